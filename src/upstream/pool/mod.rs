//! One backend's upstream connections, kept open between requests.
//!
//! Not hyper-util's pooled client, whose general pool was a measurable share of a proxied
//! request's instructions (docs/benchmarks/overhead.md, "an upstream connection pool of our own"): a pool
//! keyed by scheme and authority (hashed per request), and a task spawned per HTTP/1 request
//! only to wait until its connection may take the next one. Here the pool belongs to one backend, so there is no key.
//! HTTP/1.1 is spoken by [`h1`] on the request's own task, and a connection comes back to the
//! pool as soon as its response body has been read to the end; HTTP/2 is hyper's
//! (`hyper::client::conn::http2`), each connection on a task of its own.
//!
//! HTTP/1.1 connections serve one request at a time and wait, most recently used first, in a
//! stack; one idle longer than the idle timeout, or closed by the backend, is closed instead of
//! reused (and found within seconds even when no request comes). Where TLS ALPN
//! chose HTTP/2, one connection carries every request up to the backend's limit of concurrent
//! streams, and another is opened when every one is full: an LLM stream lasts minutes, and one
//! queued behind a full connection would wait as long, its wait counted as the backend's time
//! to first token (hyper-util's pool queued it). On a backend that speaks HTTP/2, or may
//! (TLS, before its first connection has said), requests that find no connection open wait
//! for the one being made rather than each making its own, and share its outcome: a backend
//! that cannot be reached fails them together, after one attempt, not one after another.
//!
//! A reused connection the backend closed just as the request went out fails it, unsent (the
//! write failed) or written but unanswered. Only the first is sent once more, on a new
//! connection (as hyper-util did): a request that was written may have been read, and an LLM
//! request is not idempotent (the backend may be generating, and billing, already). That
//! failure goes up as one before the response head, where the retry layer may send it to
//! another backend, counted as an attempt (`max_attempts`, the retry budget, the metrics and
//! the log). The sweep below keeps the window small: connections the backend closed are found
//! within seconds.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{Request, Response, Uri, Version};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower::ServiceExt as _;

use super::connector::Connector;
use super::{BodyError, UpstreamBody, h1};

/// An idle HTTP/1 connection is closed rather than reused after this long (as hyper-util's
/// pool did): backends close theirs after a while, and a request sent on a connection the
/// other end is closing fails.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How often the idle HTTP/1 connections are looked over for ones the backend closed (or that
/// waited past the idle timeout), to close them on our side too: no task watches an idle
/// connection, and one the backend closed would otherwise stay half-closed, a descriptor held,
/// until a request or the next return found it.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The connections to one backend.
pub struct Pool {
    connector: Connector,
    /// Where new connections go: the backend's URL.
    base: Uri,
    /// How long a new connection may take, TCP and TLS together (`connect_timeout_ms`).
    connect_timeout: Duration,
    /// HTTP/1 connections ready for a request; the most recently used at the back.
    idle: Mutex<VecDeque<Idle>>,
    /// The backend's HTTP/2 connections, where ALPN chose HTTP/2, oldest first: filled in turn,
    /// so that when the load falls the later ones go idle, for the backend to close.
    shared: Mutex<Vec<Shared>>,
    /// Held while a connection is made to a backend that speaks or may speak HTTP/2: requests
    /// that find none open wait for that one instead of each making its own.
    connecting: tokio::sync::Mutex<()>,
    /// What the backend's last connection spoke ([`Speaks`]): only on HTTP/2 does a checkout
    /// look for the shared connection (a lock an HTTP/1 backend's requests need not take),
    /// and only on HTTP/1 do connects not wait for each other.
    speaks: AtomicU8,
    /// Connection attempts that failed, and the last one's error: a request that waited for an
    /// attempt fails with it.
    failed: Mutex<(u64, Option<Arc<dyn std::error::Error + Send + Sync>>)>,
}

/// The protocol a backend's connections speak, as far as they have shown.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Speaks {
    /// A TLS backend before its first connection: ALPN may choose either.
    Unknown,
    Http1,
    Http2,
}

impl Speaks {
    fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Http1,
            2 => Self::Http2,
            _ => Self::Unknown,
        }
    }
}

/// An HTTP/2 connection, the streams open on it and the most the backend allows at once.
struct Shared {
    sender: http2::SendRequest<UpstreamBody>,
    streams: Arc<AtomicUsize>,
    max_streams: Arc<AtomicUsize>,
}

impl Shared {
    fn has_room(&self) -> bool {
        self.streams.load(Ordering::Relaxed) < self.max_streams.load(Ordering::Relaxed)
    }

    /// A stream on this connection, counted until its response ends or is dropped.
    fn open_stream(&self) -> (http2::SendRequest<UpstreamBody>, Stream) {
        self.streams.fetch_add(1, Ordering::Relaxed);
        (self.sender.clone(), Stream(Arc::clone(&self.streams)))
    }
}

