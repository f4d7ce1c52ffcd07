//! The stream meter: what the timed body does to each frame, without I/O, so that it can be
//! tested with exact inputs and benchmarked on its own (`benches/meter.rs`).
//!
//! It reads SSE events as frames go by: the first and last content event, their count, the
//! longest gap between content events, and the usage. When asked to, it removes the usage-only
//! chunk that the gateway itself requested: then an event split across frames is kept back until its
//! blank line arrives (a client cannot use half an event), and nothing else is ever kept back.

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

use crate::curve::StreamTiming;
use crate::sse::SseParser;
use crate::sse::events::{self, StreamDialect};

/// The most tokens a usage count may report and be believed: more than any model's context or
/// output holds (16 Mi).
pub const MAX_PLAUSIBLE_TOKENS: u64 = 1 << 24;

/// Timing of one stream.
#[derive(Debug)]
pub struct StreamMeter {
    dialect: StreamDialect,
    strip: bool,
    parser: SseParser,
    partial: BytesMut,
    /// Content events and usage, as far as seen.
    pub timing: StreamTiming,
    /// Longest silence between two content events, seconds.
    pub max_gap_s: f64,
}

impl StreamMeter {
    /// A meter for a stream of `dialect`; `strip` removes the usage-only chunk.
    pub fn new(dialect: StreamDialect, strip: bool) -> Self {
        Self {
            dialect,
            strip,
            parser: SseParser::new(),
            partial: BytesMut::new(),
            timing: StreamTiming::default(),
            max_gap_s: 0.0,
        }
    }

    /// Reads one frame that arrived at `now`; returns the bytes to forward (possibly empty) and
    /// whether the first content event was in it.
    pub fn frame(&mut self, data: Bytes, now: Instant) -> (Bytes, bool) {
        let had_content = self.timing.first_content.is_some();
        let out = if self.strip {
            self.strip_usage(data, now)
        } else {
            let mut parser = std::mem::take(&mut self.parser);
            parser.feed(&data, &mut |ev| {
                self.note(ev.event, ev.data, now);
            });
            self.parser = parser;
            data
        };
        (out, !had_content && self.timing.first_content.is_some())
    }

    /// Whether the usage chunk is being removed (the body's length is then not the upstream's).
    pub fn strips(&self) -> bool {
        self.strip
    }

    /// Whether the start of an unfinished event is kept back until its end arrives.
    pub fn has_partial_event(&self) -> bool {
        !self.partial.is_empty()
    }

