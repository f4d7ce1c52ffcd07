//! Server-Sent Events, read incrementally as bytes arrive.
//!
//! Pure: no I/O, no clock (an event's time comes in as an argument). The parser follows the WHATWG event-stream rules that matter to LLM
//! streams: lines end in CR, LF or CRLF (split across reads too), `:` starts a comment, `data:`
//! takes one optional space, several data lines join with `\n`, and a blank line dispatches.

pub mod events;
mod parser;
mod timing;

pub use parser::{SseEvent, SseParser};
pub(crate) use timing::{MAX_PLAUSIBLE_TOKENS, StreamTiming, read_event};
