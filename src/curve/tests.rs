use std::time::Duration;

use super::*;

/// A synthetic batching backend: TPOT = 10 ms + 1 ms per request, TTFT = 20 ms + 2 ms per
/// request + P / 5000.
fn observation(at: Instant, c: f64, prompt: u64, slow: f64) -> Observation {
    Observation {
        at,
        outcome: Outcome::Completed,
        ttft: Some(0.020 + 0.002 * c + prompt as f64 / 5000.0),
        tpot: Some(slow * (0.010 + 0.001 * c)),
        output_tokens: 100,
        estimated: false,
        prompt_tokens: Some(prompt),
        concurrency: Some(c),
        neighbours: 0.0,
    }
}

/// One request of [`observation`] at `c` in flight whose tokens came every `tpot` seconds,
/// with `neighbours` running beside it on its device.
fn beside(now: Instant, c: f64, tpot: f64, neighbours: f64) -> Observation {
    Observation {
        tpot: Some(tpot),
        neighbours,
        ..observation(now, c, 64, 1.0)
    }
}

/// One request of [`observation`] as the proxy reports it: its first token, then its end.
fn learn(curve: &mut Curve, obs: &Observation) {
    curve.first_token(&FirstToken {
        at: obs.at,
        ttft: obs.ttft.unwrap(),
        prompt_tokens: obs.prompt_tokens,
        admitted_with: obs.concurrency.unwrap(),
        queued_with: 0,
    });
    curve.record(obs);
}

#[test]
fn buckets_round_to_the_nearest_level_in_log_space() {
    assert_eq!(BUCKETS[bucket_of(0.3)], 1);
    assert_eq!(BUCKETS[bucket_of(1.4)], 1);
    assert_eq!(BUCKETS[bucket_of(1.5)], 2);
    assert_eq!(BUCKETS[bucket_of(5.0)], 5);
    assert_eq!(BUCKETS[bucket_of(9.4)], 9);
    assert_eq!(BUCKETS[bucket_of(30.0)], 32);
    assert_eq!(BUCKETS[bucket_of(1e6)], 2048);
    assert_eq!(TTFT_LEVELS[ttft_bucket_of(0.0)], 1);
    assert_eq!(TTFT_LEVELS[ttft_bucket_of(9.0)], 9);
    assert_eq!(TTFT_LEVELS[ttft_bucket_of(16.0)], 16);
    assert_eq!(TTFT_LEVELS[ttft_bucket_of(19.0)], 16);
    assert_eq!(TTFT_LEVELS[ttft_bucket_of(21.0)], 24);
    assert_eq!(TTFT_LEVELS[ttft_bucket_of(1e6)], 2048);
}

#[test]
fn the_nearest_level_is_the_one_with_the_smallest_log_distance() {
    let by_logs = |levels: &[u32], x: f64| {
        let ln = x.max(1.0).ln();
        (0..levels.len())
            .min_by(|&a, &b| {
                let d = |i: usize| (f64::from(levels[i]).ln() - ln).abs();
                d(a).total_cmp(&d(b))
            })
            .unwrap_or(0)
    };
    for step in 0..20_000 {
        let c = 0.5 + f64::from(step) * 0.25;
        assert_eq!(bucket_of(c), by_logs(&BUCKETS, c), "concurrency {c}");
        if c >= 16.5 {
            assert_eq!(
                ttft_bucket_of(c),
                15 + by_logs(&TTFT_LEVELS[15..], c),
                "occupancy {c}"
            );
        }
    }
}

#[test]
fn the_fit_recovers_a_known_backend() {
    let now = Instant::now();
    let mut curve = Curve::default();
    for (i, c) in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0].into_iter().enumerate() {
        for p in [64, 512, 2048] {
            learn(&mut curve, &observation(now, c, p + i as u64, 1.0));
        }
    }
    let fit = curve.fit(now).unwrap();
    assert!((fit.tpot_base_s - 0.010).abs() < 1e-6, "{fit:?}");
    assert!((fit.tpot_per_seq_s - 0.001).abs() < 1e-7, "{fit:?}");
    assert!((fit.ttft_per_seq_s - 0.002).abs() < 1e-6, "{fit:?}");
    assert!(
        (fit.prefill_tokens_per_s.unwrap() - 5000.0).abs() < 1.0,
        "{fit:?}"
    );
    // Between buckets and beyond them, the fit answers.
    let p = curve.predict(64.0, 0, now).unwrap();
    assert!((p.per_user_tps_p50 - 1.0 / 0.074).abs() < 0.01, "{p:?}");
    assert!(p.confidence < 0.01);
    // Where a bucket has evidence, its own quantiles answer.
    let p = curve.predict(8.0, 0, now).unwrap();
    assert!((p.per_user_tps_p50 - 1.0 / 0.018).abs() < 1e-6);
}

