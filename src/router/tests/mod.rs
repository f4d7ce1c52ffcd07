//! Routing decisions on taught curves: feasibility, policies, batch placement, queueing and
//! exploration, with exact numbers.

use super::*;
use crate::config::{BackendDialect, Slo};
use crate::curve::{FirstToken, Observation, Outcome};
use crate::fleet::{Hit, Share};
use crate::prefix::RequestPrefix;
use tokio::time::Instant;

mod device;
mod each_rung;
mod marginal;
mod no_regret;
mod stall;

/// A router over `backends` (each serving `m`, on unused ports) with classes `interactive`
/// (median speed >= 41 tok/s), `loose` (>= 21 tok/s), both shedding on a miss, and `batch`
/// (waiting for room, the default), never exploring.
fn router_over(backends: &[&str]) -> Router {
    router_exploring(backends, 0.0)
}

fn router_exploring(backends: &[&str], exploration: f64) -> Router {
    router_from(
        backends,
        "- {name: interactive, min_tps: 41, tps_percentile: 50, on_miss: shed}\n\
         - {name: loose, min_tps: 21, tps_percentile: 50, on_miss: shed}\n\
         - {name: batch}\n",
        exploration,
    )
}

/// A router over `backends` with the classes `classes` (YAML list items).
fn router_from(backends: &[&str], classes: &str, exploration: f64) -> Router {
    router_with(backends, "", classes, exploration)
}

