//! What each key used and how well its SLO was met: a whole answer charged the usage its body
//! reported, prices per model and per engine hour, and each request's verdict against its
//! class's SLO, per key and class, fleet-wide with a cluster, its metrics' series bounded.

use std::net::SocketAddr;

use http::Method;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tpsgate::bench::http_client;

use super::keys::{chat, gateway, held_stream, one_slot_in_line, replicas, until, usage};
use crate::support;

/// A whole (non-stream) request with `key` for `model` on `path` in its dialect's shape
/// (`/v1/chat/completions` or `/v1/messages`), of `max_tokens`.
async fn whole(gw: SocketAddr, path: &str, key: &str, model: &str, max_tokens: u32) -> Value {
    let body = json!({"model": model, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "a prompt of a few words, counted by the engine"}]});
    let auth = format!("Bearer {key}");
    let ex = support::send(
        &http_client(None).unwrap(),
        gw,
        Method::POST,
        path,
        Some(body.to_string().as_bytes()),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
    )
    .await;
    assert_eq!(ex.status, 200);
    ex.json()
}

#[tokio::test]
async fn a_whole_answer_is_charged_the_usage_its_body_reported_at_its_models_price() {
    for (dialect, path, input, output) in [
        (
            "openai",
            "/v1/chat/completions",
            "prompt_tokens",
            "completion_tokens",
        ),
        ("anthropic", "/v1/messages", "input_tokens", "output_tokens"),
    ] {
        // `big` is the same engine's model priced ten times `m`.
        let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
        let backend = support::backend_yaml(
            "sim",
            sim,
            dialect,
            "    models: {m: m, big: m}\n    cost: {input_per_1m: 1, output_per_1m: 2, models: {big: {input_per_1m: 10, output_per_1m: 20}}}\n",
        );
        let gw = support::gateway(&format!(
            "backends:\n{backend}api_keys:\n  - {{key_env: A, name: a}}\n"
        ))
        .await;
        let mut expected = 0.0;
        let (mut inputs, mut outputs) = (0, 0);
        for (model, per_1m) in [("m", (1.0, 2.0)), ("big", (10.0, 20.0))] {
            let answer = whole(gw.addr(), path, "key-of-A", model, 7).await;
            let (i, o) = (
                answer["usage"][input].as_u64().unwrap(),
                answer["usage"][output].as_u64().unwrap(),
            );
            inputs += i;
            outputs += o;
            expected += (i as f64 * per_1m.0 + o as f64 * per_1m.1) / 1e6;
        }
        until(|| async { usage(&gw, "a").await["output_tokens_total"] == outputs }).await;
        let a = usage(&gw, "a").await;
        assert_eq!(a["input_tokens_total"], inputs, "{dialect}: {a}");
        assert_eq!(a["output_tokens_total"], outputs, "{dialect}: {a}");
        assert_eq!(
            a["estimated_total"], 0,
            "{dialect}: nothing settled at the estimate"
        );
        let spent = a["spent_usd"].as_f64().unwrap();
        assert!(
            (spent - expected).abs() < 1e-12,
            "{dialect}: {spent} against {expected}"
        );
        // The same, per class (here none), to the millionth of a dollar.
        let class = slo_of(&gw, "a", "none").await.unwrap();
        assert_eq!(class["tokens"], inputs + outputs, "{dialect}: {class}");
        let by_class = class["spent_usd"].as_f64().unwrap();
        assert!(
            (by_class - expected).abs() < 1e-12,
            "{dialect}: {by_class} against {expected}"
        );
    }
}

