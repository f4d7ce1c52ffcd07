//! The simulator's fleet file: what it accepts, and the errors that name a field.

use super::*;
use crate::yaml;

fn fleet(text: &str) -> Result<Vec<BackendSpec>, ConfigError> {
    yaml::from_str::<FleetRaw>(text)?.validate()
}

#[test]
fn defaults_describe_a_large_batching_server() {
    let specs = fleet("backends:\n  - {name: a, listen: '127.0.0.1:0', models: [m]}\n").unwrap();
    let t = &specs[0].params.timing;
    assert_eq!(t.max_batch, 64);
    assert!((1.0 / t.step(1) - 70.0).abs() < 1.0, "{}", 1.0 / t.step(1));
    assert!(
        (1.0 / t.step(64) - 15.0).abs() < 0.5,
        "{}",
        1.0 / t.step(64)
    );
}

#[test]
fn a_step_stops_growing_past_the_batch_named_and_zero_is_rejected() {
    let engine = |until: &str| {
        fleet(&format!(
            "backends:\n  - name: a\n    listen: '127.0.0.1:0'\n    models: [m]\n    engine: {{step_base_ms: 20, step_per_seq_ms: 5, step_per_seq_until: {until}}}\n"
        ))
    };
    let t = engine("8").unwrap()[0].params.timing.clone();
    assert!((t.step(4) - 0.040).abs() < 1e-12);
    assert_eq!(t.step(8), t.step(19), "flat past 8 in flight");
    let err = engine("0").unwrap_err();
    assert_eq!(err.path, "backends[0].engine.step_per_seq_until");
}

#[test]
fn serial_mode_with_a_batch_limit_is_rejected_by_field() {
    let err = fleet(
        "backends:\n  - name: a\n    listen: '127.0.0.1:0'\n    models: [m]\n    engine: {mode: serial, max_batch: 4}\n",
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[0].engine.max_batch");
    assert!(err.message.contains("serial"), "{}", err.message);
}

#[test]
fn unknown_engine_field_is_rejected_with_its_location() {
    let err = fleet(
        "backends:\n  - name: a\n    listen: '127.0.0.1:0'\n    models: [m]\n    engine:\n      step_base: 3\n",
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[0].engine.step_base");
    assert!(
        err.message.contains("unknown field `step_base`"),
        "{}",
        err.message
    );
    assert_eq!(err.location.map(|l| l.0), Some(6));
}

#[test]
fn fault_needs_exactly_one_trigger() {
    let err = fleet(
        "backends:\n  - name: a\n    listen: '127.0.0.1:0'\n    models: [m]\n    faults: [{kind: http_500}]\n",
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[0].faults[0]");
    let err = fleet(
        "backends:\n  - name: a\n    listen: '127.0.0.1:0'\n    models: [m]\n    faults: [{kind: stall, every: 2}]\n",
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[0].faults[0].delay_ms");
}

#[test]
fn duplicate_names_are_rejected() {
    let err = fleet(
        "backends:\n  - {name: a, listen: '127.0.0.1:0', models: [m]}\n  - {name: a, listen: '127.0.0.1:0', models: [m]}\n",
    )
    .unwrap_err();
    assert_eq!(err.path, "backends[1].name");
}

#[test]
fn patch_merges_objects_and_replaces_lists() {
    let mut base = serde_json::json!({"engine": {"a": 1, "b": 2}, "faults": [1, 2]});
    merge_json(
        &mut base,
        serde_json::json!({"engine": {"b": 3}, "faults": []}),
    );
    assert_eq!(
        base,
        serde_json::json!({"engine": {"a": 1, "b": 3}, "faults": []})
    );
}
