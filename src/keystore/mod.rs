//! Virtual keys: API keys made, changed, rotated and revoked at runtime through the admin API
//! (`virtual_keys:`), beside the config's `api_keys`. Each is a [`Record`] kept in a file or the
//! cluster's Redis ([`backing`]) with its secret's digest only ([`secret`]); every replica holds
//! an [`Index`] of them by digest, which the request path reads without a lock, and swaps it
//! whole after each change (its own, or one it read from Redis, within a second).
//!
//! A key's usage and limits are a [`Tenant`] kept by its name across changes, as a config key's
//! are across reloads.

mod backing;
pub(crate) mod record;
pub(crate) mod secret;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

pub(crate) use backing::{Backing, RedisBacking};
pub(crate) use record::{Record, Spec};
use secret::Digest;

use crate::config::{Config, KeyGrant, Secret};
use crate::telemetry::OTHER_KEYS;
use crate::tenant::{Tenant, unix_now};

/// One virtual key as the request path sees it.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The class its requests get.
    pub class: Option<Arc<str>>,
    /// What they may claim.
    pub grant: Arc<KeyGrant>,
    /// Its limits and usage.
    pub tenant: Arc<Tenant>,
    /// When it stops working.
    pub expires_at_unix_s: Option<i64>,
}

/// A secret the index knows: its key, and until when it works where it was rotated out.
#[derive(Debug, Clone)]
struct Found {
    entry: Arc<Entry>,
    until: Option<i64>,
}

/// Why a presented key is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No key has this secret (or it was revoked, or its rotation's grace ended).
    Unknown,
    /// The key expired at this second.
    Expired(i64),
}

/// Every virtual key, by its secret's digest and by name.
#[derive(Debug, Default)]
struct Index {
    by_digest: HashMap<Digest, Found, foldhash::fast::RandomState>,
    records: BTreeMap<String, Arc<Record>>,
    tenants: Vec<Arc<Tenant>>,
}

/// Why an admin call on the keys failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// 400: the request is wrong; the message says which field and the fix.
    Invalid(String),
    /// 404: no key of that name.
    NotFound(String),
    /// 409: a key already has that name.
    Taken(String),
    /// 503: the store could not be written or read.
    Store(String),
}

/// The virtual keys of a gateway (none where `virtual_keys:` is off).
#[derive(Debug)]
pub(crate) struct KeyStore {
    backing: Option<Backing>,
    index: ArcSwap<Index>,
    /// One change at a time, from reading a record to swapping the index.
    changing: tokio::sync::Mutex<()>,
    /// Each key's tenant by name, kept across changes.
    tenants: Mutex<HashMap<String, Arc<Tenant>>>,
    /// How many keys' metrics may carry their own name (`admin.max_key_series` less the
    /// config's keys).
    labelled: usize,
}

/// How often a replica asks Redis whether the keys changed.
pub(crate) const FRESH_EVERY: Duration = Duration::from_secs(1);

/// The longest grace a rotation gives the old secret: 30 days.
const MAX_GRACE_S: i64 = 30 * 86_400;

impl KeyStore {
    /// No virtual keys: every lookup misses, every change is refused.
    pub(crate) fn off() -> Arc<Self> {
        Arc::new(Self::with(None, 0))
    }

    fn with(backing: Option<Backing>, labelled: usize) -> Self {
        Self {
            backing,
            index: ArcSwap::default(),
            changing: tokio::sync::Mutex::new(()),
            tenants: Mutex::default(),
            labelled,
        }
    }

