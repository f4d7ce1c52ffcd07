//! The live state of a running gateway: the request stack and its router, built from one config
//! and swapped whole by a reload. The listener, the admin plane and the reloader read it.
//!
//! Reload: a new config is validated whole and its stack built (backends, clients, router)
//! before anything changes; then the stack is swapped atomically (arc-swap). Each request takes
//! the stack current when it arrives, so requests in flight finish on the one they started with.
//! Backends whose config did not change are carried over as they are (in-flight counts, curves,
//! health); a changed one gets a new client and keeps its curves. API keys keep their usage by
//! name, their limits changed in place; a key removed is refused from the swap on.
//!
//! Discovery (`crate::discovery`): the backends are the config's entries expanded by the
//! addresses found in DNS. When an answer changes, the same config is built again over the new
//! addresses, the same way: members still there are carried over, new ones join cold, and those
//! gone are no longer routed to while their streams finish on the backend they hold.

pub(crate) mod watcher;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::Config;
use crate::discovery::{self, Found, Resolver};
use crate::fleet::{Backend, Line, Outbox};
use crate::jwt::Jwt;
use crate::keystore::KeyStore;
use crate::otel::Tracing;
use crate::router::{Entries, Router};
use crate::signal::Signal;
use crate::stack::{self, Stack};
use crate::tenant::Tenants;

/// What a reload may change: everything but the listeners.
#[derive(Debug)]
pub(crate) struct Live {
    /// The request stack.
    pub stack: Stack,
    /// Its router (also read by the admin plane).
    pub router: Arc<Router>,
    /// The config both were built from.
    pub config: Config,
    /// The addresses its discovered entries stood for.
    pub found: Found,
    /// Where the backends' samples and health events go for the other replicas (in a
    /// cluster).
    outbox: Option<Outbox>,
    /// The span exporter, when `tracing:` is configured (kept across reloads).
    pub tracing: Option<Tracing>,
    /// Each API key's limits and usage (usage kept across reloads by the key's name).
    pub tenants: Tenants,
    /// The keys made through the admin API (the same store across reloads).
    pub keys: Arc<KeyStore>,
    /// JWT bearer tokens as identities, when configured (their key set kept across reloads).
    pub jwt: Option<Arc<Jwt>>,
}

impl Live {
    /// Builds the router and stack for `config` with the addresses `found` for its discovered
    /// entries, reusing `old` backends that did not change; `drained` ends streams still open
    /// at the drain deadline; `outbox` (a cluster's) is where every backend's samples and
    /// health events go; `keys` are the virtual keys the stack also accepts.
    pub(crate) fn build(
        config: &Config,
        found: Found,
        old: Option<&Live>,
        drained: &Signal,
        outbox: Option<Outbox>,
        tracing: Option<Tracing>,
        keys: Arc<KeyStore>,
    ) -> Result<Self, String> {
        let classes_same = old.is_some_and(|o| o.config.classes == config.classes);
        // Waiters are woken by releases on any backend: reused backends keep waking the line
        // they were built with, so it is carried over with them.
        let line = match old {
            Some(o) if classes_same => o.router.line(),
            _ => Arc::new(Line::new(config.classes.len())),
        };
        let (configs, of_entry) = discovery::expand(config, &found);
        let members = |entry: usize| of_entry.get(entry).cloned().unwrap_or_default().collect();
        let entries = Entries {
            default: config.default_backend.map(members),
            by_path: config
                .routes
                .iter()
                .filter_map(|r| Some((r.path.clone()?, members(r.backend?))))
                .collect(),
            vacant: config
                .backends
                .iter()
                .zip(&of_entry)
                .filter(|(b, range)| b.discovery.is_some() && range.is_empty())
                .map(|(b, _)| crate::router::Vacant {
                    name: Arc::clone(&b.name),
                    dialect: b.dialect,
                    translate: b.translate,
                    models: b.models.clone(),
                })
                .collect(),
        };
        let mut backends = Vec::with_capacity(configs.len());
        for b in &configs {
            let previous =
                old.and_then(|o| o.router.backends().iter().find(|p| p.config.name == b.name));
            match previous {
                Some(p) if classes_same && p.config == *b => {
                    backends.push(Arc::clone(p));
                }
                _ => {
                    let fresh = Backend::new(
                        b.clone(),
                        config.curve_half_life_s,
                        config.classes.len(),
                        Arc::clone(&line),
                        outbox.clone(),
                    )?;
                    if let Some(p) = previous {
                        fresh.adopt(p);
                    }
                    backends.push(fresh);
                }
            }
        }
        let router = Arc::new(Router::new(
            backends,
            entries,
            config.classes.clone(),
            config.routing,
            line,
        ));
        // Last, once nothing can fail: a kept key takes its new limits here.
        let jwt = match &config.jwt {
            Some(j) => Some(Arc::new(Jwt::new(
                j.clone(),
                old.and_then(|o| o.jwt.as_ref())
                    .map(|o| Arc::clone(o.keys())),
            )?)),
            None => None,
        };
        let accounts = config
            .api_keys
            .iter()
            .map(|k| (&k.name, k.limits, k.weight))
            .chain(
                config
                    .jwt
                    .iter()
                    .flat_map(|j| &j.tenants)
                    .map(|t| (&t.name, t.limits, t.weight)),
            );
        let tenants = Tenants::build(
            accounts,
            old.map(|o| &o.tenants),
            Instant::now(),
            config.max_key_series,
        );
        let stack = stack::build(
            config,
            Arc::clone(&router),
            &tenants,
            &keys,
            jwt.as_ref(),
            drained.clone(),
            tracing.as_ref(),
        );
        Ok(Self {
            stack,
            router,
            config: config.clone(),
            found,
            outbox,
            tracing,
            tenants,
            keys,
            jwt,
        })
    }
}

