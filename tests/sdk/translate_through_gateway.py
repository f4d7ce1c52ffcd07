"""Each official SDK through the gateway to a backend of the other dialect (translated).

Usage: python translate_through_gateway.py GATEWAY_URL
  model `llama` is served only by an OpenAI-dialect backend, `claude` only by an Anthropic one.
Prints one JSON object of what each SDK saw. Besides the SDKs' own flows, every event and object
of the raw responses is validated against the SDK's own types (pydantic, required fields and all),
since the SDKs themselves build objects without validating them.
"""
import json
import sys
import urllib.request

import anthropic
import openai
import pydantic
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk

base = sys.argv[1]
out = {}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
TOOL = {
    "name": "lookup",
    "description": "Looks a text up",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def raw_events(path, body, headers):
    """The data of each SSE event of a streamed POST, parsed ([DONE] as the string)."""
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"content-type": "application/json", **headers},
    )
    data = []
    with urllib.request.urlopen(request, timeout=30) as r:
        for line in r:
            line = line.decode().rstrip("\r\n")
            if line.startswith("data: "):
                payload = line[len("data: "):]
                data.append(payload if payload == "[DONE]" else json.loads(payload))
    return data


# --- the Anthropic SDK, a model only an OpenAI backend serves ---
an = anthropic.Anthropic(base_url=base, api_key="client-key", max_retries=0)
hello = [{"role": "user", "content": "hello"}]

with an.messages.stream(model="llama", max_tokens=4, messages=hello) as stream:
    out["anthropic_text"] = "".join(stream.text_stream)
    final = stream.get_final_message()
out["anthropic_usage"] = [final.usage.input_tokens, final.usage.output_tokens]
out["anthropic_stop"] = final.stop_reason

event_adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
events = raw_events(
    "/v1/messages",
    {"model": "llama", "max_tokens": 3, "stream": True, "messages": hello,
     "tools": [TOOL]},
    {"x-api-key": "client-key", "anthropic-version": "2023-06-01"},
)
# `ping` is no message event in the SDK's types: its stream skips it, and so does this check.
out["anthropic_event_types"] = [
    "ping" if e == {"type": "ping"} else event_adapter.validate_python(e).type for e in events
]

# Tools across two turns, the first streamed (input_json_delta assembled by the SDK).
with an.messages.stream(model="llama", max_tokens=3, messages=hello, tools=[TOOL]) as stream:
    first = stream.get_final_message()
call = next(b for b in first.content if b.type == "tool_use")
out["anthropic_tool"] = {"stop": first.stop_reason, "name": call.name, "input": call.input}
second = an.messages.create(
    model="llama", max_tokens=2, tools=[TOOL],
    messages=hello + [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]},
    ],
)
Message.model_validate(second.to_dict())
out["anthropic_after_tool"] = [second.stop_reason, second.content[0].text]

images = an.messages.create(
    model="llama", max_tokens=2,
    messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "What are these?"},
    ]}],
)
out["anthropic_images"] = images.content[0].text

stopped = an.messages.create(
    model="llama", max_tokens=10, stop_sequences=[" fox"], messages=hello
)
out["anthropic_stop_sequence"] = [stopped.stop_reason, stopped.stop_sequence, stopped.content[0].text]

# Thinking, as coding agents ask it: the engine is sent what its backend's `thinking:` says.
thought = an.messages.create(model="llama", max_tokens=2, messages=hello,
                             thinking={"type": "enabled", "budget_tokens": 1024})
out["anthropic_thinking"] = [thought.stop_reason, thought.content[0].text]

document = [{"role": "user", "content": [{"type": "document", "source": {
    "type": "text", "media_type": "text/plain", "data": "a page"}}]}]
try:
    an.messages.create(model="llama", max_tokens=2, messages=document)
    out["anthropic_refused"] = None
except anthropic.BadRequestError as e:
    out["anthropic_refused"] = [e.status_code, e.body["error"]["type"], e.body["error"]["message"]]

# --- the OpenAI SDK, a model only an Anthropic backend serves ---
oa = openai.OpenAI(base_url=f"{base}/v1", api_key="client-key", max_retries=0)

text, usage = "", None
for chunk in oa.chat.completions.create(
    model="claude", messages=hello, max_tokens=5, n=1, stream=True,
    stream_options={"include_usage": True},
):
    ChatCompletionChunk.model_validate(chunk.to_dict())
    for choice in chunk.choices:
        text += choice.delta.content or ""
    if chunk.usage is not None:
        usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
out["openai_text"], out["openai_usage"] = text, usage

chunks = raw_events(
    "/v1/chat/completions",
    {"model": "claude", "max_tokens": 3, "stream": True, "messages": hello,
     "stream_options": {"include_usage": True}},
    {"authorization": "Bearer client-key"},
)
for c in chunks[:-1]:
    ChatCompletionChunk.model_validate(c)
out["openai_last_chunk"] = chunks[-1]

tools = [{"type": "function", "function": {
    "name": "lookup", "description": "Looks a text up",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}}]
first = oa.chat.completions.create(model="claude", max_tokens=3, messages=hello, tools=tools, n=1)
ChatCompletion.model_validate(first.to_dict())
call = first.choices[0].message.tool_calls[0]
out["openai_tool"] = {
    "finish": first.choices[0].finish_reason,
    "name": call.function.name,
    "arguments": json.loads(call.function.arguments),
}
arguments = ""
for chunk in oa.chat.completions.create(model="claude", max_tokens=3, messages=hello,
                                        tools=tools, stream=True):
    ChatCompletionChunk.model_validate(chunk.to_dict())
    for choice in chunk.choices:
        for delta in choice.delta.tool_calls or []:
            arguments += delta.function.arguments or ""
out["openai_streamed_arguments"] = json.loads(arguments)
second = oa.chat.completions.create(
    model="claude", max_tokens=2, tools=tools,
    messages=hello + [
        first.choices[0].message.to_dict(),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ],
)
out["openai_after_tool"] = [second.choices[0].finish_reason, second.choices[0].message.content]

try:
    oa.chat.completions.create(model="claude", max_tokens=2, messages=hello, n=2)
    out["openai_refused"] = None
except openai.BadRequestError as e:
    out["openai_refused"] = [e.status_code, e.body["type"], e.body["message"]]

print(json.dumps(out))