/// [`router_from`], every backend with `extra` (YAML members, e.g. `device: host`).
fn router_with(backends: &[&str], extra: &str, classes: &str, exploration: f64) -> Router {
    let list: String = backends
        .iter()
        .map(|name| {
            format!(
                "- {{name: {name}, url: 'http://127.0.0.1:1', dialect: openai, models: {{m: m}}{extra}}}\n"
            )
        })
        .collect();
    let text = format!(
        "backends:\n{list}\
        classes:\n{classes}\
        routing: {{exploration: {exploration}}}\n"
    );
    let config = crate::config::parse(&text, |_| None).unwrap();
    let line = Arc::new(Line::new(config.classes.len()));
    let backends = config
        .backends
        .iter()
        .map(|b| {
            Backend::new(
                b.clone(),
                300.0,
                config.classes.len(),
                Arc::clone(&line),
                None,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    Router::new(
        backends,
        Default::default(),
        config.classes,
        config.routing,
        line,
    )
}

fn router() -> Router {
    router_over(&["a"])
}

/// Teaches backend `i` a batching curve: TPOT = 10 ms + `per_seq_ms` per request.
fn teach(router: &Router, i: usize, per_seq_ms: f64) {
    teach_at(
        router,
        i,
        per_seq_ms,
        &[1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0],
    );
}

/// [`teach`], seen at the given concurrencies only.
fn teach_at(router: &Router, i: usize, per_seq_ms: f64, seen: &[f64]) {
    teach_prefilling(router, i, per_seq_ms, seen, None);
}

/// [`teach_at`]: every prompt of 10 tokens, its first token in 50 ms; or, given a prefill
/// `rate`, prompts of 1,000 to 8,000 tokens, each first token 50 ms plus its prefill at it.
fn teach_prefilling(router: &Router, i: usize, per_seq_ms: f64, seen: &[f64], rate: Option<f64>) {
    let now = Instant::now();
    for &c in seen {
        for k in 0..8_u64 {
            let prompt = rate.map_or(10, |_| 1000 * (k + 1));
            let ttft = 0.05 + rate.map_or(0.0, |r| prompt as f64 / r);
            let obs = Observation {
                at: now,
                outcome: Outcome::Completed,
                ttft: Some(ttft),
                tpot: Some(0.010 + per_seq_ms * 1e-3 * c),
                output_tokens: 100,
                estimated: false,
                prompt_tokens: Some(prompt),
                concurrency: Some(c),
                neighbours: 0.0,
            };
            router.backends[i].first_token(
                "m",
                &FirstToken {
                    at: now,
                    ttft,
                    prompt_tokens: Some(prompt),
                    admitted_with: c,
                    queued_with: 0,
                },
            );
            router.backends[i].record("m", &obs);
        }
    }
}

fn ask(router: &Router, class: usize) -> Ask<'static> {
    Ask {
        model: "m",
        reach: Reach::own(BackendDialect::Openai),
        prompt_tokens: 10,
        max_tokens: None,
        class: Some(class),
        slo: router.classes[class].slo,
        received: Instant::now(),
        now: Instant::now(),
        avoid: &[],
        prefix: None,
    }
}

/// Holds `n` slots of `class` on backend `i`.
fn occupy(router: &Router, i: usize, class: usize, n: usize) -> Vec<InFlightGuard> {
    (0..n)
        .map(|_| InFlightGuard::try_admit(&router.backends[i], Some(class)).unwrap())
        .collect()
}

/// The `x-tpsgate-refusal` header a refusal carries.
fn refusal(err: &crate::error::Error) -> &str {
    err.headers()
        .and_then(|h| h.get(super::refusal::HEADER))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

fn chosen(router: &Router, class: usize) -> Result<&str, ErrorKind> {
    match router.route(&ask(router, class)) {
        Ok(Some(d)) => Ok(router
            .backends
            .iter()
            .find(|b| Arc::ptr_eq(b, &d.backend))
            .map(|b| &*b.config.name)
            .unwrap()),
        Ok(None) => Err(ErrorKind::NoBackendAvailable),
        Err(e) => Err(e.kind()),
    }
}

#[tokio::test(start_paused = true)]
async fn requests_still_waiting_for_a_first_token_keep_ttft_sensitive_ones_away() {
    let router = router_over(&["a", "b"]);
    // Third on `a`: 62.5 tok/s; alone on `b`: 55.6 tok/s.
    teach(&router, 0, 2.0);
    teach(&router, 1, 8.0);
    // Two requests on `a`, neither with a first token yet.
    let _held = occupy(&router, 0, 0, 2);
    let pick = |router: &Router| {
        let within_a_second = Ask {
            slo: Slo {
                max_ttft_s: Some(1.0),
                ..router.classes[0].slo
            },
            ..ask(router, 0)
        };
        let d = router.route(&within_a_second).unwrap().unwrap();
        d.backend.config.name.to_string()
    };
    assert_eq!(pick(&router), "a", "a fresh queue costs nothing yet");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        pick(&router),
        "b",
        "two seconds without a first token: a queue"
    );
}

#[test]
fn long_prompts_queued_on_a_backend_keep_others_away_before_its_curve_knows_its_prefill_rate() {
    let router = router_over(&["a", "b"]);
    // a has seen prompts of one size only: its curve cannot tell its prefill rate. b's can.
    teach(&router, 0, 0.5);
    teach_prefilling(&router, 1, 0.5, &[1.0, 2.0, 4.0], Some(8000.0));
    let rate = |i: usize| {
        router.backends[i]
            .model("m")
            .unwrap()
            .fit
            .prefill_tokens_per_s
    };
    assert_eq!(rate(0), None);
    assert!((rate(1).unwrap() - 8000.0).abs() < 1.0);
    let within_a_second = Ask {
        prompt_tokens: 1000,
        slo: Slo {
            max_ttft_s: Some(1.0),
            ..router.classes[0].slo
        },
        ..ask(&router, 0)
    };
    let pick = |router: &Router| router.route(&within_a_second).unwrap().unwrap().index;
    // Two requests on a: a first token there in 50 ms, against b's 50 plus 125 of prefill.
    let mut held = occupy(&router, 0, 0, 2);
    assert_eq!(pick(&router), 0);
    // Their 16,000 prompt tokens not yet prefilled: two seconds at the fleet's fastest rate.
    for guard in &mut held {
        guard.expect_prefill(8000, Hit::default());
    }
    assert_eq!(pick(&router), 1);
}

#[test]
fn headroom_picks_the_most_slack_and_pack_the_least() {
    let mut router = router_over(&["a", "b"]);
    teach(&router, 0, 1.0);
    teach(&router, 1, 0.5);
    // Alone on either, b (flatter curve) has more slack.
    assert_eq!(chosen(&router, 0), Ok("b"));
    router.classes[0].policy = Policy::Pack;
    assert_eq!(chosen(&router, 0), Ok("a"));
}

#[test]
fn cheapest_takes_the_lower_price_among_the_feasible_even_with_less_slack() {
    let text = "backends:\n\
        - {name: dear, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}, cost: {input_per_1m: 1, output_per_1m: 4}}\n\
        - {name: cheap, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}, cost: {input_per_1m: 0.1, output_per_1m: 0.4}}\n\
        classes:\n\
        - {name: interactive, min_tps: 41, tps_percentile: 50, policy: cheapest, on_miss: shed}\n\
        routing: {exploration: 0}\n";
    let config = crate::config::parse(text, |_| None).unwrap();
    let line = Arc::new(Line::new(1));
    let backends = config
        .backends
        .iter()
        .map(|b| Backend::new(b.clone(), 300.0, 1, Arc::clone(&line), None))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let router = Router::new(
        backends,
        Default::default(),
        config.classes,
        config.routing,
        line,
    );
    teach(&router, 0, 0.5);
    teach(&router, 1, 1.0);
    assert_eq!(chosen(&router, 0), Ok("cheap"));
    // Once the cheap one can no longer meet the SLO, the dear one takes it.
    let _held = occupy(&router, 1, 0, 14);
    assert_eq!(chosen(&router, 0), Ok("dear"));
}

#[test]
fn a_request_is_refused_where_it_would_slow_others_below_their_slo() {
    let router = router();
    teach(&router, 0, 1.0);
    // 41 tok/s at the median holds up to 14 requests: 1 / (10 + 14) ms = 41.7.
    let _held = occupy(&router, 0, 0, 14);
    // A loose request would get 40 tok/s at 15 (enough for it), but the 14 interactive
    // requests there would drop below 41.
    assert_eq!(chosen(&router, 1), Err(ErrorKind::SloUnmet));
    let refused = router.route(&ask(&router, 1)).unwrap_err();
    assert!(
        refusal(&refused).starts_with("cause=others; backend=\"a\"; in_flight=15"),
        "{refused:?}"
    );
    let only_loose = router_over(&["a"]);
    teach(&only_loose, 0, 1.0);
    let _held = occupy(&only_loose, 0, 1, 14);
    assert_eq!(chosen(&only_loose, 1), Ok("a"), "only loose requests there");
}

#[test]
fn batch_work_leaves_room_for_one_more_latency_request() {
    let router = router();
    teach(&router, 0, 1.0);
    // Interactive fits up to 14 (see above). With 12 batch requests in flight, a 13th
    // leaves room for one interactive request at 14; with 13, it would not.
    let mut held = occupy(&router, 0, 2, 12);
    assert_eq!(chosen(&router, 2), Ok("a"));
    held.extend(occupy(&router, 0, 2, 1));
    assert_eq!(
        chosen(&router, 2),
        Err(ErrorKind::NoBackendAvailable),
        "batch waits in line"
    );
    assert_eq!(chosen(&router, 0), Ok("a"), "the room is there");
}

#[tokio::test(start_paused = true)]
async fn batch_waits_at_the_gateway_until_a_slot_frees_rather_than_take_the_room() {
    let router = router();
    teach(&router, 0, 1.0);
    let mut held = occupy(&router, 0, 2, 13);
    let batch = ask(&router, 2);
    assert!(router.route(&batch).unwrap().is_none(), "it waits in line");
    let (decision, ()) = tokio::join!(wait::in_line(&router, &batch, Share::default()), async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        held.pop();
    });
    let decision = decision.unwrap();
    assert_eq!(&*decision.backend.config.name, "a");
    assert_eq!(decision.reason, Reason::Queued);
}

#[tokio::test(start_paused = true)]
async fn batch_that_never_finds_room_is_shed_after_its_wait_with_a_retry_time() {
    let router = router();
    teach(&router, 0, 1.0);
    let _held = occupy(&router, 0, 2, 13);
    let batch = ask(&router, 2);
    let waited = Instant::now();
    let err = wait::in_line(&router, &batch, Share::default())
        .await
        .unwrap_err();
    assert_eq!(
        waited.elapsed(),
        Duration::from_secs(60),
        "the batch default"
    );
    assert_eq!(err.kind(), ErrorKind::SloUnmet);
    assert!(err.retry_after_s().is_some_and(|s| s >= 1));
    let message = err.to_string();
    assert!(message.contains("room for batch work"), "{message}");
    assert!(refusal(&err).starts_with("cause=no_room;"), "{err:?}");
    assert!(refusal(&err).ends_with("; waited_ms=60000"), "{err:?}");
    assert_eq!(router.refusals(2), [("no_room", 1)]);
    assert!(!message.contains("send it as a batch class"), "{message}");
}

#[test]
fn exploring_never_takes_the_room_a_latency_request_needs() {
    // The first request may explore; `a` was only seen up to 4 at once, so 14 is unexplored.
    let router = router_exploring(&["a"], 0.5);
    teach_at(&router, 0, 1.0, &[1.0, 2.0, 4.0]);
    let _held = occupy(&router, 0, 2, 13);
    // A 14th batch request would leave an interactive one 40 tok/s at 15 (< 41).
    assert_eq!(
        chosen(&router, 2),
        Err(ErrorKind::NoBackendAvailable),
        "no exploring here"
    );
}

#[test]
fn derived_caps_follow_the_curve_and_the_class() {
    let router = router();
    teach(&router, 0, 1.0);
    let caps = router.caps(Instant::now());
    let cap = |class: &str| caps.iter().find(|c| &*c.class == class).unwrap().cap;
    assert_eq!(cap("interactive"), 14);
    // 21 tok/s: 1 / (10 + 37.6) ms; beyond the learned 32 the fit extrapolates.
    assert_eq!(cap("loose"), 37);
    assert!(caps.iter().all(|c| &*c.class != "batch"));
}

#[test]
fn a_retry_avoids_every_backend_that_failed_it_however_many_there_are() {
    // Regression: failed backends were a 64-bit mask, so beyond the 64th a retry could go back
    // to one that had just failed it.
    let names: Vec<String> = (0..70).map(|i| format!("b{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let router = router_over(&names);
    let avoid: Vec<usize> = (0..70).filter(|i| *i != 66).collect();
    let retry = Ask {
        avoid: &avoid,
        ..ask(&router, 2)
    };
    for _ in 0..5 {
        let d = router.route(&retry).unwrap().unwrap();
        assert_eq!(&*d.backend.config.name, "b66");
    }
    assert_eq!(
        router.serving_count("m", Reach::own(BackendDialect::Openai)),
        70
    );
}

/// A prompt of 40 blocks (2,560 tokens) held by backend `i`'s prefix index.
fn held_by(router: &Router, i: usize) -> RequestPrefix {
    routed_to(router, i, 1)
}

/// A prompt of 40 blocks, numbered from `first`, routed to backend `i` (its index holds it).
fn routed_to(router: &Router, i: usize, first: u64) -> RequestPrefix {
    let prefix = RequestPrefix {
        hashes: (first..first + 40).collect(),
        hint: None,
    };
    let index = router.backends[i].prefix.as_ref().unwrap();
    index.routed(&prefix, Hit::default(), 0, Instant::now());
    prefix
}

#[test]
fn the_feasible_backend_holding_the_prompt_wins_over_more_headroom_elsewhere() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 0.5);
    teach(&router, 1, 0.5);
    let prefix = held_by(&router, 0);
    // a is busier: headroom alone prefers b.
    let _busy = occupy(&router, 0, 1, 3);
    let blind = Ask {
        prompt_tokens: 4000,
        ..ask(&router, 1)
    };
    assert_eq!(router.route(&blind).unwrap().unwrap().index, 1);
    let with_prefix = Ask {
        prefix: Some(&prefix),
        ..blind
    };
    let decision = router.route(&with_prefix).unwrap().unwrap();
    assert_eq!(decision.index, 0, "the holder, while it meets the SLO");
    assert_eq!(decision.reason, Reason::Feasible);
}

#[test]
fn a_holder_that_cannot_meet_the_slo_is_passed_over_and_the_other_holds_the_prompt_then() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 3.0);
    teach(&router, 1, 3.0);
    let prefix = held_by(&router, 0);
    // 41 tok/s needs TPOT <= 24.4 ms: at most 4 requests on either.
    let _full = occupy(&router, 0, 0, 4);
    let ask = Ask {
        prompt_tokens: 4000,
        prefix: Some(&prefix),
        ..ask(&router, 0)
    };
    let decision = router.route(&ask).unwrap().unwrap();
    assert_eq!(decision.index, 1);
    let b = router.backends[1].prefix.as_ref().unwrap();
    assert_eq!(b.expected(&prefix, Instant::now()).cached_tokens, 40 * 64);
}

