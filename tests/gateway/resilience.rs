//! Outlier ejection and 429 cooldown as a client sees them.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;
use tpsgate::bench::http_client;
use tpsgate::sim::config::{FaultKindRaw, FaultRaw, StreamRaw};

use crate::support;

const CHAT: &[u8] = br#"{"model":"m","messages":[],"max_tokens":3,"stream":true}"#;

fn fault(kind: FaultKindRaw, retry_after_s: Option<u32>) -> FaultRaw {
    FaultRaw {
        kind,
        probability: None,
        every: Some(1),
        retry_after_s,
        delay_ms: None,
        after_tokens: None,
    }
}

/// A faulty and a good backend behind a round-robin class (so that the order is known), with
/// `routing` settings.
async fn faulty_and_good_with(
    faulty: FaultRaw,
    routing: &str,
    bad_step_ms: f64,
) -> (support::FleetGuard, SocketAddr, tpsgate::gateway::Gateway) {
    let (bad_fleet, bad) = support::start(support::spec(
        "bad",
        support::engine(bad_step_ms, 0.0, 8),
        StreamRaw::default(),
        vec![faulty],
    ))
    .await;
    let (good_fleet, good) = support::start_engine("good", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{}classes:\n  - {{name: turns, policy: round_robin}}\nrouting: {{{routing}}}\n",
        support::backend_yaml(
            "bad",
            bad,
            "openai",
            "    models: {m: m}\n    ejection: {after_failures: 3, base_ms: 300, max_ms: 1000}\n"
        ),
        support::backend_yaml("good", good, "openai", "    models: {m: m}\n"),
    ))
    .await;
    (support::FleetGuard(vec![bad_fleet, good_fleet]), bad, gw)
}

/// [`faulty_and_good_with`] retries on.
async fn faulty_and_good(
    faulty: FaultRaw,
) -> (support::FleetGuard, SocketAddr, tpsgate::gateway::Gateway) {
    faulty_and_good_with(faulty, "", 1.0).await
}

/// [`faulty_and_good_with`] without retries, so that the client sees each failure.
async fn faulty_and_good_unretried(
    faulty: FaultRaw,
) -> (support::FleetGuard, SocketAddr, tpsgate::gateway::Gateway) {
    faulty_and_good_with(faulty, "max_attempts: 1", 1.0).await
}

