//! Translation between the two chat dialects: OpenAI chat completions and Anthropic messages,
//! requests and responses, streamed or whole, both ways.
//!
//! Pure: bytes in, bytes out, no I/O and no clock but the `created` second a chunk carries.
//! The routing decision does not know about it: a backend is one engine whatever its clients
//! speak, and the body is translated after the decision (`proxy/rewrite.rs` for the request,
//! `proxy/body.rs` for the response). What maps to what, and what is refused:
//! docs/gateway.md, "Translation between dialects".
//!
//! A request field the target cannot express is refused ([`Refused`], a 400 naming it), never
//! dropped, but for a short list of hints that change no answer (`DROPPED_HINTS` in each
//! direction's module). A stream is translated event by event as it arrives: nothing is held
//! back but an event whose end has not come, and a content event costs no allocation.

mod chat_chunk;
mod chunks;
mod events;
mod request;
mod response_events;
mod whole;

pub(crate) use chunks::ToChatChunks;
pub(crate) use events::ToMessageEvents;
pub use request::{
    ChatRequest, HostedTools, Thinking, chat_to_messages, count_to_tokenize, messages_to_chat,
    responses_to_chat,
};
pub(crate) use response_events::ToResponseEvents;
pub(crate) use whole::{error_body, response_body};

use bytes::{Bytes, BytesMut};

use crate::sse::SseParser;

/// Which way a request goes: the client's dialect to the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// An OpenAI chat completions client, an Anthropic messages backend.
    ChatToMessages,
    /// An Anthropic messages client, an OpenAI chat completions backend.
    MessagesToChat,
    /// An Anthropic client counting a prompt's tokens (`/v1/messages/count_tokens`), an OpenAI
    /// engine that counts them with its own chat template (`/tokenize`: vLLM, SGLang).
    CountToTokenize,
    /// An OpenAI Responses client, an OpenAI chat completions backend (one without its own
    /// Responses API: `backends[].responses_api: translate`).
    ResponsesToChat,
    /// An OpenAI Responses client, an Anthropic messages backend: through chat completions,
    /// both ways.
    ResponsesToMessages,
}

impl Direction {
    /// The path the backend serves the translated request on.
    pub(crate) const fn backend_path(self) -> &'static str {
        match self {
            Self::ChatToMessages => "/v1/messages",
            Self::MessagesToChat | Self::ResponsesToChat => "/v1/chat/completions",
            Self::CountToTokenize => "/tokenize",
            Self::ResponsesToMessages => "/v1/messages",
        }
    }
}

/// Why a request cannot be translated: names the field and what the target lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One direction of a stream's translation: what each complete event becomes, written into its
/// buffer, and what the stream's end adds.
pub trait EventTranslation {
    /// Where translated events are written, until they go.
    fn out(&mut self) -> &mut BytesMut;
    /// Translates one complete event (its data).
    fn event(&mut self, data: &[u8]);
    /// The stream ended, its last event read.
    fn end(&mut self);
}

/// A stream read event by event (the SSE parser beside one direction's translation).
#[derive(Debug)]
pub struct Stream<T> {
    parser: SseParser,
    events: T,
}

impl<T: EventTranslation> Stream<T> {
    fn new(events: T) -> Self {
        Self {
            parser: SseParser::new(),
            events,
        }
    }

    /// Translates the next bytes: the events they complete, translated.
    fn feed(&mut self, data: &[u8]) -> Bytes {
        let events = &mut self.events;
        self.parser.feed(data, &mut |ev| events.event(ev.data));
        events.out().split().freeze()
    }

    /// The stream ended: an event left without its blank line is read, then the end's own.
    fn finish(&mut self) -> Bytes {
        let events = &mut self.events;
        self.parser.feed(b"\n\n", &mut |ev| events.event(ev.data));
        events.end();
        events.out().split().freeze()
    }
}

/// A response on its way back to the client, translated as it comes: an event stream event by
/// event, anything else (a whole answer, an error) once it has all arrived.
#[derive(Debug)]
pub enum ResponseTranslator {
    /// Anthropic events in, OpenAI chunks out.
    Chunks(Stream<ToChatChunks>),
    /// OpenAI chunks in, Anthropic events out.
    Events(Stream<ToMessageEvents>),
    /// OpenAI chunks in, Responses events out.
    Responses(Stream<ToResponseEvents>),
    /// Anthropic events in, Responses events out: chunks first, then events.
    MessagesToResponses(Stream<ToChatChunks>, Stream<ToResponseEvents>),
    /// A body translated whole at its end.
    Whole {
        /// Which way.
        direction: Direction,
        /// The response's status (a success is an answer, anything else an error).
        status: u16,
        /// What has arrived of it.
        body: BytesMut,
        /// Its translation has been sent.
        done: bool,
    },
}

/// The most of a whole (not streamed) body kept to translate it: 64 MiB.
pub(crate) const MAX_WHOLE_BYTES: usize = 64 << 20;

/// What stands for a whole body over [`MAX_WHOLE_BYTES`]: not JSON, so its translation is an
/// error that says why.
const TOO_LARGE: &[u8] = b"the backend's answer is over 64 MiB, too large to translate";

