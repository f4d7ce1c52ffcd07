"""Opens N streaming requests through a proxy to a backend that sends nothing for minutes, keeps
them open, and prints the proxy's resident memory before and after (bytes per idle stream).

Usage: python3 benches/idle_streams.py PORT N PID [PID...]   (PIDs: the proxy's processes;
BATCH=K in the environment opens K streams at a time instead of 500)"""
import asyncio
import json
import os
import sys

port, n, pids = int(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
batch = int(os.environ.get("BATCH", "500"))
BODY = json.dumps({"model": "m", "max_tokens": 4, "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/json\r\nContent-Length: " + str(len(BODY)).encode() +
           b"\r\n\r\n" + BODY)


def rss():
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


async def open_stream(held):
    # The request is sent and the stream left open. Nothing is read: after its head and the
    # role-only first chunk, this backend sends nothing for minutes.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    await writer.drain()
    held.append((reader, writer))


async def main():
    before = rss()
    held = []
    for start in range(0, n, batch):
        await asyncio.gather(*(open_stream(held) for _ in range(min(batch, n - start))))
    await asyncio.sleep(3)
    after = rss()
    print(json.dumps({"streams": n, "rss_before": before, "rss_after": after,
                      "bytes_per_stream": (after - before) / n}))
    for _, writer in held:
        writer.close()


asyncio.run(main())
