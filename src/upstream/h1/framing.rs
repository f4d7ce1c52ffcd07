//! Where a response body ends (RFC 9112 section 6): a length, chunks, or the connection's close.
//! Decoding takes bytes off the front of the connection's read buffer and hands out data without
//! copying it (each frame shares the buffer), one chunk per frame, so that the frames a backend
//! sent are the frames the client gets.

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::Error;

/// The longest chunk-size line (with extensions) read before giving up.
const MAX_LINE: usize = 4096;
/// The most chunk-extension bytes one body may carry, across its chunks (as hyper allows).
const MAX_EXTENSIONS: usize = 16 * 1024;
/// A trailer section reaching this size is refused (as hyper does).
const MAX_TRAILERS: usize = 16 * 1024;
/// Chunks up to this size are handed out whole; larger ones as they arrive.
pub(super) const WHOLE_CHUNK: usize = 64 * 1024;

/// How the body of one response is delimited, and how far it has been read.
#[derive(Debug)]
pub(super) enum Framing {
    /// `Content-Length`: the bytes still to come.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked(Chunked),
    /// Neither: the body is whatever comes until the backend closes the connection.
    UntilClose,
    /// The whole body has been read.
    Done,
}

/// A chunked body's reading: where it stands, and the extension bytes seen so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunked {
    at: Chunk,
    extension_bytes: usize,
}

/// Where a chunked body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes still to come.
    Data(u64),
    /// After a chunk's data, at the CRLF that ends it.
    DataEnd,
    /// After the last (zero-size) chunk: trailer fields, then an empty line.
    Trailers,
}

/// What decoding found in the buffer.
#[derive(Debug)]
pub(super) enum Decoded {
    Data(Bytes),
    /// The trailer fields, which end the body.
    Trailers(HeaderMap),
    /// The body is over.
    End,
    /// More bytes are needed from the connection.
    More,
}

impl Framing {
    /// A chunked body, at its first chunk-size line.
    pub(super) const fn chunked() -> Self {
        Self::Chunked(Chunked {
            at: Chunk::Size,
            extension_bytes: 0,
        })
    }

    /// Whether the whole body has been read (a length-delimited body as soon as its last
    /// byte was: hyper stops polling a body whose stated length has been sent; a chunked one
    /// as soon as its trailers were, which are its last frame).
    pub(super) const fn is_done(&self) -> bool {
        matches!(self, Self::Done | Self::Length(0))
    }

    /// How many more bytes than `buffered` the next frame needs (the rest of a chunk that is
    /// handed out whole), for the next read to make room for.
    pub(super) fn wants(&self, buffered: usize) -> usize {
        match self {
            Self::Chunked(Chunked {
                at: Chunk::Data(left),
                ..
            }) => usize::try_from(*left)
                .map_or(0, |left| left.saturating_sub(buffered).min(WHOLE_CHUNK)),
            _ => 0,
        }
    }

    /// The body's exact remaining length, where the framing states one.
    pub(super) const fn exact(&self) -> Option<u64> {
        match self {
            Self::Length(n) => Some(*n),
            Self::Done => Some(0),
            _ => None,
        }
    }

    /// Decodes the next piece of the body from the front of `buf`.
    pub(super) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Error> {
        match self {
            Self::Done => Ok(Decoded::End),
            Self::Length(0) => {
                *self = Self::Done;
                Ok(Decoded::End)
            }
            Self::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let n = take_up_to(left, buf.len());
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            Self::UntilClose => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                Ok(Decoded::Data(buf.split().freeze()))
            }
            Self::Chunked(chunked) => {
                let decoded = chunked.decode(buf)?;
                if matches!(decoded, Decoded::End | Decoded::Trailers(_)) {
                    *self = Self::Done;
                }
                Ok(decoded)
            }
        }
    }

    /// What the backend closing the connection means here: the end of a body read until close,
    /// else a body cut short.
    pub(super) fn at_close(&mut self) -> Result<Decoded, Error> {
        match self {
            Self::UntilClose | Self::Done | Self::Length(0) => {
                *self = Self::Done;
                Ok(Decoded::End)
            }
            _ => Err(Error::ClosedInBody),
        }
    }
}

/// Takes up to `available` of the `left` bytes still to come: how many.
fn take_up_to(left: &mut u64, available: usize) -> usize {
    let n = usize::try_from(*left).map_or(available, |left| left.min(available));
    *left -= n as u64;
    n
}

