//! Raw config -> typed [`Config`]: every rule, with errors that name the field and the fix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Uri};

use super::raw::{OnMiss, RawBackend, RawClass, RawConfig, RawPrior};
use super::{
    ApiKey, BackendConfig, BackendDialect, ClassConfig, Config, Cost, Limits, ModelMap, Policy,
    PriorPoint, RouteRule, Routing, Secret, Slo, TlsFiles,
};
use crate::yaml::ConfigError;

type Result<T> = std::result::Result<T, ConfigError>;

/// Validates the whole config; `env` looks up environment variables (API keys); relative paths
/// are relative to `dir`.
pub fn validate(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<Config> {
    let listen = socket_addr("listen.address", &raw.listen.address)?;
    let tls = match &raw.listen.tls {
        Some(tls) => {
            readable("listen.tls.cert_file", &tls.cert_file)?;
            readable("listen.tls.key_file", &tls.key_file)?;
            Some(TlsFiles {
                cert_file: tls.cert_file.clone(),
                key_file: tls.key_file.clone(),
            })
        }
        None => None,
    };
    let admin_listen = socket_addr("admin.listen", &raw.admin.listen)?;
    if admin_listen == listen && listen.port() != 0 {
        return Err(ConfigError::at(
            "admin.listen",
            format!("{admin_listen} is also listen.address; give the admin plane its own port"),
        ));
    }
    let limits = limits(raw)?;
    let admin_token = match &raw.admin.token_env {
        None => None,
        Some(var) => match env(var) {
            Some(token) if !token.is_empty() => Some(Secret::new(token)),
            _ => {
                return Err(ConfigError::at(
                    "admin.token_env",
                    format!(
                        "environment variable {var} is not set (or empty); export it, or remove token_env"
                    ),
                ));
            }
        },
    };

    if raw.backends.is_empty() {
        return Err(ConfigError::at(
            "backends",
            "no backends: list at least one upstream (name, url, dialect, models)",
        ));
    }
    let mut backends: Vec<BackendConfig> = Vec::with_capacity(raw.backends.len());
    for (i, b) in raw.backends.iter().enumerate() {
        let at = format!("backends[{i}]");
        let backend = backend(&at, b, env, dir)?;
        if backends.iter().any(|other| other.name == backend.name) {
            return Err(ConfigError::at(
                format!("{at}.name"),
                format!(
                    "duplicate backend name `{}`: names must be unique",
                    backend.name
                ),
            ));
        }
        backends.push(backend);
    }
    let default_backend =
        match &raw.default_backend {
            None => None,
            Some(name) => Some(backends.iter().position(|b| &*b.name == name).ok_or_else(
                || {
                    ConfigError::at(
                        "default_backend",
                        format!(
                            "no backend is called `{name}`; use one of: {}",
                            names(&backends)
                        ),
                    )
                },
            )?),
        };

    let routing = routing(raw)?;
    let mut classes: Vec<ClassConfig> = Vec::with_capacity(raw.classes.len());
    for (i, c) in raw.classes.iter().enumerate() {
        let at = format!("classes[{i}]");
        if classes.iter().any(|other| *other.name == *c.name) {
            return Err(ConfigError::at(
                format!("{at}.name"),
                format!("duplicate class `{}`", c.name),
            ));
        }
        classes.push(class(&at, c, routing.policy)?);
    }
    let class_index = |at: &str, name: &str| {
        classes
            .iter()
            .position(|c| &*c.name == name)
            .ok_or_else(|| {
                ConfigError::at(
                    at,
                    format!("no class is called `{name}`; define it under classes"),
                )
            })
    };
    let default_class = match &raw.default_class {
        None => (!classes.is_empty()).then_some(0),
        Some(name) => Some(class_index("default_class", name)?),
    };
    let mut routes = Vec::with_capacity(raw.routes.len());
    for (i, r) in raw.routes.iter().enumerate() {
        let at = format!("routes[{i}]");
        if r.path.is_none() && r.model.is_none() {
            return Err(ConfigError::at(
                &at,
                "a rule matches on path, model or both: give at least one",
            ));
        }
        routes.push(RouteRule {
            path: r.path.clone(),
            model: r.model.clone(),
            class: class_index(&format!("{at}.class"), &r.class)?,
        });
    }
    let mut api_keys = Vec::with_capacity(raw.api_keys.len());
    for (i, k) in raw.api_keys.iter().enumerate() {
        let at = format!("api_keys[{i}]");
        let key = match env(&k.key_env) {
            Some(key) if !key.is_empty() => Secret::new(key),
            _ => {
                return Err(ConfigError::at(
                    format!("{at}.key_env"),
                    format!(
                        "environment variable {} is not set (or empty); export it before starting, or remove this key",
                        k.key_env
                    ),
                ));
            }
        };
        let class = match &k.class {
            Some(name) => Some(class_index(&format!("{at}.class"), name)?),
            None => None,
        };
        api_keys.push(ApiKey { key, class });
    }
    positive("curves.half_life_s", raw.curves.half_life_s)?;
    Ok(Config {
        curve_half_life_s: raw.curves.half_life_s,
        listen,
        tls,
        admin_listen,
        admin_token,
        limits,
        backends,
        default_backend,
        classes,
        default_class,
        routes,
        api_keys,
        routing,
    })
}

fn routing(raw: &RawConfig) -> Result<Routing> {
    let r = &raw.routing;
    if !(0.0..=0.5).contains(&r.exploration) {
        return Err(ConfigError::at(
            "routing.exploration",
            format!(
                "{} is out of range: use a share from 0 (never) to 0.5",
                r.exploration
            ),
        ));
    }
    if r.oracle.output_tokens == 0 {
        return Err(ConfigError::at(
            "routing.oracle.output_tokens",
            "must be at least 1",
        ));
    }
    if !(1..=5).contains(&r.max_attempts) {
        return Err(ConfigError::at(
            "routing.max_attempts",
            format!(
                "{} is out of range: use 1 (no retries) to 5",
                r.max_attempts
            ),
        ));
    }
    if !(0.0..=1.0).contains(&r.retry_budget) {
        return Err(ConfigError::at(
            "routing.retry_budget",
            format!(
                "{} is out of range: use a share from 0 to 1",
                r.retry_budget
            ),
        ));
    }
    Ok(Routing {
        max_attempts: r.max_attempts,
        retry_budget: r.retry_budget,
        policy: r.policy,
        exploration: r.exploration,
        oracle_shape: (r.oracle.prompt_tokens, r.oracle.output_tokens),
    })
}

fn class(at: &str, c: &RawClass, default_policy: Policy) -> Result<ClassConfig> {
    if c.name.trim().is_empty() {
        return Err(ConfigError::at(format!("{at}.name"), "must not be empty"));
    }
    if let Some(tps) = c.min_tps {
        positive(&format!("{at}.min_tps"), tps)?;
    }
    if let Some(ms) = c.max_ttft_ms {
        positive(&format!("{at}.max_ttft_ms"), ms)?;
    }
    for (field, value) in [
        ("tps_percentile", c.tps_percentile),
        ("ttft_percentile", c.ttft_percentile),
    ] {
        if !matches!(value, 50 | 90) {
            return Err(ConfigError::at(
                format!("{at}.{field}"),
                format!("{value} is not available: use 50 or 90 (the quantiles curves keep)"),
            ));
        }
    }
    let slo = Slo {
        min_tps: c.min_tps,
        tps_percentile: c.tps_percentile,
        max_ttft_s: c.max_ttft_ms.map(|ms| ms / 1e3),
        ttft_percentile: c.ttft_percentile,
    };
    let wait_ms = match (c.queue_max_wait_ms, c.max_ttft_ms) {
        (Some(ms), _) => {
            positive(&format!("{at}.queue_max_wait_ms"), ms)?;
            ms
        }
        (None, Some(ttft)) => ttft,
        (None, None) => 60_000.0,
    };
    Ok(ClassConfig {
        name: Arc::from(c.name.as_str()),
        slo,
        policy: c.policy.unwrap_or(default_policy),
        // Batch has no SLO to miss: "no backend" means none where it adds throughput without
        // costing latency classes theirs, and the right thing then is to wait for one.
        on_miss: c.on_miss.unwrap_or(if slo.is_batch() {
            OnMiss::Queue
        } else {
            OnMiss::BestEffort
        }),
        queue_max_wait: Duration::from_secs_f64(wait_ms / 1e3),
    })
}

/// A prior as curve points: given ones, a fit sampled at the bucket levels, or the closed-loop
/// levels of a `tpsgate bench --json` file.
fn prior(at: &str, p: &RawPrior, limit: Option<u32>, dir: &Path) -> Result<Vec<PriorPoint>> {
    let given = [p.points.is_some(), p.fit.is_some(), p.bench_file.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ConfigError::at(
            at,
            "give exactly one of points, fit or bench_file",
        ));
    }
    let mut points = Vec::new();
    if let Some(raw) = &p.points {
        for (i, r) in raw.iter().enumerate() {
            let at = format!("{at}.points[{i}]");
            positive(&format!("{at}.concurrency"), r.concurrency)?;
            positive(&format!("{at}.per_user_tps"), r.per_user_tps)?;
            positive(&format!("{at}.ttft_ms"), r.ttft_ms)?;
            points.push(PriorPoint {
                concurrency: r.concurrency,
                per_user_tps: r.per_user_tps,
                ttft_s: r.ttft_ms / 1e3,
            });
        }
    }
    if let Some(f) = &p.fit {
        positive(&format!("{at}.fit.tpot_base_ms"), f.tpot_base_ms)?;
        positive(&format!("{at}.fit.ttft_base_ms"), f.ttft_base_ms)?;
        for (field, v) in [
            ("tpot_per_seq_ms", f.tpot_per_seq_ms),
            ("ttft_per_seq_ms", f.ttft_per_seq_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::at(
                    format!("{at}.fit.{field}"),
                    format!("{v} is out of range: use 0 or more"),
                ));
            }
        }
        let top = f64::from(limit.unwrap_or(64));
        for c in crate::curve::BUCKETS.map(f64::from) {
            if c > top {
                break;
            }
            points.push(PriorPoint {
                concurrency: c,
                per_user_tps: 1e3 / (f.tpot_base_ms + f.tpot_per_seq_ms * c),
                ttft_s: (f.ttft_base_ms + f.ttft_per_seq_ms * c) / 1e3,
            });
        }
    }
    if let Some(file) = &p.bench_file {
        let at = format!("{at}.bench_file");
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError::at(&at, format!("cannot read `{}`: {e}", path.display())))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let level: BenchLevel = serde_json::from_str(line).map_err(|e| {
                ConfigError::at(
                    &at,
                    format!(
                        "`{}` line {}: not a closed-loop level of `tpsgate bench --json` ({e})",
                        path.display(),
                        n + 1
                    ),
                )
            })?;
            if let (Some(tps), Some(ttft)) = (level.per_user_tps_p50, level.ttft_p50_s) {
                points.push(PriorPoint {
                    concurrency: level.concurrency as f64,
                    per_user_tps: tps,
                    ttft_s: ttft,
                });
            }
        }
    }
    if points.is_empty() {
        return Err(ConfigError::at(at, "the prior has no points"));
    }
    Ok(points)
}

