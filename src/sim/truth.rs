//! The analytic curve of a simulated backend (`GET /sim/truth`), so that tests and benchmarks can
//! score what a client or the gateway measured against what the engine really does.
//!
//! The numbers describe a closed loop: `c` clients, each sending its next request as soon as the
//! last one ends, every request with the same prompt and output length. They follow from the
//! timing rule in [`super::engine`]:
//!
//! - `b = min(c, max_batch)` requests decode at once; one step takes `s(b)`.
//! - The other `b - 1` requests are each admitted once per lifetime `L`, so others' admissions
//!   come at rate `λ = (b - 1) / L`, each stalling decode for `p` (the prefill time); decode
//!   therefore runs a share `1 - λp` of the time.
//! - TPOT: `s(b) / (1 - λp)`, solved as a fixed point with `L = p + s(b) + (T - 1) * TPOT`
//!   (`T` = output tokens).
//! - TTFT: `extra_ttft + W + λp · p / 2 + p + s(b) + (k - 1) * TPOT`: what remains of a prefill
//!   in progress on arrival (one is, a share `λp` of the time, half done on average), the own
//!   prefill and first step, and the `k - 1` further steps that fill the first chunk
//!   (`k = min(tokens_per_chunk, T)`), stretched by others' prefills landing meanwhile;
//!   `W = (c - b) * L / b` is the FIFO wait once the batch is full (Little's law on the `b`
//!   slots).
//!
//! Arrivals are assumed spread over the lifetime, not synchronised in waves; `tpsgate bench`
//! staggers its workers so that this holds.
//! - System TPS: `b / TPOT`.

use serde::Serialize;

use super::config::Timing;

/// One point of the curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TruthPoint {
    /// Requests in flight (closed-loop clients).
    pub concurrency: usize,
    /// Tokens per second one client sees once output flows (1 / TPOT).
    pub per_user_tps: f64,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Output tokens per second across all running requests.
    pub system_tps: f64,
}

/// The curve of one backend for a given prompt and output length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Truth {
    /// Backend name.
    pub backend: String,
    /// Prompt tokens assumed.
    pub prompt_tokens: u32,
    /// Output tokens assumed.
    pub output_tokens: u32,
    /// Points for concurrency 1 ..= 2 * max_batch (at least 8).
    pub points: Vec<TruthPoint>,
}

/// Smallest and largest concurrency a curve lists up to, whatever `max_batch` says (a serial
/// backend still gets enough points to show its queue).
const MIN_POINTS: usize = 8;
const MAX_POINTS: usize = 4096;

/// The analytic point at concurrency `c` (>= 1) for a backend that streams one token per
/// chunk; see [`point_chunked`].
pub fn point(timing: &Timing, c: usize, prompt_tokens: u32, output_tokens: u32) -> TruthPoint {
    point_chunked(timing, c, prompt_tokens, output_tokens, 1)
}

/// The analytic point when tokens go out `per_chunk` at a time: the first content then arrives
/// after `min(per_chunk, T)` steps instead of one.
pub(crate) fn point_chunked(
    timing: &Timing,
    c: usize,
    prompt_tokens: u32,
    output_tokens: u32,
    per_chunk: u32,
) -> TruthPoint {
    let c = c.max(1);
    let b = c.min(timing.max_batch);
    let s = timing.step(b);
    let p = timing.prefill(prompt_tokens);
    let t = f64::from(output_tokens.max(1));
    let first_steps = f64::from(per_chunk.clamp(1, output_tokens.max(1)));
    let others = (b - 1) as f64;
    // Share of time decode runs; the fixed point converges in a few rounds since λp < 1 whenever
    // a lifetime holds more than the others' prefills.
    let mut running = 1.0;
    let mut tpot = s;
    for _ in 0..100 {
        let lifetime = p + s + (t - 1.0) * tpot;
        running = (1.0 - others * p / lifetime).max(1e-6);
        tpot = s / running;
    }
    let lifetime = p + s + (t - 1.0) * tpot;
    let wait = (c - b) as f64 * lifetime / b as f64;
    TruthPoint {
        concurrency: c,
        per_user_tps: 1.0 / tpot,
        ttft_s: timing.extra_ttft.as_secs_f64()
            + wait
            + (1.0 - running) * p / 2.0
            + p
            + s
            + (first_steps - 1.0) * tpot,
        system_tps: b as f64 / tpot,
    }
}

/// The whole curve for concurrency 1 ..= 2 * max_batch (at least 8).
pub(crate) fn curve(
    backend: &str,
    timing: &Timing,
    per_chunk: u32,
    prompt_tokens: u32,
    output_tokens: u32,
) -> Truth {
    let top = (2 * timing.max_batch).clamp(MIN_POINTS, MAX_POINTS);
    Truth {
        backend: backend.to_owned(),
        prompt_tokens,
        output_tokens,
        points: (1..=top)
            .map(|c| point_chunked(timing, c, prompt_tokens, output_tokens, per_chunk))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn timing(max_batch: usize) -> Timing {
        Timing {
            step_base: 0.010,
            step_per_seq: 0.001,
            step_per_seq_until: usize::MAX,
            max_batch,
            prefill_tokens_per_s: 1000.0,
            prefill_stall: 0.0,
            speed_spread: 0.0,
            jitter: 0.0,
            extra_ttft: Duration::from_millis(5),
            default_max_tokens: 16,
            reply_tokens: None,
            tool_call_share: 1.0,
        }
    }

    #[test]
    fn without_prefill_per_user_tps_is_one_over_the_step() {
        let pt = point(&timing(8), 4, 0, 100);
        assert!((pt.per_user_tps - 1.0 / 0.014).abs() < 1e-9);
        assert!((pt.ttft_s - 0.019).abs() < 1e-9);
        assert!((pt.system_tps - 4.0 / 0.014).abs() < 1e-9);
    }

    #[test]
    fn per_user_tps_falls_and_system_tps_rises_with_concurrency() {
        let truth = curve("x", &timing(8), 1, 10, 100);
        assert_eq!(truth.points.len(), 16);
        assert_eq!(curve("x", &timing(1), 1, 0, 10).points.len(), 8);
        for w in truth.points[..8].windows(2) {
            assert!(w[1].per_user_tps < w[0].per_user_tps);
            assert!(w[1].system_tps > w[0].system_tps);
        }
    }

    #[test]
    fn beyond_max_batch_speed_is_flat_and_ttft_grows_linearly() {
        let t = timing(1);
        let (a, b, c) = (
            point(&t, 1, 0, 10),
            point(&t, 2, 0, 10),
            point(&t, 3, 0, 10),
        );
        assert_eq!(a.per_user_tps, b.per_user_tps);
        // One request's lifetime is 10 steps of 11 ms.
        assert!((b.ttft_s - a.ttft_s - 0.110).abs() < 1e-9);
        assert!((c.ttft_s - b.ttft_s - 0.110).abs() < 1e-9);
    }
}
