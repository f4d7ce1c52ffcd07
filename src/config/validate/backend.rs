//! One backend entry: URL, dialect, credentials, headers, models, timeouts, ejection, cost and
//! prior curve.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Uri};

use super::super::raw::{RawBackend, RawContextWindow, RawDiscovery, RawPrefixCache, RawPrior};
use super::super::{
    BackendConfig, BackendDialect, ContextWindows, Cost, Discovery, Ejection, ModelMap,
    PrefixIndexSize, Price, PriorPoint, ResponsesApi, Timeouts,
};
use super::{DAY_MS, DAY_S, HUGE, Result, readable, within};
use crate::yaml::ConfigError;

/// The longest timeout a backend may be given, ms: a day.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

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

/// One `backends[]` entry at `at`, its prefix index sized by `prefix`, its key read by `env`,
/// its prior's file relative to `dir`.
pub(super) fn backend(
    at: &str,
    b: &RawBackend,
    prefix: &RawPrefixCache,
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<BackendConfig> {
    name(at, b)?;
    let url = upstream_url(&format!("{at}.url"), &b.url)?;
    let responses_api = responses_api(at, b, &url)?;
    let api_key = api_key(at, b, env)?;
    let headers = headers(at, b)?;
    let models = models(&format!("{at}.models"), &b.models)?;
    let max_context_tokens = context_windows(at, b, &models)?;
    bounds(at, b)?;
    let cost = cost(at, b, &models)?;
    if let Some(ca) = &b.ca_file {
        readable(&format!("{at}.ca_file"), ca)?;
        if url.scheme_str() != Some("https") {
            return Err(ConfigError::at(
                format!("{at}.ca_file"),
                "only applies to https:// backends",
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
    let host = host_header(&url).ok_or_else(|| {
        ConfigError::at(
            format!("{at}.url"),
            "its host cannot be sent as a Host header; write a plain host name or IP address",
        )
    })?;
    let (path_prefix, query) = provider_paths(at, b)?;
    let discovery = discovery(at, b, &url)?;
    Ok(BackendConfig {
        prefix_index: prefix_index(at, b, prefix)?,
        discovery,
        dial: None,
        prior,
        host,
        path_prefix,
        query,
        ejection: Ejection {
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
        device: device(at, b)?,
        max_models: b.max_models as usize,
        max_event_bytes: usize::try_from(b.max_event_bytes).unwrap_or(usize::MAX),
        cost,
        ca_file: b.ca_file.clone(),
        forward_client_auth: b.forward_client_auth,
        connect_timeout: Duration::from_millis(b.connect_timeout_ms),
        timeouts: Timeouts {
            first_token: Duration::from_millis(b.first_token_timeout_ms),
            stall: Duration::from_millis(b.stall_timeout_ms),
            total: b.total_timeout_ms.map(Duration::from_millis),
            response: Duration::from_millis(b.response_timeout_ms),
        },
        anthropic_version,
        translate: b.translate,
        default_max_tokens: b.default_max_tokens,
        thinking: b.thinking.unwrap_or_default(),
        responses_api,
        hosted_tools: b.hosted_tools,
        max_context_tokens,
    })
}

/// `responses_api`: as given, else `native` where the backend is OpenAI's own (or is never
/// rewritten), `translate` for every other engine (most serve chat completions only).
fn responses_api(at: &str, b: &RawBackend, url: &Uri) -> Result<ResponsesApi> {
    let field = || format!("{at}.responses_api");
    match (b.dialect, b.responses_api, b.translate) {
        (BackendDialect::Anthropic, Some(_), _) => Err(ConfigError::at(
            field(),
            "applies to an OpenAI backend; Responses clients reach an Anthropic backend translated (unless `translate: false`): remove it",
        )),
        (BackendDialect::Openai, Some(ResponsesApi::Translate), false) => Err(ConfigError::at(
            field(),
            "`translate` contradicts the backend's `translate: false` (its requests are never rewritten): give `native`, or remove `translate: false`",
        )),
        (_, Some(api), _) => Ok(api),
        (_, None, false) => Ok(ResponsesApi::Native),
        (_, None, true) => {
            let host = url.host().unwrap_or_default();
            let openai = host == "api.openai.com" || host.ends_with(".openai.azure.com");
            Ok(if openai {
                ResponsesApi::Native
            } else {
                ResponsesApi::Translate
            })
        }
    }
}

/// `max_context_tokens`: one window for every model, or windows by client model name, each
/// naming a model the backend serves (`"*"` for the others).
fn context_windows(at: &str, b: &RawBackend, models: &ModelMap) -> Result<ContextWindows> {
    let field = format!("{at}.max_context_tokens");
    let tokens = |at: &str, n: u64| {
        u32::try_from(n)
            .ok()
            .and_then(NonZeroU32::new)
            .filter(|n| n.get() <= MAX_CONTEXT_TOKENS)
            .ok_or_else(|| {
                ConfigError::at(
                    at,
                    format!("{n} is out of range: give the engine's context window in tokens, above 0 and at most {MAX_CONTEXT_TOKENS}"),
                )
            })
    };
    let mut windows = ContextWindows::default();
    match &b.max_context_tokens {
        None => {}
        Some(RawContextWindow::All(n)) => windows.others = Some(tokens(&field, *n)?),
        Some(RawContextWindow::ByModel(by_model)) => {
            for (model, n) in by_model {
                let at = format!("{field}.{model}");
                let n = tokens(&at, *n)?;
                if model == "*" {
                    windows.others = Some(n);
                } else if models.aliases.contains_key(model) || models.passthrough {
                    windows.by_model.insert(model.clone(), n);
                } else {
                    return Err(ConfigError::at(
                        at,
                        "is not among this backend's `models`: name one of them (its client name), or \"*\" for all the others",
                    ));
                }
            }
        }
    }
    Ok(windows)
}

/// The largest context window a backend may be given: 2^30 tokens, past every engine's.
const MAX_CONTEXT_TOKENS: u32 = 1 << 30;

/// `device`: a name, on a backend that is one engine (a discovered Service's pods run on
/// devices of their own).
fn device(at: &str, b: &RawBackend) -> Result<Option<Arc<str>>> {
    let Some(device) = &b.device else {
        return Ok(None);
    };
    if device.trim().is_empty() || device.len() > 256 {
        return Err(ConfigError::at(
            format!("{at}.device"),
            "give the shared device a name of 1 to 256 characters (e.g. gpu0, or host-a/gpu1)",
        ));
    }
    if b.discovery.is_some() {
        return Err(ConfigError::at(
            format!("{at}.device"),
            "a discovered Service's pods each run on a device of their own; remove device, or list the engines that share one as backends without discovery",
        ));
    }
    Ok(Some(Arc::from(device.as_str())))
}

/// `name`: letters, digits, '-', '_' and '.'.
fn name(at: &str, b: &RawBackend) -> Result<()> {
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
    Ok(())
}

/// The credential the gateway sends (`api_key_env`, in `api_key_header` or the dialect's own
/// header), where the client's is not forwarded instead.
fn api_key(
    at: &str,
    b: &RawBackend,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(HeaderName, HeaderValue)>> {
    let key_header = match &b.api_key_header {
        None => None,
        Some(_) if b.api_key_env.is_none() => {
            return Err(ConfigError::at(
                format!("{at}.api_key_header"),
                "names where the key from api_key_env goes: add api_key_env, or remove api_key_header",
            ));
        }
        Some(name) => {
            let header = HeaderName::try_from(name.as_str()).map_err(|_| {
                ConfigError::at(
                    format!("{at}.api_key_header"),
                    format!("`{name}` is not a valid header name"),
                )
            })?;
            if reserved(&header) {
                return Err(ConfigError::at(
                    format!("{at}.api_key_header"),
                    format!("`{name}` is managed by the gateway; name another header"),
                ));
            }
            Some(header)
        }
    };
    let api_key = match &b.api_key_env {
        None => None,
        Some(var) => match env(var) {
            Some(key) if !key.is_empty() => Some(credential(
                &format!("{at}.api_key_env"),
                var,
                &key,
                key_header.unwrap_or(match b.dialect {
                    BackendDialect::Openai => header::AUTHORIZATION,
                    BackendDialect::Anthropic => HeaderName::from_static("x-api-key"),
                }),
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
    Ok(api_key)
}

/// `headers`: names and values valid, none the gateway manages; values kept out of logs.
fn headers(at: &str, b: &RawBackend) -> Result<HeaderMap> {
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
    Ok(headers)
}

/// The numbers with a range: models kept, event size, concurrency, timeouts, the translated
/// requests' default limit, ejection.
fn bounds(at: &str, b: &RawBackend) -> Result<()> {
    if !(1..=10_000).contains(&b.max_models) {
        return Err(ConfigError::at(
            format!("{at}.max_models"),
            format!(
                "{} is out of range: give 1 to 10000 (each model keeps a curve and its metric series)",
                b.max_models
            ),
        ));
    }
    if !(1024..=64 << 20).contains(&b.max_event_bytes) {
        return Err(ConfigError::at(
            format!("{at}.max_event_bytes"),
            format!(
                "{} is out of range: give 1024 to 67108864 (64 MiB)",
                b.max_event_bytes
            ),
        ));
    }
    if b.max_concurrency == Some(0) {
        return Err(ConfigError::at(
            format!("{at}.max_concurrency"),
            "must be at least 1",
        ));
    }
    for (field, ms) in [
        ("connect_timeout_ms", Some(b.connect_timeout_ms)),
        ("first_token_timeout_ms", Some(b.first_token_timeout_ms)),
        ("stall_timeout_ms", Some(b.stall_timeout_ms)),
        ("total_timeout_ms", b.total_timeout_ms),
        ("response_timeout_ms", Some(b.response_timeout_ms)),
    ] {
        if let Some(ms) = ms
            && !(1..=MAX_TIMEOUT_MS).contains(&ms)
        {
            return Err(ConfigError::at(
                format!("{at}.{field}"),
                format!("{ms} ms is out of range: give 1 to {MAX_TIMEOUT_MS} (a day)"),
            ));
        }
    }
    if b.thinking.is_some() && b.dialect == BackendDialect::Anthropic {
        return Err(ConfigError::at(
            format!("{at}.thinking"),
            "applies to an OpenAI backend (what it reads of an Anthropic client's `thinking`); an Anthropic backend is sent `thinking` as the client wrote it: remove it",
        ));
    }
    if b.default_max_tokens == 0 {
        return Err(ConfigError::at(
            format!("{at}.default_max_tokens"),
            "must be at least 1 (the limit a translated request without one is sent with)",
        ));
    }
    let e = b.ejection;
    if e.after_failures == 0 || e.base_ms == 0 || e.max_ms < e.base_ms || e.max_ms > MAX_TIMEOUT_MS
    {
        return Err(ConfigError::at(
            format!("{at}.ejection"),
            "after_failures and base_ms must be at least 1, and max_ms at least base_ms and at most 86400000 (a day)",
        ));
    }
    Ok(())
}

/// `cost`: prices within range, per model only for models the backend serves.
fn cost(at: &str, b: &RawBackend, models: &ModelMap) -> Result<Option<Cost>> {
    let Some(c) = &b.cost else {
        return Ok(None);
    };
    let at = format!("{at}.cost");
    let price = |at: &str, input_per_1m: f64, output_per_1m: f64| {
        for (field, v) in [
            ("input_per_1m", input_per_1m),
            ("output_per_1m", output_per_1m),
        ] {
            if !(0.0..=HUGE).contains(&v) {
                return Err(ConfigError::at(
                    format!("{at}.{field}"),
                    format!("{v} is out of range: give 0 to {HUGE} (USD per million tokens)"),
                ));
            }
        }
        Ok(Price {
            input_per_1m,
            output_per_1m,
        })
    };
    let mut cost = Cost {
        tokens: price(&at, c.input_per_1m, c.output_per_1m)?,
        ..Cost::default()
    };
    for (model, p) in &c.models {
        let at = format!("{at}.models.{model}");
        if models.upstream(model).is_none() {
            return Err(ConfigError::at(
                at,
                "is not among this backend's `models`: price one of them (its client name)",
            ));
        }
        cost.models
            .insert(model.clone(), price(&at, p.input_per_1m, p.output_per_1m)?);
    }
    if let Some(usd) = c.gpu_hour_usd {
        if !(0.0..=HUGE).contains(&usd) {
            return Err(ConfigError::at(
                format!("{at}.gpu_hour_usd"),
                format!("{usd} is out of range: give 0 to {HUGE} (USD per hour of the engine)"),
            ));
        }
        cost.gpu_hour_usd = Some(usd);
    }
    Ok(Some(cost))
}

/// The backend's prefix index from `prefix_cache:` and its own `prefix_cache_tokens`: at
/// least one block (the section itself is checked once, by `prefix_routing`).
fn prefix_index(
    at: &str,
    b: &RawBackend,
    prefix: &RawPrefixCache,
) -> Result<Option<PrefixIndexSize>> {
    let tokens = b.prefix_cache_tokens.unwrap_or(prefix.capacity_tokens);
    let block = u64::from(prefix.block_tokens.max(1));
    if b.prefix_cache_tokens.is_some() && tokens < block {
        return Err(ConfigError::at(
            format!("{at}.prefix_cache_tokens"),
            format!(
                "{tokens} holds not one block of {block} tokens: give at least prefix_cache.block_tokens"
            ),
        ));
    }
    if !(prefix.enabled && prefix.ttl_s.is_finite() && prefix.ttl_s > 0.0) {
        return Ok(None);
    }
    Ok(Some(PrefixIndexSize {
        blocks: usize::try_from((tokens / block).max(1)).unwrap_or(usize::MAX),
        block_tokens: prefix.block_tokens.max(1),
        ttl: Duration::from_secs_f64(prefix.ttl_s.min(DAY_S)),
    }))
}

/// `discovery` and `refresh_s`: a host name to resolve (an address has nothing to discover),
/// resolved again at most ten times a second and at least once an hour.
fn discovery(at: &str, b: &RawBackend, url: &Uri) -> Result<Option<Discovery>> {
    let Some(RawDiscovery::Dns) = b.discovery else {
        return match b.refresh_s {
            Some(_) => Err(ConfigError::at(
                format!("{at}.refresh_s"),
                "applies only with `discovery: dns`; add it or remove refresh_s",
            )),
            None => Ok(None),
        };
    };
    let host = url.host().unwrap_or_default();
    if host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok()
    {
        return Err(ConfigError::at(
            format!("{at}.discovery"),
            format!(
                "the URL's host {host} is already an address: discovery resolves a name (a headless Service, or any name with several A/AAAA records); remove discovery"
            ),
        ));
    }
    let refresh_s = b.refresh_s.unwrap_or(5.0);
    if !(0.1..=3600.0).contains(&refresh_s) {
        return Err(ConfigError::at(
            format!("{at}.refresh_s"),
            format!("{refresh_s} is out of range: give 0.1 to 3600 seconds"),
        ));
    }
    Ok(Some(Discovery {
        refresh: Duration::from_secs_f64(refresh_s),
    }))
}

/// The header `name` carrying a backend's API key: `Authorization: Bearer KEY`, any other
/// header the bare key (`x-api-key` for Anthropic, `api-key` for Azure's resource keys); marked
/// sensitive, so that it never shows in logs or debug output. Made once here, not per request.
fn credential(
    at: &str,
    var: &str,
    key: &str,
    name: HeaderName,
) -> Result<(HeaderName, HeaderValue)> {
    let value = if name == header::AUTHORIZATION {
        format!("Bearer {key}")
    } else {
        key.to_owned()
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

/// Characters a path segment or a query name or value may hold without escaping (RFC 3986's
/// unreserved set): what is configured is sent as written.
fn unreserved(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// `path_prefix` and `query`, checked and made ready to splice into every upstream URI.
fn provider_paths(at: &str, b: &RawBackend) -> Result<(Option<String>, Option<String>)> {
    let path_prefix = match b.path_prefix.as_deref() {
        None => None,
        Some(p) => {
            let segments: Vec<&str> = p.trim_end_matches('/').split('/').skip(1).collect();
            if !p.starts_with('/')
                || segments.is_empty()
                || !segments
                    .iter()
                    .all(|s| unreserved(s) && *s != "." && *s != "..")
            {
                return Err(ConfigError::at(
                    format!("{at}.path_prefix"),
                    format!(
                        "`{p}`: write a path such as /v1beta/openai (segments of letters, digits, `-`, `.`, `_` or `~`)"
                    ),
                ));
            }
            Some(p.trim_end_matches('/').to_owned())
        }
    };
    let mut query = Vec::with_capacity(b.query.len());
    for (name, value) in &b.query {
        if !unreserved(name) || !unreserved(value) {
            return Err(ConfigError::at(
                format!("{at}.query.{name}"),
                format!(
                    "`{name}: {value}`: a name and a value of letters, digits, `-`, `.`, `_` or `~` (e.g. api-version: 2024-10-21)"
                ),
            ));
        }
        query.push(format!("{name}={value}"));
    }
    Ok((path_prefix, (!query.is_empty()).then(|| query.join("&"))))
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
    let Some(authority) = uri.authority() else {
        return Err(ConfigError::at(at, format!("`{value}` has no host")));
    };
    if authority.as_str().contains('@') {
        // Never used to authenticate, and shown wherever the URL is: refused, not stripped.
        return Err(ConfigError::at(
            at,
            "a backend URL cannot carry credentials (user:password@): give the key with api_key_env",
        ));
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
            within(&format!("{at}.concurrency"), r.concurrency, HUGE)?;
            within(&format!("{at}.per_user_tps"), r.per_user_tps, HUGE)?;
            within(&format!("{at}.ttft_ms"), r.ttft_ms, DAY_MS)?;
            points.push(PriorPoint {
                concurrency: r.concurrency,
                per_user_tps: r.per_user_tps,
                ttft_s: r.ttft_ms / 1e3,
            });
        }
    }
    if let Some(f) = &p.fit {
        within(&format!("{at}.fit.tpot_base_ms"), f.tpot_base_ms, DAY_MS)?;
        within(&format!("{at}.fit.ttft_base_ms"), f.ttft_base_ms, DAY_MS)?;
        for (field, v) in [
            ("tpot_per_seq_ms", f.tpot_per_seq_ms),
            ("ttft_per_seq_ms", f.ttft_per_seq_ms),
        ] {
            if !(0.0..=DAY_MS).contains(&v) {
                return Err(ConfigError::at(
                    format!("{at}.fit.{field}"),
                    format!("{v} is out of range: give 0 to {DAY_MS} (ms)"),
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