/// Of `among` (router indices), the one first in `prefix`'s rendezvous order.
fn rendezvous_first(router: &Router, prefix: &RequestPrefix, among: &[usize]) -> usize {
    // The key is the block at `min_match_tokens` (256 tokens: the 4th block of 64).
    let key = prefix.hashes[3];
    *among
        .iter()
        .max_by_key(|&&i| crate::prefix::rendezvous(key, router.backends[i].rendezvous_seed))
        .unwrap()
}

#[test]
fn a_new_prompt_goes_to_the_emptiest_cache_inside_the_slo_an_idle_never_observed_backend_first() {
    let router = router_over(&["a", "b", "c"]);
    teach(&router, 0, 0.5);
    teach(&router, 1, 0.5);
    // a holds two prompts, b one, c (never observed) none; b is the busier of a and b.
    routed_to(&router, 0, 1000);
    routed_to(&router, 0, 2000);
    routed_to(&router, 1, 3000);
    let _load = occupy(&router, 1, 1, 2);
    let new = RequestPrefix {
        hashes: (5000..5040).collect(),
        hint: None,
    };
    let ask = Ask {
        prompt_tokens: 2560,
        prefix: Some(&new),
        ..ask(&router, 1)
    };
    assert_eq!(router.route(&ask).unwrap().unwrap().index, 2);
    // Without the idle one, b's cache is the emptier: headroom alone would send it to a.
    let avoid = [2];
    let elsewhere = Ask {
        avoid: &avoid,
        ..ask
    };
    let decision = router.route(&elsewhere).unwrap().unwrap();
    assert_eq!(decision.index, 1);
    let blind = Ask {
        prefix: None,
        ..elsewhere
    };
    assert_eq!(router.route(&blind).unwrap().unwrap().index, 0);
}

