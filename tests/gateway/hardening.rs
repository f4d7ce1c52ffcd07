//! Hostile clients and broken backends: what reaches the client is framed by the gateway, and
//! every input has bounded memory and time.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use crate::support;

/// A gateway with one backend `raw` at `addr` (model `m`, with `extra` YAML lines) and `top`
/// YAML lines of its own.
async fn gateway_to(addr: SocketAddr, extra: &str, top: &str) -> tpsgate::gateway::Gateway {
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

async fn chat(gw: &tpsgate::gateway::Gateway, stream: bool) -> support::Exchange {
    support::post(
        gw.addr(),
        "/v1/chat/completions",
        &json!({"model": "m", "messages": [], "stream": stream}),
    )
    .await
}

fn chunked(body: &[u8]) -> Vec<u8> {
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
