//! An OpenAI chat completions stream as Anthropic message events, chunk by chunk.
//!
//! The first chunk opens the message (`message_start`, `ping`); content opens a text block and
//! each chunk's text is one `text_delta`; reasoning (`reasoning_content`, or `reasoning` as
//! newer vLLM names it) opens a thinking block, each chunk's one `thinking_delta`; a tool call opens a `tool_use` block and its argument
//! fragments are `input_json_delta`s; the finish reason closes the open block, and the usage
//! (the gateway asks an OpenAI backend for it) completes `message_delta`, then `message_stop`.
//! Text and arguments are copied as the JSON strings they came as: never unescaped, never
//! allocated.

use bytes::BytesMut;
use serde_json::value::RawValue;

use super::chat_chunk::{Chunk, ToolDelta, text};
use super::{EventTranslation, json_str, put_json_str, put_raw_str, put_u64, unquoted};

/// The block open in the Anthropic stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Text,
    Thinking,
    /// A tool call, by its OpenAI index.
    Tool(u64),
}

/// The usage an OpenAI chunk reported.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    prompt: u64,
    completion: u64,
    cached: u64,
}

/// Translates one OpenAI stream into Anthropic events. See the module.
#[derive(Debug)]
pub struct ToMessageEvents {
    out: BytesMut,
    started: bool,
    open: Open,
    /// The next Anthropic block index.
    next_block: u64,
    /// Anthropic's stop reason, once the finish chunk came; its stop sequence, if one.
    stop: Option<(&'static str, Option<String>)>,
    usage: Option<Usage>,
    /// `message_stop` was sent (or the stream failed): nothing more is written.
    done: bool,
}

impl Default for ToMessageEvents {
    fn default() -> Self {
        Self::new()
    }
}

impl ToMessageEvents {
    /// A translator at the start of a stream.
    pub(crate) fn new() -> Self {
        Self {
            out: BytesMut::with_capacity(4096),
            started: false,
            open: Open::None,
            next_block: 0,
            stop: None,
            usage: None,
            done: false,
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn start(&mut self, id: Option<&RawValue>, model: Option<&RawValue>) {
        self.started = true;
        self.put(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":");
        put_raw_str(&mut self.out, id, "msg");
        self.put(b",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
        put_raw_str(&mut self.out, model, "");
        self.put(b",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n");
    }

    fn open_text(&mut self) {
        self.put(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":");
        put_u64(&mut self.out, self.next_block);
        self.put(b",\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        self.next_block += 1;
        self.open = Open::Text;
    }

    /// `t` (a raw JSON string) as the next delta of a text or thinking block, opening one
    /// where the open block is another.
    fn block_delta(&mut self, block: Open, t: &str) {
        if self.open != block {
            self.close_block();
            if block == Open::Thinking {
                self.open_thinking();
            } else {
                self.open_text();
            }
        }
        self.put(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":");
        put_u64(&mut self.out, self.next_block - 1);
        self.put(if block == Open::Thinking {
            b",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":".as_slice()
        } else {
            b",\"delta\":{\"type\":\"text_delta\",\"text\":".as_slice()
        });
        self.put(t.as_bytes());
        self.put(b"}}\n\n");
    }

    /// A thinking block: its signature empty, as no Anthropic model signed it (a client sends
    /// it back in a later turn, where it is dropped for an OpenAI engine).
    fn open_thinking(&mut self) {
        self.put(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":");
        put_u64(&mut self.out, self.next_block);
        self.put(
            b",\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
        );
        self.next_block += 1;
        self.open = Open::Thinking;
    }

    fn tool_delta(&mut self, call: &ToolDelta<'_>) {
        let function = call.function.as_ref();
        if let Some(id) = json_str(call.id).filter(|id| id.len() <= super::MAX_NAME_BYTES)
            && self.open != Open::Tool(call.index)
        {
            self.close_block();
            self.put(
                b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":",
            );
            put_u64(&mut self.out, self.next_block);
            self.put(b",\"content_block\":{\"type\":\"tool_use\",\"id\":");
            self.put(id.as_bytes());
            self.put(b",\"name\":");
            put_raw_str(&mut self.out, function.and_then(|f| f.name), "");
            self.put(b",\"input\":{}}}\n\n");
            self.next_block += 1;
            self.open = Open::Tool(call.index);
        }
        let Some(arguments) = text(function.and_then(|f| f.arguments)) else {
            return;
        };
        if self.open != Open::Tool(call.index) {
            // Fragments of a call whose block is closed (calls interleaved): Anthropic's
            // stream cannot reopen it, and the stream says so instead of losing them.
            self.put(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the backend interleaved two tool calls' arguments, which Anthropic's stream cannot express\"}}\n\n");
            self.done = true;
            return;
        }
        self.put(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":");
        put_u64(&mut self.out, self.next_block - 1);
        self.put(b",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":");
        self.put(arguments.as_bytes());
        self.put(b"}}\n\n");
    }

    fn close_block(&mut self) {
        if self.open == Open::None {
            return;
        }
        self.put(b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":");
        put_u64(&mut self.out, self.next_block - 1);
        self.put(b"}\n\n");
        self.open = Open::None;
    }

    fn close_message(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let (reason, sequence) = self.stop.take().unwrap_or(("end_turn", None));
        let usage = self.usage.unwrap_or_default();
        self.put(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"");
        self.put(reason.as_bytes());
        self.put(b"\",\"stop_sequence\":");
        match &sequence {
            Some(s) => put_json_str(&mut self.out, s),
            None => self.put(b"null"),
        }
        // Anthropic's input tokens are those not read from the cache.
        self.put(b"},\"usage\":{\"input_tokens\":");
        put_u64(&mut self.out, usage.prompt.saturating_sub(usage.cached));
        self.put(b",\"cache_read_input_tokens\":");
        put_u64(&mut self.out, usage.cached);
        self.put(b",\"output_tokens\":");
        put_u64(&mut self.out, usage.completion);
        self.put(b"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    }
}

impl EventTranslation for ToMessageEvents {
    fn out(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// A finished message whose usage never came is closed.
    fn end(&mut self) {
        if self.stop.is_some() {
            self.close_message();
        }
    }

    fn event(&mut self, data: &[u8]) {
        if self.done {
            return;
        }
        if data == b"[DONE]" {
            // A server that sends no finish reason still ends the message here.
            if self.started {
                self.close_message();
            }
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(data) else {
            // Not a chunk (a comment-like line a server added): nothing of the answer.
            return;
        };
        if let Some(error) = chunk.error {
            self.put(b"event: error\ndata: {\"type\":\"error\",\"error\":");
            self.out.extend_from_slice(
                super::whole::anthropic_error_object(error.get().as_bytes()).as_bytes(),
            );
            self.put(b"}\n\n");
            self.done = true;
            return;
        }
        if !self.started {
            self.start(chunk.id, chunk.model);
        }
        if let Some(choice) = chunk.choices {
            if let Some(delta) = choice.delta {
                if let Some(t) = text(delta.reasoning_content).or(text(delta.reasoning)) {
                    self.block_delta(Open::Thinking, t);
                }
                if let Some(t) = text(delta.content) {
                    self.block_delta(Open::Text, t);
                }
                for call in delta.tool_calls.iter().flatten() {
                    self.tool_delta(call);
                }
            }
            if let Some(reason) = unquoted(choice.finish_reason) {
                self.close_block();
                let sequence = choice
                    .stop_reason
                    .and_then(|r| serde_json::from_str::<String>(r.get()).ok());
                let reason = match (reason, &sequence) {
                    ("stop", Some(_)) => "stop_sequence",
                    ("length", _) => "max_tokens",
                    ("tool_calls" | "function_call", _) => "tool_use",
                    ("content_filter", _) => "refusal",
                    _ => "end_turn",
                };
                self.stop = Some((reason, sequence));
            }
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(Usage {
                prompt: u.prompt_tokens,
                completion: u.completion_tokens,
                cached: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
            });
            if self.stop.is_some() {
                self.close_message();
            }
        }
    }
}
