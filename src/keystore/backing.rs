//! Where virtual keys are kept: a local file, written whole and atomically (a new file beside it,
//! fsync, rename, fsync of the directory), or the cluster's Redis: one hash of every key's
//! record, and a version counter that each change raises in the same transaction, so that a
//! replica need only read one number a second to know whether to read the hash again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::AsyncCommands as _;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

use super::record::Record;

/// Where the keys are kept.
pub(crate) enum Backing {
    /// A JSON file.
    File(PathBuf),
    /// The cluster's Redis.
    Redis(Box<RedisBacking>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "File({})", path.display()),
            Self::Redis(r) => write!(f, "Redis({})", r.hash),
        }
    }
}

/// The keys file: every key, in name order.
#[derive(Serialize, Deserialize)]
struct KeysFile {
    version: u32,
    keys: Vec<Record>,
}

/// How long one Redis call may take before the admin call that needed it fails.
const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// The cluster's Redis, connected on first use.
pub(crate) struct RedisBacking {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    hash: String,
    version: String,
}

impl Backing {
    /// Every key kept, by name; a missing file holds none.
    pub(crate) async fn load(&self) -> Result<BTreeMap<String, Record>, String> {
        let records = match self {
            Self::File(path) => read_file(path)?,
            Self::Redis(r) => r.load().await?,
        };
        Ok(records.into_iter().map(|r| (r.name.clone(), r)).collect())
    }
}

fn read_file(path: &Path) -> Result<Vec<Record>, String> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("virtual_keys.file {}: {e}", path.display())),
    };
    let file: KeysFile = serde_json::from_slice(&text).map_err(|e| {
        format!(
            "virtual_keys.file {}: not a keys file ({e}); restore it from a backup, or move it away to start with no keys",
            path.display()
        )
    })?;
    Ok(file.keys)
}

/// Writes every key to `path` atomically: a reader (or a restart) sees the old file or the new
/// one, never part of either.
pub(crate) async fn write_file(path: &Path, records: Vec<Record>) -> Result<(), String> {
    let path = path.to_path_buf();
    let text = serde_json::to_vec_pretty(&KeysFile {
        version: 1,
        keys: records,
    })
    .map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || replace(&path, &text))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("could not write the keys file: {e}"))
}

fn replace(path: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let fresh = dir.join(format!(".{name}.new"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        // Digests only, but nobody else's business.
        .mode(0o600)
        .open(&fresh)?;
    file.write_all(text)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&fresh, path)?;
    std::fs::File::open(dir)?.sync_all()
}

impl RedisBacking {
    /// The keys of the fleet under `prefix`, through `client`.
    pub(crate) fn new(client: redis::Client, prefix: &str) -> Self {
        Self {
            client,
            conn: tokio::sync::Mutex::new(None),
            hash: format!("{{{prefix}}}:virtual_keys"),
            version: format!("{{{prefix}}}:virtual_keys:version"),
        }
    }

    async fn conn(&self) -> Result<ConnectionManager, String> {
        let mut held = self.conn.lock().await;
        if let Some(conn) = &*held {
            return Ok(conn.clone());
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(REDIS_TIMEOUT))
            .set_response_timeout(Some(REDIS_TIMEOUT))
            .set_number_of_retries(1);
        let conn = tokio::time::timeout(
            REDIS_TIMEOUT * 2,
            self.client.get_connection_manager_with_config(config),
        )
        .await
        .map_err(|_| "the cluster's Redis did not answer in time".to_owned())?
        .map_err(|e| format!("the cluster's Redis: {e}"))?;
        *held = Some(conn.clone());
        Ok(conn)
    }

    /// The version the keys are at (0 before the first change).
    pub(crate) async fn version(&self) -> Result<i64, String> {
        let mut conn = self.conn().await?;
        let v: Option<i64> = conn.get(&self.version).await.map_err(|e| e.to_string())?;
        Ok(v.unwrap_or(0))
    }

    async fn load(&self) -> Result<Vec<Record>, String> {
        let mut conn = self.conn().await?;
        let all: Vec<(String, String)> =
            conn.hgetall(&self.hash).await.map_err(|e| e.to_string())?;
        Ok(all
            .into_iter()
            .filter_map(|(name, json)| match serde_json::from_str(&json) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::warn!(key = %name, error = %e, "a virtual key in Redis is not a record; it is left out");
                    None
                }
            })
            .collect())
    }

    /// One key as Redis holds it now.
    pub(crate) async fn get(&self, name: &str) -> Result<Option<Record>, String> {
        let mut conn = self.conn().await?;
        let json: Option<String> = conn
            .hget(&self.hash, name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// Stores `record`; with `fresh`, only where no key has its name (false: one has).
    pub(crate) async fn put(&self, record: &Record, fresh: bool) -> Result<bool, String> {
        let json = serde_json::to_string(record).map_err(|e| e.to_string())?;
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        if fresh {
            pipe.hset_nx(&self.hash, &record.name, json);
        } else {
            pipe.hset(&self.hash, &record.name, json).ignore();
        }
        pipe.incr(&self.version, 1).ignore();
        if fresh {
            let (stored,): (bool,) = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(stored)
        } else {
            let () = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(true)
        }
    }

    /// Removes the key named `name`; false where there was none.
    pub(crate) async fn remove(&self, name: &str) -> Result<bool, String> {
        let mut conn = self.conn().await?;
        let (removed,): (u32,) = redis::pipe()
            .atomic()
            .hdel(&self.hash, name)
            .incr(&self.version, 1)
            .ignore()
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(removed > 0)
    }
}
