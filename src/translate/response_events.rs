//! An OpenAI chat completions stream as OpenAI Responses events, chunk by chunk.
//!
//! The first chunk opens the response (`response.created`, `response.in_progress`). Each kind
//! of content is an output item, opened by `response.output_item.added` and closed by
//! `response.output_item.done`, which carries it whole (what Codex reads): reasoning
//! (`reasoning_content`, or vLLM's `reasoning`) a `reasoning` item whose summary text streams as
//! `response.reasoning_summary_text.delta`; content a `message` item, its text as
//! `response.output_text.delta`; each tool call a `function_call` item, its argument fragments
//! as `response.function_call_arguments.delta` (calls stay open side by side until the answer
//! moves on, so interleaved fragments find their call). The finish reason closes what is open,
//! and the usage (the gateway asks the backend for it) completes the response:
//! `response.completed`, or `response.incomplete` where the answer was cut at its token limit or
//! filtered. An error chunk is `response.failed`. Every event carries its `sequence_number`.
//!
//! Text is copied as the JSON string it came as, never unescaped; an item's text is kept (as
//! escaped JSON) for its `done` events, the only memory a stream's length costs.

use bytes::BytesMut;
use serde_json::value::RawValue;

use super::chat_chunk::{Chunk, ToolDelta, text};
use super::{
    EventTranslation, MAX_NAME_BYTES, json_str, put_json_str, put_raw_str, put_u64, unquoted,
};

/// What an output item is.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    /// A tool call: its chat index, and its id and name as the raw JSON strings they came as.
    Call {
        index: u64,
        call_id: String,
        name: String,
    },
}

/// An output item of the response.
#[derive(Debug)]
struct Item {
    kind: Kind,
    /// Its text (the reasoning's, the message's, the call's arguments) as escaped JSON string
    /// content: fragments copied as they came join into valid JSON.
    text: String,
    /// Not yet closed.
    open: bool,
}

/// The usage a chunk reported.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    prompt: u64,
    completion: u64,
    cached: u64,
    reasoning: u64,
}

/// How the answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    /// It has not.
    No,
    Completed,
    /// Cut short: the `incomplete_details.reason`.
    Incomplete(&'static str),
}

/// Translates one chat completions stream into Responses events. See the module.
#[derive(Debug)]
pub struct ToResponseEvents {
    out: BytesMut,
    /// The next event's `sequence_number`.
    seq: u64,
    /// The chat completion's id, as its JSON string's content: every id derives from it.
    id: String,
    /// The model, as the raw JSON string it came as.
    model: String,
    /// Unix seconds, from the first chunk.
    created: u64,
    items: Vec<Item>,
    finish: Finish,
    usage: Option<Usage>,
    started: bool,
    /// The response's last event was sent: nothing more is written.
    done: bool,
}

impl Default for ToResponseEvents {
    fn default() -> Self {
        Self::new()
    }
}

