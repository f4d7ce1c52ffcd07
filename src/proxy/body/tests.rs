//! The metered body over a body fed by hand: what reaches the client, what the request's end
//! learns, and the read-ahead before a retry is ruled out.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;

use super::*;
use crate::config::Timeouts;
use crate::fleet::InFlightGuard;
use crate::proxy::deadline::Deadlines;
use crate::proxy::end;
use crate::proxy::testing::{Fed, Feed, ROLE, USAGE, backend, content, fed};

fn request() -> end::RequestFacts {
    end::RequestFacts {
        id: http::HeaderValue::from_static("req-1"),
        model: Some("m".to_owned()),
        class: None,
        prompt_estimate: 10,
        start: Instant::now(),
        span: None,
        charge: None,
        reason: crate::router::Reason::Feasible,
    }
}

/// A metered body over a fed one, first token within 2 s, stalls of 1 s; `stream`: an OpenAI
/// stream (`true`: the gateway asked for the usage chunk).
fn metered(stream: Option<bool>) -> (Feed, Metered<Fed>) {
    let (feed, body) = fed();
    let timeouts = Timeouts {
        first_token: Duration::from_secs(2),
        stall: Duration::from_secs(1),
        total: None,
        response: Duration::from_secs(3),
    };
    let sent = Instant::now();
    let timed = Timed::new(
        body,
        Deadlines::new(timeouts, sent, stream.is_some()),
        None,
        Arc::from("b"),
    );
    let end = RequestEnd::new(request(), http::StatusCode::OK, sent, Arc::from("b"));
    let stream = stream.map(|strip| (StreamDialect::OpenAi, strip));
    (feed, Metered::new(timed, end, stream, 1 << 20))
}