/// The fields of a `tpsgate bench --json` closed-loop line that a prior needs.
#[derive(serde::Deserialize)]
struct BenchLevel {
    concurrency: usize,
    per_user_tps_p50: Option<f64>,
    ttft_p50_s: Option<f64>,
}

fn names(backends: &[BackendConfig]) -> String {
    backends
        .iter()
        .map(|b| &*b.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn socket_addr(at: &str, value: &str) -> Result<SocketAddr> {
    value.parse().map_err(|_| {
        ConfigError::at(
            at,
            format!("`{value}` is not an IP:port address; write e.g. 127.0.0.1:8080"),
        )
    })
}

fn readable(at: &str, path: &Path) -> Result<()> {
    std::fs::metadata(path)
        .map(|_| ())
        .map_err(|e| ConfigError::at(at, format!("cannot read `{}`: {e}", path.display())))
}

fn positive(at: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::at(
            at,
            format!("{value} is out of range: use a positive number"),
        ))
    }
}

/// The most connections a listener may hold open at once: far beyond what one process's
/// descriptors allow, and small enough to count in a `u32`.
const MAX_CONNECTIONS: u64 = 10_000_000;

fn limits(raw: &RawConfig) -> Result<Limits> {
    let l = &raw.limits;
    if l.max_body_bytes == 0 {
        return Err(ConfigError::at(
            "limits.max_body_bytes",
            "must be at least 1",
        ));
    }
    positive("limits.header_read_timeout_s", l.header_read_timeout_s)?;
    if l.max_header_bytes < 1024 {
        return Err(ConfigError::at(
            "limits.max_header_bytes",
            format!("{} is too small: use at least 1024", l.max_header_bytes),
        ));
    }
    if !(1..=MAX_CONNECTIONS).contains(&l.max_connections) {
        return Err(ConfigError::at(
            "limits.max_connections",
            format!(
                "{} is out of range: use 1 to {MAX_CONNECTIONS} (each connection holds a file descriptor)",
                l.max_connections
            ),
        ));
    }
    positive("limits.drain_timeout_s", l.drain_timeout_s)?;
    Ok(Limits {
        max_body_bytes: usize::try_from(l.max_body_bytes).unwrap_or(usize::MAX),
        header_read_timeout: Duration::from_secs_f64(l.header_read_timeout_s),
        drain_timeout: Duration::from_secs_f64(l.drain_timeout_s),
        max_header_bytes: usize::try_from(l.max_header_bytes).unwrap_or(usize::MAX),
        max_connections: usize::try_from(l.max_connections).unwrap_or(usize::MAX),
    })
}

