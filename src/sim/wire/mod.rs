//! What the simulator says on the wire: request parsing and the exact bytes of OpenAI chat
//! completions, completions and Anthropic messages, streamed and not, as vLLM and Anthropic's API
//! send them.
//!
//! Prompt tokens are estimated deterministically: the UTF-8 bytes of the prompt text (message
//! contents, text parts, the system prompt, or the completion prompt) divided by 4, rounded up.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{Value, json};

use super::config::{StreamOptions, UsageStyle};

/// The API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/messages` (Anthropic).
    Messages,
}

/// What the engine needs to know about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GenRequest {
    /// Requested model.
    pub model: String,
    /// Stream with SSE.
    pub stream: bool,
    /// Output cap the client asked for, if any.
    pub max_tokens: Option<u32>,
    /// OpenAI: `stream_options.include_usage`; Anthropic always reports usage.
    pub include_usage: bool,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// Of those, served from the prefix cache (0 without one).
    pub cached_tokens: u32,
    /// Whether usage reports cached tokens (the backend has a prefix cache).
    pub reports_cache: bool,
    /// The chained hashes of the prompt text's whole blocks ([`crate::prefix::Chain`]), when
    /// parsed for a prefix cache.
    pub prefix: Vec<u64>,
    /// The tool the answer calls (its name, and its arguments as its schema allows): the one
    /// `tool_choice` names, else the first of `tools`, unless the conversation's last turn is a
    /// tool's result (then the answer is text) or `tool_choice` is `none`.
    pub tool: Option<(String, ToolArguments)>,
    /// `stop` (OpenAI) or `stop_sequences` (Anthropic).
    pub stop: Vec<String>,
    /// The stop sequence that ended the answer, once the server has found it in the text.
    pub stopped_by: Option<String>,
}

/// Why a request body was refused; becomes a 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest(pub String);

#[derive(Deserialize)]
struct RawRequest {
    model: Option<String>,
    messages: Option<Value>,
    prompt: Option<Value>,
    system: Option<Value>,
    stream: Option<bool>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    stream_options: Option<RawStreamOptions>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    stop: Option<Value>,
    stop_sequences: Option<Value>,
}

#[derive(Deserialize)]
struct RawStreamOptions {
    include_usage: Option<bool>,
}

impl Dialect {
    #[cfg(test)]
    /// Parses a request body of this dialect.
    pub(crate) fn parse(self, body: &[u8]) -> Result<GenRequest, BadRequest> {
        self.parse_for_cache(body, None)
    }

    /// Parses a request body of this dialect and, given the bytes of a prefix-cache block
    /// (tokens per block times the 4 bytes a token is taken for), hashes the prompt text in
    /// such blocks: the system prompt, then each message's text, as the engine would see the
    /// tokens (the model seeds the chain).
    pub(crate) fn parse_for_cache(
        self,
        body: &[u8],
        block_bytes: Option<usize>,
    ) -> Result<GenRequest, BadRequest> {
        let raw: RawRequest = serde_json::from_slice(body)
            .map_err(|e| BadRequest(format!("invalid JSON body: {e}")))?;
        let model = raw
            .model
            .filter(|m| !m.is_empty())
            .ok_or_else(|| BadRequest("missing required field `model`".into()))?;
        let mut chain = block_bytes.map(|b| crate::prefix::Chain::new(model.as_bytes(), b));
        let mut text_bytes = 0;
        let mut text = |t: &str| {
            text_bytes += t.len();
            if let Some(chain) = &mut chain {
                chain.feed(t.as_bytes());
            }
        };
        match self {
            Self::Chat | Self::Messages => {
                let messages = raw
                    .messages
                    .as_ref()
                    .ok_or_else(|| BadRequest("missing required field `messages`".into()))?;
                let Value::Array(list) = messages else {
                    return Err(BadRequest("`messages` must be an array".into()));
                };
                if let Some(system) = &raw.system {
                    content_text(system, &mut text);
                }
                for content in list.iter().filter_map(|m| m.get("content")) {
                    content_text(content, &mut text);
                }
            }
            Self::Completions => {
                let prompt = raw
                    .prompt
                    .ok_or_else(|| BadRequest("missing required field `prompt`".into()))?;
                content_text(&prompt, &mut text);
            }
        }
        let max_tokens = raw.max_completion_tokens.or(raw.max_tokens);
        if self == Self::Messages && max_tokens.is_none() {
            return Err(BadRequest("missing required field `max_tokens`".into()));
        }
        if max_tokens == Some(0) {
            return Err(BadRequest("`max_tokens` must be at least 1".into()));
        }
        let include_usage = self == Self::Messages
            || raw
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false);
        let tool = tool_to_call(
            raw.tools.as_ref(),
            raw.tool_choice.as_ref(),
            raw.messages.as_ref(),
        );
        let stop = match raw.stop.or(raw.stop_sequences) {
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(list)) => list
                .into_iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        Ok(GenRequest {
            tool,
            stop,
            stopped_by: None,
            model,
            stream: raw.stream.unwrap_or(false),
            max_tokens,
            include_usage,
            prompt_tokens: u32::try_from(text_bytes.div_ceil(4)).unwrap_or(u32::MAX),
            cached_tokens: 0,
            reports_cache: false,
            prefix: chain.map(crate::prefix::Chain::finish).unwrap_or_default(),
        })
    }

    /// An error body in this dialect's shape.
    pub(crate) fn error_body(self, kind: &str, code: &str, message: &str) -> Bytes {
        let body = match self {
            Self::Messages => json!({"type": "error", "error": {"type": kind, "message": message}}),
            Self::Chat | Self::Completions => {
                json!({"error": {"message": message, "type": kind, "code": code}})
            }
        };
        Bytes::from(body.to_string())
    }
}

