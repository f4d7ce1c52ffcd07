//! The stream meter: what the timed body does to each frame, without I/O, so that it can be
//! tested with exact inputs and benchmarked on its own (`benches/meter.rs`).
//!
//! It reads SSE events as frames go by: the first and last content event, their count, the
//! longest gap between content events, and the usage. When asked to, it removes the usage-only
//! chunk that the gateway itself requested: then an event split across frames is kept back until its
//! blank line arrives (a client cannot use half an event), and nothing else is ever kept back.
//!
//! Work is linear in the bytes: an unfinished event is scanned once, where the last scan left
//! off, and appended to, never copied whole again. A line or event longer than `max_event`
//! (no real stream has one) ends the stream instead ([`StreamMeter::overflowed`]).

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

use crate::sse::events::StreamDialect;
use crate::sse::{SseParser, StreamTiming, read_event};

/// The longest line or event a stream may send by default: 1 MiB (a token is a few bytes; the
/// largest real events, tool-call arguments or a whole non-streamed answer, are kilobytes).
pub(crate) const MAX_EVENT_BYTES: usize = 1 << 20;

/// Where the scan for the end of an unfinished event stands, relative to the event's start.
#[derive(Debug, Clone, Copy, Default)]
struct Scan {
    /// The next byte to look at.
    at: usize,
    /// Where the current line began.
    line_start: usize,
}

/// Timing of one stream.
#[derive(Debug)]
pub struct StreamMeter {
    dialect: StreamDialect,
    strip: bool,
    parser: SseParser,
    /// The start of an event whose end has not come (stripping only).
    partial: BytesMut,
    /// How far `partial` has been scanned.
    scan: Scan,
    max_event: usize,
    overflowed: bool,
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
            scan: Scan::default(),
            max_event: MAX_EVENT_BYTES,
            overflowed: false,
            timing: StreamTiming::default(),
            max_gap_s: 0.0,
        }
    }

    /// The same, with lines and events of up to `bytes` (instead of [`MAX_EVENT_BYTES`]).
    #[must_use]
    pub(crate) fn with_max_event(self, bytes: usize) -> Self {
        Self {
            max_event: bytes,
            ..self
        }
    }

    /// The longest line or event allowed, bytes.
    pub(crate) fn max_event(&self) -> usize {
        self.max_event
    }

    /// Whether the stream sent a line or an event longer than allowed: it must end now (what
    /// was kept of it is dropped).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
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
            if self.overflowed {
                // An event over the limit came whole: it, and what follows it, go no further.
                data.slice(..events_within(&data, self.max_event))
            } else {
                if self.parser.buffered() > self.max_event {
                    self.overflowed = true;
                }
                data
            }
        };
        (out, !had_content && self.timing.first_content.is_some())
    }

    /// Whether the start of an unfinished event is kept back until its end arrives.
    pub(crate) fn has_partial_event(&self) -> bool {
        !self.partial.is_empty()
    }

    /// Bytes still kept back when the stream ends: an unfinished last event, which belongs to the
    /// client all the same (unless it overflowed: then it is dropped).
    pub fn finish(&mut self) -> Option<Bytes> {
        if self.overflowed {
            self.partial.clear();
        }
        (!self.partial.is_empty()).then(|| self.partial.split().freeze())
    }

    /// Records one event; returns whether it is a usage-only chunk.
    fn note(&mut self, event: &[u8], data: &[u8], now: Instant) -> bool {
        // An event over the limit that came whole in one read is over it all the same: the
        // limit must not depend on how the network cut the stream.
        if event.len() + data.len() > self.max_event {
            self.overflowed = true;
        }
        let last = self.timing.last_content;
        let read = read_event(&mut self.timing, self.dialect, event, data, now);
        if let (true, Some(last)) = (read.content, last) {
            self.max_gap_s = self.max_gap_s.max((now - last).as_secs_f64());
        }
        read.usage_only
    }

    /// Forwards every complete event of `partial + data` except a usage-only chunk; keeps an
    /// incomplete tail for the next frame. Zero-copy unless an event was split or removed.
    fn strip_usage(&mut self, data: Bytes, now: Instant) -> Bytes {
        let (done, cut) = if self.partial.is_empty() {
            let (done, cut, scan) = self.events(&data, Scan::default(), now);
            if done < data.len() {
                self.partial.put(&data[done..]);
                self.scan = scan;
            }
            let out = data.slice(..done);
            (out, cut)
        } else {
            let mut partial = std::mem::take(&mut self.partial);
            partial.put(data);
            let (done, cut, scan) = self.events(&partial, self.scan, now);
            let out = partial.split_to(done).freeze();
            self.partial = partial;
            self.scan = scan;
            (out, cut)
        };
        if self.partial.len() > self.max_event {
            self.overflowed = true;
        }
        match cut {
            None => done,
            Some(cut) => {
                let mut out = BytesMut::with_capacity(done.len() - cut.len());
                out.put(&done[..cut.start]);
                out.put(&done[cut.end..]);
                out.freeze()
            }
        }
    }

    /// Reads the complete events at the start of `buf`, the first one's scan resuming at `scan`:
    /// how many bytes they take, the usage-only chunk among them, and the scan of what is left.
    fn events(
        &mut self,
        buf: &[u8],
        mut scan: Scan,
        now: Instant,
    ) -> (usize, Option<std::ops::Range<usize>>, Scan) {
        let mut at = 0;
        let mut cut = None;
        let mut parser = std::mem::take(&mut self.parser);
        loop {
            match event_end(&buf[at..], scan) {
                Ok(len) => {
                    let mut usage_only = false;
                    parser.feed(&buf[at..at + len], &mut |ev| {
                        usage_only |= self.note(ev.event, ev.data, now);
                    });
                    if self.overflowed {
                        // An event over the limit: it, and what follows it, go no further.
                        self.parser = parser;
                        return (at, cut, Scan::default());
                    }
                    if usage_only && cut.is_none() {
                        cut = Some(at..at + len);
                    }
                    at += len;
                    scan = Scan::default();
                }
                Err(left) => {
                    self.parser = parser;
                    return (at, cut, left);
                }
            }
        }
    }
}