async fn backend_of_next(gw: &tpsgate::gateway::Gateway) -> (StatusCode, String) {
    let ex = support::exchange_with(
        &http_client(None).unwrap(),
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(CHAT),
    )
    .await;
    let backend = ex
        .headers
        .get("x-tpsgate-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    (ex.status, backend)
}

async fn metrics_of(gw: &tpsgate::gateway::Gateway) -> String {
    let metrics = support::exchange(gw.admin_addr(), Method::GET, "/metrics", None).await;
    String::from_utf8(metrics.body()).unwrap()
}

async fn health(gw: &tpsgate::gateway::Gateway) -> String {
    let all = support::get_json(gw.admin_addr(), "/admin/backends").await;
    all["backends"][0]["health"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_failing_backend_is_ejected_then_probed_back_once_it_recovers() {
    let (_fleets, bad, gw) = faulty_and_good_unretried(fault(FaultKindRaw::Http500, None)).await;
    let mut failures = 0;
    for _ in 0..6 {
        let (status, _) = backend_of_next(&gw).await;
        failures += usize::from(status == StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(failures, 3, "three failures eject it");
    assert_eq!(health(&gw).await, "ejected");
    for _ in 0..4 {
        assert_eq!(
            backend_of_next(&gw).await,
            (StatusCode::OK, "good".to_owned())
        );
    }
    assert!(
        metrics_of(&gw)
            .await
            .contains(r#"tpsgate_ejections_total{backend="bad"}"#)
    );

    // Recovered and the ejection over: round robin reaches it again, the probe succeeds.
    support::post(bad, "/sim/params", &json!({"faults": []})).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (status, backend) = backend_of_next(&gw).await;
        assert_eq!(status, StatusCode::OK);
        seen.push(backend);
    }
    assert!(seen.contains(&"bad".to_owned()), "{seen:?}");
    assert_eq!(health(&gw).await, "healthy");
}

#[tokio::test]
async fn a_429_cools_the_backend_for_its_retry_after() {
    let (_fleets, bad, gw) = faulty_and_good_unretried(fault(FaultKindRaw::Http429, Some(1))).await;
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(backend_of_next(&gw).await);
    }
    assert!(
        statuses.contains(&(StatusCode::TOO_MANY_REQUESTS, "bad".to_owned())),
        "{statuses:?}"
    );
    assert_eq!(health(&gw).await, "cooling");
    for _ in 0..4 {
        assert_eq!(
            backend_of_next(&gw).await,
            (StatusCode::OK, "good".to_owned())
        );
    }
    support::post(bad, "/sim/params", &json!({"faults": []})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(health(&gw).await, "healthy");
}

fn timed_fault(kind: FaultKindRaw, delay_ms: u64, after_tokens: Option<u32>) -> FaultRaw {
    FaultRaw {
        delay_ms: Some(delay_ms),
        after_tokens,
        ..fault(kind, None)
    }
}

/// One backend (both dialects, two entries) whose every request meets `faulty`, with `timeouts`.
async fn timing_out(
    faulty: FaultRaw,
    timeouts: &str,
) -> (support::FleetGuard, tpsgate::gateway::Gateway) {
    let (fleet, sim) = support::start(support::spec(
        "sim",
        support::engine(20.0, 0.0, 8),
        StreamRaw::default(),
        vec![faulty],
    ))
    .await;
    // One engine for each dialect's clients, each reaching only its own (no translation): one
    // backend serves a model per dialect.
    let extra = format!("    models: {{m: m}}\n    translate: false\n{timeouts}");
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml("oa", sim, "openai", &extra),
        support::backend_yaml("an", sim, "anthropic", &extra),
    ))
    .await;
    (support::FleetGuard(vec![fleet]), gw)
}

#[tokio::test]
async fn a_stalled_stream_ends_with_an_error_event_in_its_dialect() {
    let (_fleet, gw) = timing_out(
        timed_fault(FaultKindRaw::Stall, 5000, Some(2)),
        "    stall_timeout_ms: 200\n",
    )
    .await;
    let started = tokio::time::Instant::now();
    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"m","messages":[],"max_tokens":10,"stream":true}"#),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cut long before the stall ends"
    );
    assert_eq!(ex.status, StatusCode::OK);
    let events = ex.data_events();
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_timeout", "{events:?}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stalled")
    );
    assert!(
        events.iter().filter(|e| e.contains("\"content\"")).count() >= 2,
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e == "[DONE]"),
        "a cut stream does not claim to be done"
    );

    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/messages",
        Some(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}"#),
    )
    .await;
    let text = String::from_utf8(ex.body()).unwrap();
    assert!(
        text.contains("event: error\ndata: {\"error\":{\"message\":\"the upstream stalled: no data for 200 ms\",\"type\":\"api_error\"},\"type\":\"error\"}\n\n"),
        "{text}"
    );
    let metrics = support::exchange(gw.admin_addr(), Method::GET, "/metrics", None).await;
    assert!(
        String::from_utf8(metrics.body())
            .unwrap()
            .contains(r#"tpsgate_upstream_timeouts_total{backend="oa",kind="stall"}"#)
    );
}

#[tokio::test]
async fn a_stream_whose_tokens_keep_coming_is_never_cut_however_long_it_lasts() {
    // 30 tokens 20 ms apart: the stream lasts three times its stall timeout, and every gap is a
    // fifth of it. Each token moves the stall deadline on; the timer set for an earlier one
    // must not cut the stream when it fires.
    let (_fleet, sim) = support::start_engine("sim", support::engine(20.0, 0.0, 8)).await;
    let gw = support::gateway_for(
        sim,
        "openai",
        "    models: {m: m}\n    stall_timeout_ms: 200\n",
    )
    .await;
    let started = tokio::time::Instant::now();
    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"m","messages":[],"max_tokens":30,"stream":true}"#),
    )
    .await;
    assert!(
        started.elapsed() > Duration::from_millis(600),
        "the stream ran its length"
    );
    let events = ex.data_events();
    assert!(
        !events.iter().any(|e| e.contains("\"error\"")),
        "{events:?}"
    );
    assert_eq!(
        events.iter().filter(|e| e.contains("\"content\"")).count(),
        30,
        "{events:?}"
    );
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn no_response_within_the_first_token_timeout_is_a_504() {
    let (_fleet, gw) = timing_out(
        timed_fault(FaultKindRaw::SlowFirstByte, 5000, None),
        "    first_token_timeout_ms: 200\n",
    )
    .await;
    let started = tokio::time::Instant::now();
    let ex = support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(CHAT)).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(ex.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(ex.json()["error"]["code"], "upstream_timeout");
}

