//! Anthropic messages to OpenAI chat completions.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::{
    At, Json, Object, Part, Refused, body_object, is, items, object, objects, put_parts,
    put_text_part, refuse, text,
};

/// Anthropic fields an OpenAI backend has no place for that change no answer: dropped.
/// `context_management` edits Anthropic's own context (clearing old thinking and tool results);
/// an OpenAI engine is sent the whole history the client holds. (`cache_control` on a block or
/// tool, `defer_loading` on a tool, `is_error` on a tool result and thinking blocks in the
/// history are dropped where they stand; see docs/gateway.md.)
const MESSAGES_HINTS: &[&str] = &["service_tier", "context_management", "cache_control"];

const TO_OPENAI: &str = "an OpenAI";

/// What an OpenAI backend reads of an Anthropic client's `thinking` and `output_config.effort`
/// (a backend's `thinking:`): a coding agent sends both on every request, and engines read
/// reasoning switches in different places or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Thinking {
    /// Nothing: whether the model reasons is its chat template's affair, and both are dropped.
    #[default]
    Drop,
    /// vLLM and SGLang: `chat_template_kwargs.enable_thinking`, true for `enabled` and
    /// `adaptive`, false for `disabled` (a reasoning model's template reads it; others ignore it).
    ChatTemplate,
    /// OpenAI's reasoning models (and gpt-oss on vLLM): `reasoning_effort`, the client's
    /// `output_config.effort`, else drawn from `thinking.budget_tokens`.
    ReasoningEffort,
}

/// An Anthropic messages request as an OpenAI chat completions request for `model`, its
/// reasoning switches as the backend reads them (`thinking`).
pub fn messages_to_chat(body: &[u8], model: &str, thinking: Thinking) -> Result<Vec<u8>, Refused> {
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
        "thinking",
        "output_config",
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
    if let Some(system) = req.given("system") {
        system_message(Some(system), (&At::Root, "system"), &mut out)?;
    }
    let Some(messages) = req.get("messages") else {
        return refuse("`messages` must be an array");
    };
    for (i, m) in objects(messages, &"messages")?.into_iter().enumerate() {
        anthropic_message(&m, &At::Item(&At::Root, "messages", i), &mut out)?;
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
        for (i, tool) in objects(tools, &"tools")?.into_iter().enumerate() {
            anthropic_tool(&tool, &At::Item(&At::Root, "tools", i), &mut out)?;
        }
        out.close(b']');
    }
    if let Some(choice) = req.get("tool_choice") {
        anthropic_tool_choice(choice, &mut out)?;
    }
    reasoning(&req, thinking, &mut out)?;
    out.close(b'}');
    Ok(out.0)
}

/// An Anthropic `count_tokens` request as a vLLM / SGLang `/tokenize` request for `model`: the
/// same messages (and tools) a translated `messages` request would send, which the engine
/// renders with the model's own chat template and counts, the generation prompt included.
pub fn count_to_tokenize(body: &[u8], model: &str) -> Result<Vec<u8>, Refused> {
    let chat = messages_to_chat(body, model, Thinking::Drop)?;
    let chat: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&chat)
        .map_err(|e| Refused(format!("the translated request is not an object ({e})")))?;
    let mut tokenize = serde_json::Map::new();
    for key in ["model", "messages", "tools"] {
        if let Some(v) = chat.get(key) {
            tokenize.insert(key.to_owned(), v.clone());
        }
    }
    tokenize.insert("add_generation_prompt".to_owned(), true.into());
    Ok(serde_json::Value::Object(tokenize).to_string().into_bytes())
}