/// The tool an answer to this request calls, in either dialect's shapes (see
/// [`GenRequest::tool`]).
fn tool_to_call(
    tools: Option<&Value>,
    choice: Option<&Value>,
    messages: Option<&Value>,
) -> Option<(String, ToolArguments)> {
    let tools = tools?.as_array()?;
    let first = tools.first()?;
    let answered = messages
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .is_some_and(|last| {
            last["role"] == "tool"
                || last["content"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"))
        });
    let none = choice.is_some_and(|c| c == "none" || c["type"] == "none");
    if answered || none {
        return None;
    }
    let name_of = |t: &Value| {
        t["function"]["name"]
            .as_str()
            .or(t["name"].as_str())
            .map(str::to_owned)
    };
    let named = choice.and_then(|c| c["function"]["name"].as_str().or(c["name"].as_str()));
    let name = named.map(str::to_owned).or_else(|| name_of(first))?;
    let schema = tools
        .iter()
        .find(|t| name_of(t).as_deref() == Some(name.as_str()))
        .and_then(|t| t["function"].get("parameters").or(t.get("input_schema")));
    Some((name, ToolArguments::for_schema(schema)))
}

/// A tool call's arguments, valid for the tool's parameter schema: each required property
/// with the least value of its type (an enum's first value), and the generated tokens as the
/// text of one string property (the first required one, else the first, else `text`). As the
/// JSON text before and after the tokens, escaped as a JSON string's content (how they stream
/// in `arguments` and `partial_json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolArguments {
    /// Before the tokens, escaped (`{\"cmd\":\"`).
    pub open: String,
    /// After them, escaped (`\"}`).
    pub close: String,
}

impl ToolArguments {
    /// The arguments for a tool whose parameters are `schema` (JSON Schema; absent: any).
    pub(crate) fn for_schema(schema: Option<&Value>) -> Self {
        const TOKENS: &str = "\u{1}";
        let properties = schema
            .and_then(|s| s["properties"].as_object())
            .filter(|p| !p.is_empty());
        let required: Vec<&str> = schema
            .and_then(|s| s["required"].as_array())
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let is_string = |name: &str| {
            properties
                .and_then(|p| p.get(name))
                .is_some_and(|p| p["type"] == "string" && p.get("enum").is_none())
        };
        let text_field = required
            .iter()
            .copied()
            .find(|n| is_string(n))
            .or_else(|| {
                properties.and_then(|p| p.keys().map(String::as_str).find(|n| is_string(n)))
            })
            .unwrap_or("text");
        let mut arguments = serde_json::Map::new();
        for name in required.iter().copied().chain([text_field]) {
            let value = if name == text_field {
                Value::from(TOKENS)
            } else {
                least_value(properties.and_then(|p| p.get(name)))
            };
            arguments.insert(name.to_owned(), value);
        }
        let text = Value::Object(arguments).to_string();
        let at = text.find("\\u0001").unwrap_or(text.len());
        let escaped = |s: &str| {
            let quoted = Value::from(s).to_string();
            quoted[1..quoted.len() - 1].to_owned()
        };
        Self {
            open: escaped(&text[..at]),
            close: escaped(text.get(at + "\\u0001".len()..).unwrap_or("")),
        }
    }

