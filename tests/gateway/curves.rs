//! The gateway learns each backend's curve from the streams alone.

use std::time::Duration;

use serde_json::Value;
use tpsgate::bench::{self, BenchDialect, LevelReport};
use tpsgate::sim::config::{EngineRaw, StreamRaw};

use crate::support::{self, rel_err};

// Short prompts: a burst of warm-up requests (all admitted at once) stacks their prefills, which
// the gateway measures honestly and the truth, assuming spread arrivals, does not describe.
const PROMPT: u32 = 16;
const OUTPUT: u32 = 32;

async fn level(gw: std::net::SocketAddr, c: usize, n: usize) -> LevelReport {
    let spec = support::request(gw, BenchDialect::Openai, PROMPT, OUTPUT);
    let bar = indicatif::ProgressBar::hidden();
    bench::closed_loop(
        &bench::http_client(),
        &spec,
        c,
        n,
        Duration::from_secs(60),
        &bar,
    )
    .await
}

async fn curve(admin: std::net::SocketAddr) -> Value {
    let all = support::get_json(admin, "/admin/curves").await;
    all["curves"][0].clone()
}

fn point(curve: &Value, c: u64) -> Value {
    curve["points"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["concurrency"] == c)
        .cloned()
        .ok_or_else(|| format!("no bucket {c} in {curve}"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_curve_matches_the_truth_and_the_client_at_1_4_16_32() {
    let (_fleet, sim) = support::start(support::spec(
        "big",
        EngineRaw::default(),
        StreamRaw::default(),
        vec![],
    ))
    .await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    for c in [1usize, 4, 16, 32] {
        let report = level(gw.addr(), c, 32).await;
        assert_eq!(report.errors, 0, "{:?}", report.first_error);
        let measured = point(&curve(gw.admin_addr()).await, c as u64);
        let truth = support::truth(sim, PROMPT, OUTPUT, c).await;
        let tps = measured["per_user_tps_p50"].as_f64().unwrap();
        let want_tps = truth["per_user_tps"].as_f64().unwrap();
        assert!(
            rel_err(tps, want_tps) <= 0.05,
            "c={c}: gateway TPS {tps:.2}, truth {want_tps:.2}"
        );
        let ttft = measured["ttft_p50_s"].as_f64().unwrap();
        let want_ttft = truth["ttft_s"].as_f64().unwrap();
        assert!(
            rel_err(ttft, want_ttft) <= 0.10 || (ttft - want_ttft).abs() < 0.003,
            "c={c}: gateway TTFT {ttft:.4}, truth {want_ttft:.4}"
        );
        let client_tps = report.per_user_tps_p50.unwrap();
        eprintln!(
            "c={c}: gateway {tps:.2} tok/s {:.1} ms; truth {want_tps:.2} tok/s {:.1} ms; bench {client_tps:.2} tok/s",
            ttft * 1e3,
            want_ttft * 1e3
        );
        assert!(
            rel_err(tps, client_tps) <= 0.03,
            "c={c}: gateway {tps:.2} vs bench {client_tps:.2}"
        );
    }
    let c = curve(gw.admin_addr()).await;
    assert_eq!(c["in_flight"], 0);
    assert_eq!(c["estimated_share"], 0.0);
    let fit = &c["fit"];
    // The sim's step is 13.5 ms + 0.83 ms per request (prefill stalls add a little).
    assert!(
        rel_err(fit["tpot_per_seq_s"].as_f64().unwrap(), 0.00083) < 0.25,
        "{fit}"
    );
    assert!(
        rel_err(fit["tpot_base_s"].as_f64().unwrap(), 0.0135) < 0.10,
        "{fit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_tokens_per_chunk_are_timed_right() {
    let stream = StreamRaw {
        tokens_per_chunk: 4,
        usage_on_finish: false,
    };
    let (_fleet, sim) = support::start(support::spec(
        "chunky",
        EngineRaw::default(),
        stream,
        vec![],
    ))
    .await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let report = level(gw.addr(), 4, 16).await;
    assert_eq!(report.errors, 0);
    let measured = point(&curve(gw.admin_addr()).await, 4);
    let truth = support::truth(sim, PROMPT, OUTPUT, 4).await;
    let tps = measured["per_user_tps_p50"].as_f64().unwrap();
    let want = truth["per_user_tps"].as_f64().unwrap();
    assert!(
        rel_err(tps, want) <= 0.05,
        "gateway TPS {tps:.2}, truth {want:.2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_frees_its_slot_and_leaves_no_sample() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    use http_body_util::BodyExt;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"model":"m","messages":[],"max_tokens":100000,"stream":true}"#,
        )))
        .unwrap();
    let mut body = bench::http_client()
        .request(request)
        .await
        .unwrap()
        .into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(curve_in_flight(&gw).await, 1);
    drop(body);
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
    let ex = support::exchange(gw.admin_addr(), http::Method::GET, "/metrics", None).await;
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
    assert!(text.contains("quantile=\"0.5\""));
}
