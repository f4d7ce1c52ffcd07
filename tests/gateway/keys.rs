//! API keys' limits (`api_keys[].limits`): requests and tokens per minute, requests in flight,
//! spend per period; 429 in the client's dialect with `Retry-After` and the provider's
//! rate-limit headers on every answer; usage in `/admin/keys` and `/metrics`, kept across a
//! reload.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use serde_json::{Value, json};
use tpsgate::bench::http_client;

use crate::support;

/// A gateway over one simulated backend (`dialect`, 20 ms a step) whose keys are `keys`
/// (YAML list items under `api_keys:`); the key of `key_env: NAME` is `key-of-NAME`.
pub(super) async fn gateway(
    dialect: &str,
    backend_extra: &str,
    keys: &str,
) -> (tpsgate::sim::Fleet, tpsgate::gateway::Gateway) {
    let (fleet, sim) = support::start_engine("sim", support::engine(20.0, 0.0, 8)).await;
    let backend = support::backend_yaml(
        "sim",
        sim,
        dialect,
        &format!("    models: {{m: m}}\n{backend_extra}"),
    );
    let gw = support::gateway(&format!("backends:\n{backend}api_keys:\n{keys}")).await;
    (fleet, gw)
}

/// A streamed chat completion with `key`, of `max_tokens`, its usage asked for.
pub(super) async fn chat(gw: SocketAddr, key: &str, max_tokens: u32) -> support::Exchange {
    chat_for(gw, key, "m", max_tokens).await
}

/// [`chat`] asking for `model`.
pub(super) async fn chat_for(
    gw: SocketAddr,
    key: &str,
    model: &str,
    max_tokens: u32,
) -> support::Exchange {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens, "stream": true, "stream_options": {"include_usage": true}});
    let auth = format!("Bearer {key}");
    support::send(
        &http_client(None).unwrap(),
        gw,
        Method::POST,
        "/v1/chat/completions",
        Some(body.to_string().as_bytes()),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
    )
    .await
}

/// A streamed Anthropic message with `key` (as `x-api-key`), of `max_tokens`.
async fn message(gw: SocketAddr, key: &str, max_tokens: u32) -> support::Exchange {
    let body = json!({"model": "m", "max_tokens": max_tokens, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]});
    support::send(
        &http_client(None).unwrap(),
        gw,
        Method::POST,
        "/v1/messages",
        Some(body.to_string().as_bytes()),
        &[("content-type", "application/json"), ("x-api-key", key)],
    )
    .await
}

/// A chat stream with `key` through `gw`, of `max_tokens`, held open once its first frame came.
pub(super) async fn held_stream(
    gw: SocketAddr,
    key: &str,
    max_tokens: u32,
) -> hyper::body::Incoming {
    let body = json!({"model": "m", "messages": [], "max_tokens": max_tokens, "stream": true});
    let request = Request::post(format!("http://{gw}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = http_client(None).unwrap().request(request).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut open = resp.into_body();
    assert!(open.frame().await.unwrap().unwrap().is_data());
    open
}

/// Waits up to 3 s for `check` to hold.
pub(super) async fn until<F: std::future::Future<Output = bool>>(check: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
    while !check().await && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn header<'a>(ex: &'a support::Exchange, name: &str) -> Option<&'a str> {
    ex.headers.get(name).map(|v| v.to_str().unwrap())
}

/// The key named `name` in `/admin/keys`.
pub(super) async fn usage(gw: &tpsgate::gateway::Gateway, name: &str) -> Value {
    let keys = support::get_json(gw.admin_addr(), "/admin/keys").await;
    keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == name)
        .cloned()
        .expect("the key is listed")
}