#[test]
fn among_backends_holding_the_same_prompt_its_rendezvous_first_keeps_it_while_it_meets_the_slo() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 3.0);
    teach(&router, 1, 3.0);
    let prefix = held_by(&router, 0);
    held_by(&router, 1);
    let first = rendezvous_first(&router, &prefix, &[0, 1]);
    let ask = Ask {
        prompt_tokens: 2600,
        prefix: Some(&prefix),
        ..ask(&router, 0)
    };
    // Busier than the other copy's backend, but within the SLO (41 tok/s: at most 4 there).
    let mut load = occupy(&router, first, 0, 2);
    assert_eq!(router.route(&ask).unwrap().unwrap().index, first);
    // Full: the other copy serves it.
    load.extend(occupy(&router, first, 0, 2));
    assert_eq!(router.route(&ask).unwrap().unwrap().index, 1 - first);
}

#[test]
fn with_no_backend_meeting_the_slo_best_effort_sends_the_prompt_where_it_is_cached() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 3.0);
    teach(&router, 1, 3.0);
    let prefix = held_by(&router, 0);
    // Both past 4 requests; a further past it than b (more violation there).
    let _a = occupy(&router, 0, 0, 6);
    let _b = occupy(&router, 1, 0, 5);
    let ask = Ask {
        prompt_tokens: 4000,
        prefix: Some(&prefix),
        ..ask(&router, 0)
    };
    let candidates = router.candidates(&ask, Policy::Headroom);
    assert!(candidates.iter().all(|c| !c.feasible()));
    assert_eq!(
        rungs::best_effort::best_effort(&ask.slo, &candidates),
        Some(0)
    );
    let blind = Ask {
        prefix: None,
        ..ask
    };
    let candidates = router.candidates(&blind, Policy::Headroom);
    assert_eq!(
        rungs::best_effort::best_effort(&blind.slo, &candidates),
        Some(1)
    );
}

