//! Raw config -> typed [`Config`]: every rule, with errors that name the field and the fix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Uri};

use super::raw::{RawBackend, RawConfig};
use super::{BackendConfig, ClassConfig, Config, Cost, Limits, ModelMap, Secret, TlsFiles};
use crate::yaml::ConfigError;

type Result<T> = std::result::Result<T, ConfigError>;

/// Validates the whole config; `env` looks up environment variables (API keys).
pub fn validate(raw: &RawConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
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

    if raw.backends.is_empty() {
        return Err(ConfigError::at(
            "backends",
            "no backends: list at least one upstream (name, url, dialect, models)",
        ));
    }
    let mut backends: Vec<BackendConfig> = Vec::with_capacity(raw.backends.len());
    for (i, b) in raw.backends.iter().enumerate() {
        let at = format!("backends[{i}]");
        let backend = backend(&at, b, env)?;
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

    let mut classes: Vec<ClassConfig> = Vec::with_capacity(raw.classes.len());
    for (i, c) in raw.classes.iter().enumerate() {
        let at = format!("classes[{i}]");
        if c.name.trim().is_empty() {
            return Err(ConfigError::at(format!("{at}.name"), "must not be empty"));
        }
        if classes.iter().any(|other| *other.name == *c.name) {
            return Err(ConfigError::at(
                format!("{at}.name"),
                format!("duplicate class `{}`", c.name),
            ));
        }
        if let Some(tps) = c.min_tps {
            positive(&format!("{at}.min_tps"), tps)?;
        }
        if let Some(ms) = c.max_ttft_ms {
            positive(&format!("{at}.max_ttft_ms"), ms)?;
        }
        classes.push(ClassConfig {
            name: Arc::from(c.name.as_str()),
            min_tps: c.min_tps,
            max_ttft: c.max_ttft_ms.map(|ms| Duration::from_secs_f64(ms / 1e3)),
        });
    }
    let default_class = match &raw.default_class {
        None => (!classes.is_empty()).then_some(0),
        Some(name) => Some(
            classes
                .iter()
                .position(|c| &*c.name == name)
                .ok_or_else(|| {
                    ConfigError::at(
                        "default_class",
                        format!("no class is called `{name}`; define it under classes"),
                    )
                })?,
        ),
    };
    if raw.routing.policy != "round_robin" {
        return Err(ConfigError::at(
            "routing.policy",
            format!(
                "`{}` is not available in this version; use round_robin",
                raw.routing.policy
            ),
        ));
    }
    positive("curves.half_life_s", raw.curves.half_life_s)?;
    Ok(Config {
        curve_half_life_s: raw.curves.half_life_s,
        listen,
        tls,
        admin_listen,
        limits,
        backends,
        default_backend,
        classes,
        default_class,
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

fn limits(raw: &RawConfig) -> Result<Limits> {
    let l = &raw.limits;
    if l.max_body_bytes == 0 {
        return Err(ConfigError::at(
            "limits.max_body_bytes",
            "must be at least 1",
        ));
    }
    positive("limits.header_read_timeout_s", l.header_read_timeout_s)?;
    positive("limits.drain_timeout_s", l.drain_timeout_s)?;
    Ok(Limits {
        max_body_bytes: usize::try_from(l.max_body_bytes).unwrap_or(usize::MAX),
        header_read_timeout: Duration::from_secs_f64(l.header_read_timeout_s),
        drain_timeout: Duration::from_secs_f64(l.drain_timeout_s),
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
            Some(key) if !key.is_empty() => Some(Secret::new(key)),
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
    let version = b.anthropic_version.as_deref().unwrap_or("2023-06-01");
    let anthropic_version = HeaderValue::try_from(version).map_err(|_| {
        ConfigError::at(
            format!("{at}.anthropic_version"),
            "not a valid header value",
        )
    })?;
    Ok(BackendConfig {
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
        anthropic_version,
    })
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
        assert_eq!(b.models.upstream("small"), Some("upstream-small"));
        assert_eq!(b.models.upstream("other"), Some("other"));
        assert_eq!(b.anthropic_version, "2023-06-01");
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
        assert_eq!(
            c.backends[0].api_key.as_ref().unwrap().expose(),
            "sk-secret"
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
