//! The names of a fleet's keys in Redis: each carries the prefix in braces, so that on a Redis
//! Cluster they share one hash slot and one pipeline serves them.

/// The names of one fleet's keys in Redis (not API keys: those are [`super::api_keys`]).
#[derive(Debug, Clone)]
pub(crate) struct RedisKeys {
    pub(super) prefix: String,
    pub(super) sums: String,
    pub(super) leases: String,
    pub(super) samples: String,
    pub(super) health: String,
}

impl RedisKeys {
    /// The keys under `prefix`.
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            sums: format!("{{{prefix}}}:sums"),
            leases: format!("{{{prefix}}}:leases"),
            samples: format!("{{{prefix}}}:samples"),
            health: format!("{{{prefix}}}:health"),
        }
    }

    /// The hash of one replica's part of the sums.
    pub(super) fn part(&self, replica: &str) -> String {
        format!("{{{}}}:part:{replica}", self.prefix)
    }
}
