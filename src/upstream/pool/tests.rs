//! The pool against real sockets on loopback: reuse, resends, HTTP/2 sharing, sweeps.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt as _;
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::sim::Fleet;
use crate::sim::config::FleetRaw;

/// A TCP relay in front of a backend: it counts the connections made through it and cuts
/// every open one on demand, as a backend closing its idle connections would.
struct Relay {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    // Connections the pool's side closed.
    closed: Arc<AtomicUsize>,
    cut: tokio::sync::watch::Sender<u32>,
}

impl Relay {
    async fn to(backend: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (cut, _) = tokio::sync::watch::channel(0);
        let (count, ends, cuts) = (Arc::clone(&accepted), Arc::clone(&closed), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let (mut cut, ends) = (cuts.subscribe(), Arc::clone(&ends));
                tokio::spawn(async move {
                    let mut server = TcpStream::connect(backend).await.unwrap();
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {
                            ends.fetch_add(1, Ordering::SeqCst);
                        }
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            addr,
            accepted,
            closed,
            cut,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

async fn backend() -> (Fleet, SocketAddr) {
    backend_with("").await
}

/// A simulated backend serving `m` with a 1 ms step; `more` adds fields to its YAML.
async fn backend_with(more: &str) -> (Fleet, SocketAddr) {
    let yaml = format!(
        "backends:\n  - {{name: sim, listen: 127.0.0.1:0, models: [m], \
         engine: {{step_base_ms: 1}}{more}}}\n"
    );
    let specs = crate::yaml::from_str::<FleetRaw>(&yaml)
        .unwrap()
        .validate()
        .unwrap();
    let fleet = Fleet::start(&specs).await.unwrap();
    let addr = fleet.addr("sim").unwrap();
    (fleet, addr)
}

/// A simulated backend, a relay in front of it, and a pool of connections through the relay.
async fn through_relay() -> (Fleet, Relay, Arc<Pool>) {
    let (fleet, sim) = backend().await;
    let relay = Relay::to(sim).await;
    let pool = pool_to(relay.addr);
    (fleet, relay, pool)
}

fn pool_to(addr: SocketAddr) -> Arc<Pool> {
    pool_for(&format!("http://{addr}, dialect: openai"))
}

/// A pool for a backend whose YAML flow mapping starts with `url: ` and these fields.
fn pool_for(url_and_fields: &str) -> Arc<Pool> {
    let yaml = format!("backends:\n  - {{name: b, url: {url_and_fields}, models: {{m: m}}}}\n");
    let config = crate::config::parse(&yaml, |_| None).unwrap();
    Pool::for_backend(&config.backends[0]).unwrap()
}

fn chat(addr: SocketAddr) -> Request<UpstreamBody> {
    chat_of(addr, 3)
}

/// A streamed chat request for `tokens` tokens (a millisecond each).
fn chat_of(addr: SocketAddr, tokens: u32) -> Request<UpstreamBody> {
    let body = format!(r#"{{"model":"m","messages":[],"max_tokens":{tokens},"stream":true}}"#);
    Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(UpstreamBody::new(Bytes::from(body)))
        .unwrap()
}

async fn exchange(pool: &Arc<Pool>, addr: SocketAddr) -> Bytes {
    let resp = Arc::clone(pool).send(chat(addr)).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn one_connection_serves_request_after_request() {
    let (_fleet, relay, pool) = through_relay().await;
    for _ in 0..5 {
        let body = exchange(&pool, relay.addr).await;
        assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
    }
    assert_eq!(relay.accepted(), 1);
    assert_eq!(pool.idle(), 1);
}

#[tokio::test]
async fn requests_at_once_get_connections_of_their_own_and_each_comes_back() {
    let (_fleet, relay, pool) = through_relay().await;
    let heads =
        futures_util::future::join_all((0..3).map(|_| Arc::clone(&pool).send(chat(relay.addr))))
            .await;
    assert_eq!(
        pool.idle(),
        0,
        "each connection is lent until its body ends"
    );
    for head in heads {
        head.unwrap().into_body().collect().await.unwrap();
    }
    assert_eq!(relay.accepted(), 3);
    assert_eq!(pool.idle(), 3);
    exchange(&pool, relay.addr).await;
    assert_eq!(relay.accepted(), 3, "the next request reuses one of them");
}

#[tokio::test]
async fn a_connection_the_backend_closed_while_idle_is_replaced_without_an_error() {
    let (_fleet, relay, pool) = through_relay().await;
    exchange(&pool, relay.addr).await;
    relay.cut_all();
    // Once the pool's connection has read the close (a request that leaves in the instant
    // before fails as with any client: it was sent, and may not be sent twice).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let body = exchange(&pool, relay.addr).await;
    assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
    assert_eq!(relay.accepted(), 2);
    assert_eq!(
        pool.idle(),
        1,
        "the closed connection was dropped, not kept"
    );
}

/// Regression: after a connection idled a second or more, a fully written POST that got no
/// response head was sent again on a new connection, invisibly. An LLM request is not
/// idempotent: the backend may already be generating (and billing) it.
#[tokio::test]
async fn a_request_written_to_a_connection_the_backend_closed_is_not_sent_again() {
    // A backend that answers the first request on each connection and, as the next one
    // arrives, reads it and closes unanswered.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = socket.read(&mut buf).await;
            });
        }
    });
    let pool = pool_to(addr);
    exchange(&pool, addr).await;
    // Idle a while first: the pool once sent again what followed a long idle.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(5)).await;
    tokio::time::resume();
    let err = Arc::clone(&pool).send(chat(addr)).await.unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "no new connection: not sent again"
    );
}

#[tokio::test]
async fn a_response_dropped_before_its_end_closes_its_connection() {
    let (_fleet, relay, pool) = through_relay().await;
    // Ten seconds of tokens: the response is far from its end when it is dropped.
    let mut body = Arc::clone(&pool)
        .send(chat_of(relay.addr, 10_000))
        .await
        .unwrap()
        .into_body();
    body.frame().await.unwrap().unwrap();
    // The client went away mid-stream: the backend must see the connection close (so that
    // it stops generating), and no later request may read the rest of this response.
    drop(body);
    for _ in 0..100 {
        if relay.closed.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        relay.closed.load(Ordering::SeqCst),
        1,
        "the connection was closed"
    );
    exchange(&pool, relay.addr).await;
    assert_eq!(relay.accepted(), 2);
    assert_eq!(pool.idle(), 1);
}

#[tokio::test]
async fn a_connection_the_backend_closed_while_idle_is_closed_within_seconds_without_a_request() {
    let (_fleet, relay, pool) = through_relay().await;
    exchange(&pool, relay.addr).await;
    assert_eq!(pool.idle(), 1);
    relay.cut_all();
    // The backend's close reaches the pool's socket; nothing asks the pool for a connection.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(pool.idle(), 1, "not yet looked at");
    tokio::time::pause();
    tokio::time::advance(SWEEP_EVERY).await;
    tokio::time::resume();
    for _ in 0..100 {
        if pool.idle() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pool.idle(), 0, "the half-closed connection was closed");
}

#[tokio::test]
async fn a_connection_idle_past_the_timeout_is_closed_instead_of_reused() {
    let (_fleet, relay, pool) = through_relay().await;
    exchange(&pool, relay.addr).await;
    tokio::time::pause();
    tokio::time::advance(IDLE_TIMEOUT).await;
    tokio::time::resume();
    exchange(&pool, relay.addr).await;
    assert_eq!(relay.accepted(), 2);
    assert_eq!(pool.idle(), 1, "the stale connection was dropped, not kept");
}

/// A self-signed certificate for `localhost`, and its certificate and key as PEM files in
/// `dir`.
fn self_signed(dir: &std::path::Path) -> (rcgen::CertifiedKey<rcgen::KeyPair>, String, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
    let path = |p: std::path::PathBuf| p.display().to_string();
    (cert, path(cert_file), path(key_file))
}

/// A TLS listener presenting `cert` whose ALPN offers `protocol` alone; each connection goes
/// to `serve` once its handshake is done.
async fn tls_listener<F, Fut>(
    cert: &rcgen::CertifiedKey<rcgen::KeyPair>,
    protocol: &[u8],
    serve: F,
) -> SocketAddr
where
    F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let key = rustls_pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der());
    let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key.unwrap())
        .unwrap();
    config.alpn_protocols = vec![protocol.to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let client = acceptor.accept(client).await.unwrap();
            tokio::spawn(serve(client));
        }
    });
    addr
}

