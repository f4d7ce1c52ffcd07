"""A heterogeneous fleet of mock OpenAI engines written apart from `tpsgate sim`: issue 73's
independent fleet, rebuilt. One asyncio process serves every engine, so timings jitter as an
event loop on a busy machine makes them, on top of each engine's own jitter. Engines:

  large    continuous batching, 13.5 ms a step + 0.83 ms per sequence, 64 at a time
  small    continuous batching, 8 ms + 1.5 ms per sequence, 8 at a time, the rest queue
  serial   one request at a time, 25 ms a token
  hosted   flat speed (16 ms a step), a first token 580 ms late, 20% jitter, 3 tokens a chunk

A step emits one token to every running request; the prompts admitted in a step are prefilled in
it (at each engine's prefill rate), stalling the batch as a chunked prefill does. A reply ends
at `max_tokens` (`max_completion_tokens`), with a usage chunk when `stream_options.include_usage`
asks for one. Prompt tokens are counted as a quarter of the prompt's bytes.

Usage: python3 benches/mock_fleet.py [FIRST_PORT=9101] [MODEL=llama-3.1-8b]
Listens on 127.0.0.1, FIRST_PORT up to FIRST_PORT + 3, in the order above."""
import asyncio
import collections
import json
import random
import sys
import time

ENGINES = [
    # name, step base s, per sequence s, batch limit, prefill tokens/s, first token extra s,
    # jitter share, tokens a chunk
    ("large", 0.0135, 0.00083, 64, 8000, 0.0, 0.0, 1),
    ("small", 0.008, 0.0015, 8, 20000, 0.0, 0.0, 1),
    ("serial", 0.025, 0.0, 1, 2000, 0.0, 0.0, 1),
    ("hosted", 0.016, 0.000002, 1024, 50000, 0.58, 0.2, 3),
]


class Stream:
    def __init__(self, prompt_tokens, max_tokens):
        self.prompt_tokens = prompt_tokens
        self.left = max_tokens
        self.sent = 0
        self.pending = 0
        self.out = asyncio.Queue()


class Engine:
    def __init__(self, name, base, per_seq, limit, prefill, extra, jitter, chunk):
        self.name, self.base, self.per_seq, self.limit = name, base, per_seq, limit
        self.prefill, self.extra, self.jitter, self.chunk = prefill, extra, jitter, chunk
        self.waiting = collections.deque()
        self.running = []
        self.wake = asyncio.Event()

    async def submit(self, stream):
        if self.extra:
            await asyncio.sleep(self.extra)
        self.waiting.append(stream)
        self.wake.set()

    async def run(self):
        while True:
            if not (self.running or self.waiting):
                self.wake.clear()
                await self.wake.wait()
            admitted = []
            while self.waiting and len(self.running) < self.limit:
                admitted.append(self.waiting.popleft())
            self.running += admitted
            step = self.base + self.per_seq * len(self.running)
            step *= 1 + self.jitter * random.uniform(-1, 1)
            step += sum(s.prompt_tokens for s in admitted) / self.prefill
            await asyncio.sleep(step)
            for s in self.running:
                s.left -= 1
                s.pending += 1
                if s.pending == self.chunk or s.left == 0 or s.sent == 0:
                    s.out.put_nowait(s.pending)
                    s.sent += s.pending
                    s.pending = 0
                if s.left == 0:
                    s.out.put_nowait(None)
            self.running = [s for s in self.running if s.left > 0]


def chunk(model, delta, finish=None, usage=None):
    body = {
        "id": "mock",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def write_chunked(writer, data):
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


async def answer(engine, request, writer):
    model = request.get("model", "")
    prompt = json.dumps(request.get("messages", ""))
    prompt_tokens = max(1, len(prompt) // 4)
    max_tokens = request.get("max_completion_tokens") or request.get("max_tokens") or 64
    usage = (request.get("stream_options") or {}).get("include_usage")
    stream = Stream(prompt_tokens, int(max_tokens))
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    await write_chunked(writer, chunk(model, {"role": "assistant", "content": ""}))
    asyncio.get_running_loop().create_task(engine.submit(stream))
    while (tokens := await stream.out.get()) is not None:
        await write_chunked(writer, chunk(model, {"content": " tok" * tokens}))
    await write_chunked(writer, chunk(model, {}, "length"))
    if usage:
        counts = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": int(max_tokens),
            "total_tokens": prompt_tokens + int(max_tokens),
        }
        await write_chunked(writer, chunk(model, {}, usage=counts))
    await write_chunked(writer, b"data: [DONE]\n\n")
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def reply(writer, status, body):
    data = json.dumps(body).encode()
    writer.write(
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status.encode(), len(data), data)
    )
    await writer.drain()


async def serve(engine, model, reader, writer):
    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(
                (k.strip().lower(), v.strip()) for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)
            )
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path.startswith("/v1/models"):
                await reply(writer, "200 OK", {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif method == "POST" and path.startswith("/v1/chat/completions"):
                request = json.loads(body or b"{}")
                if request.get("stream"):
                    await answer(engine, request, writer)
                else:
                    await reply(writer, "400 Bad Request", {"error": {"message": "stream only", "type": "invalid_request_error", "code": None}})
            else:
                await reply(writer, "404 Not Found", {"error": {"message": path, "type": "not_found", "code": None}})
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 9101
    model = sys.argv[2] if len(sys.argv) > 2 else "llama-3.1-8b"
    servers = []
    for i, spec in enumerate(ENGINES):
        engine = Engine(*spec)
        asyncio.get_running_loop().create_task(engine.run())
        handler = lambda r, w, e=engine: serve(e, model, r, w)
        servers.append(await asyncio.start_server(handler, "127.0.0.1", first + i))
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main())