/// Chunked framing is read as strictly as hyper reads it (RFC 9112 section 7.1): every line
/// ends in CRLF, never a bare LF or CR. A lenient reader and a strict one in front of or
/// behind it disagree about where a body ends, which is how responses are smuggled.
impl Chunked {
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, Error> {
        loop {
            match self.at {
                Chunk::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Decoded::More);
                    };
                    let (size, extension) = chunk_size(&line)?;
                    self.extension_bytes += extension;
                    if self.extension_bytes >= MAX_EXTENSIONS {
                        return Err(Error::TooLarge("chunk extensions"));
                    }
                    self.at = if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    };
                }
                Chunk::Data(ref mut left) => {
                    // A chunk up to WHOLE_CHUNK comes out whole, one frame, wherever reads cut
                    // it: the frames the client gets are the events the backend sent.
                    let short = (buf.len() as u64) < *left;
                    if buf.is_empty() || (short && *left <= WHOLE_CHUNK as u64) {
                        return Ok(Decoded::More);
                    }
                    let n = take_up_to(left, buf.len());
                    if *left == 0 {
                        self.at = Chunk::DataEnd;
                    }
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                Chunk::DataEnd => {
                    if !take_crlf(buf, "a chunk's data is not followed by CRLF")? {
                        return Ok(Decoded::More);
                    }
                    self.at = Chunk::Size;
                }
                Chunk::Trailers => return trailers(buf),
            }
        }
    }
}

/// Takes the CRLF at the front of `buf`: whether it was there whole (`false`: more bytes are
/// needed); anything else there is an error, `what`.
fn take_crlf(buf: &mut BytesMut, what: &'static str) -> Result<bool, Error> {
    match &buf[..] {
        [] | [b'\r'] => Ok(false),
        [b'\r', b'\n', ..] => {
            buf.advance(2);
            Ok(true)
        }
        _ => Err(Error::Malformed(what)),
    }
}

/// The next chunk-size line of `buf` without its CRLF, taken off the buffer; `None` when the
/// buffer holds no whole line yet.
fn take_line(buf: &mut BytesMut) -> Result<Option<Bytes>, Error> {
    let Some(end) = memchr::memchr(b'\n', buf) else {
        if buf.len() > MAX_LINE {
            return Err(Error::TooLarge("chunk-size line"));
        }
        return Ok(None);
    };
    let mut line = buf.split_to(end + 1);
    if end == 0 || line[end - 1] != b'\r' {
        return Err(Error::Malformed("a chunk-size line does not end in CRLF"));
    }
    line.truncate(end - 1);
    Ok(Some(line.freeze()))
}

/// A chunk-size line's size and how many bytes of extensions it carries: hexadecimal digits,
/// then optional spaces or tabs, then optional extensions (`;name=value`, ignored).
fn chunk_size(line: &[u8]) -> Result<(u64, usize), Error> {
    const NOT_A_SIZE: Error = Error::Malformed("a chunk-size line is not a hexadecimal size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(NOT_A_SIZE);
    }
    let size = line[..digits].iter().try_fold(0u64, |size, &b| {
        let digit = char::from(b).to_digit(16).map_or(0, u64::from);
        size.checked_mul(16)
            .and_then(|size| size.checked_add(digit))
            .ok_or(Error::Malformed("a chunk size is too large"))
    })?;
    let rest = &line[digits..];
    let rest = &rest[rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count()..];
    let extension = match rest {
        [] => 0,
        [b';', extension @ ..] => extension.len(),
        _ => return Err(NOT_A_SIZE),
    };
    // A CR belongs only at the end of the line.
    if memchr::memchr(b'\r', rest).is_some() {
        return Err(Error::Malformed("a chunk-size line holds a bare CR"));
    }
    Ok((size, extension))
}

