//! Backends discovered in DNS: each address of a name is a backend of its own, joins cold when it
//! appears, drains when it vanishes, and keeps the name for TLS and `Host`; a resolver that fails
//! leaves the fleet as it was.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use http::Method;
use serde_json::json;
use tokio::net::UdpSocket;
use tpsgate::sim::Fleet;
use tpsgate::sim::config::{BackendRaw, EngineRaw, StreamRaw};

use crate::support;

/// A nameserver on loopback: every A query gets the addresses it holds at that moment (none:
/// an answer with no records), or no answer at all while it is silent.
struct StubDns {
    addr: SocketAddr,
    answer: Arc<Mutex<Vec<Ipv4Addr>>>,
    silent: Arc<AtomicBool>,
}

impl StubDns {
    async fn start(answer: &[Ipv4Addr]) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let held = Arc::new(Mutex::new(answer.to_vec()));
        let silent = Arc::new(AtomicBool::new(false));
        let (answer, quiet) = (Arc::clone(&held), Arc::clone(&silent));
        tokio::spawn(async move {
            let mut buf = vec![0_u8; 4096];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                if quiet.load(Ordering::Relaxed) {
                    continue;
                }
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
                reply.metadata.recursion_desired = query.metadata.recursion_desired;
                reply.metadata.recursion_available = true;
                reply.metadata.authoritative = true;
                reply.metadata.response_code = ResponseCode::NoError;
                reply.add_queries(query.queries.clone());
                for q in &query.queries {
                    if q.query_type() == RecordType::A {
                        let now = answer.lock().unwrap().clone();
                        for ip in now {
                            reply.add_answer(Record::from_rdata(
                                q.name().clone(),
                                0,
                                RData::A(A(ip)),
                            ));
                        }
                    }
                }
                let _ = socket.send_to(&reply.to_vec().unwrap(), from).await;
            }
        });
        Self {
            addr,
            answer: held,
            silent,
        }
    }

    fn answer(&self, addresses: &[Ipv4Addr]) {
        *self.answer.lock().unwrap() = addresses.to_vec();
    }
}

/// A simulator listening on `ip:port` (port 0: any), streaming one token per 20 ms.
async fn sim_at(name: &str, ip: Ipv4Addr, port: u16) -> (Fleet, u16) {
    let spec = BackendRaw {
        name: name.into(),
        listen: format!("{ip}:{port}"),
        models: vec!["m".into()],
        tls: None,
        device: None,
        engine: EngineRaw {
            step_base_ms: 20.0,
            max_batch: Some(64),
            ..EngineRaw::default()
        },
        stream: StreamRaw::default(),
        faults: vec![],
        prefix_cache: None,
        max_model_len: None,
    }
    .validate("test")
    .unwrap();
    let fleet = Fleet::start(&[spec]).await.unwrap();
    let port = fleet.addr(name).unwrap().port();
    (fleet, port)
}

const POD_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const POD_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// Waits (up to 5 s) until the admin plane lists exactly `want`.
async fn until_backends(admin: SocketAddr, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = support::backend_names(admin).await;
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "backends {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn chat(max_tokens: u32) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "m",
        "stream": true,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}],
    }))
    .unwrap()
}

async fn chat_once(gw: SocketAddr, max_tokens: u32) -> (String, support::Exchange) {
    let ex = support::exchange(
        gw,
        Method::POST,
        "/v1/chat/completions",
        Some(&chat(max_tokens)),
    )
    .await;
    assert_eq!(ex.status, 200, "{}", String::from_utf8_lossy(&ex.body()));
    let backend = ex.headers["x-tpsgate-backend"].to_str().unwrap().to_owned();
    (backend, ex)
}

fn config(dns: SocketAddr, port: u16) -> String {
    format!(
        "resolver: {{nameservers: [\"{dns}\"], timeout_ms: 300}}\ndefault_backend: pods\n\
         backends:\n  - name: pods\n    url: http://pods.tpsgate.test:{port}\n    dialect: openai\n    models: {{m: m}}\n    discovery: dns\n    refresh_s: 0.2\n"
    )
}

