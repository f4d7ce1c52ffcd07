//! The config file watched: reloaded on SIGHUP and when its content changes, through the
//! [`Reloader`] (a file caught half-written fails validation, and the next write is another
//! change).

use std::path::PathBuf;
use std::time::Duration;

use super::Reloader;
use crate::signal::received;

/// How often the config file is looked at, and how long a change must stay put before it is
/// read (an editor or a deploy tool writing it in several steps).
const WATCH_EVERY: Duration = Duration::from_millis(500);
const SETTLE: Duration = Duration::from_millis(200);

/// A hash of the file's content, `None` when it cannot be read.
pub(crate) fn fingerprint(file: &std::path::Path) -> Option<u64> {
    use std::hash::{Hash as _, Hasher as _};
    let bytes = std::fs::read(file).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// Reloads the config on SIGHUP, and when the file's content changes (once per change: a file
/// caught half-written fails validation, and the next write is another change).
pub(crate) async fn reload_on_change(
    file: PathBuf,
    loaded: Option<u64>,
    reloader: Reloader,
    #[cfg(unix)] mut hangup: Option<tokio::signal::unix::Signal>,
) {
    let apply = async |why: &str| {
        tracing::info!(file = %file.display(), why, "reloading the config");
        // Whatever a file holds, the watcher goes on: a panic while reading or applying one is
        // a refused reload (logged, on /admin/reload), not the end of reloading.
        let attempt = std::panic::AssertUnwindSafe(async {
            match crate::config::load(&file) {
                Ok(config) => {
                    let _ = reloader.reload(&config).await;
                }
                Err(err) => {
                    let message = err.to_string();
                    tracing::error!(error = %message, "config reload refused; the running config stays");
                    reloader.refused(message);
                }
            }
        });
        if let Err(panic) = futures_util::FutureExt::catch_unwind(attempt).await {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            let message =
                format!("internal error while reloading (a bug; please report it): {what}");
            tracing::error!(error = %message, "config reload refused; the running config stays");
            reloader.refused(message);
        }
    };
    let mut seen = loaded;
    let mut every = tokio::time::interval(WATCH_EVERY);
    loop {
        #[cfg(unix)]
        let hup = received(&mut hangup);
        #[cfg(not(unix))]
        let hup = std::future::pending::<()>();
        tokio::select! {
            () = hup => {
                seen = fingerprint(&file);
                apply("SIGHUP").await;
            }
            _ = every.tick() => {
                let now = fingerprint(&file);
                if now == seen {
                    continue;
                }
                tokio::time::sleep(SETTLE).await;
                let settled = fingerprint(&file);
                if settled != now {
                    continue; // still being written: look again next tick
                }
                seen = settled;
                apply("the file changed").await;
            }
        }
    }
}
