//! The client gets exactly the bytes the upstream sent — except the usage chunk the gateway asked
//! for itself.

use http::Method;
use serde_json::{Value, json};
use tpsgate::bench::http_client;
use tpsgate::sim::config::StreamRaw;

use crate::support::{self, Exchange};

/// The same request straight to the sim and through the gateway, with the same request id so
/// that the sim answers with the same response id.
async fn direct_and_via(stream: StreamRaw, path: &str, body: &Value) -> (Exchange, Exchange) {
    let (_fleet, sim) = support::start(support::spec(
        "sim",
        support::engine(1.0, 0.0, 64),
        stream,
        vec![],
    ))
    .await;
    let models = "    models: {m: m}\n";
    let dialect = if path == "/v1/messages" {
        "anthropic"
    } else {
        "openai"
    };
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("sim", sim, dialect, models)
    ))
    .await;
    let body = body.to_string();
    let headers = [
        ("content-type", "application/json"),
        ("x-request-id", "same-id"),
    ];
    let client = http_client(None).unwrap();
    let direct = support::send(
        &client,
        sim,
        Method::POST,
        path,
        Some(body.as_bytes()),
        &headers,
    )
    .await;
    let via = support::send(
        &client,
        gw.addr(),
        Method::POST,
        path,
        Some(body.as_bytes()),
        &headers,
    )
    .await;
    assert_eq!(direct.status, 200);
    assert_eq!(via.status, 200);
    assert_eq!(via.headers["x-tpsgate-backend"], "sim");
    (direct, via)
}

fn assert_same_bytes(direct: &Exchange, via: &Exchange) {
    assert_eq!(
        support::without_created(&via.body()),
        support::without_created(&direct.body()),
        "the gateway changed the bytes"
    );
}

#[tokio::test]
async fn a_stream_with_usage_asked_for_arrives_unchanged() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                      "stream": true, "stream_options": {"include_usage": true}});
    let (direct, via) = direct_and_via(StreamRaw::default(), "/v1/chat/completions", &body).await;
    assert!(String::from_utf8(via.body()).unwrap().contains("\"usage\""));
    assert_same_bytes(&direct, &via);
}

#[tokio::test]
async fn a_stream_without_usage_asked_for_arrives_without_the_usage_the_gateway_injected() {
    let body = json!({"model": "m", "messages": [], "max_tokens": 5, "stream": true});
    let (direct, via) = direct_and_via(StreamRaw::default(), "/v1/chat/completions", &body).await;
    assert!(!String::from_utf8(via.body()).unwrap().contains("\"usage\""));
    assert_same_bytes(&direct, &via);
}

#[tokio::test]
async fn four_tokens_per_chunk_arrive_unchanged_with_and_without_usage() {
    let chunky = StreamRaw {
        tokens_per_chunk: 4,
        ..StreamRaw::default()
    };
    for options in [
        json!({"include_usage": true}),
        json!({"include_usage": false}),
        json!({}),
    ] {
        let body = json!({"model": "m", "messages": [], "max_tokens": 10, "stream": true, "stream_options": options});
        let (direct, via) = direct_and_via(chunky.clone(), "/v1/chat/completions", &body).await;
        assert_same_bytes(&direct, &via);
    }
}

#[tokio::test]
async fn completions_and_anthropic_streams_arrive_unchanged() {
    let body = json!({"model": "m", "prompt": "hello", "max_tokens": 4, "stream": true});
    let (direct, via) = direct_and_via(StreamRaw::default(), "/v1/completions", &body).await;
    assert_same_bytes(&direct, &via);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": true});
    let (direct, via) = direct_and_via(StreamRaw::default(), "/v1/messages", &body).await;
    assert!(
        String::from_utf8(via.body())
            .unwrap()
            .contains("message_stop")
    );
    assert_same_bytes(&direct, &via);
}

#[tokio::test]
async fn non_stream_responses_arrive_unchanged() {
    let body = json!({"model": "m", "messages": [], "max_tokens": 4});
    let (direct, via) = direct_and_via(StreamRaw::default(), "/v1/chat/completions", &body).await;
    assert_eq!(via.json()["usage"]["completion_tokens"], 4);
    assert_same_bytes(&direct, &via);
}

#[tokio::test]
async fn models_lists_the_union_of_every_backend() {
    let (_a, sim_a) = support::start_engine("a", support::engine(1.0, 0.0, 8)).await;
    let (_b, sim_b) = support::start_engine("b", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml("a", sim_a, "openai", "    models: {small: m, shared: m}\n"),
        support::backend_yaml("b", sim_b, "openai", "    models: {large: m, shared: m}\n"),
    ))
    .await;
    let list = support::get_json(gw.addr(), "/v1/models").await;
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["large", "shared", "small"]);
    assert_eq!(list["object"], "list");
}

#[tokio::test]
async fn a_renamed_model_reaches_the_upstream_whatever_its_new_length() {
    // The sim serves only `m`: each alias below is renamed on the way, shortening the body by 4,
    // 30 and 0 bytes (the client's Content-Length stays only where it still holds).
    let (_fleet, sim) = support::start(support::spec(
        "sim",
        support::engine(1.0, 0.0, 64),
        StreamRaw::default(),
        vec![],
    ))
    .await;
    let models = "    models: {small: m, a-much-longer-name-for-model-m: m, n: m}\n";
    let gw = support::gateway(&format!(
        "backends:\n{}",
        support::backend_yaml("sim", sim, "openai", models)
    ))
    .await;
    let client = http_client(None).unwrap();
    for (alias, stream) in [
        ("small", false),
        ("a-much-longer-name-for-model-m", true),
        ("n", false),
    ] {
        let body = json!({"model": alias, "messages": [], "max_tokens": 3, "stream": stream});
        let via = support::send(
            &client,
            gw.addr(),
            Method::POST,
            "/v1/chat/completions",
            Some(body.to_string().as_bytes()),
            &[("content-type", "application/json")],
        )
        .await;
        assert_eq!(
            via.status,
            200,
            "{alias}: {}",
            String::from_utf8_lossy(&via.body())
        );
    }
}
