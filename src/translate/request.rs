//! Requests, both ways. Per request, not per token: built through `serde_json::Value`, every
//! field the client sent either mapped, dropped as a documented hint, or refused by name.

use serde_json::{Map, Value, json};

use super::Refused;

/// Anthropic fields an OpenAI backend has no place for that change no answer: dropped.
/// (`cache_control` on a block or tool, `is_error` on a tool result and thinking blocks in the
/// history are dropped where they stand; see docs/gateway.md.)
const MESSAGES_HINTS: &[&str] = &["service_tier"];

/// OpenAI fields an Anthropic backend has no place for that change no answer: dropped.
const CHAT_HINTS: &[&str] = &[
    "store",
    "service_tier",
    "metadata",
    "seed",
    "prompt_cache_key",
];

type Object = Map<String, Value>;

/// Whether a field's value asks for nothing beyond the default.
type IsDefault = fn(&Value) -> bool;

fn refuse<T>(message: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(message.into()))
}

fn object(body: &[u8]) -> Result<Object, Refused> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        _ => refuse("the body must be a JSON object to be translated"),
    }
}

/// Refuses any key of `o` not in `known`, naming it at `path` and the backend that lacks it.
fn only(o: &Object, known: &[&str], path: &str, target: &str) -> Result<(), Refused> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => refuse(format!(
            "`{path}{k}` cannot be expressed for {target} backend (no such field there); remove it or send this model's requests to a backend of the client's dialect"
        )),
        None => Ok(()),
    }
}

/// Each item of the array `value` (at `path`) mapped by `f`, which is given the item's path.
fn each(
    value: Value,
    path: &str,
    f: fn(Value, &str) -> Result<Value, Refused>,
) -> Result<Value, Refused> {
    let Value::Array(items) = value else {
        return refuse(format!("`{path}` must be an array"));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| f(item, &format!("{path}[{i}].")))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

fn str_of<'a>(o: &'a Object, key: &str, path: &str) -> Result<&'a str, Refused> {
    match o.get(key) {
        Some(Value::String(s)) => Ok(s),
        _ => refuse(format!("`{path}{key}` must be a string")),
    }
}

/// An Anthropic messages request as an OpenAI chat completions request for `model`.
pub fn messages_to_chat(body: &[u8], model: &str) -> Result<Vec<u8>, Refused> {
    const TARGET: &str = "an OpenAI";
    let mut req = object(body)?;
    for hint in MESSAGES_HINTS {
        req.remove(*hint);
    }
    only(
        &req,
        &[
            "model",
            "messages",
            "system",
            "max_tokens",
            "stop_sequences",
            "temperature",
            "top_p",
            "top_k",
            "metadata",
            "stream",
            "tools",
            "tool_choice",
        ],
        "",
        TARGET,
    )?;
    let mut out = Object::new();
    out.insert("model".into(), model.into());
    let mut messages = Vec::new();
    match req.remove("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(blocks @ Value::Array(_)) => {
            let parts = each(blocks, "system", text_part)?;
            messages.push(json!({"role": "system", "content": parts}));
        }
        Some(_) => return refuse("`system` must be a string or an array of text blocks"),
    }
    let Some(Value::Array(list)) = req.remove("messages") else {
        return refuse("`messages` must be an array");
    };
    for (i, m) in list.into_iter().enumerate() {
        anthropic_message(m, &format!("messages[{i}]."), &mut messages)?;
    }
    out.insert("messages".into(), Value::Array(messages));
    for key in ["max_tokens", "temperature", "top_p", "top_k"] {
        if let Some(v) = req.remove(key) {
            out.insert(key.into(), v);
        }
    }
    if let Some(v) = req.remove("stop_sequences") {
        out.insert("stop".into(), v);
    }
    if let Some(v) = req.remove("metadata") {
        let Value::Object(meta) = v else {
            return refuse("`metadata` must be an object");
        };
        only(&meta, &["user_id"], "metadata.", TARGET)?;
        if let Some(user) = meta.get("user_id").filter(|u| !u.is_null()) {
            out.insert("user".into(), user.clone());
        }
    }
    if let Some(stream) = req.remove("stream") {
        if stream == Value::Bool(true) {
            // Usage comes back to an Anthropic client always: the backend is asked for it.
            out.insert("stream_options".into(), json!({"include_usage": true}));
        }
        out.insert("stream".into(), stream);
    }
    if let Some(tools) = req.remove("tools") {
        out.insert("tools".into(), each(tools, "tools", anthropic_tool)?);
    }
    if let Some(v) = req.remove("tool_choice") {
        let Value::Object(choice) = v else {
            return refuse("`tool_choice` must be an object");
        };
        only(
            &choice,
            &["type", "name", "disable_parallel_tool_use"],
            "tool_choice.",
            TARGET,
        )?;
        let mapped = match str_of(&choice, "type", "tool_choice.")? {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => {
                json!({"type": "function", "function": {"name": str_of(&choice, "name", "tool_choice.")?}})
            }
            other => return refuse(format!("`tool_choice.type` `{other}` is not known")),
        };
        out.insert("tool_choice".into(), mapped);
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    Ok(Value::Object(out).to_string().into_bytes())
}