/// Headers a backend's `headers` may not set: the gateway owns them.
fn reserved(name: &HeaderName) -> bool {
    [
        header::HOST,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
    ]
    .contains(name)
}

fn backend(
    at: &str,
    b: &RawBackend,
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<BackendConfig> {
    let valid_name = !b.name.is_empty()
        && b.name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if !valid_name {
        return Err(ConfigError::at(
            format!("{at}.name"),
            format!(
                "`{}` is not a valid name: use letters, digits, '-', '_' and '.'",
                b.name
            ),
        ));
    }
    let url = upstream_url(&format!("{at}.url"), &b.url)?;
    let api_key = match &b.api_key_env {
        None => None,
        Some(var) => match env(var) {
            Some(key) if !key.is_empty() => Some(credential(
                &format!("{at}.api_key_env"),
                var,
                &key,
                b.dialect,
            )?),
            _ => {
                return Err(ConfigError::at(
                    format!("{at}.api_key_env"),
                    format!(
                        "environment variable {var} is not set (or empty); export it before starting, or remove api_key_env"
                    ),
                ));
            }
        },
    };
    if api_key.is_some() && b.forward_client_auth {
        return Err(ConfigError::at(
            format!("{at}.forward_client_auth"),
            "conflicts with api_key_env: either the gateway's key or the client's goes upstream, not both",
        ));
    }
    let mut headers = HeaderMap::with_capacity(b.headers.len());
    for (name, value) in &b.headers {
        let field = format!("{at}.headers.{name}");
        let header_name = HeaderName::try_from(name.as_str())
            .map_err(|_| ConfigError::at(&field, format!("`{name}` is not a valid header name")))?;
        if reserved(&header_name) {
            return Err(ConfigError::at(
                &field,
                format!("`{name}` is managed by the gateway; remove it"),
            ));
        }
        let mut value = HeaderValue::try_from(value.as_str()).map_err(|_| {
            ConfigError::at(&field, "the value has characters not allowed in a header")
        })?;
        value.set_sensitive(true);
        headers.insert(header_name, value);
    }
    let models = models(&format!("{at}.models"), &b.models)?;
    if b.max_concurrency == Some(0) {
        return Err(ConfigError::at(
            format!("{at}.max_concurrency"),
            "must be at least 1",
        ));
    }
    let cost = match b.cost {
        None => None,
        Some(c) => {
            for (field, v) in [
                ("input_per_1m", c.input_per_1m),
                ("output_per_1m", c.output_per_1m),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(ConfigError::at(
                        format!("{at}.cost.{field}"),
                        format!("{v} is out of range: use 0 or more"),
                    ));
                }
            }
            Some(Cost {
                input_per_1m: c.input_per_1m,
                output_per_1m: c.output_per_1m,
            })
        }
    };
    if let Some(ca) = &b.ca_file {
        readable(&format!("{at}.ca_file"), ca)?;
        if url.scheme_str() != Some("https") {
            return Err(ConfigError::at(
                format!("{at}.ca_file"),
                "only applies to https:// backends",
            ));
        }
    }
    if b.connect_timeout_ms == 0 {
        return Err(ConfigError::at(
            format!("{at}.connect_timeout_ms"),
            "must be at least 1",
        ));
    }
    for (field, ms) in [
        ("first_token_timeout_ms", Some(b.first_token_timeout_ms)),
        ("stall_timeout_ms", Some(b.stall_timeout_ms)),
        ("total_timeout_ms", b.total_timeout_ms),
    ] {
        if ms == Some(0) {
            return Err(ConfigError::at(
                format!("{at}.{field}"),
                "must be at least 1",
            ));
        }
    }
    let version = b.anthropic_version.as_deref().unwrap_or("2023-06-01");
    let anthropic_version = HeaderValue::try_from(version).map_err(|_| {
        ConfigError::at(
            format!("{at}.anthropic_version"),
            "not a valid header value",
        )
    })?;
    let prior = match &b.prior {
        Some(p) => Some(prior(&format!("{at}.prior"), p, b.max_concurrency, dir)?),
        None => None,
    };
    let e = b.ejection;
    if e.after_failures == 0 || e.base_ms == 0 || e.max_ms < e.base_ms {
        return Err(ConfigError::at(
            format!("{at}.ejection"),
            "after_failures and base_ms must be at least 1, and max_ms at least base_ms",
        ));
    }
    let host = host_header(&url).ok_or_else(|| {
        ConfigError::at(
            format!("{at}.url"),
            "its host cannot be sent as a Host header; write a plain host name or IP address",
        )
    })?;
    Ok(BackendConfig {
        prior,
        host,
        ejection: super::Ejection {
            after_failures: e.after_failures,
            base: Duration::from_millis(e.base_ms),
            max: Duration::from_millis(e.max_ms),
        },
        name: Arc::from(b.name.as_str()),
        url,
        dialect: b.dialect,
        api_key,
        headers,
        models,
        max_concurrency: b.max_concurrency,
        cost,
        ca_file: b.ca_file.clone(),
        forward_client_auth: b.forward_client_auth,
        connect_timeout: Duration::from_millis(b.connect_timeout_ms),
        timeouts: super::Timeouts {
            first_token: Duration::from_millis(b.first_token_timeout_ms),
            stall: Duration::from_millis(b.stall_timeout_ms),
            total: b.total_timeout_ms.map(Duration::from_millis),
        },
        anthropic_version,
    })
}

