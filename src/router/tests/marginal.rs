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

/// A class that wants 10 tok/s and a first token within a second, waiting in line on a miss,
/// before a noisy engine on shared cores: first tokens in 0.1 s alone; at two in flight eight in
/// ten in 0.2 s and two in ten after 2 s, so its p90 misses the 1-s target there while most
/// requests meet it; 60 tok/s throughout.
fn noisy_at_two() -> Router {
    noisy_engine(8, 2)
}

/// The noisy engine of [`noisy_at_two`], its first tokens at two in flight `fast` times in
/// 0.2 s and `slow` times after 2 s.
fn noisy_engine(fast: usize, slow: usize) -> Router {
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
    let decision = router.wait_in_line(&ask(router, 0), Share::default()).await;
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
    let (decision, ()) = tokio::join!(router.wait_in_line(&behind_two, Share::default()), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.pop();
    });
    assert_eq!(decision.map(|d| d.reason).ok(), Some(Reason::BestChance));
    assert_eq!(behind_two.received.elapsed(), Duration::from_millis(300));
}

/// An engine seen one request at a time only (20 tok/s, 3.2 s a request), by a class that
/// wants 10 tok/s and a first token within a second, and queues.
fn seen_one_at_a_time() -> Router {
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
        router
            .wait_in_line(&ask(&router, 0), Share::default())
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

/// Two engines on one device as measured on a shared host: `batching` decodes at 10 ms + 1 ms
/// per own request a token, and 20 ms more while the engine beside it runs (a serial engine's
/// forward pass takes the device from its whole batch); `serial` decodes alone at 8 ms a
/// token, 2 ms more while the batching engine runs. Both seen with their neighbour idle and
/// busy.
fn shared_host(extra: &str) -> Router {
    shared_host_for(extra, MARGINAL_SPEED)
}

/// [`shared_host`] with the classes `classes`.
fn shared_host_for(extra: &str, classes: &str) -> Router {
    let router = batching_beside_an_engine(extra, classes);
    let mut serial = Vec::new();
    for n in [0.0, 1.0, 0.0, 1.0] {
        for _ in 0..8 {
            serial.push((1.0, n, 0.05, 1.0 / (0.008 + 0.002 * n)));
        }
    }
    // A second request waits for the first: its first token after the first's 64 tokens.
    serial.extend([(2.0, 0.0, 0.05 + 64.0 * 0.008, 125.0); 4]);
    teach_beside(&router, 1, &serial);
    router
}

/// [`shared_host`]'s batching engine, its neighbour `serial` not yet observed.
fn batching_beside_an_engine(extra: &str, classes: &str) -> Router {
    let router = router_with(&["batching", "serial"], extra, classes, 0.0);
    let mut batching = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        for n in [0.0, 0.0, 0.0, 1.0] {
            for _ in 0..4 {
                batching.push((c, n, 0.05, 1.0 / (0.010 + 0.001 * c + 0.020 * n)));
            }
        }
    }
    teach_beside(&router, 0, &batching);
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
    assert!(!serial.keeps_others(), "but not the others'");
    assert!(serial.neighbour_loss > 1.0, "{}", serial.neighbour_loss);
    assert_eq!(chosen(&router, 0), Ok("batching"));
    // Alone on its device, the serial engine is as good a place as any.
    drop(decoding);
    assert!(router.candidates(&ask, Policy::Headroom)[1].feasible());
}

