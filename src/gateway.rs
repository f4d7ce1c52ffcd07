//! A running gateway: the client-facing listener with the request stack, and the admin listener,
//! until stopped. `tpsgate serve` and the integration tests both start it through here.
//!
//! Reload: a new config is validated whole and its stack built (backends, clients, router)
//! before anything changes; then the stack is swapped atomically (arc-swap). Each request takes
//! the stack current when it arrives, so requests in flight finish on the one they started with.
//! Backends whose config did not change are carried over as they are (in-flight counts, curves,
//! health); a changed one gets a new client and keeps its curves.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::Service;

use crate::admin::{self, AdminState};
use crate::config::{BackendConfig, Config};
use crate::listen;
use crate::proxy::body::ProxyBody;
use crate::proxy::classify::Classes;
use crate::router::Router;
use crate::router::queue::Line;
use crate::stack::{self, Stack};
use crate::upstream::Backend;

/// How often the metrics recorder's buffers are drained.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// What a reload may change: everything but the listeners.
#[derive(Debug)]
pub struct Live {
    /// The request stack.
    pub stack: Stack,
    /// Its router (also read by the admin plane).
    pub router: Arc<Router>,
    config: Config,
}

/// How the last reload went, for `/admin/reload`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReloadStatus {
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

/// The gateway, serving until [`Gateway::stop`] or drop.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    tls: bool,
    reloader: Reloader,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Applies new configs to a running gateway (see [`Reloader::reload`]); cheap to clone.
#[derive(Debug, Clone)]
pub struct Reloader {
    admin: Arc<AdminState>,
    live: Arc<ArcSwap<Live>>,
    drained: crate::signal::Signal,
}

/// Builds the router and stack for `config`, reusing `old` backends that did not change;
/// `drained` ends streams still open at the drain deadline.
fn build(
    config: &Config,
    old: Option<&Live>,
    drained: &crate::signal::Signal,
) -> Result<Live, String> {
    let classes_same = old.is_some_and(|o| o.config.classes == config.classes);
    // Waiters are woken by releases on any backend: reused backends keep waking the line they
    // were built with, so it is carried over with them.
    let line = match old {
        Some(o) if classes_same => o.router.line(),
        _ => Arc::new(Line::new(config.classes.len())),
    };
    let mut backends = Vec::with_capacity(config.backends.len());
    for b in &config.backends {
        let previous =
            old.and_then(|o| o.router.backends().iter().find(|p| p.config.name == b.name));
        match previous {
            Some(p) if classes_same && same_backend(&p.config, b) => backends.push(Arc::clone(p)),
            _ => {
                let fresh = Backend::new(
                    b.clone(),
                    config.curve_half_life_s,
                    config.classes.len(),
                    Arc::clone(&line),
                )?;
                if let Some(p) = previous {
                    fresh.adopt_curves(p);
                }
                backends.push(fresh);
            }
        }
    }
    let router = Arc::new(Router::new(
        backends,
        config.default_backend,
        config.classes.clone(),
        config.routing,
        line,
    ));
    let classes = Classes::new(
        config.classes.clone(),
        config.default_class,
        config.routes.clone(),
    );
    let stack = stack::build(
        Arc::clone(&router),
        config.limits,
        classes,
        config.api_keys.clone(),
        drained.clone(),
    );
    Ok(Live {
        stack,
        router,
        config: config.clone(),
    })
}

/// Whether a backend's config is the same in every field that matters once running.
fn same_backend(a: &BackendConfig, b: &BackendConfig) -> bool {
    a.url == b.url
        && a.dialect == b.dialect
        && a.api_key == b.api_key
        && a.headers == b.headers
        && a.models == b.models
        && a.max_concurrency == b.max_concurrency
        && a.cost == b.cost
        && a.ca_file == b.ca_file
        && a.forward_client_auth == b.forward_client_auth
        && a.connect_timeout == b.connect_timeout
        && a.timeouts == b.timeouts
        && a.anthropic_version == b.anthropic_version
        && a.prior == b.prior
        && a.ejection == b.ejection
}

/// The service the listener calls: the stack current when each request arrives.
#[derive(Debug, Clone)]
struct Current(Arc<ArcSwap<Live>>);

impl Service<Request<Incoming>> for Current {
    type Response = Response<ProxyBody>;
    type Error = std::convert::Infallible;
    type Future = <Stack as Service<Request<Incoming>>>::Future;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Every layer of the stack is always ready (none holds capacity of its own).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let mut stack = self.0.load().stack.clone();
        stack.call(req)
    }
}