impl ResponseTranslator {
    /// A translator for a response of `status` to a request going `direction`; `stream` when it
    /// is a successful event stream; `include_usage` when an OpenAI client asked for the usage
    /// chunk.
    pub fn new(direction: Direction, stream: bool, status: u16, include_usage: bool) -> Self {
        match (stream, direction) {
            (true, Direction::ChatToMessages) => {
                Self::Chunks(Stream::new(ToChatChunks::new(include_usage)))
            }
            (true, Direction::MessagesToChat) => Self::Events(Stream::new(ToMessageEvents::new())),
            (true, Direction::ResponsesToChat) => {
                Self::Responses(Stream::new(ToResponseEvents::new()))
            }
            (true, Direction::ResponsesToMessages) => Self::MessagesToResponses(
                Stream::new(ToChatChunks::new(true)),
                Stream::new(ToResponseEvents::new()),
            ),
            // A count is never streamed.
            (false, _) | (true, Direction::CountToTokenize) => Self::Whole {
                direction,
                status,
                body: BytesMut::new(),
                done: false,
            },
        }
    }

    /// Translates the next bytes; what can go to the client now (possibly nothing).
    pub fn frame(&mut self, data: &[u8]) -> Bytes {
        match self {
            Self::Chunks(t) => t.feed(data),
            Self::Events(t) => t.feed(data),
            Self::Responses(t) => t.feed(data),
            Self::MessagesToResponses(chunks, events) => events.feed(&chunks.feed(data)),
            Self::Whole { body, .. } => {
                // Past the limit the body is not kept whole: it cannot be translated, and its
                // end says so instead of sending what would be cut JSON.
                if body.len() + data.len() <= MAX_WHOLE_BYTES {
                    body.extend_from_slice(data);
                } else {
                    body.clear();
                    body.extend_from_slice(TOO_LARGE);
                }
                Bytes::new()
            }
        }
    }

    /// The upstream body ended: whatever is left to send (once; later calls give nothing).
    pub fn finish(&mut self) -> Bytes {
        match self {
            Self::Chunks(t) => t.finish(),
            Self::Events(t) => t.finish(),
            Self::Responses(t) => t.finish(),
            Self::MessagesToResponses(chunks, events) => {
                let last = events.feed(&chunks.finish());
                let end = events.finish();
                if last.is_empty() {
                    end
                } else {
                    Bytes::from([&last[..], &end[..]].concat())
                }
            }
            Self::Whole {
                direction,
                status,
                body,
                done,
            } => {
                if std::mem::replace(done, true) {
                    return Bytes::new();
                }
                let body = std::mem::take(body);
                Bytes::from(if (200..300).contains(status) && body != TOO_LARGE {
                    response_body(*direction, &body)
                } else {
                    error_body(*direction, *status, &body)
                })
            }
        }
    }
}

/// The status an error of `status` from the backend takes in the client's dialect: Anthropic's
/// 529 (overloaded) is a 503 to an OpenAI client; every other status means the same in both.
pub(crate) const fn client_status(direction: Direction, status: u16) -> u16 {
    match (direction, status) {
        (Direction::ChatToMessages | Direction::ResponsesToMessages, 529) => 503,
        _ => status,
    }
}

/// A raw JSON value that is a string: its text, quotes included. (`Option<Cow<str>>` would
/// allocate for every chunk: serde borrows only a bare `Cow`, so strings are read raw.)
fn json_str(raw: Option<&serde_json::value::RawValue>) -> Option<&str> {
    raw.map(serde_json::value::RawValue::get)
        .filter(|t| t.len() >= 2 && t.starts_with('"'))
}

/// A raw JSON string's content, for comparing with a name (escapes left as they are: the
/// names compared have none).
fn unquoted(raw: Option<&serde_json::value::RawValue>) -> Option<&str> {
    json_str(raw).map(|t| &t[1..t.len() - 1])
}

/// The longest id or name copied from the backend's stream: the model name is repeated in every
/// OpenAI chunk, and a backend must not make each tiny event a huge one.
const MAX_NAME_BYTES: usize = 256;

/// Writes a raw JSON string into `out`, or `fallback` as one where there is none (or it is
/// over [`MAX_NAME_BYTES`]).
fn put_raw_str(out: &mut BytesMut, raw: Option<&serde_json::value::RawValue>, fallback: &str) {
    match json_str(raw).filter(|t| t.len() <= MAX_NAME_BYTES) {
        Some(t) => out.extend_from_slice(t.as_bytes()),
        None => put_json_str(out, fallback),
    }
}

/// Writes `value` as a JSON string into `out` (escaped as JSON requires; nothing allocated).
fn put_json_str(out: &mut BytesMut, value: &str) {
    use bytes::BufMut as _;
    // Writing into a BytesMut cannot fail.
    let _ = serde_json::to_writer(out.writer(), value);
}

/// Writes `n` in decimal into `out`.
fn put_u64(out: &mut BytesMut, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests;
