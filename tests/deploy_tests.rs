//! deploy/: every file parses, every tpsgate config the manifests carry passes `tpsgate check`'s
//! validation, and Prometheus accepts its config and rules (`promtool`, which `.ci/run` installs
//! from the Debian package `prometheus`), systemd accepts the unit (`systemd-analyze`), and each
//! Kustomize overlay renders (`kubectl kustomize`) into manifests the Kubernetes schemas accept
//! (`kubernetes-validate`). `.ci/test` installs each tool; a missing one fails its test.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly, its shared helpers too"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

mod support;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn files(ext: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![deploy()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path
                .extension()
                .is_some_and(|e| ext.iter().any(|x| e == *x))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Every document of a YAML file.
fn documents(path: &Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            serde_yaml::Value::deserialize(doc)
                .map_err(|e| format!("{}: {e}", path.display()))
                .unwrap()
        })
        .collect()
}

/// Validates a gateway config as `tpsgate check` does, with every key variable set.
fn valid_gateway_config(text: &str, origin: &str) {
    tpsgate::config::parse(text, |_| Some("set".to_owned()))
        .map_err(|e| format!("{origin}: {e}"))
        .unwrap();
}

#[test]
fn every_yaml_and_json_file_parses() {
    let yaml = files(&["yml", "yaml"]);
    assert!(yaml.len() >= 8, "{yaml:?}");
    for path in &yaml {
        assert!(!documents(path).is_empty(), "{}", path.display());
    }
    for path in files(&["json"]) {
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| format!("{}: {e}", path.display()))
            .unwrap();
    }
}

#[test]
fn the_gateway_configs_the_manifests_carry_are_valid() {
    for file in [
        "compose/gateway.yaml",
        "k8s/overlays/shared-gateway/gateway.yaml",
        "k8s/overlays/sidecar/gateway.yaml",
    ] {
        valid_gateway_config(&std::fs::read_to_string(deploy().join(file)).unwrap(), file);
    }
}

/// `kubectl kustomize` of one overlay: its manifests.
fn rendered(overlay: &str) -> (String, Vec<serde_yaml::Value>) {
    rendered_at(&deploy().join("k8s/overlays").join(overlay))
}

/// `kubectl kustomize` of the directory `dir`: the text and its documents.
fn rendered_at(dir: &Path) -> (String, Vec<serde_yaml::Value>) {
    let overlay = dir.display();
    support::tool("kubectl", "kubernetes-client");
    // Components and `labels:` need kustomize 4 (kubectl 1.21 and later); Debian bookworm's
    // kubernetes-client is 1.20.
    let version = Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .unwrap();
    let version: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap_or_default();
    let minor: u32 = version["clientVersion"]["minor"]
        .as_str()
        .and_then(|m| m.trim_end_matches('+').parse().ok())
        .unwrap_or(0);
    assert!(
        minor >= 21,
        "kubectl 1.21 or later is needed (kustomize 4: components, labels); this one: {version}"
    );
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {overlay}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .collect();
    (text, docs)
}

/// The manifests `text` (named `what`) pass the Kubernetes 1.30 schemas, strictly: no field the
/// API does not know.
fn kubernetes_accepts(what: &str, text: &str) {
    let validate = support::venv_program("kubernetes-validate");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{what}.yaml"));
    std::fs::write(&file, text).unwrap();
    let out = Command::new(&validate)
        .args(["--strict", "--quiet", "-k", "1.30.0"])
        .arg(&file)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !said.contains("ERROR"),
        "{what}:\n{said}"
    );
}

