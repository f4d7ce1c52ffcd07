//! Raw config -> typed [`Config`]: every rule, with errors that name the field and the fix.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::raw::{OnMiss, RawClass, RawConfig, RawPrefixCache};
use super::{
    BackendConfig, ClassConfig, Config, Limits, Policy, PrefixRouting, RouteRule, Routing, Secret,
    Slo, TlsFiles,
};
use crate::yaml::ConfigError;

mod backend;
mod keys;
mod services;

use backend::backend;
use keys::api_keys;
pub(crate) use keys::{key_limits as validate_key_limits, models as validate_key_models};
pub(crate) use services::without_password;
use services::{cluster, cors, resolver, tracing};

type Result<T> = std::result::Result<T, ConfigError>;

/// Every error of a config, gathered so that one run names them all: each section and each
/// entry is checked on its own, and one that fails is left out of what depends on it (a route
/// naming a class that failed is not judged again).
#[derive(Default)]
struct Errors(Vec<ConfigError>);

impl Errors {
    /// The value, or `None` with its error kept.
    fn keep<T>(&mut self, result: Result<T>) -> Option<T> {
        result.map_err(|e| self.0.push(e)).ok()
    }

    /// An optional section, validated by `check` where the config has it.
    fn section<R, T>(&mut self, raw: Option<&R>, check: impl FnOnce(&R) -> Result<T>) -> Option<T> {
        raw.and_then(|r| self.keep(check(r)))
    }

    /// The first error, carrying the others; `None` when there were none.
    fn into_error(self) -> Option<ConfigError> {
        let mut all = self.0.into_iter();
        let mut first = all.next()?;
        first.also = all.collect();
        Some(first)
    }
}

/// Finds a named entry: its index among the valid ones; `None` (no second error) where the
/// entry of that name failed on its own.
type Lookup<'a> = dyn Fn(&str, &str) -> Result<Option<usize>> + 'a;

/// The index of the entry called `name` among `valid`, for the field at `at`: `None` where one
/// of `all` is so called but failed on its own (no second error), an error saying `otherwise`
/// where none is.
fn lookup<'n>(
    at: &str,
    name: &str,
    mut valid: impl Iterator<Item = &'n str>,
    mut all: impl Iterator<Item = &'n str>,
    otherwise: impl FnOnce() -> String,
) -> Result<Option<usize>> {
    match valid.position(|n| n == name) {
        Some(i) => Ok(Some(i)),
        None if all.any(|n| n == name) => Ok(None),
        None => Err(ConfigError::at(at, otherwise())),
    }
}

/// Validates the whole config; `env` looks up environment variables (API keys); relative paths
/// are relative to `dir`. The error names every problem found (the first, and the rest in its
/// `also`). Each section is its own function; what is left here is their order (a route is
/// judged against the backends and classes that validated) and the `Config` they make, a
/// literal that reads as a table of its fields.
pub(crate) fn validate(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<Config> {
    let mut errors = Errors::default();
    let listen = errors.keep(socket_addr("listen.address", &raw.listen.address));
    let tls = errors.keep(tls(raw)).flatten();
    let admin_listen = errors.keep(admin_listen(raw, listen));
    let limits = errors.keep(limits(raw));
    let admin_token = errors.keep(admin_token(raw, env, dir)).flatten();
    let admin_hosts = errors.keep(admin_hosts(raw));

    let backends = backends(raw, env, dir, &mut errors);
    let backend_index = |at: &str, name: &str| {
        let valid = backends.iter().map(|b| &*b.name);
        lookup(
            at,
            name,
            valid,
            raw.backends.iter().map(|b| &*b.name),
            || {
                format!(
                    "no backend is called `{name}`; use one of: {}",
                    names(&backends)
                )
            },
        )
    };
    let default_backend = raw.default_backend.as_ref().and_then(|name| {
        errors
            .keep(backend_index("default_backend", name))
            .flatten()
    });

    let routing = errors.keep(routing(raw));
    let policy = routing.map_or(Policy::Headroom, |r| r.policy);
    let classes = classes(raw, policy, &mut errors);
    let class_index = |at: &str, name: &str| {
        let valid = classes.iter().map(|c| &*c.name);
        lookup(
            at,
            name,
            valid,
            raw.classes.iter().map(|c| &*c.name),
            || format!("no class is called `{name}`; define it under classes"),
        )
    };
    let default_class = match &raw.default_class {
        None => (!classes.is_empty()).then_some(0),
        Some(name) => errors.keep(class_index("default_class", name)).flatten(),
    };
    let routes = raw
        .routes
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            errors.keep(route(
                &format!("routes[{i}]"),
                r,
                &class_index,
                &backend_index,
            ))
        })
        .collect();
    let api_keys = api_keys(raw, env, &class_index, &mut errors);
    errors.keep(within(
        "curves.half_life_s",
        raw.curves.half_life_s,
        7.0 * DAY_S,
    ));
    let cluster = errors.section(raw.cluster.as_ref(), |c| cluster(c, env));
    let cors = errors.section(raw.cors.as_ref(), cors);
    let resolver = errors.section(raw.resolver.as_ref(), resolver);
    let tracing = errors.section(raw.tracing.as_ref(), tracing);
    let virtual_keys = errors.section(raw.virtual_keys.as_ref(), |v| {
        keys::virtual_keys(v, raw, dir)
    });
    let jwt = errors.section(raw.jwt.as_ref(), |j| keys::jwt(j, &api_keys, &class_index));
    if let Some(error) = errors.into_error() {
        return Err(error);
    }
    // No error: every section validated, so each is there.
    let (Some(listen), Some(admin_listen), Some(limits), Some(admin_hosts), Some(routing)) =
        (listen, admin_listen, limits, admin_hosts, routing)
    else {
        return Err(ConfigError::at(
            "",
            "internal error: a section validated without a value",
        ));
    };
    Ok(Config {
        tracing,
        cors,
        resolver,
        admin_hosts,
        max_key_series: raw.admin.max_key_series,
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
        virtual_keys,
        jwt,
        routing,
        cluster,
    })
}

