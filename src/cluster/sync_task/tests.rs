//! What a round's reading does to this replica, without Redis: the peers' samples teach the
//! named backends' curves, health notes apply once, and the peers' ages come from their leases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::streams::StreamId;
use tokio::time::Instant;

use super::{apply_health, learn_from_peers, peers};
use crate::cluster::wire::{Clock, HealthNote, SharedSample};
use crate::curve::{Observation, Outcome};
use crate::fleet::outbox::Learned;
use crate::fleet::{Backend, Line};

/// Backends `a` and `b`, each serving `m`, on a port nothing listens on.
fn backends() -> Vec<Arc<Backend>> {
    let config = crate::config::parse(
        "backends:\n\
         - {name: a, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}}\n\
         - {name: b, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}}\n",
        |_| None,
    )
    .unwrap();
    let line = Arc::new(Line::new(config.classes.len()));
    config
        .backends
        .iter()
        .map(|b| Backend::new(b.clone(), 300.0, 0, Arc::clone(&line), None).unwrap())
        .collect()
}

/// A stream entry from `replica` with `samples`, as a round reads it.
fn entry(id: &str, replica: &str, samples: &[SharedSample]) -> StreamId {
    let text = |s: String| redis::Value::BulkString(s.into_bytes());
    StreamId {
        id: id.to_owned(),
        map: HashMap::from([
            ("r".to_owned(), text(replica.to_owned())),
            (
                "s".to_owned(),
                text(serde_json::to_string(samples).unwrap()),
            ),
        ]),
        milliseconds_elapsed_from_delivery: None,
        delivered_count: None,
    }
}

/// A request's end on `backend`, a second before `clock`'s reading.
fn ended(backend: &str, clock: &Clock) -> SharedSample {
    let obs = Observation {
        at: clock.now() - Duration::from_secs(1),
        outcome: Outcome::Completed,
        ttft: Some(0.05),
        tpot: Some(0.02),
        output_tokens: 64,
        estimated: false,
        prompt_tokens: Some(10),
        concurrency: Some(1.0),
        neighbours: 0.0,
    };
    SharedSample::new(backend, "m", &Learned::Ended(obs), clock)
}

#[test]
fn a_peers_samples_teach_the_backend_they_name_and_this_replicas_own_are_skipped() {
    let fleet = backends();
    let clock = Clock::at(Instant::now(), 1_800_000_000_000);
    let entries = [
        entry("1-0", "me", &[ended("a", &clock)]),
        entry("2-0", "peer", &[ended("b", &clock), ended("gone", &clock)]),
    ];
    let received = learn_from_peers(&entries, "me", &fleet, &clock);
    assert_eq!(received, 1, "one sample of a backend this replica has");
    assert!(
        fleet[0].model("m").is_none(),
        "its own sample was learned when it was taken"
    );
    assert!(
        fleet[1].model("m").is_some(),
        "the peer's sample is in b's curve"
    );
}

#[test]
fn a_health_note_applies_once_for_its_period() {
    let fleet = backends();
    let now = Instant::now();
    let clock = Clock::at(now, 1_800_000_000_000);
    let note = HealthNote {
        ejected_until_ms: 1_800_000_010_000,
        cooling_until_ms: 0,
    };
    let health = HashMap::from([("a".to_owned(), serde_json::to_string(&note).unwrap())]);
    let mut seen = HashMap::new();
    apply_health(&health, &mut seen, &fleet, &clock);
    assert!(!fleet[0].is_healthy(now), "ejected as the peer decided");
    assert!(!fleet[0].is_healthy(now + Duration::from_secs(9)));
    assert!(
        fleet[0].is_healthy(now + Duration::from_secs(11)),
        "for its period, no longer"
    );
    assert!(fleet[1].is_healthy(now), "the other backend untouched");
    // A note already applied (as a round that read it leaves it in `seen`) is not applied
    // again when a later round reads it, even while its period runs.
    let later = Clock::at(now + Duration::from_secs(20), 1_800_000_020_000);
    let stale = HealthNote {
        ejected_until_ms: 1_800_000_030_000,
        ..note
    };
    seen.insert("a".to_owned(), stale);
    let again = HashMap::from([("a".to_owned(), serde_json::to_string(&stale).unwrap())]);
    apply_health(&again, &mut seen, &fleet, &later);
    assert!(fleet[0].is_healthy(now + Duration::from_secs(21)));
}

#[test]
fn the_peers_are_every_lease_but_this_replicas_with_the_age_of_their_last_round() {
    // Leases of 4 s: one renewed just now runs out 4 s from now; one renewed 3 s ago, in 1 s.
    let t_ms = 1_000_000.0;
    let leases = vec![
        ("me".to_owned(), t_ms + 4_000.0),
        ("fresh".to_owned(), t_ms + 4_000.0),
        ("late".to_owned(), t_ms + 1_000.0),
    ];
    let shown = peers(leases, "me", 4_000.0, t_ms);
    let ages: Vec<(&str, f64)> = shown.iter().map(|p| (&*p.replica, p.age_s)).collect();
    assert_eq!(ages, [("fresh", 0.0), ("late", 3.0)]);
}