/// A text block as an OpenAI text part (its `cache_control` dropped).
fn text_part(block: Value, path: &str) -> Result<Value, Refused> {
    let Value::Object(b) = block else {
        return refuse(format!("`{path}` must be a block object"));
    };
    if b.get("type").and_then(Value::as_str) != Some("text") {
        return refuse(format!("`{path}type` must be `text` here"));
    }
    only(&b, &["type", "text", "cache_control"], path, "an OpenAI")?;
    Ok(json!({"type": "text", "text": str_of(&b, "text", path)?}))
}

/// An image block as an OpenAI `image_url` part: base64 as a data URL, or the URL.
fn image_part(b: &Object, path: &str) -> Result<Value, Refused> {
    only(b, &["type", "source", "cache_control"], path, "an OpenAI")?;
    let Some(Value::Object(source)) = b.get("source") else {
        return refuse(format!("`{path}source` must be an object"));
    };
    let at = format!("{path}source.");
    let url = match str_of(source, "type", &at)? {
        "base64" => format!(
            "data:{};base64,{}",
            str_of(source, "media_type", &at)?,
            str_of(source, "data", &at)?
        ),
        "url" => str_of(source, "url", &at)?.to_owned(),
        other => {
            return refuse(format!(
                "`{at}type` `{other}` cannot be expressed for an OpenAI backend (base64 and url can)"
            ));
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// One Anthropic message as OpenAI messages: a user turn's tool results become `tool`
/// messages (first, as they answer the turn before), an assistant's `tool_use` its
/// `tool_calls`.
fn anthropic_message(m: Value, path: &str, out: &mut Vec<Value>) -> Result<(), Refused> {
    let Value::Object(m) = m else {
        return refuse(format!("`{path}` must be an object"));
    };
    only(&m, &["role", "content"], path, "an OpenAI")?;
    let role = str_of(&m, "role", path)?;
    if role != "user" && role != "assistant" {
        return refuse(format!("`{path}role` must be `user` or `assistant`"));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => return refuse(format!("`{path}content` must be a string or an array")),
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{path}content[{j}].");
        let Value::Object(b) = block else {
            return refuse(format!("`{at}` must be a block object"));
        };
        match (role, b.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => parts.push(text_part(block.clone(), &at)?),
            ("user", Some("image")) => parts.push(image_part(b, &at)?),
            ("user", Some("tool_result")) => out.push(tool_result(b, &at)?),
            ("assistant", Some("tool_use")) => {
                only(
                    b,
                    &["type", "id", "name", "input", "cache_control"],
                    &at,
                    "an OpenAI",
                )?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": str_of(b, "id", &at)?,
                    "type": "function",
                    "function": {"name": str_of(b, "name", &at)?, "arguments": input.to_string()},
                }));
            }
            // The model's own reasoning from an earlier turn: no OpenAI engine reads it back.
            ("assistant", Some("thinking" | "redacted_thinking")) => {}
            (_, kind) => {
                return refuse(format!(
                    "`{at}type` `{}` in a {role} message cannot be expressed for an OpenAI backend",
                    kind.unwrap_or("(none)")
                ));
            }
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant"});
        msg["content"] = match parts.len() {
            0 => Value::Null,
            1 => parts[0]["text"].clone(),
            _ => Value::Array(parts),
        };
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

/// A `tool_result` block as a `tool` message (its `is_error` dropped: the content says what
/// failed).
fn tool_result(b: &Object, path: &str) -> Result<Value, Refused> {
    only(
        b,
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
        path,
        "an OpenAI",
    )?;
    let content = match b.get("content") {
        None | Some(Value::Null) => json!(""),
        Some(Value::String(s)) => json!(s),
        Some(Value::Array(blocks)) => Value::Array(
            blocks
                .iter()
                .enumerate()
                .map(|(k, block)| text_part(block.clone(), &format!("{path}content[{k}].")))
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return refuse(format!("`{path}content` must be a string or an array")),
    };
    Ok(json!({"role": "tool", "tool_call_id": str_of(b, "tool_use_id", path)?, "content": content}))
}

fn anthropic_tool(t: Value, path: &str) -> Result<Value, Refused> {
    let Value::Object(t) = t else {
        return refuse(format!("`{path}` must be an object"));
    };
    if let Some(kind) = t
        .get("type")
        .and_then(Value::as_str)
        .filter(|k| *k != "custom")
    {
        return refuse(format!(
            "`{path}type` `{kind}` is a server tool of Anthropic's: an OpenAI backend has none"
        ));
    }
    only(
        &t,
        &[
            "type",
            "name",
            "description",
            "input_schema",
            "cache_control",
        ],
        path,
        "an OpenAI",
    )?;
    let mut function = json!({"name": str_of(&t, "name", path)?});
    if let Some(d) = t.get("description") {
        function["description"] = d.clone();
    }
    function["parameters"] = t
        .get("input_schema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    Ok(json!({"type": "function", "function": function}))
}

/// An OpenAI chat completions request as an Anthropic messages request for `model`, with
/// `default_max_tokens` where the client set no limit (Anthropic requires one).
pub fn chat_to_messages(
    body: &[u8],
    model: &str,
    default_max_tokens: u32,
) -> Result<Vec<u8>, Refused> {
    const TARGET: &str = "an Anthropic";
    let mut req = object(body)?;
    for hint in CHAT_HINTS {
        req.remove(*hint);
    }
    // Values that ask for nothing beyond the default are hints too.
    let defaults: [(&str, IsDefault); 7] = [
        ("n", |v| v == &json!(1)),
        ("logprobs", |v| v == &json!(false)),
        ("frequency_penalty", |v| v.as_f64() == Some(0.0)),
        ("presence_penalty", |v| v.as_f64() == Some(0.0)),
        ("response_format", |v| v == &json!({"type": "text"})),
        ("modalities", |v| v == &json!(["text"])),
        ("parallel_tool_calls", |v| v == &json!(true)),
    ];
    for (key, is_default) in defaults {
        if req.get(key).is_some_and(|v| v.is_null() || is_default(v)) {
            req.remove(key);
        }
    }
    only(
        &req,
        &[
            "model",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "stop",
            "temperature",
            "top_p",
            "top_k",
            "user",
            "stream",
            "stream_options",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        ],
        "",
        TARGET,
    )?;
    let mut out = Object::new();
    out.insert("model".into(), model.into());
    let max = req
        .remove("max_completion_tokens")
        .filter(|v| !v.is_null())
        .or_else(|| req.remove("max_tokens").filter(|v| !v.is_null()))
        .unwrap_or_else(|| default_max_tokens.into());
    out.insert("max_tokens".into(), max);
    let Some(Value::Array(list)) = req.remove("messages") else {
        return refuse("`messages` must be an array");
    };
    let (system, messages) = openai_messages(list)?;
    if let Some(system) = system {
        out.insert("system".into(), system);
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(t) = req.remove("temperature").filter(|v| !v.is_null()) {
        if t.as_f64().is_some_and(|t| t > 1.0) {
            return refuse(
                "`temperature` above 1 cannot be expressed for an Anthropic backend (its range is 0 to 1)",
            );
        }
        out.insert("temperature".into(), t);
    }
    for key in ["top_p", "top_k"] {
        if let Some(v) = req.remove(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v);
        }
    }
    match req.remove("stop") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.insert("stop_sequences".into(), json!([s]));
        }
        Some(list @ Value::Array(_)) => {
            out.insert("stop_sequences".into(), list);
        }
        Some(_) => return refuse("`stop` must be a string or an array of strings"),
    }
    if let Some(user) = req.remove("user").filter(|v| !v.is_null()) {
        out.insert("metadata".into(), json!({"user_id": user}));
    }
    if let Some(Value::Object(options)) = req.remove("stream_options") {
        // Usage always comes from an Anthropic backend; the stream's translation gives the
        // client its usage chunk when it asked.
        only(
            &options,
            &["include_usage", "continuous_usage_stats"],
            "stream_options.",
            TARGET,
        )?;
    }
    if let Some(stream) = req.remove("stream") {
        out.insert("stream".into(), stream);
    }
    if let Some(tools) = req.remove("tools") {
        out.insert("tools".into(), each(tools, "tools", openai_tool)?);
    }
    let serial = req.remove("parallel_tool_calls") == Some(Value::Bool(false));
    let mut choice = match req.remove("tool_choice") {
        None | Some(Value::Null) => serial.then(|| json!({"type": "auto"})),
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => json!({"type": "auto"}),
            "required" => json!({"type": "any"}),
            "none" => json!({"type": "none"}),
            other => return refuse(format!("`tool_choice` `{other}` is not known")),
        }),
        Some(Value::Object(c)) => {
            let name = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (c.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => Some(json!({"type": "tool", "name": name})),
                _ => {
                    return refuse(
                        "`tool_choice` must name a function (`{\"type\":\"function\",\"function\":{\"name\":...}}`) for an Anthropic backend",
                    );
                }
            }
        }
        Some(_) => return refuse("`tool_choice` must be a string or an object"),
    };
    if let Some(c) = choice.as_mut().filter(|_| serial) {
        c["disable_parallel_tool_use"] = Value::Bool(true);
    }
    if let Some(c) = choice {
        out.insert("tool_choice".into(), c);
    }
    Ok(Value::Object(out).to_string().into_bytes())
}

fn openai_tool(t: Value, path: &str) -> Result<Value, Refused> {
    let Value::Object(t) = t else {
        return refuse(format!("`{path}` must be an object"));
    };
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return refuse(format!(
            "`{path}type` must be `function` for an Anthropic backend"
        ));
    }
    only(&t, &["type", "function"], path, "an Anthropic")?;
    let Some(Value::Object(f)) = t.get("function") else {
        return refuse(format!("`{path}function` must be an object"));
    };
    let at = format!("{path}function.");
    // `strict` asks for exact schema adherence, which Anthropic's tools give without asking.
    only(
        f,
        &["name", "description", "parameters", "strict"],
        &at,
        "an Anthropic",
    )?;
    let mut tool = json!({"name": str_of(f, "name", &at)?});
    if let Some(d) = f.get("description") {
        tool["description"] = d.clone();
    }
    tool["input_schema"] = f
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    Ok(tool)
}