#[tokio::test]
async fn a_stream_over_its_total_timeout_is_cut_with_an_error_event() {
    let (_fleet, gw) = timing_out(
        timed_fault(FaultKindRaw::Stall, 1, Some(1_000_000)),
        "    total_timeout_ms: 300\n",
    )
    .await;
    let ex = support::exchange(
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"m","messages":[],"max_tokens":1000,"stream":true}"#),
    )
    .await;
    let events = ex.data_events();
    let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("within 300 ms"),
        "{last}"
    );
}

#[tokio::test]
async fn a_failure_before_any_content_is_retried_elsewhere_invisibly() {
    let (_fleets, _bad, gw) = faulty_and_good(fault(FaultKindRaw::Http500, None)).await;
    for _ in 0..4 {
        assert_eq!(
            backend_of_next(&gw).await,
            (StatusCode::OK, "good".to_owned())
        );
    }
    assert!(metrics_of(&gw).await.contains("tpsgate_retries_total"));
}

/// How long a streamed chat request waits for its response head.
async fn head_after(gw: &tpsgate::gateway::Gateway) -> Duration {
    let request = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(CHAT)))
        .unwrap();
    let started = tokio::time::Instant::now();
    let resp = http_client(None).unwrap().request(request).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let waited = started.elapsed();
    drop(resp);
    waited
}

#[tokio::test]
async fn a_stream_head_is_held_for_a_retry_only_where_another_backend_could_take_it() {
    let stall = timed_fault(FaultKindRaw::Stall, 1500, Some(0));
    // One backend serves the model: nothing to fail over to, nothing held back.
    let (_fleet, alone) = timing_out(stall.clone(), "").await;
    assert!(head_after(&alone).await < Duration::from_millis(1000));
    // Two do: the head waits for the first content, so that a failure before it stays unseen.
    let (_fleets, _bad, pair) = faulty_and_good(stall).await;
    let first = head_after(&pair).await;
    let second = head_after(&pair).await;
    assert!(
        first.max(second) >= Duration::from_millis(1000),
        "{first:?} {second:?}: the stalled backend's head came before its content"
    );
}

#[tokio::test]
async fn a_stream_cut_before_content_fails_over_but_one_cut_after_content_is_never_repeated() {
    let reset = |after_tokens| FaultRaw {
        after_tokens: Some(after_tokens),
        ..fault(FaultKindRaw::Reset, None)
    };
    let body = br#"{"model":"m","messages":[],"max_tokens":5,"stream":true}"#;
    // Cut after the role chunk, before any content: the client sees one whole stream.
    let (_fleets, _bad, gw) = faulty_and_good(reset(0)).await;
    for _ in 0..2 {
        let ex =
            support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(body)).await;
        assert_eq!(ex.headers["x-tpsgate-backend"], "good");
        let events = ex.data_events();
        assert_eq!(
            events.iter().filter(|e| e.contains("\"role\"")).count(),
            1,
            "{events:?}"
        );
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        assert!(ex.error.is_none());
    }
    // Cut after two tokens went out: no retry; the stream ends with an error event, nothing
    // repeats. The cutting backend decodes a token per 100 ms, so that the tokens have reached
    // the gateway before the reset does (one that overtakes unread data drops it, and on a
    // starved machine a 1 ms step left the gateway nothing to have read: then the request was
    // rightly retried, and this test saw no cut).
    let (_fleets, _bad, gw) = faulty_and_good_with(reset(2), "", 100.0).await;
    let mut broken = 0;
    for _ in 0..2 {
        let ex =
            support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(body)).await;
        if ex.headers["x-tpsgate-backend"] == "bad" {
            broken += 1;
            let events = ex.data_events();
            let last: serde_json::Value = serde_json::from_str(events.last().unwrap()).unwrap();
            assert_eq!(
                last["error"]["code"], "upstream_error",
                "the cut is said: {events:?}"
            );
            let content = events.iter().filter(|e| e.contains("\"content\"")).count();
            // The reset may take the last chunk with it; never anything twice.
            assert!((1..=2).contains(&content), "{content} content events");
        }
    }
    assert_eq!(
        broken, 1,
        "round robin sent one of two to the cutting backend"
    );
}

