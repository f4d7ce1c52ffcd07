//! Hostile clients and broken backends: what reaches the client is framed by the gateway, and
//! every input has bounded memory and time.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use crate::support;

/// A gateway with one backend `raw` at `addr` (model `m`, with `extra` YAML lines) and `top`
/// YAML lines of its own.
pub(crate) async fn gateway_to(
    addr: SocketAddr,
    extra: &str,
    top: &str,
) -> tpsgate::gateway::Gateway {
    support::gateway(&format!(
        "{top}backends:\n{}",
        support::backend_yaml(
            "raw",
            addr,
            "openai",
            &format!("    models: {{m: m}}\n{extra}")
        )
    ))
    .await
}

pub(crate) async fn chat(gw: &tpsgate::gateway::Gateway, stream: bool) -> support::Exchange {
    support::post(
        gw.addr(),
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [], "stream": stream}),
    )
    .await
}

pub(crate) fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}

#[tokio::test]
async fn a_stale_content_length_beside_chunks_does_not_truncate_what_the_client_gets() {
    // Regression: an upstream sending both Content-Length and chunked was decoded right, but its
    // Content-Length went to the client, which then read 10 bytes of 241 on a live connection.
    let body = format!("{{\"id\":\"x\",\"pad\":\"{}\"}}", "a".repeat(220)).into_bytes();
    let answer = {
        let body = body.clone();
        move |_: usize, _: &[u8]| {
            let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            out.extend_from_slice(&chunked(&body));
            out
        }
    };
    let gw = gateway_to(support::raw_backend(answer, true).await, "", "").await;
    let ex = chat(&gw, false).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.body(), body);
    assert_ne!(
        ex.headers.get("content-length").map(|v| v.as_bytes()),
        Some(&b"10"[..])
    );
}

#[tokio::test]
async fn a_stream_framed_by_content_length_that_stalls_still_ends_with_an_error_event() {
    let answer = |_: usize, _: &[u8]| {
        let event = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        let mut out =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 5000\r\n\r\n"
                .to_vec();
        out.extend_from_slice(event);
        out
    };
    let gw = gateway_to(
        support::raw_backend(answer, false).await,
        "    stall_timeout_ms: 300\n",
        "",
    )
    .await;
    let ex = chat(&gw, true).await;
    assert_eq!(ex.status, StatusCode::OK);
    let events = ex.data_events();
    assert!(
        events
            .last()
            .is_some_and(|e| e.contains("upstream_timeout")),
        "{events:?} {:?}",
        ex.error
    );
    assert!(ex.error.is_none(), "the body ended cleanly: {:?}", ex.error);
}

#[tokio::test]
async fn a_compressed_transfer_coding_is_refused_rather_than_passed_on_unannounced() {
    let answer = |_: usize, _: &[u8]| {
        let mut out =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
                .to_vec();
        out.extend_from_slice(&chunked(b"\x1f\x8b not really gzip"));
        out
    };
    let gw = gateway_to(support::raw_backend(answer, true).await, "", "").await;
    let ex = chat(&gw, false).await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY, "{:?}", ex.body());
    assert_eq!(ex.json()["error"]["code"], "upstream_unreachable");
}

#[tokio::test]
async fn the_client_facing_head_is_the_gateways_own_version_length_and_headers() {
    // HTTP/1.0, a repeated length, headers named in Connection, and a header only the gateway
    // may set.
    let answer = |_: usize, _: &[u8]| {
        b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5, 5\r\nconnection: x-internal\r\nx-internal: secret\r\nx-tpsgate-backend: forged\r\n\r\nhello".to_vec()
    };
    let gw = gateway_to(support::raw_backend(answer, true).await, "", "").await;
    let raw = support::raw_exchange(
        gw.addr(),
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 13\r\nconnection: close\r\n\r\n{\"model\":\"m\"}",
        Duration::from_secs(5),
    )
    .await;
    let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200 ok\r\n"), "{text}");
    assert_eq!(text.matches("content-length:").count(), 1, "{text}");
    assert!(text.contains("content-length: 5\r\n"), "{text}");
    assert!(!text.contains("x-internal"), "{text}");
    assert!(text.contains("x-tpsgate-backend: raw\r\n"), "{text}");
    assert!(!text.contains("forged"), "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
}

/// An SSE response of `events` (each `data: ...`), as a backend would send it.
fn sse(events: &[&str]) -> Vec<u8> {
    let mut body = String::new();
    for e in events {
        body.push_str("data: ");
        body.push_str(e);
        body.push_str("\n\n");
    }
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    out.extend_from_slice(&chunked(body.as_bytes()));
    out
}

#[tokio::test]
async fn an_empty_but_complete_stream_is_an_answer_not_a_failure_to_retry() {
    // Regression: a stream that finished (finish_reason stop) with no content was retried on
    // another backend, as if it had failed.
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = |asked: std::sync::Arc<std::sync::atomic::AtomicUsize>| {
        move |_: usize, _: &[u8]| {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            sse(&[
                r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ])
        }
    };
    let a = support::raw_backend(count(std::sync::Arc::clone(&asked)), true).await;
    let b = support::raw_backend(count(std::sync::Arc::clone(&asked)), true).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml("a", a, "openai", "    models: {m: m}\n"),
        support::backend_yaml("b", b, "openai", "    models: {m: m}\n")
    ))
    .await;
    let ex = chat(&gw, true).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.data_events().last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "asked once"
    );
}