    /// The arguments whole, with `tokens` as the text.
    pub(crate) fn with(&self, tokens: &str) -> Value {
        let unescaped =
            |s: &str| serde_json::from_str::<String>(&format!("\"{s}\"")).unwrap_or_default();
        let tokens = Value::from(tokens).to_string();
        let text = format!(
            "{}{}{}",
            unescaped(&self.open),
            &tokens[1..tokens.len() - 1],
            unescaped(&self.close)
        );
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }
}

/// The least value a property's schema allows: its enum's first, else by its type.
fn least_value(schema: Option<&Value>) -> Value {
    let Some(schema) = schema else {
        return Value::Null;
    };
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("string") => Value::from("x"),
        Some("integer" | "number") => Value::from(1),
        Some("boolean") => Value::Bool(false),
        Some("array") => Value::Array(Vec::new()),
        Some("object") => Value::Object(serde_json::Map::new()),
        _ => Value::Null,
    }
}

/// Where the first of `stop` appears in the answer's text of `target` tokens, after its first
/// token: the tokens before it and the sequence (the stop sequence itself is not sent).
pub(crate) fn stop_within(stop: &[String], target: u32) -> Option<(u32, String)> {
    let text = token_text(0, target);
    let first = WORDS[0].len();
    let (at, sequence) = stop
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| Some((text[first..].find(s.as_str())? + first, s)))
        .min_by_key(|(at, _)| *at)?;
    let mut end = 0;
    let mut tokens = 0;
    while tokens < target {
        let next = end + WORDS[tokens as usize % WORDS.len()].len();
        if next > at {
            break;
        }
        end = next;
        tokens += 1;
    }
    Some((tokens.max(1), sequence.clone()))
}

