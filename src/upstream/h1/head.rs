//! Heads on the wire: the request's written, the response's parsed (by httparse, hyper's own
//! parser) into `http` types that share the bytes read rather than copy them.

use std::mem::MaybeUninit;

use bytes::{Buf as _, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version, request, response};

use super::framing::Framing;
use super::{Error, MAX_HEADERS};

/// The longest response head read before giving up.
const MAX_HEAD: usize = 64 * 1024;

/// A request head as HTTP/1.1 writes it: the path alone on the request line (the `Host` header
/// names the backend), and a `Content-Length` for the body unless one is there already (the
/// gateway keeps the client's where it still states the body's length).
pub(super) fn encode_request(parts: &request::Parts, body_len: usize) -> Vec<u8> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let method = parts.method.as_str();
    let fields: usize = parts
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    // Request line, fields, a Content-Length of up to 20 digits, the empty line.
    let mut out = Vec::with_capacity(method.len() + path.len() + 12 + fields + 38 + 2);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // As hyper does: a body-less GET, HEAD or CONNECT states no length; anything else does.
    let states_none =
        body_len == 0 && matches!(parts.method, Method::GET | Method::HEAD | Method::CONNECT);
    if !parts.headers.contains_key(CONTENT_LENGTH) && !states_none {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A response head, and what it says of the body and the connection.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) parts: response::Parts,
    pub(super) framing: Framing,
    /// Whether the connection may carry another request once this body is read.
    pub(super) reusable: bool,
}

