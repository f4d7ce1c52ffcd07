//! The fleet runner: several simulated backends served from one process, each on its own
//! listener, until stopped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use super::config::BackendSpec;
use super::engine::{Seat, SharedDevice};
use super::server::SimBackend;
use crate::listen;

/// Several simulated backends served from this process until stopped or dropped.
#[derive(Debug)]
pub struct Fleet {
    backends: Vec<(Arc<SimBackend>, SocketAddr)>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Binds every backend's address (all or none) and starts serving.
    pub async fn start(specs: &[BackendSpec]) -> io::Result<Self> {
        let mut listeners = Vec::with_capacity(specs.len());
        for spec in specs {
            let tls = match &spec.tls {
                Some((cert, key)) => {
                    Some(crate::tls::acceptor(cert, key).map_err(io::Error::other)?)
                }
                None => None,
            };
            listeners.push((listen::bind(spec.listen).await?, tls));
        }
        let (stop, _) = watch::channel(false);
        let mut backends = Vec::with_capacity(specs.len());
        let mut tasks = Vec::with_capacity(specs.len());
        let seats = seats(specs);
        for ((spec, (listener, tls)), seat) in specs.iter().zip(listeners).zip(seats) {
            let addr = listener.local_addr()?;
            let backend = SimBackend::new(spec, seat);
            let for_service = Arc::clone(&backend);
            let service = tower::service_fn(move |req| {
                let backend = Arc::clone(&for_service);
                async move { Ok::<_, Infallible>(backend.handle(req).await) }
            });
            let mut stopped = stop.subscribe();
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let limits = listen::Limits {
                // A simulator serves many thousands of streams in benchmarks.
                max_connections: 100_000,
                ..listen::Limits::default()
            };
            tasks.push(tokio::spawn(listen::serve(
                listener, tls, limits, service, shutdown,
            )));
            backends.push((backend, addr));
        }
        Ok(Self {
            backends,
            stop,
            tasks,
        })
    }

    /// Each backend's name and bound address, in config order.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = (&str, SocketAddr)> {
        self.backends.iter().map(|(b, a)| (b.name(), *a))
    }

    /// The address of the backend called `name`.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.addrs().find(|(n, _)| *n == name).map(|(_, a)| a)
    }

    /// The backend called `name`.
    pub fn backend(&self, name: &str) -> Option<&Arc<SimBackend>> {
        self.backends
            .iter()
            .map(|(b, _)| b)
            .find(|b| b.name() == name)
    }

    /// Stops accepting and waits (up to a second) for open connections to finish.
    pub(crate) async fn stop(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

/// Each backend's seat on the device it shares with the others naming it, in config order.
fn seats(specs: &[BackendSpec]) -> Vec<Option<Seat>> {
    let mut devices: HashMap<&str, (Arc<SharedDevice>, usize)> = HashMap::new();
    for name in specs.iter().filter_map(|s| s.device.as_deref()) {
        if !devices.contains_key(name) {
            let engines = specs
                .iter()
                .filter(|s| s.device.as_deref() == Some(name))
                .count();
            devices.insert(name, (SharedDevice::new(engines), 0));
        }
    }
    specs
        .iter()
        .map(|spec| {
            let (device, next) = devices.get_mut(spec.device.as_deref()?)?;
            let seat = device.seat(*next);
            *next += 1;
            Some(seat)
        })
        .collect()
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
