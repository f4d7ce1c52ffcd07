//! Cost of one routing decision at fleet scale: the router asks every candidate's curve what one
//! more request would see there, and picks among the feasible. With DNS discovery a model may
//! have hundreds of backends, so the decision must stay linear in the candidates with a small
//! constant. Each backend has a taught curve (its own speed slope) and a few requests in flight;
//! each iteration routes one interactive request and gives its slot back.
//!
//! Run: `cargo bench --bench route`. Results are in docs/benchmarks/overhead.md.

#![expect(
    clippy::expect_used,
    reason = "a bench whose setup fails should stop loudly"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tokio::time::Instant;
use tpsgate::config::BackendDialect;
use tpsgate::{Ask, Router};
use tpsgate::{Backend, InFlightGuard, Line};
use tpsgate::{FirstToken, Observation, Outcome};

// The gateway's allocator (src/main.rs), so that a decision costs what it costs there.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A router over `n` backends serving `m`, each taught a batching curve, with an interactive
/// class (>= 20 tok/s at the median, TTFT <= 1 s) that sheds on a miss. Backend `i` has
/// `streams(i)` requests in flight.
fn router(n: usize, streams: fn(usize) -> usize) -> (Router, Vec<InFlightGuard>) {
    let list: String = (0..n)
        .map(|i| {
            format!(
                "- {{name: b{i}, url: 'http://127.0.0.1:1', dialect: openai, models: {{m: m}}}}\n"
            )
        })
        .collect();
    let text = format!(
        "backends:\n{list}classes:\n\
         - {{name: interactive, min_tps: 20, max_ttft_ms: 1000, on_miss: shed}}\n\
         routing: {{exploration: 0}}\n"
    );
    let config = tpsgate::config::parse(&text, |_| None).expect("bench config");
    let line = Arc::new(Line::new(config.classes.len()));
    let backends: Vec<Arc<Backend>> = config
        .backends
        .iter()
        .map(|b| Backend::new(b.clone(), 300.0, 1, Arc::clone(&line), None).expect("backend"))
        .collect();
    let now = Instant::now();
    for (i, backend) in backends.iter().enumerate() {
        let per_seq = 0.0005 + 0.0001 * (i % 7) as f64;
        for c in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0] {
            for k in 0..8 {
                // Prompts of 64 to 512 tokens, prefilled at 10,000 a second: the curve knows
                // the backend's prefill rate, and so what a prompt's prefill stalls.
                let prompt = 64_u64 << (k % 4);
                backend.first_token(
                    "m",
                    &FirstToken {
                        at: now,
                        ttft: 0.05 + 0.002 * c + prompt as f64 * 1e-4,
                        prompt_tokens: Some(prompt),
                        admitted_with: c,
                        queued_with: 0,
                    },
                );
                backend.record(
                    "m",
                    &Observation {
                        at: now,
                        outcome: Outcome::Completed,
                        ttft: Some(0.05 + 0.002 * c),
                        tpot: Some(0.010 + per_seq * c),
                        output_tokens: 128,
                        estimated: false,
                        prompt_tokens: Some(64),
                        concurrency: Some(c),
                        neighbours: 0.0,
                    },
                );
            }
        }
    }
    // Requests in flight on each, each streaming 128 tokens at the class's pace: every
    // candidate's streams are asked what this prompt's prefill would cost them.
    let held = backends
        .iter()
        .enumerate()
        .flat_map(|(i, b)| {
            (0..streams(i)).map(move |_| {
                let mut slot = InFlightGuard::try_admit(b, Some(0)).expect("slot");
                slot.pace(128, Some(20.0));
                slot.first_token_came(now);
                slot.progress(1, now);
                slot
            })
        })
        .collect();
    let router = Router::new(
        backends,
        Default::default(),
        config.classes,
        config.routing,
        line,
    );
    (router, held)
}

fn route(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = runtime.enter();
    // `no_prefix`: a 64-token prompt, no prefix asked about (as before the prefix index, or
    // with `prefix_cache.enabled: false`). `prefix`: the default path, a 2,000-token prompt (31
    // blocks of 64) whose every candidate's index is looked up; each decision holds the prompt
    // on its backend, so later decisions find holders, as a conversation's turns do. Both with a
    // few requests in flight on each backend (`i % 5`, so that occupancies differ); `busy`: the
    // default path with 32 streams in flight on every backend, where a decision that scanned
    // each candidate's streams would cost the most. `fresh`: `busy`, but each decision's prompt
    // is one no backend holds (a new conversation's), so every candidate has its whole prefill
    // to charge to the streams there.
    let prompt = tpsgate::RequestPrefix {
        hashes: (1..=31).collect(),
        hint: None,
    };
    let few: fn(usize) -> usize = |i| i % 5;
    let busy: fn(usize) -> usize = |_| 32;
    for (name, prefix, prompt_tokens, streams, fresh) in [
        ("route_decision/no_prefix", None, 64, few, false),
        ("route_decision/prefix", Some(&prompt), 2000, few, false),
        ("route_decision/busy", Some(&prompt), 2000, busy, false),
        ("route_decision/fresh", Some(&prompt), 2000, busy, true),
    ] {
        let mut group = c.benchmark_group(name);
        for n in [4usize, 8, 64, 256] {
            let (router, _held) = router(n, streams);
            let slo = router.classes()[0].slo;
            let mut conversation = 0_u64;
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| {
                    let new_prompt;
                    let prefix = match prefix {
                        Some(_) if fresh => {
                            conversation += 1;
                            new_prompt = tpsgate::RequestPrefix {
                                hashes: (0..31)
                                    .map(|k| {
                                        (conversation << 8 | k).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                                    })
                                    .collect(),
                                hint: None,
                            };
                            Some(&new_prompt)
                        }
                        other => other,
                    };
                    let ask = Ask {
                        model: "m",
                        reach: tpsgate::Reach::own(BackendDialect::Openai),
                        prompt_tokens,
                        max_tokens: Some(128),
                        class: Some(0),
                        slo,
                        received: Instant::now(),
                        now: Instant::now(),
                        avoid: &[],
                        prefix,
                    };
                    // The decision (and the slot it took) is dropped at once.
                    black_box(router.route(&ask).expect("a decision"))
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, route);
criterion_main!(benches);