#[tokio::test]
async fn an_implausible_usage_count_is_ignored_and_the_tokens_estimated() {
    // Regression: usage of 2^64 - 1 tokens made a TPOT of 2e-21 s in the curve.
    let answer = |_: usize, _: &[u8]| {
        let content = r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#;
        sse(&[
            content,
            content,
            content,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":18446744073709551615}}"#,
            "[DONE]",
        ])
    };
    let huge = support::raw_backend(answer, true).await;
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("huge", huge, "openai", "    models: {m: m}\n")
    ))
    .await;
    let ex = chat(&gw, true).await;
    assert_eq!(ex.status, StatusCode::OK);
    let metrics = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
    let metrics = String::from_utf8(metrics.body()).unwrap();
    let output = metrics
        .lines()
        .find(|l| {
            l.starts_with("gen_ai_client_token_usage_sum{")
                && l.contains(r#"backend="huge""#)
                && l.contains(r#"token_type="output""#)
        })
        .unwrap_or_else(|| panic!("no output token sum in {metrics}"));
    assert!(
        output.ends_with(" 3"),
        "counted from its 3 events: {output}"
    );
}

#[tokio::test]
async fn a_non_stream_completion_longer_than_the_first_token_timeout_is_not_cut() {
    // Regression: a non-stream request was cut at first_token_timeout_ms (and retried on the
    // other backend): it has no first token, only a response.
    let (_fleet, sim) = support::start_engine("sim", support::engine(40.0, 0.0, 8)).await;
    let gw = gateway_to(sim, "    first_token_timeout_ms: 200\n", "").await;
    let ex = support::post(
        gw.addr(),
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [], "max_tokens": 20}),
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK, "{:?}", ex.json());
}

#[tokio::test]
async fn a_non_stream_request_past_its_response_timeout_is_a_504_and_never_sent_again() {
    let slow = support::engine(40.0, 0.0, 8);
    let (fleet_a, a) = support::start_engine("a", slow.clone()).await;
    let (fleet_b, b) = support::start_engine("b", slow).await;
    let _fleets = support::FleetGuard(vec![fleet_a, fleet_b]);
    let extra = "    models: {m: m}\n    response_timeout_ms: 300\n";
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml("a", a, "openai", extra),
        support::backend_yaml("b", b, "openai", extra)
    ))
    .await;
    let ex = support::post(
        gw.addr(),
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [], "max_tokens": 30}),
    )
    .await;
    assert_eq!(ex.status, StatusCode::GATEWAY_TIMEOUT, "{:?}", ex.json());
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("response_timeout_ms"),
        "{:?}",
        ex.json()
    );
    let asked = support::seen(a).await.len() + support::seen(b).await.len();
    assert_eq!(asked, 1, "accepted once, never sent again");
}

