//! A running gateway: the client-facing listener over the [live](crate::live) request stack, the
//! admin listener and the background tasks, until stopped. `tpsgate serve` and the integration
//! tests both start it through here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::Service;

use crate::admin::{self, AdminState};
use crate::config::Config;
use crate::discovery::Resolver;
use crate::fleet::Inbox;
use crate::listen;
use crate::live::{Live, ReloadStatus, Reloader};
use crate::proxy::body::ProxyBody;
use crate::signal::Signal;
use crate::stack::Stack;

/// How often the metrics recorder's buffers are drained.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// How often curves are checked for first tokens from a drained queue to forget (and classes
/// for an SLO that no backend meets).
const FORGET_EVERY: Duration = Duration::from_millis(250);

/// The gateway, serving until [`Gateway::stop`] or drop.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    tls: bool,
    admin: Arc<AdminState>,
    reloader: Reloader,
    drained: Signal,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The cluster link's sync task, when the gateway runs in a cluster, and its stop.
    cluster: Option<JoinHandle<()>>,
    cluster_stop: watch::Sender<bool>,
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
        let drained = Signal::new();
        let (live, inbox, resolver) = build_live(config, &drained).await?;
        let tls = match &config.tls {
            Some(files) => Some(crate::tls::acceptor(&files.cert_file, &files.key_file)?),
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
        // The cluster link outlives the listener: it stops once the streams have drained, so
        // that the peers count this replica's load until it is gone.
        let (cluster_stop, _) = watch::channel(false);
        let cluster = match (&config.cluster, inbox) {
            (Some(c), Some(inbox)) => Some(crate::cluster::start(
                c,
                Arc::clone(&live),
                inbox,
                cluster_stop.subscribe(),
            )?),
            _ => None,
        };
        let reload_status = Arc::new(Mutex::new(ReloadStatus::default()));
        let admin = Arc::new(AdminState {
            live: Arc::clone(&live),
            ready: AtomicBool::new(true),
            token: config.admin_token.clone(),
            hosts: config.admin_hosts.clone(),
            reload: Arc::clone(&reload_status),
            cluster: cluster.as_ref().map(|c| Arc::clone(&c.status)),
        });
        let has_tls = tls.is_some();
        let limits = config.limits;
        let proxy = tokio::spawn(listen::serve(
            listener,
            tls,
            client_limits(&limits),
            Current(Arc::clone(&live)),
            stopped(&stop),
        ));
        let admin_state = Arc::clone(&admin);
        let admin_service =
            tower::service_fn(move |req| admin::handle(Arc::clone(&admin_state), req));
        let admin_limits = listen::Limits {
            max_connections: 256,
            ..listen::Limits::default()
        };
        let admin_task = tokio::spawn(listen::serve(
            admin_listener,
            None,
            admin_limits,
            admin_service,
            stopped(&stop),
        ));
        let [upkeep, forget, oracle, windows] = upkeep_tasks(&live, &stop);
        // Keys made on another replica (in Redis) are read here within a second.
        let keys_fresh = tokio::spawn(Arc::clone(&live.load().keys).keep_fresh(stop.subscribe()));
        let reloader = Reloader::new(live, reload_status, drained.clone(), resolver);
        let discovery = tokio::spawn(reloader.clone().keep_discovering(stop.subscribe()));
        Ok(Self {
            addr,
            admin_addr,
            tls: has_tls,
            admin,
            reloader,
            drained,
            stop,
            tasks: vec![
                proxy, admin_task, upkeep, forget, oracle, windows, discovery, keys_fresh,
            ],
            cluster: cluster.map(|c| c.task),
            cluster_stop,
        })
    }

    /// A handle that reloads this gateway's config.
    pub(crate) fn reloader(&self) -> Reloader {
        self.reloader.clone()
    }

    /// See [`Reloader::reload`].
    pub async fn reload(&self, config: &Config) -> Result<(), String> {
        self.reloader.reload(config).await
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
        self.admin.ready.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
        // At the drain deadline, streams still open end with an error event (and the listener
        // then closes their connections).
        let drained = self.drained.clone();
        let deadline = self.admin.live.load().config.limits.drain_timeout;
        tokio::spawn(async move {
            tokio::time::sleep(deadline.saturating_sub(std::time::Duration::from_millis(50))).await;
            drained.fire();
        });
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        let _ = self.cluster_stop.send(true);
        if let Some(task) = self.cluster.take() {
            let _ = task.await;
        }
        // The spans still buffered go out; the exporter sends on this runtime, so it waits
        // off it.
        if let Some(tracing) = self.admin.live.load().tracing.clone() {
            let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        let _ = self.cluster_stop.send(true);
    }
}