async fn all(body: &mut Metered<Fed>) -> (Vec<u8>, Option<BodyError>) {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => out.extend_from_slice(&f.into_data().unwrap()),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

#[tokio::test(start_paused = true)]
async fn frames_are_forwarded_unchanged_without_a_copy() {
    let (feed, mut body) = metered(Some(false));
    let frame = content("Hi");
    feed.send(Ok(frame.clone())).unwrap();
    let out = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(out, frame);
    assert_eq!(out.as_ptr(), frame.as_ptr());
}

#[tokio::test(start_paused = true)]
async fn a_stalled_stream_ends_with_an_error_event_not_silence() {
    let (feed, mut body) = metered(Some(false));
    feed.send(Ok(Bytes::from_static(ROLE))).unwrap();
    feed.send(Ok(content("Hi"))).unwrap();
    let (out, err) = all(&mut body).await;
    assert!(err.is_none(), "a stream is ended by an event, not an error");
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.ends_with("\ndata: {\"error\":{\"code\":\"upstream_timeout\",\"message\":\"the upstream stalled: no data for 1000 ms\",\"type\":\"server_error\"}}\n\n"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cut_stream_sends_the_unfinished_event_it_held_before_the_error_event() {
    // Stripping the usage chunk holds an event split across frames until its end arrives.
    let (feed, mut body) = metered(Some(true));
    feed.send(Ok(content("Hi"))).unwrap();
    feed.send(Ok(Bytes::from_static(b"data: {\"choi"))).unwrap();
    feed.send(Err("reset".into())).unwrap();
    let (out, _) = all(&mut body).await;
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("data: {\"choi\ndata: {\"error\""), "{text}");
    assert!(
        text.contains("the upstream broke off the stream: reset"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_that_is_not_a_stream_fails_rather_than_get_an_event() {
    let (feed, mut body) = metered(None);
    feed.send(Ok(Bytes::from_static(b"{\"id\":"))).unwrap();
    let (out, err) = all(&mut body).await;
    assert_eq!(out, b"{\"id\":");
    assert_eq!(
        err.map(|e| e.to_string()).as_deref(),
        Some("the upstream stalled: no data for 1000 ms")
    );
}

#[tokio::test(start_paused = true)]
async fn the_usage_chunk_the_gateway_asked_for_is_removed_and_the_length_is_then_unknown() {
    let (feed, mut body) = metered(Some(true));
    assert_eq!(body.size_hint().exact(), None);
    for frame in [
        Bytes::from_static(ROLE),
        content("a"),
        Bytes::from_static(USAGE),
    ] {
        feed.send(Ok(frame)).unwrap();
    }
    feed.send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
        .unwrap();
    drop(feed);
    let (out, err) = all(&mut body).await;
    assert!(err.is_none());
    let mut want = ROLE.to_vec();
    want.extend_from_slice(&content("a"));
    want.extend_from_slice(b"data: [DONE]\n\n");
    assert_eq!(out, want);
}

#[tokio::test(start_paused = true)]
async fn reading_ahead_keeps_everything_before_the_first_content_and_sends_it_in_order() {
    let (feed, mut body) = metered(Some(false));
    feed.send(Ok(Bytes::from_static(b": keep-alive\n\n")))
        .unwrap();
    feed.send(Ok(Bytes::from_static(ROLE))).unwrap();
    feed.send(Ok(content("Hi"))).unwrap();
    assert!(body.read_ahead_to_content().await, "content came");
    feed.send(Ok(content(" there"))).unwrap();
    drop(feed);
    let (out, _) = all(&mut body).await;
    let mut want = b": keep-alive\n\n".to_vec();
    want.extend_from_slice(ROLE);
    want.extend_from_slice(&content("Hi"));
    want.extend_from_slice(&content(" there"));
    assert_eq!(out, want);
}

#[tokio::test(start_paused = true)]
async fn reading_ahead_reports_a_stream_that_fails_before_any_content() {
    let (feed, mut body) = metered(Some(false));
    feed.send(Ok(Bytes::from_static(ROLE))).unwrap();
    // Nothing more: the first-token deadline passes while reading ahead.
    assert!(!body.read_ahead_to_content().await);
    drop(feed);
    let (feed, mut ended) = metered(Some(false));
    feed.send(Ok(Bytes::from_static(ROLE))).unwrap();
    drop(feed);
    assert!(
        !ended.read_ahead_to_content().await,
        "an end without content is no answer either"
    );
}

#[tokio::test(start_paused = true)]
async fn the_slot_is_kept_until_the_body_is_dropped_and_the_curve_learns_the_stream() {
    let backend = backend();
    let (feed, mut body) = metered(Some(false));
    body.keep_slot(InFlightGuard::try_admit(&backend, Some(0)).unwrap());
    assert_eq!(backend.in_flight(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    feed.send(Ok(content("a"))).unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(
        backend.curves.get("m").is_some(),
        "the TTFT is learned at the first token"
    );
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        feed.send(Ok(content("b"))).unwrap();
        body.frame().await.unwrap().unwrap();
    }
    drop(feed);
    assert!(body.frame().await.is_none());
    assert_eq!(backend.in_flight(), 1, "held until the body goes");
    drop(body);
    assert_eq!(backend.in_flight(), 0);
    let curve = backend.curves.get("m").unwrap();
    assert_eq!(curve.counts().observations, 1);
    let point = curve.points(Instant::now())[0];
    // Five content events 20 ms apart, counted as tokens (no usage): 50 tok/s.
    assert!(
        (point.per_user_tps_p50.unwrap() - 50.0).abs() < 1e-6,
        "{point:?}"
    );
    assert!((point.ttft_p50_s.unwrap() - 0.1).abs() < 1e-6, "{point:?}");
}

#[tokio::test(start_paused = true)]
async fn a_level_probe_teaches_its_curve_its_speed_a_few_tokens_in_and_not_again_at_its_end() {
    let backend = backend();
    let (feed, mut body) = metered(Some(false));
    let mut slot = InFlightGuard::try_admit(&backend, Some(0)).unwrap();
    slot.trial().read_early();
    body.keep_slot(slot);
    let observed = || {
        backend
            .curves
            .get("m")
            .map_or(0, |c| c.counts().observations)
    };
    for i in 0..crate::fleet::trial::EARLY_EVENTS {
        tokio::time::sleep(Duration::from_millis(if i == 0 { 100 } else { 25 })).await;
        feed.send(Ok(content("a"))).unwrap();
        body.frame().await.unwrap().unwrap();
        let early = i + 1 == crate::fleet::trial::EARLY_EVENTS;
        assert_eq!(observed(), u64::from(early), "after {} events", i + 1);
    }
    assert!(!backend.level_probe.out(), "the next level may be tried");
    // The rest streams slower; the curve keeps what it learned early.
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        feed.send(Ok(content("b"))).unwrap();
        body.frame().await.unwrap().unwrap();
    }
    drop(feed);
    assert!(body.frame().await.is_none());
    drop(body);
    let curve = backend.curves.get("m").unwrap();
    assert_eq!(curve.counts().observations, 1);
    let point = curve.points(Instant::now())[0];
    // Sixteen content events 25 ms apart: 40 tok/s.
    assert!(
        (point.per_user_tps_p50.unwrap() - 40.0).abs() < 1e-6,
        "{point:?}"
    );
}