/// How many bytes at the start of `buf` hold whole events of at most `max` bytes each (or the
/// rest of an event begun before `buf`): where an event over the limit begins.
fn events_within(buf: &[u8], max: usize) -> usize {
    let mut at = 0;
    while let Ok(len) = event_end(&buf[at..], Scan::default()) {
        if len > max {
            break;
        }
        at += len;
    }
    at
}

/// The length of the event at the start of `buf` (through its blank line), scanning from where
/// `scan` stands; or where a later call should resume. CR, LF and CRLF all end a line.
fn event_end(buf: &[u8], scan: Scan) -> Result<usize, Scan> {
    let Scan {
        mut at,
        mut line_start,
    } = scan;
    while let Some(i) = memchr::memchr2(b'\r', b'\n', &buf[at..]) {
        let end = at + i;
        let mut next = end + 1;
        if buf[end] == b'\r' {
            match buf.get(next) {
                Some(b'\n') => next += 1,
                Some(_) => {}
                // A CR at the very end may be the first half of CRLF: look at it again.
                None => {
                    return Err(Scan {
                        at: end,
                        line_start,
                    });
                }
            }
        }
        if end == line_start {
            return Ok(next);
        }
        line_start = next;
        at = next;
    }
    Err(Scan {
        at: buf.len(),
        line_start,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use crate::proxy::testing::{ROLE, USAGE, content};

    #[test]
    fn event_end_finds_blank_lines_in_every_line_ending_and_resumes_where_it_left() {
        let end = |b: &[u8]| event_end(b, Scan::default()).ok();
        assert_eq!(end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(end(b"data: a\r\n\r\nx"), Some(11));
        assert_eq!(end(b"data: a\r\r"), None, "the last CR may be half of CRLF");
        assert_eq!(end(b"data: a\r\rx"), Some(9));
        assert_eq!(end(b"data: a\n"), None);
        // Fed a byte at a time, each call looks only at what is new.
        let event = b"data: a\r\ndata: b\r\n\r\n";
        let mut scan = Scan::default();
        for n in 1..event.len() {
            scan = event_end(&event[..n], scan).unwrap_err();
            assert!(scan.at >= n - 1, "resumes at {} of {n}", scan.at);
        }
        assert_eq!(event_end(event, scan).ok(), Some(event.len()));
    }

    #[test]
    fn a_line_or_event_longer_than_allowed_overflows_in_either_mode() {
        let t0 = Instant::now();
        for strip in [false, true] {
            let mut m = StreamMeter::new(StreamDialect::OpenAi, strip).with_max_event(1000);
            let (out, _) = m.frame(content("a"), t0);
            assert!(!out.is_empty() && !m.overflowed());
            for _ in 0..9 {
                m.frame(Bytes::from_static(&[b'x'; 100]), t0);
            }
            assert!(!m.overflowed(), "900 bytes of one line so far");
            m.frame(Bytes::from_static(&[b'x'; 200]), t0);
            assert!(m.overflowed(), "strip: {strip}");
            assert_eq!(m.finish(), None, "what was kept of it is dropped");
        }
    }

    #[test]
    fn an_event_over_the_limit_overflows_even_when_it_arrives_whole() {
        let t0 = Instant::now();
        let long = format!("data: {{\"x\":\"{}\"}}\n\n", "a".repeat(1100));
        for strip in [false, true] {
            let mut m = StreamMeter::new(StreamDialect::OpenAi, strip).with_max_event(1000);
            m.frame(content("a"), t0);
            assert!(!m.overflowed());
            let read = [&content("b")[..], long.as_bytes(), &content("c")[..]].concat();
            let (out, _) = m.frame(Bytes::from(read), t0);
            assert!(m.overflowed(), "strip: {strip}");
            assert_eq!(
                out,
                content("b"),
                "the long event and what follows go no further"
            );
        }
    }

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