impl ToResponseEvents {
    /// A translator at the start of a stream.
    pub(crate) fn new() -> Self {
        Self {
            out: BytesMut::with_capacity(4096),
            seq: 0,
            id: String::new(),
            model: String::new(),
            created: 0,
            items: Vec::new(),
            finish: Finish::No,
            usage: None,
            started: false,
            done: false,
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Starts event `kind`: its name, type and sequence number; its other members follow, then
    /// [`Self::close_event`].
    fn open_event(&mut self, kind: &str) {
        self.put(b"event: ");
        self.put(kind.as_bytes());
        self.put(b"\ndata: {\"type\":\"");
        self.put(kind.as_bytes());
        self.put(b"\",\"sequence_number\":");
        put_u64(&mut self.out, self.seq);
        self.seq += 1;
    }

    fn close_event(&mut self) {
        self.put(b"}\n\n");
    }

    /// Starts an event about item `i`: its `item_id` and `output_index`.
    fn open_item_event(&mut self, kind: &str, i: usize) {
        self.open_event(kind);
        self.put(b",\"item_id\":");
        put_item_id(&mut self.out, &self.id, &self.items[i].kind, i);
        self.put(b",\"output_index\":");
        put_u64(&mut self.out, i as u64);
    }

    fn start(&mut self, chunk: &Chunk<'_>) {
        self.started = true;
        self.id = json_str(chunk.id)
            .filter(|id| id.len() <= MAX_NAME_BYTES)
            .map_or_else(|| "gateway".to_owned(), |id| id[1..id.len() - 1].to_owned());
        let mut model = BytesMut::new();
        put_raw_str(&mut model, chunk.model, "");
        self.model = String::from_utf8_lossy(&model).into_owned();
        self.created = chunk.created.unwrap_or(0);
        for kind in ["response.created", "response.in_progress"] {
            self.open_event(kind);
            self.put(b",\"response\":");
            self.put_response("in_progress", None);
            self.close_event();
        }
    }

    /// The response object, its output the items as they stand; `error` an OpenAI error object
    /// (raw) for a failed one.
    fn put_response(&mut self, status: &str, error: Option<&str>) {
        self.put(b"{\"id\":\"resp_");
        self.out.extend_from_slice(self.id.as_bytes());
        self.put(b"\",\"object\":\"response\",\"created_at\":");
        put_u64(&mut self.out, self.created);
        self.put(b",\"status\":\"");
        self.put(status.as_bytes());
        self.put(b"\",\"error\":");
        match error {
            Some(e) => self.out.extend_from_slice(e.as_bytes()),
            None => self.put(b"null"),
        }
        self.put(b",\"incomplete_details\":");
        match self.finish {
            Finish::Incomplete(reason) => {
                self.put(b"{\"reason\":\"");
                self.put(reason.as_bytes());
                self.put(b"\"}");
            }
            _ => self.put(b"null"),
        }
        self.put(b",\"model\":");
        self.out.extend_from_slice(self.model.as_bytes());
        self.put(b",\"output\":[");
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                self.out.extend_from_slice(b",");
            }
            put_item(&mut self.out, &self.id, i, item);
        }
        self.put(b"],\"usage\":");
        match self.usage {
            Some(u) if status != "in_progress" => {
                self.put(b"{\"input_tokens\":");
                put_u64(&mut self.out, u.prompt);
                // An engine reports no cache writes of the kind OpenAI bills (with retention).
                self.put(b",\"input_tokens_details\":{\"cache_write_tokens\":0,\"cached_tokens\":");
                put_u64(&mut self.out, u.cached);
                self.put(b"},\"output_tokens\":");
                put_u64(&mut self.out, u.completion);
                self.put(b",\"output_tokens_details\":{\"reasoning_tokens\":");
                put_u64(&mut self.out, u.reasoning);
                self.put(b"},\"total_tokens\":");
                put_u64(&mut self.out, u.prompt + u.completion);
                self.put(b"}");
            }
            _ => self.put(b"null"),
        }
        self.put(RESPONSE_DEFAULTS);
    }

    /// Opens an item of `kind` and its first part, closing whatever was open before.
    fn open_item(&mut self, kind: Kind, close_calls: bool) -> usize {
        self.close_open(close_calls);
        let i = self.items.len();
        self.items.push(Item {
            kind,
            text: String::new(),
            open: true,
        });
        self.open_event("response.output_item.added");
        self.put(b",\"output_index\":");
        put_u64(&mut self.out, i as u64);
        self.put(b",\"item\":");
        put_item(&mut self.out, &self.id, i, &self.items[i]);
        self.close_event();
        match self.items[i].kind {
            Kind::Reasoning => {
                self.open_item_event("response.reasoning_summary_part.added", i);
                self.put(
                    b",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}",
                );
                self.close_event();
            }
            Kind::Message => {
                self.open_item_event("response.content_part.added", i);
                self.put(b",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[],\"logprobs\":[]}");
                self.close_event();
            }
            Kind::Call { .. } => {}
        }
        i
    }

    /// Closes the open items (tool calls too where `calls`).
    fn close_open(&mut self, calls: bool) {
        for i in 0..self.items.len() {
            let item = &self.items[i];
            if item.open && (calls || !matches!(item.kind, Kind::Call { .. })) {
                self.close_item(i);
            }
        }
    }

    fn close_item(&mut self, i: usize) {
        self.items[i].open = false;
        let (kind, text_key, part) = match self.items[i].kind {
            Kind::Reasoning => (
                "response.reasoning_summary_text.done",
                ",\"summary_index\":0,\"text\":\"",
                Some((
                    "response.reasoning_summary_part.done",
                    ",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"",
                    "\"}",
                )),
            ),
            Kind::Message => (
                "response.output_text.done",
                ",\"content_index\":0,\"text\":\"",
                Some((
                    "response.content_part.done",
                    ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"",
                    "\",\"annotations\":[],\"logprobs\":[]}",
                )),
            ),
            Kind::Call { .. } => (
                "response.function_call_arguments.done",
                ",\"arguments\":\"",
                None,
            ),
        };
        self.open_item_event(kind, i);
        self.put(text_key.as_bytes());
        self.out.extend_from_slice(self.items[i].text.as_bytes());
        self.put(b"\"");
        if kind == "response.output_text.done" {
            self.put(b",\"logprobs\":[]");
        }
        if let Kind::Call { name, .. } = &self.items[i].kind {
            self.out.extend_from_slice(b",\"name\":");
            self.out.extend_from_slice(name.as_bytes());
        }
        self.close_event();
        if let Some((kind, open, close)) = part {
            self.open_item_event(kind, i);
            self.put(open.as_bytes());
            self.out.extend_from_slice(self.items[i].text.as_bytes());
            self.put(close.as_bytes());
            self.close_event();
        }
        self.open_event("response.output_item.done");
        self.put(b",\"output_index\":");
        put_u64(&mut self.out, i as u64);
        self.put(b",\"item\":");
        put_item(&mut self.out, &self.id, i, &self.items[i]);
        self.close_event();
    }