/// The header that carries a backend's API key: `Authorization: Bearer KEY` for OpenAI,
/// `x-api-key: KEY` for Anthropic; marked sensitive, so that it never shows in logs or debug
/// output. Made once here, not per request.
fn credential(
    at: &str,
    var: &str,
    key: &str,
    dialect: BackendDialect,
) -> Result<(HeaderName, HeaderValue)> {
    let (name, value) = match dialect {
        BackendDialect::Openai => (header::AUTHORIZATION, format!("Bearer {key}")),
        BackendDialect::Anthropic => (HeaderName::from_static("x-api-key"), key.to_owned()),
    };
    let mut value = HeaderValue::try_from(value).map_err(|_| {
        ConfigError::at(
            at,
            format!(
                "the value of {var} holds characters an HTTP header cannot carry (a newline or a control character?); set it to the bare key"
            ),
        )
    })?;
    value.set_sensitive(true);
    Ok((name, value))
}

/// `host[:port]` as an HTTP/1.1 client sends it: the port only when not the scheme's default.
fn host_header(url: &Uri) -> Option<HeaderValue> {
    let host = url.host()?;
    let default_port = match url.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    match url.port_u16() {
        Some(port) if port != default_port => HeaderValue::try_from(format!("{host}:{port}")).ok(),
        _ => HeaderValue::from_str(host).ok(),
    }
}