/// One stream counted open on an HTTP/2 connection.
#[derive(Debug)]
struct Stream(Arc<AtomicUsize>);

impl Drop for Stream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Idle {
    conn: h1::Connection,
    since: Instant,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("base", &self.base)
            .field("idle", &lock(&self.idle).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing is left half-changed under these locks: a panic elsewhere poisons nothing real.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a request got no response head.
#[derive(Debug)]
pub(crate) enum SendError {
    /// No connection could be made (refused, timed out, TLS). Shared: every request that
    /// waited for the attempt fails with its error.
    Connect(Arc<dyn std::error::Error + Send + Sync>),
    /// A connection was made (or reused) and the HTTP/1.1 exchange failed.
    Http1(h1::Error),
    /// The HTTP/2 stream failed.
    Http2(hyper::Error),
}

impl SendError {
    /// Whether the request never reached a connection.
    pub(crate) const fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(_))
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect(_) => f.write_str("cannot connect"),
            Self::Http1(e) => e.fmt(f),
            Self::Http2(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect(e) => Some(&**e),
            Self::Http1(e) => e.source(),
            Self::Http2(e) => e.source(),
        }
    }
}

/// A connection on its way to the pool or to a request.
enum Conn {
    One(h1::Connection),
    Shared(http2::SendRequest<UpstreamBody>, Stream),
}

impl Pool {
    /// The pool of `backend`'s connections, made by its [`connector`](super::connector).
    pub(crate) fn for_backend(backend: &crate::config::BackendConfig) -> Result<Arc<Self>, String> {
        let connector = super::connector::for_backend(backend)?;
        Ok(Self::new(
            connector,
            backend.url.clone(),
            backend.connect_timeout,
        ))
    }

