//! Backends found in DNS. A `backends[]` entry with `discovery: dns` is not a backend itself: it
//! stands for every address its URL's host resolves to (a Kubernetes headless Service has one
//! per ready pod), and each address is a backend of its own, named `NAME/ADDRESS`, with its own
//! curve, occupancy and health. One curve for a Service would describe the mixture of its pods:
//! one full and one idle would look like one half-loaded backend.
//!
//! [`Found`] holds the addresses last resolved for each entry, [`expand`] turns a config and
//! what was found into the backends the router sees, and [`resolve`] asks the
//! [`Resolver`]. The live state (`crate::live`) rebuilds itself when an answer changes: an
//! address that appears joins as a backend never observed (on its slow start, the fleet's
//! ramp, until its curve forms), one that vanishes gets no new requests while its streams finish.
//!
//! Above `config`, below `live`: no I/O but the resolver's.

mod resolver;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::Range;
use std::sync::Arc;

pub(crate) use resolver::Resolver;

use crate::config::{BackendConfig, Config};

/// The addresses last found for each discovered entry, by the entry's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Found(BTreeMap<Arc<str>, Addresses>);

/// What one entry's host resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Addresses {
    /// The host asked (a reload that changes an entry's URL asks again).
    host: String,
    /// Sorted, each once.
    list: Vec<IpAddr>,
}

impl Found {
    /// The addresses found for `entry`'s current host, if it has been resolved.
    pub(crate) fn addresses(&self, entry: &BackendConfig) -> Option<&[IpAddr]> {
        self.0
            .get(&entry.name)
            .filter(|a| a.host == host_of(entry))
            .map(|a| a.list.as_slice())
    }

    /// Records `list` as what `entry`'s host resolves to.
    pub(crate) fn set(&mut self, entry: &BackendConfig, mut list: Vec<IpAddr>) {
        list.sort_unstable();
        list.dedup();
        let host = host_of(entry).to_owned();
        self.0
            .insert(Arc::clone(&entry.name), Addresses { host, list });
    }

    /// `newer`'s answers over these, keeping only entries `config` still has with the same
    /// host.
    pub(crate) fn updated(&self, newer: &Self, config: &Config) -> Self {
        let mut merged = self.clone();
        merged
            .0
            .extend(newer.0.iter().map(|(k, v)| (Arc::clone(k), v.clone())));
        merged.0.retain(|name, addresses| {
            config
                .backends
                .iter()
                .any(|b| b.discovery.is_some() && b.name == *name && host_of(b) == addresses.host)
        });
        merged
    }

    /// The discovered entries of `config` not resolved yet.
    pub(crate) fn missing<'a>(
        &self,
        config: &'a Config,
    ) -> impl Iterator<Item = &'a BackendConfig> {
        discovered(config).filter(|b| self.addresses(b).is_none())
    }

    /// What changed from `before` to these, one line per entry (for the log).
    pub(crate) fn changes(&self, before: &Self) -> Vec<String> {
        let empty = Vec::new();
        let mut lines = Vec::new();
        for (name, now) in &self.0 {
            let was = before.0.get(name).map_or(&empty, |a| &a.list);
            let joined: Vec<_> = now.list.iter().filter(|a| !was.contains(a)).collect();
            let left: Vec<_> = was.iter().filter(|a| !now.list.contains(a)).collect();
            if !joined.is_empty() || !left.is_empty() {
                lines.push(format!("{name}: joined {joined:?}, left {left:?}"));
            }
        }
        lines
    }
}

/// The entries of `config` with `discovery`.
pub(crate) fn discovered(config: &Config) -> impl Iterator<Item = &BackendConfig> {
    config.backends.iter().filter(|b| b.discovery.is_some())
}

/// The host a discovered entry resolves: its URL's, without brackets.
fn host_of(entry: &BackendConfig) -> &str {
    entry.url.host().unwrap_or_default()
}

/// The backends `config` stands for, given what was `found`: each plain entry as it is, each
/// discovered one as one backend per address, in config order; and for each entry, the
/// positions of its backends among them (one, or its members).
pub(crate) fn expand(config: &Config, found: &Found) -> (Vec<BackendConfig>, Vec<Range<usize>>) {
    let mut backends = Vec::with_capacity(config.backends.len());
    let mut of_entry = Vec::with_capacity(config.backends.len());
    for entry in &config.backends {
        let first = backends.len();
        match entry.discovery {
            None => backends.push(entry.clone()),
            Some(_) => {
                let addresses = found.addresses(entry).unwrap_or_default();
                backends.extend(addresses.iter().map(|a| member(entry, *a)));
            }
        }
        of_entry.push(first..backends.len());
    }
    (backends, of_entry)
}

