//! Clients of either dialect reach backends of the other, translated (`src/translate/`): one
//! engine is one backend, with one curve and one in-flight count, whatever its clients speak.
//! The official SDKs' own flows are in `sdk.rs`; the mappings field by field in the unit tests.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tpsgate::bench::http_client;
use tpsgate::sim::config::{FaultKindRaw, FaultRaw, StreamRaw};

use crate::support;

/// A gateway in front of `sim` declared as one backend of `dialect`, with `extra` lines for the
/// backend and `rest` of the config after the backends.
async fn gateway(
    sim: SocketAddr,
    dialect: &str,
    extra: &str,
    rest: &str,
) -> tpsgate::gateway::Gateway {
    support::gateway(&format!(
        "backends:\n{}{rest}",
        support::backend_yaml(
            "engine",
            sim,
            dialect,
            &format!("    models: {{m: m}}\n{extra}")
        )
    ))
    .await
}

async fn post(gw: SocketAddr, path: &str, body: &Value, key: Option<&str>) -> support::Exchange {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(key) = key {
        headers.push(("x-api-key", key));
    }
    support::send(
        &http_client(None).unwrap(),
        gw,
        Method::POST,
        path,
        Some(body.to_string().as_bytes()),
        &headers,
    )
    .await
}

fn message(max_tokens: u32, stream: bool) -> Value {
    json!({"model": "m", "max_tokens": max_tokens, "stream": stream,
           "messages": [{"role": "user", "content": "hello"}]})
}

fn fault(kind: FaultKindRaw) -> FaultRaw {
    FaultRaw {
        kind,
        probability: None,
        every: Some(1),
        retry_after_s: (kind == FaultKindRaw::Http429).then_some(3),
        delay_ms: None,
        after_tokens: None,
    }
}

#[tokio::test]
async fn an_anthropic_client_streams_from_an_openai_backend_and_its_key_pays_the_backends_usage() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway(
        sim,
        "openai",
        "",
        "api_keys:\n  - {key_env: A, name: team-a}\n",
    )
    .await;
    let ex = post(
        gw.addr(),
        "/v1/messages",
        &message(4, true),
        Some("key-of-A"),
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.headers["content-type"], "text/event-stream");
    let events: Vec<Value> = ex
        .data_events()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, " the quick brown fox");
    let delta = &events[events.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 4);
    assert_eq!(delta["usage"]["input_tokens"], 2);

    let seen = support::seen(sim).await;
    assert_eq!(seen[0]["path"], "/v1/chat/completions");
    assert_eq!(seen[0]["max_tokens"], 4);
    // The key pays what the backend reported, read from its own (OpenAI) usage chunk.
    let keys = support::get_json(gw.admin_addr(), "/admin/keys").await;
    let key = &keys["keys"][0];
    assert_eq!(key["name"], "team-a");
    assert_eq!(key["input_tokens_total"], 2);
    assert_eq!(key["output_tokens_total"], 4);
}

#[tokio::test]
async fn an_openai_client_gets_a_whole_answer_from_an_anthropic_backend_with_the_default_max_tokens()
 {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = gateway(sim, "anthropic", "    default_max_tokens: 3\n", "").await;
    let body = json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "hello"}]});
    let ex = post(gw.addr(), "/v1/chat/completions", &body, None).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.headers["content-type"], "application/json");
    let answer = ex.json();
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        " the quick brown"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["completion_tokens"], 3);
    let seen = support::seen(sim).await;
    assert_eq!(seen[0]["path"], "/v1/messages");
    assert_eq!(seen[0]["max_tokens"], 3);
    assert_eq!(seen[0]["anthropic_version"], "2023-06-01");
}

#[tokio::test]
async fn clients_of_both_dialects_share_one_backends_in_flight_count() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(20.0, 0.0, 8)).await;
    let gw = gateway(sim, "openai", "    max_concurrency: 1\n", "").await;
    let open = support::open_stream(gw.addr(), "m", 50).await;
    // The one slot is taken by an OpenAI client: an Anthropic client finds the engine full.
    let ex = post(gw.addr(), "/v1/messages", &message(2, true), None).await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ex.json()["type"], "error");
    assert_eq!(ex.json()["error"]["type"], "overloaded_error");
    drop(open);
}

