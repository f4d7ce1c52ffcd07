//! Real coding agents through the gateway, against the simulator, with no configuration beyond
//! the backends themselves: Claude Code (`claude -p`) in front of an OpenAI-dialect engine, and
//! Codex (`codex exec`, which speaks only the Responses API) in front of a chat completions
//! engine, an Anthropic one, and one with its own Responses API. `.ci/test` installs the agents (pinned, from npm) under
//! `target/agents`; without them the tests fail and say so.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// `claude -p PROMPT` with the gateway at `url` as its Anthropic API, in `home`, nothing else
/// reached: no telemetry, no update checks, no error reports.
fn claude(url: &str, model: &str, prompt: &str, home: &Path) -> Output {
    Command::new(agent("claude"))
        .args(["-p", prompt, "--model", model])
        // The simulator calls the first tool offered, with arguments its schema allows.
        // Claude Code's first is `Agent`, whose subagent is offered `Agent` again: an engine
        // that always calls a tool would recurse without end. Without it the first is `Bash`,
        // which `-p` mode denies without running, and the agent answers.
        .args(["--disallowedTools", "Agent"])
        .current_dir(home)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", url.trim_end_matches('/'))
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .output()
        .unwrap()
}

/// Two simulated engines replying 6 to 18 tokens, as a model ends them (an agent asking 32,000
/// tokens a turn gets an answer, not 32,000 tokens): the first answers with text, the second
/// calls the first tool it is offered (and answers its result with text). Each has a context
/// window of [`WINDOW`] tokens, as a vLLM serving a 32k model, which refuses a prompt beside
/// Claude Code's 32,000 output tokens unless the gateway cuts them. The fleets, and the two
/// addresses.
async fn plain_and_tool_engines() -> (support::FleetGuard, SocketAddr, SocketAddr) {
    let engine = |tool_call_pct| EngineRaw {
        reply_tokens: Some(12),
        tool_call_pct,
        ..support::engine(1.0, 0.0, 8)
    };
    let (plain_fleet, plain) = crate::windows::start_windowed("plain", engine(0.0), WINDOW).await;
    let (tools_fleet, tools) = crate::windows::start_windowed("tools", engine(100.0), WINDOW).await;
    (
        support::FleetGuard(vec![plain_fleet, tools_fleet]),
        plain,
        tools,
    )
}

/// The engines' context window, tokens.
const WINDOW: u32 = 32_768;

/// Runs `agent` (`claude` or `codex` below) for `model` in a fresh home, and checks that it
/// exited 0 with the simulator's text; its stderr.
async fn answered(
    agent: fn(&str, &str, &str, &Path) -> Output,
    url: &str,
    model: &'static str,
    prompt: &'static str,
) -> String {
    let home = tempfile::tempdir().unwrap();
    let (url, home_dir) = (url.to_owned(), home.path().to_owned());
    let out = tokio::task::spawn_blocking(move || agent(&url, model, prompt, &home_dir))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{model}: exited {:?}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    // The simulator's text; for the tool engine after the round trip: it called the first tool
    // offered, the agent answered the call and sent its result, and the answer to that is text.
    assert!(stdout.contains("the quick brown fox"), "{model}: {stdout}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_answers_from_an_openai_engine_and_answers_the_tool_call_it_was_sent() {
    let (_fleets, plain, tools) = plain_and_tool_engines().await;
    let backends = [
        support::backend_yaml("plain", plain, "openai", "    models: {qwen-plain: m}\n"),
        support::backend_yaml("tools", tools, "openai", "    models: {qwen-tools: m}\n"),
    ];
    let gw = support::gateway(&format!("backends:\n{}", backends.concat())).await;
    let windows = support::until(
        gw.admin_addr(),
        "/admin/backends",
        Duration::from_secs(10),
        |v| {
            v["backends"]
                .as_array()
                .unwrap()
                .iter()
                .all(|b| b["context_windows"]["m"]["tokens"] == WINDOW)
        },
    )
    .await;
    assert!(windows.to_string().contains("/v1/models"), "{windows}");
    for (model, sim, requests) in [("qwen-plain", plain, 1), ("qwen-tools", tools, 2)] {
        answered(claude, &gw.url(), model, "say hi").await;
        let seen = support::seen(sim).await;
        assert!(seen.len() >= requests, "{model}: {seen:?}");
        assert!(seen.iter().all(|r| r["path"] == "/v1/chat/completions"));
        // Its 32,000 output tokens did not fit beside its prompt: each went cut to fit.
        let window = u64::from(WINDOW);
        assert!(
            seen.iter()
                .all(|r| r["max_tokens"].as_u64().is_some_and(|n| n < 32_000)
                    && r["prompt_tokens"].as_u64().unwrap() + r["max_tokens"].as_u64().unwrap()
                        <= window),
            "{model}: {seen:?}"
        );
    }
    // One engine, one curve: every request the agent made taught it.
    let learned = |v: &serde_json::Value| {
        ["plain", "tools"].iter().zip([1, 2]).all(|(backend, n)| {
            v["curves"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["backend"] == *backend && c["observations"].as_u64() >= Some(n))
            })
        })
    };
    let curves = support::until(
        gw.admin_addr(),
        "/admin/curves",
        Duration::from_secs(2),
        learned,
    )
    .await;
    assert!(learned(&curves), "{curves}");
}