/// `backends[]`: each entry, and names unique.
fn backends(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
    errors: &mut Errors,
) -> Vec<BackendConfig> {
    if raw.backends.is_empty() {
        errors.0.push(ConfigError::at(
            "backends",
            "no backends: list at least one upstream (name, url, dialect, models)",
        ));
    }
    let mut backends: Vec<BackendConfig> = Vec::with_capacity(raw.backends.len());
    for (i, b) in raw.backends.iter().enumerate() {
        let at = format!("backends[{i}]");
        let Some(backend) = errors.keep(backend(&at, b, &raw.prefix_cache, env, dir)) else {
            continue;
        };
        if backends.iter().any(|other| other.name == backend.name) {
            errors.0.push(ConfigError::at(
                format!("{at}.name"),
                format!(
                    "duplicate backend name `{}`: names must be unique",
                    backend.name
                ),
            ));
            continue;
        }
        backends.push(backend);
    }
    backends
}

/// `classes[]`: each entry (its policy defaulting to the routing's), and names unique.
fn classes(raw: &RawConfig, policy: Policy, errors: &mut Errors) -> Vec<ClassConfig> {
    let mut classes: Vec<ClassConfig> = Vec::with_capacity(raw.classes.len());
    for (i, c) in raw.classes.iter().enumerate() {
        let at = format!("classes[{i}]");
        if classes.iter().any(|other| *other.name == *c.name) {
            errors.0.push(ConfigError::at(
                format!("{at}.name"),
                format!("duplicate class `{}`", c.name),
            ));
            continue;
        }
        if let Some(class) = errors.keep(class(&at, c, policy)) {
            classes.push(class);
        }
    }
    classes
}

/// `listen.tls`: both files readable.
fn tls(raw: &RawConfig) -> Result<Option<TlsFiles>> {
    let Some(tls) = &raw.listen.tls else {
        return Ok(None);
    };
    readable("listen.tls.cert_file", &tls.cert_file)?;
    readable("listen.tls.key_file", &tls.key_file)?;
    Ok(Some(TlsFiles {
        cert_file: tls.cert_file.clone(),
        key_file: tls.key_file.clone(),
    }))
}

/// `admin.listen`: an address other than the client-facing one.
fn admin_listen(raw: &RawConfig, listen: Option<SocketAddr>) -> Result<SocketAddr> {
    let admin = socket_addr("admin.listen", &raw.admin.listen)?;
    if Some(admin) == listen && admin.port() != 0 {
        return Err(ConfigError::at(
            "admin.listen",
            format!("{admin} is also listen.address; give the admin plane its own port"),
        ));
    }
    Ok(admin)
}