#[tokio::test]
async fn translate_false_on_a_backend_or_a_route_keeps_clients_of_the_other_dialect_away() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let off = gateway(sim, "openai", "    translate: false\n", "").await;
    let ex = post(off.addr(), "/v1/messages", &message(2, false), None).await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    assert_eq!(ex.json()["error"]["type"], "not_found_error");
    let ruled = gateway(
        sim,
        "openai",
        "",
        "routes:\n  - {path: /v1/messages, translate: false}\n",
    )
    .await;
    let ex = post(ruled.addr(), "/v1/messages", &message(2, false), None).await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    let ok = post(
        ruled.addr(),
        "/v1/chat/completions",
        &message(2, false),
        None,
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(
        support::seen(sim)
            .await
            .iter()
            .all(|s| s["path"] == "/v1/chat/completions")
    );
}

#[tokio::test]
async fn the_backends_errors_and_refusals_reach_the_client_in_its_own_dialect() {
    let start = |kind| async move {
        support::start(support::spec(
            "sim",
            support::engine(1.0, 0.0, 8),
            StreamRaw::default(),
            vec![fault(kind)],
        ))
        .await
    };
    let (_limited, limited) = start(FaultKindRaw::Http429).await;
    let gw = gateway(limited, "openai", "", "").await;
    let ex = post(gw.addr(), "/v1/messages", &message(2, true), None).await;
    assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(ex.headers["retry-after"], "3");
    assert_eq!(ex.headers["content-type"], "application/json");
    let err = ex.json();
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "rate_limit_error");

    let (_overloaded, overloaded) = start(FaultKindRaw::Http503).await;
    let gw = gateway(overloaded, "anthropic", "", "").await;
    let chat =
        json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let ex = post(gw.addr(), "/v1/chat/completions", &chat, None).await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ex.json()["error"]["type"], "server_error");
    assert_eq!(ex.json()["error"]["code"], "overloaded_error");

    let mut two = chat.clone();
    two["n"] = json!(2);
    let ex = post(gw.addr(), "/v1/chat/completions", &two, None).await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    assert_eq!(ex.json()["error"]["type"], "invalid_request_error");
    let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("`n`"), "{message}");
}

/// Claude Code's first request, as 2.1.328 sends it (`claude -p`), cut to one tool.
fn claude_code_request() -> Value {
    json!({
        "model": "m", "max_tokens": 6, "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
            {"type": "text", "text": "You are a Claude agent", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}
        ],
        "tools": [{"name": "Bash", "description": "Run a command",
                   "input_schema": {"type": "object"}, "defer_loading": true}],
        "metadata": {"user_id": "{\"session_id\":\"12\"}"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}
    })
}

#[tokio::test]
async fn claude_code_s_requests_reach_an_openai_engine_its_reasoning_switch_set_where_configured() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    for (extra, reasoning) in [
        ("", Value::Null),
        (
            "    thinking: chat_template\n",
            json!({"chat_template_kwargs": {"enable_thinking": true}}),
        ),
        (
            "    thinking: reasoning_effort\n",
            json!({"reasoning_effort": "high"}),
        ),
    ] {
        let gw = gateway(sim, "openai", extra, "").await;
        let ex = support::send(
            &http_client(None).unwrap(),
            gw.addr(),
            Method::POST,
            "/v1/messages?beta=true",
            Some(claude_code_request().to_string().as_bytes()),
            &[
                ("content-type", "application/json"),
                ("anthropic-version", "2023-06-01"),
                (
                    "anthropic-beta",
                    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
                ),
            ],
        )
        .await;
        let body = String::from_utf8_lossy(&ex.body()).into_owned();
        assert_eq!(ex.status, StatusCode::OK, "{extra}: {body}");
        assert!(body.contains("message_stop"), "{body}");
        let seen = support::seen(sim).await;
        let last = seen.last().unwrap();
        assert_eq!(last["path"], "/v1/chat/completions");
        assert_eq!(last["query"], Value::Null, "`?beta=true` is Anthropic's");
        assert_eq!(last["reasoning"], reasoning, "{extra}");
        let names = last["header_names"].as_array().unwrap();
        assert!(
            !names
                .iter()
                .any(|n| n.as_str().unwrap().starts_with("anthropic-"))
        );
        // One engine, one curve: the translated request taught it.
        let curves = support::until(
            gw.admin_addr(),
            "/admin/curves",
            std::time::Duration::from_secs(2),
            |v| v["curves"][0]["observations"] == 1,
        )
        .await;
        assert_eq!(curves["curves"][0]["observations"], 1, "{curves}");
    }
}