/// Each overlay renders, and what it renders passes the Kubernetes schemas (strict: no field
/// the API does not know), Pod Security's "restricted" rules, and carries a config the gateway
/// accepts with its admin plane behind a token, a PodDisruptionBudget and a PodMonitor that
/// sends the token.
#[test]
fn each_kustomize_overlay_renders_manifests_kubernetes_and_pod_security_accept() {
    for overlay in ["shared-gateway", "sidecar"] {
        let (text, docs) = rendered(overlay);
        kubernetes_accepts(overlay, &text);

        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        for kind in [
            "ConfigMap",
            "Secret",
            "PodDisruptionBudget",
            "PodMonitor",
            "Deployment",
        ] {
            assert!(kinds.contains(&kind), "{overlay} has no {kind}: {kinds:?}");
        }
        for deployment in docs.iter().filter(|d| d["kind"] == "Deployment") {
            let name = deployment["metadata"]["name"].as_str().unwrap();
            let pod = &deployment["spec"]["template"]["spec"];
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
                "{overlay}/{name}: Pod Security restricted needs seccompProfile RuntimeDefault"
            );
            let containers = pod["containers"].as_sequence().unwrap();
            let init = pod["initContainers"]
                .as_sequence()
                .cloned()
                .unwrap_or_default();
            for c in containers.iter().chain(&init) {
                let sc = &c["securityContext"];
                let non_root =
                    sc["runAsNonRoot"] == true || pod["securityContext"]["runAsNonRoot"] == true;
                assert!(non_root, "{overlay}/{name}/{:?}: runAsNonRoot", c["name"]);
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{overlay}/{name}");
                assert_eq!(sc["capabilities"]["drop"][0], "ALL", "{overlay}/{name}");
                assert!(
                    c["resources"]["requests"].is_mapping(),
                    "{overlay}/{name}: resources"
                );
            }
        }
        let config = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap")
            .and_then(|d| d["data"]["tpsgate.yaml"].as_str())
            .unwrap();
        let config = tpsgate::config::parse(config, |_| Some("set".to_owned())).unwrap();
        assert!(
            config.admin_token.is_some(),
            "{overlay}: the admin plane needs a token"
        );
        let monitor = docs.iter().find(|d| d["kind"] == "PodMonitor").unwrap();
        let auth = &monitor["spec"]["podMetricsEndpoints"][0]["authorization"];
        assert_eq!(auth["credentials"]["key"], "ADMIN_TOKEN", "{overlay}");
        assert!(
            kinds.iter().filter(|k| **k == "Deployment").count() == 2,
            "with the Redis component"
        );
    }
}

/// The autoscaling example renders and passes the Kubernetes schemas, and its chain holds: the
/// HPA's external metric is the one the adapter rule serves, from the series Prometheus records,
/// from gauges the gateway exports.
#[test]
fn the_autoscaler_scales_an_engine_on_the_capacity_the_gateway_exports() {
    let (text, docs) = rendered_at(&deploy().join("k8s/autoscale"));
    kubernetes_accepts("autoscale", &text);

    let hpa = docs
        .iter()
        .find(|d| d["kind"] == "HorizontalPodAutoscaler")
        .unwrap();
    let metric = &hpa["spec"]["metrics"][0]["external"]["metric"];
    let rules = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|d| d["data"]["config.yaml"].as_str())
        .unwrap();
    let rules: serde_yaml::Value = serde_yaml::from_str(rules).unwrap();
    let rule = &rules["externalRules"][0];
    assert_eq!(rule["name"]["as"], metric["name"]);
    let recorded = rule["seriesQuery"].as_str().unwrap().trim_matches('\'');
    assert!(rule["metricsQuery"].as_str().unwrap().contains(recorded));
    for label in ["model", "class"] {
        assert!(
            metric["selector"]["matchLabels"][label].is_string(),
            "the HPA picks one {label}"
        );
    }

    let alerts = documents(&deploy().join("prometheus/alerts.yml"));
    let record = alerts[0]["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .find(|r| r["record"] == recorded)
        .unwrap_or_else(|| panic!("Prometheus records {recorded}"));
    let expr = record["expr"].as_str().unwrap();
    assert!(
        expr.contains(tpsgate::telemetry::CAPACITY_REQUESTS),
        "{expr}"
    );
}

