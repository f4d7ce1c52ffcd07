//! Anthropic messages to OpenAI chat completions.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::{At, Json, Object, Refused, body_object, is, items, object, object_at, refuse, text};

/// Anthropic fields an OpenAI backend has no place for that change no answer: dropped.
/// (`cache_control` on a block or tool, `is_error` on a tool result and thinking blocks in the
/// history are dropped where they stand; see docs/gateway.md.)
const MESSAGES_HINTS: &[&str] = &["service_tier"];

const TO_OPENAI: &str = "an OpenAI";

/// An Anthropic messages request as an OpenAI chat completions request for `model`.
pub fn messages_to_chat(body: &[u8], model: &str) -> Result<Vec<u8>, Refused> {
    const FIELDS: &[&str] = &[
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
    ];
    let req = body_object(body)?;
    req.only_where(
        |k, _| FIELDS.contains(&k) || MESSAGES_HINTS.contains(&k),
        &At::Root,
        TO_OPENAI,
    )?;
    let mut out = Json(Vec::with_capacity(body.len() + 128));
    out.open(b'{').key("model").str(model);
    out.key("messages").open(b'[');
    match req.given("system") {
        None => {}
        Some(s) if is(s, b'"') => {
            let system = out.item().raw(r#"{"role":"system","content":"#);
            system.value(s).close(b'}');
        }
        Some(blocks) if is(blocks, b'[') => {
            out.item().raw(r#"{"role":"system","content":["#);
            for (i, block) in items(Some(blocks), &"system")?.into_iter().enumerate() {
                let text = text_block(block, &At::Item(&At::Root, "system", i))?;
                put_text_part(&mut out, text);
            }
            out.close(b']').close(b'}');
        }
        Some(_) => return refuse("`system` must be a string or an array of text blocks"),
    }
    for (i, m) in items(req.get("messages"), &"messages")?
        .into_iter()
        .enumerate()
    {
        anthropic_message(m, &At::Item(&At::Root, "messages", i), &mut out)?;
    }
    out.close(b']');
    for key in ["max_tokens", "temperature", "top_p", "top_k"] {
        if let Some(v) = req.get(key) {
            out.key(key).value(v);
        }
    }
    if let Some(v) = req.get("stop_sequences") {
        out.key("stop").value(v);
    }
    if let Some(v) = req.get("metadata") {
        let metadata = At::Field(&At::Root, "metadata");
        let meta = object(v, || "`metadata` must be an object".into())?;
        meta.only(&["user_id"], &metadata, TO_OPENAI)?;
        if let Some(user) = meta.given("user_id") {
            out.key("user").value(user);
        }
    }
    if let Some(stream) = req.get("stream") {
        if stream.get() == "true" {
            // Usage comes back to an Anthropic client always: the backend is asked for it.
            out.key("stream_options").raw(r#"{"include_usage":true}"#);
        }
        out.key("stream").value(stream);
    }
    if let Some(tools) = req.given("tools") {
        out.key("tools").open(b'[');
        for (i, tool) in items(Some(tools), &"tools")?.into_iter().enumerate() {
            anthropic_tool(tool, &At::Item(&At::Root, "tools", i), &mut out)?;
        }
        out.close(b']');
    }
    if let Some(choice) = req.get("tool_choice") {
        anthropic_tool_choice(choice, &mut out)?;
    }
    out.close(b'}');
    Ok(out.0)
}

/// A text block's text, as it stands.
fn text_block<'a>(block: &'a RawValue, at: &At) -> Result<&'a RawValue, Refused> {
    let b = object(block, || format!("`{at}` must be a block object"))?;
    if b.get("type").and_then(text).as_deref() != Some("text") {
        return refuse(format!("`{at}type` must be `text` here"));
    }
    text_of(&b, at)
}

/// The text of a block whose type is `text` (its `cache_control` dropped).
fn text_of<'a>(b: &Object<'a>, at: &At) -> Result<&'a RawValue, Refused> {
    b.only(&["type", "text", "cache_control"], at, TO_OPENAI)?;
    b.raw_str("text", at)
}