    /// `t` (a raw JSON string) as the next text of a reasoning or message item, opening one
    /// where the last item is another.
    fn text_delta(&mut self, kind: Kind, t: &str) {
        let i = match self.items.last() {
            Some(last) if last.open && last.kind == kind => self.items.len() - 1,
            _ => self.open_item(kind, true),
        };
        let event = match self.items[i].kind {
            Kind::Reasoning => "response.reasoning_summary_text.delta",
            _ => "response.output_text.delta",
        };
        self.open_item_event(event, i);
        self.put(if event == "response.output_text.delta" {
            b",\"content_index\":0,\"logprobs\":[],\"delta\":".as_slice()
        } else {
            b",\"summary_index\":0,\"delta\":".as_slice()
        });
        self.put(t.as_bytes());
        self.close_event();
        self.items[i].text.push_str(&t[1..t.len() - 1]);
    }

    fn tool_delta(&mut self, call: &ToolDelta<'_>) {
        let function = call.function.as_ref();
        let open_call = |items: &[Item]| {
            items.iter().rposition(|item| {
                item.open && matches!(item.kind, Kind::Call { index, .. } if index == call.index)
            })
        };
        if let Some(id) = json_str(call.id).filter(|id| id.len() <= MAX_NAME_BYTES) {
            let same = open_call(&self.items).is_some_and(
                |i| matches!(&self.items[i].kind, Kind::Call { call_id, .. } if call_id == id),
            );
            if !same {
                let mut name = BytesMut::new();
                put_raw_str(&mut name, function.and_then(|f| f.name), "");
                let kind = Kind::Call {
                    index: call.index,
                    call_id: id.to_owned(),
                    name: String::from_utf8_lossy(&name).into_owned(),
                };
                self.open_item(kind, false);
            }
        }
        let Some(arguments) = text(function.and_then(|f| f.arguments)) else {
            return;
        };
        let Some(i) = open_call(&self.items) else {
            // Fragments of a call that was never opened, or was closed: never lost silently.
            self.fail(r#"{"code":"server_error","message":"the backend streamed tool call arguments for a call it had not opened or had closed"}"#);
            return;
        };
        self.open_item_event("response.function_call_arguments.delta", i);
        self.put(b",\"delta\":");
        self.put(arguments.as_bytes());
        self.close_event();
        self.items[i]
            .text
            .push_str(&arguments[1..arguments.len() - 1]);
    }

    /// The response's end: `response.completed`, or `response.incomplete` where it was cut.
    fn complete(&mut self) {
        self.close_open(true);
        self.done = true;
        let (kind, status) = match self.finish {
            Finish::Incomplete(_) => ("response.incomplete", "incomplete"),
            _ => ("response.completed", "completed"),
        };
        self.open_event(kind);
        self.put(b",\"response\":");
        self.put_response(status, None);
        self.close_event();
    }

    /// `response.failed`, with `error` (a Responses error object, raw).
    fn fail(&mut self, error: &str) {
        self.done = true;
        self.open_event("response.failed");
        self.put(b",\"response\":");
        self.put_response("failed", Some(error));
        self.close_event();
    }
}

/// The response object's members that say what it was asked, where the stream does not tell:
/// what a client reads as defaults. Nothing is stored.
const RESPONSE_DEFAULTS: &[u8] = b",\"instructions\":null,\"max_output_tokens\":null,\"parallel_tool_calls\":true,\"previous_response_id\":null,\"reasoning\":{\"effort\":null,\"summary\":null},\"store\":false,\"temperature\":null,\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],\"top_p\":null,\"truncation\":\"disabled\",\"metadata\":{}}";

/// An item's id: its kind's prefix, the response's id and its output index (`msg_chatcmpl-1_0`).
fn put_item_id(out: &mut BytesMut, id: &str, kind: &Kind, i: usize) {
    out.extend_from_slice(match kind {
        Kind::Reasoning => b"\"rs_".as_slice(),
        Kind::Message => b"\"msg_".as_slice(),
        Kind::Call { .. } => b"\"fc_".as_slice(),
    });
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"_");
    put_u64(out, i as u64);
    out.extend_from_slice(b"\"");
}

