//! The gateway learns each backend's curve from the streams alone.

use std::time::Duration;

use serde_json::Value;
use tpsgate::sim::config::{EngineRaw, StreamRaw};

use crate::support::curves::{OUTPUT, PROMPT, curve, level, point};
use crate::support::{self, rel_err};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_cancels_upstream_frees_its_slot_and_leaves_no_sample() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    use http_body_util::BodyExt;
    let mut body = support::open_stream(gw.addr(), "m", 100_000).await;
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(curve_in_flight(&gw).await, 1);
    let left = tokio::time::Instant::now();
    drop(body);
    // The upstream request is cancelled too: the simulator sees its client (the gateway) go.
    let mut stats = Value::Null;
    for _ in 0..200 {
        stats = support::get_json(sim, "/sim/stats").await;
        if stats["stats"]["cancelled"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(stats["stats"]["cancelled"], 1, "{stats}");
    assert_eq!(stats["stats"]["running"], 0, "{stats}");
    eprintln!(
        "upstream cancelled {:?} after the client left",
        left.elapsed()
    );
    let mut c = Value::Null;
    for _ in 0..100 {
        c = curve(gw.admin_addr()).await;
        if c["observations"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(c["in_flight"], 0, "{c}");
    assert_eq!(c["cancelled"], 1, "{c}");
    assert_eq!(
        c["points"],
        serde_json::json!([]),
        "a cancelled request is not a sample"
    );
}

async fn curve_in_flight(gw: &tpsgate::gateway::Gateway) -> u64 {
    let backends = support::get_json(gw.admin_addr(), "/admin/backends").await;
    backends["backends"][0]["in_flight"].as_u64().unwrap()
}

/// Checks one line of the Prometheus text exposition format (version 0.0.4).
fn valid_exposition_line(line: &str) -> bool {
    if line.is_empty() {
        return true;
    }
    if let Some(rest) = line.strip_prefix("# TYPE ") {
        let mut parts = rest.split(' ');
        let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        return valid_name(name)
            && ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind);
    }
    if line.starts_with("# ") {
        return true;
    }
    let Some((series, value)) = line.rsplit_once(' ') else {
        return false;
    };
    let value_ok = value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value);
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}')),
        None => (series, Some("")),
    };
    let labels_ok = labels.is_some_and(|l| {
        l.is_empty()
            || l.split("\",")
                .all(|pair| pair.split_once("=\"").is_some_and(|(k, _)| valid_name(k)))
    });
    value_ok && valid_name(name) && labels_ok
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_carry_the_curve() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(2.0, 0.1, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let report = level(gw.addr(), 2, 8).await;
    assert_eq!(report.errors, 0);
    // A request leaves the in-flight count when the gateway drops its response body, which can
    // be a moment after the client has read the body's end: scrape until it has.
    let mut ex = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
    for _ in 0..100 {
        if String::from_utf8_lossy(&ex.body()).contains("tpsgate_in_flight{backend=\"sim\"} 0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        ex = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
    }
    assert_eq!(ex.status, 200);
    assert!(
        ex.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = String::from_utf8(ex.body()).unwrap();
    for line in text.lines() {
        assert!(
            valid_exposition_line(line),
            "not Prometheus text format: {line:?}"
        );
    }
    for series in [
        "gen_ai_server_time_to_first_token_seconds_bucket{",
        "gen_ai_server_time_per_output_token_seconds_count{",
        "gen_ai_client_token_usage_sum{",
        "tpsgate_per_user_tps_bucket{",
        "tpsgate_requests_total{",
        "tpsgate_in_flight{backend=\"sim\"} 0",
        "tpsgate_curve_per_user_tps{",
        "tpsgate_curve_ttft_seconds{",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    assert!(text.contains("percentile=\"50\""));
}

/// What a dashboard or an alert is built on: every metric says what it is (`# HELP`, which
/// `promtool check metrics` lints for, with Prometheus's naming rules), the build is named, the
/// reload and error counters exist at zero before their first event, and the process is
/// described (CPU, memory, open files).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_described_and_counters_an_alert_reads_exist_from_the_start() {
    let promtool = support::tool("promtool", "prometheus");
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    assert_eq!(level(gw.addr(), 1, 2).await.errors, 0);
    let text = String::from_utf8(
        support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None)
            .await
            .body(),
    )
    .unwrap();
    for family in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = family.split_whitespace().next().unwrap();
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP text"
        );
    }
    let build = format!(
        "tpsgate_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    for series in [
        build.as_str(),
        "tpsgate_config_reload_total{result=\"refused\"}",
        "tpsgate_gateway_errors_total{code=\"upstream_unreachable\"}",
        "tpsgate_retries_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    let mut lint = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut lint.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_without_usage_is_estimated_and_flagged() {
    let stream = StreamRaw {
        usage: tpsgate::sim::config::UsageStyle::Never,
        ..StreamRaw::default()
    };
    let (_fleet, sim) =
        support::start(support::spec("quiet", EngineRaw::default(), stream, vec![])).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let report = level(gw.addr(), 4, 12).await;
    assert_eq!(report.errors, 0);
    assert_eq!(report.estimated, 12, "bench sees no usage either");
    let c = curve(gw.admin_addr()).await;
    assert_eq!(c["estimated_share"], 1.0, "{c}");
    // One token per chunk: counting chunks is exact here, so the speed is still right.
    let tps = point(&c, 4)["per_user_tps_p50"].as_f64().unwrap();
    let want = support::truth(sim, PROMPT, OUTPUT, 4).await["per_user_tps"]
        .as_f64()
        .unwrap();
    assert!(rel_err(tps, want) <= 0.05, "{tps} vs {want}");
}

