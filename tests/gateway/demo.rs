//! `tpsgate demo`: README's first command.

use std::io::BufRead;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::support;

fn address_after(lines: &[String], label: &str) -> SocketAddr {
    lines
        .iter()
        .find(|l| l.trim_start().starts_with(label))
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|rest| rest.split(['/', ' ']).next())
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("no {label} address in {lines:?}"))
        .unwrap()
}

#[tokio::test]
async fn the_demo_shows_a_curve_for_every_backend_within_a_minute_and_stops_cleanly() {
    let mut child = support::tpsgate()
        .args(["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, mut stdout) = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        let mut reader = std::io::BufReader::new(stdout);
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let last = line.contains("Ctrl-C") || line.is_empty();
            lines.push(line.trim_end().to_owned());
            if last {
                break;
            }
        }
        (lines, reader)
    })
    .await
    .unwrap();
    let gateway = address_after(&lines, "gateway");
    let admin = address_after(&lines, "dashboard");
    let text = lines.join("\n");
    assert!(text.contains("curl -N http://") && text.contains("from openai import OpenAI"));

    let page = support::exchange(admin, Method::GET, "/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    let started = Instant::now();
    let mut with_curve = Vec::new();
    while started.elapsed() < Duration::from_secs(60) {
        let curves = support::get_json(admin, "/admin/curves").await;
        with_curve = curves["curves"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["points"].as_array().is_some_and(|p| !p.is_empty()))
            .map(|c| c["backend"].as_str().unwrap().to_owned())
            .collect();
        with_curve.sort();
        with_curve.dedup();
        if with_curve.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        with_curve,
        [
            "hosted-api",
            "llamacpp-serial",
            "sglang-small",
            "vllm-large"
        ],
        "curves after {:?}",
        started.elapsed()
    );
    dashboard_renders_in_a_browser(admin, &with_curve).await;
    // The gateway answers a client too.
    let ex = support::post(
        gateway,
        "/v1/chat/completions",
        &serde_json::json!({"model": "llama-3.1-8b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(ex.status, StatusCode::OK);

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (exit, log) = tokio::task::spawn_blocking(move || {
        let mut log = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
        (child.wait().unwrap(), log)
    })
    .await
    .unwrap();
    assert!(exit.success(), "{exit:?}");
    // The screen keeps its URLs: no line per request in the log, a status line instead.
    assert!(
        !log.contains("tpsgate::request"),
        "request lines in the demo's log:\n{log}"
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let traffic = rest
        .lines()
        .rfind(|l| l.trim_start().starts_with("traffic"))
        .unwrap_or_else(|| panic!("no status line after the URLs:\n{rest}"));
    assert!(
        traffic.contains(" sent, ") && traffic.contains("within its SLO"),
        "{traffic}"
    );
}

/// Loads the dashboard in headless Chromium, lets its script fetch `/admin/curves` and draw,
/// and checks the DOM: a card with both charts (points drawn) for every backend. Saves a
/// screenshot to `target/dashboard.png`. `.ci/test` installs Chromium (Debian `chromium`).
async fn dashboard_renders_in_a_browser(admin: SocketAddr, backends: &[String]) {
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let dom = support::dashboard_dom(admin).await;
    for backend in backends {
        let card = dom
            .split(&format!("data-backend=\"{backend}\""))
            .nth(1)
            .ok_or_else(|| format!("no card for {backend} in the rendered page:\n{dom}"))
            .unwrap();
        let card = card.split("</section>").next().unwrap();
        assert_eq!(card.matches("<svg").count(), 2, "{backend}: both charts");
        assert!(card.contains("<circle"), "{backend}: measured points drawn");
    }
    // The prefix caches' card: every backend's index in its table, the hit-rate chart drawn.
    let prefix = dom
        .split("id=\"prefix\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap();
    assert!(prefix.contains("<svg"), "the hit-rate chart:\n{prefix}");
    for backend in backends {
        assert!(
            prefix.contains(&format!("<td>{backend}</td>")),
            "{backend} in the prefix table:\n{prefix}"
        );
    }
    let shot = support::chromium(admin, &format!("--screenshot={}", screenshot.display())).await;
    assert!(shot.status.success());
    assert!(
        std::fs::metadata(&screenshot).unwrap().len() > 10_000,
        "a real screenshot"
    );
}
