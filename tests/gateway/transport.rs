//! Transport: h2c on the client side, TLS on both sides.

use bytes::Bytes;
use http::{Method, Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support;

const CHAT: &[u8] = br#"{"model":"m","messages":[],"max_tokens":3,"stream":true}"#;

fn chat_request(url: String) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(CHAT)))
        .unwrap()
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let resp = client
        .request(chat_request(format!(
            "http://{}/v1/chat/completions",
            gw.addr()
        )))
        .await
        .unwrap();
    assert_eq!(resp.version(), Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
}

#[tokio::test]
async fn tls_works_on_both_sides_and_alpn_picks_h2_or_http1() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, cert, cert_file) =
        support::tls_sim("secure", "127.0.0.1:0", "localhost", dir.path()).await;
    let key_file = dir.path().join("key.pem");
    let sim_port = fleet.addr("secure").unwrap().port();
    let (cert_path, key_path) = (cert_file.display(), key_file.display());
    let config = format!(
        "listen: {{address: 127.0.0.1:0, tls: {{cert_file: {cert_path}, key_file: {key_path}}}}}\nadmin: {{listen: 127.0.0.1:0}}\n\
         backends:\n  - name: secure\n    url: https://localhost:{sim_port}\n    dialect: openai\n    models: {{m: m}}\n    ca_file: {cert_path}\n"
    );
    let config = tpsgate::config::parse(&config, |_| None).unwrap();
    let gw = tpsgate::gateway::Gateway::start(&config).await.unwrap();
    assert!(gw.url().starts_with("https://"));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(tpsgate::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_only()
        .enable_http1()
        .enable_http2()
        .build();
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let url = format!("https://localhost:{}/v1/chat/completions", gw.addr().port());
    let resp = client.request(chat_request(url.clone())).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), Version::HTTP_2, "ALPN picks h2");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");

    // A client that offers only http/1.1 gets it.
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let resp = client.request(chat_request(url)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), Version::HTTP_11, "ALPN picks http/1.1");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "{body:?}");
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_until_one_closes_and_oversized_heads_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "limits: {{max_connections: 2, max_header_bytes: 4096}}\nbackends:\n{}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let ask = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    let answered = async |conn: &mut tokio::net::TcpStream| {
        conn.write_all(ask).await.unwrap();
        let mut buf = [0u8; 512];
        let n = conn.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mut first = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    assert!(answered(&mut first).await.starts_with("HTTP/1.1 200"));
    assert!(answered(&mut second).await.starts_with("HTTP/1.1 200"));
    let mut third = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    third.write_all(ask).await.unwrap();
    let mut buf = [0u8; 512];
    let waited =
        tokio::time::timeout(std::time::Duration::from_millis(300), third.read(&mut buf)).await;
    assert!(
        waited.is_err(),
        "the third connection is not served while two are open"
    );
    drop(first);
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("served once a slot frees")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop((second, third));

    let mut big = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    let padding = "a".repeat(16 << 10);
    big.write_all(
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: {padding}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut reply = Vec::new();
    let _ = big.read_to_end(&mut reply).await;
    assert!(
        String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_an_https_server_with_its_roots_and_a_key_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, _cert, cert_file) =
        support::tls_sim("hosted", "127.0.0.1:0", "localhost", dir.path()).await;
    let addr = fleet.addr("hosted").unwrap();
    let url = format!("https://localhost:{}", addr.port());
    let run = move |extra: Vec<String>| {
        let mut command = support::tpsgate();
        command
            .args(["bench", "--url", &url, "--model", "m", "--max-tokens", "8"])
            .args(["--concurrency", "1", "--requests", "2", "--json"])
            .args(extra)
            .env("HOSTED_KEY", "sk-from-env");
        command.output().unwrap()
    };
    let ca = cert_file.display().to_string();
    let with_roots = vec![
        "--ca-file".to_owned(),
        ca,
        "--api-key-env".to_owned(),
        "HOSTED_KEY".to_owned(),
    ];
    let out = tokio::task::spawn_blocking({
        let run = run.clone();
        move || run(with_roots)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"], 0, "{report}");
    assert!(
        report["per_user_tps_p50"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let client = tpsgate::bench::http_client(Some(&cert_file)).unwrap();
    let requests = format!("https://localhost:{}/sim/requests", addr.port());
    let resp = client
        .request(
            Request::get(requests)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let seen = seen["requests"].as_array().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|r| r["authorization"] == "Bearer sk-from-env"),
        "{seen:?}"
    );
    // Without the server's root, every request fails on the certificate: nothing is measured.
    let out = tokio::task::spawn_blocking(move || run(Vec::new()))
        .await
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"], report["requests"], "{report}");
}
