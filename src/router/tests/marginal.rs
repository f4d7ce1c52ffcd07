//! Where the class's percentiles miss: noisy engines whose p10 sits below the target, fits
//! through two samples, a queueing class's line, and engines sharing one device. What the
//! router does there decides whether its goodput stays above a simple baseline's.

use super::*;

/// Teaches backend `i` one request per `(concurrency, ttft_s, tps)`.
pub(super) fn teach_each(router: &Router, i: usize, requests: &[(f64, f64, f64)]) {
    let beside: Vec<_> = requests.iter().map(|&(c, t, s)| (c, 0.0, t, s)).collect();
    teach_beside(router, i, &beside);
}

/// Teaches backend `i` one request per `(concurrency, neighbours, ttft_s, tps)`: `neighbours`
/// decoding on the backends sharing its device while it decoded.
pub(super) fn teach_beside(router: &Router, i: usize, requests: &[(f64, f64, f64, f64)]) {
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
pub(super) const MARGINAL: &str =
    "- {name: marginal, min_tps: 10, max_ttft_ms: 1000, on_miss: shed}\n";

/// A noisy engine's requests at 1 to 8 in flight: 9 to 13 tok/s at every level (a p10 of about
/// 9.5, a median of 11), first tokens in 150 ms.
pub(super) fn short_of_ten() -> Vec<(f64, f64, f64)> {
    let speeds = [9.0, 9.5, 10.2, 10.6, 11.0, 11.4, 11.8, 12.4, 13.0];
    (1..=8)
        .flat_map(|c| speeds.map(|tps| (f64::from(c), 0.15, tps)))
        .collect()
}

/// Requests whose speed falls with load, spread ±12% about it: 14 tok/s up to four in flight,
/// 2 fewer per request beyond.
pub(super) fn falling() -> Vec<(f64, f64, f64)> {
    (1..=8_u32)
        .flat_map(|c| {
            let median = 14.0 - 2.0 * f64::from(c.saturating_sub(4));
            [0.88, 0.92, 0.96, 1.0, 1.04, 1.08, 1.12].map(|k| (f64::from(c), 0.15, median * k))
        })
        .collect()
}

pub(super) fn reason_of(router: &Router, ask: &Ask<'_>) -> Result<Reason, ErrorKind> {
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
    assert!(
        candidates[0].estimate().unwrap().chance() > 0.7,
        "{}",
        candidates[0].estimate().unwrap().chance()
    );
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
    assert!(
        matches!(
            reason_of(&router, &ask),
            Ok(Reason::Feasible | Reason::BestChance)
        ),
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
        .prediction()
        .copied()
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

/// A class that wants 10 tok/s and a first token within a second, waiting in line on a miss,
/// before a noisy engine on shared cores: first tokens in 0.1 s alone; at two in flight eight in
/// ten in 0.2 s and two in ten after 2 s, so its p90 misses the 1-s target there while most
/// requests meet it; 60 tok/s throughout.
fn noisy_at_two() -> Router {
    noisy_engine(8, 2)
}

/// The noisy engine of [`noisy_at_two`], its first tokens at two in flight `fast` times in
/// 0.2 s and `slow` times after 2 s.
pub(super) fn noisy_engine(fast: usize, slow: usize) -> Router {
    let classes = "- {name: waits, min_tps: 10, max_ttft_ms: 1000, on_miss: queue}\n";
    let router = router_from(&["noisy"], classes, 0.0);
    let mut requests = vec![(1.0, 0.1, 60.0); 8];
    requests.extend(vec![(2.0, 0.2, 60.0); fast]);
    requests.extend(vec![(2.0, 2.0, 60.0); slow]);
    teach_each(&router, 0, &requests);
    router
}

#[test]
fn a_class_that_queues_takes_a_full_backend_where_its_request_is_likelier_than_not_to_be_good() {
    // Waiting for the noisy engine to be idle again would refuse most of its requests.
    let router = noisy_at_two();
    let _held = occupy(&router, 0, 0, 1);
    assert_eq!(reason_of(&router, &ask(&router, 0)), Ok(Reason::BestChance));
}

/// A request of class 0 waiting in `router`'s line is placed at once, where it has a chance.
async fn goes_from_the_line_at_once(router: &Router) {
    let waited = Instant::now();
    let decision = wait::in_line(router, &ask(router, 0), Share::default()).await;
    assert_eq!(decision.map(|d| d.reason).ok(), Some(Reason::BestChance));
    assert_eq!(waited.elapsed(), Duration::ZERO);
}

/// A request of class 0 arriving at `router` goes to the line, and at its turn there goes at
/// once ([`goes_from_the_line_at_once`]).
async fn arrives_in_line_and_goes_at_its_turn(router: &Router) {
    assert_eq!(
        reason_of(router, &ask(router, 0)),
        Err(ErrorKind::NoBackendAvailable),
        "it goes to the line"
    );
    goes_from_the_line_at_once(router).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_waiting_in_line_takes_a_full_backend_once_no_slot_is_expected_in_time() {
    // The noisy engine, where a request takes 1.3 s or so. In line behind one request,
    // no slot frees before its 1-s target, and waiting would only end in a 429: it goes at
    // once, likelier than not to be good.
    let router = noisy_at_two();
    let mut held = occupy(&router, 0, 0, 1);
    goes_from_the_line_at_once(&router).await;
    // Behind two, one of them is expected to finish in time: it waits, and goes when one has.
    held.extend(occupy(&router, 0, 0, 1));
    let behind_two = ask(&router, 0);
    let (decision, ()) = tokio::join!(
        wait::in_line(&router, &behind_two, Share::default()),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            held.pop();
        }
    );
    assert_eq!(decision.map(|d| d.reason).ok(), Some(Reason::BestChance));
    assert_eq!(behind_two.received.elapsed(), Duration::from_millis(300));
}

/// An engine seen one request at a time only (20 tok/s, 3.2 s a request), by a class that
/// wants 10 tok/s and a first token within a second, and queues.
pub(super) fn seen_one_at_a_time() -> Router {
    let classes = "- {name: waits, min_tps: 10, max_ttft_ms: 1000, on_miss: queue}\n";
    let router = router_from(&["seen_alone"], classes, 0.0);
    teach_each(&router, 0, &[(1.0, 0.1, 20.0); 16]);
    router
}

#[tokio::test(start_paused = true)]
async fn at_its_turn_a_request_takes_a_backend_beyond_its_curves_evidence_rather_than_a_429() {
    // Seen one request at a time only (20 tok/s, 3.2 s a request), the engine holds two: a
    // third is beyond twice what its curve has seen, a guess an arriving request does not
    // take. In line, with no slot due before its 1-s target, the guess beats the sure miss of
    // a 429 (seen on two CPU engines warmed at 0.5 req/s then offered 2: 20 of 60 refused
    // while the batching engine's guess said every one would be good).
    let router = seen_one_at_a_time();
    let _held = occupy(&router, 0, 0, 2);
    arrives_in_line_and_goes_at_its_turn(&router).await;
}

#[tokio::test(start_paused = true)]
async fn at_its_turn_a_request_takes_one_guess_beyond_its_curves_evidence_not_a_burst_of_them() {
    // Seen one request at a time only, the curve fits no cost per request: it guesses 20 tok/s
    // at any load. With a guess already in flight (three there, twice what it has seen is
    // two), the next in line does not bet on the same guess: a line of ten, each at its turn,
    // once took it together on a GPU and all ten streamed at 10 tok/s against 16.
    let router = seen_one_at_a_time();
    let _held = occupy(&router, 0, 0, 3);
    assert!(
        wait::in_line(&router, &ask(&router, 0), Share::default())
            .await
            .is_err(),
        "it waits for what the guess teaches, and gets a 429 if nothing frees in time"
    );
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

#[tokio::test(start_paused = true)]
async fn at_its_turn_a_request_takes_any_worthwhile_chance_once_waiting_could_only_end_in_a_429() {
    // At two in flight the noisy engine's first tokens come within the 1-s target four times
    // in ten. Arriving to an empty line, a request leaves that chance for a better slot; in
    // line, with no slot due before its target, waiting could only end in a 429: it takes it.
    let router = noisy_engine(4, 6);
    let _held = occupy(&router, 0, 0, 1);
    arrives_in_line_and_goes_at_its_turn(&router).await;
}

/// An engine seen from 1 to 8 in flight slowing as a line (40 ms + 7 ms per request a token,
/// each request ±3% about that), eight requests a level, first tokens in 50 ms: at 8 it meets
/// 10 tok/s at the 90th percentile; the line says it would not at 9.
pub(super) fn a_line_up_to_eight() -> Vec<(f64, f64, f64)> {
    (1..=8_u32)
        .flat_map(|c| {
            let median = 1.0 / (0.040 + 0.007 * f64::from(c));
            [0.97, 0.98, 0.99, 1.0, 1.0, 1.01, 1.02, 1.03].map(|k| (f64::from(c), 0.05, median * k))
        })
        .collect()
}

#[test]
fn a_level_past_the_evidence_is_tried_one_request_at_a_time_before_it_is_condemned() {
    // The line through 1 to 8 predicts 9.7 tok/s at 9, but nobody has seen 9: an engine's
    // cost per request can stop growing past a batch (an H200's did from 8 on). Where the
    // other end is a 429, one request is sent to find out, with its chance as if the speed
    // held; a second waits until the first has told, a few tokens in.
    let router = router_from(&["bends"], MARGINAL, 0.0);
    teach_each(&router, 0, &a_line_up_to_eight());
    let ask = ask(&router, 0);
    let _held = occupy(&router, 0, 0, 8);
    let ninth = &router.candidates(&ask, Policy::Headroom)[0];
    assert!(
        !ninth.feasible() && ninth.prediction().is_some_and(|p| p.unproven),
        "{ninth:?}"
    );
    let mut probe = router.route(&ask).unwrap().unwrap();
    assert_eq!(probe.reason, Reason::BestChance, "a probe");
    assert_eq!(
        reason_of(&router, &ask),
        Err(ErrorKind::SloUnmet),
        "one probe at a time"
    );
    // Its first tokens streamed at 10.4 tok/s, as at 8: the curve learns it, and the next
    // level is tried at once.
    teach_each(&router, 0, &[(9.0, 0.05, 10.4)]);
    probe.guard.trial().read_early_done();
    assert_eq!(reason_of(&router, &ask), Ok(Reason::BestChance));
}

#[tokio::test(start_paused = true)]
async fn a_request_at_its_turn_in_line_probes_a_level_nobody_has_tried_rather_than_wait_for_a_slot()
{
    // Eight in flight, each about 6 s: a slot frees in time, and waiting for it at the levels
    // the curve has proven would hold the engine at eight while the line grows. The request at
    // the head of the line tries the ninth level instead; an arrival to an empty line waits
    // for its turn, as the line is the sign that the proven levels do not hold the load.
    let classes = "- {name: waits, min_tps: 10, max_ttft_ms: 1000, on_miss: queue}\n";
    let router = router_from(&["bends"], classes, 0.0);
    teach_each(&router, 0, &a_line_up_to_eight());
    let _held = occupy(&router, 0, 0, 8);
    assert!(
        !router.no_slot_in_time(&ask(&router, 0)),
        "a slot is due in time"
    );
    arrives_in_line_and_goes_at_its_turn(&router).await;
}

#[test]
fn a_level_whose_few_samples_read_slow_is_tried_again_not_shut() {
    // Two requests at 9 read 9 tok/s (beside a neighbour's pass, say): fewer samples than a
    // level needs to be trusted, weighed against a line that slopes the same way. Where the
    // other end is a 429, the level is tried again, one request at a time, at the speed the
    // eight there now stream; once enough samples there say it is slow, it is shut.
    let router = router_from(&["bends"], MARGINAL, 0.0);
    teach_each(&router, 0, &a_line_up_to_eight());
    teach_each(&router, 0, &[(9.0, 0.05, 9.0); 2]);
    let ask = ask(&router, 0);
    let _held = occupy(&router, 0, 0, 8);
    let ninth = router.candidates(&ask, Policy::Headroom).swap_remove(0);
    assert!(
        !ninth.feasible() && ninth.prediction().is_some_and(|p| p.unproven),
        "{ninth:?}"
    );
    assert_eq!(
        reason_of(&router, &ask),
        Ok(Reason::BestChance),
        "tried again"
    );
    teach_each(&router, 0, &[(9.0, 0.05, 9.0); 4]);
    let ninth = router.candidates(&ask, Policy::Headroom).swap_remove(0);
    assert!(ninth.prediction().is_some_and(|p| !p.unproven), "{ninth:?}");
    assert_eq!(reason_of(&router, &ask), Err(ErrorKind::SloUnmet), "shut");
}

#[test]
fn past_its_trusted_levels_a_curve_believes_a_levels_own_samples_over_its_line() {
    // The probe at 9 streamed at 10.4 tok/s, as at 8: the engine holds its speed there.
    // Against a line through the levels below (9.7), that one sample is what 9 is.
    let router = router_from(&["bends"], MARGINAL, 0.0);
    teach_each(&router, 0, &a_line_up_to_eight());
    teach_each(&router, 0, &[(9.0, 0.05, 10.4)]);
    let _held = occupy(&router, 0, 0, 8);
    let ninth = router
        .candidates(&ask(&router, 0), Policy::Headroom)
        .swap_remove(0);
    let p = ninth.prediction().unwrap();
    assert!((p.per_user_tps_p50 - 10.4).abs() < 0.1, "{p:?}");
    assert!(ninth.feasible(), "{ninth:?}");
}

#[test]
fn past_its_trusted_levels_a_slow_sample_is_weighed_against_the_line_not_believed() {
    // A probe at 9 that read 5 tok/s (beside a neighbour's pass, say) is evidence, not the
    // verdict: believed outright, it would hold the level shut for a half-life with nobody
    // let in to correct it. One sample weighs as much as the line's 9.7 tok/s.
    let router = router_from(&["bends"], MARGINAL, 0.0);
    teach_each(&router, 0, &a_line_up_to_eight());
    teach_each(&router, 0, &[(9.0, 0.05, 5.0)]);
    let _held = occupy(&router, 0, 0, 8);
    let p = router.candidates(&ask(&router, 0), Policy::Headroom)[0]
        .prediction()
        .copied()
        .unwrap();
    assert!(
        p.per_user_tps_p50 > 6.5 && p.per_user_tps_p50 < 9.0,
        "{p:?}"
    );
}

#[test]
fn batch_work_waits_at_the_gateway_rather_than_in_a_busy_engines_queue() {
    // A serial engine runs a batch request; a second would wait behind it there, holding a
    // slot for that one engine's turn and adding next to nothing. It waits in the gateway's
    // line instead, for whichever backend frees first.
    let router = router_with(&["serial"], "", "- {name: batch}\n", 0.0);
    let mut serial = vec![(1.0, 0.05, 100.0); 8];
    serial.extend([(2.0, 1.35, 100.0); 8]);
    teach_each(&router, 0, &serial);
    let mut running = occupy(&router, 0, 0, 1);
    running[0].first_token(Instant::now());
    let waiting = router
        .candidates(&ask(&router, 0), Policy::Headroom)
        .swap_remove(0);
    assert!(waiting.queues(), "{waiting:?}");
    assert_eq!(chosen(&router, 0), Err(ErrorKind::NoBackendAvailable));
    drop(running);
    assert_eq!(chosen(&router, 0), Ok("serial"), "idle, it takes it");
}