    /// A pool of connections to `base` (the backend's URL) made by `connector`, each within
    /// `connect_timeout`.
    pub(crate) fn new(connector: Connector, base: Uri, connect_timeout: Duration) -> Arc<Self> {
        let pool = Arc::new(Self {
            connector,
            connect_timeout,
            idle: Mutex::new(VecDeque::new()),
            shared: Mutex::new(Vec::new()),
            connecting: tokio::sync::Mutex::const_new(()),
            // Without TLS there is no ALPN to choose HTTP/2.
            speaks: AtomicU8::new(if base.scheme() == Some(&http::uri::Scheme::HTTPS) {
                Speaks::Unknown as u8
            } else {
                Speaks::Http1 as u8
            }),
            failed: Mutex::new((0, None)),
            base,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Ends with the pool (a configuration reload drops it).
            let pool = Arc::downgrade(&pool);
            runtime.spawn(async move {
                let mut every = tokio::time::interval(SWEEP_EVERY);
                every.tick().await;
                loop {
                    every.tick().await;
                    let Some(pool) = pool.upgrade() else { break };
                    pool.sweep();
                }
            });
        }
        pool
    }

    /// Closes the idle connections the backend has closed or that waited past the idle
    /// timeout.
    fn sweep(&self) {
        let now = Instant::now();
        lock(&self.idle)
            .retain_mut(|i| now.duration_since(i.since) < IDLE_TIMEOUT && i.conn.is_open());
    }

    fn speaks(&self) -> Speaks {
        Speaks::from_u8(self.speaks.load(Ordering::Relaxed))
    }

    /// HTTP/1 connections waiting for a request.
    #[cfg(test)]
    fn idle(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Sends `req` (its URI absolute, to this pool's backend, and its `Host` header set) and
    /// waits for the response head. The body gives its HTTP/1 connection back to the pool, or
    /// counts its HTTP/2 stream closed, when it ends or is dropped.
    pub(crate) async fn send(
        self: Arc<Self>,
        req: Request<UpstreamBody>,
    ) -> Result<Response<PooledBody>, SendError> {
        let (conn, idle_for) = match self.checkout() {
            Some((conn, idle_for)) => (conn, Some(idle_for)),
            // Boxed: the connect and handshake futures are large, and most requests never
            // make them; unboxed they would sit in (and be copied with) every request's future.
            None => Box::pin(self.open()).await?,
        };
        let (err, req) = match self.exchange(conn, req).await {
            Ok(resp) => return Ok(resp),
            // Handed back unsent: the connection closed before the request was written, so the
            // backend never saw it.
            Err((err, Some(unsent))) if idle_for.is_some() => (err, unsent),
            // Written (it may be running there) or a new connection: not sent again here.
            Err((err, _)) => return Err(err),
        };
        tracing::debug!(backend = %self.base, "reused connection closed ({err}); sending again");
        let conn = Box::pin(self.connect()).await?;
        self.exchange(conn, req).await.map_err(|(e, _)| e)
    }

    async fn exchange(
        self: &Arc<Self>,
        conn: Conn,
        mut req: Request<UpstreamBody>,
    ) -> Result<Response<PooledBody>, (SendError, Option<Request<UpstreamBody>>)> {
        match conn {
            Conn::One(conn) => match conn.send(req).await {
                Ok(resp) => Ok(resp.map(|body| PooledBody::http1(body, Arc::clone(self)))),
                Err((e, unsent)) => Err((SendError::Http1(e), unsent)),
            },
            Conn::Shared(mut sender, stream) => {
                *req.version_mut() = Version::HTTP_2;
                match sender.try_send_request(req).await {
                    Ok(resp) => Ok(resp.map(|body| PooledBody {
                        inner: Inner::Http2 {
                            body,
                            stream: Some(stream),
                        },
                    })),
                    Err(mut e) => {
                        let req = e.take_message();
                        Err((SendError::Http2(e.into_error()), req))
                    }
                }
            }
        }
    }

    /// A connection ready for a request, if one is open, and how long it has been idle.
    fn checkout(&self) -> Option<(Conn, Duration)> {
        if self.speaks() == Speaks::Http2 {
            let mut shared = lock(&self.shared);
            shared.retain(|c| !c.sender.is_closed());
            if let Some(c) = shared.iter().find(|c| c.has_room()) {
                let (sender, stream) = c.open_stream();
                // Shared by requests in flight: never idle in the sense that matters here.
                return Some((Conn::Shared(sender, stream), Duration::ZERO));
            }
        }
        let mut idle = lock(&self.idle);
        let now = Instant::now();
        while let Some(Idle { mut conn, since }) = idle.pop_back() {
            let idle_for = now.duration_since(since);
            if idle_for >= IDLE_TIMEOUT {
                // Every connection below it has waited longer still.
                idle.clear();
                return None;
            }
            // No system call unless the socket turned readable while idle (closed, mostly).
            if conn.is_open() {
                return Some((Conn::One(conn), idle_for));
            }
            // Closed by the backend while it waited: dropped.
        }
        None
    }

    /// A connection for a request that found none open: a new one, or, on a backend that
    /// speaks or may speak HTTP/2, the one another request is making meanwhile (then with how
    /// long it has been idle).
    async fn open(&self) -> Result<(Conn, Option<Duration>), SendError> {
        if self.speaks() == Speaks::Http1 {
            return Ok((self.connect().await?, None));
        }
        let failures_before = lock(&self.failed).0;
        let making = self.connecting.lock().await;
        if let Some((conn, idle_for)) = self.checkout() {
            return Ok((conn, Some(idle_for)));
        }
        if let Some(err) = self.failed_since(failures_before) {
            // The attempt this request waited for failed; another now would keep each request
            // behind it waiting one more connect timeout on a backend that cannot be reached.
            return Err(SendError::Connect(err));
        }
        if self.speaks() == Speaks::Http1 {
            // The connection waited for spoke HTTP/1: it serves one request, and the rest
            // connect at once, side by side.
            drop(making);
        }
        Ok((self.connect().await?, None))
    }

    /// The last connect error, if an attempt failed since `failures` were counted.
    fn failed_since(&self, failures: u64) -> Option<Arc<dyn std::error::Error + Send + Sync>> {
        let failed = lock(&self.failed);
        if failed.0 == failures {
            return None;
        }
        failed.1.clone()
    }

    /// Opens a connection to the backend: HTTP/2 where ALPN chose it (run on a task of its
    /// own, its larger handshake boxed apart), else HTTP/1.1.
    ///
    /// Every request that finds no idle connection holds this future (in a box) until the
    /// connection is made, so its size is resident memory under a burst of new streams.
    async fn connect(&self) -> Result<Conn, SendError> {
        // The connector's own timeout covers the TCP connect only; a backend that accepts and
        // never finishes the TLS handshake would hold the request until its first-token timeout.
        let connecting = self.connector.clone().oneshot(self.base.clone());
        let io = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(io)) => io,
            Ok(Err(err)) => return Err(self.failed(Arc::from(err))),
            Err(_) => {
                return Err(self.failed(Arc::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TCP connect and TLS handshake took longer than connect_timeout_ms",
                ))));
            }
        };
        if io.connected().is_negotiated_h2() {
            return Box::pin(self.start_http2(io)).await;
        }
        if self.speaks() != Speaks::Http1 {
            // The backend no longer offers HTTP/2 (or never did): its old shared connections,
            // if still open, end with the requests on them.
            lock(&self.shared).clear();
            self.speaks.store(Speaks::Http1 as u8, Ordering::Relaxed);
        }
        Ok(Conn::One(h1::Connection::new(io)))
    }

    /// Counts a failed connect, for the requests that waited for it, and fails this one.
    fn failed(&self, err: Arc<dyn std::error::Error + Send + Sync>) -> SendError {
        let mut failed = lock(&self.failed);
        *failed = (failed.0 + 1, Some(Arc::clone(&err)));
        SendError::Connect(err)
    }

    /// Starts HTTP/2 on a connection whose ALPN chose it, shared by requests from then on.
    async fn start_http2(
        &self,
        io: MaybeHttpsStream<TokioIo<TcpStream>>,
    ) -> Result<Conn, SendError> {
        // The preface and settings go out here, before any request: a failure is one to connect,
        // shared with the requests that waited for it.
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(|e| self.failed(Arc::new(e)))?;
        let max_streams = Arc::new(AtomicUsize::new(conn.current_max_send_streams()));
        let conn = PublishingLimit {
            conn,
            max_streams: Arc::clone(&max_streams),
        };
        spawn_boxed(conn);
        let connection = Shared {
            sender,
            streams: Arc::new(AtomicUsize::new(0)),
            max_streams,
        };
        let (sender, stream) = connection.open_stream();
        lock(&self.shared).push(connection);
        self.speaks.store(Speaks::Http2 as u8, Ordering::Relaxed);
        Ok(Conn::Shared(sender, stream))
    }

    /// Takes back an HTTP/1 connection whose response was read to its end. Connections that
    /// wait too long are closed by the sweep, or by the checkout that finds them.
    fn give_back(&self, conn: h1::Connection) {
        let since = Instant::now();
        lock(&self.idle).push_back(Idle { conn, since });
    }
}

