//! Setting up the link: this replica's id and the Redis client (TLS and password included).

use crate::config::{ClusterConfig, without_password};

/// This replica's id: the configured one, or host name, process id and a random suffix.
pub(super) fn replica_id(config: &ClusterConfig) -> String {
    if let Some(id) = &config.replica_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tpsgate".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// The Redis client for `config` (nothing is connected yet).
pub(super) fn client(config: &ClusterConfig) -> Result<redis::Client, String> {
    use redis::IntoConnectionInfo as _;
    let url = config.redis_url.expose();
    let shown = without_password(url);
    let mut info = url
        .into_connection_info()
        .map_err(|e| format!("cluster.redis_url `{shown}`: {e}"))?;
    if let Some(password) = &config.password {
        let settings = info
            .redis_settings()
            .clone()
            .set_password(password.expose());
        info = info.set_redis_settings(settings);
    }
    match &config.ca_file {
        None => redis::Client::open(info).map_err(|e| format!("cluster.redis_url `{shown}`: {e}")),
        Some(ca) => {
            let root =
                std::fs::read(ca).map_err(|e| format!("cluster.ca_file {}: {e}", ca.display()))?;
            redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                },
            )
            .map_err(|e| format!("cluster.ca_file {}: {e}", ca.display()))
        }
    }
}
