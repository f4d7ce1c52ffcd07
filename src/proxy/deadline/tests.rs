//! The deadlines on a body fed by hand, under paused time: exact instants, no sleeps.

use std::time::Duration;

use http_body_util::BodyExt as _;

use super::*;
use crate::proxy::testing::fed;

const TIMEOUTS: Timeouts = Timeouts {
    first_token: Duration::from_secs(2),
    stall: Duration::from_secs(1),
    total: Some(Duration::from_secs(10)),
    response: Duration::from_secs(5),
};

fn timed(
    body: crate::proxy::testing::Fed,
    drained: Option<Signal>,
) -> Timed<crate::proxy::testing::Fed> {
    Timed::new(
        body,
        Deadlines::new(TIMEOUTS, Instant::now(), true),
        drained,
        Arc::from("b"),
    )
}

fn expired_kind(frame: Option<Result<Frame<Bytes>, Cut>>) -> &'static str {
    match frame {
        Some(Err(Cut::Expired(e))) => e.kind,
        other => panic!("expected a deadline to pass, got {other:?}"),
    }
}

#[test]
fn the_first_token_deadline_is_capped_by_the_total_and_the_stall_too() {
    let sent = Instant::now();
    let d = Deadlines::new(TIMEOUTS, sent, true);
    assert_eq!(d.first_token(), sent + Duration::from_secs(2));
    assert_eq!(
        d.stall_from(sent + Duration::from_secs(3)),
        sent + Duration::from_secs(4)
    );
    assert_eq!(
        d.stall_from(sent + Duration::from_millis(9500)),
        sent + Duration::from_secs(10),
        "never past the total"
    );
    let short_total = Timeouts {
        total: Some(Duration::from_secs(1)),
        ..TIMEOUTS
    };
    assert_eq!(
        Deadlines::new(short_total, sent, true).first_token(),
        sent + Duration::from_secs(1)
    );
}

#[test]
fn the_expired_deadline_is_named_for_what_the_stream_was_waiting_for() {
    let sent = Instant::now();
    let d = Deadlines::new(TIMEOUTS, sent, true);
    let at = |s| sent + Duration::from_secs(s);
    assert_eq!(d.expired(at(2), false).kind, "first_token");
    assert_eq!(d.expired(at(5), true).kind, "stall");
    assert_eq!(d.expired(at(10), true).kind, "total");
    assert_eq!(
        d.expired(at(2), false).message,
        "no first token from the upstream within 2000 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_with_no_first_token_is_cut_at_the_first_token_timeout() {
    let (_feed, body) = fed();
    let start = Instant::now();
    let mut body = timed(body, None);
    assert_eq!(expired_kind(body.frame().await), "first_token");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(body.frame().await.is_none(), "a cut body ends");
    assert!(body.is_end_stream());
}

#[tokio::test(start_paused = true)]
async fn once_output_flows_every_frame_moves_the_stall_deadline() {
    let (feed, body) = fed();
    let start = Instant::now();
    let mut body = std::pin::pin!(timed(body, None));
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(900)).await;
        feed.send(Ok(Bytes::from_static(b"x"))).unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        body.as_mut().flowing(Instant::now());
    }
    // 4.5 s in, output flowing: silence now ends it one stall later, not at the first token's.
    assert_eq!(expired_kind(body.frame().await), "stall");
    assert_eq!(start.elapsed(), Duration::from_millis(5500));
}

#[tokio::test(start_paused = true)]
async fn the_total_deadline_cuts_a_stream_that_never_stalls() {
    let (feed, body) = fed();
    let start = Instant::now();
    let mut body = std::pin::pin!(timed(body, None));
    let kind = loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(_)) => body.as_mut().flowing(Instant::now()),
                other => break expired_kind(other),
            },
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                feed.send(Ok(Bytes::from_static(b"x"))).unwrap();
            }
        }
    };
    assert_eq!(kind, "total");
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn the_drain_deadline_cuts_an_open_body() {
    let (_feed, body) = fed();
    let drained = Signal::new();
    let mut body = timed(body, Some(drained.clone()));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drained.fire();
    });
    let start = Instant::now();
    assert!(matches!(body.frame().await, Some(Err(Cut::Drained))));
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn an_upstream_failure_is_a_cut_and_the_body_ends_after_it() {
    let (feed, body) = fed();
    let mut body = timed(body, None);
    feed.send(Err("connection reset".into())).unwrap();
    match body.frame().await {
        Some(Err(Cut::Upstream(e))) => assert_eq!(e.to_string(), "connection reset"),
        other => panic!("{other:?}"),
    }
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_body_that_arrives_whole_never_arms_a_timer() {
    let (feed, body) = fed();
    feed.send(Ok(Bytes::from_static(b"all of it"))).unwrap();
    drop(feed);
    let mut body = timed(body, None);
    assert!(body.frame().await.unwrap().is_ok());
    assert!(body.frame().await.is_none());
    assert!(body.timer.armed.is_none());
}

#[test]
fn a_response_that_is_not_a_stream_has_the_response_timeout_in_place_of_a_first_token() {
    let sent = Instant::now();
    let d = Deadlines::new(TIMEOUTS, sent, false);
    assert_eq!(d.first_token(), sent + Duration::from_secs(5));
    let e = d.expired(sent + Duration::from_secs(5), false);
    assert_eq!(e.kind, "response");
    assert_eq!(e.message, "the upstream did not answer within 5000 ms");
}
