//! A virtual key as stored: its name, what an operator set (its [`Spec`]), its secret's digest
//! (and the previous one's, during a rotation's grace), and when it was made and last changed.
//! Stored as JSON, in the keys file or in Redis; never the secret itself.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::config::raw::RawKeyLimits;
use crate::config::{KeyGrant, KeyLimits};

/// What an operator sets on a key: the fields of an `api_keys[]` entry (but `key_env`), and
/// an expiry and free-form metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Spec {
    /// The class its requests get, if none is claimed.
    #[serde(default)]
    pub class: Option<String>,
    /// Other classes its requests may claim.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Whether its requests may set their own SLO.
    #[serde(default)]
    pub slo_overrides: bool,
    /// The models its requests may ask for; absent: any.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Its limits and budget.
    #[serde(default)]
    pub limits: RawKeyLimits,
    /// Its weight in a class's line.
    #[serde(default = "one")]
    pub weight: f64,
    /// When it stops working, seconds since the Unix epoch; absent: never.
    #[serde(default)]
    pub expires_at_unix_s: Option<i64>,
    /// Whatever the operator keeps with it (an owner, a ticket); at most 4 KiB of JSON.
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

fn one() -> f64 {
    1.0
}

/// A rotated-out secret, still valid until its grace ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Previous {
    /// Its SHA-256, hex.
    pub sha256: String,
    /// When it stops working, seconds since the Unix epoch.
    pub valid_until_unix_s: i64,
}

/// A key as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Its name: unique among all keys, the handle of the admin API, its metrics' label.
    pub name: String,
    /// Its secret's SHA-256, hex.
    pub sha256: String,
    /// The secret it replaced, during the rotation's grace.
    #[serde(default)]
    pub previous: Option<Previous>,
    /// What the operator set.
    pub spec: Spec,
    /// When it was made, seconds since the Unix epoch.
    pub created_at_unix_s: i64,
    /// When it was last changed or rotated.
    pub updated_at_unix_s: i64,
}

/// The most metadata a key carries, as JSON.
const MAX_METADATA_BYTES: usize = 4096;

/// What a key gives its requests, resolved from its spec.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The class its requests get.
    pub class: Option<Arc<str>>,
    /// What they may claim.
    pub grant: Arc<KeyGrant>,
    /// Its limits.
    pub limits: KeyLimits,
}

impl Spec {
    /// Whether every class it names is one of `classes` (the running config's): a key is
    /// checked when it is made or changed; a reload that drops a class leaves its keys
    /// without it.
    pub(crate) fn check_classes(&self, classes: &[&str]) -> Result<(), String> {
        let named = self.class.iter().map(|c| ("class".to_owned(), c));
        let listed = self
            .classes
            .iter()
            .enumerate()
            .map(|(j, c)| (format!("classes[{j}]"), c));
        match named
            .chain(listed)
            .find(|(_, c)| !classes.contains(&c.as_str()))
        {
            None => Ok(()),
            Some((field, class)) => Err(format!(
                "{field}: no class is called `{class}`; configured: {}",
                if classes.is_empty() {
                    "none".to_owned()
                } else {
                    classes.join(", ")
                }
            )),
        }
    }

    /// What it gives its requests, by the same rules as an `api_keys[]` entry: every problem
    /// as `field: fix`.
    pub(crate) fn resolve(&self) -> Result<Resolved, String> {
        let mut granted: Vec<Arc<str>> = self.class.iter().map(|c| c.as_str().into()).collect();
        for class in &self.classes {
            if !granted.iter().any(|c| **c == **class) {
                granted.push(class.as_str().into());
            }
        }
        if !(self.weight.is_finite() && (0.001..=1000.0).contains(&self.weight)) {
            return Err("weight: a number from 0.001 to 1000 (default 1)".to_owned());
        }
        let json = |e: crate::yaml::ConfigError| format!("{}: {}", e.path, e.message);
        let models =
            crate::config::validate_key_models("models", self.models.as_deref()).map_err(json)?;
        let limits = crate::config::validate_key_limits("limits", &self.limits).map_err(json)?;
        if serde_json::to_string(&self.metadata).map_or(0, |s| s.len()) > MAX_METADATA_BYTES {
            return Err(format!(
                "metadata: at most {MAX_METADATA_BYTES} bytes of JSON"
            ));
        }
        Ok(Resolved {
            class: self.class.as_deref().map(Into::into),
            grant: Arc::new(KeyGrant {
                classes: granted,
                slo_overrides: self.slo_overrides,
                models,
            }),
            limits,
        })
    }