/// OpenAI messages as Anthropic's system prompt and turns: system (and developer) messages
/// before the first turn become the system prompt, `tool` messages `tool_result` blocks of a
/// user turn, `tool_calls` `tool_use` blocks; consecutive turns of one role are joined, as
/// Anthropic requires turns to alternate.
fn openai_messages(list: Vec<Value>) -> Result<(Option<Value>, Vec<Value>), Refused> {
    let mut system: Vec<Value> = Vec::new();
    let mut turns: Vec<(String, Vec<Value>)> = Vec::new();
    for (i, m) in list.into_iter().enumerate() {
        let path = format!("messages[{i}].");
        let Value::Object(m) = m else {
            return refuse(format!("`{path}` must be an object"));
        };
        let role = str_of(&m, "role", &path)?.to_owned();
        let blocks = match role.as_str() {
            "system" | "developer" => {
                if !turns.is_empty() {
                    return refuse(format!(
                        "`{path}role` `{role}` after the conversation began cannot be expressed for an Anthropic backend (its system prompt comes first)"
                    ));
                }
                only(&m, &["role", "content", "name"], &path, "an Anthropic")?;
                system.extend(openai_content(m.get("content"), &path, false)?);
                continue;
            }
            "user" => {
                only(&m, &["role", "content", "name"], &path, "an Anthropic")?;
                openai_content(m.get("content"), &path, true)?
            }
            "assistant" => {
                only(
                    &m,
                    &["role", "content", "name", "tool_calls", "refusal"],
                    &path,
                    "an Anthropic",
                )?;
                if m.get("refusal").is_some_and(|r| !r.is_null()) {
                    return refuse(format!(
                        "`{path}refusal` cannot be expressed for an Anthropic backend"
                    ));
                }
                let mut blocks = openai_content(m.get("content"), &path, false)?;
                if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
                    let Value::Array(calls) = calls else {
                        return refuse(format!("`{path}tool_calls` must be an array"));
                    };
                    for (j, call) in calls.iter().enumerate() {
                        blocks.push(tool_use(call, &format!("{path}tool_calls[{j}]."))?);
                    }
                }
                blocks
            }
            "tool" => {
                only(
                    &m,
                    &["role", "content", "tool_call_id", "name"],
                    &path,
                    "an Anthropic",
                )?;
                let content = openai_content(m.get("content"), &path, false)?;
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": str_of(&m, "tool_call_id", &path)?,
                    "content": content,
                })]
            }
            other => {
                return refuse(format!(
                    "`{path}role` `{other}` cannot be expressed for an Anthropic backend"
                ));
            }
        };
        let role = if role == "tool" {
            "user".to_owned()
        } else {
            role
        };
        match turns.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let system = (!system.is_empty()).then(|| match system.as_slice() {
        [only] => only["text"].clone(),
        _ => Value::Array(system),
    });
    let messages = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    Ok((system, messages))
}