#[test]
fn a_running_engine_slows_its_neighbours_by_its_pass_not_by_the_requests_it_carries() {
    // 90 tok/s at the median: the serial engine makes it beside a running batch (10 ms a
    // token), whether that batch carries one request or three; it would not if each of them
    // cost it 2 ms more.
    let router = shared_host_for(
        ", device: host",
        "- {name: quick, min_tps: 90, tps_percentile: 50, max_ttft_ms: 1000, on_miss: shed}\n",
    );
    let decoding = |i: usize, n: usize| {
        let mut held = occupy(&router, i, 0, n);
        for request in &mut held {
            request.first_token(Instant::now());
        }
        held
    };
    let speed_on_serial = |router: &Router| {
        router.candidates(&ask(router, 0), Policy::Headroom)[1]
            .prediction
            .unwrap()
            .per_user_tps_p50
    };
    let _one = decoding(0, 1);
    let beside_one = speed_on_serial(&router);
    let two_more = decoding(0, 2);
    assert_eq!(speed_on_serial(&router), beside_one);
    assert!((beside_one - 100.0).abs() < 5.0, "{beside_one}");
    drop(two_more);
    // The serial engine runs a request of this class: a request joining the running batch
    // adds no pass beside it, and costs it nothing.
    let _serial = decoding(1, 1);
    let loss = router.candidates(&ask(&router, 0), Policy::Headroom)[0].neighbour_loss;
    assert_eq!(loss, 0.0);
}

#[test]
fn an_idle_engine_is_tried_again_only_where_its_pass_costs_the_requests_beside_it_nothing() {
    // The batching engine is full (its limit, 4) with requests at 71 tok/s; the engine beside
    // it has two slow samples, too few to condemn it. Its pass would slow those four to
    // 29 tok/s, under their 60: it is not tried, and the request gets its class's `on_miss`.
    // Told of no device, it is tried.
    let classes =
        "- {name: quick, min_tps: 60, tps_percentile: 50, max_ttft_ms: 1000, on_miss: shed}\n";
    for (extra, tried) in [
        (", device: host, max_concurrency: 4", false),
        (", max_concurrency: 4", true),
    ] {
        let router = batching_beside_an_engine(extra, classes);
        teach_beside(&router, 1, &[(1.0, 1.0, 0.05, 30.0); 2]);
        let mut full = occupy(&router, 0, 0, 4);
        for request in &mut full {
            request.first_token(Instant::now());
        }
        let reason = reason_of(&router, &ask(&router, 0));
        assert_eq!(reason == Ok(Reason::Explore), tried, "{extra}: {reason:?}");
    }
}

#[test]
fn an_engine_seen_only_beside_another_is_not_judged_alone_by_its_neighbours_passes() {
    // The batching engine has only ever run beside the serial one, whose pass cost each of its
    // tokens 20 ms: its own curve cannot tell that from its base, and alone it reads 32 tok/s,
    // under the class's 41. The serial engine, seen with and without the batching one beside
    // it, learned what a pass beside it costs: 20 ms. With that, the batching engine alone
    // gives a request 53 tok/s and leaves the next one room (51 as its second), where the
    // serial engine would keep the next one waiting behind it (1.2 s) or put it beside itself
    // on the batching engine (32 tok/s).
    let router = router_with(
        &["batching", "serial"],
        ", device: host",
        MARGINAL_SPEED,
        0.0,
    );
    let mut batching = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        batching.extend([(c, 1.0, 0.05, 1.0 / (0.010 + 0.001 * c + 0.020)); 8]);
    }
    teach_beside(&router, 0, &batching);
    let mut serial = Vec::new();
    for n in [0.0, 1.0, 0.0, 1.0] {
        serial.extend([(1.0, n, 0.05, 1.0 / (0.008 + 0.020 * n)); 8]);
    }
    serial.extend([(2.0, 0.0, 1.2, 125.0); 4]);
    teach_beside(&router, 1, &serial);
    let fit = |i: usize| router.backends[i].model("m").unwrap().fit;
    assert_eq!(fit(0).tpot_per_neighbour_s, 0.0, "{:?}", fit(0));
    assert!(
        (fit(1).tpot_per_neighbour_s - 0.020).abs() < 1e-6,
        "{:?}",
        fit(1)
    );
    assert_eq!(chosen(&router, 0), Ok("batching"));
}

