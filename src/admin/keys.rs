//! `/admin/keys`: every API key's limits and usage, and the admin API of virtual keys (see
//! [`crate::keystore`]):
//!
//! | call | does |
//! |---|---|
//! | `GET /admin/keys` | every key: the config's (`"source": "config"`) and the API's (`"api"`) |
//! | `GET /admin/keys/NAME` | one |
//! | `POST /admin/keys` | makes one (`{"name", ...spec}`); 201 with its secret, shown this once |
//! | `PATCH /admin/keys/NAME` | changes its spec (JSON merge patch) |
//! | `POST /admin/keys/NAME/rotate` | a new secret (`{"grace_s"}`: how long the old one still works) |
//! | `DELETE /admin/keys/NAME` | revokes it at once |
//!
//! A call that changes a key needs the admin token even where reading needs none.

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use super::AdminState;
use crate::keystore::{KeyError, Record, Spec};
use crate::live::Live;

/// The largest body a key call may send.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// The grace an old secret gets where a rotation names none: an hour to roll the new one out.
const DEFAULT_GRACE_S: i64 = 3600;

/// Answers a call under `/admin/keys` (the caller checked that it may read the admin data).
pub(super) async fn answer<B>(state: &AdminState, req: Request<B>) -> (StatusCode, Value)
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let live = state.live.load_full();
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let rest = path.strip_prefix("/admin/keys").unwrap_or("");
    let name = rest
        .strip_prefix('/')
        .map(|n| n.split('/').collect::<Vec<_>>());
    let method = req.method().clone();
    if method == Method::GET {
        return match name.as_deref() {
            None => (StatusCode::OK, json!({"keys": every_key(&live)})),
            Some([name]) => match one_key(&live, name) {
                Some(key) => (StatusCode::OK, key),
                None => error(&KeyError::NotFound(format!("no key is called `{name}`"))),
            },
            Some(_) => not_found(),
        };
    }
    if !super::holds_token(state, &req) {
        return (
            StatusCode::UNAUTHORIZED,
            json!({"error": {"message": "making or changing a key needs the admin token: send Authorization: Bearer TOKEN (admin.token_env or admin.token_file)", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        );
    }
    let body = match read_json(req).await {
        Ok(body) => body,
        Err(message) => return error(&KeyError::Invalid(message)),
    };
    let store = &live.keys;
    let result = match (method, name.as_deref()) {
        (Method::POST, None) => create(&live, body).await,
        (Method::PATCH, Some([name])) => store
            .update(name, &body, &live.config)
            .await
            .map(|r| (StatusCode::OK, r.view())),
        (Method::POST, Some([name, "rotate"])) => {
            let grace_s = match body.get("grace_s") {
                None | Some(Value::Null) => Ok(DEFAULT_GRACE_S),
                Some(v) => v.as_i64().ok_or_else(|| {
                    KeyError::Invalid("grace_s: a whole number of seconds".to_owned())
                }),
            };
            match grace_s {
                Ok(grace_s) => store
                    .rotate(name, grace_s)
                    .await
                    .map(|(secret, r)| (StatusCode::OK, with_secret(&r, secret.expose()))),
                Err(e) => Err(e),
            }
        }
        (Method::DELETE, Some([name])) => store
            .revoke(name)
            .await
            .map(|r| (StatusCode::OK, json!({"revoked": r.view()}))),
        (_, Some(_) | None) => return not_found(),
    };
    result.unwrap_or_else(|e| error(&e))
}

/// `POST /admin/keys`: `{"name", ...spec}`.
async fn create(live: &Live, mut body: Value) -> Result<(StatusCode, Value), KeyError> {
    let Some(Value::String(name)) = body.as_object_mut().and_then(|o| o.remove("name")) else {
        return Err(KeyError::Invalid(
            "name: every key needs a name (a string)".to_owned(),
        ));
    };
    let spec: Spec = serde_json::from_value(body).map_err(|e| KeyError::Invalid(e.to_string()))?;
    let (secret, record) = live.keys.create(&name, spec, &live.config).await?;
    Ok((StatusCode::CREATED, with_secret(&record, secret.expose())))
}

/// A key's view with its secret, the one time it is shown.
fn with_secret(record: &Record, secret: &str) -> Value {
    let mut view = record.view();
    if let Value::Object(fields) = &mut view {
        fields.insert("key".to_owned(), Value::from(secret));
        fields.insert(
            "note".to_owned(),
            Value::from("the key is shown this once: keep it now"),
        );
    }
    view
}

/// Every key: its usage, and for a virtual key its spec.
fn every_key(live: &Live) -> Vec<Value> {
    let now = tokio::time::Instant::now();
    let unix_s = crate::tenant::unix_now();
    // The config's keys come first in its tenants, its JWT tenants after them.
    let keys = live.config.api_keys.len();
    let mut all: Vec<Value> = live
        .tenants
        .usage(now, unix_s)
        .into_iter()
        .enumerate()
        .map(|(i, u)| {
            let mut v = json!(u);
            v["source"] = json!(if i < keys { "config" } else { "jwt" });
            v
        })
        .collect();
    for (record, tenant) in live.keys.listed() {
        all.push(merged(record.view(), json!(tenant.usage(now, unix_s))));
    }
    all
}

/// One key by name.
fn one_key(live: &Live, name: &str) -> Option<Value> {
    every_key(live)
        .into_iter()
        .find(|k| k["name"].as_str() == Some(name))
}

/// `view`'s fields with `usage`'s added.
fn merged(mut view: Value, usage: Value) -> Value {
    if let (Value::Object(v), Value::Object(u)) = (&mut view, usage) {
        for (field, value) in u {
            v.entry(field).or_insert(value);
        }
    }
    view
}

/// The body as JSON (an empty body as `{}`).
async fn read_json<B>(req: Request<B>) -> Result<Value, String>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let body = http_body_util::Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| format!("could not read the body (at most {MAX_BODY_BYTES} bytes): {e}"))?
        .to_bytes();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the body is not JSON: {e}"))
}

fn not_found() -> (StatusCode, Value) {
    error(&KeyError::NotFound(
        "no such key call: GET, POST /admin/keys; GET, PATCH, DELETE /admin/keys/NAME; POST /admin/keys/NAME/rotate".to_owned(),
    ))
}

/// A failed call in the OpenAI error shape.
fn error(e: &KeyError) -> (StatusCode, Value) {
    let (status, code, message) = match e {
        KeyError::Invalid(m) => (StatusCode::BAD_REQUEST, "invalid_request", m),
        KeyError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m),
        KeyError::Taken(m) => (StatusCode::CONFLICT, "key_exists", m),
        KeyError::Store(m) => (StatusCode::SERVICE_UNAVAILABLE, "key_store_unavailable", m),
    };
    let kind = if status.is_server_error() {
        "api_error"
    } else {
        "invalid_request_error"
    };
    (
        status,
        json!({"error": {"message": message, "type": kind, "code": code}}),
    )
}
