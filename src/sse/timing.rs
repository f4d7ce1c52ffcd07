//! A stream's timing as its events tell it: the first and last content event, their count, the
//! end of the generation and the usage. The gateway's meter and `tpsgate bench` read a stream
//! through [`read_event`], so that they count alike.

use tokio::time::Instant;

use super::events::{self, StreamDialect};

/// The most tokens a usage count may report and be believed: more than any model's context or
/// output holds (16 Mi).
pub(crate) const MAX_PLAUSIBLE_TOKENS: u64 = 1 << 24;

/// What a stream's events said of its timing, in the terms a curve's observation needs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StreamTiming {
    /// First content event.
    pub first_content: Option<Instant>,
    /// Last content event.
    pub last_content: Option<Instant>,
    /// Content events seen.
    pub content_events: u32,
    /// Output tokens from usage.
    pub output_tokens: Option<u64>,
    /// Prompt tokens from usage.
    pub prompt_tokens: Option<u64>,
    /// Of those, served from the backend's prefix cache, from usage.
    pub cached_tokens: Option<u64>,
    /// The event that ended the generation (a finish reason, a stop reason, a completion).
    pub finished: Option<Instant>,
}

impl StreamTiming {
    /// When the last token was made. With a token count from usage, that is the event that
    /// finished the generation: an engine that holds back text (bytes that are not yet valid
    /// UTF-8) goes silent before it, and the silent tokens were decoded all the same. Without
    /// usage, the tokens are the content events, and the last of them ends the count.
    pub(crate) fn decode_end(&self) -> Option<Instant> {
        let last = self.last_content?;
        Some(match (self.output_tokens, self.finished) {
            (Some(_), Some(finished)) => finished.max(last),
            _ => last,
        })
    }
}

/// What one event was, for whoever reads the stream after [`read_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventRead {
    /// It carried generated content.
    pub content: bool,
    /// It was an OpenAI chunk with nothing but usage.
    pub usage_only: bool,
}

/// Records what one event at `now` tells a stream's timing: content, the end of the generation,
/// usage. The gateway's meter and `tpsgate bench` read streams through this one function, so that
/// they count alike.
pub(crate) fn read_event(
    t: &mut StreamTiming,
    dialect: StreamDialect,
    event: &[u8],
    data: &[u8],
    now: Instant,
) -> EventRead {
    let content = events::is_content(dialect, event, data);
    if content {
        t.first_content.get_or_insert(now);
        t.last_content = Some(now);
        t.content_events += 1;
    }
    if t.finished.is_none() && events::is_finish(dialect, event, data) {
        t.finished = Some(now);
    }
    let Some(u) = events::usage(dialect, event, data) else {
        return EventRead {
            content,
            usage_only: false,
        };
    };
    // A count no generation reaches (2^64 - 1 was seen) is no count: the stream is then timed
    // as one without usage, from its content events.
    let plausible = |n: &u64| *n <= MAX_PLAUSIBLE_TOKENS;
    if let Some(p) = u.usage.prompt_tokens.filter(plausible) {
        t.prompt_tokens = Some(p);
    }
    if let Some(c) = u.usage.cached_tokens.filter(plausible) {
        t.cached_tokens = Some(c);
    }
    if let Some(o) = u.usage.output_tokens.filter(plausible) {
        t.output_tokens = Some(o);
    }
    EventRead {
        content,
        usage_only: u.usage_only,
    }
}
