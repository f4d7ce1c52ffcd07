//! Every mistake gets a precise answer in the client's dialect, and nothing goes upstream that
//! should not.

use std::time::Duration;

use http::{Method, StatusCode};
use tpsgate::bench::http_client;
use tpsgate::sim::config::{FaultKindRaw, FaultRaw, StreamRaw};

use crate::support;

async fn one_backend(
    extra: &str,
    config_tail: &str,
) -> (
    tpsgate::sim::Fleet,
    std::net::SocketAddr,
    tpsgate::gateway::Gateway,
) {
    let (fleet, sim) = support::start_engine("sim", support::engine(2.0, 0.0, 64)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{config_tail}",
        support::backend_yaml(
            "sim",
            sim,
            "openai",
            &format!("    models: {{small: m}}\n{extra}")
        ),
    ))
    .await;
    (fleet, sim, gw)
}

#[tokio::test]
async fn client_mistakes_get_openai_errors_and_never_reach_the_upstream() {
    let (_fleet, sim, gw) = one_backend("", "limits: {max_body_bytes: 200}\n").await;
    let json = ("content-type", "application/json");
    let big = format!(
        r#"{{"model":"small","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(300)
    );
    type Case<'a> = (
        Method,
        &'a str,
        Vec<(&'a str, &'a str)>,
        String,
        StatusCode,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            Method::POST,
            "/v1/chat/completions",
            vec![json],
            "{not json".into(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            vec![json],
            r#"{"messages":[]}"#.into(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            vec![json],
            r#"{"model":"large","messages":[]}"#.into(),
            StatusCode::NOT_FOUND,
            "model_not_found",
        ),
        (
            Method::GET,
            "/v1/chat/completions",
            vec![],
            String::new(),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            vec![json],
            big,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            Method::POST,
            "/v1/chat/completions",
            vec![("content-type", "text/plain")],
            r#"{"model":"small"}"#.into(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            Method::POST,
            "/elsewhere",
            vec![json],
            "{}".into(),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    let client = http_client(None).unwrap();
    for (method, path, headers, body, status, code) in cases {
        let ex = support::send(
            &client,
            gw.addr(),
            method.clone(),
            path,
            Some(body.as_bytes()),
            &headers,
        )
        .await;
        assert_eq!(ex.status, status, "{method} {path} {body:.40}");
        let err = ex.json();
        assert_eq!(err["error"]["code"], code, "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
        assert!(!err["error"]["message"].as_str().unwrap().is_empty());
        assert!(ex.headers.contains_key("x-request-id"));
    }
    let ex = support::send(
        &client,
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"large","messages":[]}"#),
        &[json],
    )
    .await;
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("available: small")
    );
    assert!(
        support::seen(sim).await.is_empty(),
        "nothing may reach the upstream"
    );
}

/// The gateway reads a body's structure and the fields it routes by; a value it does not read
/// (here inside `messages`) is the backend's to judge, and the backend's 400 reaches the client
/// as it was sent.
#[tokio::test]
async fn a_body_malformed_where_the_gateway_does_not_read_gets_the_backends_own_400() {
    let (_fleet, sim, gw) = one_backend("", "").await;
    let client = http_client(None).unwrap();
    let post = async |body: &[u8]| {
        let json = ("content-type", "application/json");
        let path = "/v1/chat/completions";
        support::send(&client, gw.addr(), Method::POST, path, Some(body), &[json]).await
    };
    let bad = post(br#"{"messages":[{"role":"user","content":"hi","name":tru}],"model":"small"}"#);
    let ex = bad.await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.starts_with("invalid JSON"), "{message}");
    assert_eq!(support::seen(sim).await.len(), 1, "the backend judged it");
    let good = br#"{"messages":[{"role":"user","content":"hi"}],"model":"small","max_tokens":2}"#;
    assert_eq!(post(good).await.status, StatusCode::OK);
}

#[tokio::test]
async fn errors_on_v1_messages_take_anthropics_shape() {
    let (_fleet, _sim, gw) = one_backend("", "").await;
    let ex = support::send(
        &http_client(None).unwrap(),
        gw.addr(),
        Method::POST,
        "/v1/messages",
        Some(b"{}"),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let err = ex.json();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert_eq!(err["error"]["message"], "missing required field `model`");
}

#[tokio::test]
async fn upstream_errors_pass_through_unchanged() {
    let fault = FaultRaw {
        kind: FaultKindRaw::Http429,
        probability: None,
        every: Some(1),
        retry_after_s: Some(3),
        delay_ms: None,
        after_tokens: None,
    };
    let (_fleet, sim) = support::start(support::spec(
        "sim",
        support::engine(2.0, 0.0, 8),
        StreamRaw::default(),
        vec![fault],
    ))
    .await;
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let body = br#"{"model":"m","messages":[]}"#;
    let direct = support::exchange(sim, Method::POST, "/v1/chat/completions", Some(body)).await;
    let via = support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(body)).await;
    assert_eq!(via.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(via.headers["retry-after"], "3");
    assert_eq!(via.body(), direct.body());
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502() {
    let (_held, closed) = support::refusing_port();
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("gone", closed, "openai", "    models: {m: m}\n")
    ))
    .await;
    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"m","messages":[]}"#),
    )
    .await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    assert_eq!(ex.json()["error"]["code"], "upstream_unreachable");
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("backend gone")
    );
}

