//! Conversations and shared prompts: the prefix index sends a conversation's next turn to the
//! backend that holds its history while that backend's curve allows, and elsewhere once it is
//! full; the backend's own report of cached tokens calibrates the index.

use std::net::SocketAddr;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tpsgate::bench::{HttpClient, http_client};
use tpsgate::sim::config::{EngineRaw, PrefixCacheRaw, StreamRaw};

use crate::support;

/// A simulated pod with a prefix cache of `cache_tokens`: 100 tok/s alone, prefill at 4,000
/// tokens per second (a cold 2,000-token prompt costs half a second).
async fn pod(name: &str, cache_tokens: u32) -> (tpsgate::sim::Fleet, SocketAddr) {
    let mut spec = support::spec(
        name,
        EngineRaw {
            prefill_tokens_per_s: 4000.0,
            ..support::engine(10.0, 0.0, 16)
        },
        StreamRaw::default(),
        vec![],
    );
    spec.raw.prefix_cache = Some(PrefixCacheRaw {
        tokens: cache_tokens,
        block_tokens: 16,
    });
    support::start(spec.raw.validate("test").unwrap()).await
}

/// Two such pods, each with room for 100,000 prompt tokens.
async fn two_pods() -> (support::FleetGuard, SocketAddr, SocketAddr) {
    let (fa, a) = pod("a", 100_000).await;
    let (fb, b) = pod("b", 100_000).await;
    (support::FleetGuard(vec![fa, fb]), a, b)
}

/// Both pods' curves, learned from conversations of their own through `gw`.
async fn warm(client: &HttpClient, gw: SocketAddr) {
    for system in ['x', 'y', 'z', 'w'] {
        send(client, gw, &turn(system, &["warm up"], 4)).await;
    }
}

fn gateway_config(a: SocketAddr, b: SocketAddr, extra: &str) -> String {
    let backend = "    models: {m: m}\n    max_concurrency: 2\n";
    format!(
        "backends:\n{}{}\
         classes:\n  - {{name: interactive, min_tps: 25, max_ttft_ms: 3000}}\n\
         routing: {{exploration: 0}}\n{extra}",
        support::backend_yaml("a", a, "openai", backend),
        support::backend_yaml("b", b, "openai", backend),
    )
}

/// Turn `turns.len()` of a conversation with an 8,000-byte system prompt `system`.
fn turn(system: char, turns: &[&str], max_tokens: u32) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": system.to_string().repeat(8000)})];
    for (i, q) in turns.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": "a reply"}));
        }
        messages.push(json!({"role": "user", "content": q}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": max_tokens, "stream": true,
           "stream_options": {"include_usage": true}})
    .to_string()
    .into_bytes()
}

/// Sends one turn to its end: the backend that served it and the cached tokens it reported.
async fn send(client: &HttpClient, gw: SocketAddr, body: &[u8]) -> (String, u64) {
    send_with(client, gw, body, &[]).await
}

/// [`send`] with more headers.
async fn send_with(
    client: &HttpClient,
    gw: SocketAddr,
    body: &[u8],
    headers: &[(&str, &str)],
) -> (String, u64) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let ex = support::send(
        client,
        gw,
        Method::POST,
        "/v1/chat/completions",
        Some(body),
        &all,
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK);
    let backend = ex.headers["x-tpsgate-backend"].to_str().unwrap().to_owned();
    let cached = ex
        .data_events()
        .iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|e| e["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64())
        .unwrap();
    (backend, cached)
}

