"""The OpenAI SDK's Responses API through the gateway to engines without one (translated).

Usage: python responses_through_gateway.py GATEWAY_URL
  model `llama` is served only by a chat completions backend, `claude` only by an Anthropic one.
Prints one JSON object of what the SDK saw, per model. Every event and object is validated
against the SDK's own types (pydantic), since the SDK itself builds them without validating.
"""
import json
import sys

import openai
import pydantic
from openai.types.responses import Response, ResponseStreamEvent

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="client-key", max_retries=0)
event_adapter = pydantic.TypeAdapter(ResponseStreamEvent)
TOOLS = [
    {"type": "function", "name": "lookup", "description": "Looks a text up", "strict": False,
     "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
    # Hosted: the engine cannot run it; the gateway leaves it out (hosted_tools: drop).
    {"type": "web_search"},
]


def validated(response):
    Response.model_validate(response.to_dict())
    return response


def seen(model):
    got = {}
    whole = validated(client.responses.create(
        model=model, input="hello", max_output_tokens=5, store=False,
        instructions="Answer briefly."))
    got["text"] = whole.output_text
    got["status"] = whole.status
    got["usage"] = [whole.usage.input_tokens, whole.usage.output_tokens]

    types, text = [], ""
    for event in client.responses.create(model=model, input="hello", max_output_tokens=4,
                                         stream=True):
        event_adapter.validate_python(event.to_dict())
        types.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = validated(event.response)
    got["event_types"] = types
    got["streamed_text"] = text
    got["final_text"] = final.output_text

    with client.responses.stream(model=model, input="look it up", tools=TOOLS,
                                 max_output_tokens=3) as stream:
        first = validated(stream.get_final_response())
    call = next(item for item in first.output if item.type == "function_call")
    got["tool"] = {"name": call.name, "arguments": json.loads(call.arguments)}
    second = validated(client.responses.create(
        model=model, tools=TOOLS, max_output_tokens=2,
        input=[{"role": "user", "content": "look it up"}, call.to_dict(),
               {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]))
    got["after_tool"] = [second.status, second.output_text]

    try:
        client.responses.create(model=model, input="again", previous_response_id=second.id)
        got["refused"] = None
    except openai.BadRequestError as e:
        got["refused"] = [e.status_code, e.body["type"], e.body["message"]]
    return got


print(json.dumps({model: seen(model) for model in ["llama", "claude"]}))