/// A pool for `https://localhost:{port}`, trusting `ca_file`.
fn tls_pool(port: u16, ca_file: &str) -> Arc<Pool> {
    pool_for(&format!(
        "https://localhost:{port}, dialect: openai, ca_file: {ca_file}"
    ))
}

/// A streamed chat request to `https://localhost:{port}`, sent through `pool`.
fn send_tls(
    pool: &Arc<Pool>,
    port: u16,
) -> impl Future<Output = Result<Response<PooledBody>, SendError>> + use<> {
    let mut req = chat(SocketAddr::from(([127, 0, 0, 1], port)));
    *req.uri_mut() = format!("https://localhost:{port}/v1/chat/completions")
        .parse()
        .unwrap();
    Arc::clone(pool).send(req)
}

/// Sends `n` requests at once to `https://localhost:{port}` and reads each response to its
/// end, checking it whole; the protocol each spoke.
async fn at_once(n: usize, pool: &Arc<Pool>, port: u16) -> Vec<Version> {
    let heads = futures_util::future::join_all((0..n).map(|_| send_tls(pool, port))).await;
    let mut versions = Vec::new();
    for head in heads {
        let head = head.unwrap();
        versions.push(head.version());
        let body = head.into_body().collect().await.unwrap().to_bytes();
        assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
    }
    versions
}

