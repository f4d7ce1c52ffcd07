//! Where a response body ends (RFC 9112 section 6): a length, chunks, or the connection's close.
//! Decoding takes bytes off the front of the connection's read buffer and hands out data without
//! copying it (each frame shares the buffer), one chunk per frame, so that the frames a backend
//! sent are the frames the client gets.

use bytes::{Buf as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use super::Error;

/// The longest chunk-size line (with extensions) or trailer section read before giving up.
const MAX_LINE: usize = 4096;
/// Chunks up to this size are handed out whole; larger ones as they arrive.
pub(super) const WHOLE_CHUNK: usize = 64 * 1024;
const MAX_TRAILERS: usize = 64 * 1024;

/// How the body of one response is delimited, and how far it has been read.
#[derive(Debug)]
pub(super) enum Framing {
    /// `Content-Length`: the bytes still to come.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked(Chunk),
    /// Neither: the body is whatever comes until the backend closes the connection.
    UntilClose,
    /// The whole body has been read.
    Done,
}

/// Where a chunked body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes still to come.
    Data(u64),
    /// After a chunk's data, at the CRLF that ends it.
    DataEnd,
    /// After the last (zero-size) chunk: trailer fields, then an empty line.
    Trailers,
    /// The trailer fields were handed out: the body is over.
    Over,
}

/// What decoding found in the buffer.
#[derive(Debug)]
pub(super) enum Decoded {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body is over.
    End,
    /// More bytes are needed from the connection.
    More,
}

impl Framing {
    /// Whether the whole body has been read (a length-delimited body as soon as its last
    /// byte was: hyper stops polling a body whose stated length has been sent).
    pub(super) const fn is_done(&self) -> bool {
        matches!(self, Self::Done | Self::Length(0))
    }

