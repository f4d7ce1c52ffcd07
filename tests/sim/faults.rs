//! Injected faults reach the client exactly as documented.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;
use tpsgate::sim::config::{FaultKindRaw, FaultRaw, StreamRaw};

use crate::support;

fn every(n: u64, kind: FaultKindRaw) -> FaultRaw {
    FaultRaw {
        kind,
        probability: None,
        every: Some(n),
        retry_after_s: None,
        delay_ms: None,
        after_tokens: None,
    }
}

async fn faulty(faults: Vec<FaultRaw>) -> (tpsgate::sim::Fleet, std::net::SocketAddr) {
    support::start(support::spec(
        "faulty",
        support::engine(2.0, 0.0, 64),
        StreamRaw::default(),
        faults,
    ))
    .await
}

fn chat(max_tokens: u32) -> serde_json::Value {
    json!({"model": "m", "messages": [], "max_tokens": max_tokens, "stream": true})
}

#[tokio::test]
async fn status_faults_answer_like_a_failing_server() {
    for (kind, status, code) in [
        (
            FaultKindRaw::Http500,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
        ),
        (
            FaultKindRaw::Http503,
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
        ),
        (
            FaultKindRaw::Http429,
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
        ),
    ] {
        let mut fault = every(1, kind);
        if kind == FaultKindRaw::Http429 {
            fault.retry_after_s = Some(7);
        }
        let (_fleet, addr) = faulty(vec![fault]).await;
        let ex = support::post(addr, "/v1/chat/completions", &chat(4)).await;
        assert_eq!(ex.status, status);
        assert_eq!(ex.json()["error"]["code"], code);
        let retry_after = ex
            .headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            retry_after.as_deref(),
            (kind == FaultKindRaw::Http429).then_some("7")
        );
    }
}

#[tokio::test]
async fn every_nth_fault_strikes_only_every_nth_request() {
    let (_fleet, addr) = faulty(vec![every(2, FaultKindRaw::Http500)]).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            support::post(addr, "/v1/chat/completions", &chat(2))
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 500, 200, 500]);
}

#[tokio::test]
async fn slow_first_byte_holds_the_response_head() {
    let fault = FaultRaw {
        delay_ms: Some(300),
        ..every(1, FaultKindRaw::SlowFirstByte)
    };
    let (_fleet, addr) = faulty(vec![fault]).await;
    let ex = support::post(addr, "/v1/chat/completions", &chat(2)).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert!(
        ex.head_after >= Duration::from_millis(300),
        "{:?}",
        ex.head_after
    );
    assert_eq!(ex.data_events().last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn stall_goes_silent_mid_stream_then_finishes() {
    let fault = FaultRaw {
        delay_ms: Some(300),
        after_tokens: Some(3),
        ..every(1, FaultKindRaw::Stall)
    };
    let (_fleet, addr) = faulty(vec![fault]).await;
    let ex = support::post(addr, "/v1/chat/completions", &chat(6)).await;
    // Frames: role, three tokens, then silence, then the rest.
    let silence = ex.frames.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap();
    assert!(
        silence >= Duration::from_millis(295),
        "longest gap {silence:?}"
    );
    let before: String = ex.frames[..4]
        .iter()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .collect();
    assert_eq!(before.matches("\"content\"").count(), 3);
    assert!(ex.frames[4].0 - ex.frames[3].0 >= Duration::from_millis(295));
    assert_eq!(ex.data_events().last().unwrap(), "[DONE]");
    assert!(ex.error.is_none());
}

#[tokio::test]
async fn reset_cuts_the_connection_after_the_given_tokens() {
    let fault = FaultRaw {
        after_tokens: Some(3),
        ..every(1, FaultKindRaw::Reset)
    };
    let (_fleet, addr) = faulty(vec![fault]).await;
    let ex = support::post(addr, "/v1/chat/completions", &chat(10)).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert!(ex.error.is_some(), "the body must break, not end cleanly");
    let content = ex
        .data_events()
        .iter()
        .filter(|d| d.contains("\"content\""))
        .count();
    assert_eq!(content, 3);
    assert!(!ex.data_events().contains(&"[DONE]".to_owned()));
}
