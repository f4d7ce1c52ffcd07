//! OpenAI chat completions to Anthropic messages.

use std::borrow::Cow;

use serde_json::Value;
use serde_json::value::RawValue;

use super::{At, Json, Object, Refused, body_object, is, items, object, object_at, refuse, text};

/// OpenAI fields an Anthropic backend has no place for that change no answer: dropped.
const CHAT_HINTS: &[&str] = &[
    "store",
    "service_tier",
    "metadata",
    "seed",
    "prompt_cache_key",
];

/// Whether a field's value asks for nothing beyond the default.
type IsDefault = fn(&Value) -> bool;

/// OpenAI fields that an Anthropic backend lacks but that pass, as hints, where their value asks
/// for nothing beyond the default.
const CHAT_DEFAULTS: [(&str, IsDefault); 6] = [
    ("n", |v| v == &Value::from(1)),
    ("logprobs", |v| v == &Value::Bool(false)),
    ("frequency_penalty", |v| v.as_f64() == Some(0.0)),
    ("presence_penalty", |v| v.as_f64() == Some(0.0)),
    ("response_format", |v| {
        v["type"] == "text" && v.as_object().is_some_and(|o| o.len() == 1)
    }),
    ("modalities", |v| {
        v.as_array().is_some_and(|m| m.len() == 1 && m[0] == "text")
    }),
];

const TO_ANTHROPIC: &str = "an Anthropic";