#[test]
fn while_others_wait_in_line_a_request_is_held_to_its_target_less_the_lines_reserve() {
    let router = router_from(
        &["a"],
        "- {name: waits, max_ttft_ms: 1000, on_miss: queue}\n",
        0.0,
    );
    let waits = ask(&router, 0);
    let me = router.line.join(0, Share::default());
    assert_eq!(
        router.line_reserve(&waits, true),
        None,
        "alone in line: nothing kept back"
    );
    let _behind = router.line.join(0, Share::default());
    let reserve = router.line_reserve(&waits, true).unwrap();
    assert!((reserve - 0.2).abs() < 1e-9, "{reserve}");
    assert_eq!(
        router.line_reserve(&waits, false),
        None,
        "a fresh request is tried only when the line is empty"
    );
    let now = Instant::now();
    let held = waits.holding_back(now, reserve).slo_at(now);
    assert!((held.max_ttft_s.unwrap() - 0.8).abs() < 1e-3, "{held:?}");
    // One that has waited longer than the reserve keeps its own, smaller, budget.
    let waited = Ask {
        received: now - Duration::from_millis(500),
        ..waits
    };
    let own = waited.holding_back(now, reserve).slo_at(now);
    assert!((own.max_ttft_s.unwrap() - 0.5).abs() < 1e-3, "{own:?}");
    drop(me);
}
