//! A long prompt's prefill stalls the streams decoding beside it: where it goes, the streams
//! a few tokens from their speed targets' edge are what it may cost, and the router reads
//! each one's spare time, not a level's average.

use super::*;
use crate::fleet::paces::Paces;

/// Two backends prefilling 8,000 and 7,000 tokens a second (their curves taught so), with a
/// class that wants a first token within a second and 25 tok/s, sent on a miss where it adds
/// the most (the default).
fn prefilling_pair() -> Router {
    let router = router_from(
        &["a", "b"],
        "- {name: chat, min_tps: 25, max_ttft_ms: 1000}\n",
        0.0,
    );
    for (i, rate) in [8000.0, 7000.0].into_iter().enumerate() {
        teach_prefilling(&router, i, 0.5, &[1.0, 2.0, 4.0, 8.0], Some(rate));
    }
    router
}

/// `n` streams on backend `i`, each `tokens` long at the class's 25 tok/s, one token out now.
fn streaming(router: &Router, i: usize, n: usize, tokens: u32) -> Vec<InFlightGuard> {
    let now = Instant::now();
    let mut guards = occupy(router, i, 0, n);
    for g in &mut guards {
        g.pace(tokens, Some(25.0));
        g.first_token(now);
        g.progress(1, now);
    }
    guards
}

fn routed(router: &Router, prompt_tokens: u64) -> (&str, Reason) {
    let ask = Ask {
        prompt_tokens,
        max_tokens: Some(16),
        ..ask(router, 0)
    };
    let d = router.route(&ask).unwrap().unwrap();
    let name = &*router.backends[d.index].config.name;
    (name, d.reason)
}

#[test]
fn a_long_prompt_goes_where_its_prefill_pushes_no_stream_below_its_target() {
    let router = prefilling_pair();
    // a: one short answer, 11 tokens, 0.4 s to stream the last ten and keep 25 tok/s: about
    // 0.3 s to spare. b: three long answers, seconds to spare each; slower to prefill and
    // busier, it has less room by the curve.
    let _short = streaming(&router, 0, 1, 11);
    let _long = streaming(&router, 1, 3, 201);
    // 1,600 tokens stall for 0.2 s: the short answer keeps its target, and a has the room.
    assert_eq!(routed(&router, 1600), ("a", Reason::Feasible));
    // 6,000 tokens stall a for 0.75 s: the short answer would miss; b's keep theirs.
    assert_eq!(routed(&router, 6000), ("b", Reason::Feasible));
}

#[test]
fn a_prompt_that_no_backend_serves_in_time_goes_where_its_prefill_costs_the_fewest_streams() {
    let router = prefilling_pair();
    let _short = streaming(&router, 0, 1, 11);
    let _long = streaming(&router, 1, 3, 201);
    // 9,000 tokens: over 1.1 s of prefill, past the first-token target on either. On a it would
    // also cost the short answer its target; b has the less room but loses nothing.
    assert_eq!(routed(&router, 9000), ("b", Reason::BestEffort));
}

#[test]
fn streams_that_end_teach_how_long_a_prefill_stalls_them_not_what_the_batch_or_their_draw_costs() {
    let router = prefilling_pair();
    // Streams of 21 tokens at 1 to 4 in flight, each with a speed of its own (±30% about the
    // engine's), beside 0 to 4,000 prompt tokens a second of prefill: 100 tok/s alone, 5 fewer
    // per request in flight, and on `a` stalled 0.1 ms per prompt token beside it; `b` (a
    // hosted API, say) is slowed by its load alone. A slow stream sees more prefill beside it
    // for being slow, which is not a stall.
    let teach = |paces: &Paces, stall_s: f64| {
        let t0 = Instant::now();
        for k in 0..48_u32 {
            let in_flight = f64::from(1 + k % 4);
            let rate = 1000.0 * f64::from(k % 5);
            let own = [0.7, 1.0, 1.3][(k % 3) as usize];
            let speed = own * (100.0 - 5.0 * in_flight) * (1.0 - stall_s * rate);
            let decode = 20.0 / speed;
            let pace = paces.start(21, Some(25.0));
            pace.progress(paces, 1, t0);
            paces.first_token((rate * decode) as u64, false);
            pace.progress(paces, 21, t0 + Duration::from_secs_f64(decode));
            paces.end(&pace, in_flight);
        }
    };
    let (a, b) = (&router.backends[0].paces, &router.backends[1].paces);
    assert_eq!(a.stall_s_per_token(), None, "nothing learned yet");
    teach(a, 1e-4);
    teach(b, 0.0);
    let learned = a.stall_s_per_token().unwrap();
    assert!((learned - 1e-4).abs() < 1.5e-5, "{learned}");
    let hosted = b.stall_s_per_token().unwrap();
    assert!(hosted < 1e-5, "{hosted}");
}

#[test]
fn a_serial_engine_is_told_by_its_first_tokens_coming_while_others_wait_and_none_decodes() {
    let router = prefilling_pair();
    // Two requests at a time on each. On `a` (serial) the second waits for the first stream to
    // end; on `b` (batching) its first token comes while the first decodes.
    for _ in 0..8 {
        for (i, serial) in [(0, true), (1, false)] {
            let now = Instant::now();
            let mut guards = occupy(&router, i, 0, 2);
            for g in &mut guards {
                g.pace(21, Some(25.0));
            }
            let mut second = guards.pop().unwrap();
            let mut first = guards.pop().unwrap();
            first.first_token(now);
            first.progress(1, now);
            if serial {
                first.progress(21, now);
                drop(first);
                second.first_token(now);
            } else {
                second.first_token(now);
                drop(first);
            }
        }
    }
    let (a, b) = (&router.backends[0].paces, &router.backends[1].paces);
    assert_eq!(a.stall_s_per_token(), Some(0.0), "a newcomer stalls nobody");
    assert_eq!(
        b.stall_s_per_token(),
        None,
        "not learned yet: taken to stall"
    );
}