#[tokio::test]
async fn a_key_over_its_requests_per_minute_gets_429_with_retry_after_and_openai_headers() {
    let (_fleet, gw) = gateway(
        "openai",
        "",
        "  - {key_env: A, name: team-a, limits: {requests_per_minute: 2}}\n  - {key_env: B, name: team-b}\n",
    )
    .await;
    for remaining in ["1", "0"] {
        let ok = chat(gw.addr(), "key-of-A", 4).await;
        assert_eq!(ok.status, 200);
        assert_eq!(header(&ok, "x-ratelimit-limit-requests"), Some("2"));
        assert_eq!(
            header(&ok, "x-ratelimit-remaining-requests"),
            Some(remaining)
        );
        assert!(
            header(&ok, "x-ratelimit-reset-requests")
                .unwrap()
                .ends_with('s')
        );
    }
    let refused = chat(gw.addr(), "key-of-A", 4).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let error = &refused.json()["error"];
    assert_eq!(error["type"], "rate_limit_error");
    assert_eq!(error["code"], "rate_limit_exceeded");
    assert!(error["message"].as_str().unwrap().contains("team-a"));
    assert!(!error["message"].as_str().unwrap().contains("key-of-A"));
    // A request comes back every 30 s.
    let wait: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&wait), "retry-after {wait}");
    assert_eq!(
        header(&refused, "x-ratelimit-remaining-requests"),
        Some("0")
    );
    // Another key is not held back by team-a's limit, and carries no limit headers.
    let other = chat(gw.addr(), "key-of-B", 4).await;
    assert_eq!(other.status, 200);
    assert_eq!(header(&other, "x-ratelimit-limit-requests"), None);
    let a = usage(&gw, "team-a").await;
    assert_eq!(
        (a["requests_total"].as_u64(), a["limited_total"].as_u64()),
        (Some(2), Some(1))
    );
    let metrics = support::exchange(gw.admin_addr(), Method::GET, "/metrics", None).await;
    let metrics = String::from_utf8(metrics.body()).unwrap();
    assert!(
        metrics.contains("tpsgate_key_requests_total{key=\"team-a\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("tpsgate_key_limited_total{key=\"team-a\",limit=\"requests\"} 1"));
    assert!(metrics.contains("tpsgate_key_requests_total{key=\"team-b\"} 1"));
    assert!(!metrics.contains("key-of-"), "a key never shows in metrics");
}