impl Live {
    /// Every API key's tenant: the config's, in order, then the admin API's, by name.
    pub(crate) fn every_tenant(&self) -> Vec<Arc<crate::tenant::Tenant>> {
        let mut all: Vec<_> = self.tenants.iter().cloned().collect();
        all.extend(self.keys.tenants());
        all
    }
}

/// How the last reload went, for `/admin/reload`.
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct ReloadStatus {
    /// Reloads applied since start.
    pub applied: u64,
    /// Reloads refused since start.
    pub refused: u64,
    /// Seconds since the Unix epoch of the last attempt.
    pub last_at_unix_s: Option<u64>,
    /// Whether it was applied.
    pub last_ok: Option<bool>,
    /// Why it was refused.
    pub last_error: Option<String>,
}

/// Applies new configs to a running gateway (see [`Reloader::reload`]), and new DNS answers
/// (see [`Reloader::keep_discovering`]); cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Reloader {
    live: Arc<ArcSwap<Live>>,
    status: Arc<Mutex<ReloadStatus>>,
    drained: Signal,
    resolver: Resolver,
    /// Held from reading the live state to storing the next, so that a reload and a new DNS
    /// answer never build on the same state and one of them is lost.
    building: Arc<Mutex<()>>,
}

/// How often [`Reloader::keep_discovering`] looks for entries a reload added.
const DISCOVERY_LOOK: Duration = Duration::from_secs(1);

impl Reloader {
    /// A reloader of `live`, recording outcomes in `status`; `drained` as for [`Live::build`];
    /// `resolver` answers for discovered entries.
    pub(crate) fn new(
        live: Arc<ArcSwap<Live>>,
        status: Arc<Mutex<ReloadStatus>>,
        drained: Signal,
        resolver: Resolver,
    ) -> Self {
        Self {
            live,
            status,
            drained,
            resolver,
            building: Arc::default(),
        }
    }

    /// Applies `config` if it can be applied whole: listeners cannot change without a restart,
    /// and every backend's client must build. Discovered entries it adds are resolved first,
    /// so that their backends are there from the moment it applies. On error nothing changes.
    /// The outcome is what `/admin/reload` shows.
    pub(crate) async fn reload(&self, config: &Config) -> Result<(), String> {
        let result = self.try_reload(config).await;
        match &result {
            Ok(()) => tracing::info!(backends = config.backends.len(), "config reloaded"),
            Err(err) => tracing::error!(%err, "config reload refused; the running config stays"),
        }
        self.record(result.as_ref().err().cloned());
        result
    }

    /// Records a reload refused before it got here (the file did not validate).
    pub(crate) fn refused(&self, error: String) {
        self.record(Some(error));
    }

