//! OpenAI Responses to OpenAI chat completions: a Responses client (Codex) in front of an engine
//! without its own Responses API. (An Anthropic backend is reached through this and
//! `chat_to_messages`.)
//!
//! `input` items become chat messages: `instructions` and developer messages system messages,
//! `function_call` items the `tool_calls` of the assistant message they follow,
//! `function_call_output` items `tool` messages. The model's own reasoning items from earlier
//! turns are dropped, as no chat engine reads them back. Nothing is stored: a request that
//! names a `previous_response_id` is refused, and the client sends the whole conversation, as
//! one with `store: false` does.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::{
    At, Json, Object, Part, Refused, Thinking, body_object, is, object_at, objects, put_parts,
    refuse, text,
};

/// Responses fields a chat completions backend has no place for that change no answer:
/// dropped. (`store` is dropped whatever it asks: the gateway keeps nothing, and its answers
/// say `store: false`.)
const RESPONSES_HINTS: &[&str] = &[
    "store",
    "include",
    "prompt_cache_key",
    "prompt_cache_retention",
    "client_metadata",
    "metadata",
    "service_tier",
    "truncation",
    "safety_identifier",
    "stream_options",
];

const TO_CHAT: &str = "a chat completions";

/// What the gateway does with a tool only OpenAI's own servers run (`web_search`,
/// `file_search`, `code_interpreter`, …) or a `namespace` of tools, for an engine that runs
/// function tools only (a backend's `hosted_tools:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostedTools {
    /// Left out of the request, named in the log and in the response's
    /// `x-tpsgate-dropped-tools`: the model answers without them (Codex offers `web_search` on
    /// every turn and runs without it).
    #[default]
    Drop,
    /// The request is refused, a 400 naming the tool.
    Refuse,
}

/// A Responses request translated for a chat completions backend.
#[derive(Debug)]
pub struct ChatRequest {
    /// The chat completions request.
    pub body: Vec<u8>,
    /// The tools left out ([`HostedTools::Drop`]), by name (or type, where a tool has none).
    pub dropped_tools: Vec<String>,
}

