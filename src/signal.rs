//! Signals: a one-time [`Signal`] that many tasks wait on (graceful shutdown beginning, the
//! drain deadline passing), and the process's own (Ctrl-C, SIGTERM, SIGHUP).
//!
//! tokio-util's `CancellationToken` wakes its waiters well, but answers `is_cancelled` under its
//! node's mutex, one mutex that every clone shares; connections and streams ask on every pending
//! read, so here the answer is one atomic load, and the token only wakes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// A signal that fires once; cloning shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Signal(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    fired: AtomicBool,
    wake: CancellationToken,
}

impl Signal {
    /// An unfired signal.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Fires it: every waiter wakes, and [`Signal::has_fired`] says so from then on.
    pub(crate) fn fire(&self) {
        // Set before the wake-up, so that a woken task reads it.
        self.0.fired.store(true, Ordering::Release);
        self.0.wake.cancel();
    }

    /// Whether it has fired.
    pub(crate) fn has_fired(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }

    /// A future that completes once it has fired.
    pub(crate) fn fired(&self) -> WaitForCancellationFutureOwned {
        self.0.wake.clone().cancelled_owned()
    }
}

/// Resolves on Ctrl-C or SIGTERM, listened for from the moment this is called, not from the
/// first poll: a signal that comes before its handler is registered takes its default action
/// and kills the process, streams and all. Servers call it before they say they listen.
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        async move {
            tokio::select! {
                () = received(&mut interrupt) => {}
                () = received(&mut terminate) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The next delivery of `signal`; never, when it could not be registered.
#[cfg(unix)]
pub(crate) async fn received(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_made_before_the_signal_fires_wakes_and_sees_it() {
        let signal = Signal::new();
        let waiter = signal.fired();
        let clone = signal.clone();
        assert!(!clone.has_fired());
        tokio::spawn(async move { signal.fire() });
        waiter.await;
        assert!(clone.has_fired());
        clone.fired().await; // and one made after returns at once
    }
}
