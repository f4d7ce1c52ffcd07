//! An Anthropic message stream as OpenAI chat completion chunks, event by event.
//!
//! `message_start` gives the role chunk; each `text_delta` is one content chunk, each
//! `tool_use` block a `tool_calls` entry whose `input_json_delta`s are its argument fragments
//! (a `thinking_delta` is `reasoning_content`, as vLLM streams reasoning); `message_delta` is
//! the finish chunk, followed by the usage chunk when the client asked for it
//! (`stream_options.include_usage`); `message_stop` is `[DONE]`. Text is copied as the JSON
//! string it came as: never unescaped, never allocated.

use std::borrow::Cow;
use std::marker::PhantomData;

use bytes::BytesMut;
use serde::de::{Deserialize, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::{EventTranslation, put_raw_str, put_u64, unquoted};

/// Deserializes an array as its first element, skipping the rest (a translated request asks
/// for one choice, so no more come).
pub(super) fn first<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct First<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for First<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
            let first = seq.next_element()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
        fn visit_unit<E>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
    }
    d.deserialize_any(First(PhantomData))
}

#[derive(serde::Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    content_block: Option<Block<'a>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(serde::Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partial_json: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stop_reason: Option<&'a RawValue>,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

/// Translates one Anthropic stream into OpenAI chunks. See the module.
#[derive(Debug)]
pub struct ToChatChunks {
    out: BytesMut,
    include_usage: bool,
    /// `{"id":…,"object":"chat.completion.chunk","created":…,"model":…,"choices":[`, made at
    /// `message_start`: every chunk opens with it.
    envelope: String,
    /// The open block is a tool call: its OpenAI index.
    tool: Option<u64>,
    tools: u64,
    input: u64,
    cached: u64,
    output: u64,
    /// The finish chunk was sent.
    finished: bool,
    done: bool,
}

/// A raw JSON string that is neither `null` nor empty.
fn text(raw: Option<&RawValue>) -> Option<&str> {
    raw.map(RawValue::get)
        .filter(|t| t.starts_with('"') && *t != "\"\"")
}

