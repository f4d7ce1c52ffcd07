//! `tpsgate keys`: the admin API of virtual keys from a shell (see [`super::keys`]).

use clap::{Args, Subcommand};
use http::Method;
use serde_json::{Map, Value, json};

use super::remote::Remote;

/// `tpsgate keys` arguments.
#[derive(Debug, Args)]
pub(crate) struct KeysArgs {
    /// The gateway's admin plane.
    #[arg(
        long,
        env = "TPSGATE_ADMIN_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub url: String,
    /// The environment variable holding the admin token (calls that change a key need it).
    #[arg(long, default_value = "TPSGATE_ADMIN_TOKEN")]
    pub token_env: String,
    /// Extra PEM roots for an https:// admin URL.
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub action: KeysAction,
}

/// `tpsgate keys` actions.
#[derive(Debug, Subcommand)]
pub(crate) enum KeysAction {
    /// Every key, the config's and the API's, with its usage.
    List,
    /// One key.
    Show {
        /// Its name.
        name: String,
    },
    /// Make a key; its secret is printed this once.
    Create {
        /// Its name: letters, digits, `.`, `_`, `-`.
        name: String,
        /// What it gives and may use.
        #[command(flatten)]
        spec: SpecFlags,
    },
    /// Change a key: only what is given changes.
    Update {
        /// Its name.
        name: String,
        /// What to change.
        #[command(flatten)]
        spec: SpecFlags,
    },
    /// Give a key a new secret (printed this once); the old one works for the grace.
    Rotate {
        /// Its name.
        name: String,
        /// Seconds the old secret keeps working (0: it stops at once).
        #[arg(long, default_value_t = 3600)]
        grace_s: i64,
    },
    /// Revoke a key: it stops working at once.
    Revoke {
        /// Its name.
        name: String,
    },
}

/// A key's fields as flags; each one given is sent, the rest are left as they are.
#[derive(Debug, Args)]
pub(crate) struct SpecFlags {
    /// The class its requests get.
    #[arg(long)]
    pub class: Option<String>,
    /// Other classes its requests may claim (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub classes: Option<Vec<String>>,
    /// The models it may ask for (comma-separated; default any).
    #[arg(long, value_delimiter = ',')]
    pub models: Option<Vec<String>>,
    /// Requests per minute.
    #[arg(long)]
    pub rpm: Option<u64>,
    /// Prompt and output tokens per minute.
    #[arg(long)]
    pub tpm: Option<u64>,
    /// Requests in flight at once.
    #[arg(long)]
    pub max_concurrency: Option<u64>,
    /// Dollars per budget period.
    #[arg(long)]
    pub budget_usd: Option<f64>,
    /// hour, day or month (UTC).
    #[arg(long)]
    pub budget_period: Option<String>,
    /// Its weight in a class's line.
    #[arg(long)]
    pub weight: Option<f64>,
    /// It stops working this many seconds from now.
    #[arg(long)]
    pub expires_in_s: Option<i64>,
    /// Any other fields, as a JSON object (e.g. '{"metadata": {"owner": "team-a"}}').
    #[arg(long)]
    pub json: Option<String>,
}

impl SpecFlags {
    /// The fields given, as the admin API takes them.
    fn body(&self) -> Result<Map<String, Value>, String> {
        let mut body = match &self.json {
            Some(text) => match serde_json::from_str(text) {
                Ok(Value::Object(fields)) => fields,
                _ => return Err("--json: a JSON object of the key's fields".to_owned()),
            },
            None => Map::new(),
        };
        let mut set = |field: &str, value: Option<Value>| {
            if let Some(value) = value {
                body.insert(field.to_owned(), value);
            }
        };
        set("class", self.class.as_ref().map(|c| json!(c)));
        set("classes", self.classes.as_ref().map(|c| json!(c)));
        set("models", self.models.as_ref().map(|m| json!(m)));
        set("weight", self.weight.map(|w| json!(w)));
        set(
            "expires_at_unix_s",
            self.expires_in_s
                .map(|s| json!(crate::tenant::unix_now().saturating_add(s))),
        );
        let limits: Map<String, Value> = [
            ("requests_per_minute", self.rpm.map(|n| json!(n))),
            ("tokens_per_minute", self.tpm.map(|n| json!(n))),
            ("max_concurrency", self.max_concurrency.map(|n| json!(n))),
            ("budget_usd", self.budget_usd.map(|n| json!(n))),
            (
                "budget_period",
                self.budget_period.as_ref().map(|p| json!(p)),
            ),
        ]
        .into_iter()
        .filter_map(|(field, value)| Some((field.to_owned(), value?)))
        .collect();
        if !limits.is_empty() {
            let merged = match body.remove("limits") {
                Some(Value::Object(mut given)) => {
                    given.extend(limits);
                    given
                }
                _ => limits,
            };
            body.insert("limits".to_owned(), Value::Object(merged));
        }
        Ok(body)
    }
}

/// Runs one `tpsgate keys` action: the gateway's answer.
pub(crate) async fn run(args: KeysArgs) -> Result<Value, String> {
    let remote = Remote::new(&args.url, Some(&args.token_env), false, args.ca_file)?;
    match args.action {
        KeysAction::List => remote.call(Method::GET, "/admin/keys", None).await,
        KeysAction::Show { name } => {
            remote
                .call(Method::GET, &format!("/admin/keys/{name}"), None)
                .await
        }
        KeysAction::Create { name, spec } => {
            let mut body = spec.body()?;
            body.insert("name".to_owned(), json!(name));
            remote
                .call(Method::POST, "/admin/keys", Some(&Value::Object(body)))
                .await
        }
        KeysAction::Update { name, spec } => {
            let body = Value::Object(spec.body()?);
            remote
                .call(Method::PATCH, &format!("/admin/keys/{name}"), Some(&body))
                .await
        }
        KeysAction::Rotate { name, grace_s } => {
            let body = json!({"grace_s": grace_s});
            remote
                .call(
                    Method::POST,
                    &format!("/admin/keys/{name}/rotate"),
                    Some(&body),
                )
                .await
        }
        KeysAction::Revoke { name } => {
            remote
                .call(Method::DELETE, &format!("/admin/keys/{name}"), None)
                .await
        }
    }
}