/// A message's content as Anthropic blocks: a string as one text block, text parts as text
/// blocks and (where `images`) image parts as image blocks.
fn openai_content(
    content: Option<&Value>,
    path: &str,
    images: bool,
) -> Result<Vec<Value>, Refused> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(vec![json!({"type": "text", "text": s})]),
        Some(Value::Array(parts)) => parts,
        Some(_) => return refuse(format!("`{path}content` must be a string or an array")),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (k, part) in parts.iter().enumerate() {
        let at = format!("{path}content[{k}].");
        let Value::Object(p) = part else {
            return refuse(format!("`{at}` must be an object"));
        };
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                only(p, &["type", "text"], &at, "an Anthropic")?;
                blocks.push(json!({"type": "text", "text": str_of(p, "text", &at)?}));
            }
            Some("image_url") if images => {
                only(p, &["type", "image_url"], &at, "an Anthropic")?;
                let url = match p.get("image_url") {
                    Some(Value::String(u)) => u.as_str(),
                    // `detail` is a hint of how closely to look: Anthropic decides that itself.
                    Some(Value::Object(i)) => str_of(i, "url", &format!("{at}image_url."))?,
                    _ => return refuse(format!("`{at}image_url` must be an object")),
                };
                blocks.push(image_block(url, &at)?);
            }
            kind => {
                return refuse(format!(
                    "`{at}type` `{}` cannot be expressed for an Anthropic backend here",
                    kind.unwrap_or("(none)")
                ));
            }
        }
    }
    Ok(blocks)
}