#[tokio::test]
async fn a_pass_through_path_that_leaves_v1_or_an_unusual_method_never_reaches_the_backend() {
    // Regression: /v1/../metrics, /v1/%2e%2e/x and /v1/..;/x reached the backend as written,
    // with the backend's key.
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&asked);
    let backend = support::raw_backend(
        move |_: usize, _: &[u8]| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_vec()
        },
        true,
    )
    .await;
    let gw = gateway_to(backend, "", "default_backend: raw\n").await;
    for path in [
        "/v1/../metrics",
        "/v1/%2e%2e/x",
        "/v1/..;/x",
        "/v1/files%2f..%2fsecret",
    ] {
        let ex = support::exchange(gw.addr(), http::Method::GET, path, None).await;
        assert_eq!(ex.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(ex.json()["error"]["code"], "invalid_request", "{path}");
    }
    let ex = support::exchange(gw.addr(), http::Method::PUT, "/v1/files", Some(b"{}")).await;
    assert_eq!(ex.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 0);
    // A plain pass-through still goes.
    let ex = support::exchange(gw.addr(), http::Method::GET, "/v1/files", None).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn the_admin_plane_answers_a_page_that_rebinds_its_name_only_with_the_token() {
    // Without a token, a browser page whose own name resolves to 127.0.0.1 (DNS rebinding)
    // could read /metrics and /admin/*: such a request names the page's host.
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway_to(
        sim,
        "",
        "admin: {listen: 127.0.0.1:0, allowed_hosts: [gateway]}\n",
    )
    .await;
    let client = tpsgate::bench::http_client(None).unwrap();
    let get = async |path: &str, host: &str| {
        support::send(
            &client,
            gw.admin_addr(),
            http::Method::GET,
            path,
            None,
            &[("host", host)],
        )
        .await
    };
    let direct = format!("127.0.0.1:{}", gw.admin_addr().port());
    for path in ["/metrics", "/admin/curves", "/admin/backends"] {
        assert_eq!(get(path, "evil.example:9090").await.status, 401, "{path}");
        assert_eq!(get(path, &direct).await.status, 200, "{path}");
        assert_eq!(get(path, "localhost:9090").await.status, 200, "{path}");
        assert_eq!(get(path, "gateway:9090").await.status, 200, "{path}");
    }
    assert_eq!(get("/healthz", "evil.example").await.status, 200);
    let page = get("/", &direct).await;
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    assert_eq!(
        get("/admin/backends", &direct).await.headers["x-content-type-options"],
        "nosniff"
    );
}

#[tokio::test]
async fn the_admin_token_is_taken_whatever_the_case_of_its_scheme() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway_to(
        sim,
        "",
        "admin: {listen: 127.0.0.1:0, token_env: ADMIN_TOKEN}\n",
    )
    .await;
    let client = tpsgate::bench::http_client(None).unwrap();
    for auth in [
        "Bearer key-of-ADMIN_TOKEN",
        "bearer key-of-ADMIN_TOKEN",
        "BEARER  key-of-ADMIN_TOKEN",
    ] {
        let ex = support::send(
            &client,
            gw.admin_addr(),
            http::Method::GET,
            "/admin/backends",
            None,
            &[("authorization", auth), ("host", "anything.example")],
        )
        .await;
        assert_eq!(ex.status, 200, "{auth}");
    }
}

#[tokio::test]
async fn a_failed_upstream_is_named_but_its_internal_error_stays_in_the_log() {
    let (_held, closed) = support::refusing_port();
    let gw = gateway_to(closed, "", "").await;
    let ex = chat(&gw, false).await;
    assert_eq!(ex.status, StatusCode::BAD_GATEWAY);
    let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("backend raw"), "{message}");
    assert!(!message.contains("127.0.0.1"), "{message}");
    assert!(!message.to_lowercase().contains("refused"), "{message}");
}

#[tokio::test]
async fn a_head_over_the_limit_gets_a_431_on_http1_and_http2_alike() {
    // Regression: heads between max_header_bytes and twice it were accepted; HTTP/2 heads over
    // it dropped the connection with no answer.
    use http_body_util::BodyExt as _;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway_to(sim, "", "limits: {max_header_bytes: 4096}\n").await;
    let pad = "a".repeat(6000);
    for h2 in [false, true] {
        let client = Client::builder(TokioExecutor::new())
            .http2_only(h2)
            .build_http::<http_body_util::Full<bytes::Bytes>>();
        let request = |pad: &str| {
            http::Request::get(format!("http://{}/v1/models", gw.addr()))
                .header("x-pad", pad)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap()
        };
        let resp = client.request(request(&pad)).await.unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "h2: {h2}"
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "headers_too_large", "h2: {h2}");
        // The connection (on HTTP/2) or the client goes on.
        let resp = client.request(request("small")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "h2: {h2}");
    }
}