#[test]
fn backends_that_share_no_device_are_not_charged_for_each_other() {
    let router = shared_host("");
    let _decoding = occupy(&router, 0, 0, 2);
    let candidates = router.candidates(&ask(&router, 0), Policy::Headroom);
    assert!(candidates[1].keeps_others() && candidates[1].neighbour_loss == 0.0);
    assert_eq!(
        chosen(&router, 0),
        Ok("serial"),
        "the most room, by its own curve"
    );
}

#[test]
fn with_both_engines_idle_a_request_goes_where_it_leaves_the_next_one_room() {
    // Alone, the serial engine gives a request as much slack as the batching engine (their
    // first tokens bind: 50 ms of a second). But a next request would then wait behind it
    // there (0.56 s), or join the batching engine at 32 tok/s beside it; placed on the batching
    // engine, it leaves the next one 83 tok/s there, or 100 on the serial engine beside it.
    let router = shared_host(", device: host");
    let candidates = router.candidates(&ask(&router, 0), Policy::Headroom);
    let (batching, serial) = (&candidates[0], &candidates[1]);
    let rooms = (batching.slack, batching.room(), serial.slack, serial.room());
    assert!(serial.slack >= batching.slack, "{rooms:?}");
    assert!(serial.room() < 0.5 && batching.room() > 0.9, "{rooms:?}");
    assert_eq!(chosen(&router, 0), Ok("batching"));
    // Told of no device, each is ranked by its own slack: placing a request on one changes
    // nothing on the other.
    let untold = shared_host("");
    for c in untold.candidates(&ask(&untold, 0), Policy::Headroom) {
        assert_eq!(c.room(), c.slack);
    }
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
fn a_line_up_to_eight() -> Vec<(f64, f64, f64)> {
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
        !ninth.feasible() && ninth.prediction.is_some_and(|p| p.unproven),
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
    probe.guard.read_early_done();
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
        !ninth.feasible() && ninth.prediction.is_some_and(|p| p.unproven),
        "{ninth:?}"
    );
    assert_eq!(
        reason_of(&router, &ask),
        Ok(Reason::BestChance),
        "tried again"
    );
    teach_each(&router, 0, &[(9.0, 0.05, 9.0); 4]);
    let ninth = router.candidates(&ask, Policy::Headroom).swap_remove(0);
    assert!(ninth.prediction.is_some_and(|p| !p.unproven), "{ninth:?}");
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
    let p = ninth.prediction.unwrap();
    assert!((p.per_user_tps_p50 - 10.4).abs() < 0.1, "{p:?}");
    assert!(ninth.feasible(), "{ninth:?}");
}

#[test]
fn batch_work_queued_on_a_busy_engine_is_charged_the_pass_it_keeps_beside_its_neighbours() {
    // The serial engine (33 tok/s, too slow for the class) runs a batch request; a second
    // would wait for it, then run its own pass beside the batching engine's two latency
    // requests, taking them from 83 tok/s to 31, under their 41. It waits in line instead.
    let classes = format!("{MARGINAL_SPEED}- {{name: batch}}\n");
    let router = batching_beside_an_engine(", device: host", &classes);
    let mut serial = Vec::new();
    for n in [0.0, 1.0, 0.0, 1.0] {
        serial.extend([(1.0, n, 0.05, 1.0 / (0.030 + 0.002 * n)); 8]);
    }
    serial.extend([(2.0, 0.0, 0.05 + 64.0 * 0.030, 33.0); 4]);
    teach_beside(&router, 1, &serial);
    let mut running = occupy(&router, 0, 0, 2);
    running.extend(occupy(&router, 1, 1, 1));
    for request in &mut running {
        request.first_token(Instant::now());
    }
    let on_serial = router
        .candidates(&ask(&router, 1), Policy::Headroom)
        .swap_remove(1);
    assert!(
        !on_serial.keeps_others() && on_serial.neighbour_loss > 1.0,
        "{on_serial:?}"
    );
    assert_eq!(chosen(&router, 1), Err(ErrorKind::NoBackendAvailable));
    // Idle, its pass would leave the batching engine no room for a latency request.
    drop(running);
    let on_serial = router
        .candidates(&ask(&router, 1), Policy::Headroom)
        .swap_remove(1);
    assert!(!on_serial.leaves_room, "{on_serial:?}");
}