/// Runs an HTTP/2 connection on a task of its own, the connection boxed apart from the task:
/// Tokio allocates a task with its future inline and aligned to a cache line, which for hyper's
/// HTTP/1 connections (when they had tasks) cost more resident memory per idle stream than a
/// small task and a plain allocation (docs/benchmarks/overhead.md, "the memory of setting up a stream"). The connection is polled where it lies (`map`): an
/// `async` block awaiting it would hold it twice, once as what it captured and once as the
/// future it awaits.
fn spawn_boxed(connection: PublishingLimit) {
    tokio::spawn(Box::pin(connection.map(|ended| {
        if let Err(e) = ended {
            tracing::debug!("upstream HTTP/2 connection ended: {e}");
        }
    })));
}

type Http2Connection =
    http2::Connection<MaybeHttpsStream<TokioIo<TcpStream>>, UpstreamBody, TokioExecutor>;

pin_project_lite::pin_project! {
    /// An HTTP/2 connection that publishes the backend's limit of concurrent streams (its
    /// SETTINGS, which may change at any time) each time it is polled, for the pool to read:
    /// hyper tells it only to the connection, not to the requests' side.
    struct PublishingLimit {
        #[pin]
        conn: Http2Connection,
        max_streams: Arc<AtomicUsize>,
    }
}

impl Future for PublishingLimit {
    type Output = hyper::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let polled = this.conn.as_mut().poll(cx);
        this.max_streams
            .store(this.conn.current_max_send_streams(), Ordering::Relaxed);
        polled
    }
}

/// A response body from the pool: read from its HTTP/1 connection, which goes back to the pool
/// when the body has been read to its end (and closes if the body is dropped before), or from an
/// HTTP/2 stream, counted closed when the body ends or is dropped.
#[derive(Debug)]
pub(crate) struct PooledBody {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Http1 {
        body: h1::Body,
        pool: Arc<Pool>,
    },
    Http2 {
        body: Incoming,
        stream: Option<Stream>,
    },
}

impl PooledBody {
    fn http1(mut body: h1::Body, pool: Arc<Pool>) -> Self {
        // A body-less response (HEAD, 204, 304) is over with its head.
        if let Some(conn) = body.take_reusable() {
            pool.give_back(conn);
        }
        Self {
            inner: Inner::Http1 { body, pool },
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().inner {
            Inner::Http1 { body, pool } => {
                let frame = std::task::ready!(Pin::new(&mut *body).poll_frame(cx));
                // Given back as soon as the last of the body is read, before it is forwarded.
                if body.is_end_stream()
                    && let Some(conn) = body.take_reusable()
                {
                    pool.give_back(conn);
                }
                Poll::Ready(frame.map(|f| f.map_err(BodyError::from)))
            }
            Inner::Http2 { body, stream } => {
                let frame = std::task::ready!(Pin::new(body).poll_frame(cx));
                if frame.is_none() {
                    stream.take();
                }
                Poll::Ready(frame.map(|f| f.map_err(BodyError::from)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Http1 { body, .. } => body.is_end_stream(),
            Inner::Http2 { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Http1 { body, .. } => body.size_hint(),
            Inner::Http2 { body, .. } => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests;
