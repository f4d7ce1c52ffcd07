//! `api_keys[]`: each key from the environment, its class, its limits and budget.

use std::sync::Arc;

use super::{Errors, Lookup, Result, secret_from};
use crate::config::raw::RawConfig;
use crate::config::{ApiKey, Budget, KeyGrant, KeyLimits, Secret};
use crate::yaml::ConfigError;

/// `api_keys[]`: each entry, and names unique (a name keys the usage kept across reloads and
/// the metrics).
pub(super) fn api_keys(
    raw: &RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
    class_index: &Lookup<'_>,
    errors: &mut Errors,
) -> Vec<ApiKey> {
    let mut api_keys: Vec<ApiKey> = Vec::with_capacity(raw.api_keys.len());
    for (i, k) in raw.api_keys.iter().enumerate() {
        let at = format!("api_keys[{i}]");
        let Some(key) = errors.keep(api_key(&at, k, env, class_index)) else {
            continue;
        };
        if api_keys.iter().any(|other| other.name == key.name) {
            errors.0.push(ConfigError::at(
                format!("{at}.name"),
                format!(
                    "another key is already named {:?}: give each key a name of its own",
                    &*key.name
                ),
            ));
            continue;
        }
        api_keys.push(key);
    }
    api_keys
}

/// One `api_keys[]` entry: its key from the environment, its class and what it may claim.
fn api_key(
    at: &str,
    k: &crate::config::raw::RawApiKey,
    env: &dyn Fn(&str) -> Option<String>,
    class_index: &Lookup<'_>,
) -> Result<ApiKey> {
    let key = secret_from(
        env,
        Some(&k.key_env),
        &format!("{at}.key_env"),
        "remove this key",
    )?
    .unwrap_or_else(|| Secret::new(String::new()));
    let class = match &k.class {
        Some(name) => class_index(&format!("{at}.class"), name)?,
        None => None,
    };
    // Its own class always; others only where listed.
    let mut classes: Vec<usize> = class.into_iter().collect();
    for (j, name) in k.classes.iter().flatten().enumerate() {
        if let Some(index) = class_index(&format!("{at}.classes[{j}]"), name)?
            && !classes.contains(&index)
        {
            classes.push(index);
        }
    }
    let grant = Arc::new(KeyGrant {
        classes,
        slo_overrides: k.slo_overrides,
    });
    let name = match &k.name {
        Some(name) if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) => {
            return Err(ConfigError::at(
                format!("{at}.name"),
                "a key's name is 1 to 64 printable characters (it labels metrics)",
            ));
        }
        Some(name) => name.as_str(),
        None => k.key_env.as_str(),
    };
    Ok(ApiKey {
        key,
        name: name.into(),
        class,
        grant,
        limits: key_limits(&format!("{at}.limits"), &k.limits)?,
        weight: if k.weight.is_finite() && (0.001..=1000.0).contains(&k.weight) {
            k.weight
        } else {
            return Err(ConfigError::at(
                format!("{at}.weight"),
                "a weight is a number from 0.001 to 1000 (default 1: keys share a class's line equally)",
            ));
        },
    })
}

/// `api_keys[].limits`: each limit at least 1 where given; a period only with a budget.
fn key_limits(at: &str, raw: &crate::config::raw::RawKeyLimits) -> Result<KeyLimits> {
    let positive = |field: &str, value: Option<u64>| match value {
        Some(0) => Err(ConfigError::at(
            format!("{at}.{field}"),
            "must be at least 1 (leave it out for no limit)",
        )),
        _ => Ok(value),
    };
    let budget = match (raw.budget_usd, raw.budget_period) {
        (Some(usd), period) if usd.is_finite() && usd > 0.0 => Some(Budget {
            usd,
            period: period.unwrap_or_default(),
        }),
        (Some(_), _) => {
            return Err(ConfigError::at(
                format!("{at}.budget_usd"),
                "must be a number of dollars above 0 (leave it out for no budget)",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::at(
                format!("{at}.budget_period"),
                "a period needs a budget: set budget_usd, or remove budget_period",
            ));
        }
        (None, None) => None,
    };
    Ok(KeyLimits {
        requests_per_minute: positive("requests_per_minute", raw.requests_per_minute)?,
        tokens_per_minute: positive("tokens_per_minute", raw.tokens_per_minute)?,
        max_concurrency: positive("max_concurrency", raw.max_concurrency)?,
        budget,
    })
}
