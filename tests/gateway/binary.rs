//! `tpsgate check` and `tpsgate serve` as a user runs them.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support;

use support::tpsgate;

#[test]
fn every_shipped_config_passes_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            // config/providers.yaml reads its providers' keys from these.
            let keys = [
                "OPENAI_API_KEY",
                "ANTHROPIC_API_KEY",
                "GEMINI_API_KEY",
                "AZURE_OPENAI_API_KEY",
                "GROQ_API_KEY",
                "TOGETHER_API_KEY",
                "FIREWORKS_API_KEY",
            ];
            let out = tpsgate()
                .arg("check")
                .arg("--config")
                .arg(&path)
                .envs(keys.map(|k| (k, "test-key")))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"));
            checked += 1;
        }
    }
    assert!(checked >= 3);
}

#[test]
fn broken_configs_print_file_line_column_and_field() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cases = [
        (
            "bad-unknown-field.yaml",
            "bad-unknown-field.yaml:6:5: backends[0].modles: unknown field `modles`",
        ),
        (
            "bad-url.yaml",
            "bad-url.yaml:4:10: backends[0].url: `ftp://10.0.0.1` must start with http:// or https://",
        ),
        (
            "bad-duplicate.yaml",
            "bad-duplicate.yaml:9:11: backends[1].name: duplicate backend name `a`",
        ),
        (
            "bad-missing-env.yaml",
            "bad-missing-env.yaml:6:18: backends[0].api_key_env: environment variable TPSGATE_TEST_UNSET_KEY is not set",
        ),
    ];
    for (file, expected) in cases {
        let out = tpsgate()
            .arg("check")
            .arg("--config")
            .arg(fixtures.join(file))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{file}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(expected),
            "{file}:\n{stderr}\nwanted: {expected}"
        );
    }
}

#[test]
fn check_names_every_error_of_a_config_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(
        &file,
        "backends:\n  - {name: a, url: ftp://x, dialect: openai, models: {m: m}}\n  - {name: b, url: http://127.0.0.1:1, dialect: openai, models: {m: m}, max_concurrency: 0}\ndefault_backend: c\n",
    )
    .unwrap();
    let out = tpsgate()
        .arg("check")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    assert!(
        lines[0].contains("gw.yaml:2:") && lines[0].contains("backends[0].url"),
        "{stderr}"
    );
    assert!(
        lines[1].contains("gw.yaml:3:") && lines[1].contains("backends[1].max_concurrency"),
        "{stderr}"
    );
    assert!(
        lines[2].contains("gw.yaml:4:") && lines[2].contains("default_backend"),
        "{stderr}"
    );
    assert_eq!(lines[3], "3 errors");
}

#[test]
fn check_no_env_lints_a_config_whose_secrets_are_elsewhere() {
    let providers = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/providers.yaml");
    let plain = tpsgate()
        .args(["check", "--config"])
        .arg(&providers)
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(1), "without the keys it fails");
    assert!(String::from_utf8_lossy(&plain.stderr).contains("is not set"));
    let linted = tpsgate()
        .args(["check", "--no-env", "--config"])
        .arg(&providers)
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert!(
        linted.status.success(),
        "{}",
        String::from_utf8_lossy(&linted.stderr)
    );
    assert!(
        String::from_utf8_lossy(&linted.stdout)
            .contains("ok (environment variables not read: --no-env)")
    );
}

#[test]
fn check_warns_of_one_engine_declared_once_per_dialect() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("twice.yaml");
    std::fs::write(
        &file,
        "backends:\n  - {name: vllm, url: http://10.0.0.5:8000, dialect: openai, models: {m: m}}\n  - {name: vllm-messages, url: http://10.0.0.5:8000, dialect: anthropic, models: {m: m}}\n",
    )
    .unwrap();
    let out = tpsgate()
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "a warning, not an error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("warning: backends vllm and vllm-messages have the same URL in two dialects"),
        "{stderr}"
    );
}

#[test]
fn the_config_path_can_come_from_tpsgate_config() {
    let gateway = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/gateway.yaml");
    let out = tpsgate()
        .arg("check")
        .env("TPSGATE_CONFIG", &gateway)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("gateway.yaml: ok"));
}