#[tokio::test]
async fn an_engine_priced_by_the_hour_charges_each_request_its_share_of_the_engines_time() {
    // $3600 an hour: a dollar for each second of the engine, 20 ms a token, 10 tokens.
    let (_fleet, gw) = gateway(
        "openai",
        "    cost: {gpu_hour_usd: 3600}\n",
        "  - {key_env: A, name: alone}\n  - {key_env: B, name: b}\n  - {key_env: C, name: c}\n",
    )
    .await;
    let spent = |name: &'static str| {
        let gw = &gw;
        async move { usage(gw, name).await["spent_usd"].as_f64().unwrap() }
    };
    let addr = gw.addr();
    let timed = |key: &'static str| async move {
        let start = tokio::time::Instant::now();
        assert_eq!(chat(addr, key, 10).await.status, 200);
        start.elapsed().as_secs_f64()
    };
    let wall = timed("key-of-A").await;
    until(|| async { spent("alone").await > 0.0 }).await;
    let alone = spent("alone").await;
    assert!(
        (0.9 * 0.2..=wall).contains(&alone),
        "alone, it pays the engine's time it held: {alone} of {wall} s"
    );
    // Two at once share each second.
    let (wall_b, wall_c) = tokio::join!(timed("key-of-B"), timed("key-of-C"));
    until(|| async { spent("b").await > 0.0 && spent("c").await > 0.0 }).await;
    let (b, c) = (spent("b").await, spent("c").await);
    assert!(
        b + c <= wall_b.max(wall_c),
        "the shares add up to the time the engine was held: {b} + {c} against {wall_b} and {wall_c} s"
    );
    assert!(
        b <= 0.75 * wall_b && c <= 0.75 * wall_c,
        "each paid about half its time: {b} of {wall_b} s, {c} of {wall_c} s"
    );
    assert!(
        b >= 0.09 && c >= 0.09,
        "and at least half of its own: {b}, {c}"
    );
}

/// Each key's verdicts of class `class` on `/admin/keys`: (requests, attainment, by verdict).
async fn slo_of(gw: &tpsgate::gateway::Gateway, key: &str, class: &str) -> Option<Value> {
    usage(gw, key).await["slo"]
        .as_array()?
        .iter()
        .find(|c| c["class"] == class)
        .cloned()
}