/// The trailer section after the last chunk: `End` when it is empty (almost always), else its
/// fields; `More` until the empty line that ends it has come. Its lines end in CRLF, and it
/// holds at most as many fields and bytes as hyper reads.
fn trailers(buf: &mut BytesMut) -> Result<Decoded, Error> {
    const BARE: &str = "a trailer section line does not end in CRLF";
    match &buf[..] {
        [] | [b'\r'] => return Ok(Decoded::More),
        [b'\r', b'\n', ..] => {
            buf.advance(2);
            return Ok(Decoded::End);
        }
        [b'\r' | b'\n', ..] => return Err(Error::Malformed(BARE)),
        _ => {}
    }
    let end = memchr::memmem::find(buf, b"\r\n\r\n").map(|at| at + 4);
    let section = &buf[..end.unwrap_or(buf.len())];
    if section.len() >= MAX_TRAILERS {
        return Err(Error::TooLarge("trailer section"));
    }
    // A CR must be followed by LF (a CR last in the buffer is followed by what comes next),
    // and an LF must follow a CR.
    let bare = section.iter().enumerate().any(|(i, &b)| match b {
        b'\r' => section.get(i + 1).is_some_and(|&next| next != b'\n'),
        b'\n' => section[i - 1] != b'\r',
        _ => false,
    });
    if bare {
        return Err(Error::Malformed(BARE));
    }
    let Some(end) = end else {
        return Ok(Decoded::More);
    };
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    let map = match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((len, fields))) if len == end => header_map(fields)?,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Error::TooLarge("trailer section"));
        }
        _ => return Err(Error::Malformed("an invalid trailer section")),
    };
    buf.advance(end);
    Ok(Decoded::Trailers(map))
}

