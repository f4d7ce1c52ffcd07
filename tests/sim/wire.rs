//! The simulator speaks the OpenAI and Anthropic wire formats the way real engines do.

use http::StatusCode;
use serde_json::{Value, json};
use tpsgate::sim::config::{EngineRaw, StreamRaw};

use crate::support::{self, Exchange};

async fn fast_backend(stream: StreamRaw) -> (tpsgate::sim::Fleet, std::net::SocketAddr) {
    support::start(support::spec(
        "fast",
        support::engine(1.0, 0.0, 64),
        stream,
        vec![],
    ))
    .await
}

fn parsed(ex: &Exchange) -> Vec<Value> {
    ex.data_events()
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn chat_stream_opens_role_only_and_sends_usage_last_when_asked() {
    let (_fleet, addr) = fast_backend(StreamRaw::default()).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}],
                      "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}});
    let ex = support::post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.headers["content-type"], "text/event-stream");
    let events = parsed(&ex);
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant"})
    );
    let text: String = events[1..4]
        .iter()
        .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, " the quick brown");
    assert_eq!(events[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[4]["choices"], json!([]));
    assert_eq!(
        events[4]["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5})
    );
    assert_eq!(ex.data_events().last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn usage_is_absent_unless_the_client_asks() {
    let (_fleet, addr) = fast_backend(StreamRaw::default()).await;
    let body = json!({"model": "m", "messages": [], "max_tokens": 3, "stream": true});
    let ex = support::post(addr, "/v1/chat/completions", &body).await;
    assert!(parsed(&ex).iter().all(|e| e.get("usage").is_none()));
    assert_eq!(parsed(&ex).len(), 4);
}

#[tokio::test]
async fn usage_on_finish_rides_the_last_content_chunk() {
    let (_fleet, addr) = fast_backend(StreamRaw {
        usage: tpsgate::sim::config::UsageStyle::FinishChunk,
        ..StreamRaw::default()
    })
    .await;
    let body = json!({"model": "m", "messages": [], "max_tokens": 2, "stream": true,
                      "stream_options": {"include_usage": true}});
    let events = parsed(&support::post(addr, "/v1/chat/completions", &body).await);
    assert_eq!(events.len(), 3);
    assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[2]["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn max_completion_tokens_wins_and_no_limit_means_a_natural_stop() {
    let engine = EngineRaw {
        default_max_tokens: 5,
        ..support::engine(1.0, 0.0, 64)
    };
    let (_fleet, addr) = support::start_engine("fast", engine).await;
    let body = json!({"model": "m", "messages": [], "max_tokens": 9, "max_completion_tokens": 4});
    let ex = support::post(addr, "/v1/chat/completions", &body).await;
    assert_eq!(ex.json()["usage"]["completion_tokens"], 4);
    assert_eq!(ex.json()["choices"][0]["finish_reason"], "length");
    let ex = support::post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "m", "messages": []}),
    )
    .await;
    assert_eq!(ex.json()["usage"]["completion_tokens"], 5);
    assert_eq!(ex.json()["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn completions_stream_and_non_stream() {
    let (_fleet, addr) = fast_backend(StreamRaw::default()).await;
    let ex = support::post(
        addr,
        "/v1/completions",
        &json!({"model": "m", "prompt": "12345678", "max_tokens": 2, "stream": true}),
    )
    .await;
    let events = parsed(&ex);
    assert_eq!(events.len(), 2, "no role chunk in completions");
    assert_eq!(events[0]["object"], "text_completion");
    assert_eq!(events[0]["choices"][0]["text"], " the");
    let ex = support::post(
        addr,
        "/v1/completions",
        &json!({"model": "m", "prompt": "12345678", "max_tokens": 2}),
    )
    .await;
    let body = ex.json();
    assert_eq!(body["choices"][0]["text"], " the quick");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4})
    );
}