    fn record(&self, error: Option<String>) {
        crate::telemetry::count_reload(error.is_none());
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        status.last_at_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
        status.last_ok = Some(error.is_none());
        if error.is_some() {
            status.refused += 1;
        } else {
            status.applied += 1;
        }
        status.last_error = error;
    }

    async fn try_reload(&self, config: &Config) -> Result<(), String> {
        {
            let current = self.live.load();
            let old = &current.config;
            if config.listen != old.listen
                || config.admin_listen != old.admin_listen
                || config.tls != old.tls
                || config.admin_token != old.admin_token
                || config.admin_hosts != old.admin_hosts
                || config.limits.header_read_timeout != old.limits.header_read_timeout
                || config.limits.max_header_bytes != old.limits.max_header_bytes
                || config.limits.max_connections != old.limits.max_connections
                || config.limits.idle_timeout != old.limits.idle_timeout
                || config.limits.client_write_timeout != old.limits.client_write_timeout
            {
                return Err(
                    "listen, admin, TLS and connection limits apply at start only: restart to change them"
                        .to_owned(),
                );
            }
            if config.cluster != old.cluster {
                return Err("cluster applies at start only: restart to change it".to_owned());
            }
            if config.resolver != old.resolver {
                return Err("resolver applies at start only: restart to change it".to_owned());
            }
            if config.tracing != old.tracing {
                return Err("tracing applies at start only: restart to change it".to_owned());
            }
            if config.virtual_keys != old.virtual_keys {
                return Err("virtual_keys applies at start only: restart to change it".to_owned());
            }
            let tenants = config.jwt.iter().flat_map(|j| &j.tenants).map(|t| &t.name);
            if let Some(name) = config
                .api_keys
                .iter()
                .map(|k| &k.name)
                .chain(tenants)
                .find(|name| current.keys.record(name).is_some())
            {
                return Err(format!(
                    "a virtual key is already called `{name}`: give the config's key or tenant another name, or revoke the virtual key"
                ));
            }
        }
        let mut fresh = Found::default();
        let known = self.live.load_full();
        discovery::resolve(&self.resolver, known.found.missing(config), &mut fresh).await;
        let _building = self.building.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.live.load();
        let found = current.found.updated(&fresh, config);
        let next = Live::build(
            config,
            found,
            Some(&current),
            &self.drained,
            current.outbox.clone(),
            current.tracing.clone(),
            Arc::clone(&current.keys),
        )?;
        self.live.store(Arc::new(next));
        Ok(())
    }

    /// Resolves the running config's discovered entries, each every its `refresh_s`, and
    /// rebuilds the live state when an answer changes; until `stop`.
    pub(crate) async fn keep_discovering(self, mut stop: watch::Receiver<bool>) {
        let mut due: HashMap<Arc<str>, Instant> = HashMap::new();
        loop {
            let live = self.live.load_full();
            let now = Instant::now();
            let entries: Vec<_> = discovery::discovered(&live.config)
                .filter(|b| due.get(&b.name).is_none_or(|at| *at <= now))
                .collect();
            if !entries.is_empty() {
                let mut fresh = Found::default();
                discovery::resolve(&self.resolver, entries.iter().copied(), &mut fresh).await;
                for entry in &entries {
                    let refresh = entry.discovery.map_or(DISCOVERY_LOOK, |d| d.refresh);
                    due.insert(Arc::clone(&entry.name), now + refresh);
                }
                self.rediscovered(&fresh);
            }
            let next = discovery::discovered(&live.config)
                .filter_map(|b| due.get(&b.name).copied())
                .chain([Instant::now() + DISCOVERY_LOOK])
                .min()
                .unwrap_or(now);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Applies new answers: the running config built again over them, if they changed what
    /// it stands for.
    fn rediscovered(&self, fresh: &Found) {
        let _building = self.building.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.live.load();
        let found = current.found.updated(fresh, &current.config);
        if found == current.found {
            return;
        }
        let changes = found.changes(&current.found).join("; ");
        match Live::build(
            &current.config,
            found,
            Some(&current),
            &self.drained,
            current.outbox.clone(),
            current.tracing.clone(),
            Arc::clone(&current.keys),
        ) {
            Ok(next) => {
                tracing::info!(%changes, "discovered backends changed");
                self.live.store(Arc::new(next));
            }
            Err(err) => tracing::error!(%err, %changes, "discovered backends could not be built"),
        }
    }
}