/// An image URL as an Anthropic image block: a `data:` URL as base64, any other as a URL.
fn image_block(url: &str, path: &str) -> Result<Value, Refused> {
    let Some(data) = url.strip_prefix("data:") else {
        return Ok(json!({"type": "image", "source": {"type": "url", "url": url}}));
    };
    match data.split_once(";base64,") {
        Some((media_type, data)) => Ok(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        })),
        None => refuse(format!(
            "`{path}image_url.url` is a data URL that is not base64: an Anthropic backend takes base64 only"
        )),
    }
}

/// A `tool_calls` entry as a `tool_use` block; its arguments must be a JSON object.
fn tool_use(call: &Value, path: &str) -> Result<Value, Refused> {
    let Value::Object(c) = call else {
        return refuse(format!("`{path}` must be an object"));
    };
    only(c, &["id", "type", "function"], path, "an Anthropic")?;
    let Some(Value::Object(f)) = c.get("function") else {
        return refuse(format!("`{path}function` must be an object"));
    };
    let at = format!("{path}function.");
    let arguments = str_of(f, "arguments", &at)?;
    let input: Value = if arguments.trim().is_empty() {
        json!({})
    } else {
        match serde_json::from_str(arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return refuse(format!(
                    "`{at}arguments` must be a JSON object for an Anthropic backend's tool input"
                ));
            }
        }
    };
    Ok(json!({
        "type": "tool_use",
        "id": str_of(c, "id", path)?,
        "name": str_of(f, "name", &at)?,
        "input": input,
    }))
}