#[test]
fn global_flags_are_listed_apart_from_a_commands_own() {
    let out = tpsgate().args(["check", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let global = help
        .find("Global options:")
        .unwrap_or_else(|| panic!("{help}"));
    let own = help.find("--no-env").unwrap();
    assert!(own < global, "the command's own flags first:\n{help}");
    assert!(help[global..].contains("--log-format") && help[global..].contains("--threads"));
    assert!(
        help.contains("TPSGATE_CONFIG"),
        "the variable is named in --help:\n{help}"
    );
}

/// Serves one streamed request through `tpsgate serve` (JSON logs, `RUST_LOG` as given, the
/// backend's key from `TPSGATE_TEST_KEY`), then stops it with SIGTERM: the headers the backend
/// received and what the gateway wrote to stderr. (Not SIGKILL: the request's line is written
/// when the gateway drops the response body, which can be just after the client has read its
/// end, and lines gathered for the next write die with a killed process.)
async fn one_stream_through_serve(format: &str, rust_log: &str) -> (serde_json::Value, String) {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\nbackends:\n{}",
            support::backend_yaml(
                "sim",
                sim,
                "openai",
                "    models: {m: m}\n    api_key_env: TPSGATE_TEST_KEY\n"
            )
        ),
    )
    .unwrap();
    let mut command = tpsgate();
    command
        .args(["--log-format", format, "serve", "--config"])
        .arg(&file)
        .env("TPSGATE_TEST_KEY", "sk-very-secret-value")
        .env("RUST_LOG", rust_log)
        .stderr(Stdio::piped());
    let mut gw = support::spawn_listening(command).await;
    let ex = support::post(
        gw.addr,
        "/v1/chat/completions",
        &serde_json::json!({"model": "m", "messages": [], "max_tokens": 2, "stream": true}),
    )
    .await;
    assert_eq!(ex.status, 200);
    let received = support::seen(sim).await[0].clone();
    sigterm(&gw.child);
    (received, gw.child.wait_with_output_ref())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_never_logs_the_api_key() {
    let (received, out) = one_stream_through_serve("json", "trace").await;
    assert_eq!(received["authorization"], "Bearer sk-very-secret-value");
    assert!(
        out.contains("\"message\":\"request\""),
        "one log line per request: {out}"
    );
    assert!(
        !out.contains("sk-very-secret-value"),
        "the key leaked into the logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_line_says_why_the_router_chose_its_backend() {
    let (_, out) = one_stream_through_serve("json", "info").await;
    let line: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .find(|v: &serde_json::Value| v["message"] == "request")
        .unwrap_or_else(|| panic!("no request line: {out}"));
    // A request without a class on a backend whose curve knows nothing yet: the exploration
    // budget's pick (the `reason` label of `tpsgate_route_decisions_total`).
    assert_eq!(line["route"], "explore", "{line}");
    assert_eq!(line["backend"], "sim", "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_lines_can_be_silenced_alone_by_their_log_target() {
    let (_, out) = one_stream_through_serve("json", "info,tpsgate::request=off").await;
    assert!(!out.contains("\"message\":\"request\""), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pretty_logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (_, out) = one_stream_through_serve("pretty", "info").await;
    assert!(out.contains("request"), "the request's line: {out}");
    assert!(
        !out.contains('\u{1b}'),
        "ANSI escape codes in a file or pipe: {out:?}"
    );
}

/// Asks a child to stop, as an operator's `kill` would.
fn sigterm(child: &std::process::Child) {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
}

trait WaitOutput {
    fn wait_with_output_ref(&mut self) -> String;
}

impl WaitOutput for std::process::Child {
    fn wait_with_output_ref(&mut self) -> String {
        let _ = self.wait();
        let mut err = String::new();
        if let Some(mut stderr) = self.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
        }
        err
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_running_stream_finish_then_exits() {
    // 40 tokens at 10 ms: the stream outlives the signal by about 0.4 s.
    let (_fleet, sim) = support::start_engine("sim", support::engine(10.0, 0.0, 8)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\nlimits: {{drain_timeout_s: 10}}\nbackends:\n{}",
            support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
        ),
    )
    .unwrap();
    let mut command = tpsgate();
    command
        .args(["serve", "--config"])
        .arg(&file)
        .stderr(Stdio::null());
    let mut gw = support::spawn_listening(command).await;
    let addr = gw.addr;

    use http_body_util::BodyExt;
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"model":"m","messages":[],"max_tokens":40,"stream":true}"#,
        )))
        .unwrap();
    let mut body = tpsgate::bench::http_client(None)
        .unwrap()
        .request(request)
        .await
        .unwrap()
        .into_body();
    let mut received = body
        .frame()
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap()
        .to_vec();
    sigterm(&gw.child);
    while let Some(frame) = body.frame().await {
        received.extend_from_slice(&frame.unwrap().into_data().unwrap_or_default());
    }
    assert!(
        received.ends_with(b"data: [DONE]\n\n"),
        "the stream must finish whole"
    );
    let status = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// The handlers are registered before the gateway says it listens: a SIGTERM (or SIGHUP) the
/// moment it does is a drain and a clean exit, not the signal's default action killing the
/// process, streams and all.
#[tokio::test]
async fn a_signal_the_moment_the_gateway_says_it_listens_is_handled() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\nbackends:\n{}",
            support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
        ),
    )
    .unwrap();
    let mut command = tpsgate();
    command
        .args(["serve", "--config"])
        .arg(&file)
        .stderr(Stdio::null());
    let mut gw = support::spawn_listening(command).await;
    let pid = gw.child.id().to_string();
    for signal in ["-HUP", "-TERM"] {
        let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(sent.success());
    }
    let status = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// README's configs ("With your own backends", "Any client, any engine") are ones `tpsgate
/// check` accepts, as written.
#[test]
fn the_readme_configs_pass_check() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for heading in ["## With your own backends", "## Any client, any engine"] {
        let section = readme.split(heading).nth(1).unwrap();
        let yaml = section
            .split("```yaml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gateway.yaml");
        std::fs::write(&file, yaml).unwrap();
        let out = tpsgate()
            .args(["check", "--config"])
            .arg(&file)
            .env("TOGETHER_API_KEY", "test-key")
            .env("ANTHROPIC_API_KEY", "test-key")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{heading}: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