/// A turn held open after its first frame, on the backend named in its head.
async fn hold(gw: SocketAddr, body: Vec<u8>) -> (String, hyper::body::Incoming) {
    let request = http::Request::post(format!("http://{gw}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = http_client(None).unwrap().request(request).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let backend = resp.headers()["x-tpsgate-backend"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut body = resp.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    (backend, body)
}

#[tokio::test]
async fn a_conversation_stays_on_the_backend_holding_its_history_until_that_backend_is_full() {
    let (_fleets, a, b) = two_pods().await;
    let gw = support::gateway(&gateway_config(a, b, "")).await;
    let client = http_client(None).unwrap();
    warm(&client, gw.addr()).await;

    let (first, cached) = send(&client, gw.addr(), &turn('c', &["q1"], 4)).await;
    assert_eq!(cached, 0, "a new system prompt is cold everywhere");
    let mut history = vec!["q1"];
    for q in ["q2", "q3", "q4"] {
        history.push(q);
        let (backend, cached) = send(&client, gw.addr(), &turn('c', &history, 4)).await;
        assert_eq!(backend, first, "turn {} follows its history", history.len());
        assert!(
            cached >= 2000,
            "the backend served the history from cache: {cached}"
        );
    }

    // The holder fills up (max_concurrency 2) with the conversation's own long turns...
    let (h1, _s1) = hold(gw.addr(), turn('c', &history, 2000)).await;
    let (h2, _s2) = hold(gw.addr(), turn('c', &history, 2000)).await;
    assert_eq!((h1.as_str(), h2.as_str()), (first.as_str(), first.as_str()));
    // ...so the next turn goes to the other backend, which pays the prefill once...
    history.push("q5");
    let (other, cached) = send(&client, gw.addr(), &turn('c', &history, 4)).await;
    assert_ne!(other, first, "the holder is full");
    assert_eq!(cached, 0);
    // ...and holds the prefix too from then on.
    history.push("q6");
    let (again, cached) = send(&client, gw.addr(), &turn('c', &history, 4)).await;
    assert_eq!(again, other);
    assert!(cached >= 2000, "{cached}");

    let backends = support::get_json(gw.admin_addr(), "/admin/backends").await;
    for entry in backends["backends"].as_array().unwrap() {
        let index = &entry["prefix_index"];
        assert!(index["blocks"].as_u64().unwrap() > 0, "{entry}");
        assert!(index["reported_hit_rate"].as_f64().is_some(), "{entry}");
    }
}

#[tokio::test]
async fn the_index_learns_how_much_its_backend_keeps_from_the_cached_tokens_it_reports() {
    // Room for three of eight 500-token system prompts, asked for in turn: the engine has
    // always evicted the next one by the time it comes round again.
    let (fleet, a) = pod("a", 1500).await;
    let _fleet = support::FleetGuard(vec![fleet]);
    let backend = "    models: {m: m}\n";
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("a", a, "openai", backend)
    ))
    .await;
    let client = http_client(None).unwrap();
    let capacity = |backends: &Value| {
        backends["backends"][0]["prefix_index"]["capacity_blocks"]
            .as_u64()
            .unwrap()
    };
    let configured = capacity(&support::get_json(gw.admin_addr(), "/admin/backends").await);
    for _round in 0..4 {
        for system in "abcdefgh".chars() {
            let body = json!({"model": "m", "max_tokens": 2, "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "system", "content": system.to_string().repeat(2000)},
                             {"role": "user", "content": "q"}]});
            let (_, cached) = send(&client, gw.addr(), body.to_string().as_bytes()).await;
            assert_eq!(cached, 0, "an LRU of three never holds the next of eight");
        }
    }
    // The index first expected every prompt back, and each report said it was gone: it now
    // holds about what the engine does (1,500 tokens, 23 blocks of 64), not its default.
    let learned = capacity(&support::get_json(gw.admin_addr(), "/admin/backends").await);
    assert!(configured > 10_000, "{configured}");
    assert!(
        (16..=48).contains(&learned),
        "calibrated from {configured} to {learned} blocks"
    );
}

