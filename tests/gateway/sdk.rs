//! The official OpenAI and Anthropic Python SDKs stream through the gateway with only their base
//! URL changed, to backends of their own dialect and, translated, of the other. `.ci/test`
//! installs both into the tests' venv; without them the test fails and says so.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use crate::support;

/// Two simulated engines behind one gateway, the first declared an OpenAI backend named `oa`
/// serving `openai_models`, the second an Anthropic one named `an` serving `anthropic_models`
/// (YAML lines under the entry); then the Python script `tests/sdk/SCRIPT` against the gateway.
/// What it printed, and the engines' addresses.
async fn sdk_script(
    script: &str,
    openai_entry: &str,
    anthropic_entry: &str,
) -> (Value, SocketAddr, SocketAddr, support::FleetGuard) {
    let python = support::venv_program("python");
    let (oa, openai_sim) = support::start_engine("oa", support::engine(1.0, 0.0, 8)).await;
    let (an, anthropic_sim) = support::start_engine("an", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml("oa", openai_sim, "openai", openai_entry),
        support::backend_yaml("an", anthropic_sim, "anthropic", anthropic_entry),
    ))
    .await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let url = gw.url();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python).arg(script).arg(url).output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = serde_json::from_slice(&out.stdout).unwrap();
    (
        printed,
        openai_sim,
        anthropic_sim,
        support::FleetGuard(vec![oa, an]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_stream_through_the_gateway() {
    let (result, _, anthropic_sim, _fleets) = sdk_script(
        "stream_through_gateway.py",
        "    models: {m: m}\n    api_key_env: OA_KEY\n",
        "    models: {claude: m}\n    api_key_env: AN_KEY\n",
    )
    .await;
    assert_eq!(result["openai_text"], " the quick brown fox jumps");
    assert_eq!(result["openai_usage"], 5);
    assert_eq!(result["anthropic_text"], " the quick brown fox");
    assert_eq!(result["anthropic_usage"], 4);
    assert_eq!(
        support::seen(anthropic_sim).await[0]["x_api_key"],
        "key-of-AN_KEY"
    );
}

/// Each SDK reaches a model only a backend of the other dialect serves: streaming, tools across
/// two turns, images, stop sequences and refusals, every event and object validated against the
/// SDK's own types (`tests/sdk/translate_through_gateway.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_official_sdk_reaches_a_backend_of_the_other_dialect_through_translation() {
    let (got, openai_sim, anthropic_sim, _fleets) = sdk_script(
        "translate_through_gateway.py",
        "    models: {llama: m}\n",
        "    models: {claude: m}\n",
    )
    .await;
    let tool_input = json!({"text": " the quick brown"});
    assert_eq!(got["anthropic_text"], " the quick brown fox");
    assert_eq!(got["anthropic_usage"], json!([2, 4]));
    assert_eq!(got["anthropic_stop"], "max_tokens");
    assert_eq!(
        got["anthropic_event_types"],
        json!([
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ])
    );
    assert_eq!(
        got["anthropic_tool"],
        json!({"stop": "tool_use", "name": "lookup", "input": tool_input})
    );
    assert_eq!(
        got["anthropic_after_tool"],
        json!(["max_tokens", " the quick"])
    );
    assert_eq!(got["anthropic_images"], " the quick");
    assert_eq!(
        got["anthropic_stop_sequence"],
        json!(["stop_sequence", " fox", " the quick brown"])
    );
    assert_eq!(
        got["anthropic_thinking"],
        json!(["max_tokens", " the quick"])
    );
    assert_eq!(got["anthropic_refused"][0], 400);
    assert_eq!(got["anthropic_refused"][1], "invalid_request_error");
    assert!(
        got["anthropic_refused"][2]
            .as_str()
            .unwrap()
            .contains("`messages[0].content[0].type` `document`"),
        "{}",
        got["anthropic_refused"]
    );

    assert_eq!(got["openai_text"], " the quick brown fox jumps");
    assert_eq!(got["openai_usage"], json!([2, 5]));
    assert_eq!(got["openai_last_chunk"], "[DONE]");
    assert_eq!(
        got["openai_tool"],
        json!({"finish": "tool_calls", "name": "lookup", "arguments": tool_input})
    );
    assert_eq!(got["openai_streamed_arguments"], tool_input);
    assert_eq!(got["openai_after_tool"], json!(["length", " the quick"]));
    assert_eq!(got["openai_refused"][0], 400);
    assert_eq!(got["openai_refused"][1], "invalid_request_error");
    assert!(got["openai_refused"][2].as_str().unwrap().contains("`n`"));

    // Each backend heard only its own dialect.
    assert!(
        support::seen(openai_sim)
            .await
            .iter()
            .all(|s| s["path"] == "/v1/chat/completions")
    );
    assert!(
        support::seen(anthropic_sim)
            .await
            .iter()
            .all(|s| s["path"] == "/v1/messages")
    );
}

/// The OpenAI SDK's `client.responses.create` and `responses.stream` reach engines without a
/// Responses API, a chat completions one and an Anthropic one: text, streams, a tool across two
/// turns, and a clear refusal of what the gateway does not keep (`previous_response_id`), every
/// event and object validated against the SDK's own types
/// (`tests/sdk/responses_through_gateway.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_s_responses_api_reaches_engines_that_have_none() {
    let (got, openai_sim, anthropic_sim, _fleets) = sdk_script(
        "responses_through_gateway.py",
        "    models: {llama: m}\n",
        "    models: {claude: m}\n",
    )
    .await;
    for model in ["llama", "claude"] {
        let got = &got[model];
        assert_eq!(got["text"], " the quick brown fox jumps", "{model}");
        assert_eq!(
            got["status"], "incomplete",
            "{model}: cut at max_output_tokens"
        );
        assert_eq!(got["usage"][1], 5, "{model}");
        assert_eq!(got["streamed_text"], " the quick brown fox", "{model}");
        assert_eq!(got["final_text"], got["streamed_text"], "{model}");
        let types = got["event_types"].as_array().unwrap();
        assert_eq!(types[0], "response.created", "{model}");
        assert_eq!(types.last().unwrap(), "response.incomplete", "{model}");
        assert_eq!(
            got["tool"],
            json!({"name": "lookup", "arguments": {"text": " the quick brown"}}),
            "{model}"
        );
        assert_eq!(
            got["after_tool"],
            json!(["incomplete", " the quick"]),
            "{model}"
        );
        assert_eq!(got["refused"][0], 400, "{model}");
        assert_eq!(got["refused"][1], "invalid_request_error", "{model}");
        let why = got["refused"][2].as_str().unwrap();
        assert!(why.contains("`previous_response_id`"), "{model}: {why}");
    }
    // Each engine heard only its own dialect, and never the hosted tool.
    for (sim, path) in [
        (openai_sim, "/v1/chat/completions"),
        (anthropic_sim, "/v1/messages"),
    ] {
        let seen = support::seen(sim).await;
        assert!(!seen.is_empty());
        assert!(seen.iter().all(|s| s["path"] == path), "{seen:?}");
    }
}
