//! Each rung of the decision ladder alone: the scene a request brings, the one rung asked, and
//! what it gives the user.

use super::*;
use crate::prefix::RequestPrefix;
use crate::router::rungs::batch::Batch;
use crate::router::rungs::best_chance::BestChance;
use crate::router::rungs::explore::Explore;
use crate::router::rungs::holder::Holder;
use crate::router::rungs::place::Place;
use crate::router::rungs::policy::ByPolicy;
use crate::router::rungs::retry_idle::RetryIdle;
use crate::router::rungs::slow_start::SlowStart;
use crate::router::scene::{Rung, Scene};

/// What `rung` alone picks for `ask` under `policy`, as the backend's name and the reason: on
/// arrival, the line empty, exploring where `explore` says.
fn alone(
    router: &Router,
    rung: &dyn Rung,
    ask: &Ask<'_>,
    policy: Policy,
    explore: bool,
) -> Option<(String, Reason)> {
    let candidates = router.candidates(ask, policy);
    let scene = Scene {
        ask,
        policy,
        classes: &router.classes,
        candidates: &candidates,
        on_miss: router.on_miss(ask).0,
        turn: None,
        line_empty: true,
        may_explore: explore,
        in_time: true,
    };
    let pick = rung.pick(&scene)?;
    let name = candidates[pick.candidate].backend.config.name.to_string();
    Some((name, pick.reason))
}

fn name(s: &str, reason: Reason) -> Option<(String, Reason)> {
    Some((s.to_owned(), reason))
}

#[test]
fn exploring_tries_the_backend_the_curve_knows_least_only_within_the_budget() {
    let router = router_over(&["seen", "unseen"]);
    teach(&router, 0, 1.0);
    let ask = ask(&router, 0);
    assert_eq!(
        alone(&router, &Explore, &ask, Policy::Headroom, true),
        name("unseen", Reason::Explore)
    );
    assert_eq!(
        alone(&router, &Explore, &ask, Policy::Headroom, false),
        None
    );
}

#[test]
fn the_backend_holding_the_prompt_keeps_it_over_more_headroom_elsewhere() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 0.5);
    teach(&router, 1, 0.5);
    let prefix = held_by(&router, 0);
    let _busy = occupy(&router, 0, 1, 3);
    let with_prefix = Ask {
        prompt_tokens: 4000,
        prefix: Some(&prefix),
        ..ask(&router, 1)
    };
    assert_eq!(
        alone(&router, &Holder, &with_prefix, Policy::Headroom, false),
        name("a", Reason::Feasible)
    );
    let blind = Ask {
        prefix: None,
        ..with_prefix
    };
    assert_eq!(
        alone(&router, &Holder, &blind, Policy::Headroom, false),
        None
    );
}

#[test]
fn a_new_prompt_worth_holding_goes_to_the_emptiest_cache() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 0.5);
    teach(&router, 1, 0.5);
    routed_to(&router, 0, 1000);
    routed_to(&router, 0, 2000);
    let new = RequestPrefix {
        hashes: (5000..5040).collect(),
        hint: None,
    };
    let ask = Ask {
        prompt_tokens: 2560,
        prefix: Some(&new),
        ..ask(&router, 1)
    };
    assert_eq!(
        alone(&router, &Place, &ask, Policy::Headroom, false),
        name("b", Reason::Feasible)
    );
    assert_eq!(
        alone(&router, &Place, &ask, Policy::Pack, false),
        None,
        "pack keeps its own order"
    );
}

#[test]
fn headroom_takes_the_backend_with_the_most_room_and_pack_the_least() {
    let router = router_over(&["a", "b"]);
    teach(&router, 0, 1.0);
    teach(&router, 1, 0.5);
    let ask = ask(&router, 0);
    assert_eq!(
        alone(&router, &ByPolicy, &ask, Policy::Headroom, false),
        name("b", Reason::Feasible)
    );
    assert_eq!(
        alone(&router, &ByPolicy, &ask, Policy::Pack, false),
        name("a", Reason::Feasible)
    );
}

#[test]
fn a_never_observed_backend_takes_a_lone_request_first() {
    let router = router_over(&["seen", "unseen"]);
    teach(&router, 0, 1.0);
    let ask = ask(&router, 0);
    assert_eq!(
        alone(&router, &SlowStart, &ask, Policy::Headroom, false),
        name("unseen", Reason::ColdStart)
    );
    let _first = occupy(&router, 1, 0, 1);
    assert_eq!(
        alone(&router, &SlowStart, &ask, Policy::Headroom, false),
        None,
        "one at a time until its first token tells the ramp"
    );
}

#[test]
fn an_idle_backend_on_thin_evidence_is_tried_again_where_it_costs_nobody() {
    let router = router_from(&["unlucky"], marginal::MARGINAL, 0.0);
    // One slow first token alone (1.4 s, past the 1-s target) and nothing else.
    marginal::teach_each(&router, 0, &[(1.0, 1.4, 64.0)]);
    let ask = ask(&router, 0);
    assert_eq!(
        alone(&router, &RetryIdle, &ask, Policy::Headroom, false),
        name("unlucky", Reason::Explore)
    );
    let _busy = occupy(&router, 0, 0, 1);
    assert_eq!(
        alone(&router, &RetryIdle, &ask, Policy::Headroom, false),
        None,
        "not once it is busy"
    );
}

#[test]
fn a_backend_short_of_the_percentile_still_takes_a_request_likely_to_be_good() {
    let router = router_from(&["noisy"], marginal::MARGINAL, 0.0);
    marginal::teach_each(&router, 0, &marginal::short_of_ten());
    let _held = occupy(&router, 0, 0, 3);
    let ask = ask(&router, 0);
    assert_eq!(
        alone(&router, &ByPolicy, &ask, Policy::Headroom, false),
        None
    );
    assert_eq!(
        alone(&router, &BestChance, &ask, Policy::Headroom, false),
        name("noisy", Reason::BestChance)
    );
}

#[test]
fn batch_work_goes_where_a_latency_request_could_still_join_after_it() {
    let router = router();
    teach(&router, 0, 1.0);
    let batch = ask(&router, 2);
    let mut held = occupy(&router, 0, 2, 12);
    assert_eq!(
        alone(&router, &Batch, &batch, Policy::Headroom, false),
        name("a", Reason::Feasible)
    );
    held.extend(occupy(&router, 0, 2, 1));
    assert_eq!(
        alone(&router, &Batch, &batch, Policy::Headroom, false),
        None
    );
}

/// The ladder a latency request climbs is the numbered list docs/ARCHITECTURE.md gives, in
/// its order, each rung named for its file in `router/rungs/`.
#[test]
fn the_ladder_climbs_the_rungs_in_the_order_the_architecture_lists_them() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"),
    )
    .unwrap();
    let from = page.find("**The ladder**").unwrap();
    let to = from + page[from..].find("A batch request's").unwrap();
    let listed: Vec<&str> = page[from..to]
        .lines()
        .filter_map(|l| l.split_once(". `")?.1.split_once(".rs`").map(|(f, _)| f))
        .collect();
    let climbed: Vec<&str> = crate::router::ladder::LATENCY
        .iter()
        .map(|r| r.name())
        .collect();
    assert_eq!(climbed, listed);
    for name in climbed {
        let file = format!("{}/src/router/rungs/{name}.rs", env!("CARGO_MANIFEST_DIR"));
        assert!(std::path::Path::new(&file).exists(), "{file}");
    }
}
