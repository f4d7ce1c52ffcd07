//! The simulator's prefix cache is the truth the gateway's index is scored against: what a hit
//! is worth in TTFT, and what usage reports.

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use tpsgate::sim::config::{EngineRaw, PrefixCacheRaw, StreamRaw};

use crate::support;

/// One backend whose prefill is slow enough to see (1,000 tokens/s), with a cache of
/// `tokens` in 16-token blocks.
async fn cached_backend(tokens: u32) -> (tpsgate::sim::Fleet, std::net::SocketAddr) {
    let mut spec = support::spec(
        "cached",
        EngineRaw {
            prefill_tokens_per_s: 1000.0,
            ..support::engine(2.0, 0.0, 64)
        },
        StreamRaw::default(),
        vec![],
    );
    let raw = PrefixCacheRaw {
        tokens,
        block_tokens: 16,
    };
    spec.raw.prefix_cache = Some(raw);
    let spec = spec.raw.validate("test").unwrap();
    support::start(spec).await
}

/// A chat turn: a 2,000-token system prompt (8,000 bytes), then `turns` user questions.
fn chat(system: char, turns: &[&str]) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system.to_string().repeat(8000)})];
    for (i, q) in turns.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": "an answer of some length"}));
        }
        messages.push(json!({"role": "user", "content": q}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": 2, "stream": true,
           "stream_options": {"include_usage": true}})
}

/// First content after sending, and the usage the stream reported.
async fn turn(addr: std::net::SocketAddr, body: &Value) -> (Duration, Value) {
    let ex = support::post(addr, "/v1/chat/completions", body).await;
    assert_eq!(ex.status, StatusCode::OK);
    let ttft = ex
        .frames
        .iter()
        .find(|(_, b)| b.windows(9).any(|w| w == b"\"content\""))
        .map(|(t, _)| *t)
        .unwrap();
    let usage = ex
        .data_events()
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find_map(|e| e.get("usage").cloned())
        .unwrap();
    (ttft, usage)
}

#[tokio::test]
async fn a_second_turn_prefills_only_what_the_cache_lacks_and_usage_says_what_was_cached() {
    let (_fleet, addr) = cached_backend(100_000).await;
    let (cold, first) = turn(addr, &chat('a', &["what is a gateway?"])).await;
    assert_eq!(first["prompt_tokens_details"]["cached_tokens"], 0);
    let (warm, second) = turn(addr, &chat('a', &["what is a gateway?", "and a cache?"])).await;
    let prompt = second["prompt_tokens"].as_u64().unwrap();
    let cached = second["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The first turn's whole blocks: its 2,005 tokens hold 125 blocks of 16.
    assert_eq!(cached, 2000, "usage: {second}");
    assert!(prompt > cached);
    // Cold: 2,005 tokens at 1,000/s. Warm: about 15 uncached tokens.
    assert!(cold > Duration::from_millis(1900), "cold TTFT {cold:?}");
    assert!(warm < Duration::from_millis(200), "warm TTFT {warm:?}");
    let stats = support::get_json(addr, "/sim/stats").await;
    assert_eq!(stats["prefix_cache"]["cached_tokens"], 2000);
}

#[tokio::test]
async fn a_shared_system_prompt_is_a_hit_for_every_conversation_that_starts_with_it() {
    let (_fleet, addr) = cached_backend(100_000).await;
    turn(addr, &chat('s', &["first user"])).await;
    let (_, other) = turn(addr, &chat('s', &["a different user entirely"])).await;
    assert_eq!(other["prompt_tokens_details"]["cached_tokens"], 2000);
    let (_, unrelated) = turn(addr, &chat('t', &["first user"])).await;
    assert_eq!(unrelated["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn a_cache_smaller_than_the_working_set_forgets_the_tail_of_the_least_recent_prompt() {
    // Room for 187 blocks: one 2,000-token system prompt (125 blocks) and half of another.
    let (_fleet, addr) = cached_backend(3000).await;
    turn(addr, &chat('a', &["q"])).await;
    turn(addr, &chat('b', &["q"])).await;
    let (_, again_a) = turn(addr, &chat('a', &["q"])).await;
    // b pushed out a's last 63 blocks; its first 62 stayed (992 tokens).
    assert_eq!(again_a["prompt_tokens_details"]["cached_tokens"], 992);
    let (_, again_a) = turn(addr, &chat('a', &["q"])).await;
    assert_eq!(again_a["prompt_tokens_details"]["cached_tokens"], 2000);
}

#[tokio::test]
async fn anthropic_usage_reports_cache_reads_apart_from_input_tokens() {
    let (_fleet, addr) = cached_backend(100_000).await;
    let body = |q: &str| {
        json!({"model": "m", "system": "z".repeat(8000), "max_tokens": 2, "stream": false,
               "messages": [{"role": "user", "content": q}]})
    };
    support::post(addr, "/v1/messages", &body("one")).await;
    let ex = support::post(addr, "/v1/messages", &body("two")).await;
    let usage = &ex.json()["usage"];
    assert_eq!(usage["cache_read_input_tokens"], 2000);
    assert_eq!(
        usage["input_tokens"], 1,
        "the 2,001-token prompt less what was read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_sends_conversations_that_re_send_their_history_and_reports_the_cached_share() {
    let (_fleet, addr) = cached_backend(1_000_000).await;
    let url = support::base(addr);
    let args = [
        "--url",
        url.as_str(),
        "--model",
        "m",
        "--rate",
        "4",
        "--duration",
        "1",
        "--seed",
        "7",
        "--max-tokens",
        "4",
        "--shared-prefix",
        "groups=2,system=400,question=20",
        "--conversation",
        "turns=3,think_s=0.05",
    ];
    let level = crate::binary::bench_json(&args).await.remove(0);
    let requests = level["requests"].as_u64().unwrap();
    assert!(
        requests >= 3 && requests % 3 == 0,
        "three turns a conversation: {level}"
    );
    assert_eq!(level["errors"], 0, "{level}");
    // Two system prompts shared by every conversation, and each turn's history: most of
    // the prompt tokens come from the cache.
    let cached = level["cached_share"].as_f64().unwrap();
    assert!(cached > 0.5, "{level}");
    assert!(
        level["mix"]
            .as_str()
            .unwrap()
            .contains("conversations turns=3"),
        "{level}"
    );
    // The last turns re-sent the history: the simulator saw prompts grow within a conversation.
    let sizes: Vec<u64> = support::seen(addr)
        .await
        .iter()
        .filter_map(|r| r["prompt_tokens"].as_u64())
        .collect();
    assert!(sizes.iter().any(|&p| p > 420 + 20), "{sizes:?}");
}