fn upstream_url(at: &str, value: &str) -> Result<Uri> {
    let uri: Uri = value.parse().map_err(|e| {
        ConfigError::at(
            at,
            format!("`{value}` is not a URL ({e}); write e.g. http://127.0.0.1:8000"),
        )
    })?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(ConfigError::at(
                at,
                format!("`{value}` must start with http:// or https://"),
            ));
        }
    }
    if uri.authority().is_none() {
        return Err(ConfigError::at(at, format!("`{value}` has no host")));
    }
    if uri.query().is_some() {
        return Err(ConfigError::at(
            at,
            "a backend URL cannot carry a query string",
        ));
    }
    // Client paths carry /v1 already: a base URL copied from an SDK setting ends in it.
    let path = uri.path().trim_end_matches('/');
    let path = path.strip_suffix("/v1").unwrap_or(path);
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = uri.authority().map_or("", |a| a.as_str());
    format!("{scheme}://{authority}{path}")
        .parse()
        .map_err(|e| ConfigError::at(at, format!("`{value}`: {e}")))
}

fn models(at: &str, raw: &BTreeMap<String, String>) -> Result<ModelMap> {
    if raw.is_empty() {
        return Err(ConfigError::at(
            at,
            "list the models this backend serves (client name: upstream name), or \"*\": \"*\" for any",
        ));
    }
    let mut map = ModelMap::default();
    for (client, upstream) in raw {
        if client == "*" {
            if upstream != "*" {
                return Err(ConfigError::at(
                    format!("{at}.*"),
                    "the wildcard passes names through unchanged: write \"*\": \"*\"",
                ));
            }
            map.passthrough = true;
        } else if client.is_empty() || upstream.is_empty() || upstream == "*" {
            return Err(ConfigError::at(
                format!("{at}.{client}"),
                "model names must not be empty (and only the key \"*\" may map to \"*\")",
            ));
        } else {
            map.aliases.insert(client.clone(), upstream.clone());
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    const BASE: &str = "backends:\n  - name: a\n    url: http://127.0.0.1:9101/\n    dialect: openai\n    models: {small: upstream-small, \"*\": \"*\"}\n";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_minimal_config_gets_documented_defaults() {
        let c = parse(&BASE.replace("9101/", "9101/v1"), no_env).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.admin_listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.limits.max_body_bytes, 4 << 20);
        let b = &c.backends[0];
        assert_eq!(b.url, "http://127.0.0.1:9101");
        assert_eq!(b.host, "127.0.0.1:9101");
        assert_eq!(b.models.upstream("small"), Some("upstream-small"));
        assert_eq!(b.models.upstream("other"), Some("other"));
        assert_eq!(b.anthropic_version, "2023-06-01");
    }

    #[test]
    fn a_class_without_an_slo_waits_for_room_unless_told_otherwise() {
        let text = format!(
            "{BASE}classes:\n  - {{name: chat, min_tps: 20}}\n  - {{name: batch}}\n  - {{name: bulk, on_miss: shed}}\n"
        );
        let c = parse(&text, no_env).unwrap();
        let on_miss: Vec<OnMiss> = c.classes.iter().map(|k| k.on_miss).collect();
        assert_eq!(on_miss, [OnMiss::BestEffort, OnMiss::Queue, OnMiss::Shed]);
        assert_eq!(c.classes[1].queue_max_wait, Duration::from_secs(60));
    }

    #[test]
    fn the_upstream_host_header_carries_the_port_only_when_it_is_not_the_default() {
        let host = |url: &str| {
            let c = parse(&BASE.replace("http://127.0.0.1:9101/", url), no_env).unwrap();
            c.backends[0].host.to_str().unwrap().to_owned()
        };
        assert_eq!(host("http://127.0.0.1:9101/"), "127.0.0.1:9101");
        assert_eq!(host("https://api.example.com/v1"), "api.example.com");
        assert_eq!(host("https://api.example.com:443"), "api.example.com");
        assert_eq!(host("http://upstream:80"), "upstream");
        assert_eq!(host("https://upstream:8443"), "upstream:8443");
    }

    #[test]
    fn a_missing_key_variable_is_named_with_the_fix() {
        let text = format!("{BASE}    api_key_env: TPSGATE_TEST_KEY\n");
        let err = parse(&text, no_env).unwrap_err();
        assert_eq!(err.path, "backends[0].api_key_env");
        assert!(
            err.message.contains("TPSGATE_TEST_KEY is not set"),
            "{}",
            err.message
        );
        let c = parse(&text, |_| Some("sk-secret".into())).unwrap();
        let (name, value) = c.backends[0].api_key.as_ref().unwrap();
        assert_eq!(
            (name.as_str(), value.as_bytes()),
            ("authorization", &b"Bearer sk-secret"[..])
        );
        let err = parse(&text, |_| Some("sk-\nsecret".into())).unwrap_err();
        assert_eq!(err.path, "backends[0].api_key_env");
        assert!(err.message.contains("cannot carry"), "{}", err.message);
        assert!(
            !err.message.contains("secret"),
            "the key stays out of messages"
        );
        assert!(
            !format!("{c:?}").contains("sk-secret"),
            "keys never show in debug output"
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (
                BASE.replace("http://127.0.0.1:9101/", "ftp://x"),
                "backends[0].url",
            ),
            (
                BASE.replace("dialect: openai", "dialect: cohere"),
                "backends[0].dialect",
            ),
            (
                format!("{BASE}    max_concurrency: 0\n"),
                "backends[0].max_concurrency",
            ),
            (format!("{BASE}default_backend: nope\n"), "default_backend"),
            (
                format!("{BASE}routing: {{policy: slo}}\n"),
                "routing.policy",
            ),
            (
                format!(
                    "{BASE}  - name: a\n    url: http://x\n    dialect: openai\n    models: {{m: m}}\n"
                ),
                "backends[1].name",
            ),
            (
                format!("{BASE}    headers: {{Host: x}}\n"),
                "backends[0].headers.Host",
            ),
            (
                format!("{BASE}limits: {{max_connections: 100000000000}}\n"),
                "limits.max_connections",
            ),
            (
                format!("{BASE}limits: {{max_connections: 0}}\n"),
                "limits.max_connections",
            ),
        ];
        for (text, path) in cases {
            let err = parse(&text, no_env).unwrap_err();
            assert_eq!(err.path, path, "{text}\n{err}");
        }
    }

    #[test]
    fn errors_after_parsing_are_placed_at_their_line_and_column() {
        let text = format!("{BASE}    max_concurrency: 0\n");
        let err = parse(&text, no_env).unwrap_err();
        let placed = crate::yaml::place(err, Path::new("gw.yaml"), &text);
        assert_eq!(
            placed.to_string(),
            "gw.yaml:6:22: backends[0].max_concurrency: must be at least 1"
        );
    }
}