/// The text of a content value, in order: a string, or text parts
/// (`[{"type":"text","text":...}]`).
fn content_text(value: &Value, text: &mut impl FnMut(&str)) {
    match value {
        Value::String(s) => text(s),
        Value::Array(parts) => {
            for part in parts {
                match part {
                    Value::String(s) => text(s),
                    other => {
                        if let Some(t) = other.get("text").and_then(Value::as_str) {
                            text(t);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// The words tokens are made of; token `i` is `WORDS[i % WORDS.len()]`.
const WORDS: [&str; 16] = [
    " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", " and", " keeps",
    " running", " past", " our", " gateway", ".",
];

fn push_tokens(buf: &mut BytesMut, first: u32, count: u32) {
    for i in first..first + count {
        buf.put_slice(WORDS[i as usize % WORDS.len()].as_bytes());
    }
}

/// The text of `count` tokens starting at token `first`.
pub fn token_text(first: u32, count: u32) -> String {
    (first..first + count)
        .map(|i| WORDS[i as usize % WORDS.len()])
        .collect()
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The client's max_tokens was reached.
    Length,
    /// The model "chose" to stop (the request named no max_tokens).
    Stop,
    /// A stop sequence came ([`GenRequest::stopped_by`]).
    StopSequence,
    /// The answer is a call of [`GenRequest::tool`].
    ToolUse,
}

impl Finish {
    fn openai(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Stop | Self::StopSequence => "stop",
            Self::ToolUse => "tool_calls",
        }
    }

    fn anthropic(self) -> &'static str {
        match self {
            Self::Length => "max_tokens",
            Self::Stop => "end_turn",
            Self::StopSequence => "stop_sequence",
            Self::ToolUse => "tool_use",
        }
    }
}

/// Builds the SSE bytes of one streamed response. The per-request JSON around each token is
/// rendered once, so a chunk costs one buffer and a few copies.
#[derive(Debug)]
pub(crate) struct Framer {
    dialect: Dialect,
    /// Everything before the token text of a content event.
    prefix: String,
    /// Id, object, created and model fields shared by OpenAI chunks.
    envelope: String,
    usage: UsageStyle,
    include_usage: bool,
    send_done: bool,
    prompt_tokens: u32,
    cached_tokens: u32,
    reports_cache: bool,
    /// The tool the answer calls: the call's id, its name (JSON), and its arguments around the
    /// tokens.
    tool: Option<(String, String, ToolArguments)>,
    /// The stop sequence that ended the answer, as a JSON string.
    stopped_by: Option<String>,
}

impl Framer {
    /// A framer for one response; `id` and `created` (unix seconds) identify it.
    pub(crate) fn new(
        dialect: Dialect,
        req: &GenRequest,
        id: &str,
        created: u64,
        stream: StreamOptions,
    ) -> Self {
        let usage = stream.usage;
        let model = Value::String(req.model.clone()).to_string();
        let envelope = match dialect {
            Dialect::Chat => format!(
                r#""id":"chatcmpl-{id}","object":"chat.completion.chunk","created":{created},"model":{model}"#
            ),
            Dialect::Completions => format!(
                r#""id":"cmpl-{id}","object":"text_completion","created":{created},"model":{model}"#
            ),
            Dialect::Messages => format!(r#""id":"msg_{id}","model":{model}"#),
        };
        let prefix = match dialect {
            Dialect::Chat => {
                format!(r#"data: {{{envelope},"choices":[{{"index":0,"delta":{{"content":""#)
            }
            Dialect::Completions => {
                format!(r#"data: {{{envelope},"choices":[{{"index":0,"text":""#)
            }
            Dialect::Messages => r#"event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""#
                .to_owned(),
        };
        Self {
            dialect,
            prefix,
            envelope,
            usage,
            include_usage: req.include_usage
                && (dialect == Dialect::Messages || usage != UsageStyle::Never),
            send_done: stream.send_done,
            prompt_tokens: req.prompt_tokens,
            cached_tokens: req.cached_tokens,
            reports_cache: req.reports_cache,
            tool: req.tool.clone().map(|(name, arguments)| {
                let call = match dialect {
                    Dialect::Messages => format!("toolu_{id}"),
                    _ => format!("call_{id}"),
                };
                (call, Value::String(name).to_string(), arguments)
            }),
            stopped_by: req.stopped_by.clone().map(|s| Value::String(s).to_string()),
        }
    }

    fn usage_json(&self, output_tokens: u32) -> String {
        let p = self.prompt_tokens;
        let details = if self.reports_cache {
            format!(
                r#","prompt_tokens_details":{{"cached_tokens":{}}}"#,
                self.cached_tokens
            )
        } else {
            String::new()
        };
        format!(
            r#""usage":{{"prompt_tokens":{p},"total_tokens":{},"completion_tokens":{output_tokens}{details}}}"#,
            p + output_tokens
        )
    }

    /// What is sent before any token: the role-only chunk (chat), message_start and
    /// content_block_start (Anthropic), or nothing (completions).
    pub(crate) fn head(&self) -> Option<Bytes> {
        match self.dialect {
            Dialect::Chat => Some(Bytes::from(format!(
                "data: {{{},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
                self.envelope
            ))),
            Dialect::Completions => None,
            Dialect::Messages => Some(Bytes::from(format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{{},\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{{},\"output_tokens\":1}}}}}}\n\n\
                 event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{}}}\n\n\
                 event: ping\ndata: {{\"type\":\"ping\"}}\n\n",
                self.envelope,
                anthropic_input(self.prompt_tokens, self.cached_tokens, self.reports_cache),
                match &self.tool {
                    Some((id, name, _)) => format!(
                        "{{\"type\":\"tool_use\",\"id\":\"{id}\",\"name\":{name},\"input\":{{}}}}"
                    ),
                    None => "{\"type\":\"text\",\"text\":\"\"}".to_owned(),
                }
            ))),
        }
    }

    /// One content event carrying tokens `first .. first + count`. `finish` marks the last one
    /// (OpenAI puts finish_reason, and usage when asked to, on it).
    pub(crate) fn content(&self, first: u32, count: u32, finish: Option<Finish>) -> Bytes {
        if let Some((id, name, arguments)) = &self.tool {
            return self.tool_content((id, name, arguments), first, count, finish);
        }
        let mut buf = BytesMut::with_capacity(self.prefix.len() + 128 + 8 * count as usize);
        buf.put_slice(self.prefix.as_bytes());
        push_tokens(&mut buf, first, count);
        match (self.dialect, finish) {
            (Dialect::Messages, _) => buf.put_slice(b"\"}}\n\n"),
            (Dialect::Chat, None) => {
                buf.put_slice(b"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
            }
            (Dialect::Completions, None) => {
                buf.put_slice(b"\",\"logprobs\":null,\"finish_reason\":null}]}\n\n")
            }
            (Dialect::Chat | Dialect::Completions, Some(finish)) => {
                let close = if self.dialect == Dialect::Chat {
                    "\"}"
                } else {
                    "\""
                };
                buf.put_slice(close.as_bytes());
                buf.put_slice(b",\"logprobs\":null,\"finish_reason\":\"");
                buf.put_slice(finish.openai().as_bytes());
                buf.put_u8(b'"');
                if let (Finish::StopSequence, Some(s)) = (finish, &self.stopped_by) {
                    // vLLM names the stop string that ended the answer.
                    buf.put_slice(b",\"stop_reason\":");
                    buf.put_slice(s.as_bytes());
                }
                buf.put_slice(b"}]");
                if self.include_usage && self.usage == UsageStyle::FinishChunk {
                    buf.put_u8(b',');
                    buf.put_slice(self.usage_json(first + count).as_bytes());
                }
                buf.put_slice(b"}\n\n");
            }
        }
        buf.freeze()
    }

    /// A content event of a tool call: its arguments' next tokens (the first opens them with
    /// the call's id and name, the last closes them).
    fn tool_content(
        &self,
        (id, name, arguments): (&str, &str, &ToolArguments),
        first: u32,
        count: u32,
        finish: Option<Finish>,
    ) -> Bytes {
        let mut buf = BytesMut::with_capacity(self.envelope.len() + 256 + 8 * count as usize);
        match self.dialect {
            Dialect::Messages => buf.put_slice(
                b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"",
            ),
            Dialect::Chat | Dialect::Completions => {
                buf.put_slice(b"data: {");
                buf.put_slice(self.envelope.as_bytes());
                buf.put_slice(b",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,");
                if first == 0 {
                    buf.put_slice(format!("\"id\":\"{id}\",\"type\":\"function\",\"function\":{{\"name\":{name},").as_bytes());
                } else {
                    buf.put_slice(b"\"function\":{");
                }
                buf.put_slice(b"\"arguments\":\"");
            }
        }
        if first == 0 {
            buf.put_slice(arguments.open.as_bytes());
        }
        push_tokens(&mut buf, first, count);
        if finish.is_some() {
            buf.put_slice(arguments.close.as_bytes());
        }
        match self.dialect {
            Dialect::Messages => buf.put_slice(b"\"}}\n\n"),
            Dialect::Chat | Dialect::Completions => {
                buf.put_slice(b"\"}}]},\"logprobs\":null,\"finish_reason\":");
                match finish {
                    Some(f) => {
                        buf.put_u8(b'"');
                        buf.put_slice(f.openai().as_bytes());
                        buf.put_slice(b"\"}]");
                        if self.include_usage && self.usage == UsageStyle::FinishChunk {
                            buf.put_u8(b',');
                            buf.put_slice(self.usage_json(first + count).as_bytes());
                        }
                        buf.put_slice(b"}\n\n");
                    }
                    None => buf.put_slice(b"null}]}\n\n"),
                }
            }
        }
        buf.freeze()
    }

    /// The OpenAI finish chunk with no text, after `output_tokens` whose text was held back;
    /// Anthropic has none (its message_delta in the tail says how the generation ended).
    pub(crate) fn finish_only(&self, output_tokens: u32, finish: Finish) -> Option<Bytes> {
        (self.dialect != Dialect::Messages).then(|| self.content(output_tokens, 0, Some(finish)))
    }

    /// Everything after the last content event: the usage chunk (when asked for and not on the
    /// finish chunk) and `[DONE]` (OpenAI); content_block_stop, message_delta, message_stop
    /// (Anthropic).
    pub(crate) fn tail(&self, output_tokens: u32, finish: Finish) -> Bytes {
        match self.dialect {
            Dialect::Chat | Dialect::Completions => {
                let mut out = String::new();
                if self.include_usage && self.usage == UsageStyle::FinalChunk {
                    out.push_str(&format!(
                        "data: {{{},\"choices\":[],{}}}\n\n",
                        self.envelope,
                        self.usage_json(output_tokens)
                    ));
                }
                if self.send_done {
                    out.push_str("data: [DONE]\n\n");
                }
                Bytes::from(out)
            }
            Dialect::Messages => Bytes::from(format!(
                "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
                 event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":{}}},\"usage\":{{\"output_tokens\":{output_tokens}}}}}\n\n\
                 event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
                finish.anthropic(),
                self.stopped_by.as_deref().unwrap_or("null"),
            )),
        }
    }
}

/// Anthropic's input fields: `input_tokens` counts only what was not read from the cache, and
/// `cache_read_input_tokens` the rest (Anthropic's prompt caching reports it so).
fn anthropic_input(prompt: u32, cached: u32, reports_cache: bool) -> String {
    if reports_cache {
        format!(
            r#""input_tokens":{},"cache_creation_input_tokens":0,"cache_read_input_tokens":{cached}"#,
            prompt - cached.min(prompt)
        )
    } else {
        format!(r#""input_tokens":{prompt}"#)
    }
}

fn anthropic_usage_value(req: &GenRequest, output_tokens: u32) -> Value {
    let input = anthropic_input(req.prompt_tokens, req.cached_tokens, req.reports_cache);
    serde_json::from_str(&format!(r#"{{{input},"output_tokens":{output_tokens}}}"#))
        .unwrap_or(Value::Null)
}

/// The whole non-streamed response body.
pub(crate) fn complete_body(
    dialect: Dialect,
    req: &GenRequest,
    id: &str,
    created: u64,
    output_tokens: u32,
    finish: Finish,
) -> Bytes {
    let text = token_text(0, output_tokens);
    let p = req.prompt_tokens;
    let mut usage = json!({"prompt_tokens": p, "completion_tokens": output_tokens, "total_tokens": p + output_tokens});
    if req.reports_cache {
        usage["prompt_tokens_details"] = json!({"cached_tokens": req.cached_tokens});
    }
    let mut body = match dialect {
        Dialect::Chat => json!({
            "id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": created,
            "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": null, "finish_reason": finish.openai()}],
            "usage": usage,
        }),
        Dialect::Completions => json!({
            "id": format!("cmpl-{id}"), "object": "text_completion", "created": created,
            "model": req.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish.openai()}],
            "usage": usage,
        }),
        Dialect::Messages => json!({
            "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": req.model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": finish.anthropic(), "stop_sequence": req.stopped_by,
            "usage": anthropic_usage_value(req, output_tokens),
        }),
    };
    if let Some((name, arguments)) = &req.tool {
        let arguments = arguments.with(&token_text(0, output_tokens));
        match dialect {
            Dialect::Chat => {
                body["choices"][0]["message"] = json!({"role": "assistant", "content": null,
                    "tool_calls": [{"id": format!("call_{id}"), "type": "function",
                                    "function": {"name": name, "arguments": arguments.to_string()}}]});
            }
            Dialect::Messages => {
                body["content"] = json!([{"type": "tool_use", "id": format!("toolu_{id}"),
                                          "name": name, "input": arguments}]);
            }
            Dialect::Completions => {}
        }
    }
    if let (Dialect::Chat, Some(stop)) = (dialect, &req.stopped_by) {
        body["choices"][0]["stop_reason"] = json!(stop);
    }
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests;