    /// The keys of `config`'s `virtual_keys:`, loaded from its file, or from Redis through
    /// `redis` (the cluster's client) where it has `cluster:`. A file that cannot be read is an
    /// error; Redis out of reach at start is not (the keys are read once it answers).
    pub(crate) async fn open(
        config: &Config,
        redis: Option<redis::Client>,
    ) -> Result<Arc<Self>, String> {
        let Some(v) = &config.virtual_keys else {
            return Ok(Self::off());
        };
        let backing = match (&v.file, redis, &config.cluster) {
            (Some(file), _, _) => {
                let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
                if let Some(dir) = dir
                    && !dir.is_dir()
                {
                    return Err(format!(
                        "virtual_keys.file {}: the directory {} does not exist; create it, or name a file in one that does",
                        file.display(),
                        dir.display()
                    ));
                }
                Backing::File(file.clone())
            }
            (None, Some(client), Some(cluster)) => {
                Backing::Redis(Box::new(RedisBacking::new(client, &cluster.key_prefix)))
            }
            _ => return Err("virtual_keys: no file and no cluster to keep them in".to_owned()),
        };
        let labelled = config.max_key_series.saturating_sub(config.api_keys.len());
        let store = Arc::new(Self::with(Some(backing), labelled));
        match store.load().await {
            Ok(()) => {}
            Err(e) if matches!(store.backing, Some(Backing::Redis(_))) => {
                tracing::warn!(error = %e, "virtual keys: Redis out of reach at start; they are read once it answers");
            }
            Err(e) => return Err(e),
        }
        Ok(store)
    }

    /// Whether keys can be made here (`virtual_keys:` is on).
    pub(crate) fn is_on(&self) -> bool {
        self.backing.is_some()
    }

    /// The key whose secret is `given`, at `unix_s`.
    pub(crate) fn find(&self, given: &[u8], unix_s: i64) -> Result<Arc<Entry>, Denied> {
        let index = self.index.load();
        if index.by_digest.is_empty() {
            return Err(Denied::Unknown);
        }
        let found = index
            .by_digest
            .get(&secret::digest(given))
            .ok_or(Denied::Unknown)?;
        if found.until.is_some_and(|until| unix_s >= until) {
            return Err(Denied::Unknown);
        }
        match found.entry.expires_at_unix_s {
            Some(at) if unix_s >= at => Err(Denied::Expired(at)),
            _ => Ok(Arc::clone(&found.entry)),
        }
    }

    /// One key.
    pub(crate) fn record(&self, name: &str) -> Option<Arc<Record>> {
        self.index.load().records.get(name).cloned()
    }