impl Gateway {
    /// Builds every backend's client, binds both listeners (or fails without serving anything)
    /// and starts serving.
    pub async fn start(config: &Config) -> Result<Self, String> {
        let drained = crate::signal::Signal::new();
        let live = Arc::new(ArcSwap::from_pointee(build(config, None, &drained)?));
        let tls = match &config.tls {
            Some(files) => Some(listen::tls_acceptor(&files.cert_file, &files.key_file)?),
            None => None,
        };
        let listener = listen::bind(config.listen)
            .await
            .map_err(|e| e.to_string())?;
        let admin_listener = listen::bind(config.admin_listen)
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let admin_addr = admin_listener.local_addr().map_err(|e| e.to_string())?;

        let (stop, _) = watch::channel(false);
        let stopped = |stop: &watch::Sender<bool>| {
            let mut rx = stop.subscribe();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let admin = Arc::new(AdminState {
            live: Arc::clone(&live),
            ready: AtomicBool::new(true),
            token: config.admin_token.clone(),
            reload: std::sync::Mutex::new(ReloadStatus::default()),
        });
        let has_tls = tls.is_some();
        let limits = config.limits;
        let proxy = tokio::spawn(listen::serve(
            listener,
            tls,
            listen::Limits {
                header_read_timeout: limits.header_read_timeout,
                max_header_bytes: limits.max_header_bytes,
                max_connections: limits.max_connections,
                drain: limits.drain_timeout,
            },
            Current(Arc::clone(&live)),
            stopped(&stop),
        ));
        let admin_state = Arc::clone(&admin);
        let admin_service =
            tower::service_fn(move |req| admin::handle(Arc::clone(&admin_state), req));
        let admin_task = tokio::spawn(listen::serve(
            admin_listener,
            None,
            listen::Limits {
                max_connections: 256,
                ..listen::Limits::default()
            },
            admin_service,
            stopped(&stop),
        ));
        // Histograms buffer samples until upkeep drains them: without a scraper they would grow.
        let mut stopped_upkeep = stop.subscribe();
        let upkeep = tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        if let Some(handle) = crate::telemetry::prometheus() {
                            handle.run_upkeep();
                        }
                    }
                    _ = stopped_upkeep.wait_for(|s| *s) => return,
                }
            }
        });
        let mut stopped_oracle = stop.subscribe();
        let oracle_live = Arc::clone(&live);
        let oracle = tokio::spawn(async move {
            let mut every = tokio::time::interval(crate::router::oracle::REFRESH);
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        let router = Arc::clone(&oracle_live.load().router);
                        if let Some(oracle) = router.oracle() {
                            oracle.refresh(router.backends()).await;
                        }
                    }
                    () = async { let _ = stopped_oracle.wait_for(|s| *s).await; } => return,
                }
            }
        });
        Ok(Self {
            addr,
            admin_addr,
            tls: has_tls,
            reloader: Reloader {
                admin,
                live,
                drained,
            },
            stop,
            tasks: vec![proxy, admin_task, upkeep, oracle],
        })
    }

    /// A handle that reloads this gateway's config.
    pub fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// See [`Reloader::reload`].
    pub fn reload(&self, config: &Config) -> Result<(), String> {
        self.reloader.reload(config)
    }

    /// Client-facing address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// Admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// `http://ADDR` or `https://ADDR`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops accepting, reports not-ready, and lets in-flight requests finish up to the drain
    /// deadline.
    pub async fn stop(mut self) {
        self.reloader.admin.ready.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
        // At the drain deadline, streams still open end with an error event (and the listener
        // then closes their connections).
        let drained = self.reloader.drained.clone();
        let deadline = self.reloader.live.load().config.limits.drain_timeout;
        tokio::spawn(async move {
            tokio::time::sleep(deadline.saturating_sub(std::time::Duration::from_millis(50))).await;
            drained.fire();
        });
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Reloader {
    /// Applies `config` if it can be applied whole: listeners cannot change without a restart,
    /// and every backend's client must build. On error nothing changes. The outcome is what
    /// `/admin/reload` shows.
    pub fn reload(&self, config: &Config) -> Result<(), String> {
        let result = self.try_reload(config);
        match &result {
            Ok(()) => tracing::info!(backends = config.backends.len(), "config reloaded"),
            Err(err) => tracing::error!(%err, "config reload refused; the running config stays"),
        }
        self.record(result.as_ref().err().cloned());
        result
    }

    /// Records a reload refused before it got here (the file did not validate).
    pub fn refused(&self, error: String) {
        self.record(Some(error));
    }

    fn record(&self, error: Option<String>) {
        let mut status = self
            .admin
            .reload
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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

    fn try_reload(&self, config: &Config) -> Result<(), String> {
        let current = self.live.load();
        let old = &current.config;
        if config.listen != old.listen
            || config.admin_listen != old.admin_listen
            || config.tls != old.tls
            || config.admin_token != old.admin_token
            || config.limits.header_read_timeout != old.limits.header_read_timeout
            || config.limits.max_header_bytes != old.limits.max_header_bytes
            || config.limits.max_connections != old.limits.max_connections
        {
            return Err(
                "listen, admin, TLS and connection limits apply at start only: restart to change them"
                    .to_owned(),
            );
        }
        let next = build(config, Some(&current), &self.drained)?;
        self.live.store(Arc::new(next));
        Ok(())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