    /// Bytes still kept back when the stream ends: an unfinished last event, which belongs to the
    /// client all the same.
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.partial.is_empty()).then(|| self.partial.split().freeze())
    }

    /// Records one event; returns whether it is a usage-only chunk.
    fn note(&mut self, event: &[u8], data: &[u8], now: Instant) -> bool {
        let t = &mut self.timing;
        if events::is_content(self.dialect, event, data) {
            match t.last_content {
                Some(last) => self.max_gap_s = self.max_gap_s.max((now - last).as_secs_f64()),
                None => t.first_content = Some(now),
            }
            t.last_content = Some(now);
            t.content_events += 1;
        }
        if t.finished.is_none() && events::is_finish(self.dialect, event, data) {
            t.finished = Some(now);
        }
        let Some(u) = events::usage(self.dialect, event, data) else {
            return false;
        };
        // A count no generation reaches (2^64 - 1 was seen) is no count: the stream is then
        // timed as one without usage, from its content events.
        if let Some(p) = u.usage.prompt_tokens.filter(|p| *p <= MAX_PLAUSIBLE_TOKENS) {
            t.prompt_tokens = Some(p);
        }
        // Anthropic's message_start reports input tokens only; output comes in message_delta.
        if (u.usage.output_tokens > 0 || event != b"message_start")
            && u.usage.output_tokens <= MAX_PLAUSIBLE_TOKENS
        {
            t.output_tokens = Some(u.usage.output_tokens);
        }
        u.usage_only
    }

    /// Forwards every complete event of `partial + data` except a usage-only chunk; keeps an
    /// incomplete tail for the next frame. Zero-copy unless an event was split or removed.
    fn strip_usage(&mut self, data: Bytes, now: Instant) -> Bytes {
        let buf = if self.partial.is_empty() {
            data
        } else {
            self.partial.put(data);
            self.partial.split().freeze()
        };
        let mut at = 0;
        let mut cut: Option<std::ops::Range<usize>> = None;
        let mut parser = std::mem::take(&mut self.parser);
        while let Some(len) = events::event_end(&buf[at..]) {
            let mut usage_only = false;
            parser.feed(&buf[at..at + len], &mut |ev| {
                usage_only |= self.note(ev.event, ev.data, now);
            });
            if usage_only && cut.is_none() {
                cut = Some(at..at + len);
            }
            at += len;
        }
        self.parser = parser;
        if at < buf.len() {
            self.partial.put(&buf[at..]);
        }
        match cut {
            None => buf.slice(..at),
            Some(cut) => {
                let mut out = BytesMut::with_capacity(at - cut.len());
                out.put(&buf[..cut.start]);
                out.put(&buf[cut.end..at]);
                out.freeze()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use crate::proxy::testing::{ROLE, USAGE, content};

    #[test]
    fn role_only_first_chunk_is_not_ttft() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut m = StreamMeter::new(StreamDialect::OpenAi, false);
        assert!(!m.frame(Bytes::from_static(ROLE), at(5)).1);
        assert!(m.frame(content("Hi"), at(40)).1);
        m.frame(content(" there"), at(60));
        m.frame(Bytes::from_static(USAGE), at(61));
        assert_eq!(m.timing.first_content, Some(at(40)));
        assert_eq!(m.timing.last_content, Some(at(60)));
        assert_eq!(
            (
                m.timing.content_events,
                m.timing.output_tokens,
                m.timing.prompt_tokens
            ),
            (2, Some(2), Some(5))
        );
        assert!((m.max_gap_s - 0.020).abs() < 1e-9);
    }

    #[test]
    fn reasoning_or_tool_calls_first_count_as_first_content() {
        let t0 = Instant::now();
        for first in [
            &b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"Let me think\"}}]}\n\n"[..],
            &b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\"}}]}}]}\n\n"[..],
        ] {
            let mut m = StreamMeter::new(StreamDialect::OpenAi, false);
            m.frame(Bytes::from_static(ROLE), t0);
            assert!(m.frame(Bytes::from_static(first), t0 + Duration::from_millis(30)).1);
        }
    }

    #[test]
    fn only_the_requested_usage_chunk_is_removed_even_when_split() {
        let t0 = Instant::now();
        let mut stream = Vec::new();
        stream.extend_from_slice(ROLE);
        stream.extend_from_slice(&content("a"));
        stream.extend_from_slice(USAGE);
        stream.extend_from_slice(b"data: [DONE]\n\n");
        let mut want = stream.clone();
        let start = want.windows(USAGE.len()).position(|w| w == USAGE).unwrap();
        want.drain(start..start + USAGE.len());
        for cut in 1..stream.len() {
            let mut m = StreamMeter::new(StreamDialect::OpenAi, true);
            let mut out = Vec::new();
            for piece in stream.chunks(cut) {
                out.extend_from_slice(&m.frame(Bytes::copy_from_slice(piece), t0).0);
            }
            if let Some(rest) = m.finish() {
                out.extend_from_slice(&rest);
            }
            assert_eq!(out, want, "split every {cut} bytes");
            assert_eq!(m.timing.output_tokens, Some(2));
        }
    }

    #[test]
    fn without_stripping_frames_pass_untouched() {
        let mut m = StreamMeter::new(StreamDialect::OpenAi, false);
        let frame = Bytes::from_static(USAGE);
        let (out, _) = m.frame(frame.clone(), Instant::now());
        assert_eq!(out, frame);
        assert_eq!(out.as_ptr(), frame.as_ptr(), "forwarded without a copy");
    }
}
