//! Hot reload: validated whole, swapped at once, streams in flight untouched, curves kept; on
//! SIGHUP and on file change, once per change.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::Value;

use crate::support;

fn config_text(backends: &[(&str, SocketAddr)]) -> String {
    let mut text = String::from("backends:\n");
    for (name, addr) in backends {
        text.push_str(&support::backend_yaml(
            name,
            *addr,
            "openai",
            "    models: {m: m}\n",
        ));
    }
    text
}

fn parse(text: &str) -> tpsgate::config::Config {
    let full = format!("listen: {{address: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\n{text}");
    tpsgate::config::parse(&full, |_| None).unwrap()
}

/// The listeners of a served config file, on free ports.
const HEAD: &str = "listen: {address: 127.0.0.1:0}\nadmin: {listen: 127.0.0.1:0}\n";

/// `tpsgate serve` running on a config file in a temporary directory, with one backend `one`.
struct Served {
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
    gw: support::Spawned,
    admin: SocketAddr,
}

impl Served {
    async fn start(sim: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gateway.yaml");
        std::fs::write(&file, format!("{HEAD}{}", config_text(&[("one", sim)]))).unwrap();
        let mut command = support::tpsgate();
        command
            .args(["serve", "--config"])
            .arg(&file)
            .stderr(std::process::Stdio::null());
        let gw = support::spawn_listening(command).await;
        let admin = support::admin_of(&gw);
        Self {
            _dir: dir,
            file,
            gw,
            admin,
        }
    }
}

#[tokio::test]
async fn a_reload_swaps_backends_without_touching_a_running_stream_and_keeps_curves() {
    let (_a_fleet, a) = support::start_engine("a", support::engine(20.0, 0.0, 8)).await;
    let (_b_fleet, b) = support::start_engine("b", support::engine(1.0, 0.0, 8)).await;
    let gw = tpsgate::gateway::Gateway::start(&parse(&config_text(&[("a", a)])))
        .await
        .unwrap();
    // One request teaches a's curve.
    let ex = support::post(
        gw.addr(),
        "/v1/chat/completions",
        &serde_json::json!({"model": "m", "messages": [], "max_tokens": 4, "stream": true}),
    )
    .await;
    assert_eq!(ex.status, http::StatusCode::OK);

    // A stream of 40 tokens at 20 ms each is running while the config changes.
    let body = support::open_stream(gw.addr(), "m", 40).await;

    gw.reload(&parse(&config_text(&[("a", a), ("b", b)])))
        .await
        .unwrap();
    assert_eq!(support::backend_names(gw.admin_addr()).await, ["a", "b"]);

    let rest = body.collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the running stream finished: {text}"
    );

    let curves = support::get_json(gw.admin_addr(), "/admin/curves").await;
    let a_curve = curves["curves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["backend"] == "a")
        .cloned()
        .unwrap();
    assert!(a_curve["observations"].as_u64().unwrap() >= 2, "{a_curve}");

    // A reload that would change the listener is refused whole, and says why.
    let moved = tpsgate::config::parse(
        &format!(
            "listen: {{address: 127.0.0.1:1}}\nadmin: {{listen: 127.0.0.1:0}}\n{}",
            config_text(&[("b", b)])
        ),
        |_| None,
    )
    .unwrap();
    let err = gw.reload(&moved).await.unwrap_err();
    assert!(err.contains("restart"), "{err}");
    assert_eq!(support::backend_names(gw.admin_addr()).await, ["a", "b"]);
    let status = support::get_json(gw.admin_addr(), "/admin/reload").await;
    assert_eq!(status["applied"], 1);
    assert_eq!(status["refused"], 1);
    assert_eq!(status["last_ok"], false);
}

