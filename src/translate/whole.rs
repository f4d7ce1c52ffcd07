//! Whole bodies: a non-streamed answer, and an error, in the client's dialect.

use serde_json::{Value, json};

use super::Direction;

/// A successful non-streamed answer of the backend in the client's dialect.
pub(crate) fn response_body(direction: Direction, body: &[u8]) -> Vec<u8> {
    let Ok(Value::Object(answer)) = serde_json::from_slice::<Value>(body) else {
        return error_body(direction, 502, b"the backend's answer is not a JSON object");
    };
    let translated = match direction {
        Direction::ChatToMessages => message_as_completion(&answer),
        Direction::MessagesToChat => completion_as_message(&answer),
        Direction::ResponsesToChat => completion_as_response(&answer),
        Direction::ResponsesToMessages => match message_as_completion(&answer) {
            Value::Object(completion) => completion_as_response(&completion),
            _ => unreachable!("a completion is an object"),
        },
        // vLLM's and SGLang's `/tokenize`: `{"count", "max_model_len", "tokens"}`.
        Direction::CountToTokenize => match answer.get("count").and_then(Value::as_u64) {
            Some(count) => json!({"input_tokens": count}),
            None => {
                return error_body(
                    direction,
                    502,
                    b"the backend's /tokenize answer has no `count`",
                );
            }
        },
    };
    translated.to_string().into_bytes()
}

/// An Anthropic message as an OpenAI chat completion.
fn message_as_completion(m: &serde_json::Map<String, Value>) -> Value {
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut reasoning = String::new();
    for block in m
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or("")),
            Some("thinking") => reasoning.push_str(block["thinking"].as_str().unwrap_or("")),
            Some("tool_use") => calls.push(json!({
                "id": block["id"],
                "type": "function",
                "function": {"name": block["name"], "arguments": block["input"].to_string()},
            })),
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
        if text.is_empty() {
            message["content"] = Value::Null;
        }
    }
    if !reasoning.is_empty() {
        message["reasoning_content"] = reasoning.into();
    }
    let finish = match m.get("stop_reason").and_then(Value::as_str) {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    };
    let usage = m.get("usage");
    let count = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cached = count("cache_read_input_tokens");
    let prompt = count("input_tokens") + count("cache_creation_input_tokens") + cached;
    let output = count("output_tokens");
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "id": m.get("id").cloned().unwrap_or_else(|| "chatcmpl".into()),
        "object": "chat.completion",
        "created": created,
        "model": m.get("model").cloned().unwrap_or_else(|| "".into()),
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    })
}

/// A chat completion's first choice (a translated request asks for one), `null` where it has
/// none.
fn first_choice(c: &serde_json::Map<String, Value>) -> Value {
    c.get("choices")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or(Value::Null)
}

/// A chat message's reasoning (`reasoning_content`, or `reasoning` as newer vLLM names it).
fn reasoning_of(message: &Value) -> Option<&str> {
    [&message["reasoning_content"], &message["reasoning"]]
        .into_iter()
        .find_map(|r| r.as_str().filter(|t| !t.is_empty()))
}

/// An OpenAI chat completion as an OpenAI Responses response: the engine's reasoning a
/// `reasoning` item, its text a `message`, each tool call a `function_call` (ids as the stream's
/// translation makes them).
fn completion_as_response(c: &serde_json::Map<String, Value>) -> Value {
    let choice = first_choice(c);
    let message = &choice["message"];
    let id = c.get("id").and_then(Value::as_str).unwrap_or("gateway");
    let mut output = Vec::new();
    if let Some(thinking) = reasoning_of(message) {
        output.push(
            json!({"id": format!("rs_{id}_{}", output.len()), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": thinking}]}),
        );
    }
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(
            json!({"id": format!("msg_{id}_{}", output.len()), "type": "message",
            "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}),
        );
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        output.push(
            json!({"id": format!("fc_{id}_{}", output.len()), "type": "function_call",
            "status": "completed", "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"].as_str().unwrap_or("{}")}),
        );
    }
    let incomplete = match choice["finish_reason"].as_str() {
        Some("length") => Some("max_output_tokens"),
        Some("content_filter") => Some("content_filter"),
        _ => None,
    };
    let usage = c.get("usage");
    let count = |path: &[&str]| {
        usage
            .and_then(|u| path.iter().try_fold(u, |v, k| v.get(k)))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (input, output_tokens) = (count(&["prompt_tokens"]), count(&["completion_tokens"]));
    json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": c.get("created").cloned().unwrap_or_else(|| 0.into()),
        "status": if incomplete.is_some() { "incomplete" } else { "completed" },
        "error": null,
        "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
        "model": c.get("model").cloned().unwrap_or_else(|| "".into()),
        "output": output,
        "usage": {
            "input_tokens": input,
            "input_tokens_details": {
                "cache_write_tokens": 0,
                "cached_tokens": count(&["prompt_tokens_details", "cached_tokens"]),
            },
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": count(&["completion_tokens_details", "reasoning_tokens"])},
            "total_tokens": input + output_tokens,
        },
        "instructions": null, "max_output_tokens": null, "parallel_tool_calls": true,
        "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
        "store": false, "temperature": null, "text": {"format": {"type": "text"}},
        "tool_choice": "auto", "tools": [], "top_p": null, "truncation": "disabled",
        "metadata": {},
    })
}

/// An OpenAI chat completion as an Anthropic message.
fn completion_as_message(c: &serde_json::Map<String, Value>) -> Value {
    let choice = first_choice(c);
    let message = &choice["message"];
    let mut content = Vec::new();
    // The engine's reasoning first, as a thinking block (unsigned: no Anthropic model wrote it).
    if let Some(thinking) = reasoning_of(message) {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        let input: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
        content.push(json!({
            "type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input,
        }));
    }
    let sequence = choice["stop_reason"].as_str().map(str::to_owned);
    let stop = match (choice["finish_reason"].as_str(), &sequence) {
        (Some("stop"), Some(_)) => "stop_sequence",
        (Some("length"), _) => "max_tokens",
        (Some("tool_calls" | "function_call"), _) => "tool_use",
        (Some("content_filter"), _) => "refusal",
        _ => "end_turn",
    };
    let usage = c.get("usage");
    let count = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cached = usage
        .and_then(|u| u.get("prompt_tokens_details"))
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    json!({
        "id": c.get("id").cloned().unwrap_or_else(|| "msg".into()),
        "type": "message",
        "role": "assistant",
        "model": c.get("model").cloned().unwrap_or_else(|| "".into()),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": count("prompt_tokens").saturating_sub(cached),
            "cache_read_input_tokens": cached,
            "output_tokens": count("completion_tokens"),
        },
    })
}

