"""Streams through the gateway with the official SDKs, changing only the base URL.

Usage: python stream_through_gateway.py GATEWAY_URL
Prints one JSON object: the text each SDK received and the usage it saw.
"""
import json
import sys

import anthropic
import openai

base = sys.argv[1]

oa = openai.OpenAI(base_url=f"{base}/v1", api_key="client-key", max_retries=0)
chunks = oa.chat.completions.create(
    model="m",
    messages=[{"role": "user", "content": "hello"}],
    max_tokens=5,
    stream=True,
    stream_options={"include_usage": True},
)
openai_text, openai_usage = "", None
for chunk in chunks:
    for choice in chunk.choices:
        openai_text += choice.delta.content or ""
    if chunk.usage is not None:
        openai_usage = chunk.usage.completion_tokens

an = anthropic.Anthropic(base_url=base, api_key="client-key", max_retries=0)
with an.messages.stream(
    model="claude", max_tokens=4, messages=[{"role": "user", "content": "hello"}]
) as stream:
    anthropic_text = "".join(stream.text_stream)
    final = stream.get_final_message()

print(json.dumps({
    "openai_text": openai_text,
    "openai_usage": openai_usage,
    "anthropic_text": anthropic_text,
    "anthropic_usage": final.usage.output_tokens,
}))