#[tokio::test]
async fn the_dashboard_lists_each_key_by_name_with_what_it_used() {
    let (_fleet, gw) = gateway(
        "openai",
        "",
        "  - {key_env: A, name: team-a, limits: {requests_per_minute: 60, max_concurrency: 4}}\n",
    )
    .await;
    assert_eq!(chat(gw.addr(), "key-of-A", 4).await.status, 200);
    let dom = support::dashboard_dom(gw.admin_addr()).await;
    let card = dom
        .split("id=\"keys\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap();
    assert!(!card.contains("hidden"), "shown when keys exist:\n{card}");
    assert!(card.contains("<td>team-a</td>"), "{card}");
    // Requests left of 60 a minute (refilled while the page loaded), one admitted.
    assert!(
        card.contains(" of 60</td>") && card.contains("<td>1</td>"),
        "{card}"
    );
    assert!(!card.contains("key-of-A"), "never the key itself");
}

#[tokio::test]
async fn anthropic_clients_get_anthropics_rate_limit_headers_and_error_shape() {
    let (_fleet, gw) = gateway(
        "anthropic",
        "",
        "  - {key_env: A, limits: {requests_per_minute: 1, tokens_per_minute: 100000}}\n",
    )
    .await;
    let ok = message(gw.addr(), "key-of-A", 4).await;
    assert_eq!(ok.status, 200);
    assert_eq!(header(&ok, "anthropic-ratelimit-requests-limit"), Some("1"));
    assert_eq!(
        header(&ok, "anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
    assert_eq!(
        header(&ok, "anthropic-ratelimit-tokens-limit"),
        Some("100000")
    );
    let reset = header(&ok, "anthropic-ratelimit-requests-reset").unwrap();
    assert!(
        reset.len() == 20 && reset.ends_with('Z'),
        "RFC 3339: {reset}"
    );
    assert_eq!(header(&ok, "x-ratelimit-limit-requests"), None);
    let refused = message(gw.addr(), "key-of-A", 4).await;
    assert_eq!(refused.status, 429);
    let body = refused.json();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(header(&refused, "retry-after").is_some());
    assert_eq!(
        header(&refused, "anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
}

#[tokio::test]
async fn anthropic_clients_over_a_token_limit_or_a_budget_get_anthropics_429() {
    // A dollar per token: one request spends the budget of $10.
    let (_fleet, gw) = gateway(
        "anthropic",
        "    cost: {input_per_1m: 1000000, output_per_1m: 1000000}\n",
        "  - {key_env: T, limits: {tokens_per_minute: 100}}\n  - {key_env: S, limits: {budget_usd: 10}}\n",
    )
    .await;
    assert_eq!(message(gw.addr(), "key-of-T", 60).await.status, 200);
    let over_tokens = message(gw.addr(), "key-of-T", 60).await;
    assert_eq!(over_tokens.status, 429);
    assert_eq!(over_tokens.json()["error"]["type"], "rate_limit_error");
    assert_eq!(
        header(&over_tokens, "anthropic-ratelimit-tokens-limit"),
        Some("100")
    );
    assert!(header(&over_tokens, "retry-after").is_some());
    assert_eq!(message(gw.addr(), "key-of-S", 20).await.status, 200);
    let spent = message(gw.addr(), "key-of-S", 20).await;
    assert_eq!(spent.status, 429);
    assert_eq!(spent.json()["type"], "error");
    assert_eq!(spent.json()["error"]["type"], "rate_limit_error");
    assert!(
        spent.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget")
    );
}

#[tokio::test]
async fn tokens_per_minute_counts_what_the_stream_reported_not_the_estimate() {
    let (_fleet, gw) = gateway(
        "openai",
        "",
        "  - {key_env: A, name: a, limits: {tokens_per_minute: 1000}}\n",
    )
    .await;
    // Admitted at its estimate (the prompt and 600 output tokens), it used 20 output tokens.
    let ex = chat(gw.addr(), "key-of-A", 20).await;
    assert_eq!(ex.status, 200);
    let usage_event = ex
        .data_events()
        .into_iter()
        .filter(|d| d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(&d).unwrap())
        .find(|v| v["usage"].is_object())
        .unwrap();
    let prompt = usage_event["usage"]["prompt_tokens"].as_u64().unwrap();
    let a = usage(&gw, "a").await;
    assert_eq!(a["input_tokens_total"].as_u64(), Some(prompt));
    assert_eq!(a["output_tokens_total"].as_u64(), Some(20));
    let remaining = a["tokens_per_minute"]["remaining"].as_u64().unwrap();
    assert!(
        (1000 - prompt - 20..=1000).contains(&remaining),
        "what was used is drawn, the rest of the estimate came back: {a}"
    );
    // A request estimated beyond what is left waits (the whole limit is not free).
    let refused = chat(gw.addr(), "key-of-A", 999).await;
    assert_eq!(refused.status, 429);
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens per minute")
    );
    assert!(header(&refused, "x-ratelimit-remaining-tokens").is_some());
}

#[tokio::test]
async fn a_key_at_its_max_concurrency_waits_for_its_own_streams_to_end() {
    let (_fleet, gw) = gateway(
        "openai",
        "",
        "  - {key_env: A, name: a, limits: {max_concurrency: 1}}\n",
    )
    .await;
    // A stream of 40 tokens at 20 ms each, held open.
    let mut open = held_stream(gw.addr(), "key-of-A", 40).await;
    assert_eq!(usage(&gw, "a").await["in_flight"], 1);
    let refused = chat(gw.addr(), "key-of-A", 4).await;
    assert_eq!(refused.status, 429);
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in flight")
    );
    // Read to its end: the slot is the key's again.
    while open.frame().await.is_some() {}
    assert_eq!(usage(&gw, "a").await["in_flight"], 0);
    assert_eq!(chat(gw.addr(), "key-of-A", 4).await.status, 200);
}

#[tokio::test]
async fn a_spent_budget_answers_insufficient_quota_until_the_period_renews() {
    // A dollar per token either way: a budget of $30 is spent by the first request.
    let (_fleet, gw) = gateway(
        "openai",
        "    cost: {input_per_1m: 1000000, output_per_1m: 1000000}\n",
        "  - {key_env: A, name: a, limits: {budget_usd: 30, budget_period: hour}}\n",
    )
    .await;
    assert_eq!(chat(gw.addr(), "key-of-A", 30).await.status, 200);
    let a = usage(&gw, "a").await;
    assert!(a["spent_usd"].as_f64().unwrap() >= 30.0, "{a}");
    assert_eq!(a["budget_period"], "hour");
    let refused = chat(gw.addr(), "key-of-A", 4).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["error"]["type"], "insufficient_quota");
    assert_eq!(refused.json()["error"]["code"], "insufficient_quota");
    let wait: i64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    let resets = a["period_resets_in_s"].as_i64().unwrap();
    assert!(
        (1..=3600).contains(&wait) && (wait - resets).abs() <= 2,
        "{wait} against {resets}"
    );
}

#[tokio::test]
async fn a_reload_keeps_each_keys_usage_and_a_removed_key_stops_at_once() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let backend = support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n");
    let text = |keys: &str| format!("backends:\n{backend}api_keys:\n{keys}");
    let parse = |body: &str| {
        tpsgate::config::parse(
            &format!("listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\n{body}"),
            |name| Some(format!("key-of-{name}")),
        )
        .unwrap()
    };
    let first =
        "  - {key_env: A, name: a, limits: {requests_per_minute: 3}}\n  - {key_env: B, name: b}\n";
    let gw = support::gateway(&text(first)).await;
    for _ in 0..2 {
        assert_eq!(chat(gw.addr(), "key-of-A", 2).await.status, 200);
    }
    // A new key joins, b leaves, a's limit is raised by one: a has 2 of 4 left.
    gw.reload(&parse(&text(
        "  - {key_env: C, name: c}\n  - {key_env: A, name: a, limits: {requests_per_minute: 4}}\n",
    )))
    .await
    .unwrap();
    assert_eq!(chat(gw.addr(), "key-of-B", 2).await.status, 401);
    assert_eq!(chat(gw.addr(), "key-of-C", 2).await.status, 200);
    for remaining in ["1", "0"] {
        let ok = chat(gw.addr(), "key-of-A", 2).await;
        assert_eq!(
            header(&ok, "x-ratelimit-remaining-requests"),
            Some(remaining)
        );
    }
    assert_eq!(chat(gw.addr(), "key-of-A", 2).await.status, 429);
    assert_eq!(usage(&gw, "a").await["requests_total"], 4);
}

/// A gateway of `keys` over one backend of one slot, 20 ms a token, whose only class waits in
/// line for up to 20 s.
pub(super) async fn one_slot_in_line(
    keys: &str,
) -> (tpsgate::sim::Fleet, tpsgate::gateway::Gateway) {
    let (fleet, sim) = support::start_engine("one", support::engine(20.0, 0.0, 8)).await;
    let backend = support::backend_yaml(
        "one",
        sim,
        "openai",
        "    models: {m: m}\n    max_concurrency: 1\n",
    );
    let gw = support::gateway(&format!(
        "backends:\n{backend}classes:\n  - {{name: waits, on_miss: queue, queue_max_wait_ms: 20000}}\napi_keys:\n{keys}"
    ))
    .await;
    (fleet, gw)
}

#[tokio::test]
async fn a_key_that_floods_a_queueing_class_waits_behind_itself_not_the_other_keys() {
    // Requests of 4 tokens queue behind each other.
    let (_fleet, gw) =
        one_slot_in_line("  - {key_env: A, name: noisy}\n  - {key_env: B, name: polite}\n").await;
    let start = tokio::time::Instant::now();
    let timed = |key: &'static str| {
        let addr = gw.addr();
        async move {
            let ex = chat(addr, key, 4).await;
            assert_eq!(ex.status, 200);
            (key, start.elapsed())
        }
    };
    let flood = futures_util::future::join_all((0..6).map(|_| timed("key-of-A")));
    let admin = gw.admin_addr();
    let polite = async {
        // Once the flood is in: one request in service, five in line.
        loop {
            let page = support::exchange(admin, Method::GET, "/metrics", None).await;
            if String::from_utf8(page.body())
                .unwrap()
                .contains("tpsgate_queue_waiting 5")
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        timed("key-of-B").await
    };
    let (mut done, polite) = tokio::join!(flood, polite);
    done.push(polite);
    done.sort_by_key(|(_, at)| *at);
    let place = done.iter().position(|(key, _)| *key == "key-of-B").unwrap();
    // First come, first served it would be last (7th); in fair order it follows the request
    // in service and the flood's first in line.
    assert!(
        place <= 3,
        "the polite key finished {}th: {done:?}",
        place + 1
    );
}

/// Two in-process replicas over one backend, sharing `redis` (20 ms rounds), with `keys`.
pub(super) async fn replicas(
    redis: &support::Redis,
    keys: &str,
) -> (
    tpsgate::sim::Fleet,
    tpsgate::gateway::Gateway,
    tpsgate::gateway::Gateway,
) {
    let (fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 64)).await;
    let backend = support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n");
    let text = format!(
        "backends:\n{backend}api_keys:\n{keys}cluster: {{redis_url: '{}', key_prefix: keys, sync_interval_ms: 20}}\n",
        redis.url()
    );
    let a = support::gateway(&text).await;
    let b = support::gateway(&text).await;
    // Both have made a round and see the other.
    for gw in [&a, &b] {
        until(|| async {
            let c = support::get_json(gw.admin_addr(), "/admin/cluster").await;
            c["cluster"]["peers"].as_array().map(Vec::len) == Some(1)
        })
        .await;
    }
    (fleet, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_requests_per_minute_hold_for_the_whole_fleet_of_replicas() {
    let redis = support::Redis::start().await;
    let (_fleet, a, b) = replicas(
        &redis,
        "  - {key_env: A, name: a, limits: {requests_per_minute: 20}}\n",
    )
    .await;
    // Alternating between the replicas, a round apart: each alone would admit 20.
    let mut admitted = 0;
    for i in 0..60 {
        let gw = if i % 2 == 0 { &a } else { &b };
        if chat(gw.addr(), "key-of-A", 1).await.status == 200 {
            admitted += 1;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The fleet's 20, and what refilled meanwhile (a request every 3 s), give or take the
    // parts drawn by chance.
    assert!(
        (16..=26).contains(&admitted),
        "admitted {admitted} of a fleet-wide 20"
    );
    let (ua, ub) = (usage(&a, "a").await, usage(&b, "a").await);
    let (na, nb) = (
        ua["requests_total"].as_u64().unwrap(),
        ub["requests_total"].as_u64().unwrap(),
    );
    assert!(
        na > 0 && nb > 0,
        "both replicas admitted some: {na} and {nb}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_concurrency_counts_its_streams_on_every_replica() {
    let redis = support::Redis::start().await;
    let (_fleet, a, b) = replicas(
        &redis,
        "  - {key_env: A, name: a, limits: {max_concurrency: 1}}\n",
    )
    .await;
    // A long stream through replica a.
    let open = held_stream(a.addr(), "key-of-A", 3000).await;
    until(|| async { usage(&b, "a").await["peers_in_flight"] == 1 }).await;
    let refused = chat(b.addr(), "key-of-A", 1).await;
    assert_eq!(
        refused.status, 429,
        "the stream on the other replica counts"
    );
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_away_a_keys_limits_count_per_replica_and_nothing_blocks() {
    let mut redis = support::Redis::start().await;
    let (_fleet, a, _b) = replicas(
        &redis,
        "  - {key_env: A, name: a, limits: {requests_per_minute: 600}}\n",
    )
    .await;
    assert_eq!(chat(a.addr(), "key-of-A", 1).await.status, 200);
    redis.kill();
    until(|| async {
        support::get_json(a.admin_addr(), "/admin/cluster").await["cluster"]["connected"] == false
    })
    .await;
    // Served on this replica's own allowance: the whole limit, refilled at the whole rate.
    for _ in 0..20 {
        let ok = chat(a.addr(), "key-of-A", 1).await;
        assert_eq!(ok.status, 200);
    }
    let window = &usage(&a, "a").await["requests_per_minute"];
    assert!(window["remaining"].as_u64().unwrap() > 250, "{window}");
}
