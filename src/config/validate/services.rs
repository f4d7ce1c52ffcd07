//! The services a gateway talks to or serves besides its backends: the tracer's endpoint, the
//! DNS resolver, CORS, and the cluster's Redis.

use std::net::SocketAddr;
use std::time::Duration;

use super::{DAY_S, Result, readable, within};
use crate::config::raw::RawCluster;
use crate::config::{ClusterConfig, Secret};
use crate::yaml::ConfigError;

/// `tracing:`: an http(s) endpoint, a service name, a ratio.
pub(super) fn tracing(
    raw: &crate::config::raw::RawTracing,
) -> Result<crate::config::TracingConfig> {
    let endpoint = raw.otlp_endpoint.trim();
    let url = endpoint.parse::<http::Uri>().ok();
    if !url
        .as_ref()
        .is_some_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some())
    {
        return Err(ConfigError::at(
            "tracing.otlp_endpoint",
            format!(
                "`{endpoint}` is not an OTLP/HTTP endpoint: write http://HOST:4318/v1/traces (a collector's)"
            ),
        ));
    }
    if raw.service_name.trim().is_empty() {
        return Err(ConfigError::at(
            "tracing.service_name",
            "give the service's name (default: tpsgate)",
        ));
    }
    if !(0.0..=1.0).contains(&raw.sample_ratio) {
        return Err(ConfigError::at(
            "tracing.sample_ratio",
            format!("{} is out of range: give 0 to 1", raw.sample_ratio),
        ));
    }
    Ok(crate::config::TracingConfig {
        otlp_endpoint: endpoint.to_owned(),
        service_name: raw.service_name.trim().to_owned(),
        sample_ratio: raw.sample_ratio,
    })
}

/// `resolver:`: at least one nameserver, each an IP address with an optional port.
pub(super) fn resolver(
    raw: &crate::config::raw::RawResolver,
) -> Result<crate::config::ResolverConfig> {
    if raw.nameservers.is_empty() {
        return Err(ConfigError::at(
            "resolver.nameservers",
            "list at least one nameserver (e.g. 10.96.0.10:53), or remove resolver: to use the system's",
        ));
    }
    let mut nameservers = Vec::with_capacity(raw.nameservers.len());
    for (i, text) in raw.nameservers.iter().enumerate() {
        let address = text
            .parse::<SocketAddr>()
            .or_else(|_| {
                text.parse::<std::net::IpAddr>()
                    .map(|ip| SocketAddr::new(ip, 53))
            })
            .map_err(|_| {
                ConfigError::at(
                    format!("resolver.nameservers[{i}]"),
                    format!("`{text}` is not an address: write IP or IP:PORT (e.g. 10.96.0.10:53)"),
                )
            })?;
        nameservers.push(address);
    }
    within("resolver.timeout_ms", raw.timeout_ms as f64, 60_000.0)?;
    Ok(crate::config::ResolverConfig {
        nameservers,
        timeout: Duration::from_millis(raw.timeout_ms),
    })
}

/// `cors:`: each origin a scheme and a host (and port), as a browser sends it; or `*` alone.
pub(super) fn cors(raw: &crate::config::raw::RawCors) -> Result<crate::config::Cors> {
    within("cors.max_age_s", raw.max_age_s as f64, DAY_S)?;
    let max_age = Duration::from_secs(raw.max_age_s);
    if raw.allowed_origins == ["*"] {
        return Ok(crate::config::Cors {
            origins: None,
            max_age,
        });
    }
    if raw.allowed_origins.is_empty() {
        return Err(ConfigError::at(
            "cors.allowed_origins",
            "list the origins browsers may call from (e.g. https://app.example.com), or [\"*\"] for any; remove cors: to turn it off",
        ));
    }
    let mut origins = Vec::with_capacity(raw.allowed_origins.len());
    for (i, origin) in raw.allowed_origins.iter().enumerate() {
        let uri = origin.parse::<http::Uri>().ok();
        let plain = uri.as_ref().is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.authority().is_some()
                && u.path_and_query().is_none_or(|p| p.as_str() == "/")
                && !origin.ends_with('/')
        });
        match (plain, http::HeaderValue::from_str(origin)) {
            (true, Ok(value)) => origins.push(value),
            _ => {
                return Err(ConfigError::at(
                    format!("cors.allowed_origins[{i}]"),
                    format!(
                        "`{origin}` is not an origin: write scheme and host as a browser sends them (https://app.example.com, no path or trailing slash), or [\"*\"] alone"
                    ),
                ));
            }
        }
    }
    Ok(crate::config::Cors {
        origins: Some(origins),
        max_age,
    })
}

/// `cluster:`.
pub(super) fn cluster(
    raw: &RawCluster,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ClusterConfig> {
    use redis::IntoConnectionInfo as _;
    let url = raw.redis_url.trim();
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(ConfigError::at(
            "cluster.redis_url",
            format!(
                "`{}` is not a Redis URL: write redis://HOST:PORT/DB (or rediss:// for TLS)",
                without_password(url)
            ),
        ));
    }
    if let Err(e) = url.into_connection_info() {
        return Err(ConfigError::at(
            "cluster.redis_url",
            format!(
                "`{}`: {e}; write redis://HOST:PORT/DB (or rediss:// for TLS)",
                without_password(url)
            ),
        ));
    }
    let password = match &raw.password_env {
        None => None,
        Some(var) => match env(var) {
            Some(p) if !p.is_empty() => Some(Secret::new(p)),
            _ => {
                return Err(ConfigError::at(
                    "cluster.password_env",
                    format!(
                        "environment variable {var} is not set (or empty); export it, or remove password_env"
                    ),
                ));
            }
        },
    };
    let prefix = &raw.key_prefix;
    if prefix.is_empty()
        || prefix.len() > 64
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
    {
        return Err(ConfigError::at(
            "cluster.key_prefix",
            format!(
                "`{prefix}`: use 1 to 64 letters, digits, `.`, `_`, `:` or `-` (one prefix per gateway fleet sharing the Redis)"
            ),
        ));
    }
    if !(10..=10_000).contains(&raw.sync_interval_ms) {
        return Err(ConfigError::at(
            "cluster.sync_interval_ms",
            format!(
                "{} ms is out of range: give 10 to 10000 (50 by default: the peers' counts are that stale at most)",
                raw.sync_interval_ms
            ),
        ));
    }
    if let Some(id) = &raw.replica_id
        && (id.is_empty()
            || id.len() > 128
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)))
    {
        return Err(ConfigError::at(
            "cluster.replica_id",
            format!(
                "`{id}`: use 1 to 128 letters, digits, `.`, `_`, `:` or `-`, unique in the fleet (or leave it out to have one made)"
            ),
        ));
    }
    if let Some(ca) = &raw.ca_file {
        readable("cluster.ca_file", ca)?;
    }
    Ok(ClusterConfig {
        redis_url: Secret::new(url.to_owned()),
        password,
        key_prefix: prefix.clone(),
        sync_interval: Duration::from_millis(raw.sync_interval_ms),
        replica_id: raw.replica_id.clone(),
        ca_file: raw.ca_file.clone(),
    })
}

/// `url` with any password in it replaced by `***`, for messages and the admin plane.
pub(crate) fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_owned(),
    }
}
