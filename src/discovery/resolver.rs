//! The DNS resolver behind `discovery: dns`: hickory-resolver over tokio, with the system's
//! nameservers (`/etc/resolv.conf`, `/etc/hosts`) or those of `resolver:`.

use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig as Servers};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

use crate::config::ResolverConfig;

/// Resolves discovered hosts; cheap to share.
#[derive(Clone)]
pub(crate) struct Resolver {
    /// The resolver, or why none could be made (the system's config unreadable): kept to be
    /// reported by each lookup, since a gateway with no discovered backend needs none.
    inner: Result<TokioResolver, String>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("ready", &self.inner.is_ok())
            .finish()
    }
}

impl Resolver {
    /// A resolver asking `config`'s nameservers, or the system's when `None`.
    pub(crate) fn new(config: Option<&ResolverConfig>) -> Self {
        let provider = TokioRuntimeProvider::default();
        let builder = match config {
            None => TokioResolver::builder(provider).map_err(|e| {
                format!("cannot read the system's resolver config ({e}); set resolver.nameservers")
            }),
            Some(config) => {
                let servers = config
                    .nameservers
                    .iter()
                    .map(|address| {
                        let mut udp = ConnectionConfig::udp();
                        udp.port = address.port();
                        let mut tcp = ConnectionConfig::tcp();
                        tcp.port = address.port();
                        NameServerConfig::new(address.ip(), true, vec![udp, tcp])
                    })
                    .collect();
                let mut builder = TokioResolver::builder_with_config(
                    Servers::from_name_servers(servers),
                    provider,
                );
                builder.options_mut().timeout = config.timeout;
                Ok(builder)
            }
        };
        let inner = builder.and_then(|mut builder| {
            // Every refresh asks the nameserver: the refresh interval is the cache, and an
            // address that left must stop getting requests by the next one.
            let options = builder.options_mut();
            options.positive_max_ttl = Some(Duration::ZERO);
            options.negative_max_ttl = Some(Duration::ZERO);
            builder
                .build()
                .map_err(|e| format!("cannot make a DNS resolver: {e}"))
        });
        Self { inner }
    }

    /// The addresses of `host` (none when it has no A/AAAA record or does not exist); an
    /// error when the lookup itself failed.
    pub(crate) async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, String> {
        let resolver = self.inner.as_ref().map_err(Clone::clone)?;
        // As written: a short name (`vllm-headless`) goes through the search domains, as a
        // Service's name does in a pod.
        match resolver.lookup_ip(host).await {
            Ok(found) => Ok(found.iter().collect()),
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        }
    }
}
