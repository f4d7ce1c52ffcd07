//! The official OpenAI and Anthropic Python SDKs stream through the gateway with only their base
//! URL changed. `.ci/test` installs both into the tests' venv; without them the test fails and
//! says so.

use std::path::PathBuf;
use std::process::Command;

use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_stream_through_the_gateway() {
    let python = support::venv_program("python");
    let (_oa, openai_sim) = support::start_engine("oa", support::engine(1.0, 0.0, 8)).await;
    let (_an, anthropic_sim) = support::start_engine("an", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "backends:\n{}{}",
        support::backend_yaml(
            "oa",
            openai_sim,
            "openai",
            "    models: {m: m}\n    api_key_env: OA_KEY\n"
        ),
        support::backend_yaml(
            "an",
            anthropic_sim,
            "anthropic",
            "    models: {claude: m}\n    api_key_env: AN_KEY\n"
        ),
    ))
    .await;
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/stream_through_gateway.py");
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
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["openai_text"], " the quick brown fox jumps");
    assert_eq!(result["openai_usage"], 5);
    assert_eq!(result["anthropic_text"], " the quick brown fox");
    assert_eq!(result["anthropic_usage"], 4);
    assert_eq!(
        support::seen(anthropic_sim).await[0]["x_api_key"],
        "key-of-AN_KEY"
    );
}