#[test]
fn until_the_device_tells_what_a_pass_costs_it_is_charged_a_lone_token_of_the_engine_beside() {
    // Both engines seen only with the other idle: nothing says what the serial engine's pass
    // costs the two latency requests decoding on the batching engine (12 ms a token). Charged
    // a lone token of the serial engine (20 ms), it takes them to 31 tok/s, under the class's
    // 41: neither a latency request nor batch work starts it beside them. Once the batching
    // engine has run beside the pass (2 ms a token more: 71 tok/s), both may.
    let classes = format!("{MARGINAL_SPEED}- {{name: batch}}\n");
    let router = router_with(&["batching", "serial"], ", device: host", &classes, 0.0);
    let mut batching = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        batching.extend([(c, 0.0, 0.05, 1.0 / (0.010 + 0.001 * c)); 16]);
    }
    teach_beside(&router, 0, &batching);
    let mut serial = vec![(1.0, 0.0, 0.05, 50.0); 16];
    serial.extend([(2.0, 0.0, 0.5, 50.0); 4]);
    teach_beside(&router, 1, &serial);
    let mut decoding = occupy(&router, 0, 0, 2);
    for request in &mut decoding {
        request.first_token(Instant::now());
    }
    let on_serial = |class: usize| {
        router
            .candidates(&ask(&router, class), Policy::Headroom)
            .swap_remove(1)
    };
    let latency = on_serial(0);
    assert!(
        !latency.keeps_others() && latency.neighbour_loss > 1.0,
        "{latency:?}"
    );
    assert!(!on_serial(1).leaves_room, "{:?}", on_serial(1));
    let beside: Vec<_> = [1.0, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|&c| [(c, 1.0, 0.05, 1.0 / (0.012 + 0.001 * c)); 16])
        .collect();
    teach_beside(&router, 0, &beside);
    let latency = on_serial(0);
    assert!(
        latency.keeps_others() && latency.neighbour_loss < 0.1,
        "{latency:?}"
    );
    assert!(on_serial(1).leaves_room, "{:?}", on_serial(1));
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
        .prediction
        .unwrap();
    assert!(
        p.per_user_tps_p50 > 6.5 && p.per_user_tps_p50 < 9.0,
        "{p:?}"
    );
}

#[test]
fn requests_at_a_level_the_curve_has_not_proven_are_charged_a_neighbours_pass_as_if_meeting_their_target()
 {
    // The batching engine was seen from 1 to 4 in flight, 5 ms more a token per request: 33
    // tok/s at 4, and its line says 20 at 8. Eight decode there now, where the line is only a
    // guess (an H200's engine held its speed past 8). The serial engine's pass would cost them
    // 20 ms a token: charged at the line's 20 tok/s they would have nothing to lose; taken to
    // make their median 30 tok/s, as they were let in to, half of them lose it. (Held to the
    // speed of the last level proven, requests on a curve with none proven yet were charged
    // as at one in flight, and lost nothing.)
    let router = batching_and_serial_at_30();
    let mut batching = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        for n in [0.0, 0.0, 0.0, 1.0] {
            batching.extend([(c, n, 0.05, 1.0 / (0.010 + 0.005 * c + 0.020 * n)); 4]);
        }
    }
    assert_half_of_eight_lose_their_target_beside_the_serial_pass(&router, &batching);
}