/// The backend at `address` of a discovered `entry`: the entry's every setting, its name with
/// the address, its connections dialled to the address under the entry's host name.
fn member(entry: &BackendConfig, address: IpAddr) -> BackendConfig {
    BackendConfig {
        name: Arc::from(format!("{}/{address}", entry.name)),
        discovery: None,
        dial: Some(address),
        device: None,
        ..entry.clone()
    }
}

/// Resolves each of `entries` into `found`. An entry whose host has no address (NXDOMAIN, or
/// no A/AAAA record) is set to none, so that its backends drain; one whose lookup failed
/// (timeout, server failure) is left as it was, logged: a resolver's hiccup must not empty a
/// fleet.
pub(crate) async fn resolve<'a>(
    resolver: &Resolver,
    entries: impl Iterator<Item = &'a BackendConfig>,
    found: &mut Found,
) {
    let entries: Vec<_> = entries.collect();
    let answers =
        futures_util::future::join_all(entries.iter().map(|entry| resolver.lookup(host_of(entry))))
            .await;
    for (entry, answer) in entries.into_iter().zip(answers) {
        match answer {
            Ok(list) => {
                if list.is_empty() {
                    tracing::warn!(backend = %entry.name, host = host_of(entry), "the host has no addresses: its backends drain");
                }
                found.set(entry, list);
            }
            Err(err) => {
                tracing::warn!(backend = %entry.name, host = host_of(entry), %err, "DNS lookup failed; the addresses found before stay");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!(
            "backends:\n  - name: pods\n    url: http://pods.example:8000\n    dialect: openai\n    models: {{m: m}}\n    discovery: dns\n  - name: hosted\n    url: https://api.example\n    dialect: openai\n    models: {{m: m}}\n{extra}"
        );
        crate::config::parse(&text, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn each_address_is_a_backend_named_after_it_and_dialled_under_the_entrys_host() {
        let config = config("");
        let mut found = Found::default();
        found.set(
            &config.backends[0],
            vec![ip("10.0.0.9"), ip("10.0.0.7"), ip("10.0.0.9")],
        );
        let (backends, _) = expand(&config, &found);
        let names: Vec<_> = backends.iter().map(|b| &*b.name).collect();
        assert_eq!(names, ["pods/10.0.0.7", "pods/10.0.0.9", "hosted"]);
        assert_eq!(backends[0].dial, Some(ip("10.0.0.7")));
        assert_eq!(
            backends[0].url, config.backends[0].url,
            "the host stays for TLS and Host"
        );
        assert_eq!(backends[0].host, config.backends[0].host);
        assert!(backends.iter().all(|b| b.discovery.is_none()));
        assert_eq!(backends[2], config.backends[1]);
    }

    #[test]
    fn an_entry_not_resolved_yet_has_no_backends_and_is_missing() {
        let config = config("");
        let found = Found::default();
        let (backends, _) = expand(&config, &found);
        assert_eq!(backends.len(), 1);
        let missing: Vec<_> = found.missing(&config).map(|b| &*b.name).collect();
        assert_eq!(missing, ["pods"]);
    }

    #[test]
    fn each_entry_knows_its_backends_one_or_its_members() {
        let config = config("");
        let mut found = Found::default();
        found.set(&config.backends[0], vec![ip("10.0.0.1"), ip("10.0.0.2")]);
        assert_eq!(expand(&config, &found).1, [0..2, 2..3]);
        assert_eq!(expand(&config, &Found::default()).1, [0..0, 0..1]);
    }

    #[test]
    fn answers_for_a_host_the_entry_no_longer_names_are_dropped() {
        let before = config("");
        let mut found = Found::default();
        found.set(&before.backends[0], vec![ip("10.0.0.1")]);
        let moved = crate::config::parse(
            "backends:\n  - name: pods\n    url: http://other.example:8000\n    dialect: openai\n    models: {m: m}\n    discovery: dns\n",
            |_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found.addresses(&moved.backends[0]), None);
        let kept = found.updated(&Found::default(), &moved);
        assert_eq!(kept, Found::default());
        assert_eq!(found.updated(&Found::default(), &before), found);
    }

    #[test]
    fn changes_name_who_joined_and_who_left() {
        let config = config("");
        let mut before = Found::default();
        before.set(&config.backends[0], vec![ip("10.0.0.1"), ip("10.0.0.2")]);
        let mut after = Found::default();
        after.set(&config.backends[0], vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(
            after.changes(&before),
            ["pods: joined [10.0.0.3], left [10.0.0.1]"]
        );
        assert!(after.changes(&after).is_empty());
    }
}
