//! Any bytes as a backend's answer, read in pieces of any size, by our HTTP/1.1 client and by
//! hyper's on the same bytes: no panic, never a response hyper refuses, and where both read
//! one, the same status, headers, body and trailers. Where only hyper reads one, the refusal
//! must be one we make on purpose (a transfer coding we do not pass on, a limit hyper lacks).
#![no_main]

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, response};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tpsgate::{H1Error as Error, read_response};

type Read = (response::Parts, Vec<u8>, Option<HeaderMap>);

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
});

fuzz_target!(|data: &[u8]| {
    let [flags, step, wire @ ..] = data else {
        return;
    };
    let method = if flags & 1 == 1 {
        Method::HEAD
    } else {
        Method::POST
    };
    let step = usize::from(*step).max(1);
    let ours = read_response(wire, &method, std::iter::repeat(step));
    let theirs = RUNTIME.block_on(hyper_reads(wire.to_vec(), step, method.clone()));
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => {
            assert_eq!(ours.0.status, theirs.0.status, "status");
            assert_eq!(ours.0.version, theirs.0.version, "version");
            assert_eq!(ours.0.headers, theirs.0.headers, "headers");
            assert_eq!(ours.1, theirs.1, "body");
            assert_eq!(ours.2, theirs.2, "trailers");
        }
        (Ok(_), Err(theirs)) => panic!("we read a response hyper refuses: {theirs}"),
        (Err(ours), Ok(_)) => assert!(
            refused_on_purpose(&ours),
            "we refuse a response hyper reads: {ours}"
        ),
        (Err(_), Err(_)) => {}
    }
});

/// Responses hyper reads and we refuse by design.
fn refused_on_purpose(err: &Error) -> bool {
    match err {
        // Compression as a transfer coding would reach the client unannounced; an LLM API
        // has no business switching protocols on a request that did not ask to; hyper ends
        // trailer lines at a CR but lets httparse read them, which takes a bare LF too (and
        // stops at the first empty line, dropping what follows).
        Error::Malformed(why) => [
            "a transfer coding other than",
            "switched protocols",
            "a trailer section line does not end in CRLF",
        ]
        .iter()
        .any(|on_purpose| why.starts_with(on_purpose) || why.contains(on_purpose)),
        _ => false,
    }
}

async fn hyper_reads(wire: Vec<u8>, step: usize, method: Method) -> Result<Read, String> {
    let io = TokioIo::new(Wire {
        wire,
        at: 0,
        step,
        asked: false,
        reader: None,
    });
    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri("/v1/chat/completions")
        .header("host", "backend")
        .body(Empty::new())
        .expect("a request");
    let read = async {
        let (parts, mut body) = send
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?
            .into_parts();
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = body.frame().await {
            match frame.map_err(|e| e.to_string())?.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        Ok((parts, data, trailers))
    }
    .await;
    driver.abort();
    read
}

/// A backend's side of a connection: once the request is written, it answers `wire` in reads
/// of `step` bytes, then closes.
struct Wire {
    wire: Vec<u8>,
    at: usize,
    step: usize,
    /// Whether the request was written, and who waits to read until it is.
    asked: bool,
    reader: Option<std::task::Waker>,
}

impl AsyncRead for Wire {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.asked {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = self
            .step
            .min(self.wire.len() - self.at)
            .min(buf.remaining());
        buf.put_slice(&self.wire[self.at..self.at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.asked = true;
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