#[tokio::test]
async fn each_address_of_a_name_is_a_backend_that_joins_cold_and_drains_when_it_vanishes() {
    let dns = StubDns::start(&[POD_A]).await;
    let (sim_a, port) = sim_at("a", POD_A, 0).await;
    let (sim_b, _) = sim_at("b", POD_B, port).await;
    let gw = support::gateway(&config(dns.addr, port)).await;
    let (proxy, admin) = (gw.addr(), gw.admin_addr());

    // One address: one backend, named after it, reached under the name.
    assert_eq!(support::backend_names(admin).await, ["pods/127.0.0.2"]);
    let (backend, _) = chat_once(proxy, 4).await;
    assert_eq!(backend, "pods/127.0.0.2");
    let seen = support::seen(sim_a.addr("a").unwrap()).await;
    assert_eq!(seen[0]["host"], format!("pods.tpsgate.test:{port}"));
    let row = &support::get_json(admin, "/admin/backends").await["backends"][0];
    assert_eq!(row["address"], "127.0.0.2");

    // A second pod appears: it joins as a backend of its own, cold (no curve yet), and serves.
    dns.answer(&[POD_A, POD_B]);
    until_backends(admin, &["pods/127.0.0.2", "pods/127.0.0.3"]).await;
    let curves = support::get_json(admin, "/admin/curves").await;
    let has_curve = |name: &str| {
        curves["curves"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["backend"] == name)
    };
    assert!(
        has_curve("pods/127.0.0.2") && !has_curve("pods/127.0.0.3"),
        "{curves}"
    );
    let mut served_b = 0;
    for _ in 0..3 {
        let burst: Vec<_> = (0..4).map(|_| tokio::spawn(chat_once(proxy, 4))).collect();
        for task in burst {
            served_b += usize::from(task.await.unwrap().0 == "pods/127.0.0.3");
        }
    }
    assert!(served_b > 0, "the new pod got no request");
    assert!(!support::seen(sim_b.addr("b").unwrap()).await.is_empty());

    // The first pod vanishes with streams open on it: they finish; nothing new goes there.
    // (The streams are put on it by answering with it alone first.)
    dns.answer(&[POD_A]);
    until_backends(admin, &["pods/127.0.0.2"]).await;
    let started = tokio::time::Instant::now();
    let seen_a = || async { support::seen(sim_a.addr("a").unwrap()).await.len() };
    let before_long = seen_a().await;
    let long: Vec<_> = (0..4)
        .map(|_| tokio::spawn(chat_once(proxy, 100)))
        .collect();
    // All four reached the pod (on a loaded machine a spawned request may take a while to go).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen_a().await < before_long + 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_before = seen_a().await;
    dns.answer(&[POD_B]);
    until_backends(admin, &["pods/127.0.0.3"]).await;
    let gone = started.elapsed();
    for task in long {
        let (backend, ex) = task.await.unwrap();
        assert_eq!(backend, "pods/127.0.0.2");
        let last = ex.frames.last().map(|(at, _)| *at).unwrap_or_default();
        assert!(
            last > gone,
            "the stream ended ({last:?}) before its pod left ({gone:?})"
        );
        assert_eq!(ex.data_events().last().map(String::as_str), Some("[DONE]"));
        assert!(ex.error.is_none(), "{:?}", ex.error);
    }
    for _ in 0..4 {
        assert_eq!(chat_once(proxy, 2).await.0, "pods/127.0.0.3");
    }
    assert_eq!(
        support::seen(sim_a.addr("a").unwrap()).await.len(),
        a_before
    );
}