#[tokio::test]
async fn where_alpn_picks_http2_requests_share_one_connection_from_the_first_and_wait_for_one_new_one()
 {
    let dir = tempfile::tempdir().unwrap();
    let (_, cert_file, key_file) = self_signed(dir.path());
    let (_fleet, sim) = backend_with(&format!(
        ", tls: {{cert_file: {cert_file}, key_file: {key_file}}}"
    ))
    .await;
    let relay = Relay::to(sim).await;
    let (port, pool) = (relay.addr.port(), tls_pool(relay.addr.port(), &cert_file));
    // The first requests, sent before any connection has said which protocol the backend
    // speaks, wait for the first connection and share it.
    assert_eq!(at_once(3, &pool, port).await, [Version::HTTP_2; 3]);
    assert_eq!(relay.accepted(), 1);
    assert_eq!(pool.idle(), 0, "an HTTP/2 connection is shared, never lent");
    // The backend closes it; the next requests at once wait for one new connection.
    relay.cut_all();
    tokio::time::sleep(Duration::from_millis(50)).await;
    at_once(3, &pool, port).await;
    assert_eq!(relay.accepted(), 2);
}

#[tokio::test]
async fn where_alpn_picks_http1_over_tls_requests_at_once_get_connections_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, cert_file, _) = self_signed(dir.path());
    let (_fleet, sim) = backend().await;
    // TLS offering HTTP/1.1 alone, as uvicorn's (which serves vLLM and SGLang) does.
    let tls = tls_listener(&cert, b"http/1.1", move |mut client| async move {
        let mut server = TcpStream::connect(sim).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    })
    .await;
    let relay = Relay::to(tls).await;
    let (port, pool) = (relay.addr.port(), tls_pool(relay.addr.port(), &cert_file));
    // The first wait for the first connection to say HTTP/1.1, then connect side by side.
    assert_eq!(at_once(3, &pool, port).await, [Version::HTTP_11; 3]);
    assert_eq!(relay.accepted(), 3);
    assert_eq!(pool.idle(), 3);
    at_once(3, &pool, port).await;
    assert_eq!(relay.accepted(), 3, "each came back and was reused");
}

#[tokio::test]
async fn requests_waiting_for_a_connection_that_cannot_be_made_fail_with_it_after_one_attempt() {
    // A backend that accepts a connection, says nothing for a while, and closes it: the
    // TLS handshake fails, slowly, as a connect that times out would.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(conn);
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (_, cert_file, _) = self_signed(dir.path());
    let pool = tls_pool(port, &cert_file);
    let results = futures_util::future::join_all((0..3).map(|_| send_tls(&pool, port))).await;
    let errors: Vec<String> = results
        .into_iter()
        .map(|r| {
            let err = r.unwrap_err();
            assert!(err.is_connect(), "{err:?}");
            std::error::Error::source(&err).unwrap().to_string()
        })
        .collect();
    assert_eq!(attempts.load(Ordering::SeqCst), 1, "one attempt, shared");
    assert!(
        errors.iter().all(|e| e == &errors[0]),
        "each fails with the attempt's own error: {errors:?}"
    );
}

#[tokio::test]
async fn where_http2_streams_reach_the_backends_limit_a_new_connection_takes_the_next() {
    // An HTTP/2 backend that allows two streams at once per connection, and whose responses
    // never end (a long generation).
    let dir = tempfile::tempdir().unwrap();
    let (cert, cert_file, _) = self_signed(dir.path());
    let backend = tls_listener(&cert, b"h2", |client| async move {
        let endless = hyper::service::service_fn(|_| async {
            let body = http_body_util::StreamBody::new(futures_util::stream::pending::<
                Result<Frame<Bytes>, std::convert::Infallible>,
            >());
            Ok::<_, std::convert::Infallible>(Response::new(body))
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .max_concurrent_streams(2)
            .serve_connection(TokioIo::new(client), endless)
            .await;
    })
    .await;
    let relay = Relay::to(backend).await;
    let (port, pool) = (relay.addr.port(), tls_pool(relay.addr.port(), &cert_file));
    // One stream first, so that the backend's limit has arrived before the next ones go.
    let first = send_tls(&pool, port).await.unwrap();
    let _second = send_tls(&pool, port).await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(10), send_tls(&pool, port)).await;
    assert!(
        matches!(third, Ok(Ok(_))),
        "the third stream waited behind a full connection"
    );
    assert_eq!(
        relay.accepted(),
        2,
        "a second connection took the third stream"
    );
    // A stream that ends makes room on the first connection again.
    drop(first);
    let fourth = tokio::time::timeout(Duration::from_secs(10), send_tls(&pool, port)).await;
    assert!(matches!(fourth, Ok(Ok(_))));
    assert_eq!(
        relay.accepted(),
        2,
        "the fourth reused a connection with room"
    );
}
