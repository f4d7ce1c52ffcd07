//! Cost of learning from one request on a curve whose windows are full: the sample alone, and
//! the sample plus the model rebuild that falls due every 100 ms on a busy backend (inline, on
//! the first token or the end that finds it due).
//!
//! Run: `cargo bench --bench curve`. Results are in docs/benchmarks/overhead.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::time::Instant;
use tpsgate::{Curve, FirstToken, Observation, Outcome};

/// A backend seen at every concurrency from 1 to 64 for long enough to fill every window it
/// touched: 256 samples in each of 12 speed buckets and 20 TTFT levels.
fn full_curve(t0: Instant) -> Curve {
    let mut curve = Curve::new(300.0);
    let mut at = t0;
    for round in 0..300u32 {
        for c in 1..=64u32 {
            at += Duration::from_millis(1);
            let c = f64::from(c);
            let jitter = f64::from(round % 7) * 0.001;
            curve.first_token(&first_token(at, c, jitter));
            curve.record(&Observation {
                at,
                outcome: Outcome::Completed,
                ttft: Some(0.02 + 0.002 * c + jitter),
                tpot: Some(0.010 + 0.001 * c + jitter / 10.0),
                output_tokens: 200,
                estimated: false,
                prompt_tokens: Some(500),
                concurrency: Some(c),
                neighbours: 0.0,
            });
        }
    }
    curve
}

fn first_token(at: Instant, c: f64, jitter: f64) -> FirstToken {
    FirstToken {
        at,
        ttft: 0.02 + 0.002 * c + jitter,
        prompt_tokens: Some(500 + (jitter * 1e5) as u64),
        admitted_with: c,
        queued_with: 0,
    }
}

fn learn(c: &mut Criterion) {
    let t0 = Instant::now();
    let mut group = c.benchmark_group("curve_first_token");
    for (name, step) in [
        ("sample_only", Duration::from_micros(10)),
        ("sample_and_rebuild", Duration::from_millis(101)),
    ] {
        let mut curve = full_curve(t0);
        let mut at = t0 + Duration::from_secs(60);
        let mut i = 0u32;
        group.bench_function(name, |b| {
            b.iter(|| {
                at += step;
                i = i.wrapping_add(1);
                let c = f64::from(i % 64 + 1);
                curve.first_token(black_box(&first_token(at, c, f64::from(i % 7) * 0.001)));
                black_box(curve.model().is_some())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, learn);
criterion_main!(benches);