/// `admin.allowed_hosts`: host names, lowercase.
fn admin_hosts(raw: &RawConfig) -> Result<Vec<String>> {
    let hosts: Vec<String> = raw
        .admin
        .allowed_hosts
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    if let Some(bad) = hosts.iter().find(|h| {
        h.is_empty()
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
    }) {
        return Err(ConfigError::at(
            "admin.allowed_hosts",
            format!(
                "`{bad}` is not a host name: give names only (letters, digits, `-`, `.`), no port"
            ),
        ));
    }
    Ok(hosts)
}

/// `admin.token_env` or `admin.token_file`: the bearer token of the admin plane, if any.
fn admin_token(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<Option<Secret>> {
    let from_env = secret_from(
        env,
        raw.admin.token_env.as_deref(),
        "admin.token_env",
        "remove token_env",
    )?;
    let Some(file) = &raw.admin.token_file else {
        return Ok(from_env);
    };
    if from_env.is_some() {
        return Err(ConfigError::at(
            "admin.token_file",
            "the token comes from token_env or token_file, not both: remove one",
        ));
    }
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        ConfigError::at(
            "admin.token_file",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    match text.trim() {
        "" => Err(ConfigError::at(
            "admin.token_file",
            format!("{} is empty: write the token in it", path.display()),
        )),
        token => Ok(Some(Secret::new(token.to_owned()))),
    }
}

/// The secret in the environment variable `var` (at field `at`), if one is named; a named
/// variable unset or empty is an error whose fix is to export it or to `instead`.
fn secret_from(
    env: &dyn Fn(&str) -> Option<String>,
    var: Option<&str>,
    at: &str,
    instead: &str,
) -> Result<Option<Secret>> {
    let Some(var) = var else {
        return Ok(None);
    };
    match env(var) {
        Some(value) if !value.is_empty() => Ok(Some(Secret::new(value))),
        _ => Err(ConfigError::at(
            at,
            format!("environment variable {var} is not set (or empty); export it, or {instead}"),
        )),
    }
}

/// One `routes[]` rule.
fn route(
    at: &str,
    r: &crate::config::raw::RawRouteRule,
    class_index: &Lookup<'_>,
    backend_index: &Lookup<'_>,
) -> Result<RouteRule> {
    if r.path.is_none() && r.model.is_none() {
        return Err(ConfigError::at(
            at,
            "a rule matches on path, model or both: give at least one",
        ));
    }
    let class = match &r.class {
        Some(name) => class_index(&format!("{at}.class"), name)?,
        None => None,
    };
    let backend = match &r.backend {
        None => None,
        Some(_) if r.path.is_none() || r.model.is_some() => {
            return Err(ConfigError::at(
                format!("{at}.backend"),
                "picks where bodies naming no model go, by path: give path and no model",
            ));
        }
        Some(name) => backend_index(&format!("{at}.backend"), name)?,
    };
    if r.class.is_none() && r.backend.is_none() && r.translate {
        return Err(ConfigError::at(
            at,
            "a rule gives a class, a backend (for bodies naming no model), `translate: false`, or several: give at least one",
        ));
    }
    Ok(RouteRule {
        path: r.path.clone(),
        model: r.model.clone(),
        class,
        backend,
        translate: r.translate,
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
        prefix: prefix_routing(&raw.prefix_cache)?,
        max_attempts: r.max_attempts,
        retry_budget: r.retry_budget,
        policy: r.policy,
        exploration: r.exploration,
        oracle_shape: (r.oracle.prompt_tokens, r.oracle.output_tokens),
    })
}

/// `prefix_cache:`: blocks of 1 to 4,096 tokens, a match of at least one block, a capacity of
/// at least one block, an age limit of at most a day.
fn prefix_routing(p: &RawPrefixCache) -> Result<Option<PrefixRouting>> {
    if !(1..=4096).contains(&p.block_tokens) {
        return Err(ConfigError::at(
            "prefix_cache.block_tokens",
            format!(
                "{} is out of range: use 1 to 4096 (engines cache blocks of 16 to 256)",
                p.block_tokens
            ),
        ));
    }
    if p.min_match_tokens < p.block_tokens {
        return Err(ConfigError::at(
            "prefix_cache.min_match_tokens",
            format!(
                "{} is less than one block ({}): give at least block_tokens",
                p.min_match_tokens, p.block_tokens
            ),
        ));
    }
    if p.capacity_tokens < u64::from(p.block_tokens) {
        return Err(ConfigError::at(
            "prefix_cache.capacity_tokens",
            format!(
                "{} holds not one block of {} tokens: give at least block_tokens",
                p.capacity_tokens, p.block_tokens
            ),
        ));
    }
    within("prefix_cache.ttl_s", p.ttl_s, DAY_S)?;
    Ok(p.enabled.then_some(PrefixRouting {
        block_tokens: p.block_tokens,
        min_match_tokens: u64::from(p.min_match_tokens),
    }))
}

fn class(at: &str, c: &RawClass, default_policy: Policy) -> Result<ClassConfig> {
    if c.name.trim().is_empty() {
        return Err(ConfigError::at(format!("{at}.name"), "must not be empty"));
    }
    if let Some(tps) = c.min_tps {
        within(&format!("{at}.min_tps"), tps, HUGE)?;
    }
    if let Some(ms) = c.max_ttft_ms {
        within(&format!("{at}.max_ttft_ms"), ms, DAY_MS)?;
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
            within(&format!("{at}.queue_max_wait_ms"), ms, DAY_MS)?;
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

/// `value` is a number above 0 and at most `max`: every number a config gives is bounded, so
/// that no later arithmetic (a deadline as an instant, a duration from seconds) can overflow.
fn within(at: &str, value: f64, max: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 && value <= max {
        Ok(())
    } else {
        Err(ConfigError::at(
            at,
            format!("{value} is out of range: give a number above 0 and at most {max}"),
        ))
    }
}

/// A day, in seconds: the longest any wait or timeout may be.
const DAY_S: f64 = 86_400.0;
/// A day, in milliseconds.
const DAY_MS: f64 = 86_400_000.0;
/// Beyond any real speed or concurrency (tokens per second, requests in flight).
const HUGE: f64 = 1e6;

/// The most connections a listener may hold open at once: far beyond what one process's
/// descriptors allow, and small enough to count in a `u32`.
const MAX_CONNECTIONS: u64 = 10_000_000;

fn limits(raw: &RawConfig) -> Result<Limits> {
    let l = &raw.limits;
    if !(1..=1 << 30).contains(&l.max_body_bytes) {
        return Err(ConfigError::at(
            "limits.max_body_bytes",
            format!(
                "{} is out of range: give 1 to 1073741824 (1 GiB)",
                l.max_body_bytes
            ),
        ));
    }
    within(
        "limits.header_read_timeout_s",
        l.header_read_timeout_s,
        3600.0,
    )?;
    if !(1024..=1 << 20).contains(&l.max_header_bytes) {
        return Err(ConfigError::at(
            "limits.max_header_bytes",
            format!(
                "{} is out of range: give 1024 to 1048576 (1 MiB)",
                l.max_header_bytes
            ),
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
    within("limits.drain_timeout_s", l.drain_timeout_s, DAY_S)?;
    within("limits.body_read_timeout_s", l.body_read_timeout_s, 3600.0)?;
    within("limits.idle_timeout_s", l.idle_timeout_s, DAY_S)?;
    within(
        "limits.client_write_timeout_s",
        l.client_write_timeout_s,
        DAY_S,
    )?;
    if !(1..=1 << 30).contains(&l.body_min_bytes_per_s) {
        return Err(ConfigError::at(
            "limits.body_min_bytes_per_s",
            format!(
                "{} is out of range: give 1 to 1073741824",
                l.body_min_bytes_per_s
            ),
        ));
    }
    Ok(Limits {
        max_body_bytes: usize::try_from(l.max_body_bytes).unwrap_or(usize::MAX),
        header_read_timeout: Duration::from_secs_f64(l.header_read_timeout_s),
        drain_timeout: Duration::from_secs_f64(l.drain_timeout_s),
        max_header_bytes: usize::try_from(l.max_header_bytes).unwrap_or(usize::MAX),
        max_connections: usize::try_from(l.max_connections).unwrap_or(usize::MAX),
        body_read_timeout: Duration::from_secs_f64(l.body_read_timeout_s),
        body_min_rate: l.body_min_bytes_per_s,
        idle_timeout: Duration::from_secs_f64(l.idle_timeout_s),
        client_write_timeout: Duration::from_secs_f64(l.client_write_timeout_s),
    })
}

#[cfg(test)]
mod keys_tests;
#[cfg(test)]
mod tests;
