//! The `tpsgate` binary itself: what it prints, how it fails.

use std::path::Path;

use tpsgate::sim::FleetRaw;

use crate::support;

use support::tpsgate;

#[tokio::test]
async fn sim_serves_on_the_address_it_prints() {
    let mut command = support::tpsgate();
    command.args([
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "llama",
        "--step-base-ms",
        "2",
    ]);
    let sim = support::spawn_listening(command).await;
    let models = support::get_json(sim.addr, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "llama");
}

fn sim_with_config(yaml: &str) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = tpsgate()
        .args(["sim", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    (out, dir)
}

#[test]
fn a_misspelt_field_is_reported_with_file_line_column_and_path() {
    let (out, _dir) = sim_with_config(
        "backends:\n  - name: a\n    listen: 127.0.0.1:0\n    models: [m]\n    engine:\n      mode: batching\n      stp_base_ms: 3\n",
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "fleet.yaml:7:7: backends[0].engine.stp_base_ms: unknown field `stp_base_ms`"
        ),
        "{stderr}"
    );
}

#[test]
fn an_out_of_range_value_is_reported_with_its_path_and_the_fix() {
    let (out, _dir) = sim_with_config(
        "backends:\n  - name: a\n    listen: 127.0.0.1:0\n    models: [m]\n    engine: {mode: serial, max_batch: 4}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fleet.yaml: backends[0].engine.max_batch: 4 conflicts with mode: serial"),
        "{stderr}"
    );
}