#[tokio::test]
async fn anthropic_messages_stream_and_non_stream() {
    let (_fleet, addr) = fast_backend(StreamRaw::default()).await;
    let body = json!({"model": "m", "system": "be brief", "max_tokens": 2, "stream": true,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]});
    let events = parsed(&support::post(addr, "/v1/messages", &body).await);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[0]["message"]["usage"]["input_tokens"], 4);
    assert_eq!(events[6]["usage"]["output_tokens"], 2);
    assert_eq!(events[6]["delta"]["stop_reason"], "max_tokens");

    let mut body = body;
    body["stream"] = json!(false);
    let ex = support::post(addr, "/v1/messages", &body).await;
    let msg = ex.json();
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["content"][0]["text"], " the quick");
    assert_eq!(msg["usage"], json!({"input_tokens": 4, "output_tokens": 2}));
}

#[tokio::test]
async fn models_lists_what_the_backend_serves() {
    let (_fleet, addr) = fast_backend(StreamRaw::default()).await;
    let models = support::get_json(addr, "/v1/models").await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m");
}

#[tokio::test]
async fn bad_requests_get_errors_shaped_like_each_api() {
    let (_fleet, addr) = fast_backend(StreamRaw::default()).await;
    let raw = |path: &'static str, body: &'static [u8]| async move {
        support::exchange(addr, http::Method::POST, path, Some(body)).await
    };
    let ex = raw("/v1/chat/completions", b"{not json").await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid JSON")
    );
    assert_eq!(ex.json()["error"]["type"], "invalid_request_error");

    let ex = raw("/v1/chat/completions", br#"{"messages": []}"#).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`model`")
    );

    let ex = raw(
        "/v1/chat/completions",
        br#"{"model": "nope", "messages": []}"#,
    )
    .await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    assert_eq!(ex.json()["error"]["code"], "model_not_found");
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Available: m")
    );

    let ex = raw("/v1/messages", br#"{"model": "m", "messages": []}"#).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(ex.json()["type"], "error");
    assert!(
        ex.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`max_tokens`")
    );

    let ex = raw("/v1/nothing", b"{}").await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    let ex = support::exchange(addr, http::Method::GET, "/v1/chat/completions", None).await;
    assert_eq!(ex.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn replies_end_at_a_natural_length_and_call_a_tool_on_the_configured_share_of_turns() {
    let engine = EngineRaw {
        reply_tokens: Some(8),
        tool_call_pct: 50.0,
        ..support::engine(0.2, 0.0, 64)
    };
    let (_fleet, addr) = support::start_engine("agentic", engine).await;
    let client = tpsgate::bench::http_client(None).unwrap();
    let body = json!({"model": "m", "max_tokens": 1000,
                      "messages": [{"role": "user", "content": "go"}],
                      "tools": [{"type": "function", "function": {"name": "f"}}]});
    let answer = |id: String| {
        let client = client.clone();
        let body = body.to_string();
        async move {
            let ex = support::send(
                &client,
                addr,
                http::Method::POST,
                "/v1/chat/completions",
                Some(body.as_bytes()),
                &[("content-type", "application/json"), ("x-request-id", &id)],
            )
            .await;
            let v: Value = ex.json();
            let choice = &v["choices"][0];
            (
                choice["finish_reason"].as_str().unwrap().to_owned(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        }
    };
    let mut calls = 0;
    for i in 0..40 {
        let (finish, tokens) = answer(format!("req-{i}")).await;
        // 4 to 12 tokens, never the 1000 asked.
        assert!((4..=12).contains(&tokens), "{tokens}");
        match finish.as_str() {
            "tool_calls" => calls += 1,
            "stop" => {}
            other => panic!("{other}"),
        }
        // The same request id: the same answer.
        assert_eq!(answer(format!("req-{i}")).await, (finish, tokens));
    }
    assert!(
        (8..=32).contains(&calls),
        "{calls} of 40 turns called the tool"
    );
}