#[tokio::test]
async fn the_dashboard_is_one_self_contained_page() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(2.0, 0.1, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let ex = support::exchange(gw.admin_addr(), http::Method::GET, "/", None).await;
    assert_eq!(ex.status, 200);
    assert!(
        ex.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let page = String::from_utf8(ex.body()).unwrap();
    assert!(
        page.contains("/admin/curves"),
        "it plots the curves endpoint"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://") && !page.contains("src="),
        "no CDN, no external assets"
    );
}

#[tokio::test]
async fn a_non_stream_response_read_to_its_end_is_counted_as_completed() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(2.0, 0.1, 8)).await;
    // Its own backend name: the metrics registry is shared by every test in this binary.
    let backend = support::backend_yaml("whole", sim, "openai", "    models: {m: m}\n");
    let gw = support::gateway(&format!("backends:\n{backend}")).await;
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let ex = support::post(gw.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(ex.status, 200);
    let metrics = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
    let text = String::from_utf8(metrics.body()).unwrap();
    let requests: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tpsgate_requests_total{") && l.contains("backend=\"whole\""))
        .collect();
    assert!(
        requests.len() == 1 && requests[0].contains("outcome=\"completed\""),
        "{requests:?}"
    );
}

/// `tpsgate curves` takes a gateway's curves away as the dashboard draws them (SVG) and as
/// numbers (CSV); the dashboard's download buttons fetch the same files from the admin plane,
/// behind its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_curves_can_be_taken_away_as_svg_and_csv() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(2.0, 0.1, 8)).await;
    let gw = support::gateway(&format!(
        "admin: {{listen: 127.0.0.1:0, token_env: ADMIN}}\nbackends:\n{}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    assert_eq!(level(gw.addr(), 2, 8).await.errors, 0);
    let dir = tempfile::tempdir().unwrap();
    let (svg, csv) = (dir.path().join("c.svg"), dir.path().join("c.csv"));
    let admin = format!("http://{}", gw.admin_addr());
    let run = |token: Option<&str>| {
        let mut command = support::tpsgate();
        command.args(["curves", "--url", &admin, "--token-env", "TOKEN", "--svg"]);
        command.arg(&svg).arg("--csv").arg(&csv);
        match token {
            Some(t) => command.env("TOKEN", t),
            None => command.env("TOKEN", "wrong"),
        };
        command.output().unwrap()
    };
    let refused = run(None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("401"),
        "{refused:?}"
    );
    // support::gateway answers `key-of-NAME` for every variable NAME.
    let out = run(Some("key-of-ADMIN"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(
        picture.contains("sim · m") && picture.contains("<circle"),
        "{picture}"
    );
    let numbers = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<&str> = numbers.lines().collect();
    assert!(rows[0].starts_with("backend,model,concurrency,"));
    assert!(
        rows.len() >= 2 && rows[1..].iter().all(|r| r.starts_with("sim,m,")),
        "{numbers}"
    );

    // The dashboard's buttons: the same files from the admin plane, as downloads.
    for (path, kind, starts) in [
        ("/admin/curves.svg", "image/svg+xml", "<svg"),
        (
            "/admin/curves.csv",
            "text/csv; charset=utf-8",
            "backend,model",
        ),
    ] {
        let ex = support::send(
            &tpsgate::bench::http_client(None).unwrap(),
            gw.admin_addr(),
            http::Method::GET,
            path,
            None,
            &[("authorization", "Bearer key-of-ADMIN")],
        )
        .await;
        assert_eq!(ex.status, 200, "{path}");
        assert_eq!(ex.headers["content-type"], kind);
        assert!(
            ex.headers["content-disposition"]
                .to_str()
                .unwrap()
                .starts_with("attachment")
        );
        assert!(
            String::from_utf8(ex.body()).unwrap().starts_with(starts),
            "{path}"
        );
    }
    let page = String::from_utf8(
        support::exchange(gw.admin_addr(), http::Method::GET, "/", None)
            .await
            .body(),
    )
    .unwrap();
    assert!(page.contains("id=\"save-svg\"") && page.contains("\"/admin/curves.\" + kind"));

    // A document saved from the admin plane (a benchmark keeps one) draws the same way later,
    // with no gateway running; a file that is not one is refused by name.
    let saved = dir.path().join("curves.json");
    let doc = support::send(
        &tpsgate::bench::http_client(None).unwrap(),
        gw.admin_addr(),
        http::Method::GET,
        "/admin/curves",
        None,
        &[("authorization", "Bearer key-of-ADMIN")],
    )
    .await
    .body();
    std::fs::write(&saved, doc).unwrap();
    let later = dir.path().join("later.svg");
    let drawn = support::tpsgate()
        .args(["curves", "--from"])
        .arg(&saved)
        .arg("--svg")
        .arg(&later)
        .output()
        .unwrap();
    assert!(drawn.status.success(), "{drawn:?}");
    let picture = std::fs::read_to_string(&later).unwrap();
    assert!(picture.contains("sim · m") && picture.contains("<circle"));
    let refused = support::tpsgate()
        .args(["curves", "--from"])
        .arg(&later)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("later.svg") && said.contains("not an /admin/curves document"),
        "{said}"
    );
    // JSON, but not the document: refused too, not drawn as an empty page.
    let other = dir.path().join("other.json");
    std::fs::write(&other, "{\"backends\": []}").unwrap();
    let refused = support::tpsgate()
        .args(["curves", "--from"])
        .arg(&other)
        .arg("--svg")
        .arg(dir.path().join("none.svg"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no `curves` list"),
        "{refused:?}"
    );
    assert!(!dir.path().join("none.svg").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_on_one_device_learn_what_each_others_load_costs_their_speed() {
    // A batching engine (5 ms + 0.5 ms per request a step) and a serial one (4 ms a step) on one
    // simulated device: while the serial engine decodes, each of the batching engine's steps
    // also waits for its 4 ms.
    let on_host = |name: &str, engine: EngineRaw| {
        let mut spec = support::spec(name, engine, StreamRaw::default(), vec![]);
        spec.device = Some("host".into());
        spec
    };
    let serial = EngineRaw {
        mode: tpsgate::sim::config::Mode::Serial,
        ..support::engine(4.0, 0.0, 1)
    };
    let fleet = tpsgate::sim::Fleet::start(&[
        on_host("batching", support::engine(5.0, 0.5, 8)),
        on_host("serial", serial),
    ])
    .await
    .unwrap();
    let neighbour_term = |told: &'static str| {
        let fleet = &fleet;
        async move {
            let backends: String = ["batching", "serial"]
                .iter()
                .map(|name| {
                    let addr = fleet.addr(name).unwrap();
                    support::backend_yaml(
                        name,
                        addr,
                        "openai",
                        &format!("    models: {{m: m}}\n{told}"),
                    )
                })
                .collect();
            let gw = support::gateway(&format!(
                "backends:\n{backends}routing: {{policy: round_robin}}\n"
            ))
            .await;
            // One at a time (the device to itself), then four at once (side by side).
            for (c, n) in [(1, 8), (4, 24)] {
                assert_eq!(level(gw.addr(), c, n).await.errors, 0);
            }
            let all = support::get_json(gw.admin_addr(), "/admin/curves").await;
            let batching = all["curves"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["backend"] == "batching")
                .cloned()
                .unwrap();
            batching["fit"]["tpot_per_neighbour_s"].as_f64().unwrap()
        }
    };
    let told = neighbour_term("    device: host\n").await;
    assert!(
        (0.003..0.005).contains(&told),
        "the serial engine's 4-ms steps show: {told}"
    );
    let untold = neighbour_term("").await;
    assert_eq!(
        untold, 0.0,
        "backends that share no device learn nothing of each other"
    );
}

/// BENCHMARKS.md's pictures are what `benches/pictures.sh` draws from the benchmarks' output kept
/// in docs/benchmarks/data/: redrawn here, each is the committed file byte for byte (a change to
/// the data, the drawing script or the dashboard's curve picture that is not redrawn fails).
#[test]
fn the_benchmarks_pictures_are_drawn_from_the_kept_data() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let drawn = std::process::Command::new("python3")
        .arg(root.join("benches/pictures.py"))
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(drawn.status.success(), "{drawn:?}");
    let curves = support::tpsgate()
        .args(["curves", "--from"])
        .arg(root.join("docs/benchmarks/data/curves-default.json"))
        .arg("--svg")
        .arg(dir.path().join("curves-default.svg"))
        .output()
        .unwrap();
    assert!(curves.status.success(), "{curves:?}");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}");
    let page = std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap();
    for name in &names {
        let kept = std::fs::read_to_string(root.join("docs/benchmarks/img").join(name))
            .unwrap_or_else(|e| panic!("docs/benchmarks/img/{name}: {e}; run benches/pictures.sh"));
        let fresh = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(
            kept == fresh,
            "docs/benchmarks/img/{name} is not its data's picture: run benches/pictures.sh"
        );
        assert!(
            page.contains(&format!("(docs/benchmarks/img/{name})")),
            "BENCHMARKS.md shows {name}"
        );
    }
}