/// `thinking` and `output_config.effort`, checked whatever the backend reads of them, and
/// written as it reads them.
fn reasoning(req: &Object, control: Thinking, out: &mut Json) -> Result<(), Refused> {
    // Some(budget) where thinking is on (a budget only where `enabled` gives one).
    let on: Option<Option<u64>> = match req.given("thinking") {
        None => None,
        Some(t) => {
            let at = At::Field(&At::Root, "thinking");
            let t = object(t, || "`thinking` must be an object".into())?;
            t.only(&["type", "budget_tokens", "display"], &at, TO_OPENAI)?;
            match &*t.str("type", &at)? {
                "enabled" => Some(match t.given("budget_tokens") {
                    None => None,
                    Some(b) => Some(b.get().parse::<u64>().or_else(|_| {
                        refuse("`thinking.budget_tokens` must be a whole number of tokens")
                    })?),
                }),
                "adaptive" => Some(None),
                "disabled" => None,
                other => {
                    return refuse(format!(
                        "`thinking.type` `{other}` is not known (enabled, adaptive and disabled are)"
                    ));
                }
            }
        }
    };
    let effort = match req.given("output_config") {
        None => None,
        Some(c) => {
            let at = At::Field(&At::Root, "output_config");
            let c = object(c, || "`output_config` must be an object".into())?;
            c.only(&["effort"], &at, TO_OPENAI)?;
            match c
                .given("effort")
                .map(|_| c.str("effort", &at))
                .transpose()?
            {
                None => None,
                // OpenAI's scale ends at high.
                Some(e) => Some(match &*e {
                    "low" => "low",
                    "medium" => "medium",
                    "high" | "max" => "high",
                    other => {
                        return refuse(format!(
                            "`output_config.effort` `{other}` is not known (low, medium, high and max are)"
                        ));
                    }
                }),
            }
        }
    };
    match control {
        Thinking::Drop => {}
        Thinking::ChatTemplate => {
            if req.given("thinking").is_some() {
                let switch = if on.is_some() { "true" } else { "false" };
                let kwargs = out.key("chat_template_kwargs");
                kwargs.raw(r#"{"enable_thinking":"#).raw(switch).raw("}");
            }
        }
        Thinking::ReasoningEffort => {
            let from_budget = on.flatten().map(|budget| match budget {
                0..4096 => "low",
                4096..16384 => "medium",
                _ => "high",
            });
            if let Some(effort) = effort.or(from_budget) {
                out.key("reasoning_effort").str(effort);
            }
        }
    }
    Ok(())
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

/// One Anthropic message as OpenAI messages: a user turn's tool results become `tool`
/// messages (first, as they answer the turn before), an assistant's `tool_use` its
/// `tool_calls`.
fn anthropic_message(m: &Object, at: &At, out: &mut Json) -> Result<(), Refused> {
    m.only(&["role", "content"], at, TO_OPENAI)?;
    let role = m.str("role", at)?;
    let assistant = match &*role {
        "user" => false,
        "assistant" => true,
        // Instructions in the middle of the conversation (Claude Code's environment notes): a
        // system message where it stands, as OpenAI chat allows.
        "system" => return system_message(m.get("content"), (at, "content"), out),
        _ => {
            return refuse(format!(
                "`{at}role` must be `user`, `assistant` or `system`"
            ));
        }
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
    for (j, b) in objects(blocks, &format_args!("{at}content"))?
        .into_iter()
        .enumerate()
    {
        let at = At::Item(at, "content", j);
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

/// A system message: the request's `system`, or a `system` turn's `content` (`field` of `at`),
/// its text or its text blocks as text parts.
fn system_message(
    content: Option<&RawValue>,
    (at, field): (&At, &'static str),
    out: &mut Json,
) -> Result<(), Refused> {
    match content {
        Some(s) if is(s, b'"') => {
            out.item()
                .raw(r#"{"role":"system","content":"#)
                .value(s)
                .close(b'}');
        }
        Some(blocks) if is(blocks, b'[') => {
            out.item().raw(r#"{"role":"system","content":["#);
            for (j, block) in items(Some(blocks), &"content")?.into_iter().enumerate() {
                put_text_part(out, text_block(block, &At::Item(at, field, j))?);
            }
            out.close(b']').close(b'}');
        }
        _ => {
            return refuse(format!(
                "`{at}{field}` must be a string or an array of text blocks"
            ));
        }
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

fn anthropic_tool(t: &Object, at: &At, out: &mut Json) -> Result<(), Refused> {
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
            "defer_loading",
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