/// An error body of the backend (status `status`) in the client's dialect: OpenAI's
/// `{"error":{"message","type","code"}}` or Anthropic's `{"type":"error","error":{"type",
/// "message"}}`. A body in neither shape becomes the message.
pub(crate) fn error_body(direction: Direction, status: u16, body: &[u8]) -> Vec<u8> {
    let error = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v.get("error").map(Value::to_string),
        Err(_) => None,
    };
    let error = error.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(&body[..body.len().min(1000)]);
        json!({"message": text.trim()}).to_string()
    });
    // An engine without `/tokenize` cannot count: never a made-up number (an agent that reads
    // 0 stops compacting its context).
    let error = match (direction, status) {
        (Direction::CountToTokenize, 404 | 405 | 501) => json!({"message": format!(
            "the backend cannot count tokens: its /tokenize answered {status} (vLLM and SGLang serve it; an Anthropic backend counts them itself)"
        )})
        .to_string(),
        _ => error,
    };
    match direction {
        Direction::ChatToMessages | Direction::ResponsesToMessages => {
            format!(
                "{{\"error\":{}}}",
                openai_error_object(error.as_bytes(), status)
            )
        }
        // An OpenAI engine's error is already in the client's dialect: its shape made whole.
        Direction::ResponsesToChat => {
            format!("{{\"error\":{}}}", openai_shaped(error.as_bytes(), status))
        }
        Direction::MessagesToChat | Direction::CountToTokenize => format!(
            "{{\"type\":\"error\",\"error\":{}}}",
            anthropic_error_object_with(error.as_bytes(), Some(status))
        ),
    }
    .into_bytes()
}

/// An OpenAI error object with every member OpenAI's has (`message`, `type`, `code`), for an
/// answer of `status`.
fn openai_shaped(raw: &[u8], status: u16) -> String {
    let error: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let kind =
        error
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(if (400..500).contains(&status) {
                "invalid_request_error"
            } else {
                "server_error"
            });
    json!({"message": message_of(&error, raw), "type": kind, "code": error.get("code").cloned().unwrap_or(Value::Null)}).to_string()
}

fn message_of(error: &Value, raw: &[u8]) -> String {
    error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| String::from_utf8_lossy(raw).into_owned(), str::to_owned)
}

/// An Anthropic `error` object (`{"type","message"}`) as OpenAI's (`{"message","type",
/// "code"}`), for an answer of `status`: the Anthropic type is the code.
pub(super) fn openai_error_object(raw: &[u8], status: u16) -> String {
    let error: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let code = error
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("api_error");
    let kind = match (code, status) {
        ("invalid_request_error" | "not_found_error" | "request_too_large", _) => {
            "invalid_request_error"
        }
        ("authentication_error", _) => "authentication_error",
        ("permission_error", _) => "permission_error",
        ("rate_limit_error", _) | (_, 429) => "rate_limit_error",
        (_, 400..=499) => "invalid_request_error",
        _ => "server_error",
    };
    json!({"message": message_of(&error, raw), "type": kind, "code": code}).to_string()
}

/// An OpenAI `error` object as Anthropic's, by the status of its answer where there is one
/// (in a stream there is none: by OpenAI's type).
pub(super) fn anthropic_error_object(raw: &[u8]) -> String {
    anthropic_error_object_with(raw, None)
}

fn anthropic_error_object_with(raw: &[u8], status: Option<u16>) -> String {
    let error: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
    let openai = error.get("type").and_then(Value::as_str).unwrap_or("");
    let kind = match (status, openai) {
        (Some(400 | 422), _) => "invalid_request_error",
        (Some(401), _) => "authentication_error",
        (Some(403), _) => "permission_error",
        (Some(404), _) => "not_found_error",
        (Some(413), _) => "request_too_large",
        (Some(429), _) | (None, "rate_limit_error" | "insufficient_quota") => "rate_limit_error",
        (Some(503 | 529), _) => "overloaded_error",
        (None, "invalid_request_error") => "invalid_request_error",
        _ => "api_error",
    };
    json!({"type": kind, "message": message_of(&error, raw)}).to_string()
}