/// An OpenAI Responses request as an OpenAI chat completions request for `model`, its reasoning
/// switches as the backend reads them (`thinking`), its hosted tools dropped or refused
/// (`hosted`).
pub fn responses_to_chat(
    body: &[u8],
    model: &str,
    thinking: Thinking,
    hosted: HostedTools,
) -> Result<ChatRequest, Refused> {
    const FIELDS: &[&str] = &[
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "user",
        "parallel_tool_calls",
        "stream",
        "tools",
        "tool_choice",
        "reasoning",
        "text",
    ];
    let req = body_object(body)?;
    if req.given("previous_response_id").is_some() {
        return refuse(
            "`previous_response_id` cannot be served: the gateway keeps no responses (its answers say `store: false`); send the whole conversation in `input`, as a client with `store: false` does",
        );
    }
    req.only_where(
        |k, v| FIELDS.contains(&k) || RESPONSES_HINTS.contains(&k) || asks_nothing(k, v),
        &At::Root,
        TO_CHAT,
    )?;
    let mut out = Json(Vec::with_capacity(body.len() + 128));
    out.open(b'{').key("model").str(model);
    out.key("messages").open(b'[');
    match req.given("instructions") {
        None => {}
        Some(s) if is(s, b'"') => {
            out.item().raw(r#"{"role":"system","content":"#);
            out.value(s).close(b'}');
        }
        Some(_) => return refuse("`instructions` must be a string"),
    }
    match req.get("input") {
        Some(s) if is(s, b'"') => {
            out.item().raw(r#"{"role":"user","content":"#);
            out.value(s).close(b'}');
        }
        Some(list) if is(list, b'[') => input_items(objects(list, &"input")?, &mut out)?,
        _ => return refuse("`input` must be a string or an array of items"),
    }
    out.close(b']');
    if let Some(max) = req.given("max_output_tokens") {
        out.key("max_tokens").value(max);
    }
    for key in ["temperature", "top_p", "user"] {
        if let Some(v) = req.given(key) {
            out.key(key).value(v);
        }
    }
    if let Some(stream) = req.get("stream") {
        if stream.get() == "true" {
            // `response.completed` carries the usage: the backend is asked for it.
            out.key("stream_options").raw(r#"{"include_usage":true}"#);
        }
        out.key("stream").value(stream);
    }
    let dropped_tools = tools(&req, hosted, &mut out)?;
    if let Some(r) = req.given("reasoning") {
        reasoning(r, thinking, &mut out)?;
    }
    if let Some(t) = req.given("text") {
        text_format(t, &mut out)?;
    }
    out.close(b'}');
    Ok(ChatRequest {
        body: out.0,
        dropped_tools,
    })
}

/// Whether a field passes as a hint because its value asks for nothing: a foreground
/// response, no log probabilities.
fn asks_nothing(key: &str, value: &RawValue) -> bool {
    matches!(
        (key, value.get()),
        ("background", "false" | "null") | ("top_logprobs", "0" | "null")
    )
}

/// The assistant message being gathered: its text parts and the calls that follow them (a
/// Responses client sends each as its own item; chat wants one message).
#[derive(Default)]
struct Assistant<'a> {
    text: Vec<&'a RawValue>,
    calls: Vec<(&'a RawValue, &'a RawValue, &'a RawValue)>,
}

impl Assistant<'_> {
    /// Writes the message gathered, if any, and starts the next.
    fn flush(&mut self, out: &mut Json) {
        if self.text.is_empty() && self.calls.is_empty() {
            return;
        }
        out.item().raw(r#"{"role":"assistant","content":"#);
        match self.text.as_slice() {
            [] => {
                out.raw("null");
            }
            [t] => {
                out.value(t);
            }
            parts => put_parts(
                out,
                &parts.iter().map(|t| Part::Text(t)).collect::<Vec<_>>(),
            ),
        }
        if !self.calls.is_empty() {
            out.key("tool_calls").open(b'[');
            for (id, name, arguments) in self.calls.drain(..) {
                let call = out.item().raw(r#"{"id":"#).value(id);
                let function = call.raw(r#","type":"function","function":{"name":"#);
                function
                    .value(name)
                    .key("arguments")
                    .value(arguments)
                    .raw("}}");
            }
            out.close(b']');
        }
        out.close(b'}');
        self.text.clear();
    }
}

fn input_items(list: Vec<Object<'_>>, out: &mut Json) -> Result<(), Refused> {
    let mut assistant = Assistant::default();
    for (i, item) in list.into_iter().enumerate() {
        let at = At::Item(&At::Root, "input", i);
        let kind = item
            .given("type")
            .map(|_| item.str("type", &at))
            .transpose()?;
        match kind.as_deref().unwrap_or("message") {
            "message" => {
                item.only(&["type", "id", "role", "content", "status"], &at, TO_CHAT)?;
                let role = item.str("role", &at)?;
                if role == "assistant" {
                    assistant_content(item.get("content"), &at, &mut assistant.text)?;
                    continue;
                }
                assistant.flush(out);
                let role = match &*role {
                    "user" => "user",
                    // Chat's system messages may stand anywhere, as Responses' do.
                    "system" | "developer" => "system",
                    other => {
                        return refuse(format!(
                            "`{at}role` `{other}` is not known (user, assistant, system and developer are)"
                        ));
                    }
                };
                message(role, item.get("content"), &at, out)?;
            }
            "function_call" => {
                item.only(
                    &[
                        "type",
                        "id",
                        "call_id",
                        "name",
                        "arguments",
                        "status",
                        "namespace",
                        // The OpenAI SDK's parse of `arguments`, sent back with the item.
                        "parsed_arguments",
                    ],
                    &at,
                    TO_CHAT,
                )?;
                assistant.calls.push((
                    item.raw_str("call_id", &at)?,
                    item.raw_str("name", &at)?,
                    item.raw_str("arguments", &at)?,
                ));
            }
            "function_call_output" => {
                assistant.flush(out);
                item.only(&["type", "id", "call_id", "output", "status"], &at, TO_CHAT)?;
                let id = item.raw_str("call_id", &at)?;
                out.item()
                    .raw(r#"{"role":"tool","tool_call_id":"#)
                    .value(id);
                out.key("content");
                match item.get("output") {
                    Some(s) if is(s, b'"') => {
                        out.value(s);
                    }
                    Some(parts) if is(parts, b'[') => {
                        put_parts(out, &content_parts(parts, (&at, "output"), false)?);
                    }
                    _ => return refuse(format!("`{at}output` must be a string or an array")),
                }
                out.close(b'}');
            }
            // The model's reasoning from an earlier turn: no chat engine reads it back.
            "reasoning" => {}
            other => {
                return refuse(format!(
                    "`{at}type` `{other}` cannot be expressed for a chat completions backend (message, function_call, function_call_output and reasoning items can)"
                ));
            }
        }
    }
    assistant.flush(out);
    Ok(())
}

/// A user or system message: its content a string, or input parts.
fn message(role: &str, content: Option<&RawValue>, at: &At, out: &mut Json) -> Result<(), Refused> {
    out.item()
        .raw(r#"{"role":""#)
        .raw(role)
        .raw(r#"","content":"#);
    match content {
        Some(s) if is(s, b'"') => {
            out.value(s);
        }
        Some(parts) if is(parts, b'[') => {
            put_parts(out, &content_parts(parts, (at, "content"), role == "user")?);
        }
        _ => return refuse(format!("`{at}content` must be a string or an array")),
    }
    out.close(b'}');
    Ok(())
}

/// Input parts as chat parts: `input_text` as text, `input_image` (by URL) as `image_url` where
/// `images` may stand.
fn content_parts<'a>(
    parts: &'a RawValue,
    (at, field): (&At, &'static str),
    images: bool,
) -> Result<Vec<Part<'a>>, Refused> {
    let mut out = Vec::new();
    for (j, p) in objects(parts, &format_args!("{at}{field}"))?
        .into_iter()
        .enumerate()
    {
        let at = At::Item(at, field, j);
        match &*p.str("type", &at)? {
            "input_text" | "output_text" | "text" => {
                p.only(&["type", "text", "annotations", "logprobs"], &at, TO_CHAT)?;
                out.push(Part::Text(p.raw_str("text", &at)?));
            }
            "input_image" if images => {
                p.only(&["type", "image_url", "detail", "file_id"], &at, TO_CHAT)?;
                let url = p.given("image_url").map(|_| p.str("image_url", &at));
                match url.transpose()? {
                    Some(url) => out.push(Part::ImageUrl(url)),
                    None => {
                        return refuse(format!(
                            "`{at}image_url` must be a URL (an image by `file_id` is stored by OpenAI, which a chat completions backend cannot read)"
                        ));
                    }
                }
            }
            other => {
                return refuse(format!(
                    "`{at}type` `{other}` cannot be expressed for a chat completions backend here"
                ));
            }
        }
    }
    Ok(out)
}

/// An assistant message's text parts (`output_text`), gathered into the message being built.
fn assistant_content<'a>(
    content: Option<&'a RawValue>,
    at: &At,
    text: &mut Vec<&'a RawValue>,
) -> Result<(), Refused> {
    match content {
        Some(s) if is(s, b'"') => text.push(s),
        Some(parts) if is(parts, b'[') => {
            for part in content_parts(parts, (at, "content"), false)? {
                if let Part::Text(t) = part {
                    text.push(t);
                }
            }
        }
        _ => return refuse(format!("`{at}content` must be a string or an array")),
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls`: function tools as chat's, the others
/// dropped or refused as `hosted` says; the tools dropped, by name.
fn tools(req: &Object, hosted: HostedTools, out: &mut Json) -> Result<Vec<String>, Refused> {
    let mut dropped = Vec::new();
    let mut kept = 0;
    let list = match req.given("tools") {
        Some(list) => objects(list, &"tools")?,
        None => Vec::new(),
    };
    for (i, t) in list.into_iter().enumerate() {
        let at = At::Item(&At::Root, "tools", i);
        let kind = t.str("type", &at)?;
        if kind != "function" {
            let name = t.given("name").and_then(text).unwrap_or(kind);
            if hosted == HostedTools::Refuse {
                return refuse(format!(
                    "`{at}` is a `{name}` tool, which a chat completions engine cannot run (it runs function tools); remove it, or set the backend's `hosted_tools: drop`"
                ));
            }
            dropped.push(name.into_owned());
            continue;
        }
        t.only(
            &["type", "name", "description", "parameters", "strict"],
            &at,
            TO_CHAT,
        )?;
        if kept == 0 {
            out.key("tools").open(b'[');
        }
        kept += 1;
        let function = out.item().raw(r#"{"type":"function","function":{"name":"#);
        function.value(t.raw_str("name", &at)?);
        for key in ["description", "parameters", "strict"] {
            if let Some(v) = t.given(key) {
                out.key(key).value(v);
            }
        }
        out.raw("}}");
    }
    // Without a tool left, no engine is asked to choose one.
    if kept == 0 {
        return Ok(dropped);
    }
    out.close(b']');
    if let Some(choice) = req.given("tool_choice") {
        out.key("tool_choice");
        if is(choice, b'"') {
            match text(choice).as_deref() {
                Some("auto" | "none" | "required") => out.value(choice),
                _ => return refuse("`tool_choice` must be `auto`, `none` or `required`"),
            };
        } else {
            let at = At::Field(&At::Root, "tool_choice");
            let c = object_at(choice, &at)?;
            match &*c.str("type", &at)? {
                "function" => {
                    c.only(&["type", "name"], &at, TO_CHAT)?;
                    let name = c.raw_str("name", &at)?;
                    let function = out.raw(r#"{"type":"function","function":{"name":"#);
                    function.value(name).raw("}}");
                }
                other => {
                    return refuse(format!(
                        "`tool_choice.type` `{other}` cannot be expressed for a chat completions backend (a function by name can)"
                    ));
                }
            }
        }
    }
    if let Some(p) = req.given("parallel_tool_calls") {
        out.key("parallel_tool_calls").value(p);
    }
    Ok(dropped)
}

/// `reasoning.effort` as the backend reads it (`summary` asks for the reasoning's summary,
/// which is what an engine streams of it anyway).
fn reasoning(r: &RawValue, control: Thinking, out: &mut Json) -> Result<(), Refused> {
    let at = At::Field(&At::Root, "reasoning");
    let r = object_at(r, &at)?;
    r.only(&["effort", "summary", "generate_summary"], &at, TO_CHAT)?;
    let Some(effort) = r
        .given("effort")
        .map(|_| r.str("effort", &at))
        .transpose()?
    else {
        return Ok(());
    };
    let effort: Cow<str> = match &*effort {
        "none" | "minimal" | "low" | "medium" | "high" => effort,
        // Chat's scale ends at high.
        "xhigh" => "high".into(),
        other => {
            return refuse(format!(
                "`reasoning.effort` `{other}` is not known (none, minimal, low, medium, high and xhigh are)"
            ));
        }
    };
    match control {
        Thinking::Drop => {}
        Thinking::ChatTemplate => {
            let on = if matches!(&*effort, "none" | "minimal") {
                "false"
            } else {
                "true"
            };
            let kwargs = out.key("chat_template_kwargs");
            kwargs.raw(r#"{"enable_thinking":"#).raw(on).raw("}");
        }
        Thinking::ReasoningEffort => {
            out.key("reasoning_effort").str(&effort);
        }
    }
    Ok(())
}

/// `text.format` as chat's `response_format` (`verbosity`, a hint, dropped).
fn text_format(t: &RawValue, out: &mut Json) -> Result<(), Refused> {
    let at = At::Field(&At::Root, "text");
    let t = object_at(t, &at)?;
    t.only(&["format", "verbosity"], &at, TO_CHAT)?;
    let Some(format) = t.given("format") else {
        return Ok(());
    };
    let at = At::Field(&at, "format");
    let f = object_at(format, &at)?;
    match &*f.str("type", &at)? {
        "text" => {}
        "json_object" => {
            f.only(&["type"], &at, TO_CHAT)?;
            out.key("response_format").raw(r#"{"type":"json_object"}"#);
        }
        "json_schema" => {
            f.only(
                &["type", "name", "schema", "strict", "description"],
                &at,
                TO_CHAT,
            )?;
            let schema = out.key("response_format");
            schema.raw(r#"{"type":"json_schema","json_schema":{"name":"#);
            match f.given("name") {
                Some(name) => out.value(name),
                None => out.raw(r#""response""#),
            };
            for key in ["schema", "strict", "description"] {
                if let Some(v) = f.given(key) {
                    out.key(key).value(v);
                }
            }
            out.raw("}}");
        }
        other => {
            return refuse(format!(
                "`text.format.type` `{other}` is not known (text, json_object and json_schema are)"
            ));
        }
    }
    Ok(())
}