    /// Every key's tenant, in name order.
    pub(crate) fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.index.load().tenants.clone()
    }

    /// Every key with its tenant, in name order, from one reading of the index.
    pub(crate) fn listed(&self) -> Vec<(Arc<Record>, Arc<Tenant>)> {
        let index = self.index.load();
        index
            .records
            .values()
            .cloned()
            .zip(index.tenants.iter().cloned())
            .collect()
    }

    /// Reads every key from the store and swaps the index.
    async fn load(&self) -> Result<(), String> {
        let Some(backing) = &self.backing else {
            return Ok(());
        };
        let records = backing.load().await?;
        self.swap(records);
        Ok(())
    }

    /// Keeps the index as Redis has it, asking every [`FRESH_EVERY`] whether the keys
    /// changed, until `stop` says so; nothing to do for a file (this process alone writes it).
    pub(crate) async fn keep_fresh(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some(Backing::Redis(redis)) = &self.backing else {
            return;
        };
        let mut seen: Option<i64> = None;
        let mut failing = false;
        let mut every = tokio::time::interval(FRESH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let result = match redis.version().await {
                Ok(v) if seen == Some(v) => Ok(()),
                Ok(v) => {
                    let _changing = self.changing.lock().await;
                    self.load().await.map(|()| seen = Some(v))
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("virtual keys: Redis answers again");
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "virtual keys: cannot read them from Redis; the last read stand");
                }
                _ => {}
            }
        }
    }

    /// Builds the index of `records`, each key's tenant kept by name (limits and weight
    /// changed in place), and swaps it in.
    fn swap(&self, records: BTreeMap<String, Record>) {
        let now = Instant::now();
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        tenants.retain(|name, _| records.contains_key(name));
        let mut index = Index::default();
        for (name, record) in records {
            let resolved = match record.spec.resolve() {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(key = %name, error = %e, "a stored virtual key does not validate; it is left out");
                    continue;
                }
            };
            let fresh_label = tenants.len() < self.labelled;
            let tenant = tenants
                .entry(name.clone())
                .and_modify(|t| t.set_limits(resolved.limits, now))
                .or_insert_with(|| {
                    let label: Arc<str> = if fresh_label {
                        name.as_str().into()
                    } else {
                        OTHER_KEYS.into()
                    };
                    Tenant::labelled(name.as_str().into(), label, resolved.limits, now)
                });
            tenant.set_weight(record.spec.weight);
            let entry = Arc::new(Entry {
                class: resolved.class,
                grant: resolved.grant,
                tenant: Arc::clone(tenant),
                expires_at_unix_s: record.spec.expires_at_unix_s,
            });
            if let Some(digest) = secret::from_hex(&record.sha256) {
                let found = Found {
                    entry: Arc::clone(&entry),
                    until: None,
                };
                index.by_digest.insert(digest, found);
            }
            if let Some(previous) = &record.previous
                && let Some(digest) = secret::from_hex(&previous.sha256)
            {
                let found = Found {
                    entry,
                    until: Some(previous.valid_until_unix_s),
                };
                index.by_digest.insert(digest, found);
            }
            index.tenants.push(Arc::clone(tenant));
            index.records.insert(name, Arc::new(record));
        }
        drop(tenants);
        self.index.store(Arc::new(index));
    }

    /// Makes a key called `name` of `spec`, checked against `config` (its classes; no config
    /// key may have the name): its secret, shown this once, and its record.
    pub(crate) async fn create(
        &self,
        name: &str,
        spec: Spec,
        config: &Config,
    ) -> Result<(Secret, Arc<Record>), KeyError> {
        if !record::valid_name(name) {
            return Err(KeyError::Invalid(
                "name: 1 to 64 letters, digits, `.`, `_` or `-`".to_owned(),
            ));
        }
        let tenants = config.jwt.iter().flat_map(|j| &j.tenants).map(|t| &t.name);
        if config
            .api_keys
            .iter()
            .map(|k| &k.name)
            .chain(tenants)
            .any(|n| **n == *name)
        {
            return Err(KeyError::Taken(format!(
                "a key or JWT tenant of the config is called `{name}`: give this one a name of its own"
            )));
        }
        check(&spec, config)?;
        let (secret, digest) = secret::generate()
            .ok_or_else(|| KeyError::Store("the system gave no randomness".to_owned()))?;
        let now = unix_now();
        let record = Record {
            name: name.to_owned(),
            sha256: secret::hex(&digest),
            previous: None,
            spec,
            created_at_unix_s: now,
            updated_at_unix_s: now,
        };
        let record = self.store(record, true).await?;
        tracing::info!(key = %name, "virtual key made");
        Ok((secret, record))
    }

    /// Changes the key called `name` by `patch` (JSON merge patch of its spec).
    pub(crate) async fn update(
        &self,
        name: &str,
        patch: &serde_json::Value,
        config: &Config,
    ) -> Result<Arc<Record>, KeyError> {
        let _changing = self.changing.lock().await;
        let mut record = self.current(name).await?;
        let spec = record.spec.patched(patch).map_err(KeyError::Invalid)?;
        check(&spec, config)?;
        record.spec = spec;
        record.updated_at_unix_s = unix_now();
        let record = self.write(record, false).await?;
        tracing::info!(key = %name, "virtual key changed");
        Ok(record)
    }

    /// Gives the key called `name` a new secret; the old one keeps working for `grace_s`.
    pub(crate) async fn rotate(
        &self,
        name: &str,
        grace_s: i64,
    ) -> Result<(Secret, Arc<Record>), KeyError> {
        if !(0..=MAX_GRACE_S).contains(&grace_s) {
            return Err(KeyError::Invalid(format!(
                "grace_s: from 0 (the old secret stops at once) to {MAX_GRACE_S} (30 days)"
            )));
        }
        let _changing = self.changing.lock().await;
        let mut record = self.current(name).await?;
        let (secret, digest) = secret::generate()
            .ok_or_else(|| KeyError::Store("the system gave no randomness".to_owned()))?;
        let now = unix_now();
        let old = std::mem::replace(&mut record.sha256, secret::hex(&digest));
        record.previous = (grace_s > 0).then_some(record::Previous {
            sha256: old,
            valid_until_unix_s: now + grace_s,
        });
        record.updated_at_unix_s = now;
        let record = self.write(record, false).await?;
        tracing::info!(key = %name, grace_s, "virtual key rotated");
        Ok((secret, record))
    }

    /// Revokes the key called `name`: its secrets stop working at once; its record goes.
    pub(crate) async fn revoke(&self, name: &str) -> Result<Arc<Record>, KeyError> {
        let _changing = self.changing.lock().await;
        let record = self.current(name).await?;
        let mut records = self.local();
        records.remove(name);
        match self.backing.as_ref() {
            Some(Backing::File(path)) => {
                backing::write_file(path, records.values().cloned().collect())
                    .await
                    .map_err(KeyError::Store)?;
            }
            Some(Backing::Redis(redis)) => {
                redis.remove(name).await.map_err(KeyError::Store)?;
            }
            None => return Err(off()),
        }
        self.swap(records);
        tracing::info!(key = %name, "virtual key revoked");
        Ok(Arc::new(record))
    }

    /// The record called `name` as the store has it now (Redis may know of a change this
    /// replica has not read yet).
    async fn current(&self, name: &str) -> Result<Record, KeyError> {
        let found = match self.backing.as_ref().ok_or_else(off)? {
            Backing::Redis(redis) => redis.get(name).await.map_err(KeyError::Store)?,
            Backing::File(_) => self.record(name).map(|r| (*r).clone()),
        };
        found.ok_or_else(|| KeyError::NotFound(format!("no virtual key is called `{name}`")))
    }

    /// Stores a new record, one change at a time.
    async fn store(&self, record: Record, fresh: bool) -> Result<Arc<Record>, KeyError> {
        let _changing = self.changing.lock().await;
        self.write(record, fresh).await
    }

    /// Writes `record` (with `fresh`, only where no key has its name) and swaps the index; the
    /// caller holds `changing`.
    async fn write(&self, record: Record, fresh: bool) -> Result<Arc<Record>, KeyError> {
        let name = record.name.clone();
        let taken = || KeyError::Taken(format!("a virtual key is already called `{name}`"));
        let mut records = self.local();
        match self.backing.as_ref().ok_or_else(off)? {
            Backing::File(path) => {
                if fresh && records.contains_key(&name) {
                    return Err(taken());
                }
                records.insert(name.clone(), record.clone());
                backing::write_file(path, records.values().cloned().collect())
                    .await
                    .map_err(KeyError::Store)?;
            }
            Backing::Redis(redis) => {
                if !redis.put(&record, fresh).await.map_err(KeyError::Store)? {
                    return Err(taken());
                }
                records.insert(name.clone(), record.clone());
            }
        }
        self.swap(records);
        Ok(Arc::new(record))
    }

    /// The records as this replica holds them, to change and store.
    fn local(&self) -> BTreeMap<String, Record> {
        let index = self.index.load();
        index
            .records
            .iter()
            .map(|(name, r)| (name.clone(), (**r).clone()))
            .collect()
    }
}

/// The refusal of a change where `virtual_keys:` is off.
fn off() -> KeyError {
    KeyError::Invalid(
        "virtual keys are off: add virtual_keys: to the config (with a file, or cluster:)"
            .to_owned(),
    )
}

/// A spec checked against the running config.
fn check(spec: &Spec, config: &Config) -> Result<(), KeyError> {
    let classes: Vec<&str> = config.classes.iter().map(|c| &*c.name).collect();
    spec.check_classes(&classes).map_err(KeyError::Invalid)?;
    spec.resolve().map(drop).map_err(KeyError::Invalid)
}

#[cfg(test)]
mod tests;
