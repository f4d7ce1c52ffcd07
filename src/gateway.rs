//! A running gateway: the client-facing listener with the request stack, and the admin listener,
//! until stopped. `tpsgate serve` and the integration tests both start it through here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminState};
use crate::config::Config;
use crate::listen;
use crate::proxy::classify::Classes;
use crate::router::Router;
use crate::router::queue::Line;
use crate::stack;
use crate::upstream::Backend;

/// How often the metrics recorder's buffers are drained.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The gateway, serving until [`Gateway::stop`] or drop.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    tls: bool,
    admin: Arc<AdminState>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Gateway {
    /// Builds every backend's client, binds both listeners (or fails without serving anything)
    /// and starts serving.
    pub async fn start(config: &Config) -> Result<Self, String> {
        let line = Arc::new(Line::new(config.classes.len()));
        let backends = config
            .backends
            .iter()
            .map(|b| {
                Backend::new(
                    b.clone(),
                    config.curve_half_life_s,
                    config.classes.len(),
                    Arc::clone(&line),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let router = Arc::new(Router::new(
            backends,
            config.default_backend,
            config.classes.clone(),
            config.routing,
            line,
        ));
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
            router: Arc::clone(&router),
            ready: AtomicBool::new(true),
            token: config.admin_token.clone(),
        });
        let has_tls = tls.is_some();
        let classes = Classes::new(
            config.classes.clone(),
            config.default_class,
            config.routes.clone(),
        );
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
            stack::build(
                Arc::clone(&router),
                limits,
                classes,
                config.api_keys.clone(),
            ),
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
        let mut tasks = vec![proxy, admin_task, upkeep];
        if router.oracle().is_some() {
            let mut stopped_oracle = stop.subscribe();
            tasks.push(tokio::spawn(async move {
                let mut every = tokio::time::interval(crate::router::oracle::REFRESH);
                loop {
                    tokio::select! {
                        _ = every.tick() => {
                            if let Some(oracle) = router.oracle() {
                                oracle.refresh(router.backends()).await;
                            }
                        }
                        () = async { let _ = stopped_oracle.wait_for(|s| *s).await; } => return,
                    }
                }
            }));
        }
        Ok(Self {
            addr,
            admin_addr,
            tls: has_tls,
            admin,
            stop,
            tasks,
        })
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
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
