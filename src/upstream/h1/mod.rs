//! HTTP/1.1 to a backend, spoken by the request that holds the connection: the request is
//! written, the response head read and the body read as the client's side of the gateway polls
//! for it, all on the client connection's own task.
//!
//! hyper's client (which the pool used before) runs each connection on a task of its own and
//! hands requests, heads and body frames across channels to it; an open stream kept its
//! dispatch channel, a read and a write buffer, and the boxed connection and its task: about
//! half of what an idle stream cost in resident memory, with no setting to make any of it
//! smaller (docs/benchmarks/overhead.md, "Memory per idle stream, by owner"). Here a connection is a socket
//! and one read buffer that starts at 1 KiB and grows only while reads fill it. The request
//! head is written from a buffer freed once it is sent, with the body beside it (one `writev`).
//! The parsing is httparse's, as in hyper; the framing (length, chunks, close) is ours.

mod framing;
mod head;

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response};
use hyper::body::{Frame, SizeHint};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use self::framing::{Decoded, Framing};
use super::UpstreamBody;

/// The most header fields a response head (or trailer section) may have, as hyper allows.
const MAX_HEADERS: usize = 100;

/// What the first read of a response reserves: a streamed response's head and first events fit,
/// and small allocations share pages (an idle stream's resident cost is the pages it touched).
const FIRST_READ: usize = 1024;
/// The most a read reserves, reached by doubling while reads fill the buffer (large bodies).
/// A chunk up to this size waits for its last byte and goes out as one frame.
const MAX_READ: usize = 64 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The connection closed (or was reset) after the request was written, before any of the
    /// response came: a backend closing an idle connection as the request arrived.
    #[error("the connection closed before a response head came")]
    ClosedBeforeHead,
    #[error("the connection closed before the end of the response body")]
    ClosedInBody,
    /// The backend sent bytes (or closed the connection) while no request was out on it.
    #[error("the backend sent what no request asked for, or closed the connection")]
    Unasked,
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    #[error("malformed response: {0}")]
    Malformed(&'static str),
    #[error("the response's {0} is too large")]
    TooLarge(&'static str),
}

/// A request that failed, and the request itself unless all of it was written.
pub(crate) type Failed = (Error, Option<Request<UpstreamBody>>);

/// An open HTTP/1.1 connection to a backend, ready for a request.
#[derive(Debug)]
pub(crate) struct Connection {
    io: Io,
    /// What was read and not yet handed out. Frames handed out share its allocation.
    buf: BytesMut,
    /// What the next read reserves when the buffer is full.
    read_size: usize,
}

/// The connection's socket, with or without TLS.
#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    // Boxed: a TLS session is kilobytes, and most backends are plain TCP.
    Tls(Box<TlsStream<TokioIo<TokioIo<TcpStream>>>>),
}

impl Connection {
    /// A connection over the connector's stream, which ALPN (where there was TLS) did not
    /// make HTTP/2.
    pub(crate) fn new(stream: MaybeHttpsStream<TokioIo<TcpStream>>) -> Self {
        let io = match stream {
            MaybeHttpsStream::Http(tcp) => Io::Plain(tcp.into_inner()),
            MaybeHttpsStream::Https(tls) => Io::Tls(Box::new(tls.into_inner())),
        };
        Self {
            io,
            buf: BytesMut::new(),
            read_size: FIRST_READ,
        }
    }