    /// How many more bytes than `buffered` the next frame needs (the rest of a chunk that is
    /// handed out whole), for the next read to make room for.
    pub(super) fn wants(&self, buffered: usize) -> usize {
        match self {
            Self::Chunked(Chunk::Data(left)) => usize::try_from(*left)
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
            Self::Chunked(state) => {
                let decoded = decode_chunked(state, buf)?;
                if matches!(decoded, Decoded::End) {
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

fn decode_chunked(state: &mut Chunk, buf: &mut BytesMut) -> Result<Decoded, Error> {
    loop {
        match state {
            Chunk::Size => {
                let Some(line) = take_line(buf, MAX_LINE, "chunk-size line")? else {
                    return Ok(Decoded::More);
                };
                let size = chunk_size(&line)?;
                *state = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(left) => {
                // A chunk up to WHOLE_CHUNK comes out whole, one frame, wherever reads cut it:
                // the frames the client gets are the events the backend sent.
                let short = (buf.len() as u64) < *left;
                if buf.is_empty() || (short && *left <= WHOLE_CHUNK as u64) {
                    return Ok(Decoded::More);
                }
                let n = take_up_to(left, buf.len());
                if *left == 0 {
                    *state = Chunk::DataEnd;
                }
                return Ok(Decoded::Data(buf.split_to(n).freeze()));
            }
            Chunk::DataEnd => match buf.first() {
                None => return Ok(Decoded::More),
                Some(b'\n') => {
                    buf.advance(1);
                    *state = Chunk::Size;
                }
                Some(b'\r') if buf.len() < 2 => return Ok(Decoded::More),
                Some(b'\r') if buf[1] == b'\n' => {
                    buf.advance(2);
                    *state = Chunk::Size;
                }
                Some(_) => return Err(Error::Malformed("a chunk's data is not followed by CRLF")),
            },
            Chunk::Trailers => {
                let decoded = trailers(buf)?;
                if matches!(decoded, Decoded::Trailers(_)) {
                    *state = Chunk::Over;
                }
                return Ok(decoded);
            }
            Chunk::Over => return Ok(Decoded::End),
        }
    }
}

/// The next line of `buf` (without its line ending), taken off the buffer; `None` when the
/// buffer holds no whole line yet.
fn take_line(buf: &mut BytesMut, max: usize, what: &'static str) -> Result<Option<Bytes>, Error> {
    let Some(end) = memchr::memchr(b'\n', buf) else {
        if buf.len() > max {
            return Err(Error::TooLarge(what));
        }
        return Ok(None);
    };
    let mut line = buf.split_to(end + 1);
    line.truncate(end);
    if line.last() == Some(&b'\r') {
        line.truncate(end - 1);
    }
    Ok(Some(line.freeze()))
}

/// A chunk-size line's size: hexadecimal digits, then optional whitespace and extensions
/// (`;name=value`), which are ignored.
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = line[digits..].trim_ascii_start();
    if digits == 0 || !(rest.is_empty() || rest[0] == b';') {
        return Err(Error::Malformed(
            "a chunk-size line is not a hexadecimal size",
        ));
    }
    if digits > 15 {
        return Err(Error::Malformed("a chunk size is too large"));
    }
    line[..digits].iter().try_fold(0u64, |size, &b| {
        let digit = char::from(b).to_digit(16).map(u64::from);
        digit.map(|d| size << 4 | d).ok_or(Error::Malformed(
            "a chunk-size line is not a hexadecimal size",
        ))
    })
}

/// The trailer section after the last chunk: `End` when it is empty (almost always), else its
/// fields first; `More` until the empty line that ends it has come.
fn trailers(buf: &mut BytesMut) -> Result<Decoded, Error> {
    match buf.first() {
        None => return Ok(Decoded::More),
        Some(b'\n') => {
            buf.advance(1);
            return Ok(Decoded::End);
        }
        Some(b'\r') if buf.len() < 2 => return Ok(Decoded::More),
        Some(b'\r') if buf[1] == b'\n' => {
            buf.advance(2);
            return Ok(Decoded::End);
        }
        Some(_) => {}
    }
    let mut fields = [httparse::EMPTY_HEADER; super::MAX_HEADERS];
    match httparse::parse_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete((len, fields))) => {
            let map = header_map(fields)?;
            buf.advance(len);
            Ok(Decoded::Trailers(map))
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_TRAILERS => {
            Err(Error::TooLarge("trailer section"))
        }
        Ok(httparse::Status::Partial) => Ok(Decoded::More),
        Err(_) => Err(Error::Malformed("an invalid trailer section")),
    }
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
            decode_in_steps(&mut Framing::Chunked(Chunk::Size), wire, wire.len()).unwrap();
        assert_eq!(frames, [&b"hello"[..], &b", world"[..]]);
        assert!(trailers.is_none());
        assert!(clean);
    }

    #[test]
    fn a_chunk_cut_by_a_read_still_comes_out_as_one_frame() {
        let wire = b"19\r\ndata: {\"delta\":\"hello\"}\n\n\r\n0\r\n\r\n";
        for step in 1..wire.len() {
            let (frames, _, clean) =
                decode_in_steps(&mut Framing::Chunked(Chunk::Size), wire, step).unwrap();
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
        let wire = b"5;ext=1\r\nhello\r\na \r\n0123456789\n0\r\nx-usage: 42\r\n\r\n";
        for step in 1..wire.len() {
            let (frames, trailers, clean) =
                decode_in_steps(&mut Framing::Chunked(Chunk::Size), wire, step).unwrap();
            assert_eq!(joined(&frames), b"hello0123456789", "step {step}");
            assert_eq!(trailers.unwrap()["x-usage"], "42", "step {step}");
            assert!(clean, "step {step}");
        }
    }

    #[test]
    fn a_chunked_body_cut_before_its_last_chunk_is_an_error() {
        for wire in [&b"5\r\nhel"[..], b"5\r\nhello\r\n", b"5\r\nhello\r\n0\r\n"] {
            let err = decode_in_steps(&mut Framing::Chunked(Chunk::Size), wire, 3).unwrap_err();
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
            let err = decode_in_steps(&mut Framing::Chunked(Chunk::Size), wire, 64).unwrap_err();
            assert!(matches!(err, Error::Malformed(_)), "{wire:?}: {err}");
        }
        let endless = vec![b'1'; MAX_LINE + 1];
        let err = decode_in_steps(&mut Framing::Chunked(Chunk::Size), &endless, 64).unwrap_err();
        assert!(matches!(err, Error::TooLarge(_)), "{err}");
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