#[tokio::test]
async fn a_full_backend_is_a_503_with_retry_after_until_its_stream_ends() {
    let (_fleet, _sim, gw) = one_backend("    max_concurrency: 1\n", "").await;
    let held = support::open_stream(gw.addr(), "small", 100_000).await;

    let short = br#"{"model":"small","messages":[],"max_tokens":2}"#;
    let ex = support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(short)).await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ex.headers["retry-after"], "1");
    assert_eq!(ex.json()["error"]["code"], "no_backend_available");

    drop(held); // the client goes away: the slot must come back at once
    let mut status = StatusCode::SERVICE_UNAVAILABLE;
    for _ in 0..50 {
        status = support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(short))
            .await
            .status;
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_connect_timeout_is_a_504() {
    // A listener that never accepts, with its accept queue full: further SYNs are dropped and a
    // connect hangs until the gateway's connect timeout.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(100),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            fillers.push(s);
        }
    }
    let ex = chat_through(&support::backend_yaml(
        "stuck",
        addr,
        "openai",
        "    models: {m: m}\n    connect_timeout_ms: 200\n",
    ))
    .await;
    assert_eq!(ex.status, StatusCode::GATEWAY_TIMEOUT, "{:?}", ex.json());
    assert_eq!(ex.json()["error"]["code"], "upstream_timeout");
    drop(listener);
}

/// A chat request for model `m` through a gateway whose `backends:` list is `backends`.
async fn chat_through(backends: &str) -> support::Exchange {
    let gw = support::gateway(&format!("backends:\n{backends}")).await;
    support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"m","messages":[]}"#),
    )
    .await
}

#[tokio::test]
async fn a_tls_handshake_that_never_finishes_is_a_504_after_the_connect_timeout() {
    // An HTTPS backend that accepts the connection and never answers the client hello: the
    // connect timeout covers the handshake too, not only the TCP connect.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let ex = chat_through(&format!(
        "  - {{name: silent, url: https://{addr}, dialect: openai, models: {{m: m}}, \
         connect_timeout_ms: 200, first_token_timeout_ms: 60000}}\n"
    ))
    .await;
    assert_eq!(ex.status, StatusCode::GATEWAY_TIMEOUT, "{:?}", ex.json());
    assert_eq!(ex.json()["error"]["code"], "upstream_timeout");
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connect timed out"),
        "{:?}",
        ex.json()
    );
    held.abort();
}

#[tokio::test]
async fn other_v1_paths_pass_through_by_model_or_to_the_default_backend() {
    let (_fleet, sim, gw) = one_backend("", "default_backend: sim\n").await;
    // The sim has no embeddings endpoint: its own 404 comes back, from the backend serving `small`.
    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/embeddings",
        Some(br#"{"model":"small","input":"x"}"#),
    )
    .await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    assert_eq!(ex.headers["x-tpsgate-backend"], "sim");
    assert_eq!(ex.json()["error"]["message"], "no such endpoint");
    // No model in the body: the default backend answers (the sim lists its models on GET).
    let ex = support::exchange(gw.addr(), Method::GET, "/v1/models/extra", None).await;
    assert_eq!(ex.headers["x-tpsgate-backend"], "sim");
    let _ = sim;

    let (_fleet, _sim, gw) = one_backend("", "").await;
    let ex = support::exchange(gw.addr(), Method::GET, "/v1/files", None).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no default_backend")
    );
}

#[tokio::test]
async fn an_admin_token_guards_metrics_and_admin_data_but_not_health() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "admin: {{listen: 127.0.0.1:0, token_env: ADMIN_TOKEN}}\nbackends:\n{}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let client = tpsgate::bench::http_client(None).unwrap();
    let get = async |path: &str, auth: Option<&str>| {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        support::send(&client, gw.admin_addr(), Method::GET, path, None, &headers)
            .await
            .status
    };
    for path in ["/metrics", "/admin/curves", "/admin/backends"] {
        assert_eq!(get(path, None).await, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(
            get(path, Some("Bearer nope")).await,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        assert_eq!(
            get(path, Some("Bearer key-of-ADMIN_TOKEN")).await,
            StatusCode::OK,
            "{path}"
        );
    }
    for path in ["/healthz", "/readyz", "/"] {
        assert_eq!(get(path, None).await, StatusCode::OK, "{path}");
    }
}