fn put_text_part(out: &mut Json, text: &RawValue) {
    out.item()
        .raw(r#"{"type":"text","text":"#)
        .value(text)
        .close(b'}');
}

/// A part of an OpenAI user message.
enum Part<'a> {
    Text(&'a RawValue),
    ImageUrl(Cow<'a, str>),
}

/// An image block as an OpenAI `image_url` part: base64 as a data URL, or the URL.
fn image_part<'a>(b: &Object<'a>, at: &At) -> Result<Part<'a>, Refused> {
    b.only(&["type", "source", "cache_control"], at, TO_OPENAI)?;
    let source = match b.get("source") {
        Some(s) => object(s, || format!("`{at}source` must be an object"))?,
        None => return refuse(format!("`{at}source` must be an object")),
    };
    let at = At::Field(at, "source");
    match &*source.str("type", &at)? {
        "base64" => Ok(Part::ImageUrl(Cow::Owned(format!(
            "data:{};base64,{}",
            source.str("media_type", &at)?,
            source.str("data", &at)?
        )))),
        "url" => Ok(Part::ImageUrl(source.str("url", &at)?)),
        other => refuse(format!(
            "`{at}type` `{other}` cannot be expressed for an OpenAI backend (base64 and url can)"
        )),
    }
}

fn put_parts(out: &mut Json, parts: &[Part]) {
    out.open(b'[');
    for part in parts {
        match part {
            Part::Text(t) => put_text_part(out, t),
            Part::ImageUrl(url) => {
                let image = out.item().raw(r#"{"type":"image_url","image_url":{"url":"#);
                image.str(url).raw("}}");
            }
        }
    }
    out.close(b']');
}

/// One Anthropic message as OpenAI messages: a user turn's tool results become `tool`
/// messages (first, as they answer the turn before), an assistant's `tool_use` its
/// `tool_calls`.
fn anthropic_message(m: &RawValue, at: &At, out: &mut Json) -> Result<(), Refused> {
    let m = object_at(m, at)?;
    m.only(&["role", "content"], at, TO_OPENAI)?;
    let role = m.str("role", at)?;
    let assistant = match &*role {
        "user" => false,
        "assistant" => true,
        _ => return refuse(format!("`{at}role` must be `user` or `assistant`")),
    };
    let content = m.get("content");
    if let Some(s) = content.filter(|c| is(c, b'"')) {
        let message = out.item().raw(r#"{"role":"#).str(&role);
        message.key("content").value(s).close(b'}');
        return Ok(());
    }
    let Some(blocks) = content.filter(|c| is(c, b'[')) else {
        return refuse(format!("`{at}content` must be a string or an array"));
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in items(Some(blocks), &"content")?.into_iter().enumerate() {
        let at = At::Item(at, "content", j);
        let b = object(block, || format!("`{at}` must be a block object"))?;
        match (assistant, b.get("type").and_then(text).as_deref()) {
            (_, Some("text")) => parts.push(Part::Text(text_of(&b, &at)?)),
            (false, Some("image")) => parts.push(image_part(&b, &at)?),
            (false, Some("tool_result")) => tool_result(&b, &at, out)?,
            (true, Some("tool_use")) => {
                b.only(
                    &["type", "id", "name", "input", "cache_control"],
                    &at,
                    TO_OPENAI,
                )?;
                calls.push((
                    b.raw_str("id", &at)?,
                    b.raw_str("name", &at)?,
                    b.get("input"),
                ));
            }
            // The model's own reasoning from an earlier turn: no OpenAI engine reads it back.
            (true, Some("thinking" | "redacted_thinking")) => {}
            (_, kind) => {
                return refuse(format!(
                    "`{at}type` `{}` in a {role} message cannot be expressed for an OpenAI backend",
                    kind.unwrap_or("(none)")
                ));
            }
        }
    }
    if assistant {
        out.item().raw(r#"{"role":"assistant","content":"#);
        match parts.as_slice() {
            [] => {
                out.raw("null");
            }
            [Part::Text(t)] => {
                out.value(t);
            }
            _ => put_parts(out, &parts),
        }
        if !calls.is_empty() {
            out.key("tool_calls").open(b'[');
            for (id, name, input) in calls {
                let call = out.item().raw(r#"{"id":"#).value(id);
                let function = call.raw(r#","type":"function","function":{"name":"#);
                let arguments = function.value(name).key("arguments");
                arguments.str(input.map_or("{}", RawValue::get)).raw("}}");
            }
            out.close(b']');
        }
        out.close(b'}');
    } else if !parts.is_empty() {
        out.item().raw(r#"{"role":"user","content":"#);
        put_parts(out, &parts);
        out.close(b'}');
    }
    Ok(())
}

/// A `tool_result` block as a `tool` message (its `is_error` dropped: the content says what
/// failed).
fn tool_result(b: &Object, at: &At, out: &mut Json) -> Result<(), Refused> {
    b.only(
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
        at,
        TO_OPENAI,
    )?;
    let id = b.raw_str("tool_use_id", at)?;
    out.item()
        .raw(r#"{"role":"tool","tool_call_id":"#)
        .value(id);
    out.key("content");
    match b.given("content") {
        None => out.raw(r#""""#),
        Some(s) if is(s, b'"') => out.value(s),
        Some(blocks) if is(blocks, b'[') => {
            out.open(b'[');
            for (k, block) in items(Some(blocks), &"content")?.into_iter().enumerate() {
                put_text_part(out, text_block(block, &At::Item(at, "content", k))?);
            }
            out.close(b']')
        }
        Some(_) => return refuse(format!("`{at}content` must be a string or an array")),
    };
    out.close(b'}');
    Ok(())
}

fn anthropic_tool(t: &RawValue, at: &At, out: &mut Json) -> Result<(), Refused> {
    let t = object_at(t, at)?;
    if let Some(kind) = t.get("type").and_then(text).filter(|k| k != "custom") {
        return refuse(format!(
            "`{at}type` `{kind}` is a server tool of Anthropic's: an OpenAI backend has none"
        ));
    }
    t.only(
        &[
            "type",
            "name",
            "description",
            "input_schema",
            "cache_control",
        ],
        at,
        TO_OPENAI,
    )?;
    let name = t.raw_str("name", at)?;
    let function = out.item().raw(r#"{"type":"function","function":{"name":"#);
    function.value(name);
    if let Some(d) = t.get("description") {
        out.key("description").value(d);
    }
    out.key("parameters");
    match t.get("input_schema") {
        Some(schema) => out.value(schema),
        None => out.raw(r#"{"type":"object"}"#),
    };
    out.raw("}}");
    Ok(())
}

fn anthropic_tool_choice(choice: &RawValue, out: &mut Json) -> Result<(), Refused> {
    let at = At::Field(&At::Root, "tool_choice");
    let choice = object(choice, || "`tool_choice` must be an object".into())?;
    choice.only(
        &["type", "name", "disable_parallel_tool_use"],
        &at,
        TO_OPENAI,
    )?;
    out.key("tool_choice");
    match &*choice.str("type", &at)? {
        "auto" => out.raw(r#""auto""#),
        "any" => out.raw(r#""required""#),
        "none" => out.raw(r#""none""#),
        "tool" => {
            let name = choice.str("name", &at)?;
            let function = out.raw(r#"{"type":"function","function":{"name":"#);
            function.str(&name).raw("}}")
        }
        other => return refuse(format!("`tool_choice.type` `{other}` is not known")),
    };
    if choice
        .get("disable_parallel_tool_use")
        .is_some_and(|d| d.get() == "true")
    {
        out.key("parallel_tool_calls").raw("false");
    }
    Ok(())
}