    /// This spec with `patch` merged in (JSON merge patch, RFC 7386: a field given replaces,
    /// `null` removes, an object merges field by field).
    pub(crate) fn patched(&self, patch: &Value) -> Result<Self, String> {
        if !patch.is_object() {
            return Err("the body is a JSON object of the fields to change".to_owned());
        }
        let mut doc = serde_json::to_value(self).map_err(|e| e.to_string())?;
        merge(&mut doc, patch);
        serde_json::from_value(doc).map_err(|e| e.to_string())
    }
}

/// RFC 7386's merge.
fn merge(doc: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *doc = patch.clone();
        return;
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Value::Object(target) = doc {
        for (name, value) in fields {
            if value.is_null() {
                target.remove(name);
            } else {
                merge(target.entry(name.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Whether `name` may name a key: 1 to 64 of letters, digits, `.`, `_` and `-` (it goes in URL
/// paths and metric labels unescaped).
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Record {
    /// What the admin API shows of it: everything but the digests.
    pub(crate) fn view(&self) -> Value {
        let mut view = serde_json::to_value(&self.spec).unwrap_or_default();
        if let Value::Object(fields) = &mut view {
            fields.insert("name".to_owned(), Value::from(self.name.as_str()));
            fields.insert("source".to_owned(), Value::from("api"));
            fields.insert(
                "created_at_unix_s".to_owned(),
                self.created_at_unix_s.into(),
            );
            fields.insert(
                "updated_at_unix_s".to_owned(),
                self.updated_at_unix_s.into(),
            );
            fields.insert(
                "previous_secret_valid_until_unix_s".to_owned(),
                self.previous
                    .as_ref()
                    .map_or(Value::Null, |p| p.valid_until_unix_s.into()),
            );
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: Value) -> Spec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_patch_replaces_what_it_names_removes_what_it_nulls_and_keeps_the_rest() {
        let before = spec(
            json!({"class": "chat", "limits": {"requests_per_minute": 10, "max_concurrency": 2}, "metadata": {"owner": "a"}}),
        );
        let after = before
            .patched(&json!({"limits": {"requests_per_minute": 60}, "metadata": {"owner": null}, "models": ["m"]}))
            .unwrap();
        assert_eq!(after.class.as_deref(), Some("chat"));
        assert_eq!(after.limits.requests_per_minute, Some(60));
        assert_eq!(
            after.limits.max_concurrency,
            Some(2),
            "a limit not named stays"
        );
        assert!(after.metadata.is_empty());
        assert_eq!(after.models, Some(vec!["m".to_owned()]));
        assert!(
            before.patched(&json!({"colour": "red"})).is_err(),
            "unknown fields are errors"
        );
        assert!(before.patched(&json!([1])).is_err());
    }

    #[test]
    fn a_spec_is_checked_against_the_classes_and_the_limits_rules() {
        let classes = ["chat"];
        let good = spec(json!({"class": "chat", "classes": ["chat"], "limits": {"budget_usd": 5}}));
        good.check_classes(&classes).unwrap();
        let ok = good.resolve().unwrap();
        assert_eq!(ok.grant.classes.len(), 1);
        assert_eq!(ok.limits.budget.map(|b| b.usd), Some(5.0));
        for (bad, field) in [
            (json!({"class": "batch"}), "class:"),
            (json!({"classes": ["batch"]}), "classes[0]:"),
            (
                json!({"limits": {"requests_per_minute": 0}}),
                "limits.requests_per_minute:",
            ),
            (json!({"models": []}), "models:"),
            (json!({"weight": 0}), "weight:"),
            (json!({"metadata": {"x": "y".repeat(5000)}}), "metadata:"),
        ] {
            let bad = spec(bad);
            let err = bad
                .check_classes(&classes)
                .and_then(|()| bad.resolve().map(drop))
                .unwrap_err();
            assert!(err.starts_with(field), "{err}");
        }
    }

    #[test]
    fn names_are_safe_in_paths_and_labels() {
        assert!(valid_name("team-a.prod_1"));
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
