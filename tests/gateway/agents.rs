//! Real coding agents through the gateway, against the simulator: Claude Code (`claude -p`) in
//! front of an OpenAI-dialect engine with no configuration beyond the backend itself. `.ci/test`
//! installs the agents (pinned, from npm) under `target/agents`; without them the test fails and
//! says so.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tpsgate::sim::config::EngineRaw;

use crate::support;

/// An agent's program under `TPSGATE_TEST_AGENTS` (else `target/agents`), which `.ci/install`
/// fills; the test fails, naming it, when it is not there.
fn agent(name: &str) -> PathBuf {
    let dir = std::env::var_os("TPSGATE_TEST_AGENTS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/agents"),
        PathBuf::from,
    );
    let program = dir.join("node_modules/.bin").join(name);
    assert!(
        program.exists(),
        "{} is missing: run .ci/test, which installs the coding agents the tests run",
        program.display()
    );
    program
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_answers_from_an_openai_engine_and_runs_the_tool_it_was_asked_to_call() {
    // Replies of 6 to 18 tokens, as a model ends them: an agent asking 32,000 tokens a turn
    // gets an answer, not 32,000 tokens.
    let engine = EngineRaw {
        reply_tokens: Some(12),
        ..support::engine(1.0, 0.0, 8)
    };
    let (_fleet, sim) = support::start_engine("vllm", engine).await;
    let gw = support::gateway_for(sim, "openai", "    models: {qwen-coder: m}\n").await;
    let home = tempfile::tempdir().unwrap();
    let claude = agent("claude");
    let url = gw.url();
    let home_dir = home.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(claude)
            .args(["-p", "say hi", "--model", "qwen-coder"])
            .current_dir(&home_dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home_dir)
            .env("ANTHROPIC_BASE_URL", url.trim_end_matches('/'))
            .env("ANTHROPIC_API_KEY", "sk-test")
            // No calls but the model's: no telemetry, no update checks, no error reports.
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "claude -p exited {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The simulator's text, after the tool round trip: it called the first tool offered, the
    // agent ran it and sent its result, and the answer to that is text.
    assert!(stdout.contains("the quick brown fox"), "{stdout}");
    let seen = support::seen(sim).await;
    assert!(seen.len() >= 2, "a call and its answer: {seen:?}");
    assert!(seen.iter().all(|r| r["path"] == "/v1/chat/completions"));
    // One engine, one curve: every request the agent made taught it.
    let curves = support::until(
        gw.admin_addr(),
        "/admin/curves",
        Duration::from_secs(2),
        |v| v["curves"][0]["observations"].as_u64() >= Some(2),
    )
    .await;
    assert!(
        curves["curves"][0]["observations"].as_u64() >= Some(2),
        "{curves}"
    );
}
