//! Engines that share a device (`device:`): a pass beside the requests on another engine, what it
//! costs them, and when an idle engine may be started beside a running one.

use super::marginal::{MARGINAL, reason_of, teach_beside, teach_each};
use super::*;

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
        serial.estimate().unwrap().slack >= 0.0,
        "it meets its own SLO there: {serial:?}"
    );
    assert!(!serial.keeps_others(), "but not the others'");
    assert!(
        serial.estimate().unwrap().neighbour_loss > 1.0,
        "{}",
        serial.estimate().unwrap().neighbour_loss
    );
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
            .prediction()
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
    let loss = router.candidates(&ask(&router, 0), Policy::Headroom)[0]
        .estimate()
        .unwrap()
        .neighbour_loss;
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
    assert!(
        candidates[1].keeps_others() && candidates[1].estimate().unwrap().neighbour_loss == 0.0
    );
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
    let rooms = (
        batching.estimate().unwrap().slack,
        batching.room(),
        serial.estimate().unwrap().slack,
        serial.room(),
    );
    assert!(
        serial.estimate().unwrap().slack >= batching.estimate().unwrap().slack,
        "{rooms:?}"
    );
    assert!(serial.room() < 0.5 && batching.room() > 0.9, "{rooms:?}");
    assert_eq!(chosen(&router, 0), Ok("batching"));
    // Told of no device, each is ranked by its own slack: placing a request on one changes
    // nothing on the other.
    let untold = shared_host("");
    for c in untold.candidates(&ask(&untold, 0), Policy::Headroom) {
        assert_eq!(c.room(), c.estimate().unwrap().slack);
    }
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
        !on_serial.keeps_others() && on_serial.estimate().unwrap().neighbour_loss > 1.0,
        "{on_serial:?}"
    );
    assert_eq!(chosen(&router, 1), Err(ErrorKind::NoBackendAvailable));
    // Idle, its pass would leave the batching engine no room for a latency request.
    drop(running);
    let on_serial = router
        .candidates(&ask(&router, 1), Policy::Headroom)
        .swap_remove(1);
    assert!(!on_serial.estimate().unwrap().leaves_room, "{on_serial:?}");
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
        !latency.keeps_others() && latency.estimate().unwrap().neighbour_loss > 1.0,
        "{latency:?}"
    );
    assert!(
        !on_serial(1).estimate().unwrap().leaves_room,
        "{:?}",
        on_serial(1)
    );
    let beside: Vec<_> = [1.0, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|&c| [(c, 1.0, 0.05, 1.0 / (0.012 + 0.001 * c)); 16])
        .collect();
    teach_beside(&router, 0, &beside);
    let latency = on_serial(0);
    assert!(
        latency.keeps_others() && latency.estimate().unwrap().neighbour_loss < 0.1,
        "{latency:?}"
    );
    assert!(
        on_serial(1).estimate().unwrap().leaves_room,
        "{:?}",
        on_serial(1)
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
        !serial.keeps_others() && serial.estimate().unwrap().neighbour_loss >= 4.0 - 1e-9,
        "{serial:?}"
    );
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
    assert!(
        serial.estimate().unwrap().chance() > 0.9,
        "{}",
        serial.estimate().unwrap().chance()
    );
    assert!(
        serial.estimate().unwrap().neighbour_loss < 0.5,
        "{}",
        serial.estimate().unwrap().neighbour_loss
    );
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
        assert!(
            serial.keeps_others(),
            "{extra}: {}",
            serial.estimate().unwrap().neighbour_loss
        );
        assert_eq!(
            serial.estimate().unwrap().neighbour_loss > 0.05,
            !tried,
            "{extra}: {}",
            serial.estimate().unwrap().neighbour_loss
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
    if let Some(trial) = first.guard.trial_ref() {
        trial.first_token(0.03);
    }
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
        on_serial.starts_beside
            && on_serial.keeps_others()
            && on_serial.estimate().unwrap().leaves_room,
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