#[tokio::test]
async fn serve_reloads_once_per_file_change_rejects_half_written_files_and_obeys_sighup() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let served = Served::start(sim).await;
    let (file, admin) = (served.file.as_path(), served.admin);
    let head = HEAD;
    let status = async || -> Value { support::get_json(admin, "/admin/reload").await };
    let settle = || tokio::time::sleep(Duration::from_millis(1500));

    // Caught half-written: refused, the running config stays.
    std::fs::write(
        file,
        format!("{head}backends:\n  - name: two\n    url: http://{sim}\n"),
    )
    .unwrap();
    settle().await;
    let s = status().await;
    assert_eq!(
        (s["applied"].as_u64(), s["refused"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    assert_eq!(support::backend_names(admin).await, ["one"]);
    // An alert can see it: the last reload failed, and when.
    let metrics = async || {
        String::from_utf8(
            support::exchange(admin, http::Method::GET, "/metrics", None)
                .await
                .body(),
        )
        .unwrap()
    };
    let page = metrics().await;
    assert!(
        page.contains("tpsgate_config_last_reload_successful 0"),
        "{page}"
    );
    assert!(
        page.contains("tpsgate_config_reload_total{result=\"refused\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("tpsgate_config_last_reload_timestamp_seconds 1"),
        "{page}"
    );

    // The finished write is the next change: applied, once.
    std::fs::write(
        file,
        format!("{head}{}", config_text(&[("one", sim), ("two", sim)])),
    )
    .unwrap();
    settle().await;
    settle().await;
    let s = status().await;
    assert_eq!(
        (s["applied"].as_u64(), s["refused"].as_u64()),
        (Some(1), Some(1)),
        "{s}"
    );
    assert_eq!(support::backend_names(admin).await, ["one", "two"]);
    assert!(
        metrics()
            .await
            .contains("tpsgate_config_last_reload_successful 1")
    );

    // SIGHUP reloads even without a change.
    let killed = std::process::Command::new("kill")
        .args(["-HUP", &served.gw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status().await["applied"], 2);
}

#[tokio::test]
async fn an_absurd_number_in_a_reloaded_file_is_refused_by_name_and_reloading_goes_on() {
    // Regression: `drain_timeout_s: 1e300` panicked the reload task (a duration overflow), so
    // later valid edits and SIGHUP were ignored; `tpsgate check` panicked on the same file.
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let served = Served::start(sim).await;
    let (file, admin) = (served.file.as_path(), served.admin);
    let head = HEAD;
    let settle = || tokio::time::sleep(Duration::from_millis(1500));

    let absurd = format!(
        "{head}limits: {{drain_timeout_s: 1e300}}\n{}",
        config_text(&[("one", sim)])
    );
    std::fs::write(file, &absurd).unwrap();
    settle().await;
    let s = support::get_json(admin, "/admin/reload").await;
    assert_eq!(s["refused"], 1, "{s}");
    let why = s["last_error"].as_str().unwrap();
    assert!(why.contains("limits.drain_timeout_s"), "{why}");
    assert!(why.contains("at most 86400"), "{why}");
    let check = support::tpsgate()
        .args(["check", "--config"])
        .arg(file)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&check.stderr).contains("limits.drain_timeout_s"));

    // Reloading goes on: the next valid file is applied.
    std::fs::write(
        file,
        format!("{head}{}", config_text(&[("one", sim), ("two", sim)])),
    )
    .unwrap();
    settle().await;
    settle().await;
    assert_eq!(
        support::get_json(admin, "/admin/reload").await["applied"],
        1
    );
    assert_eq!(support::backend_names(admin).await, ["one", "two"]);
}

#[tokio::test]
async fn a_reload_that_changes_only_a_backends_limits_applies_them() {
    // Regression: a reload carried a backend over when the fields a hand-kept list compared
    // were the same, and the list missed max_models and max_event_bytes.
    let event = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "a".repeat(2000)
    );
    let answer = move |_: usize, _: &[u8]| {
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
            event.len() + 14
        )
        .into_bytes();
        out.extend_from_slice(event.as_bytes());
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    };
    let raw = support::raw_backend(answer, true).await;
    let with = |extra: &str| {
        parse(&format!(
            "backends:\n{}",
            support::backend_yaml(
                "raw",
                raw,
                "openai",
                &format!("    models: {{m: m}}\n{extra}")
            )
        ))
    };
    let gw = tpsgate::gateway::Gateway::start(&with("")).await.unwrap();
    let stream = async || {
        let ex = support::post(
            gw.addr(),
            "/v1/chat/completions",
            &serde_json::json!({"model": "m", "messages": [], "stream": true}),
        )
        .await;
        String::from_utf8(ex.body()).unwrap()
    };
    assert!(stream().await.ends_with("data: [DONE]\n\n"));

    gw.reload(&with("    max_event_bytes: 1024\n"))
        .await
        .unwrap();
    let cut = stream().await;
    assert!(cut.contains("\"error\""), "the new limit applies: {cut}");
    assert!(!cut.contains("[DONE]"), "{cut}");
}