#[test]
fn the_shipped_fleet_has_four_backends_of_distinct_shape() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/sim-fleet.yaml");
    let specs = tpsgate::yaml::from_file::<FleetRaw>(&path)
        .unwrap()
        .validate()
        .unwrap();
    assert!(specs.len() >= 4);
    let speed = |name: &str, c: usize| {
        let spec = specs.iter().find(|s| s.name == name).unwrap();
        tpsgate::sim::truth::point(&spec.params.timing, c, 64, 128)
    };
    let (one, many) = (speed("vllm-large", 1), speed("vllm-large", 64));
    assert!((65.0..75.0).contains(&one.per_user_tps) && (13.0..17.0).contains(&many.per_user_tps));
    assert!(
        speed("sglang-small", 16).ttft_s > 1.0,
        "past max_batch 8 requests queue"
    );
    assert_eq!(
        speed("llamacpp-serial", 1).per_user_tps,
        speed("llamacpp-serial", 4).per_user_tps
    );
    let hosted = speed("hosted-api", 32);
    assert!(
        (0.55..0.65).contains(&hosted.ttft_s)
            && support::rel_err(hosted.per_user_tps, speed("hosted-api", 1).per_user_tps) < 0.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prints_one_json_object_per_level() {
    let (_fleet, addr) = support::start_engine("x", support::engine(2.0, 0.5, 8)).await;
    let lines = bench_json(&[
        "--url",
        &support::base(addr),
        "--model",
        "m",
        "--concurrency",
        "1,4",
        "--requests",
        "8",
        "--max-tokens",
        "16",
        "--prompt-tokens",
        "8",
    ])
    .await;
    assert_eq!(lines.len(), 2);
    for (line, c) in lines.iter().zip([1, 4]) {
        assert_eq!(line["concurrency"], c);
        assert_eq!(line["requests"], 8);
        assert_eq!(line["errors"], 0);
        for field in [
            "ttft_p50_s",
            "ttft_p90_s",
            "ttft_p99_s",
            "per_user_tps_p10",
            "per_user_tps_p50",
            "per_user_tps_p90",
            "system_tps",
        ] {
            assert!(line[field].as_f64().unwrap() > 0.0, "{field} in {line}");
        }
    }
}

/// Runs `tpsgate bench ARGS --json` to completion; one JSON object per line it printed.
pub(crate) async fn bench_json(args: &[&str]) -> Vec<serde_json::Value> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        tpsgate()
            .arg("bench")
            .args(&args)
            .arg("--json")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn open_loop(addr: std::net::SocketAddr, slo_tps: &str) -> serde_json::Value {
    let url = support::base(addr);
    let args = [
        "--url",
        &url,
        "--model",
        "m",
        "--rate",
        "20",
        "--duration",
        "1",
    ];
    let slo = [
        "--max-tokens",
        "8",
        "--slo-ttft-ms",
        "500",
        "--slo-tps",
        slo_tps,
    ];
    bench_json(&[&args[..], &slo[..]].concat()).await.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_open_loop_offers_the_same_requests_every_time() {
    let (_fleet, addr) = support::start_engine("x", support::engine(1.0, 0.0, 64)).await;
    let url = support::base(addr);
    let per_class = |seed: &'static str| {
        let url = url.clone();
        async move {
            let args = [
                "--url",
                &url,
                "--model",
                "m",
                "--max-tokens",
                "2",
                "--seed",
                seed,
            ];
            let mix = ["--rate", "40", "--duration", "1", "--mix", "a=0.5,b=0.5"];
            bench_json(&[&args[..], &mix[..]].concat())
                .await
                .into_iter()
                .map(|report| report["requests"].clone())
                .collect::<Vec<_>>()
        }
    };
    // Named alike too (`x-request-id`), so that a simulator draws each the same speed.
    let names = |seen: &[serde_json::Value]| -> std::collections::BTreeSet<String> {
        seen.iter()
            .map(|r| r["request_id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let first = per_class("7").await;
    assert_eq!(first.len(), 2, "one report per class");
    let seen = support::seen(addr).await;
    let named = names(&seen);
    assert!(
        named.iter().all(|id| id.starts_with("s7-r40000-")),
        "{named:?}"
    );
    assert_eq!(per_class("7").await, first);
    let again = support::seen(addr).await;
    assert_eq!(names(&again[again.len() - seen.len()..]), named);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_sends_a_seeded_mix_of_recorded_prompts_and_drawn_output_lengths() {
    let (fleet, addr) = support::start_engine("x", support::engine(1.0, 0.0, 64)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sharegpt.jsonl");
    let prompts = ["a".repeat(40), "b".repeat(400), "c".repeat(2000)];
    let lines: Vec<String> = prompts
        .iter()
        .map(|p| {
            serde_json::json!({"conversations": [
                {"from": "human", "value": p},
                {"from": "gpt", "value": "an answer"},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let url = support::base(addr);
    let file = file.display().to_string();
    let run = || {
        let (url, file) = (url.clone(), file.clone());
        async move {
            let args = [
                "--url",
                &url,
                "--model",
                "m",
                "--prompts",
                &file,
                "--max-tokens",
                "uniform:min=4,max=12",
                "--seed",
                "11",
                "--concurrency",
                "1,2",
                "--requests",
                "16",
            ];
            bench_json(&args).await
        }
    };
    let levels = run().await;
    assert_eq!(levels.len(), 2, "one report per level");
    for level in &levels {
        assert_eq!(level["errors"], 0, "{level}");
        let mix = level["mix"].as_str().unwrap();
        assert!(
            mix.contains("sharegpt.jsonl (3 of them)")
                && mix.contains("output tokens uniform:min=4,max=12")
                && mix.contains("seed 11"),
            "{mix}"
        );
        let asked = level["max_tokens_mean"].as_f64().unwrap();
        assert!((4.0..=12.0).contains(&asked), "{level}");
        assert_eq!(
            level["output_tokens_mean"], level["max_tokens_mean"],
            "{level}"
        );
    }
    // What the server saw: only the file's first user turns, and several output lengths.
    let seen = support::seen(fleet.addr("x").unwrap()).await;
    let sizes: std::collections::BTreeSet<u64> = seen
        .iter()
        .map(|r| r["prompt_tokens"].as_u64().unwrap())
        .collect();
    let outputs: std::collections::BTreeSet<u64> = seen
        .iter()
        .map(|r| r["max_tokens"].as_u64().unwrap())
        .collect();
    assert!(
        sizes.len() >= 2 && sizes.iter().all(|s| [10, 100, 500].contains(s)),
        "{sizes:?}"
    );
    assert!(
        outputs.len() >= 3 && outputs.iter().all(|t| (1..=12).contains(t)),
        "{outputs:?}"
    );
    // The same seed: the same requests, so the same means.
    let again = run().await;
    for (a, b) in levels.iter().zip(&again) {
        assert_eq!(a["prompt_tokens_mean"], b["prompt_tokens_mean"]);
        assert_eq!(a["max_tokens_mean"], b["max_tokens_mean"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_bench_reports_slo_attainment_and_goodput() {
    // A 10 ms step: 100 tok/s per user whatever the load. The easy SLO asks for a fifth of
    // that, so a shared machine that stalls a chunk for tens of milliseconds still meets it.
    let (_fleet, addr) = support::start_engine("x", support::engine(10.0, 0.0, 64)).await;
    let easy = open_loop(addr, "20").await;
    assert_eq!(easy["rate_rps"], 20.0);
    assert!(easy["slo_attainment"].as_f64().unwrap() >= 0.9, "{easy}");
    assert!(easy["goodput_rps"].as_f64().unwrap() > 5.0, "{easy}");
    let impossible = open_loop(addr, "1000").await;
    assert_eq!(impossible["slo_attainment"], 0.0, "{impossible}");
    assert_eq!(impossible["goodput_rps"], 0.0, "{impossible}");
}

#[test]
fn every_command_has_help_and_shells_get_completions() {
    let out = tpsgate().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    for command in ["serve", "check", "sim", "bench", "demo", "completions"] {
        assert!(help.contains(command), "{command} missing from:\n{help}");
        let out = tpsgate().args([command, "--help"]).output().unwrap();
        assert!(out.status.success(), "{command} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: tpsgate"),
            "{command} --help"
        );
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = tpsgate().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("tpsgate") && script.contains("bench") && script.contains("--config"),
            "{shell}"
        );
    }
}