/// A curve that learned TTFT = 20 ms + 2 ms per request + P / 5000 (plus noise) from
/// first tokens at occupancies 1 to 8, with prompt sizes drawn by `prompt(i)`.
fn ttft_curve(prompt: impl Fn(u64) -> u64) -> (Curve, Instant) {
    let now = Instant::now();
    let mut curve = Curve::default();
    // One completed request: a model needs speed too.
    curve.record(&observation(now, 1.0, 76, 1.0));
    let mut seed = 7_u64;
    for i in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Odd requests 4 ms slower, then ±1 ms at random: with sizes 76 and 77 by parity,
        // a token would seem to cost 8 ms.
        let parity = if i % 2 == 1 { 0.004 } else { -0.004 };
        let noise = parity + ((seed >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.002;
        let (c, p) = ((i % 8 + 1) as f64, prompt(i));
        curve.first_token(&FirstToken {
            at: now,
            ttft: 0.020 + 0.002 * c + p as f64 / 5000.0 + noise,
            prompt_tokens: Some(p),
            admitted_with: c,
            queued_with: 0,
        });
    }
    (curve, now)
}

#[test]
fn a_prefill_rate_is_fitted_only_from_a_real_spread_of_prompt_sizes() {
    // Equal prompts whose size estimate moves by a token: no rate, and a 1,000-token
    // prompt is not predicted from one.
    let (constant, now) = ttft_curve(|i| 76 + i % 2);
    let fit = constant.fit(now).unwrap();
    assert_eq!(fit.prefill_tokens_per_s, None, "{fit:?}");
    assert!(
        fit.ttft_base_s >= 0.0 && fit.ttft_per_seq_s >= 0.0,
        "{fit:?}"
    );
    let near = |a: f64, b: f64| (a - b).abs() < 0.002;
    // The base is a lone request's TTFT: 20 ms + 2 ms for its own place in the count.
    let expect = 0.022 + 76.5 / 5000.0;
    assert!(near(fit.ttft_base_s, expect), "{fit:?}");
    // Two sizes far apart, and a wide mix, tell the rate.
    let two_valued = |i: u64| -> u64 { if i.is_multiple_of(3) { 1000 } else { 100 } };
    let wide = |i: u64| 50 + (i * 7919) % 1950;
    for (name, prompt) in [
        ("two-valued", &two_valued as &dyn Fn(u64) -> u64),
        ("wide", &wide),
    ] {
        let (curve, now) = ttft_curve(prompt);
        let fit = curve.fit(now).unwrap();
        let rate = fit.prefill_tokens_per_s.unwrap_or_default();
        assert!((rate - 5000.0).abs() < 250.0, "{name}: {fit:?}");
        assert!(near(fit.ttft_base_s, 0.022), "{name}: {fit:?}");
        assert!(
            (fit.ttft_per_seq_s - 0.002).abs() < 0.0005,
            "{name}: {fit:?}"
        );
    }
}

#[test]
fn a_mostly_cached_prompt_waits_as_long_as_the_others_and_prefills_only_its_own_tokens() {
    // A third of the requests miss the prefix cache (1,000 tokens to prefill, 200 ms at
    // 5,000 tokens/s), the rest hit it (100 tokens, 20 ms): every level's TTFT p90 is a
    // miss. A hit joining at 4 in flight waits 28 ms for those ahead, then prefills 20 ms.
    let two_valued = |i: u64| -> u64 { if i.is_multiple_of(3) { 1000 } else { 100 } };
    let (curve, now) = ttft_curve(two_valued);
    let wait = 0.020 + 0.002 * 4.0;
    let hit = curve.predict(4.0, 100, now).unwrap();
    assert!((hit.ttft_p50_s - (wait + 0.020)).abs() < 0.006, "{hit:?}");
    assert!(hit.ttft_p90_s < wait + 0.020 + 0.010, "{hit:?}");
    let miss = curve.predict(4.0, 1000, now).unwrap();
    assert!((miss.ttft_p90_s - (wait + 0.200)).abs() < 0.020, "{miss:?}");
}

#[test]
fn every_fitted_ttft_parameter_is_physically_possible() {
    let now = Instant::now();
    let mut curve = Curve::default();
    curve.record(&observation(now, 1.0, 76, 1.0));
    // Steeper than any line from a non-negative base: unconstrained, t0 would be -100 ms.
    // And prompt sizes that move opposite to TTFT: unconstrained, a negative rate.
    for i in 0..64_u64 {
        let c = (i % 8 + 1) as f64;
        curve.first_token(&FirstToken {
            at: now,
            ttft: (0.150 * c - 0.100).max(0.001),
            prompt_tokens: Some(2000 - 200 * (i % 8)),
            admitted_with: c,
            queued_with: 0,
        });
    }
    let fit = curve.fit(now).unwrap();
    assert!(fit.ttft_base_s >= 0.0, "{fit:?}");
    assert!(fit.ttft_per_seq_s > 0.0, "{fit:?}");
    assert!(
        fit.prefill_tokens_per_s
            .is_none_or(|r| r > 0.0 && r.is_finite()),
        "{fit:?}"
    );
    let p = curve.predict(8.0, 5000, now).unwrap();
    assert!(p.ttft_p50_s > 0.0 && p.ttft_p50_s < 2.0, "{p:?}");
}

#[test]
fn the_curve_follows_a_backend_that_slows_down_within_two_half_lives() {
    let t0 = Instant::now();
    let mut curve = Curve::new(60.0);
    // Ten minutes at normal speed, one sample a second at concurrency 4...
    for s in 0..600 {
        learn(
            &mut curve,
            &observation(t0 + Duration::from_secs(s), 4.0, 100, 1.0),
        );
    }
    // ...then the backend becomes twice as slow.
    let slow_from = t0 + Duration::from_secs(600);
    for s in 0..=120 {
        let obs = observation(slow_from + Duration::from_secs(s), 4.0, 100, 2.0);
        learn(&mut curve, &obs);
    }
    let after_two_half_lives = slow_from + Duration::from_secs(120);
    let p = curve.predict(4.0, 100, after_two_half_lives).unwrap();
    let slow_tps = 1.0 / (2.0 * 0.014);
    assert!(
        (p.per_user_tps_p50 - slow_tps).abs() / slow_tps < 0.05,
        "{p:?}"
    );
}

#[test]
fn a_queue_shows_in_predicted_ttft_at_its_first_token_not_when_the_request_ends() {
    // A one-slot server: alone, 50 ms to the first token; second in line, 3 s.
    let now = Instant::now();
    let mut curve = Curve::default();
    for _ in 0..10 {
        let mut obs = observation(now, 1.0, 64, 1.0);
        obs.ttft = Some(0.05);
        learn(&mut curve, &obs);
    }
    let before = curve.model().unwrap().predict(2.0, 0.0, 64);
    assert!(before.ttft_p50_s < 0.1, "nothing seen at 2 yet: {before:?}");
    // The second request's first token arrives; it is still decoding.
    curve.first_token(&FirstToken {
        at: now,
        ttft: 3.0,
        prompt_tokens: Some(64),
        admitted_with: 2.0,
        queued_with: 0,
    });
    let after = curve.model().unwrap().predict(2.0, 0.0, 64);
    assert!(after.ttft_p50_s > 2.5, "{after:?}");
}

#[test]
fn speed_seen_behind_a_queue_is_no_evidence_for_joining_one() {
    // One slot: each request found it free, then decoded with three more waiting behind.
    let now = Instant::now();
    let mut curve = Curve::default();
    for _ in 0..10 {
        let obs = observation(now, 4.0, 64, 1.0);
        curve.first_token(&FirstToken {
            at: now,
            ttft: 0.05,
            prompt_tokens: Some(64),
            admitted_with: 1.0,
            queued_with: 0,
        });
        curve.record(&obs);
    }
    let model = curve.model().unwrap();
    assert!(!model.predict(2.0, 0.0, 64).beyond_evidence);
    assert!(model.predict(3.0, 0.0, 64).beyond_evidence);
}

#[test]
fn ttft_jumps_right_after_a_batch_limit_and_stays_up_beyond_it() {
    // Eight slots: the ninth request in waits for one to free.
    let now = Instant::now();
    let mut curve = Curve::default();
    for n in 1..=9u32 {
        for _ in 0..10 {
            let mut obs = observation(now, f64::from(n), 64, 1.0);
            obs.ttft = Some(if n <= 8 { 0.02 } else { 1.5 });
            curve.first_token(&FirstToken {
                at: now,
                ttft: obs.ttft.unwrap(),
                prompt_tokens: Some(64),
                admitted_with: f64::from(n),
                queued_with: 0,
            });
            curve.record(&obs);
        }
    }
    let model = curve.model().unwrap();
    assert!(model.predict(8.0, 0.0, 64).ttft_p90_s < 0.05);
    assert!(model.predict(9.0, 0.0, 64).ttft_p50_s >= 1.5);
    // Nothing seen at 10 yet: no sooner than at 9.
    assert!(model.predict(10.0, 0.0, 64).ttft_p50_s >= 1.5);
}

#[test]
fn one_recent_slow_first_token_past_the_levels_seen_is_believed() {
    let t0 = Instant::now();
    let mut curve = Curve::new(60.0);
    for n in 1..=8u32 {
        for _ in 0..10 {
            let mut obs = observation(t0, f64::from(n), 64, 1.0);
            obs.ttft = Some(0.02);
            learn(&mut curve, &obs);
        }
    }
    let slow_at_nine = |at| FirstToken {
        at,
        ttft: 1.5,
        prompt_tokens: Some(64),
        admitted_with: 9.0,
        queued_with: 0,
    };
    curve.first_token(&slow_at_nine(t0));
    assert!(curve.model().unwrap().predict(9.0, 0.0, 64).ttft_p90_s >= 1.5);
    // And for the levels above it, which nobody has tried: no sooner there.
    assert!(curve.model().unwrap().predict(12.0, 0.0, 64).ttft_p50_s >= 1.5);
    // Two half-lives later, one old sample no longer speaks for the level.
    let later = t0 + Duration::from_secs(120);
    let p = curve.predict(9.0, 64, later).unwrap();
    assert!(p.ttft_p90_s < 0.5, "{p:?}");
    assert!(curve.predict(12.0, 64, later).unwrap().ttft_p90_s < 0.5);
}

/// A curve of ten quick first tokens (20 ms) at each occupancy up to `trusted`, then one
/// first token each at the `sparse` (occupancy, TTFT) pairs.
fn trusted_then_sparse(t0: Instant, trusted: u32, ttft: f64, sparse: &[(f64, f64)]) -> Curve {
    let mut curve = Curve::new(60.0);
    for n in 1..=trusted {
        for _ in 0..10 {
            let mut obs = observation(t0, f64::from(n), 64, 1.0);
            obs.ttft = Some(ttft);
            learn(&mut curve, &obs);
        }
    }
    for &(admitted_with, ttft) in sparse {
        curve.first_token(&FirstToken {
            at: t0,
            ttft,
            prompt_tokens: Some(64),
            admitted_with,
            queued_with: 0,
        });
    }
    curve
}

#[test]
fn past_a_batch_limit_each_request_ahead_costs_at_least_what_the_last_did() {
    // A batch of 6 full: the 7th waits 250 ms for a slot, the 8th 500 ms; nobody has
    // been admitted at 9 or 10 yet. Requests hold their slot ~1.6 s.
    let t0 = Instant::now();
    let curve = trusted_then_sparse(t0, 6, 0.02, &[(7.0, 0.25), (8.0, 0.5)]);
    let model = curve.model().unwrap();
    assert!(model.predict(6.0, 0.0, 64).ttft_p90_s < 0.05);
    let at_nine = model.predict(9.0, 0.0, 64).ttft_p50_s;
    assert!(
        at_nine >= 0.74,
        "one more request ahead, one more slot to wait for: {at_nine}"
    );
    let at_ten = model.predict(10.0, 0.0, 64).ttft_p90_s;
    assert!(at_ten >= 0.99, "{at_ten}");
    // A lucky first token at 9 (a slot freed just then) does not make 10 look cheap.
    let lucky = trusted_then_sparse(t0, 6, 0.02, &[(7.0, 0.25), (8.0, 0.5), (9.0, 0.3)]);
    let at_ten = lucky.model().unwrap().predict(10.0, 0.0, 64).ttft_p90_s;
    assert!(at_ten >= 0.99, "{at_ten}");
}

#[test]
fn a_queue_measured_past_a_batch_limit_is_carried_on_to_the_levels_nobody_tried() {
    // The 7th and 8th waited for a slot, time and again: both levels trusted, none above.
    let t0 = Instant::now();
    let mut curve = trusted_then_sparse(t0, 6, 0.02, &[]);
    for (n, ttft) in [(7.0, 0.25), (8.0, 0.5)] {
        for _ in 0..10 {
            let mut obs = observation(t0, n, 64, 1.0);
            obs.ttft = Some(ttft);
            learn(&mut curve, &obs);
        }
    }
    let model = curve.model().unwrap();
    assert!(model.predict(8.0, 0.0, 64).ttft_p90_s < 0.6);
    // Not 500 ms, the highest level's, as before: two more slots to wait for than at 8.
    let at_ten = model.predict(10.0, 0.0, 64).ttft_p50_s;
    assert!(at_ten >= 0.99, "{at_ten}");
}

#[test]
fn jitter_on_a_flat_first_token_is_not_taken_for_a_queue() {
    // A hosted API's fixed 850 ms, a little later at 4 and 5 by chance.
    let t0 = Instant::now();
    let curve = trusted_then_sparse(t0, 3, 0.85, &[(4.0, 0.88), (5.0, 0.90)]);
    let at_ten = curve.model().unwrap().predict(10.0, 0.0, 64).ttft_p50_s;
    assert!(at_ten < 0.95, "{at_ten}");
}

#[test]
fn a_burst_is_believed_at_once_and_forgotten_once_its_queue_is_gone() {
    // Steady traffic at 8 in flight: first tokens in 150 ms, nobody waiting ahead.
    let t0 = Instant::now();
    let steady = |curve: &mut Curve, from: Instant, n: u64| {
        for i in 0..n {
            let at = from + Duration::from_millis(100 * i);
            let mut obs = observation(at, 8.0, 64, 1.0);
            obs.ttft = Some(0.150);
            curve.first_token(&FirstToken {
                at,
                ttft: 0.150,
                prompt_tokens: Some(64),
                admitted_with: 8.0,
                queued_with: 0,
            });
            curve.record(&obs);
        }
    };
    let mut reference = Curve::new(60.0);
    steady(&mut reference, t0, 40);
    let mut curve = Curve::new(60.0);
    steady(&mut curve, t0, 40);
    // Then eight requests at once: the n-th waits behind n - 1 prefills.
    let burst = t0 + Duration::from_secs(4);
    for n in 1..=8u32 {
        curve.first_token(&FirstToken {
            at: burst,
            ttft: 0.150 + 0.130 * f64::from(n - 1),
            prompt_tokens: Some(64),
            admitted_with: f64::from(n),
            queued_with: n - 1,
        });
    }
    let believed = curve.model().unwrap().predict(7.0, 0.0, 64).ttft_p50_s;
    assert!(believed >= 0.9, "the queue is believed at once: {believed}");
    // Steady traffic again, as the reference saw: newer first tokens at 8, sooner than any
    // of the burst's queued ones, show their queue gone.
    steady(&mut curve, burst + Duration::from_millis(100), 15);
    steady(&mut reference, burst + Duration::from_millis(100), 15);
    // The 8th waited 1.06 s: its queue is surely gone 3.2 s later, when traffic has
    // stopped: the periodic check rebuilds the curve.
    let later = burst + Duration::from_secs(8);
    assert!(curve.forgets_by(later));
    curve.forget_due(later);
    reference.refresh(later);
    let (got, want) = (curve.model().unwrap(), reference.model().unwrap());
    for n in 1..=8 {
        let (g, w) = (
            got.predict(f64::from(n), 0.0, 64).ttft_p50_s,
            want.predict(f64::from(n), 0.0, 64).ttft_p50_s,
        );
        assert!((g / w - 1.0).abs() < 0.10, "at {n}: {g} against {w}");
    }
    assert!(!curve.forgets_by(later + Duration::from_secs(600)));
}

#[test]
fn queue_evidence_at_a_level_traffic_still_visits_ages_like_any_sample() {
    // Past a batch limit of 8, first tokens at 9 wait for a slot, some behind others.
    let t0 = Instant::now();
    let mut curve = Curve::new(60.0);
    curve.record(&observation(t0, 8.0, 64, 1.0));
    let at_nine = |i: u64, queued_with| FirstToken {
        at: t0 + Duration::from_millis(500 * i),
        ttft: 1.2,
        prompt_tokens: Some(64),
        admitted_with: 9.0,
        queued_with,
    };
    for i in 0..10 {
        curve.first_token(&at_nine(i, 1));
    }
    // A newer first token at 9 with no queue: the queued ones before it stay evidence.
    curve.first_token(&at_nine(10, 0));
    let later = t0 + Duration::from_secs(30);
    curve.forget_due(later);
    assert!(!curve.forgets_by(later + Duration::from_secs(600)));
    let p = curve.predict(9.0, 64, later).unwrap();
    assert!(p.ttft_p50_s >= 1.2, "{p:?}");
}

#[test]
fn a_queue_past_a_batch_limit_is_not_forgotten_for_a_lucky_first_token() {
    // A batch of 6 full and 3 more waiting: the 10th waits for 4 slots to turn over, 1.2 s
    // mostly, 0.5 s when they happen to end together.
    let t0 = Instant::now();
    let mut curve = trusted_then_sparse(t0, 6, 0.02, &[]);
    let at_ten = |ms: u64, ttft| FirstToken {
        at: t0 + Duration::from_millis(ms),
        ttft,
        prompt_tokens: Some(64),
        admitted_with: 10.0,
        queued_with: 3,
    };
    for i in 0..5 {
        curve.first_token(&at_ten(300 * i, 1.2));
    }
    curve.first_token(&at_ten(1600, 0.5));
    let later = t0 + Duration::from_secs(8);
    curve.forget_due(later);
    let p = curve.predict(10.0, 64, later).unwrap();
    assert!(p.ttft_p90_s >= 1.0, "{p:?}");
}

#[test]
fn attainment_is_the_share_of_recent_samples_meeting_both_targets() {
    let now = Instant::now();
    let mut curve = Curve::default();
    for c in [1.0, 2.0, 4.0, 8.0] {
        learn(&mut curve, &observation(now, c, 0, 1.0));
    }
    // TPS: 90.9, 83.3, 71.4, 55.6; TTFT: 22, 24, 28, 36 ms.
    assert_eq!(curve.attainment(Some(60.0), None), Some(0.75));
    assert_eq!(curve.attainment(Some(60.0), Some(0.025)), Some(0.5));
    assert_eq!(curve.attainment(None, None), Some(1.0));
}

#[test]
fn a_model_rebuilt_from_kept_summaries_equals_one_built_from_every_sample() {
    // Rebuilds fall due every 100 ms, and each re-summarises only the windows changed since.
    let t0 = Instant::now();
    let mut curve = Curve::new(0.5);
    let mut at = t0;
    let learn_at = |curve: &mut Curve, at, i: u32| {
        let c = f64::from(i % 40 + 1);
        let slow = 1.0 + f64::from(i % 3) / 10.0;
        learn(curve, &observation(at, c, u64::from(i % 300), slow));
    };
    for i in 0..2000 {
        at += Duration::from_millis(10);
        learn_at(&mut curve, at, i);
    }
    let every_sample = |curve: &Curve, at| {
        let speed =
            std::array::from_fn(|i| curve.buckets.windows()[i].summary(NeighbourTerm::default()));
        // The fit's sums do not depend on the rate the quantiles are taken at.
        let any = std::array::from_fn(|i| curve.starts.windows()[i].summary(<_>::default()));
        let rate = PrefillRate::near(model::ttft_fit(&any).2);
        let starts = std::array::from_fn(|i| curve.starts.windows()[i].summary(rate));
        Model::build(&speed, &starts, curve.decay.factor(at)).unwrap()
    };
    curve.refresh(at);
    assert_eq!(**curve.model().unwrap(), every_sample(&curve, at));
    // One request 40 s later (80 half-lives of 0.5 s past the first sample): the weights are
    // rebased onto a later anchor, and every window's kept summary with them.
    at += Duration::from_secs(40);
    learn_at(&mut curve, at, 0);
    assert!(curve.decay.factor(at) > 2f64.powi(-64), "rebased");
    curve.refresh(at);
    assert_eq!(**curve.model().unwrap(), every_sample(&curve, at));
}

#[test]
fn cancelled_requests_are_counted_but_never_sampled() {
    let now = Instant::now();
    let mut curve = Curve::default();
    let mut obs = observation(now, 2.0, 10, 1.0);
    obs.outcome = Outcome::Cancelled;
    curve.record(&obs);
    assert_eq!(curve.counts().cancelled, 1);
    assert!(curve.points(now).is_empty());
    assert_eq!(curve.predict(2.0, 10, now), None);
}

#[test]
fn an_idle_serial_engine_is_not_charged_a_queue() {
    // A one-slot engine seen only busy: a request admitted as the n-th waits for the n - 1
    // ahead of it, a second each, after its own 140 ms. Alone, it waits for none.
    let now = Instant::now();
    let mut curve = Curve::default();
    for n in 2..=6_u32 {
        for _ in 0..8 {
            let obs = Observation {
                ttft: Some(0.140 + 1.0 * f64::from(n - 1)),
                tpot: Some(1.0 / 64.0),
                ..observation(now, f64::from(n), 64, 1.0)
            };
            learn(&mut curve, &obs);
        }
    }
    let fit = curve.fit(now).unwrap();
    assert!((fit.ttft_base_s - 0.140).abs() < 0.01, "{fit:?}");
    assert!((fit.ttft_per_seq_s - 1.0).abs() < 0.01, "{fit:?}");
    let idle = curve.predict(1.0, 64, now).unwrap();
    assert!((idle.ttft_p50_s - 0.140).abs() < 0.02, "{idle:?}");
}

#[test]
fn a_level_spreads_as_its_requests_did_and_says_how_likely_a_target_is() {
    // Speeds 8 to 12 tok/s at concurrency 4, evenly: a 10 tok/s target is met by about
    // half, 9 by three in four.
    let now = Instant::now();
    let mut curve = Curve::default();
    for k in 0..=40 {
        let obs = Observation {
            tpot: Some(1.0 / (8.0 + 0.1 * f64::from(k))),
            ..observation(now, 4.0, 64, 1.0)
        };
        learn(&mut curve, &obs);
    }
    let p = curve.predict(4.0, 64, now).unwrap();
    assert!((p.per_user_tps_p10 - 8.4).abs() < 0.11, "{p:?}");
    let half = p.chance(Some(10.0), None);
    assert!((half - 0.5).abs() < 0.05, "{half}");
    let most = p.chance(Some(9.0), None);
    assert!((most - 0.75).abs() < 0.05, "{most}");
    // TTFT: every first token came in 28 ms (20 + 2 x 4 ms): a 1-s target is sure.
    assert!((p.chance(Some(9.0), Some(1.0)) - most).abs() < 1e-9);
    assert_eq!(p.chance(None, Some(0.001)), 0.0);
}

#[test]
fn a_backend_sharing_its_device_learns_what_its_neighbours_load_costs_its_speed() {
    // TPOT = 10 ms + 1 ms per own request + 6 ms per request on the engine beside it, seen with
    // the neighbour idle and busy at every level.
    let mut curve = Curve::new(300.0);
    let now = Instant::now();
    for c in [1.0, 2.0, 4.0, 8.0] {
        for n in [0.0, 0.0, 1.0, 2.0] {
            for _ in 0..4 {
                learn(
                    &mut curve,
                    &beside(now, c, 0.010 + 0.001 * c + 0.006 * n, n),
                );
            }
        }
    }
    let fit = curve.fit(now).unwrap();
    assert!((fit.tpot_base_s - 0.010).abs() < 1e-6, "{fit:?}");
    assert!((fit.tpot_per_seq_s - 0.001).abs() < 1e-6, "{fit:?}");
    assert!((fit.tpot_per_neighbour_s - 0.006).abs() < 1e-6, "{fit:?}");
    let model = curve.model().unwrap();
    let idle_beside = model.predict(2.0, 0.0, 64).per_user_tps_p50;
    let busy_beside = model.predict(2.0, 2.0, 64).per_user_tps_p50;
    assert!((idle_beside - 1.0 / 0.012).abs() < 1.0, "{idle_beside}");
    assert!((busy_beside - 1.0 / 0.024).abs() < 1.0, "{busy_beside}");
    // A backend whose neighbours were never seen busy keeps the fit it had.
    let mut alone = Curve::new(300.0);
    for c in [1.0, 2.0, 4.0, 8.0] {
        for _ in 0..8 {
            learn(&mut alone, &observation(now, c, 64, 1.0));
        }
    }
    assert_eq!(alone.fit(now).unwrap().tpot_per_neighbour_s, 0.0);
}

#[test]
fn a_speed_put_back_beside_an_idle_device_is_never_faster_than_one_from_a_lighter_load() {
    // Two engines on two CPU cores: alone a token takes 8 ms; while the engine beside it
    // decodes, 41 ms; where it decoded for a third of this one's life, 9 ms (the cores were
    // shared unevenly). The linear term (35 ms a neighbour) puts the last back below zero.
    let mut curve = Curve::new(300.0);
    let now = Instant::now();
    for (tpot, n) in [(0.008, 0.0), (0.009, 0.3), (0.041, 1.0)] {
        for _ in 0..8 {
            learn(&mut curve, &beside(now, 1.0, tpot, n));
        }
    }
    let model = curve.model().unwrap();
    assert!(model.fit.tpot_per_neighbour_s > 0.03, "{:?}", model.fit);
    let alone = model.predict(1.0, 0.0, 64);
    assert!(alone.tps.quantile(0.9) <= 125.0 + 1e-6, "{alone:?}");
    // Beside a busy neighbour, most requests miss what every one alone met.
    let beside = model.predict(1.0, 1.0, 64);
    assert!(beside.tps.share_above(50.0) < 0.5, "{beside:?}");
}

#[test]
fn a_neighbours_cost_is_told_within_each_level_where_speed_bends_with_load() {
    // An H200's batching engine, as the simulator's bend fleet: 10 ms a token plus 2.5 ms per
    // request up to 8 in flight and no more from there, and 8.5 ms more while the serial engine
    // beside it runs. Most samples are past the bend, where a line through every level is flat,
    // and the serial engine ran most beside the few requests below it.
    let mut curve = Curve::new(300.0);
    let now = Instant::now();
    for c in 1..=16 {
        let c = f64::from(c);
        let (runs, loads) = if c < 8.0 {
            (2, [0.0, 1.0, 1.0, 1.0])
        } else {
            (6, [0.0, 0.0, 0.0, 1.0])
        };
        for n in loads {
            for _ in 0..runs {
                learn(
                    &mut curve,
                    &beside(now, c, 0.010 + 0.0025 * c.min(8.0) + 0.0085 * n, n),
                );
            }
        }
    }
    let fit = curve.fit(now).unwrap();
    assert!((fit.tpot_per_neighbour_s - 0.0085).abs() < 1e-4, "{fit:?}");
    // Beside an idle device, the level past the bend streams as it did alone.
    let p = curve.predict(12.0, 64, now).unwrap();
    assert!((p.per_user_tps_p50 - 1.0 / 0.030).abs() < 0.5, "{p:?}");
}

#[test]
fn a_level_seen_only_beside_a_busy_neighbour_is_put_back_to_its_speed_alone() {
    // 10 ms a token plus 2.5 ms per request, 8.5 ms more beside the neighbour's pass: seen with
    // the neighbour idle and busy up to 6 in flight, and at 7 only beside it.
    let mut curve = Curve::new(300.0);
    let now = Instant::now();
    for c in 1..=7 {
        let c = f64::from(c);
        let loads: &[f64] = if c < 7.0 { &[0.0, 1.0] } else { &[1.0] };
        for &n in loads {
            for _ in 0..8 {
                learn(
                    &mut curve,
                    &beside(now, c, 0.010 + 0.0025 * c + 0.0085 * n, n),
                );
            }
        }
    }
    let p = curve.predict(7.0, 64, now).unwrap();
    assert!((p.per_user_tps_p50 - 1.0 / 0.0275).abs() < 0.5, "{p:?}");
}