/// An output item as it stands: in progress while open, complete once closed.
fn put_item(out: &mut BytesMut, id: &str, i: usize, item: &Item) {
    let status: &[u8] = if item.open {
        b"in_progress"
    } else {
        b"completed"
    };
    out.extend_from_slice(b"{\"id\":");
    put_item_id(out, id, &item.kind, i);
    match &item.kind {
        Kind::Reasoning => {
            out.extend_from_slice(b",\"type\":\"reasoning\",\"summary\":[");
            if !item.open {
                out.extend_from_slice(b"{\"type\":\"summary_text\",\"text\":\"");
                out.extend_from_slice(item.text.as_bytes());
                out.extend_from_slice(b"\"}");
            }
            out.extend_from_slice(b"]}");
        }
        Kind::Message => {
            out.extend_from_slice(b",\"type\":\"message\",\"status\":\"");
            out.extend_from_slice(status);
            out.extend_from_slice(b"\",\"role\":\"assistant\",\"content\":[");
            if !item.open {
                out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":\"");
                out.extend_from_slice(item.text.as_bytes());
                out.extend_from_slice(b"\",\"annotations\":[],\"logprobs\":[]}");
            }
            out.extend_from_slice(b"]}");
        }
        Kind::Call { call_id, name, .. } => {
            out.extend_from_slice(b",\"type\":\"function_call\",\"status\":\"");
            out.extend_from_slice(status);
            out.extend_from_slice(b"\",\"call_id\":");
            out.extend_from_slice(call_id.as_bytes());
            out.extend_from_slice(b",\"name\":");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b",\"arguments\":\"");
            if !item.open {
                out.extend_from_slice(item.text.as_bytes());
            }
            out.extend_from_slice(b"\"}");
        }
    }
}

/// An OpenAI error object (`{"message","type","code"}`, raw) as a Responses one (`{"code",
/// "message"}`).
pub(super) fn responses_error(raw: &RawValue) -> String {
    let error: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or_default();
    let code = ["code", "type"]
        .iter()
        .find_map(|k| error.get(k).and_then(serde_json::Value::as_str))
        .unwrap_or("server_error");
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .map_or_else(|| raw.get().to_owned(), str::to_owned);
    let mut out = BytesMut::new();
    out.extend_from_slice(b"{\"code\":");
    put_json_str(&mut out, code);
    out.extend_from_slice(b",\"message\":");
    put_json_str(&mut out, &message);
    out.extend_from_slice(b"}");
    String::from_utf8_lossy(&out).into_owned()
}

impl EventTranslation for ToResponseEvents {
    fn out(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// A finished answer whose usage never came is completed; a stream that ended before its
    /// answer did fails, saying so.
    fn end(&mut self) {
        if self.done {
            return;
        }
        if self.finish == Finish::No {
            self.fail(r#"{"code":"server_error","message":"the backend's stream ended before its answer did"}"#);
        } else {
            self.complete();
        }
    }

    fn event(&mut self, data: &[u8]) {
        if self.done {
            return;
        }
        if data == b"[DONE]" {
            // A server that sends no finish reason still ends the response here.
            if self.started {
                if self.finish == Finish::No {
                    self.finish = Finish::Completed;
                }
                self.complete();
            }
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(data) else {
            // Not a chunk (a comment-like line a server added): nothing of the answer.
            return;
        };
        if let Some(error) = chunk.error {
            self.fail(&responses_error(error));
            return;
        }
        if !self.started {
            self.start(&chunk);
        }
        if let Some(choice) = chunk.choices {
            if let Some(delta) = choice.delta {
                if let Some(t) = text(delta.reasoning_content).or(text(delta.reasoning)) {
                    self.text_delta(Kind::Reasoning, t);
                }
                if let Some(t) = text(delta.content) {
                    self.text_delta(Kind::Message, t);
                }
                for call in delta.tool_calls.iter().flatten() {
                    self.tool_delta(call);
                    if self.done {
                        return;
                    }
                }
            }
            if let Some(reason) = unquoted(choice.finish_reason) {
                self.close_open(true);
                self.finish = match reason {
                    "length" => Finish::Incomplete("max_output_tokens"),
                    "content_filter" => Finish::Incomplete("content_filter"),
                    _ => Finish::Completed,
                };
            }
        }
        if let Some(u) = chunk.usage {
            let details =
                |d: &Option<super::chat_chunk::Details>,
                 f: fn(&super::chat_chunk::Details) -> Option<u64>| {
                    d.as_ref().and_then(f).unwrap_or(0)
                };
            self.usage = Some(Usage {
                prompt: u.prompt_tokens,
                completion: u.completion_tokens,
                cached: details(&u.prompt_tokens_details, |d| d.cached_tokens),
                reasoning: details(&u.completion_tokens_details, |d| d.reasoning_tokens),
            });
            if self.finish != Finish::No {
                self.complete();
            }
        }
    }
}