#[tokio::test]
async fn model_names_beyond_a_backends_limit_fold_into_one_other_series_and_curve() {
    // Regression: under `"*": "*"`, 25,000 made-up model names made 25,000 metric series and
    // curves (RSS 8 -> 163 MB, /metrics 270 MB).
    let answer = |_: usize, _: &[u8]| {
        let content = r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#;
        sse(&[
            content,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            "[DONE]",
        ])
    };
    let backend = support::raw_backend(answer, true).await;
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml(
            "flood",
            backend,
            "openai",
            "    models: {named: named, \"*\": \"*\"}\n    max_models: 3\n"
        )
    ))
    .await;
    for model in ["named", "a", "b", "c", "d", "e", "f", "named"] {
        let ex = support::post(
            gw.addr(),
            "/v1/chat/completions",
            &json!({"model": model, "messages": [], "stream": true}),
        )
        .await;
        assert_eq!(ex.status, StatusCode::OK, "requests still flow: {model}");
    }
    let curves = support::get_json(gw.admin_addr(), "/admin/curves").await;
    let mut models: Vec<&str> = curves["curves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["model"].as_str().unwrap())
        .collect();
    models.sort_unstable();
    assert_eq!(models, ["a", "b", "named", "other"], "{curves}");
    let other = curves["curves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "other")
        .unwrap();
    assert_eq!(other["observations"], 4, "c, d, e and f");
    let metrics = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
    let metrics = String::from_utf8(metrics.body()).unwrap();
    let series: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tpsgate_requests_total{") && l.contains(r#"backend="flood""#))
        .filter_map(|l| l.split(r#"model=""#).nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        series.into_iter().collect::<Vec<_>>(),
        ["a", "b", "named", "other"]
    );
}

#[tokio::test]
async fn what_a_stream_sends_before_its_first_content_is_kept_only_up_to_a_limit() {
    // Regression: while a retry was possible, everything before the first content event was
    // kept: 256 MB of SSE comments were held (307 MB peak).
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = |asked: std::sync::Arc<std::sync::atomic::AtomicUsize>| {
        move |_: usize, _: &[u8]| {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let comments = ": keep-alive\n\n".repeat(200_000); // 2.8 MB, then nothing
            let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            out.extend_from_slice(format!("{:x}\r\n", comments.len()).as_bytes());
            out.extend_from_slice(comments.as_bytes());
            out.extend_from_slice(b"\r\n");
            out
        }
    };
    let a = support::raw_backend(counting(std::sync::Arc::clone(&asked)), false).await;
    let b = support::raw_backend(counting(std::sync::Arc::clone(&asked)), false).await;
    let extra = "    models: {m: m}\n    first_token_timeout_ms: 1000\n";
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml("a", a, "openai", extra),
        support::backend_yaml("b", b, "openai", extra)
    ))
    .await;
    let ex = chat(&gw, true).await;
    assert_eq!(ex.status, StatusCode::OK);
    let body = ex.body();
    assert!(
        body.len() > 1 << 20,
        "the comments reached the client: {}",
        body.len()
    );
    assert!(
        String::from_utf8_lossy(&body).contains("upstream_timeout"),
        "and the stream ended with an error event"
    );
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "committed to the backend past the limit: no retry"
    );
}

#[tokio::test]
async fn an_endless_sse_line_from_a_backend_ends_the_stream_with_an_error_event() {
    // Regression: a 16 MB line without a newline cost 13 s of CPU (the kept event was copied and
    // rescanned per frame) and a 128 MB one took peak memory from 9 to 279 MB.
    let answer = |_: usize, _: &[u8]| {
        let line = format!("data: {}", "x".repeat(4 << 20));
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for piece in line.as_bytes().chunks(16 << 10) {
            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
        }
        out
    };
    let gw = gateway_to(support::raw_backend(answer, false).await, "", "").await;
    let started = tokio::time::Instant::now();
    let ex = chat(&gw, true).await;
    assert_eq!(ex.status, StatusCode::OK);
    let events = ex.data_events();
    let last = events.last().cloned().unwrap_or_default();
    assert!(last.contains("max_event_bytes"), "{last}");
    assert!(
        ex.body().len() < 2 << 20,
        "cut at the limit, not at the end: {}",
        ex.body().len()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