impl ToChatChunks {
    /// A translator at the start of a stream; `include_usage`: the client asked for the usage
    /// chunk.
    pub(crate) fn new(include_usage: bool) -> Self {
        Self {
            out: BytesMut::with_capacity(4096),
            include_usage,
            envelope: String::new(),
            tool: None,
            tools: 0,
            input: 0,
            cached: 0,
            output: 0,
            finished: false,
            done: false,
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Opens a chunk: `data: ` and the envelope, up to the choice.
    fn open_chunk(&mut self) {
        self.out.extend_from_slice(b"data: ");
        self.out.extend_from_slice(self.envelope.as_bytes());
    }

    fn choice(&mut self, delta_open: &[u8], raw: &str, delta_close: &[u8]) {
        self.open_chunk();
        self.put(b"{\"index\":0,\"delta\":");
        self.put(delta_open);
        self.put(raw.as_bytes());
        self.put(delta_close);
        self.put(b",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }
}

impl ToChatChunks {
    /// `message_start`: the envelope every chunk repeats (id, created, model), the prompt's
    /// usage, and the first chunk, the assistant's role.
    fn message_start(&mut self, message: Option<Message<'_>>) {
        let (id, model) = message.as_ref().map_or((None, None), |m| (m.id, m.model));
        let mut envelope = BytesMut::with_capacity(160);
        envelope.extend_from_slice(b"{\"id\":");
        put_raw_str(&mut envelope, id, "chatcmpl");
        envelope.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        put_u64(&mut envelope, created);
        envelope.extend_from_slice(b",\"model\":");
        put_raw_str(&mut envelope, model, "");
        envelope.extend_from_slice(b",\"choices\":[");
        self.envelope = String::from_utf8_lossy(&envelope).into_owned();
        if let Some(u) = message.and_then(|m| m.usage) {
            self.usage(u);
        }
        self.choice(b"{\"role\":\"assistant\",\"content\":", "\"\"", b"}");
    }

    /// `content_block_start`: a tool call's first chunk (its index, id and name); a text block
    /// starts with its first delta.
    fn block_start(&mut self, block: &Block<'_>) {
        self.tool = None;
        if block.kind == "tool_use" {
            let index = self.tools;
            self.tools += 1;
            self.tool = Some(index);
            self.open_chunk();
            self.put(b"{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":");
            put_u64(&mut self.out, index);
            self.put(b",\"id\":");
            put_raw_str(&mut self.out, block.id, "");
            self.put(b",\"type\":\"function\",\"function\":{\"name\":");
            put_raw_str(&mut self.out, block.name, "");
            self.put(b",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        }
    }

    /// `content_block_delta`: text, a tool call's arguments, or reasoning, as a content chunk.
    fn block_delta(&mut self, delta: &Delta<'_>) {
        match unquoted(delta.kind) {
            Some("text_delta") => {
                if let Some(t) = text(delta.text) {
                    self.choice(b"{\"content\":", t, b"}");
                }
            }
            Some("input_json_delta") => {
                if let (Some(t), Some(index)) = (text(delta.partial_json), self.tool) {
                    self.open_chunk();
                    self.put(b"{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":");
                    put_u64(&mut self.out, index);
                    self.put(b",\"function\":{\"arguments\":");
                    self.put(t.as_bytes());
                    self.put(b"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
                }
            }
            Some("thinking_delta") => {
                if let Some(t) = text(delta.thinking) {
                    self.choice(b"{\"reasoning_content\":", t, b"}");
                }
            }
            // Signatures and citations belong to Anthropic's own clients.
            _ => {}
        }
    }

    /// `message_delta`: the finish chunk with its reason, then the usage chunk when asked.
    fn message_delta(&mut self, usage: Option<Usage>, delta: Option<&Delta<'_>>) {
        if let Some(u) = usage {
            self.usage(u);
        }
        let reason = match delta.and_then(|d| unquoted(d.stop_reason)) {
            Some("max_tokens" | "model_context_window_exceeded") => "length",
            Some("tool_use") => "tool_calls",
            Some("refusal") => "content_filter",
            _ => "stop",
        };
        self.finished = true;
        self.open_chunk();
        self.put(b"{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"");
        self.put(reason.as_bytes());
        self.put(b"\"}]}\n\n");
        if self.include_usage {
            let prompt = self.input + self.cached;
            self.open_chunk();
            self.put(b"],\"usage\":{\"prompt_tokens\":");
            put_u64(&mut self.out, prompt);
            self.put(b",\"completion_tokens\":");
            put_u64(&mut self.out, self.output);
            self.put(b",\"total_tokens\":");
            put_u64(&mut self.out, prompt + self.output);
            self.put(b",\"prompt_tokens_details\":{\"cached_tokens\":");
            put_u64(&mut self.out, self.cached);
            self.put(b"}}}\n\n");
        }
    }

    /// `error`: the error as OpenAI's, and the stream's end.
    fn error(&mut self, error: Option<&RawValue>) {
        self.done = true;
        self.put(b"data: {\"error\":");
        let error = error.map_or("{}", RawValue::get);
        self.out
            .extend_from_slice(super::whole::openai_error_object(error.as_bytes(), 500).as_bytes());
        self.put(b"}\n\n");
    }
}

impl EventTranslation for ToChatChunks {
    fn out(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// A finished answer whose `message_stop` never came gets its `[DONE]`.
    fn end(&mut self) {
        if self.finished && !self.done {
            self.done = true;
            self.put(b"data: [DONE]\n\n");
        }
    }

    fn event(&mut self, data: &[u8]) {
        if self.done {
            return;
        }
        let Ok(ev) = serde_json::from_slice::<Event<'_>>(data) else {
            return;
        };
        match &*ev.kind {
            "message_start" => self.message_start(ev.message),
            "content_block_start" => {
                if let Some(block) = ev.content_block {
                    self.block_start(&block);
                }
            }
            "content_block_delta" => {
                if let Some(delta) = ev.delta {
                    self.block_delta(&delta);
                }
            }
            "message_delta" => self.message_delta(ev.usage, ev.delta.as_ref()),
            "message_stop" => {
                self.done = true;
                self.put(b"data: [DONE]\n\n");
            }
            "error" => self.error(ev.error),
            // `ping`, `content_block_stop`: nothing an OpenAI client reads.
            _ => {}
        }
    }
}

impl ToChatChunks {
    /// Notes usage: Anthropic's input tokens exclude those read from (or written to) the
    /// cache, which OpenAI's prompt tokens include.
    fn usage(&mut self, u: Usage) {
        if let Some(input) = u.input_tokens {
            self.input = input + u.cache_creation_input_tokens.unwrap_or(0);
        }
        if let Some(cached) = u.cache_read_input_tokens {
            self.cached = cached;
        }
        if let Some(output) = u.output_tokens {
            self.output = output;
        }
    }
}