/// The sidecar starts before the app and stops after it: a native sidecar (an init container
/// that keeps running) whose startup probe holds the app back; the app's own containers are
/// left as they were.
#[test]
fn the_sidecar_is_a_native_sidecar_that_is_ready_before_the_app_starts() {
    let (_, docs) = rendered("sidecar");
    let app = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "my-app")
        .unwrap();
    let pod = &app["spec"]["template"]["spec"];
    let names: Vec<&str> = pod["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app"]);
    let gateway = &pod["initContainers"][0];
    assert_eq!(gateway["name"], "tpsgate");
    assert_eq!(gateway["restartPolicy"], "Always");
    assert_eq!(gateway["startupProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        app["spec"]["template"]["metadata"]["labels"]["tpsgate.io/gateway"],
        "true"
    );
    let env = &pod["containers"][0]["env"];
    assert_eq!(env[0]["value"], "http://127.0.0.1:8080/v1");
}

#[test]
fn the_grafana_dashboard_queries_metrics_the_gateway_exports() {
    let text = std::fs::read_to_string(deploy().join("grafana/dashboards/tpsgate.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exported = [
        tpsgate::telemetry::TTFT,
        tpsgate::telemetry::TPOT,
        tpsgate::telemetry::PER_USER_TPS,
        tpsgate::telemetry::CURVE_TPS,
        tpsgate::telemetry::CURVE_TTFT,
        tpsgate::telemetry::SLO_ATTAINMENT,
        tpsgate::telemetry::IN_FLIGHT,
        tpsgate::telemetry::BACKEND_HEALTHY,
        tpsgate::telemetry::ROUTE_DECISIONS,
        tpsgate::telemetry::CONCURRENCY_CAP,
        tpsgate::telemetry::REQUESTS,
        tpsgate::telemetry::QUEUE_WAITING,
        tpsgate::telemetry::EJECTIONS,
        tpsgate::telemetry::RETRIES,
        tpsgate::telemetry::TIMEOUTS,
        tpsgate::telemetry::GATEWAY_ERRORS,
        tpsgate::telemetry::CONFIG_RELOADS,
        tpsgate::telemetry::BUILD_INFO,
    ];
    // Importable into any Grafana: the data source is a variable, and every panel follows it
    // and the gateway (instance), backend and model chosen.
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "instance", "backend", "model"]);
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = &panel["title"];
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {title}");
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            assert!(
                exported.iter().any(|m| expr.contains(m)),
                "panel {title}: {expr}"
            );
            assert!(
                expr.contains("instance=~\"$instance\""),
                "panel {title}: {expr}"
            );
            assert!(
                !expr.contains("rate(") || expr.contains("[$__rate_interval]"),
                "panel {title}: rates over $__rate_interval, not a fixed window: {expr}"
            );
        }
    }
    // The curves against concurrency, as an XY chart, not one time series per level.
    let curves: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["title"].as_str().unwrap().starts_with("Curve"))
        .collect();
    assert_eq!(curves.len(), 2);
    for panel in curves {
        assert_eq!(panel["type"], "xychart", "{}", panel["title"]);
        assert_eq!(panel["targets"][0]["instant"], true);
        assert_eq!(
            panel["options"]["series"][0]["x"]["matcher"]["options"],
            "concurrency"
        );
    }
}

