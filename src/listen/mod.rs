//! The accept loop every server here shares: TCP with `TCP_NODELAY`, HTTP/1.1 and h2c (HTTP/2
//! with prior knowledge, told apart by the connection's first bytes), HTTPS with both (ALPN
//! chooses), a header-read timeout against slow clients, and graceful shutdown that lets open
//! connections finish up to a deadline.

use std::convert::Infallible;
use std::future::Future;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use pin_project_lite::pin_project;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tower::Service;

mod idle;
mod preface;
mod write_deadline;

use crate::signal::Signal;
use idle::{Activity, Counted, Idle};
use preface::opens_with_h2_preface;
use write_deadline::WriteDeadline;

/// How often an HTTP/2 client connection is pinged, and how long its answer may take.
const H2_PING_EVERY: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a client may take to send its request headers.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How a listener treats its clients.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Time to send request headers (and finish a TLS handshake).
    pub header_read_timeout: Duration,
    /// Largest request head (HTTP/1.1 read buffer; HTTP/2 header list).
    pub max_header_bytes: usize,
    /// Connections open at once; beyond it, new ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long open connections may finish after shutdown begins.
    pub drain: Duration,
    /// A connection with no request in flight is closed after this long (see [`idle`]).
    pub idle_timeout: Duration,
    /// A write to a client that takes no bytes for this long fails the connection (see
    /// [`write_deadline`]).
    pub client_write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_header_bytes: 64 << 10,
            max_connections: 10_000,
            drain: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(120),
            client_write_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `service` on `listener` until `shutdown` completes, then waits up to `limits.drain`
/// for open connections to finish. With `tls`, connections are HTTPS (ALPN h2 and http/1.1); the
/// header-read timeout also bounds the TLS handshake.
pub(crate) async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    service: S,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let header_read_timeout = limits.header_read_timeout;
    let write_timeout = limits.client_write_timeout;
    // Shared, not cloned into each connection's task, which holds what it captures for as long
    // as the connection is open (both builders: 232 bytes a connection).
    let builders = Arc::new(Builders::new(&limits));
    let stopping = Signal::new();
    // Each connection's task holds a slot until it ends: when shutdown has them all back,
    // every connection is done.
    let max_connections = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max_connections));
    tokio::pin!(shutdown);
    loop {
        // A slot first: at the limit, connections wait in the backlog instead of being accepted.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => match accepted {
                Some(conn) => conn,
                None => continue,
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::default());
        let idle = Idle::new(Arc::clone(&activity), limits.idle_timeout);
        let service = TowerToHyperService::new(Counted {
            inner: service.clone(),
            activity,
        });
        let conn = Conn {
            stream,
            peer,
            builders: Arc::clone(&builders),
            ends: (stopping.clone(), idle),
            service,
            header_read_timeout,
            write_timeout,
        };
        // One task type per transport: a task is the size of everything it may hold, and a TLS
        // handshake's state would size every plain connection's task.
        match &tls {
            None => tokio::spawn(async move {
                conn.plain().await;
                drop(slot);
            }),
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    conn.over_tls(acceptor).await;
                    drop(slot);
                })
            }
        };
    }
    drop(listener);
    stopping.fire();
    let drain = limits.drain;
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(drain, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(?drain, "drain deadline passed with connections still open");
    }
}

/// An accepted connection, and what serving it takes.
struct Conn<S> {
    stream: TcpStream,
    peer: SocketAddr,
    builders: Arc<Builders>,
    /// What ends it: the listener's shutdown, or its idle period.
    ends: (Signal, Idle),
    service: TowerToHyperService<Counted<S>>,
    header_read_timeout: Duration,
    write_timeout: Duration,
}

impl<S, B> Conn<S>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Plain TCP: HTTP/1.1, or HTTP/2 where the connection opens with its preface (h2c).
    async fn plain(self) {
        let Self { stream, peer, .. } = self;
        match tokio::time::timeout(self.header_read_timeout, opens_with_h2_preface(stream)).await {
            Ok(Ok(stream)) => {
                let h2 = stream.h2;
                let io = WriteDeadline::new(stream, self.write_timeout);
                serve_connection(io, h2, &self.builders, self.ends, self.service, peer).await;
            }
            Ok(Err(err)) => tracing::debug!(%peer, %err, "connection failed before a request"),
            Err(_) => tracing::debug!(%peer, "no request within the header read timeout"),
        }
    }

    /// TLS, HTTP/2 where ALPN negotiated it (RFC 9113, section 3.2).
    async fn over_tls(self, acceptor: TlsAcceptor) {
        let Self { stream, peer, .. } = self;
        let stream = WriteDeadline::new(stream, self.write_timeout);
        match tokio::time::timeout(self.header_read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                serve_connection(stream, h2, &self.builders, self.ends, self.service, peer).await;
            }
            Ok(Err(err)) => tracing::debug!(%peer, %err, "TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
        }
    }
}

