//! Routing decisions on taught curves: feasibility, policies, batch placement, queueing and
//! exploration, with exact numbers.

use super::*;
use crate::curve::{FirstToken, Observation, Outcome};
use crate::fleet::{Hit, Share};

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
    let now = Instant::now();
    for &c in seen {
        for _ in 0..8 {
            let obs = Observation {
                at: now,
                outcome: Outcome::Completed,
                ttft: Some(0.05),
                tpot: Some(0.010 + per_seq_ms * 1e-3 * c),
                output_tokens: 100,
                estimated: false,
                prompt_tokens: Some(10),
                concurrency: Some(c),
                neighbours: 0.0,
            };
            router.backends[i].first_token(
                "m",
                &FirstToken {
                    at: now,
                    ttft: 0.05,
                    prompt_tokens: Some(10),
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
    let (decision, ()) = tokio::join!(router.wait_in_line(&batch, Share::default()), async {
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
    let err = router
        .wait_in_line(&batch, Share::default())
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
    let caps = router.caps();
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
    assert_eq!(choose::best_effort(&ask.slo, &candidates), Some(0));
    let blind = Ask {
        prefix: None,
        ..ask
    };
    let candidates = router.candidates(&blind, Policy::Headroom);
    assert_eq!(choose::best_effort(&blind.slo, &candidates), Some(1));
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

/// Teaches backend `i` one request per `(concurrency, ttft_s, tps)`.
fn teach_each(router: &Router, i: usize, requests: &[(f64, f64, f64)]) {
    let beside: Vec<_> = requests.iter().map(|&(c, t, s)| (c, 0.0, t, s)).collect();
    teach_beside(router, i, &beside);
}

/// Teaches backend `i` one request per `(concurrency, neighbours, ttft_s, tps)`: `neighbours`
/// decoding on the backends sharing its device while it decoded.
fn teach_beside(router: &Router, i: usize, requests: &[(f64, f64, f64, f64)]) {
    let now = Instant::now();
    for &(c, neighbours, ttft, tps) in requests {
        router.backends[i].first_token(
            "m",
            &FirstToken {
                at: now,
                ttft,
                prompt_tokens: Some(10),
                admitted_with: c,
                queued_with: 0,
            },
        );
        router.backends[i].record(
            "m",
            &Observation {
                at: now,
                outcome: Outcome::Completed,
                ttft: Some(ttft),
                tpot: Some(1.0 / tps),
                output_tokens: 64,
                estimated: false,
                prompt_tokens: Some(10),
                concurrency: Some(c),
                neighbours,
            },
        );
    }
}

/// A class that wants 10 tok/s from nine requests in ten and a first token within a second,
/// shedding what it cannot place.
const MARGINAL: &str = "- {name: marginal, min_tps: 10, max_ttft_ms: 1000, on_miss: shed}\n";

/// A noisy engine's requests at 1 to 8 in flight: 9 to 13 tok/s at every level (a p10 of about
/// 9.5, a median of 11), first tokens in 150 ms.
fn short_of_ten() -> Vec<(f64, f64, f64)> {
    let speeds = [9.0, 9.5, 10.2, 10.6, 11.0, 11.4, 11.8, 12.4, 13.0];
    (1..=8)
        .flat_map(|c| speeds.map(|tps| (f64::from(c), 0.15, tps)))
        .collect()
}

/// Requests whose speed falls with load, spread ±12% about it: 14 tok/s up to four in flight,
/// 2 fewer per request beyond.
fn falling() -> Vec<(f64, f64, f64)> {
    (1..=8_u32)
        .flat_map(|c| {
            let median = 14.0 - 2.0 * f64::from(c.saturating_sub(4));
            [0.88, 0.92, 0.96, 1.0, 1.04, 1.08, 1.12].map(|k| (f64::from(c), 0.15, median * k))
        })
        .collect()
}

fn reason_of(router: &Router, ask: &Ask<'_>) -> Result<Reason, ErrorKind> {
    match router.route(ask) {
        Ok(Some(d)) => Ok(d.reason),
        Ok(None) => Err(ErrorKind::NoBackendAvailable),
        Err(e) => Err(e.kind()),
    }
}

#[test]
fn a_backend_whose_p10_sits_just_below_the_target_still_serves() {
    // A noisy batching engine: per-user speed 9 to 13 tok/s at every level up to 8 (its p10
    // about 9.5, its median 11), first tokens in 150 ms. No level reaches a p10 of 10.
    let router = router_from(&["noisy"], MARGINAL, 0.0);
    let requests = short_of_ten();
    teach_each(&router, 0, &requests);
    let ask = ask(&router, 0);
    let candidates = router.candidates(&ask, Policy::Headroom);
    assert!(!candidates[0].feasible(), "its p10 misses the target");
    assert!(candidates[0].chance > 0.7, "{}", candidates[0].chance);
    let _held = occupy(&router, 0, 0, 3);
    assert_eq!(reason_of(&router, &ask), Ok(Reason::BestChance));
}

#[test]
fn a_request_that_would_cost_the_others_more_than_it_adds_gets_its_classs_on_miss() {
    // Speed falls with load, spread ±10% about it: 14 tok/s alone, 2 fewer per request
    // beyond four in flight. Joining as the 7th, a request meets 10 tok/s about half the
    // time, and makes it a coin toss for the six already there, who were likelier before.
    let router = router_from(&["falling"], MARGINAL, 0.0);
    let requests = falling();
    teach_each(&router, 0, &requests);
    let ask = ask(&router, 0);
    let _held = occupy(&router, 0, 0, 6);
    assert_eq!(reason_of(&router, &ask), Err(ErrorKind::SloUnmet));
    drop(_held);
    let _held = occupy(&router, 0, 0, 4);
    assert_eq!(
        reason_of(&router, &ask),
        Ok(Reason::BestChance),
        "the 5th is likelier, and costs the four little"
    );
}

#[test]
fn a_two_sample_fit_does_not_lock_a_backend_out() {
    // A one-slot engine seen twice: alone (first token in 139 ms, 64 tok/s), then behind one
    // other (4.95 s). Idle, it is the case it was seen meet the SLO with room to spare.
    let router = router_from(&["serial"], MARGINAL, 0.0);
    teach_each(&router, 0, &[(1.0, 0.139, 64.0), (2.0, 4.95, 64.0)]);
    let p = router.candidates(&ask(&router, 0), Policy::Headroom)[0]
        .prediction
        .unwrap();
    assert!(p.ttft_p50_s < 0.2, "{p:?}");
    assert!(matches!(
        reason_of(&router, &ask(&router, 0)),
        Ok(Reason::Feasible | Reason::BestChance)
    ));
    // Busy, it is not: the second's wait is believed.
    let _held = occupy(&router, 0, 0, 1);
    assert_eq!(
        reason_of(&router, &ask(&router, 0)),
        Err(ErrorKind::SloUnmet)
    );
}

#[test]
fn an_idle_backend_whose_thin_evidence_predicts_a_miss_is_explored_again() {
    // One slow first token alone (1.4 s, past the 1-s target) and nothing else: without
    // exploration the backend would never be tried again, and never shown otherwise.
    let router = router_from(&["unlucky"], MARGINAL, 0.5);
    teach_each(&router, 0, &[(1.0, 1.4, 64.0)]);
    assert_eq!(reason_of(&router, &ask(&router, 0)), Ok(Reason::Explore));
}

#[test]
fn a_class_that_queues_takes_a_full_backend_where_its_request_is_likelier_than_not_to_be_good() {
    // A noisy engine on shared cores: first tokens in 0.1 s alone; at two in flight eight in
    // ten in 0.2 s and two in ten after 2 s, so its p90 misses the 1-s target there while most
    // requests meet it. Waiting for it to be idle again would refuse most of them.
    let classes = "- {name: waits, min_tps: 10, max_ttft_ms: 1000, on_miss: queue}\n";
    let router = router_from(&["noisy"], classes, 0.0);
    let mut requests = vec![(1.0, 0.1, 60.0); 8];
    requests.extend([(2.0, 0.2, 60.0); 8]);
    requests.extend([(2.0, 2.0, 60.0); 2]);
    teach_each(&router, 0, &requests);
    let _held = occupy(&router, 0, 0, 1);
    assert_eq!(reason_of(&router, &ask(&router, 0)), Ok(Reason::BestChance));
}

#[test]
fn a_backend_slowed_by_its_cold_start_is_tried_again_while_idle_by_a_class_that_queues() {
    // A fresh engine's first answer came after 16 s (its warm-up), and no exploration budget is
    // left: still, while it is idle, the next request goes there rather than waiting in line
    // for nothing (seen on two fresh `transformers serve` engines: every request refused).
    let classes = "- {name: waits, min_tps: 10, max_ttft_ms: 1000, on_miss: queue}\n";
    let router = router_from(&["warming"], classes, 0.0);
    teach_each(&router, 0, &[(1.0, 16.0, 64.0)]);
    assert_eq!(reason_of(&router, &ask(&router, 0)), Ok(Reason::Explore));
    // Busy, it is not tried on that evidence: the request waits for it.
    let _held = occupy(&router, 0, 0, 1);
    assert_eq!(
        reason_of(&router, &ask(&router, 0)),
        Err(ErrorKind::NoBackendAvailable)
    );
}

#[test]
fn a_class_is_feasible_while_some_backend_meets_its_slo_alone_and_names_the_closest() {
    let router = router_from(&["slow", "fast"], MARGINAL, 0.0);
    assert_eq!(router.standings()[0].feasible, None, "no evidence yet");
    // 8 tok/s alone: not even a lone request meets 10.
    teach_each(&router, 0, &[(1.0, 0.1, 8.0); 6]);
    let standing = &router.standings()[0];
    assert_eq!(standing.feasible, Some(false));
    let best = standing.best.as_ref().unwrap();
    assert_eq!(&*best.backend, "slow");
    assert!((best.per_user_tps_p50 - 8.0).abs() < 0.5, "{best:?}");
    // A second backend at 30 tok/s alone meets it, and is the best.
    teach_each(&router, 1, &[(1.0, 0.1, 30.0); 6]);
    let standing = &router.standings()[0];
    assert_eq!(standing.feasible, Some(true));
    assert_eq!(&*standing.best.as_ref().unwrap().backend, "fast");
}

#[test]
fn a_class_that_queues_waits_for_a_full_backend_but_takes_its_chance_on_one_short_of_the_target() {
    let classes = "- {name: waits, min_tps: 10, max_ttft_ms: 1000, on_miss: queue}\n";
    // Meets 10 tok/s at the 90th percentile up to 4 in flight, about half the time at 6.
    let full = router_from(&["full"], classes, 0.0);
    let requests = falling();
    teach_each(&full, 0, &requests);
    let _held = occupy(&full, 0, 0, 5);
    assert_eq!(
        reason_of(&full, &ask(&full, 0)),
        Err(ErrorKind::NoBackendAvailable),
        "it waits in line for a slot where the SLO holds"
    );
    // Short of the target even alone (its p10 about 9.5): waiting would not help.
    let short = router_from(&["short"], classes, 0.0);
    let requests = short_of_ten();
    teach_each(&short, 0, &requests);
    let _held = occupy(&short, 0, 0, 2);
    assert_eq!(reason_of(&short, &ask(&short, 0)), Ok(Reason::BestChance));
}

/// Two engines on one device as measured on a shared host: `batching` decodes at 10 ms + 1 ms
/// per own request a token, and each request on the engine beside it adds 20 ms (a serial
/// engine's forward pass takes the device from its whole batch); `serial` decodes alone at
/// 8 ms a token, 2 ms more per request beside it. Both seen with their neighbour idle and busy.
fn shared_host(extra: &str) -> Router {
    let router = router_with(&["batching", "serial"], extra, MARGINAL_SPEED, 0.0);
    let mut batching = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        for n in [0.0, 0.0, 0.0, 1.0] {
            for _ in 0..4 {
                batching.push((c, n, 0.05, 1.0 / (0.010 + 0.001 * c + 0.020 * n)));
            }
        }
    }
    teach_beside(&router, 0, &batching);
    let mut serial = Vec::new();
    for n in [0.0, 1.0, 2.0, 3.0] {
        for _ in 0..8 {
            serial.push((1.0, n, 0.05, 1.0 / (0.008 + 0.002 * n)));
        }
    }
    teach_beside(&router, 1, &serial);
    router
}

/// 41 tok/s at the median and a first token within a second, shedding what it cannot place.
const MARGINAL_SPEED: &str =
    "- {name: interactive, min_tps: 41, tps_percentile: 50, max_ttft_ms: 1000, on_miss: shed}\n";

#[test]
fn a_request_stays_off_an_engine_whose_device_it_would_take_from_the_requests_beside_it() {
    // Two requests decode on the batching engine at 12 ms a token (83 tok/s). The serial
    // engine alone would give this one more room (8 + 2·2 = 12 ms, against 13 ms as the
    // batching engine's third), but there it would slow those two to 32 ms a token, under
    // their 41 tok/s.
    let router = shared_host(", device: host");
    let mut decoding = occupy(&router, 0, 0, 2);
    for request in &mut decoding {
        request.first_token(Instant::now());
    }
    let ask = ask(&router, 0);
    let candidates = router.candidates(&ask, Policy::Headroom);
    let serial = &candidates[1];
    assert!(
        serial.slack >= 0.0,
        "it meets its own SLO there: {serial:?}"
    );
    assert!(!serial.keeps_others, "but not the others'");
    assert!(serial.neighbour_loss > 1.0, "{}", serial.neighbour_loss);
    assert_eq!(chosen(&router, 0), Ok("batching"));
    // Alone on its device, the serial engine is as good a place as any.
    drop(decoding);
    assert!(router.candidates(&ask, Policy::Headroom)[1].feasible());
}

#[test]
fn backends_that_share_no_device_are_not_charged_for_each_other() {
    let router = shared_host("");
    let _decoding = occupy(&router, 0, 0, 2);
    let candidates = router.candidates(&ask(&router, 0), Policy::Headroom);
    assert!(candidates[1].keeps_others && candidates[1].neighbour_loss == 0.0);
    assert_eq!(
        chosen(&router, 0),
        Ok("serial"),
        "the most room, by its own curve"
    );
}