/// A trailer section's fields as a header map (copied: trailers are rare).
fn header_map(fields: &[httparse::Header<'_>]) -> Result<HeaderMap, Error> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| Error::Malformed("an invalid trailer name"))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| Error::Malformed("an invalid trailer value"))?;
        map.append(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes all of `wire`, handed over in pieces of `step` bytes; the data frames and the
    /// trailers, or the error.
    fn decode_in_steps(
        framing: &mut Framing,
        wire: &[u8],
        step: usize,
    ) -> Result<(Vec<Bytes>, Option<HeaderMap>, bool), Error> {
        let (mut buf, mut frames, mut trailers) = (BytesMut::new(), Vec::new(), None);
        let mut pieces = wire.chunks(step);
        loop {
            match framing.decode(&mut buf)? {
                Decoded::Data(d) => frames.push(d),
                Decoded::Trailers(t) => trailers = Some(t),
                Decoded::End => return Ok((frames, trailers, buf.is_empty())),
                Decoded::More => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => {
                        framing.at_close()?;
                        return Ok((frames, trailers, true));
                    }
                },
            }
        }
    }

    fn joined(frames: &[Bytes]) -> Vec<u8> {
        frames.concat()
    }

    #[test]
    fn each_chunk_is_one_frame_when_it_arrives_whole() {
        let wire = b"5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n";
        let (frames, trailers, clean) =
            decode_in_steps(&mut Framing::chunked(), wire, wire.len()).unwrap();
        assert_eq!(frames, [&b"hello"[..], &b", world"[..]]);
        assert!(trailers.is_none());
        assert!(clean);
    }

    #[test]
    fn a_chunk_cut_by_a_read_still_comes_out_as_one_frame() {
        let wire = b"19\r\ndata: {\"delta\":\"hello\"}\n\n\r\n0\r\n\r\n";
        for step in 1..wire.len() {
            let (frames, _, clean) = decode_in_steps(&mut Framing::chunked(), wire, step).unwrap();
            assert_eq!(
                frames,
                [&b"data: {\"delta\":\"hello\"}\n\n"[..]],
                "step {step}"
            );
            assert!(clean);
        }
    }

    #[test]
    fn chunked_bodies_decode_the_same_split_at_any_byte() {
        let wire = b"5;ext=1\r\nhello\r\na \t\r\n0123456789\r\n0\r\nx-usage: 42\r\n\r\n";
        for step in 1..wire.len() {
            let (frames, trailers, clean) =
                decode_in_steps(&mut Framing::chunked(), wire, step).unwrap();
            assert_eq!(joined(&frames), b"hello0123456789", "step {step}");
            assert_eq!(trailers.unwrap()["x-usage"], "42", "step {step}");
            assert!(clean, "step {step}");
        }
    }

    #[test]
    fn a_chunked_body_cut_before_its_last_chunk_is_an_error() {
        for wire in [&b"5\r\nhel"[..], b"5\r\nhello\r\n", b"5\r\nhello\r\n0\r\n"] {
            let err = decode_in_steps(&mut Framing::chunked(), wire, 3).unwrap_err();
            assert!(matches!(err, Error::ClosedInBody), "{err}");
        }
    }

    #[test]
    fn malformed_chunks_are_errors_not_guesses() {
        for wire in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            b"1234567890abcdef0\r\n",
            b"\r\n",
        ] {
            let err = decode_in_steps(&mut Framing::chunked(), wire, 64).unwrap_err();
            assert!(matches!(err, Error::Malformed(_)), "{wire:?}: {err}");
        }
        let endless = vec![b'1'; MAX_LINE + 1];
        let err = decode_in_steps(&mut Framing::chunked(), &endless, 64).unwrap_err();
        assert!(matches!(err, Error::TooLarge(_)), "{err}");
    }

    #[test]
    fn framing_that_hyper_refuses_as_lenient_is_refused() {
        for wire in [
            // A bare LF after a size line, after chunk data, after the last chunk.
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\n0\n\r\n",
            b"5\r\nhello\r\n0\r\n\n",
            // A bare CR, in an extension or ending a line.
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\r\n0\r\n\r\n",
            // Trailer lines ended by a bare LF.
            b"5\r\nhello\r\n0\r\nx: 1\nx: 2\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx: 1\r\n\n",
            // Whitespace before the size, between its digits, or a sign.
            b" 5\r\nhello\r\n0\r\n\r\n",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            // A size past 64 bits.
            b"10000000000000000\r\n",
        ] {
            let err = decode_in_steps(&mut Framing::chunked(), wire, 64).unwrap_err();
            assert!(
                matches!(err, Error::Malformed(_)),
                "{}: {err}",
                String::from_utf8_lossy(wire)
            );
        }
        // Leading zeros are not a size past 64 bits.
        let wire = b"0000000000000000000005\r\nhello\r\n0\r\n\r\n";
        let (frames, _, _) = decode_in_steps(&mut Framing::chunked(), wire, 64).unwrap();
        assert_eq!(joined(&frames), b"hello");
    }

    #[test]
    fn chunk_extensions_are_capped_across_the_body() {
        let line = format!("1;{}\r\nx\r\n", "e".repeat(MAX_LINE - 8));
        let under = format!("{}0\r\n\r\n", line.repeat(MAX_EXTENSIONS / (MAX_LINE - 8)));
        let over = format!(
            "{}0\r\n\r\n",
            line.repeat(MAX_EXTENSIONS / (MAX_LINE - 8) + 1)
        );
        assert!(decode_in_steps(&mut Framing::chunked(), under.as_bytes(), 512).is_ok());
        let err = decode_in_steps(&mut Framing::chunked(), over.as_bytes(), 512).unwrap_err();
        assert!(matches!(err, Error::TooLarge(_)), "{err}");
    }

    #[test]
    fn trailers_end_the_body_as_soon_as_they_are_read() {
        let mut framing = Framing::chunked();
        let mut buf = BytesMut::from(&b"2\r\nhi\r\n0\r\nx-usage: 7\r\n\r\n"[..]);
        assert!(matches!(
            framing.decode(&mut buf).unwrap(),
            Decoded::Data(_)
        ));
        assert!(!framing.is_done());
        assert!(matches!(
            framing.decode(&mut buf).unwrap(),
            Decoded::Trailers(_)
        ));
        assert!(framing.is_done(), "the trailers are the body's last frame");
        assert!(buf.is_empty());
    }

    #[test]
    fn a_trailer_section_is_capped_in_size_and_fields() {
        let many = format!(
            "0\r\n{}\r\n",
            "x: 1\r\n".repeat(super::super::MAX_HEADERS + 1)
        );
        let large = format!("0\r\nx: {}\r\n\r\n", "a".repeat(MAX_TRAILERS));
        for wire in [many, large] {
            let err = decode_in_steps(&mut Framing::chunked(), wire.as_bytes(), 256).unwrap_err();
            assert!(matches!(err, Error::TooLarge(_)), "{err}");
        }
    }

    #[test]
    fn a_length_delimited_body_ends_at_its_length_and_leaves_what_follows() {
        let mut framing = Framing::Length(5);
        let mut buf = BytesMut::from(&b"hello, next"[..]);
        assert!(matches!(framing.decode(&mut buf).unwrap(), Decoded::Data(d) if d == "hello"));
        assert!(matches!(framing.decode(&mut buf).unwrap(), Decoded::End));
        assert!(framing.is_done());
        assert_eq!(&buf[..], b", next");
    }

    #[test]
    fn a_length_delimited_body_cut_short_is_an_error() {
        let err = decode_in_steps(&mut Framing::Length(10), b"hello", 2).unwrap_err();
        assert!(matches!(err, Error::ClosedInBody), "{err}");
    }

    #[test]
    fn a_body_without_length_or_chunks_ends_when_the_connection_closes() {
        let (frames, _, _) = decode_in_steps(&mut Framing::UntilClose, b"all of it", 4).unwrap();
        assert_eq!(joined(&frames), b"all of it");
    }
}