#[test]
fn requests_on_a_curve_with_no_level_proven_yet_are_not_charged_a_neighbours_pass_as_if_alone() {
    // Two samples a level, 1 to 4 in flight (none proven), 5 ms more a token per request and
    // 10 ms more beside the serial engine's pass. Eight decode: at one in flight the pass
    // would leave 40 tok/s, but at eight it takes their 30 to 25.
    let router = batching_and_serial_at_30();
    let batching: Vec<_> = [1.0, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|&c| [0.0, 1.0].map(|n| (c, n, 0.05, 1.0 / (0.010 + 0.005 * c + 0.010 * n))))
        .collect();
    assert_half_of_eight_lose_their_target_beside_the_serial_pass(&router, &batching);
}

/// `batching` and `serial` on one device, a class that wants a median of 30 tok/s.
fn batching_and_serial_at_30() -> Router {
    let classes = "- {name: interactive, min_tps: 30, tps_percentile: 50, max_ttft_ms: 1000, on_miss: shed}\n";
    router_with(&["batching", "serial"], ", device: host", classes, 0.0)
}

/// With the batching engine taught `batching` and eight of its requests decoding, a request
/// on the serial engine (100 tok/s alone) is charged half of them: taken to make their median
/// 30 tok/s, they lose it beside its pass.
fn assert_half_of_eight_lose_their_target_beside_the_serial_pass(
    router: &Router,
    batching: &[(f64, f64, f64, f64)],
) {
    teach_beside(router, 0, batching);
    teach_each(router, 1, &[(1.0, 0.05, 100.0); 8]);
    let mut decoding = occupy(router, 0, 0, 8);
    for request in &mut decoding {
        request.first_token(Instant::now());
    }
    let serial = router
        .candidates(&ask(router, 0), Policy::Headroom)
        .swap_remove(1);
    assert!(
        !serial.keeps_others() && serial.neighbour_loss >= 4.0 - 1e-9,
        "{serial:?}"
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
    assert!(waiting.queues, "{waiting:?}");
    assert_eq!(chosen(&router, 0), Err(ErrorKind::NoBackendAvailable));
    drop(running);
    assert_eq!(chosen(&router, 0), Ok("serial"), "idle, it takes it");
}

#[test]
fn requests_on_an_engine_short_of_the_target_even_alone_are_charged_a_neighbours_pass_only_what_they_could_still_lose()
 {
    // Seen on an H200 with fresh engines: the batching engine's first samples, slowed by its
    // warm-up and the serial engine's passes, read 9 to 14 tok/s at 1 and 2 in flight, under
    // the class's 16 even alone. Its two requests there came in on their best chance, not to
    // meet the target; taken to meet it, they were charged nine tenths of a completion each
    // for the idle serial engine's pass, and the next requests joined them at a chance of
    // 0.06 or waited for a 429 while the serial engine (55 tok/s) stood idle.
    let classes = "- {name: interactive, min_tps: 16, max_ttft_ms: 1000, on_miss: queue}\n";
    let router = router_with(&["batching", "serial"], ", device: gpu", classes, 0.0);
    teach_beside(
        &router,
        0,
        &[
            (1.0, 0.0, 0.05, 14.0),
            (1.0, 1.0, 0.05, 9.0),
            (2.0, 0.0, 0.1, 12.0),
            (2.0, 1.0, 0.1, 10.0),
        ],
    );
    teach_beside(
        &router,
        1,
        &[(1.0, 0.0, 0.04, 55.0), (1.0, 1.0, 0.04, 36.0)],
    );
    let mut decoding = occupy(&router, 0, 0, 2);
    for request in &mut decoding {
        request.first_token(Instant::now());
    }
    let serial = router
        .candidates(&ask(&router, 0), Policy::Headroom)
        .swap_remove(1);
    assert!(serial.chance > 0.9, "{}", serial.chance);
    assert!(serial.neighbour_loss < 0.5, "{}", serial.neighbour_loss);
    assert_eq!(chosen(&router, 0), Ok("serial"));
}

#[test]
fn an_idle_engine_is_not_tried_beside_requests_whose_share_of_the_target_its_pass_would_cost() {
    // The batching engine runs four requests at 71 tok/s, spread ±10%; the engine beside it
    // has two slow samples (20 tok/s), too few to condemn it. Its pass would take the four to
    // 29 tok/s: their 10th percentile still clears the class's 26, but some would now miss
    // where none did. It is not tried while they decode; told of no device, it is.
    let classes = "- {name: quick, min_tps: 26, max_ttft_ms: 1000, on_miss: shed}\n";
    for (extra, tried) in [
        (", device: host, max_concurrency: 4", false),
        (", max_concurrency: 4", true),
    ] {
        let router = router_with(&["batching", "serial"], extra, classes, 0.0);
        let mut batching = Vec::new();
        for c in [1.0, 2.0, 3.0, 4.0] {
            for n in [0.0, 0.0, 0.0, 1.0] {
                for k in [0.9, 0.95, 1.0, 1.05, 1.1] {
                    batching.push((c, n, 0.05, k / (0.010 + 0.001 * c + 0.020 * n)));
                }
            }
        }
        teach_beside(&router, 0, &batching);
        teach_beside(&router, 1, &[(1.0, 1.0, 0.05, 20.0); 2]);
        let mut full = occupy(&router, 0, 0, 4);
        for request in &mut full {
            request.first_token(Instant::now());
        }
        let candidates = router.candidates(&ask(&router, 0), Policy::Headroom);
        let serial = candidates
            .iter()
            .find(|c| &*c.backend.config.name == "serial")
            .unwrap();
        assert!(serial.keeps_others(), "{extra}: {}", serial.neighbour_loss);
        assert_eq!(
            serial.neighbour_loss > 0.05,
            !tried,
            "{extra}: {}",
            serial.neighbour_loss
        );
        let reason = reason_of(&router, &ask(&router, 0));
        assert_eq!(reason == Ok(Reason::Explore), tried, "{extra}: {reason:?}");
    }
}

#[test]
fn a_never_observed_engine_is_not_started_beside_a_running_one_while_that_ones_ramp_takes_the_request()
 {
    // A fresh gateway over two never-observed engines on two CPU cores: the first request goes
    // to the batching engine. Started beside it, the serial engine took the cores from it,
    // and both curves' first samples booked the other's load as their own.
    let router = router_with(&["batching", "serial"], ", device: host", MARGINAL, 0.0);
    let first = router.route(&ask(&router, 0)).unwrap().unwrap();
    assert_eq!(&*first.backend.config.name, "batching");
    // Its first token came in time: its ramp takes a second request.
    first.guard.probe_first_token(0.03);
    let second = router.route(&ask(&router, 0)).unwrap().unwrap();
    assert_eq!(
        &*second.backend.config.name, "batching",
        "the running engine's ramp, not a start beside it"
    );
    // Its ramp takes no third before the second's first token: where nothing else can take
    // the request, the idle engine is started beside the running one rather than never tried.
    assert_eq!(chosen(&router, 0), Ok("serial"));
    drop((first, second));
    assert_eq!(chosen(&router, 0), Ok("batching"), "alone, in turn");
}

#[test]
fn exploring_never_starts_an_idle_engine_on_a_device_it_shares() {
    // Two CPU cores: a serial engine never observed, explored beside two requests on the
    // batching engine, slowed every request on both under the target for 30 s; explored while
    // the device was idle, its pass still ran beside the next arrivals.
    let router = router_with(
        &["batching", "serial"],
        ", device: host",
        MARGINAL_SPEED,
        0.5,
    );
    let mut batching = vec![(1.0, 0.05, 100.0); 8];
    batching.extend([(2.0, 0.05, 90.0); 8]);
    teach_each(&router, 0, &batching);
    let running = occupy(&router, 0, 0, 1);
    assert_eq!(
        chosen(&router, 0),
        Ok("batching"),
        "not beside a running engine"
    );
    drop(running);
    assert_eq!(chosen(&router, 0), Ok("batching"), "nor on an idle device");
    // On a device of its own, the same engine is explored.
    let apart = router_with(&["batching", "serial"], "", MARGINAL_SPEED, 0.5);
    teach_each(&apart, 0, &batching);
    assert_eq!(chosen(&apart, 0), Ok("serial"));
}

#[test]
fn a_running_engine_takes_a_level_past_its_evidence_before_a_cold_one_is_started_beside_it() {
    // The batching engine, seen at one and two in flight, runs four; its ramp has ended. The
    // serial engine beside it was never observed: started now, its pass would run beside the
    // four, at a cost nothing has measured. The batching engine's line says a fifth request
    // meets the SLO there (69 tok/s), and joining it adds no pass.
    let fifth_beside_four = |classes: &str| {
        let router = router_with(&["batching", "serial"], ", device: host", classes, 0.0);
        let mut batching = vec![(1.0, 0.05, 100.0); 8];
        batching.extend([(2.0, 0.05, 90.0); 8]);
        teach_each(&router, 0, &batching);
        let missed = crate::fleet::ramp::Probe {
            admitted_with: 1,
            max_ttft_s: Some(0.01),
            min_tps: None,
        };
        router.backends[0].ramp.first_token(&missed, 1.0);
        let _running = occupy(&router, 0, 0, 4);
        let fifth = router
            .candidates(&ask(&router, 0), Policy::Headroom)
            .swap_remove(0);
        assert!(!fifth.feasible(), "beyond its evidence: {fifth:?}");
        chosen(&router, 0).map(str::to_owned)
    };
    assert_eq!(fifth_beside_four(MARGINAL_SPEED).as_deref(), Ok("batching"));
    // Where the line says a fifth misses (70 tok/s), the serial engine is started beside the
    // batch rather than never tried.
    let fast =
        "- {name: fast, min_tps: 70, tps_percentile: 50, max_ttft_ms: 1000, on_miss: shed}\n";
    assert_eq!(fifth_beside_four(fast).as_deref(), Ok("serial"));
}

#[test]
fn batch_work_never_starts_an_idle_engine_beside_a_running_one() {
    // The simulator's copy of the H200's pair at 4 req/s: a batch request started the idle
    // serial engine beside the batching engine's latency requests, and a second queued behind
    // it. Their 512 tokens each kept the device from the batch for 16 s, which the neighbour
    // cost learned so far did not show, and 84 to 95 latency requests got a 429 in 30 s.
    let classes = format!("{MARGINAL_SPEED}- {{name: batch}}\n");
    let router = router_with(&["batching", "serial"], ", device: host", &classes, 0.0);
    let mut batching = Vec::new();
    for c in [1.0, 2.0, 3.0, 4.0] {
        for n in [0.0, 0.0, 0.0, 1.0] {
            for _ in 0..4 {
                batching.push((c, n, 0.05, 1.0 / (0.010 + 0.001 * c + 0.001 * n)));
            }
        }
    }
    teach_beside(&router, 0, &batching);
    let mut serial = Vec::new();
    for n in [0.0, 1.0, 0.0, 1.0] {
        serial.extend([(1.0, n, 0.05, 1.0 / (0.008 + 0.001 * n)); 8]);
    }
    teach_beside(&router, 1, &serial);
    let running = occupy(&router, 0, 0, 1);
    let on_serial = router
        .candidates(&ask(&router, 1), Policy::Headroom)
        .swap_remove(1);
    assert!(
        on_serial.starts_beside && on_serial.keeps_others() && on_serial.leaves_room,
        "by its curves the pass would cost nobody: {on_serial:?}"
    );
    assert_eq!(
        chosen(&router, 1),
        Ok("batching"),
        "joins the running engine"
    );
    drop(running);
    assert_eq!(
        chosen(&router, 1),
        Ok("serial"),
        "an idle device: the most added"
    );
}