#[tokio::test]
async fn a_resolver_that_stops_answering_leaves_the_backends_as_they_were() {
    let dns = StubDns::start(&[POD_A, POD_B]).await;
    let (_sim_a, port) = sim_at("a", POD_A, 0).await;
    let (_sim_b, _) = sim_at("b", POD_B, port).await;
    let gw = support::gateway(&config(dns.addr, port)).await;
    let admin = gw.admin_addr();
    assert_eq!(
        support::backend_names(admin).await,
        ["pods/127.0.0.2", "pods/127.0.0.3"]
    );

    dns.silent.store(true, Ordering::Relaxed);
    dns.answer(&[]);
    // Several refreshes time out (0.2 s apart, 0.3 s each): nothing changes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        support::backend_names(admin).await,
        ["pods/127.0.0.2", "pods/127.0.0.3"]
    );
    assert_eq!(chat_once(gw.addr(), 2).await.1.status, 200);

    // A name with no address left is an answer: its backends drain away, and its model is
    // there without a backend: a 503 to retry, not a 404.
    dns.silent.store(false, Ordering::Relaxed);
    until_backends(admin, &[]).await;
    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(&chat(2)),
    )
    .await;
    assert_eq!(ex.status, 503, "{}", String::from_utf8_lossy(&ex.body()));
    let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("`pods`") && message.contains("no address"),
        "{message}"
    );
    assert!(ex.headers.contains_key("retry-after"));
    // So does a body naming no model, bound for the entry as default_backend.
    let upload = support::send(
        &tpsgate::bench::http_client(None).unwrap(),
        gw.addr(),
        Method::POST,
        "/v1/files",
        Some(b"--b\r\n\r\nx\r\n--b--\r\n"),
        &[("content-type", "multipart/form-data; boundary=b")],
    )
    .await;
    assert_eq!(
        upload.status,
        503,
        "{}",
        String::from_utf8_lossy(&upload.body())
    );
}

#[tokio::test]
async fn tls_to_a_discovered_address_verifies_the_configured_name() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, _cert, cert_file) =
        support::tls_sim("a", &format!("{POD_A}:0"), "pods.tpsgate.test", dir.path()).await;
    let port = sim.addr("a").unwrap().port();
    let dns = StubDns::start(&[POD_A]).await;
    let gw = support::gateway(&format!(
        "resolver: {{nameservers: [\"{}\"]}}\n\
         backends:\n  - name: pods\n    url: https://pods.tpsgate.test:{port}\n    dialect: openai\n    models: {{m: m}}\n    discovery: dns\n    ca_file: {}\n",
        dns.addr,
        cert_file.display()
    ))
    .await;
    // The certificate names only pods.tpsgate.test, no address: the handshake succeeds only
    // if the name, not the address dialled, is what TLS checks.
    let (backend, ex) = chat_once(gw.addr(), 3).await;
    assert_eq!(backend, "pods/127.0.0.2");
    assert_eq!(ex.data_events().last().map(String::as_str), Some("[DONE]"));
}

/// A pod that left is not left standing on the metrics page: its gauges (in flight, health)
/// go once they have not been set for `GAUGE_IDLE`, while those that stand (the build, live
/// backends) are set again at every scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauges_of_a_pod_that_left_leave_the_metrics_page() {
    let dns = StubDns::start(&[POD_A, POD_B]).await;
    let (_sim_a, port) = sim_at("a", POD_A, 0).await;
    let (_sim_b, _) = sim_at("b", POD_B, port).await;
    let gw = support::gateway(&config(dns.addr, port)).await;
    let admin = gw.admin_addr();
    let page = || async {
        String::from_utf8(
            support::exchange(admin, Method::GET, "/metrics", None)
                .await
                .body(),
        )
        .unwrap()
    };
    let gone = "tpsgate_in_flight{backend=\"pods/127.0.0.2\"}";
    assert!(page().await.contains(gone));
    dns.answer(&[POD_B]);
    until_backends(admin, &["pods/127.0.0.3"]).await;
    let deadline =
        tokio::time::Instant::now() + tpsgate::telemetry::GAUGE_IDLE + Duration::from_secs(15);
    loop {
        let text = page().await;
        if !text.contains(gone) {
            assert!(text.contains("tpsgate_in_flight{backend=\"pods/127.0.0.3\"}"));
            assert!(text.contains("tpsgate_build_info{"), "standing gauges stay");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still listed:\n{text}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
