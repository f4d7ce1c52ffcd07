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
    let (class, grant) = grant(
        at,
        k.class.as_deref(),
        k.classes.as_deref(),
        k.slo_overrides,
        k.models.as_deref(),
        class_index,
    )?;
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
        weight: weight(at, k.weight)?,
    })
}

/// The class a key (or a tenant) at `at` gives and what it may claim: its own class always,
/// the others listed, the models named.
fn grant(
    at: &str,
    class: Option<&str>,
    listed: Option<&[String]>,
    slo_overrides: bool,
    allowed: Option<&[String]>,
    class_index: &Lookup<'_>,
) -> Result<(Option<Arc<str>>, Arc<KeyGrant>)> {
    let class: Option<Arc<str>> = match class {
        Some(name) => class_index(&format!("{at}.class"), name)?.map(|_| name.into()),
        None => None,
    };
    let mut classes: Vec<Arc<str>> = class.iter().cloned().collect();
    for (j, name) in listed.into_iter().flatten().enumerate() {
        if class_index(&format!("{at}.classes[{j}]"), name)?.is_some()
            && !classes.iter().any(|c| **c == **name)
        {
            classes.push(name.as_str().into());
        }
    }
    let grant = Arc::new(KeyGrant {
        classes,
        slo_overrides,
        models: models(&format!("{at}.models"), allowed)?,
    });
    Ok((class, grant))
}

/// `jwt:`: the issuer, audience and key set URL, the claim naming a tenant, and each tenant by
/// an API key's rules; a tenant may not be named as a key is.
pub(super) fn jwt(
    raw: &crate::config::raw::RawJwt,
    keys: &[ApiKey],
    class_index: &Lookup<'_>,
) -> Result<crate::config::JwtConfig> {
    use crate::config::raw::OneOrMany;
    if raw.issuer.trim().is_empty() {
        return Err(ConfigError::at(
            "jwt.issuer",
            "name the issuer (the `iss` its tokens carry)",
        ));
    }
    let audience = match &raw.audience {
        OneOrMany::One(a) => vec![a.clone()],
        OneOrMany::Many(list) => list.clone(),
    };
    if audience.is_empty() || audience.iter().any(String::is_empty) {
        return Err(ConfigError::at(
            "jwt.audience",
            "name the audience (the `aud` this gateway's tokens carry)",
        ));
    }
    let jwks_url: http::Uri = raw.jwks_url.parse().ok().filter(|u: &http::Uri| {
        matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
    }).ok_or_else(|| ConfigError::at("jwt.jwks_url", format!("`{}` is not an http(s) URL: write the issuer's JWK set URL, e.g. https://issuer/.well-known/jwks.json", raw.jwks_url)))?;
    let tenant_claim: Vec<String> = raw.tenant_claim.split('.').map(str::to_owned).collect();
    if tenant_claim.iter().any(String::is_empty) {
        return Err(ConfigError::at(
            "jwt.tenant_claim",
            "a claim name, or a dotted path into nested claims (org.team)",
        ));
    }
    if raw.tenants.is_empty() {
        return Err(ConfigError::at(
            "jwt.tenants",
            "list the tenants a token may name (by the value of its tenant_claim)",
        ));
    }
    let mut tenants = Vec::with_capacity(raw.tenants.len());
    for (name, t) in &raw.tenants {
        let at = format!("jwt.tenants.{name}");
        if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            return Err(ConfigError::at(
                at,
                "a tenant's name is 1 to 64 printable characters (it labels metrics)",
            ));
        }
        if keys.iter().any(|k| *k.name == **name) {
            return Err(ConfigError::at(
                at,
                format!(
                    "an API key is already named {name:?}: tenants and keys share one set of names"
                ),
            ));
        }
        let (class, grant) = grant(
            &at,
            t.class.as_deref(),
            t.classes.as_deref(),
            t.slo_overrides,
            t.models.as_deref(),
            class_index,
        )?;
        tenants.push(crate::config::Identity {
            name: name.as_str().into(),
            class,
            grant,
            limits: key_limits(&format!("{at}.limits"), &t.limits)?,
            weight: weight(&at, t.weight)?,
        });
    }
    if raw.jwks_refresh_s == 0 || raw.jwks_refresh_s > 86_400 {
        return Err(ConfigError::at(
            "jwt.jwks_refresh_s",
            "from 1 to 86400 seconds (default 300)",
        ));
    }
    if raw.leeway_s > 600 {
        return Err(ConfigError::at(
            "jwt.leeway_s",
            "at most 600 seconds of clock skew (default 30)",
        ));
    }
    Ok(crate::config::JwtConfig {
        issuer: raw.issuer.clone(),
        audience,
        jwks_url,
        tenant_claim,
        tenants,
        jwks_refresh: std::time::Duration::from_secs(raw.jwks_refresh_s),
        leeway_s: raw.leeway_s,
    })
}

/// A weight in a class's line, at `at`.
fn weight(at: &str, weight: f64) -> Result<f64> {
    if weight.is_finite() && (0.001..=1000.0).contains(&weight) {
        Ok(weight)
    } else {
        Err(ConfigError::at(
            format!("{at}.weight"),
            "a weight is a number from 0.001 to 1000 (default 1: keys share a class's line equally)",
        ))
    }
}

/// `api_keys[].models`: the models a key may ask for, each named (an empty list would refuse
/// every request: leaving the field out allows any).
pub(crate) fn models(at: &str, models: Option<&[String]>) -> Result<Option<Vec<String>>> {
    match models {
        Some([]) => Err(ConfigError::at(
            at,
            "an empty list allows no model: name at least one, or leave models out to allow any",
        )),
        Some(list) => match list.iter().position(String::is_empty) {
            Some(j) => Err(ConfigError::at(
                format!("{at}[{j}]"),
                "a model name is not empty",
            )),
            None => Ok(Some(list.to_vec())),
        },
        None => Ok(None),
    }
}

/// `api_keys[].limits`: each limit at least 1 where given; a period only with a budget.
pub(crate) fn key_limits(at: &str, raw: &crate::config::raw::RawKeyLimits) -> Result<KeyLimits> {
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

/// `virtual_keys:`: a file to keep them in without `cluster:` (Redis keeps them with it), and
/// an admin token, which every call that changes a key needs.
pub(super) fn virtual_keys(
    v: &crate::config::raw::RawVirtualKeys,
    raw: &RawConfig,
    dir: &std::path::Path,
) -> Result<crate::config::VirtualKeys> {
    if raw.admin.token_env.is_none() && raw.admin.token_file.is_none() {
        return Err(ConfigError::at(
            "virtual_keys",
            "making and changing keys needs an admin token: set admin.token_env or admin.token_file",
        ));
    }
    match (&v.file, &raw.cluster) {
        (Some(_), Some(_)) => Err(ConfigError::at(
            "virtual_keys.file",
            "with cluster:, the keys live in its Redis for every replica to see: remove file",
        )),
        (None, None) => Err(ConfigError::at(
            "virtual_keys.file",
            "keys made through the admin API need a place that outlives a restart: name a file (e.g. /var/lib/tpsgate/keys.json), or configure cluster: to keep them in Redis",
        )),
        (file, _) => Ok(crate::config::VirtualKeys {
            file: file.as_ref().map(|f| dir.join(f)),
        }),
    }
}