/// Parses the response head at the front of `buf` and takes it off; `None` until the buffer
/// holds a whole one. Interim responses (1xx) before it are taken off and skipped.
pub(super) fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, Error> {
    loop {
        // Left uninitialised, as hyper does: zeroing a hundred fields per response would cost
        // more than parsing the few a response has.
        let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let config = httparse::ParserConfig::default();
        let len = match config.parse_response_with_uninit_headers(&mut parsed, buf, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(Error::TooLarge("response head"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Error::Head(e)),
        };
        let code = parsed.code.unwrap_or_default();
        if code == 101 {
            return Err(Error::Malformed("the backend switched protocols (101)"));
        }
        if (100..200).contains(&code) {
            buf.advance(len);
            continue;
        }
        let status =
            StatusCode::from_u16(code).map_err(|_| Error::Malformed("an invalid status code"))?;
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        // Where each field lies, so that the values can share the head's bytes once it is off
        // the buffer (the fields borrow the buffer until then).
        let base = buf.as_ptr() as usize;
        // Offsets into the buffer, which holds less than 4 GiB.
        let offset = |part: &[u8]| (part.as_ptr() as usize - base) as u32;
        let mut spans = [[0u32; 4]; MAX_HEADERS];
        let count = parsed.headers.len();
        for (span, field) in spans.iter_mut().zip(parsed.headers.iter()) {
            let (name, value) = (field.name.as_bytes(), field.value);
            *span = [
                offset(name),
                name.len() as u32,
                offset(value),
                value.len() as u32,
            ];
        }
        let head = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(count);
        for span in &spans[..count] {
            let [name_at, name_len, value_at, value_len] = span.map(|n| n as usize);
            let name = HeaderName::from_bytes(&head[name_at..name_at + name_len])
                .map_err(|_| Error::Malformed("an invalid header name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(value_at..value_at + value_len))
                .map_err(|_| Error::Malformed("an invalid header value"))?;
            headers.append(name, value);
        }
        let (framing, reusable) = body_framing(&headers, status, version, method)?;
        let (mut parts, ()) = http::Response::new(()).into_parts();
        parts.status = status;
        parts.version = version;
        parts.headers = headers;
        return Ok(Some(Head {
            parts,
            framing,
            reusable,
        }));
    }
}

/// How the body is delimited (RFC 9112 section 6.3) and whether the connection outlives it.
fn body_framing(
    headers: &HeaderMap,
    status: StatusCode,
    version: Version,
    method: &Method,
) -> Result<(Framing, bool), Error> {
    let keep_alive = if version == Version::HTTP_11 {
        !has_token(headers, "close")
    } else {
        has_token(headers, "keep-alive")
    };
    if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((Framing::Done, keep_alive));
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        if version == Version::HTTP_10 {
            return Err(Error::Malformed(
                "a Transfer-Encoding in an HTTP/1.0 response",
            ));
        }
        let mut codings = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii);
        // Only `chunked`, once, is taken: another coding (gzip, deflate) would reach the
        // client as bytes it is not told how to read (the gateway passes no transfer coding
        // on), and chunked twice is not allowed (RFC 9112 section 6.1).
        let chunked = codings
            .next()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        if !chunked || codings.next().is_some() {
            return Err(Error::Malformed(
                "a transfer coding other than a single chunked (compression is not passed on: ask the backend not to compress)",
            ));
        }
        // A length beside chunks is ignored, and the connection closed after (a sign of
        // request smuggling, RFC 9112 section 6.3).
        return Ok((
            Framing::chunked(),
            keep_alive && !headers.contains_key(CONTENT_LENGTH),
        ));
    }
    let length = content_length(headers)?;
    Ok(match length {
        Some(n) => (Framing::Length(n), keep_alive),
        None => (Framing::UntilClose, false),
    })
}

/// The `Content-Length`, if stated; fields that disagree or are not a number are an error.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for item in value.as_bytes().split(|&b| b == b',') {
            let item = item.trim_ascii();
            let n = std::str::from_utf8(item)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(Error::Malformed("an invalid Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::Malformed("Content-Length fields that disagree"));
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Whether the `Connection` header lists `token`.
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers.get_all(CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(wire: &[u8], method: &Method) -> Result<Option<Head>, Error> {
        parse_response(&mut BytesMut::from(wire), method)
    }

    #[test]
    fn a_request_head_names_the_path_and_states_the_body_length() {
        let (parts, ()) = http::Request::post("http://backend:8000/v1/chat/completions?x=1")
            .header("host", "backend:8000")
            .header("content-type", "application/json")
            .body(())
            .unwrap()
            .into_parts();
        let head = encode_request(&parts, 42);
        assert_eq!(
            std::str::from_utf8(&head).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: backend:8000\r\n\
             content-type: application/json\r\ncontent-length: 42\r\n\r\n"
        );
        let (parts, ()) = http::Request::get("http://b/v1/models")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(
            encode_request(&parts, 0),
            b"GET /v1/models HTTP/1.1\r\n\r\n"
        );
    }

    #[test]
    fn a_response_head_comes_whole_with_what_it_says_of_the_body() {
        let wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                     transfer-encoding: chunked\r\nx-request-id: abc\r\n\r\n5\r\nhello";
        for cut in 0..wire.len() - 10 {
            assert!(
                parse(&wire[..cut], &Method::POST).unwrap().is_none(),
                "cut at {cut}"
            );
        }
        let mut buf = BytesMut::from(&wire[..]);
        let head = parse_response(&mut buf, &Method::POST).unwrap().unwrap();
        assert_eq!(head.parts.status, 200);
        assert_eq!(head.parts.headers["x-request-id"], "abc");
        assert!(matches!(head.framing, Framing::Chunked(_)));
        assert!(head.reusable);
        assert_eq!(&buf[..], b"5\r\nhello");
    }

    #[test]
    fn interim_responses_before_the_head_are_skipped() {
        let wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
                     HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
        let head = parse(wire, &Method::POST).unwrap().unwrap();
        assert_eq!(head.parts.status, 201);
        assert!(head.parts.headers.get("link").is_none());
    }

    #[test]
    fn the_connection_is_reused_only_when_the_body_is_delimited_and_nobody_said_close() {
        let cases: [(&[u8], &Method, bool); 7] = [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n",
                &Method::POST,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n",
                &Method::POST,
                false,
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", &Method::POST, false),
            (
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n",
                &Method::POST,
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n",
                &Method::POST,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n",
                &Method::POST,
                false,
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", &Method::HEAD, true),
        ];
        for (wire, method, reusable) in cases {
            let head = parse(wire, method).unwrap().unwrap();
            assert_eq!(head.reusable, reusable, "{}", String::from_utf8_lossy(wire));
        }
    }

    #[test]
    fn malformed_heads_are_errors() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: -2\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(
                parse(wire, &Method::POST).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let endless = [b"HTTP/1.1 200 OK\r\nx: ".as_slice(), &[b'a'; MAX_HEAD]].concat();
        assert!(matches!(
            parse(&endless, &Method::POST),
            Err(Error::TooLarge(_))
        ));
    }
}