#[test]
fn prometheus_accepts_the_scrape_config_and_the_alert_rules() {
    support::tool("promtool", "prometheus");
    // `test rules`: target down, the error ratio and a refused reload each fire on the series
    // that should fire them (prometheus/alerts_test.yml).
    for (what, file) in [
        ("check config", "prometheus/prometheus.yml"),
        ("check rules", "prometheus/alerts.yml"),
        ("test rules", "prometheus/alerts_test.yml"),
    ] {
        let out = Command::new("promtool")
            .args(what.split(' '))
            .arg(deploy().join(file))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {what} {file}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The image cannot be built here (no Docker), so at least every file its build copies from the
/// repository must exist, and the scripts it runs must parse.
#[test]
fn the_dockerfile_copies_files_that_exist_and_runs_scripts_that_parse() {
    let root = deploy().parent().unwrap().to_path_buf();
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    let mut copied = 0;
    for line in dockerfile.lines() {
        let Some(args) = line.strip_prefix("COPY ") else {
            continue;
        };
        if args.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = args.split_whitespace().collect();
        for source in &words[..words.len() - 1] {
            assert!(
                root.join(source).exists(),
                "Dockerfile copies {source}, which is missing"
            );
            copied += 1;
        }
    }
    assert!(copied > 0, "no COPY line read from the Dockerfile");
    let out = Command::new("bash")
        .arg("-n")
        .arg(deploy().join("pgo-build.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy/pgo-build.sh does not parse:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The unit as shipped: systemd accepts every line of it (`systemd-analyze verify`, with the
/// binary it names pointed at the one built here), its user can read the config, and
/// `systemctl reload` checks the config before applying it with SIGHUP.
#[test]
fn the_systemd_unit_verifies_reads_its_config_and_reloads() {
    support::tool("systemd-analyze", "systemd");
    let unit = std::fs::read_to_string(deploy().join("systemd/tpsgate.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("tpsgate.service");
    std::fs::write(
        &here,
        unit.replace("/usr/local/bin/tpsgate", env!("CARGO_BIN_EXE_tpsgate")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&here)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    // systemd-analyze exits 0 on a line it ignores: what it says about the unit is the verdict.
    let about_unit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("tpsgate.service"))
        .collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify:\n{said}"
    );
    // DynamicUser: the service's user is made at start, so the config must be world-readable.
    assert!(unit.contains("DynamicUser=yes"));
    assert!(
        unit.contains("install -m 644 config/gateway.yaml /etc/tpsgate/tpsgate.yaml"),
        "the install line must leave the config readable by the dynamic user"
    );
    let reload: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecReload="))
        .collect();
    assert_eq!(
        reload,
        [
            "/usr/local/bin/tpsgate check --config /etc/tpsgate/tpsgate.yaml",
            "/bin/kill -HUP $MAINPID"
        ]
    );
}

/// The compose file as `docker compose up --build` reads it: every service that runs our image
/// builds it (none pulls `tpsgate:local`), each says for itself when it is healthy (the image
/// has no HEALTHCHECK that would mark the simulator or bench unhealthy), the traffic waits for
/// healthy gateways, and the gateways' dashboards are published on this machine only.
#[test]
fn compose_builds_our_image_everywhere_checks_each_service_and_publishes_the_dashboards() {
    let mut compose = documents(&deploy().join("docker-compose.yml")).remove(0);
    compose.apply_merge().unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let mut ours = 0;
    for (name, service) in services {
        let name = name.as_str().unwrap();
        if service["image"].as_str() != Some("tpsgate:local") {
            continue;
        }
        ours += 1;
        assert!(
            service["build"].is_mapping(),
            "{name} runs tpsgate:local without build:"
        );
        let command = service["command"][0].as_str().unwrap();
        let probe = service["healthcheck"]["test"].as_sequence();
        match command {
            "serve" | "sim" => {
                let probe = probe.unwrap_or_else(|| panic!("{name} has no healthcheck"));
                let line = probe.last().unwrap().as_str().unwrap();
                assert!(line.contains("/dev/tcp/127.0.0.1/"), "{name}: {line}");
            }
            _ => assert!(
                probe.is_none(),
                "{name} ({command}) serves nothing to probe"
            ),
        }
        if command == "serve" {
            let ports: Vec<&str> = service["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap())
                .collect();
            assert!(
                ports
                    .iter()
                    .any(|p| p.starts_with("127.0.0.1:") && p.ends_with(":9090")),
                "{name}: the dashboard (admin :9090) is published on loopback: {ports:?}"
            );
        }
    }
    assert_eq!(
        ours, 6,
        "two simulators, two gateways, two traffic generators"
    );
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    assert!(!dockerfile.lines().any(|l| l.starts_with("HEALTHCHECK")));
    assert!(
        dockerfile.contains("--mount=type=cache"),
        "dependencies cached between builds"
    );
    let ignore = std::fs::read_to_string(deploy().join("../.dockerignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l.trim() == "target/"),
        "target/ stays out of the context"
    );
}