#[tokio::test]
async fn prompt_cache_key_joins_requests_whose_prompts_are_too_short_to_match() {
    let (_fleets, a, b) = two_pods().await;
    let gw = support::gateway(&gateway_config(a, b, "")).await;
    let client = http_client(None).unwrap();
    warm(&client, gw.addr()).await;
    let short = |key: &str, q: &str| {
        json!({"model": "m", "messages": [{"role": "user", "content": q}], "max_tokens": 4,
               "stream": true, "stream_options": {"include_usage": true}, "prompt_cache_key": key})
        .to_string()
        .into_bytes()
    };
    let (first, _) = send(&client, gw.addr(), &short("user-42", "hello")).await;
    for q in ["a", "bb", "ccc", "dddd", "eeeee"] {
        let (backend, _) = send(&client, gw.addr(), &short("user-42", q)).await;
        assert_eq!(backend, first);
    }
}

#[tokio::test]
async fn an_x_session_id_header_joins_requests_as_prompt_cache_key_does() {
    let (_fleets, a, b) = two_pods().await;
    let gw = support::gateway(&gateway_config(a, b, "")).await;
    let client = http_client(None).unwrap();
    warm(&client, gw.addr()).await;
    let short = |q: &str| {
        json!({"model": "m", "messages": [{"role": "user", "content": q}], "max_tokens": 4,
               "stream": true, "stream_options": {"include_usage": true}})
        .to_string()
        .into_bytes()
    };
    let session = [("x-session-id", "session-7")];
    let (first, _) = send_with(&client, gw.addr(), &short("hello"), &session).await;
    for q in ["a", "bb", "ccc", "dddd", "eeeee"] {
        let (backend, _) = send_with(&client, gw.addr(), &short(q), &session).await;
        assert_eq!(backend, first);
    }
}

#[tokio::test]
async fn with_the_index_off_no_backend_keeps_one() {
    let (_fleets, a, b) = two_pods().await;
    let gw = support::gateway(&gateway_config(a, b, "prefix_cache: {enabled: false}\n")).await;
    let backends = support::get_json(gw.admin_addr(), "/admin/backends").await;
    assert!(backends["backends"][0]["prefix_index"].is_null());
}

/// Waits up to two seconds for `check` to hold on what `admin` says of its backends.
async fn until_backends(admin: SocketAddr, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let got = support::get_json(admin, "/admin/backends").await;
        if check(&got) || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_sends_the_next_turn_where_another_replica_sent_the_first() {
    let redis = support::Redis::start().await;
    let (_fleets, a, b) = two_pods().await;
    let cluster = format!(
        "cluster: {{redis_url: '{}', key_prefix: prefix, sync_interval_ms: 20}}\n",
        redis.url()
    );
    let one = support::gateway(&gateway_config(a, b, &cluster)).await;
    let two = support::gateway(&gateway_config(a, b, &cluster)).await;
    let client = http_client(None).unwrap();
    // Curves from both pods, learned through replica one and shared with replica two.
    warm(&client, one.addr()).await;
    let (first, _) = send(&client, one.addr(), &turn('c', &["q1"], 4)).await;
    let blocks = |all: &Value| {
        all["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == first.as_str())
            .and_then(|b| b["prefix_index"]["blocks"].as_u64())
            .unwrap()
    };
    // Each prompt is 31 blocks of 64 tokens; a peer learns every fourth and the last: 8.
    let routed_by_one = blocks(&support::get_json(one.admin_addr(), "/admin/backends").await);
    assert_eq!(routed_by_one % 31, 0);
    // Replica two learns where replica one sent the conversation...
    let learned = until_backends(two.admin_addr(), |v| blocks(v) == routed_by_one / 31 * 8).await;
    assert_eq!(blocks(&learned), routed_by_one / 31 * 8, "{learned}");
    // ...and sends the second turn there, to the history in its cache.
    for q in ["q2", "q3"] {
        let (backend, cached) = send(&client, two.addr(), &turn('c', &["q1", q], 4)).await;
        assert_eq!(backend, first);
        assert!(cached >= 1900, "{cached}");
    }
}