/// `codex exec PROMPT` with the gateway at `url` as its model provider (the Responses API, the
/// key from `TPSGATE_KEY`), in `home`, nothing else reached: no update check, no analytics.
fn codex(url: &str, model: &str, prompt: &str, home: &Path) -> Output {
    let provider = format!(
        r#"model_providers.tpsgate={{name="tpsgate",base_url="{}/v1",wire_api="responses",env_key="TPSGATE_KEY"}}"#,
        url.trim_end_matches('/')
    );
    Command::new(agent("codex"))
        .args(["exec", "--skip-git-repo-check", "-m", model])
        .args(["-c", "model_provider=tpsgate", "-c", &provider])
        .args(["-c", "check_for_update_on_startup=false"])
        .args(["-c", "analytics.enabled=false"])
        .arg(prompt)
        .current_dir(home)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("CODEX_HOME", home)
        .env("TPSGATE_KEY", "sk-test")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_answers_from_a_chat_engine_and_an_anthropic_engine_and_runs_the_tool_it_was_asked_to_call()
 {
    // Each engine behind both dialects, and the text one behind its own Responses API too.
    let (_fleets, plain, tools) = plain_and_tool_engines().await;
    let backends = [
        support::backend_yaml("chat", plain, "openai", "    models: {chat-plain: m}\n"),
        // The simulator's own Responses API, as vLLM has one: passed through untranslated.
        support::backend_yaml(
            "native",
            plain,
            "openai",
            "    models: {native-plain: m}\n    responses_api: native\n",
        ),
        support::backend_yaml(
            "claude",
            plain,
            "anthropic",
            "    models: {claude-plain: m}\n",
        ),
        support::backend_yaml(
            "chat-tools",
            tools,
            "openai",
            "    models: {chat-tools: m}\n",
        ),
        support::backend_yaml(
            "claude-tools",
            tools,
            "anthropic",
            "    models: {claude-tools: m}\n",
        ),
    ];
    let gw = support::gateway(&format!("backends:\n{}", backends.concat())).await;
    let url = gw.url();
    let runs = [
        ("chat-plain", "say hi", "/v1/chat/completions", 1),
        ("claude-plain", "say hi", "/v1/messages", 1),
        ("native-plain", "say hi", "/v1/responses", 1),
        ("chat-tools", "list the files", "/v1/chat/completions", 2),
        ("claude-tools", "list the files", "/v1/messages", 2),
    ];
    let mut seen_before = [0, 0];
    for (model, prompt, path, requests) in runs {
        let stderr = answered(codex, &url, model, prompt).await;
        if requests == 2 {
            // The call's arguments were valid for `exec_command`'s schema: Codex ran its
            // `cmd`, the simulator's words, as a shell command.
            assert!(
                stderr.contains("exec\n/bin/bash -lc ' the quick brown"),
                "{model}: {stderr}"
            );
        }
        let sim = if model.ends_with("plain") { 0 } else { 1 };
        let seen = support::seen([plain, tools][sim]).await;
        let new = &seen[seen_before[sim]..];
        seen_before[sim] = seen.len();
        assert_eq!(new.len(), requests, "{model}: {new:?}");
        assert!(new.iter().all(|r| r["path"] == path), "{model}: {new:?}");
    }
    // One engine, one curve per backend: every request the agent made taught it, whichever
    // dialect it was translated to.
    let curves = support::until(
        gw.admin_addr(),
        "/admin/curves",
        Duration::from_secs(2),
        |v| v["curves"].as_array().is_some_and(|c| c.len() == 5),
    )
    .await;
    for (backend, requests) in [
        ("chat", 1),
        ("claude", 1),
        ("native", 1),
        ("chat-tools", 2),
        ("claude-tools", 2),
    ] {
        let curve = curves["curves"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["backend"] == backend)
            .unwrap_or_else(|| panic!("no curve for {backend}: {curves}"));
        assert_eq!(curve["observations"], requests, "{backend}: {curve}");
    }
}
