//! The incremental SSE parser.

use memchr::memchr2;

/// One dispatched event. Borrows the parser's buffers: valid until the next `feed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field, empty when absent (the spec's default type "message").
    pub event: &'a [u8],
    /// The `data:` lines joined with `\n`.
    pub data: &'a [u8],
}

/// Splits a byte stream into events. Buffers are reused, so after warm-up feeding allocates
/// nothing.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    event: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// The last read ended in CR: an LF opening the next read belongs to the same line end.
    skip_lf: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the stream, calling `on_event` for every event they complete.
    pub fn feed(&mut self, mut bytes: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
        // An empty read says nothing about whether the CR was half of a CRLF.
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = memchr2(b'\r', b'\n', bytes) {
            if self.partial.is_empty() {
                self.line(&bytes[..end], on_event);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&bytes[..end]);
                self.line(&line, on_event);
                line.clear();
                self.partial = line;
            }
            let mut next = end + 1;
            if bytes[end] == b'\r' {
                match bytes.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            bytes = &bytes[next..];
        }
        self.partial.extend_from_slice(bytes);
    }

    /// Bytes held for what has not ended yet: the start of a line, and the data of an event
    /// without its blank line.
    pub(crate) fn buffered(&self) -> usize {
        self.partial.len() + self.data.len()
    }

    fn line(&mut self, line: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
        if line.is_empty() {
            if self.has_data {
                on_event(SseEvent {
                    event: &self.event,
                    data: &self.data,
                });
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(0) => return, // a comment or keep-alive
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            _ => {} // id, retry and unknown fields do not matter here
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(stream: &[u8], cut: usize) -> Vec<(String, String)> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        let mut push = |ev: SseEvent<'_>| {
            out.push((
                String::from_utf8_lossy(ev.event).into_owned(),
                String::from_utf8_lossy(ev.data).into_owned(),
            ));
        };
        for piece in stream.chunks(cut.max(1)) {
            parser.feed(piece, &mut push);
        }
        out
    }

    const STREAM: &[u8] = b": keep-alive\n\ndata: {\"a\":1}\n\nevent: message_delta\r\ndata:{\"b\":2}\r\n\r\ndata: one\rdata: two\r\rdata: [DONE]\n\n";

    #[test]
    fn events_are_the_same_however_the_stream_is_split() {
        let whole = parse_in_pieces(STREAM, STREAM.len());
        assert_eq!(
            whole,
            [
                (String::new(), "{\"a\":1}".to_owned()),
                ("message_delta".to_owned(), "{\"b\":2}".to_owned()),
                (String::new(), "one\ntwo".to_owned()),
                (String::new(), "[DONE]".to_owned()),
            ]
        );
        for cut in 1..STREAM.len() {
            assert_eq!(parse_in_pieces(STREAM, cut), whole, "cut at {cut}");
        }
    }

    /// Found by the split property below: a CR ending one read, then an empty read, then the LF.
    /// The empty read cleared the "maybe CRLF" state, so the LF became a blank line and split
    /// one event in two.
    #[test]
    fn an_empty_read_between_cr_and_lf_keeps_them_one_line_end() {
        let mut parser = SseParser::new();
        let mut events = 0;
        for piece in [&b"data: a\r"[..], b"", b"\ndata: b\r\n\r\n"] {
            parser.feed(piece, &mut |ev| {
                assert_eq!(ev.data, b"a\nb");
                events += 1;
            });
        }
        assert_eq!(events, 1);
    }

    #[test]
    fn an_event_without_its_blank_line_is_not_dispatched() {
        assert!(parse_in_pieces(b"data: x\n", 100).is_empty());
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// A stream of events with every line ending SSE allows, and the events it encodes.
        fn stream() -> impl Strategy<Value = (Vec<u8>, Vec<(String, String)>)> {
            let line = "[a-z0-9 {}\":,]{0,12}";
            let event = (
                proptest::option::of("[a-z_]{1,8}"),
                proptest::collection::vec(line, 1..3),
                0usize..3,
            );
            proptest::collection::vec(event, 0..6).prop_map(|events| {
                let mut bytes = Vec::new();
                let mut expected = Vec::new();
                for (name, lines, ending) in events {
                    let eol: &[u8] = [&b"\n"[..], b"\r\n", b"\r"][ending];
                    bytes.extend_from_slice(b": comment");
                    bytes.extend_from_slice(eol);
                    if let Some(name) = &name {
                        bytes.extend_from_slice(format!("event: {name}").as_bytes());
                        bytes.extend_from_slice(eol);
                    }
                    for line in &lines {
                        bytes.extend_from_slice(b"data:");
                        bytes.extend_from_slice(line.as_bytes());
                        bytes.extend_from_slice(eol);
                    }
                    bytes.extend_from_slice(eol);
                    expected.push((name.unwrap_or_default(), lines.join("\n")));
                }
                (bytes, expected)
            })
        }

        fn parse(pieces: &[&[u8]]) -> Vec<(String, String)> {
            let mut parser = SseParser::new();
            let mut out = Vec::new();
            for piece in pieces {
                parser.feed(piece, &mut |ev| {
                    out.push((
                        String::from_utf8_lossy(ev.event).into_owned(),
                        String::from_utf8_lossy(ev.data).into_owned(),
                    ));
                });
            }
            out
        }

        proptest! {
            #[test]
            fn every_split_of_a_stream_gives_the_same_events(
                (bytes, expected) in stream(),
                cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
            ) {
                let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
                at.sort_unstable();
                let mut pieces = Vec::new();
                let mut start = 0;
                for cut in at {
                    pieces.push(&bytes[start..cut]);
                    start = cut;
                }
                pieces.push(&bytes[start..]);
                // A data line starting with a space loses it ("data: x" is "x"), as the spec says.
                let expected: Vec<(String, String)> = expected
                    .into_iter()
                    .map(|(e, d)| (e, d.split('\n').map(|l| l.strip_prefix(' ').unwrap_or(l)).collect::<Vec<_>>().join("\n")))
                    .collect();
                prop_assert_eq!(parse(&pieces), expected);
            }

            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..512) {
                let cut = cut.min(bytes.len());
                parse(&[&bytes[..cut], &bytes[cut..]]);
            }
        }
    }
}