/// The next connection; `None` after a failed accept (EMFILE and friends), once a short pause
/// has passed instead of spinning.
async fn accept(listener: &TcpListener) -> Option<(TcpStream, SocketAddr)> {
    match listener.accept().await {
        Ok(conn) => Some(conn),
        Err(err) => {
            tracing::warn!(%err, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

pin_project! {
    /// A served connection that begins its graceful shutdown (finish the requests in flight,
    /// take no more) once `stopping` fires, or once it has been idle for a period (`idle`).
    ///
    /// hyper-util's `GracefulShutdown` does the same, but its connection future polls the
    /// shutdown signal again every time the connection is polled (once or more per forwarded
    /// chunk); here the signal is polled only when the task polling the connection changes, and
    /// between times asked with one atomic load (what that saved: docs/benchmarks/overhead.md, "Per-chunk
    /// polling: the deadline timer and graceful shutdown").
    struct UntilStopping<C> {
        #[pin]
        conn: C,
        #[pin]
        signal: WaitForCancellationFutureOwned,
        stopping: Signal,
        idle: Idle,
        // The waker `signal` and the idle timer were last polled with.
        registered: Option<Waker>,
        shutting_down: bool,
    }
}

impl<C: GracefulConnection> Future for UntilStopping<C> {
    type Output = Result<(), C::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        let mut this = self.project();
        if !*this.shutting_down {
            let registered = this
                .registered
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()));
            let begun = if registered {
                this.stopping.has_fired()
            } else {
                *this.registered = Some(cx.waker().clone());
                this.signal.poll(cx).is_ready()
            };
            if begun {
                *this.shutting_down = true;
                this.conn.as_mut().graceful_shutdown();
            } else if this.idle.poll_idle(cx, registered) {
                // Nothing in flight for a whole period: closed at once (an HTTP/2 graceful
                // shutdown would wait for the peer to answer a ping, which an idle peer that
                // holds a slot on purpose never does).
                return Poll::Ready(Ok(()));
            }
        }
        this.conn.poll(cx)
    }
}

impl<C> UntilStopping<C> {
    fn new(conn: C, (stopping, idle): (Signal, Idle)) -> Self {
        Self {
            conn,
            signal: stopping.fired(),
            stopping,
            idle,
            registered: None,
            shutting_down: false,
        }
    }
}

/// How every connection of a listener is served, per protocol.
struct Builders {
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
}

impl Builders {
    /// Both protocols held to `limits`: heads of up to twice the header limit reach the stack,
    /// whose limit layer answers those over it with a 431 in the client's dialect; beyond that
    /// the HTTP layers refuse them.
    fn new(limits: &Limits) -> Self {
        let max_buf_size = limits.max_header_bytes.saturating_mul(2).max(8192);
        let max_header_list_size =
            u32::try_from(limits.max_header_bytes.saturating_mul(2)).unwrap_or(u32::MAX);
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(max_buf_size)
            .keep_alive(true);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        // Pings find a peer that is gone while its streams stay open (a dropped network path).
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(max_header_list_size)
            .keep_alive_interval(Some(H2_PING_EVERY))
            .keep_alive_timeout(H2_PING_TIMEOUT);
        Self { http1, http2 }
    }
}

/// Serves one connection in the protocol chosen, until it closes or graceful shutdown ends it.
async fn serve_connection<I, S, B>(
    io: I,
    h2: bool,
    builders: &Builders,
    stopping: (Signal, Idle),
    service: TowerToHyperService<Counted<S>>,
    peer: SocketAddr,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = TokioIo::new(io);
    let ended = if h2 {
        // Boxed, so that HTTP/2's state does not size every HTTP/1 connection's task.
        Box::pin(UntilStopping::new(
            builders.http2.serve_connection(io, service),
            stopping,
        ))
        .await
    } else {
        UntilStopping::new(builders.http1.serve_connection(io, service), stopping).await
    };
    if let Err(err) = ended {
        tracing::debug!(%peer, %err, "connection ended with an error");
    }
}

/// Binds `addr`, naming the address in the error.
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// Whether the server closes a connection that sends `sent` and then nothing, within `within`.
    async fn closes_a_silent_client(sent: &[u8], within: Duration) -> bool {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let service = tower::service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
        });
        let server = tokio::spawn(serve(
            listener,
            None,
            limits,
            service,
            std::future::pending(),
        ));
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(sent).await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(within, client.read_to_end(&mut rest))
            .await
            .is_ok();
        server.abort();
        closed
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_or_half_a_head_is_dropped_after_the_header_read_timeout() {
        assert!(closes_a_silent_client(b"", Duration::from_secs(2)).await);
        assert!(closes_a_silent_client(b"PRI * HTTP/2.0", Duration::from_secs(2)).await);
        assert!(
            closes_a_silent_client(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
                Duration::from_secs(2)
            )
            .await
        );
    }

    #[tokio::test]
    async fn shutdown_lets_a_request_in_flight_finish_and_closes_idle_connections_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            drain: Duration::from_secs(30),
            ..Limits::default()
        };
        // `/slow` answers after 300 ms, anything else at once.
        let service = tower::service_fn(|req: Request<Incoming>| async move {
            if req.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from(
                "done",
            ))))
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, None, limits, service, async {
            let _ = stopped.await;
        }));
        let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        // One connection answered once and left open (idle, kept alive); one mid-request.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(get("/").as_bytes()).await.unwrap();
        let mut head = [0u8; 17];
        idle.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200 OK\r\n");
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(get("/slow").as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;

        let started = tokio::time::Instant::now();
        stop.send(()).unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), busy.read_to_end(&mut answer))
            .await
            .expect("the busy connection is closed once its response is out")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("done"),
            "{answer}"
        );
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest))
            .await
            .expect("the idle connection is closed")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve returns once both connections are done, long before the drain deadline")
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