#[tokio::test]
async fn count_tokens_is_the_engine_s_own_count_and_an_engine_that_cannot_count_says_so() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let prompt = json!({
        "model": "m",
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "How many tokens is this prompt, exactly?"}],
        "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive"}
    });
    for dialect in ["openai", "anthropic"] {
        let gw = gateway(sim, dialect, "", "").await;
        let counted = post(gw.addr(), "/v1/messages/count_tokens", &prompt, None).await;
        assert_eq!(
            counted.status,
            StatusCode::OK,
            "{dialect}: {:?}",
            counted.body()
        );
        let count: Value = serde_json::from_slice(&counted.body()).unwrap();
        // The same prompt sent for an answer: the engine's own count of it.
        let mut ask = prompt.clone();
        ask["max_tokens"] = json!(1);
        let answered = post(gw.addr(), "/v1/messages", &ask, None).await;
        assert_eq!(answered.status, StatusCode::OK);
        let seen = support::seen(sim).await;
        let last = seen.last().unwrap();
        assert_eq!(
            count["input_tokens"], last["prompt_tokens"],
            "{dialect}: {count}"
        );
        assert!(count["input_tokens"].as_u64().unwrap() > 0);
    }
    // An engine whose `/tokenize` is not there: a clear error, never a made-up number.
    let base = format!("http://{sim}/no-tokenizer");
    let gw = support::gateway(&format!(
        "backends:\n  - {{name: engine, url: '{base}', dialect: openai, models: {{m: m}}}}\n"
    ))
    .await;
    let refused = post(gw.addr(), "/v1/messages/count_tokens", &prompt, None).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_slice(&refused.body()).unwrap();
    assert_eq!(error["type"], "error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("cannot count tokens"), "{message}");
}

/// A Responses request as Codex sends one: a developer message, the question, a function tool
/// and the hosted web search.
fn responses_request(stream: bool) -> Value {
    json!({"model": "m", "stream": stream, "store": false, "max_output_tokens": 3,
           "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
           "tools": [{"type": "web_search"}]})
}

#[tokio::test]
async fn a_responses_client_is_translated_for_a_chat_engine_and_passed_through_to_a_native_one() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let translated = gateway(sim, "openai", "", "").await;
    let ex = post(
        translated.addr(),
        "/v1/responses",
        &responses_request(false),
        None,
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.headers["x-tpsgate-dropped-tools"], "web_search");
    let response = ex.json();
    assert_eq!(response["object"], "response");
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        " the quick brown"
    );
    let seen = support::seen(sim).await;
    assert_eq!(seen.last().unwrap()["path"], "/v1/chat/completions");

    // `responses_api: native`: the engine's own Responses API (the simulator serves one, as
    // vLLM does) gets the request as it came, hosted tools and all, and its stream is timed as
    // a Responses stream: the backend's curve learns from it, its usage read.
    let native = gateway(sim, "openai", "    responses_api: native\n", "").await;
    let ex = post(
        native.addr(),
        "/v1/responses",
        &responses_request(true),
        None,
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK);
    assert!(ex.headers.get("x-tpsgate-dropped-tools").is_none());
    let body = String::from_utf8_lossy(&ex.body()).into_owned();
    // Cut at its `max_output_tokens`, a finish all the same.
    assert!(body.contains("event: response.incomplete\n"), "{body}");
    assert_eq!(
        support::seen(sim).await.last().unwrap()["path"],
        "/v1/responses"
    );
    let learned = |v: &Value| v["curves"][0]["observations"] == 1;
    let curves = support::until(
        native.admin_addr(),
        "/admin/curves",
        Duration::from_secs(2),
        learned,
    )
    .await;
    assert!(learned(&curves), "{curves}");
    assert_eq!(curves["curves"][0]["estimated_share"], 0.0, "{curves}");

    // `hosted_tools: refuse`: a 400 naming the tool.
    let strict = gateway(sim, "openai", "    hosted_tools: refuse\n", "").await;
    let ex = post(
        strict.addr(),
        "/v1/responses",
        &responses_request(true),
        None,
    )
    .await;
    assert_eq!(ex.status, StatusCode::BAD_REQUEST);
    let message = ex.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("`web_search`"), "{message}");
}

#[tokio::test]
async fn a_translated_responses_stream_cut_by_the_backend_ends_with_response_failed() {
    let stalls = support::spec(
        "sim",
        support::engine(1.0, 0.0, 8),
        StreamRaw::default(),
        vec![fault(FaultKindRaw::Reset)],
    );
    let (_fleet, sim) = support::start(stalls).await;
    let gw = gateway(sim, "anthropic", "", "").await;
    let ex = post(gw.addr(), "/v1/responses", &responses_request(true), None).await;
    assert_eq!(ex.status, StatusCode::OK);
    let body = String::from_utf8_lossy(&ex.body()).into_owned();
    let last = body.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: response.failed\n"), "{body}");
    let data: Value =
        serde_json::from_str(last.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(data["response"]["status"], "failed");
    assert!(data["response"]["error"]["message"].is_string(), "{data}");
}
