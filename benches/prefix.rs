//! Cost of the prefix index on the request path: hashing a request's prompt into chained
//! blocks ([`tpsgate::prefix_of`]) at 1, 8, 32 and 128 KB prompts, and looking a
//! prompt up in one backend's index that holds it whole (what each candidate costs a routing
//! decision), beside reading the same body (classify's peek, which every routed request pays)
//! and the routing decision itself (`cargo bench --bench route`).
//!
//! Run: `cargo bench --bench prefix`. Results are in docs/benchmarks/overhead.md ("Prefix index").

#![expect(
    clippy::expect_used,
    reason = "a benchmark whose setup fails has nothing to measure"
)]

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tpsgate::Endpoint;
use tpsgate::config::{PrefixIndexSize, PrefixRouting};
use tpsgate::peek;
use tpsgate::prefix_of;
use tpsgate::{Hit, PrefixIndex};

/// A chat request whose system prompt is about `bytes` long, then a short question.
fn chat(bytes: usize) -> Bytes {
    let system = "You are a careful assistant. ".repeat(bytes.div_ceil(29));
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "What does the gateway do with my prompt?"},
            ],
            "max_tokens": 256,
            "stream": true,
        }))
        .expect("JSON"),
    )
}

fn prefix(c: &mut Criterion) {
    let routing = PrefixRouting {
        block_tokens: 64,
        min_match_tokens: 256,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let mut read = c.benchmark_group("prefix_peek");
    for kb in [1usize, 8, 32, 128] {
        let body = chat(kb * 1024);
        read.throughput(Throughput::Bytes(body.len() as u64));
        read.bench_with_input(
            BenchmarkId::from_parameter(format!("{kb}KB")),
            &kb,
            |b, _| {
                b.iter(|| black_box(peek(Endpoint::Chat, black_box(&body))));
            },
        );
    }
    read.finish();
    let mut hash = c.benchmark_group("prefix_hash");
    let mut lookup_cases = Vec::new();
    for kb in [1usize, 8, 32, 128] {
        let body = chat(kb * 1024);
        let classified = peek(Endpoint::Chat, &body).expect("a valid request");
        let req = http::Request::new(body.clone());
        hash.throughput(Throughput::Bytes(body.len() as u64));
        hash.bench_with_input(
            BenchmarkId::from_parameter(format!("{kb}KB")),
            &kb,
            |b, _| {
                b.iter(|| black_box(prefix_of(&req, &classified, "m", routing)));
            },
        );
        lookup_cases.push((kb, prefix_of(&req, &classified, "m", routing)));
    }
    hash.finish();
    let mut lookup = c.benchmark_group("prefix_lookup");
    for (kb, prompt) in &lookup_cases {
        let index = PrefixIndex::new(PrefixIndexSize {
            blocks: 1 << 16,
            block_tokens: 64,
            ttl: Duration::from_secs(600),
        });
        let now = tokio::time::Instant::now();
        index.routed(prompt, Hit::default(), 0, now);
        lookup.bench_with_input(
            BenchmarkId::from_parameter(format!("{kb}KB")),
            kb,
            |b, _| {
                b.iter(|| black_box(index.expected(prompt, tokio::time::Instant::now())));
            },
        );
    }
    lookup.finish();
    // What the chosen backend pays: its index touches every block of the prompt, last first.
    let mut routed = c.benchmark_group("prefix_routed");
    for (kb, prompt) in &lookup_cases {
        let index = PrefixIndex::new(PrefixIndexSize {
            blocks: 1 << 16,
            block_tokens: 64,
            ttl: Duration::from_secs(600),
        });
        routed.bench_with_input(
            BenchmarkId::from_parameter(format!("{kb}KB")),
            kb,
            |b, _| {
                b.iter(|| index.routed(prompt, Hit::default(), 0, tokio::time::Instant::now()));
            },
        );
    }
    routed.finish();
}

criterion_group!(benches, prefix);
criterion_main!(benches);