#[tokio::test]
async fn each_key_sees_the_share_of_its_requests_that_met_their_classs_slo_and_why_the_rest_did_not()
 {
    // 50 tok/s: `chat` (10 tok/s) is met, `greedy` and `strict` (1,000 tok/s) are not: greedy's
    // requests are sent anyway, strict's refused once the curve says so.
    let (_fleet, sim) = support::start_engine("sim", support::engine(20.0, 0.0, 8)).await;
    let backend = support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n");
    let gw = support::gateway(&format!(
        "backends:\n{backend}classes:\n  - {{name: chat, min_tps: 10, max_ttft_ms: 5000}}\n  - {{name: greedy, min_tps: 1000, on_miss: best_effort}}\n  - {{name: strict, min_tps: 1000, on_miss: shed}}\n  - {{name: waits, min_tps: 1000, on_miss: queue, queue_max_wait_ms: 200}}\napi_keys:\n  - {{key_env: A, name: a, class: chat}}\n  - {{key_env: B, name: b, class: greedy}}\n  - {{key_env: C, name: c, class: strict}}\n  - {{key_env: D, name: d, class: waits}}\n"
    ))
    .await;
    for _ in 0..2 {
        assert_eq!(chat(gw.addr(), "key-of-A", 8).await.status, 200);
    }
    assert_eq!(chat(gw.addr(), "key-of-B", 8).await.status, 200);
    let (mut served, mut refused) = (0, 0);
    while refused == 0 && served < 10 {
        match chat(gw.addr(), "key-of-C", 8).await.status.as_u16() {
            200 => served += 1,
            429 => refused += 1,
            other => panic!("strict got {other}"),
        }
    }
    assert_eq!(
        refused, 1,
        "once the curve shows 50 tok/s, strict's requests are refused"
    );
    // And waits' wait in line for their whole wait first.
    assert_eq!(chat(gw.addr(), "key-of-D", 8).await.status, 429);
    until(|| async {
        slo_of(&gw, "a", "chat")
            .await
            .is_some_and(|c| c["requests"] == 2)
            && slo_of(&gw, "b", "greedy").await.is_some()
            && slo_of(&gw, "c", "strict")
                .await
                .is_some_and(|c| c["requests"] == served + refused)
    })
    .await;
    let a = slo_of(&gw, "a", "chat").await.unwrap();
    assert_eq!(a["attainment"], 1.0, "{a}");
    assert_eq!(a["by_verdict"], json!({"met": 2}));
    let b = slo_of(&gw, "b", "greedy").await.unwrap();
    assert_eq!(b["attainment"], 0.0, "{b}");
    assert_eq!(b["by_verdict"], json!({"too_slow": 1}));
    let c = slo_of(&gw, "c", "strict").await.unwrap();
    assert_eq!(c["by_verdict"]["shed"], 1, "{c}");
    assert_eq!(
        c["by_verdict"]["too_slow"].as_u64().unwrap_or(0),
        served,
        "{c}"
    );
    until(|| async { slo_of(&gw, "d", "waits").await.is_some() }).await;
    let d = slo_of(&gw, "d", "waits").await.unwrap();
    assert_eq!(d["by_verdict"], json!({"queued_too_long": 1}), "{d}");

    let metrics = support::exchange(gw.admin_addr(), Method::GET, "/metrics", None).await;
    let text = String::from_utf8(metrics.body()).unwrap();
    assert!(
        text.contains(r#"tpsgate_key_slo_requests_total{key="a",class="chat",verdict="met"} 2"#),
        "{text}"
    );
    let dom = support::dashboard_dom(gw.admin_addr()).await;
    assert!(
        dom.contains("<td>b</td><td>greedy</td><td>1</td><td>0.0%</td><td>too slow 1</td>"),
        "the dashboard's table"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cluster_each_replica_shows_the_fleets_verdicts_for_a_key() {
    let redis = support::Redis::start().await;
    let (_fleet, a, b) = replicas(&redis, "  - {key_env: A, name: a}\n").await;
    for gw in [&a, &a, &b] {
        assert_eq!(chat(gw.addr(), "key-of-A", 1).await.status, 200);
    }
    for gw in [&a, &b] {
        until(|| async {
            slo_of(gw, "a", "none")
                .await
                .is_some_and(|c| c["requests"] == 3)
        })
        .await;
        let fleet = slo_of(gw, "a", "none").await.unwrap();
        assert_eq!(fleet["by_verdict"], json!({"met": 3}), "{fleet}");
    }
}

#[tokio::test]
async fn keys_past_the_series_cap_share_one_metrics_label_and_keep_their_own_usage() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let backend = support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n");
    let gw = support::gateway(&format!(
        "admin: {{listen: 127.0.0.1:0, max_key_series: 1}}\nbackends:\n{backend}api_keys:\n  - {{key_env: A, name: capped-a}}\n  - {{key_env: B, name: capped-b}}\n  - {{key_env: C, name: capped-c}}\n"
    ))
    .await;
    for key in ["key-of-A", "key-of-B", "key-of-C"] {
        assert_eq!(chat(gw.addr(), key, 2).await.status, 200);
    }
    let metrics = support::exchange(gw.admin_addr(), Method::GET, "/metrics", None).await;
    let text = String::from_utf8(metrics.body()).unwrap();
    assert!(
        text.contains(r#"tpsgate_key_requests_total{key="capped-a"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains("capped-b") && !text.contains("capped-c"),
        "{text}"
    );
    assert!(
        text.contains(r#"tpsgate_key_requests_total{key="other"}"#),
        "{text}"
    );
    // /admin/keys still tells them apart.
    assert_eq!(usage(&gw, "capped-c").await["requests_total"], 1);
}

#[tokio::test]
async fn a_request_whose_client_left_while_it_waited_in_line_is_cancelled_not_missed() {
    // The one slot taken by a stream of 40 tokens at 20 ms: the next request waits in line.
    let (_fleet, gw) = one_slot_in_line("  - {key_env: A, name: a}\n").await;
    let mut open = held_stream(gw.addr(), "key-of-A", 40).await;
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        chat(gw.addr(), "key-of-A", 4),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "it was still waiting when its client left"
    );
    while open.frame().await.is_some() {}
    until(|| async {
        slo_of(&gw, "a", "waits")
            .await
            .is_some_and(|c| c["requests"] == 2)
    })
    .await;
    let waits = slo_of(&gw, "a", "waits").await.unwrap();
    assert_eq!(
        waits["by_verdict"],
        json!({"met": 1, "cancelled": 1}),
        "{waits}"
    );
    assert_eq!(
        waits["attainment"], 1.0,
        "a request given up counts neither way"
    );
}