    /// Whether the connection is still open, as far as can be told without waiting: the
    /// backend has not closed it (nor sent anything unasked). Costs no system call unless the
    /// socket has become readable since it was last read.
    pub(crate) fn is_open(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut probe)
            .is_pending()
    }

    /// Writes `req` (its URI's path and query, its headers and its body) and reads the
    /// response head. The body reads the rest of the response from this connection.
    pub(crate) async fn send(
        mut self,
        req: Request<UpstreamBody>,
    ) -> Result<Response<Body>, Failed> {
        self.read_size = FIRST_READ;
        // Scoped so that the request is not kept while the response is awaited.
        let (method, sent) = {
            let (parts, body) = req.into_parts();
            let body = body.into_inner().unwrap_or_default();
            let head = head::encode_request(&parts, body.len());
            // Requests that became ready together are written together: the task lets the
            // others run first, so that the backend is woken once for the batch rather than
            // once per request. Where it shares the host (a sidecar, or the benchmark), each
            // wake-up is an interrupt to its core charged to the gateway's (the wake-ups and the
            // requests/s this bought: docs/benchmarks/overhead.md, "An HTTP/1.1 client of our own"). hyper's
            // client batched so by accident, its requests crossing to the connections' own
            // tasks.
            tokio::task::yield_now().await;
            // Anything the backend sent since its last response was read (a second answer to
            // it, from a buggy backend) would be taken for the answer to this request: the
            // connection is given up before a byte is written, and the request handed back
            // unsent. Bytes that come once the request is out cannot be told from its answer
            // (docs/gateway.md, "Backends that misbehave").
            if !self.is_open() {
                let unsent = Request::from_parts(parts, UpstreamBody::new(body));
                return Err((Error::Unasked, Some(unsent)));
            }
            match self.write(&head, &body, &parts.method).await {
                Ok(sent) => (parts.method, sent),
                Err(e) => {
                    let unsent = Request::from_parts(parts, UpstreamBody::new(body));
                    return Err((closed_or(e), Some(unsent)));
                }
            }
        };
        let head = match sent {
            Sent::Whole => std::future::poll_fn(|cx| self.poll_head(cx, &method)).await,
            // The backend still expects the rest of the request: the connection is done.
            Sent::Answered(head) => head.map(|head| head::Head {
                reusable: false,
                ..head
            }),
        }
        .map_err(|e| (e, None))?;
        // Likewise responses: heads that came together go out to their clients together (same
        // section).
        tokio::task::yield_now().await;
        let body = Body {
            conn: Some(self),
            framing: head.framing,
            reusable: head.reusable,
        };
        Ok(Response::from_parts(head.parts, body))
    }

    /// Writes the request head and body, together where the socket takes both at once. A
    /// backend may answer before it has read the whole request (a 413 for a body too large) and
    /// stop reading it, or close the connection: while the socket takes no more, and when it
    /// fails, what the backend sent is read, and once a final response head has come the rest
    /// of the request is not written (RFC 9112, "Failures and Timeouts": a client that sees an
    /// error response while it sends a body stops sending it). An LLM API answers only once it
    /// has read and parsed the whole body, so an early answer is taken for such a refusal,
    /// whatever its status.
    async fn write(
        &mut self,
        mut head: &[u8],
        mut body: &[u8],
        method: &Method,
    ) -> io::Result<Sent> {
        std::future::poll_fn(|cx| {
            while !head.is_empty() || !body.is_empty() {
                let parts = [IoSlice::new(head), IoSlice::new(body)];
                let written = match Pin::new(&mut self.io).poll_write_vectored(cx, &parts) {
                    Poll::Ready(Ok(written)) => written,
                    // A backend that answered and closed with the request unread resets the
                    // connection; its answer may have come before the reset.
                    Poll::Ready(Err(e)) => {
                        return match self.poll_head(cx, method) {
                            Poll::Ready(Ok(head)) => Poll::Ready(Ok(Sent::Answered(Ok(head)))),
                            _ => Poll::Ready(Err(e)),
                        };
                    }
                    Poll::Pending => {
                        return match ready!(self.poll_head(cx, method)) {
                            // Closed unanswered: as if the write had failed.
                            Err(Error::ClosedBeforeHead) => {
                                Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
                            }
                            answer => Poll::Ready(Ok(Sent::Answered(answer))),
                        };
                    }
                };
                if written == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                let of_head = written.min(head.len());
                head = &head[of_head..];
                body = &body[written - of_head..];
            }
            Pin::new(&mut self.io)
                .poll_flush(cx)
                .map_ok(|()| Sent::Whole)
        })
        .await
    }

    /// Reads until a final response head is whole (interim ones, a `100 Continue`, skipped).
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
    ) -> Poll<Result<head::Head, Error>> {
        loop {
            if let Some(head) = head::parse_response(&mut self.buf, method)? {
                return Poll::Ready(Ok(head));
            }
            let nothing_yet = self.buf.is_empty();
            match ready!(self.poll_fill(cx, 0)) {
                Ok(0) if nothing_yet => return Poll::Ready(Err(Error::ClosedBeforeHead)),
                Ok(0) => {
                    return Poll::Ready(Err(Error::Malformed("the response head was cut short")));
                }
                Ok(_) => {}
                Err(e) if nothing_yet => return Poll::Ready(Err(closed_or(e))),
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    /// Reads more of the response into the buffer, with room for `wants` bytes at least: how
    /// many bytes came (0: the backend closed). What is left of the buffer is read into while
    /// it is half a read or more; a smaller rest is replaced (or reclaimed, once the frames that
    /// share it are gone), so that reads stay large enough to take several events at once.
    fn poll_fill(&mut self, cx: &mut Context<'_>, wants: usize) -> Poll<io::Result<usize>> {
        let mut room = self.buf.capacity() - self.buf.len();
        if room < wants.max(self.read_size / 2) {
            self.buf.reserve(wants.max(self.read_size));
            room = self.buf.capacity() - self.buf.len();
        }
        let read = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        if read == room && self.read_size < MAX_READ {
            self.read_size *= 2;
        }
        Poll::Ready(Ok(read))
    }
}

/// How the writing of a request ended.
#[derive(Debug)]
enum Sent {
    /// All of it went out.
    Whole,
    /// The backend answered before taking all of it: its response head, or what was wrong
    /// with what it sent.
    Answered(Result<head::Head, Error>),
}

/// A reset or broken pipe with no response yet reads as the close it is (the backend closed
/// the connection as the request arrived); any other error stays itself.
fn closed_or(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Error::ClosedBeforeHead,
        _ => Error::Io(e),
    }
}

/// A response body, read from its connection as it is polled. The connection closes when the
/// body is dropped before its end.
#[derive(Debug)]
pub(crate) struct Body {
    /// `None` once the connection was taken back for another request, or dropped on an error.
    conn: Option<Connection>,
    framing: Framing,
    reusable: bool,
}

impl Body {
    /// The connection, once the body has been read to its end, when it may carry another
    /// request: the response said nothing against it and nothing came after the body.
    pub(crate) fn take_reusable(&mut self) -> Option<Connection> {
        let conn = self.conn.as_ref()?;
        (self.framing.is_done() && self.reusable && conn.buf.is_empty())
            .then(|| self.conn.take())
            .flatten()
    }

    fn fail(&mut self, err: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.conn = None;
        self.framing = Framing::Done;
        Poll::Ready(Some(Err(err)))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let decoded = match this.framing.decode(&mut conn.buf) {
                Ok(Decoded::More) => {
                    match ready!(conn.poll_fill(cx, this.framing.wants(conn.buf.len()))) {
                        Ok(0) => this.framing.at_close().inspect(|_| this.reusable = false),
                        Ok(_) => continue,
                        Err(e) => Err(Error::Io(e)),
                    }
                }
                decoded => decoded,
            };
            return match decoded {
                Ok(Decoded::Data(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::Trailers(map)) => Poll::Ready(Some(Ok(Frame::trailers(map)))),
                Ok(Decoded::End | Decoded::More) => Poll::Ready(None),
                Err(e) => this.fail(e),
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.framing
            .exact()
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// Reads one response to a `method` request from `wire`, as a connection reads it: the bytes
/// arrive in reads of the sizes `reads` gives (the rest in one), then the backend closes. The
/// head, the body's bytes and its trailers. For the fuzz target, which checks this against
/// hyper's client on the same bytes.
#[doc(hidden)]
pub fn read_response(
    wire: &[u8],
    method: &Method,
    reads: impl IntoIterator<Item = usize>,
) -> Result<(http::response::Parts, Vec<u8>, Option<http::HeaderMap>), Error> {
    let mut reads = reads.into_iter();
    let mut rest = wire;
    let mut read = |buf: &mut BytesMut| {
        let n = reads
            .next()
            .unwrap_or(rest.len())
            .clamp(1, rest.len().max(1));
        let (piece, after) = rest.split_at(n.min(rest.len()));
        buf.extend_from_slice(piece);
        rest = after;
        piece.len()
    };
    let mut buf = BytesMut::new();
    let head = loop {
        if let Some(head) = head::parse_response(&mut buf, method)? {
            break head;
        }
        if read(&mut buf) == 0 {
            return Err(if buf.is_empty() {
                Error::ClosedBeforeHead
            } else {
                Error::Malformed("the response head was cut short")
            });
        }
    };
    let (mut framing, mut body, mut trailers) = (head.framing, Vec::new(), None);
    loop {
        let decoded = match framing.decode(&mut buf)? {
            Decoded::More if read(&mut buf) == 0 => framing.at_close()?,
            decoded => decoded,
        };
        match decoded {
            Decoded::Data(data) => body.extend_from_slice(&data),
            Decoded::Trailers(map) => trailers = Some(map),
            Decoded::End => return Ok((head.parts, body, trailers)),
            Decoded::More => {}
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(tcp) => tcp.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests;
