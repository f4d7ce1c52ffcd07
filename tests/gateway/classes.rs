//! Traffic classes as far as this version goes: picked by header or default, echoed, labelled in
//! metrics; and backend health as /admin/backends reports it.

use http::{Method, StatusCode};
use serde_json::json;
use tpsgate::bench::http_client;
use tpsgate::sim::config::{FaultKindRaw, FaultRaw, StreamRaw};

use crate::support;

const CLASSES: &str = "classes:\n  - {name: interactive, min_tps: 20, max_ttft_ms: 1000}\n  - {name: batch}\ndefault_class: interactive\n";
const CHAT: &[u8] = br#"{"model":"m","messages":[],"max_tokens":3,"stream":true}"#;

#[tokio::test]
async fn the_class_comes_from_the_header_or_the_default_and_is_echoed() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{CLASSES}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let client = http_client(None).unwrap();
    let json = ("content-type", "application/json");
    let ex = support::send(
        &client,
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(CHAT),
        &[json],
    )
    .await;
    assert_eq!(ex.headers["x-tpsgate-class"], "interactive");
    let ex = support::send(
        &client,
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(CHAT),
        &[json, ("x-tpsgate-class", "batch")],
    )
    .await;
    assert_eq!(ex.headers["x-tpsgate-class"], "batch");

    let ex = support::send(
        &client,
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(CHAT),
        &[json, ("x-tpsgate-class", "vip")],
    )
    .await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("unknown class `vip`") && message.contains("interactive, batch"),
        "{message}"
    );

    let metrics = support::exchange(gw.admin_addr(), Method::GET, "/metrics", None).await;
    let text = String::from_utf8(metrics.body()).unwrap();
    assert!(
        text.contains("class=\"batch\""),
        "metrics are labelled by class"
    );
    let curves = support::get_json(gw.admin_addr(), "/admin/curves").await;
    assert!(
        curves["curves"][0]["slo_attainment"]
            .get("interactive")
            .is_some(),
        "{curves}"
    );
}

#[tokio::test]
async fn a_lone_backend_failing_three_times_in_a_row_is_ejected_yet_still_tried() {
    let fault = FaultRaw {
        kind: FaultKindRaw::Http500,
        probability: None,
        every: Some(1),
        retry_after_s: None,
        delay_ms: None,
        after_tokens: None,
    };
    let (_fleet, sim) = support::start(support::spec(
        "sim",
        support::engine(1.0, 0.0, 8),
        StreamRaw::default(),
        vec![fault],
    ))
    .await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let health = || async {
        support::get_json(gw.admin_addr(), "/admin/backends").await["backends"][0]["health"].clone()
    };
    assert_eq!(health().await, "healthy");
    for _ in 0..3 {
        let ex =
            support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(CHAT)).await;
        assert_eq!(ex.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(health().await, "ejected");
    // With no other backend for the model, an ejected one is still better than none.
    support::post(sim, "/sim/params", &json!({"faults": []})).await;
    let ex = support::exchange(gw.addr(), Method::POST, "/v1/chat/completions", Some(CHAT)).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(health().await, "healthy");
}