/// The live state for `config` (its DNS entries resolved once, the tracer started), the inbox of
/// the cluster link when there is one, and the resolver that keeps discovering.
async fn build_live(
    config: &Config,
    drained: &Signal,
) -> Result<(Arc<ArcSwap<Live>>, Option<Inbox>, Resolver), String> {
    let (outbox, inbox) = match &config.cluster {
        Some(cluster) => {
            // A claim's answer comes within a round trip; two intervals cover one that
            // waits behind a round in flight.
            let (outbox, inbox) = crate::fleet::outbox::outbox(cluster.sync_interval * 2);
            (Some(outbox), Some(inbox))
        }
        None => (None, None),
    };
    let resolver = crate::discovery::Resolver::new(config.resolver.as_ref());
    let mut found = crate::discovery::Found::default();
    crate::discovery::resolve(&resolver, crate::discovery::discovered(config), &mut found).await;
    let tracing = match &config.tracing {
        Some(t) => Some(crate::otel::Tracing::start(
            t,
            tokio::runtime::Handle::current(),
        )?),
        None => None,
    };
    let redis = match &config.cluster {
        Some(c) if config.virtual_keys.is_some() => Some(crate::cluster::redis_client(c)?),
        _ => None,
    };
    let keys = crate::keystore::KeyStore::open(config, redis).await?;
    let live = Arc::new(ArcSwap::from_pointee(Live::build(
        config, found, None, drained, outbox, tracing, keys,
    )?));
    Ok((live, inbox, resolver))
}

/// The gateway's periodic upkeep, until `stop` says so: the metrics' histograms drained, the
/// curves' stale first tokens forgotten, the oracle policy's truth refreshed, and the context
/// windows the backends report asked again.
fn upkeep_tasks(live: &Arc<ArcSwap<Live>>, stop: &watch::Sender<bool>) -> [JoinHandle<()>; 4] {
    // Histograms buffer samples until upkeep drains them: without a scraper they would grow.
    let upkeep = every(UPKEEP_EVERY, stop.subscribe(), |_| async {
        if let Some(handle) = crate::telemetry::prometheus() {
            handle.run_upkeep();
        }
    });
    // First tokens from a burst's queue are forgotten on time even where no traffic comes
    // to rebuild a curve (a backend that looks slow gets none); and a class whose SLO no
    // backend meets is told to the operator as soon as the curves show it.
    let forget_live = Arc::clone(live);
    let forget = every(FORGET_EVERY, stop.subscribe(), move |now| {
        let router = Arc::clone(&forget_live.load().router);
        async move {
            for backend in router.backends() {
                backend.forget_drained_queues(now);
            }
            router.warn_unmet_slos();
        }
    });
    let oracle_live = Arc::clone(live);
    let oracle = every(
        crate::router::oracle::REFRESH,
        stop.subscribe(),
        move |_| {
            let router = Arc::clone(&oracle_live.load().router);
            async move {
                if let Some(oracle) = router.oracle() {
                    oracle.refresh(router.backends()).await;
                }
            }
        },
    );
    // All backends at once: one that does not answer holds up no other.
    let windows_live = Arc::clone(live);
    let windows = every(
        crate::fleet::window::ASK_EVERY,
        stop.subscribe(),
        move |_| {
            let router = Arc::clone(&windows_live.load().router);
            async move {
                let asks = router
                    .backends()
                    .iter()
                    .filter(|b| b.windows.asks(&b.config));
                futures_util::future::join_all(asks.map(|b| crate::fleet::window::ask_models(b)))
                    .await;
            }
        },
    );
    [upkeep, forget, oracle, windows]
}

/// Runs `work` every `period` (its first time at once) until `stop` says so; a run under way
/// finishes first.
fn every<W, F>(period: Duration, mut stop: watch::Receiver<bool>, mut work: W) -> JoinHandle<()>
where
    W: FnMut(Instant) -> F + Send + 'static,
    F: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut every = tokio::time::interval(period);
        loop {
            tokio::select! {
                now = every.tick() => work(now).await,
                () = async { let _ = stop.wait_for(|s| *s).await; } => return,
            }
        }
    })
}

/// What the client-facing listener holds each connection to.
fn client_limits(limits: &crate::config::Limits) -> listen::Limits {
    listen::Limits {
        header_read_timeout: limits.header_read_timeout,
        max_header_bytes: limits.max_header_bytes,
        max_connections: limits.max_connections,
        drain: limits.drain_timeout,
        idle_timeout: limits.idle_timeout,
        client_write_timeout: limits.client_write_timeout,
    }
}