/// An OpenAI chat completions request as an Anthropic messages request for `model`, with
/// `default_max_tokens` where the client set no limit (Anthropic requires one).
pub fn chat_to_messages(
    body: &[u8],
    model: &str,
    default_max_tokens: u32,
) -> Result<Vec<u8>, Refused> {
    const FIELDS: &[&str] = &[
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
    ];
    let req = body_object(body)?;
    req.only_where(
        |k, v| FIELDS.contains(&k) || CHAT_HINTS.contains(&k) || asks_nothing(k, v),
        &At::Root,
        TO_ANTHROPIC,
    )?;
    let mut out = Json(Vec::with_capacity(body.len() + 128));
    out.open(b'{').key("model").str(model);
    out.key("max_tokens");
    match req
        .given("max_completion_tokens")
        .or_else(|| req.given("max_tokens"))
    {
        Some(max) => out.value(max),
        None => out.raw(itoa::Buffer::new().format(default_max_tokens)),
    };
    openai_messages(items(req.get("messages"), &"messages")?, &mut out)?;
    if let Some(t) = req.given("temperature") {
        if t.get().parse::<f64>().is_ok_and(|t| t > 1.0) {
            return refuse(
                "`temperature` above 1 cannot be expressed for an Anthropic backend (its range is 0 to 1)",
            );
        }
        out.key("temperature").value(t);
    }
    for key in ["top_p", "top_k"] {
        if let Some(v) = req.given(key) {
            out.key(key).value(v);
        }
    }
    match req.given("stop") {
        None => {}
        Some(s) if is(s, b'"') => {
            out.key("stop_sequences").open(b'[').value(s).close(b']');
        }
        Some(list) if is(list, b'[') => {
            out.key("stop_sequences").value(list);
        }
        Some(_) => return refuse("`stop` must be a string or an array of strings"),
    }
    if let Some(user) = req.given("user") {
        let metadata = out.key("metadata").raw(r#"{"user_id":"#);
        metadata.value(user).close(b'}');
    }
    if let Some(options) = req.get("stream_options").filter(|o| is(o, b'{')) {
        // Usage always comes from an Anthropic backend; the stream's translation gives the
        // client its usage chunk when it asked.
        let at = At::Field(&At::Root, "stream_options");
        let options = object_at(options, &at)?;
        options.only(
            &["include_usage", "continuous_usage_stats"],
            &at,
            TO_ANTHROPIC,
        )?;
    }
    if let Some(stream) = req.get("stream") {
        out.key("stream").value(stream);
    }
    if let Some(tools) = req.given("tools") {
        out.key("tools").open(b'[');
        for (i, tool) in items(Some(tools), &"tools")?.into_iter().enumerate() {
            openai_tool(tool, &At::Item(&At::Root, "tools", i), &mut out)?;
        }
        out.close(b']');
    }
    let serial = req
        .get("parallel_tool_calls")
        .is_some_and(|p| p.get() == "false");
    openai_tool_choice(req.given("tool_choice"), serial, &mut out)?;
    out.close(b'}');
    Ok(out.0)
}

/// Whether the OpenAI field `key` passes as a hint: one of [`CHAT_DEFAULTS`], null or at its
/// default. (Read into a `Value`: rare, and small.)
fn asks_nothing(key: &str, value: &RawValue) -> bool {
    CHAT_DEFAULTS.iter().any(|(k, is_default)| {
        *k == key
            && serde_json::from_str::<Value>(value.get())
                .is_ok_and(|v| v.is_null() || is_default(&v))
    })
}

fn openai_tool_choice(
    choice: Option<&RawValue>,
    serial: bool,
    out: &mut Json,
) -> Result<(), Refused> {
    let kind = match choice {
        None if serial => "auto",
        None => return Ok(()),
        Some(s) if is(s, b'"') => match text(s).as_deref() {
            Some("auto") => "auto",
            Some("required") => "any",
            Some("none") => "none",
            other => {
                return refuse(format!(
                    "`tool_choice` `{}` is not known",
                    other.unwrap_or_default()
                ));
            }
        },
        Some(c) if is(c, b'{') => {
            let c = object_at(c, &At::Root)?;
            let name = c
                .get("function")
                .filter(|f| is(f, b'{'))
                .and_then(|f| serde_json::from_str::<Object>(f.get()).ok())
                .and_then(|f| f.given("name").filter(|n| is(n, b'"')));
            match (c.get("type").and_then(text).as_deref(), name) {
                (Some("function"), Some(name)) => {
                    let tool = out.key("tool_choice").raw(r#"{"type":"tool","name":"#);
                    tool.value(name);
                    if serial {
                        out.key("disable_parallel_tool_use").raw("true");
                    }
                    out.close(b'}');
                    return Ok(());
                }
                _ => {
                    return refuse(
                        "`tool_choice` must name a function (`{\"type\":\"function\",\"function\":{\"name\":...}}`) for an Anthropic backend",
                    );
                }
            }
        }
        Some(_) => return refuse("`tool_choice` must be a string or an object"),
    };
    out.key("tool_choice").raw(r#"{"type":"#).str(kind);
    if serial {
        out.key("disable_parallel_tool_use").raw("true");
    }
    out.close(b'}');
    Ok(())
}

fn openai_tool(t: &RawValue, at: &At, out: &mut Json) -> Result<(), Refused> {
    let t = object_at(t, at)?;
    if t.get("type").and_then(text).as_deref() != Some("function") {
        return refuse(format!(
            "`{at}type` must be `function` for an Anthropic backend"
        ));
    }
    t.only(&["type", "function"], at, TO_ANTHROPIC)?;
    let f = match t.get("function") {
        Some(f) => object(f, || format!("`{at}function` must be an object"))?,
        None => return refuse(format!("`{at}function` must be an object")),
    };
    let at = At::Field(at, "function");
    // `strict` asks for exact schema adherence, which Anthropic's tools give without asking.
    f.only(
        &["name", "description", "parameters", "strict"],
        &at,
        TO_ANTHROPIC,
    )?;
    let name = f.raw_str("name", &at)?;
    out.item().raw(r#"{"name":"#).value(name);
    if let Some(d) = f.get("description") {
        out.key("description").value(d);
    }
    out.key("input_schema");
    match f.get("parameters") {
        Some(schema) => out.value(schema),
        None => out.raw(r#"{"type":"object","properties":{}}"#),
    };
    out.close(b'}');
    Ok(())
}

/// An Anthropic content block, read from an OpenAI message and written once the turns are
/// joined.
enum Block<'a> {
    /// Its text as it stands, quotes included.
    Text(&'a RawValue),
    /// A URL; a `data:` URL is base64 (checked when read).
    Image(Cow<'a, str>),
    ToolUse {
        id: &'a RawValue,
        name: &'a RawValue,
        /// A JSON object's text (checked when read).
        input: Cow<'a, str>,
    },
    ToolResult {
        id: &'a RawValue,
        content: Vec<Block<'a>>,
    },
}

/// OpenAI messages as Anthropic's system prompt and turns: system (and developer) messages
/// before the first turn become the system prompt, `tool` messages `tool_result` blocks of a
/// user turn, `tool_calls` `tool_use` blocks; consecutive turns of one role are joined, as
/// Anthropic requires turns to alternate.
fn openai_messages(list: Vec<&RawValue>, out: &mut Json) -> Result<(), Refused> {
    let mut system: Vec<Block> = Vec::new();
    // Each turn: whether it is the assistant's, and its blocks.
    let mut turns: Vec<(bool, Vec<Block>)> = Vec::new();
    for (i, m) in list.into_iter().enumerate() {
        let at = At::Item(&At::Root, "messages", i);
        let m = object_at(m, &at)?;
        let role = m.str("role", &at)?;
        let (assistant, blocks) = match &*role {
            "system" | "developer" => {
                if !turns.is_empty() {
                    return refuse(format!(
                        "`{at}role` `{role}` after the conversation began cannot be expressed for an Anthropic backend (its system prompt comes first)"
                    ));
                }
                m.only(&["role", "content", "name"], &at, TO_ANTHROPIC)?;
                system.extend(openai_content(m.get("content"), &at, false)?);
                continue;
            }
            "user" => {
                m.only(&["role", "content", "name"], &at, TO_ANTHROPIC)?;
                (false, openai_content(m.get("content"), &at, true)?)
            }
            "assistant" => {
                m.only(
                    &["role", "content", "name", "tool_calls", "refusal"],
                    &at,
                    TO_ANTHROPIC,
                )?;
                if m.given("refusal").is_some() {
                    return refuse(format!(
                        "`{at}refusal` cannot be expressed for an Anthropic backend"
                    ));
                }
                let mut blocks = openai_content(m.get("content"), &at, false)?;
                if let Some(calls) = m.given("tool_calls") {
                    let name = format_args!("{at}tool_calls");
                    for (j, call) in items(Some(calls), &name)?.into_iter().enumerate() {
                        blocks.push(tool_use(call, &At::Item(&at, "tool_calls", j))?);
                    }
                }
                (true, blocks)
            }
            "tool" => {
                m.only(
                    &["role", "content", "tool_call_id", "name"],
                    &at,
                    TO_ANTHROPIC,
                )?;
                let content = openai_content(m.get("content"), &at, false)?;
                let id = m.raw_str("tool_call_id", &at)?;
                (false, vec![Block::ToolResult { id, content }])
            }
            other => {
                return refuse(format!(
                    "`{at}role` `{other}` cannot be expressed for an Anthropic backend"
                ));
            }
        };
        match turns.last_mut() {
            Some((last, content)) if *last == assistant => content.extend(blocks),
            _ => turns.push((assistant, blocks)),
        }
    }
    match system.as_slice() {
        [] => {}
        [Block::Text(text)] => {
            out.key("system").value(text);
        }
        blocks => {
            out.key("system");
            put_blocks(out, blocks);
        }
    }
    out.key("messages").open(b'[');
    for (assistant, blocks) in &turns {
        let role = if *assistant { "assistant" } else { "user" };
        out.item().raw(r#"{"role":"#).str(role).key("content");
        put_blocks(out, blocks);
        out.close(b'}');
    }
    out.close(b']');
    Ok(())
}

fn put_blocks(out: &mut Json, blocks: &[Block]) {
    out.open(b'[');
    for block in blocks {
        out.item();
        match block {
            Block::Text(t) => {
                out.raw(r#"{"type":"text","text":"#).value(t);
            }
            Block::Image(url) => {
                out.raw(r#"{"type":"image","source":"#);
                match url
                    .strip_prefix("data:")
                    .and_then(|d| d.split_once(";base64,"))
                {
                    Some((media_type, data)) => {
                        let source = out.raw(r#"{"type":"base64","media_type":"#);
                        source.str(media_type).key("data").str(data)
                    }
                    None => out.raw(r#"{"type":"url","url":"#).str(url),
                };
                out.close(b'}');
            }
            Block::ToolUse { id, name, input } => {
                let block = out.raw(r#"{"type":"tool_use","id":"#).value(id);
                block.key("name").value(name).key("input").raw(input);
            }
            Block::ToolResult { id, content } => {
                let block = out.raw(r#"{"type":"tool_result","tool_use_id":"#);
                block.value(id).key("content");
                put_blocks(out, content);
            }
        }
        out.close(b'}');
    }
    out.close(b']');
}

/// A message's content as Anthropic blocks: a string as one text block, text parts as text
/// blocks and (where `images`) image parts as image blocks.
fn openai_content<'a>(
    content: Option<&'a RawValue>,
    at: &At,
    images: bool,
) -> Result<Vec<Block<'a>>, Refused> {
    let parts = match content {
        None => return Ok(Vec::new()),
        Some(c) if matches!(c.get(), "null" | r#""""#) => return Ok(Vec::new()),
        Some(s) if is(s, b'"') => return Ok(vec![Block::Text(s)]),
        Some(parts) if is(parts, b'[') => items(Some(parts), &"content")?,
        Some(_) => return refuse(format!("`{at}content` must be a string or an array")),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (k, part) in parts.into_iter().enumerate() {
        let at = At::Item(at, "content", k);
        let p = object_at(part, &at)?;
        match p.get("type").and_then(text).as_deref() {
            Some("text") => {
                p.only(&["type", "text"], &at, TO_ANTHROPIC)?;
                blocks.push(Block::Text(p.raw_str("text", &at)?));
            }
            Some("image_url") if images => {
                p.only(&["type", "image_url"], &at, TO_ANTHROPIC)?;
                let url = match p.get("image_url") {
                    Some(u) if is(u, b'"') => p.str("image_url", &at)?,
                    // `detail` is a hint of how closely to look: Anthropic decides that itself.
                    Some(i) if is(i, b'{') => {
                        object_at(i, &at)?.str("url", &At::Field(&at, "image_url"))?
                    }
                    _ => return refuse(format!("`{at}image_url` must be an object")),
                };
                if url
                    .strip_prefix("data:")
                    .is_some_and(|d| !d.contains(";base64,"))
                {
                    return refuse(format!(
                        "`{at}image_url.url` is a data URL that is not base64: an Anthropic backend takes base64 only"
                    ));
                }
                blocks.push(Block::Image(url));
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

/// A `tool_calls` entry as a `tool_use` block; its arguments must be a JSON object.
fn tool_use<'a>(call: &'a RawValue, at: &At) -> Result<Block<'a>, Refused> {
    let c = object_at(call, at)?;
    c.only(&["id", "type", "function"], at, TO_ANTHROPIC)?;
    let f = match c.get("function") {
        Some(f) => object(f, || format!("`{at}function` must be an object"))?,
        None => return refuse(format!("`{at}function` must be an object")),
    };
    let at_function = At::Field(at, "function");
    let arguments = f.str("arguments", &at_function)?;
    let input = if arguments.trim().is_empty() {
        Cow::Borrowed("{}")
    } else if serde_json::from_str::<&RawValue>(&arguments).is_ok()
        && arguments.trim_start().starts_with('{')
    {
        arguments
    } else {
        return refuse(format!(
            "`{at_function}arguments` must be a JSON object for an Anthropic backend's tool input"
        ));
    };
    Ok(Block::ToolUse {
        id: c.raw_str("id", at)?,
        name: f.raw_str("name", &at_function)?,
        input,
    })
}