#[tokio::test]
async fn retries_stop_when_the_budget_is_spent() {
    let (bad_fleet, bad) = support::start(support::spec(
        "bad",
        support::engine(1.0, 0.0, 8),
        StreamRaw::default(),
        vec![fault(FaultKindRaw::Http503, None)],
    ))
    .await;
    let (good_fleet, good) = support::start_engine("good", support::engine(1.0, 0.0, 8)).await;
    let _fleets = support::FleetGuard(vec![bad_fleet, good_fleet]);
    // No deposits, no ejection: only the reserve of retries is there to spend.
    let gw = support::gateway(&format!(
        "backends:\n{}{}classes:\n  - {{name: turns, policy: round_robin}}\nrouting: {{retry_budget: 0}}\n",
        support::backend_yaml(
            "bad",
            bad,
            "openai",
            "    models: {m: m}\n    ejection: {after_failures: 1000}\n"
        ),
        support::backend_yaml("good", good, "openai", "    models: {m: m}\n"),
    ))
    .await;
    let mut unavailable = 0;
    for _ in 0..30 {
        let (status, _) = backend_of_next(&gw).await;
        unavailable += usize::from(status == StatusCode::SERVICE_UNAVAILABLE);
    }
    // Retries never go back to the backend that failed: what it received are first attempts.
    // The reserve (10 retries) saves the first ten of them; the rest reach the client.
    let started_on_bad = support::seen(bad).await.len();
    assert!(started_on_bad > 10, "{started_on_bad}");
    assert_eq!(unavailable, started_on_bad - 10);
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What a stream through the gateway looked like.
enum Ending {
    /// `[DONE]` after exactly the tokens asked for, in order.
    Whole,
    /// An error event after a prefix of them (or an error response before any).
    Error,
}

fn judge(ex: &support::Exchange, tokens: u32) -> Result<Ending, String> {
    if ex.status != StatusCode::OK {
        let body = ex.json();
        return if body["error"]["code"].is_string() {
            Ok(Ending::Error)
        } else {
            Err(format!("{}: {body}", ex.status))
        };
    }
    let events = ex.data_events();
    let mut text = String::new();
    for e in &events {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(e)
            && let Some(t) = v["choices"][0]["delta"]["content"].as_str()
        {
            text.push_str(t);
        }
    }
    let expected = tpsgate::sim::wire::token_text(0, tokens);
    if !expected.starts_with(&text) {
        return Err(format!(
            "content is not a prefix of what was produced: {text:?}"
        ));
    }
    match events.last().map(String::as_str) {
        Some("[DONE]") if text == expected => Ok(Ending::Whole),
        Some(last) => {
            let v: serde_json::Value =
                serde_json::from_str(last).map_err(|e| format!("{e}: {last}"))?;
            if v["error"]["code"].is_string() && ex.error.is_none() {
                Ok(Ending::Error)
            } else {
                Err(format!(
                    "ended without [DONE] or an error event: {events:?}"
                ))
            }
        }
        None => Err("no events".to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_random_faults_every_stream_is_whole_or_ends_with_an_error_event() {
    let faults = || {
        let f = |kind, probability: f64, delay_ms, after_tokens| FaultRaw {
            kind,
            probability: Some(probability),
            every: None,
            retry_after_s: (kind == FaultKindRaw::Http429).then_some(1),
            delay_ms,
            after_tokens,
        };
        vec![
            f(FaultKindRaw::Http500, 0.04, None, None),
            f(FaultKindRaw::Http429, 0.02, None, None),
            f(FaultKindRaw::Stall, 0.04, Some(3000), Some(3)),
            f(FaultKindRaw::Reset, 0.04, None, Some(5)),
            f(FaultKindRaw::Reset, 0.02, None, Some(0)),
            f(FaultKindRaw::SlowFirstByte, 0.04, Some(300), None),
        ]
    };
    let mut fleets = Vec::new();
    let mut yaml = String::from("backends:\n");
    for name in ["a", "b", "c"] {
        let (fleet, addr) = support::start(support::spec(
            name,
            support::engine(5.0, 0.0, 1024),
            StreamRaw::default(),
            faults(),
        ))
        .await;
        fleets.push(fleet);
        yaml.push_str(&support::backend_yaml(
            name,
            addr,
            "openai",
            "    models: {m: m}\n    stall_timeout_ms: 500\n    ejection: {after_failures: 1000}\n",
        ));
    }
    let _fleets = support::FleetGuard(fleets);
    // The gateway is the real binary, so that its memory is its own.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\n{yaml}routing: {{max_attempts: 3, retry_budget: 0.5}}\n"
        ),
    )
    .unwrap();
    let mut command = support::tpsgate();
    command
        .args(["--log-format", "json", "serve", "--config"])
        .arg(&file)
        .stderr(std::process::Stdio::null());
    let gw = support::spawn_listening(command).await;
    let admin: SocketAddr = support::admin_of(&gw);
    let pid = gw.child.id();
    let tokens = 20;
    let body = format!(r#"{{"model":"m","messages":[],"max_tokens":{tokens},"stream":true}}"#);
    let client = http_client(None).unwrap();
    // Three rounds: the first sets the allocator's high-water mark, the later ones must not
    // climb far above it (memory held per stream would).
    let mut rss = Vec::new();
    for round in 0..3 {
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..500 {
            let (client, body, addr) = (client.clone(), body.clone(), gw.addr);
            streams.spawn(async move {
                support::exchange_with(
                    &client,
                    addr,
                    Method::POST,
                    "/v1/chat/completions",
                    Some(body.as_bytes()),
                )
                .await
            });
        }
        let results = tokio::time::timeout(Duration::from_secs(60), streams.join_all())
            .await
            .expect("every stream ends in bounded time");
        let (mut whole, mut errors) = (0, 0);
        for ex in &results {
            match judge(ex, tokens) {
                Ok(Ending::Whole) => whole += 1,
                Ok(Ending::Error) => errors += 1,
                Err(why) => panic_free_fail(&why),
            }
        }
        assert_eq!(whole + errors, 500);
        assert!(
            whole > 400,
            "retries before content keep most streams whole: {whole} whole, {errors} errors"
        );
        // Everything released.
        let mut in_flight = u64::MAX;
        for _ in 0..50 {
            let all = support::get_json(admin, "/admin/backends").await;
            in_flight = all["backends"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["in_flight"].as_u64().unwrap())
                .sum();
            if in_flight == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(in_flight, 0);
        drop(results);
        rss.push(rss_bytes(pid));
        eprintln!(
            "round {round}: {whole} whole, {errors} ended with an error; RSS {} MiB",
            rss[round] >> 20
        );
    }
    // 1,000 streams later: a leak of 32 KiB a stream would show as 32 MiB.
    assert!(rss[2] < rss[0] + (32 << 20), "RSS grew: {rss:?}");
}

/// Fails the test with a message (the lint forbids `panic!`).
fn panic_free_fail(why: &str) {
    assert!(why.is_empty(), "{why}");
}

#[tokio::test]
async fn streams_still_open_at_the_drain_deadline_end_with_an_error_event() {
    use http_body_util::BodyExt;
    let (_fleet, sim) = support::start_engine("sim", support::engine(50.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "limits: {{drain_timeout_s: 0.3}}\nbackends:\n{}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let body = support::open_stream(gw.addr(), "m", 200).await;
    let started = tokio::time::Instant::now();
    let stopping = tokio::spawn(gw.stop());
    let rest = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        text.trim_end().ends_with(r#""code":"gateway_shutdown","message":"the gateway is shutting down and its drain deadline passed","type":"server_error"}}"#),
        "{text}"
    );
    stopping.await.unwrap();
}
