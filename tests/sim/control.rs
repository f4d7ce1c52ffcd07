//! The control plane: runtime parameters, stats, and cancellation when a client leaves.

use std::time::Duration;

use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tpsgate::bench::{self, BenchDialect};

use crate::support::{self, rel_err};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_params_slow_the_backend_down_mid_run() {
    let (_fleet, addr) = support::start_engine("x", support::engine(5.0, 0.0, 8)).await;
    // 150 tokens (0.75 s, then 1.5 s): one late timer among them, while other tests share the
    // machine, moves the measured speed by a few ms in a span long enough not to notice.
    let spec = support::request(addr, BenchDialect::Openai, 0, 150);
    let client = bench::http_client(None).unwrap();
    let before = bench::client::run_one(&client, &spec)
        .await
        .per_user_tps()
        .unwrap();
    assert!(rel_err(before, 200.0) < 0.05, "{before}");

    let ex = support::post(
        addr,
        "/sim/params",
        &json!({"engine": {"step_base_ms": 10.0}}),
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.json()["engine"]["step_base_ms"], 10.0);
    assert_eq!(ex.json()["engine"]["max_batch"], 8, "untouched fields stay");

    let after = bench::client::run_one(&client, &spec)
        .await
        .per_user_tps()
        .unwrap();
    assert!(rel_err(after, 100.0) < 0.05, "{after}");
    let truth = support::truth(addr, 0, 150, 1).await;
    assert!(rel_err(truth["per_user_tps"].as_f64().unwrap(), 100.0) < 0.001);
}

#[tokio::test]
async fn a_bad_patch_is_rejected_whole_and_names_the_field() {
    let (_fleet, addr) = support::start_engine("x", support::engine(5.0, 0.0, 8)).await;
    let cases = [
        (
            json!({"engine": {"step_base_ms": 99.0, "max_batch": 0}}),
            "engine.max_batch",
        ),
        (json!({"engine": {"stepbase": 1}}), "engine.stepbase"),
        (
            json!({"faults": [{"kind": "stall", "every": 1}]}),
            "faults[0].delay_ms",
        ),
        (json!({"name": "y"}), "`name` cannot be changed"),
    ];
    for (patch, named) in cases {
        let ex = support::post(addr, "/sim/params", &patch).await;
        assert_eq!(ex.status, StatusCode::BAD_REQUEST, "{patch}");
        let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(named), "{message} should name {named}");
    }
    let params = support::get_json(addr, "/sim/params").await;
    assert_eq!(
        params["engine"]["step_base_ms"], 5.0,
        "nothing of a rejected patch applies"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_running_and_queued_requests() {
    let (fleet, addr) = support::start_engine("x", support::engine(5.0, 0.0, 1)).await;
    let body = json!({"model": "m", "messages": [], "max_tokens": 40}).to_string();
    let held: Vec<_> = (0..3)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                support::exchange(
                    addr,
                    Method::POST,
                    "/v1/chat/completions",
                    Some(body.as_bytes()),
                )
                .await
            })
        })
        .collect();
    let mut seen = json!(null);
    for _ in 0..100 {
        seen = support::get_json(addr, "/sim/stats").await;
        if seen["stats"]["queued"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen["stats"]["running"], 1, "{seen}");
    assert_eq!(seen["stats"]["queued"], 2, "{seen}");
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    let stats = fleet.backend("x").unwrap().stats();
    assert_eq!((stats.completed, stats.running, stats.queued), (3, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_frees_its_batch_slot() {
    let (fleet, addr) = support::start_engine("x", support::engine(5.0, 0.0, 8)).await;
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(Full::new(bytes::Bytes::from(
            json!({"model": "m", "messages": [], "max_tokens": 100000, "stream": true}).to_string(),
        )))
        .unwrap();
    let mut body = bench::http_client(None)
        .unwrap()
        .request(request)
        .await
        .unwrap()
        .into_body();
    body.frame().await.unwrap().unwrap(); // role chunk
    body.frame().await.unwrap().unwrap(); // first token
    drop(body);
    let backend = fleet.backend("x").unwrap();
    for _ in 0..100 {
        if backend.stats().cancelled == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = backend.stats();
    assert_eq!((stats.cancelled, stats.running), (1, 0), "{stats:?}");
}
