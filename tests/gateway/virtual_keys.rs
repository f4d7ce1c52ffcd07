//! Virtual keys (`virtual_keys:`): API keys made, changed, rotated and revoked at runtime
//! through the admin API, kept in a file (or the cluster's Redis), beside the config's keys;
//! and `tpsgate keys`, the same calls from a shell.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use tpsgate::bench::http_client;

use super::keys::{chat, chat_for, held_stream};
use crate::support::{self, Redis};

/// The admin token of these gateways: `admin.token_env: ADMIN`, which the tests' environment
/// answers `key-of-ADMIN`.
const TOKEN: &str = "key-of-ADMIN";

/// The config of a gateway over the sim at `sim`, with a config key `ops`, and `store` (YAML
/// lines: `virtual_keys:` and, for Redis, `cluster:`).
fn config(sim: SocketAddr, store: &str) -> String {
    format!(
        "admin: {{listen: 127.0.0.1:0, token_env: ADMIN}}\nbackends:\n{}classes:\n  - {{name: chat}}\napi_keys:\n  - {{key_env: OPS, name: ops}}\n{store}",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    )
}

/// `method path` on the admin plane with `body`, with the admin token or without.
async fn admin(
    admin: SocketAddr,
    method: Method,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(b) = &bearer {
        headers.push(("authorization", b));
    }
    let body = body.map(|b| b.to_string());
    let ex = support::send(
        &http_client(None).unwrap(),
        admin,
        method,
        path,
        body.as_deref().map(str::as_bytes),
        &headers,
    )
    .await;
    (ex.status, ex.json())
}

/// Makes a key of `spec` (with its name) on `gw`: its secret.
async fn create(gw: &tpsgate::gateway::Gateway, spec: Value) -> String {
    let (status, made) = call(gw, Method::POST, "/admin/keys", Some(spec)).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    made["key"].as_str().unwrap().to_owned()
}

/// `method path` with `body` on `gw`'s admin plane, with the admin token.
async fn call(
    gw: &tpsgate::gateway::Gateway,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    admin(gw.admin_addr(), method, path, body, Some(TOKEN)).await
}

/// The status of a short chat through `gw` with `key`.
async fn answer(gw: &tpsgate::gateway::Gateway, key: &str) -> StatusCode {
    chat(gw.addr(), key, 4).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_through_the_admin_api_serves_at_once_within_its_limits_and_outlives_a_restart()
{
    let dir = tempfile::tempdir().unwrap();
    let (_fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let store = format!(
        "virtual_keys: {{file: {}}}\n",
        dir.path().join("keys.json").display()
    );
    let text = config(sim, &store);
    let gw = support::gateway(&text).await;
    let spec = json!({"name": "vk-a", "class": "chat", "models": ["m"],
        "limits": {"requests_per_minute": 100}, "metadata": {"owner": "a@example.com"}});

    // Without the admin token, nothing is made.
    let (status, refused) = admin(
        gw.admin_addr(),
        Method::POST,
        "/admin/keys",
        Some(spec.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_api_key", "{refused}");

    let key = create(&gw, spec.clone()).await;
    assert!(key.starts_with("sk-tps-"), "{key}");
    let ex = chat(gw.addr(), &key, 4).await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.headers["x-tpsgate-class"], "chat", "the key's class");
    assert_eq!(
        answer(&gw, "key-of-OPS").await,
        StatusCode::OK,
        "the config's keys work beside it"
    );
    let other = chat_for(gw.addr(), &key, "not-m", 4).await;
    assert_eq!(
        other.status,
        StatusCode::FORBIDDEN,
        "a model it may not use"
    );
    assert!(String::from_utf8_lossy(&other.body()).contains("may not use model `not-m`"));

    // The list shows its usage and spec, never its secret nor its digest.
    let (status, list) = call(&gw, Method::GET, "/admin/keys", None).await;
    assert_eq!(status, StatusCode::OK);
    let keys = list["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{list}");
    let made = keys.iter().find(|k| k["name"] == "vk-a").unwrap();
    assert_eq!(made["source"], "api");
    assert_eq!(made["requests_total"], 1, "{made}");
    assert_eq!(made["metadata"]["owner"], "a@example.com");
    assert!(!list.to_string().contains(&key[7..]), "{list}");
    assert!(!list.to_string().contains("sha256"), "{list}");
    let (status, again) = call(&gw, Method::POST, "/admin/keys", Some(spec)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");

    // A change applies to the next request: expired, then not.
    let past = json!({"expires_at_unix_s": 1});
    let (status, _) = call(&gw, Method::PATCH, "/admin/keys/vk-a", Some(past)).await;
    assert_eq!(status, StatusCode::OK);
    let expired = chat(gw.addr(), &key, 4).await;
    assert_eq!(expired.status, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&expired.body()).contains("expired"));
    let renewed = json!({"expires_at_unix_s": null, "limits": {"max_concurrency": 1}});
    let (status, changed) = call(&gw, Method::PATCH, "/admin/keys/vk-a", Some(renewed)).await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["limits"]["max_concurrency"], 1);
    assert_eq!(
        changed["limits"]["requests_per_minute"], 100,
        "what the patch did not name stays"
    );
    assert_eq!(answer(&gw, &key).await, StatusCode::OK);
    let (status, bad) = call(
        &gw,
        Method::PATCH,
        "/admin/keys/vk-a",
        Some(json!({"class": "gold"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("class:"),
        "{bad}"
    );

    // A restart reads the file back; the file holds no secret.
    gw.stop().await;
    let text_on_disk = std::fs::read_to_string(dir.path().join("keys.json")).unwrap();
    assert!(!text_on_disk.contains(&key), "{text_on_disk}");
    let gw = support::gateway(&text).await;
    assert_eq!(answer(&gw, &key).await, StatusCode::OK);

    // Rotation: the old secret works for its grace (none here), the new one at once.
    let (status, rotated) = call(
        &gw,
        Method::POST,
        "/admin/keys/vk-a/rotate",
        Some(json!({"grace_s": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    let new_key = rotated["key"].as_str().unwrap();
    assert_eq!(answer(&gw, &key).await, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(&gw, new_key).await, StatusCode::OK);
    let (_, graced) = call(&gw, Method::POST, "/admin/keys/vk-a/rotate", None).await;
    let newest = graced["key"].as_str().unwrap();
    assert_eq!(
        answer(&gw, new_key).await,
        StatusCode::OK,
        "the default grace is an hour"
    );
    assert_eq!(answer(&gw, newest).await, StatusCode::OK);

    // Revoked: both secrets stop at once.
    let (status, _) = call(&gw, Method::DELETE, "/admin/keys/vk-a", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer(&gw, newest).await, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(&gw, new_key).await, StatusCode::UNAUTHORIZED);
    let (status, _) = call(&gw, Method::DELETE, "/admin/keys/vk-a", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_or_revoked_on_one_replica_is_seen_by_the_others_within_a_second() {
    let redis = Redis::start().await;
    let (_fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let store = format!(
        "virtual_keys: {{}}\ncluster: {{redis_url: '{}', key_prefix: vk, sync_interval_ms: 20}}\n",
        redis.url()
    );
    let a = support::gateway(&config(sim, &store)).await;
    let b = support::gateway(&config(sim, &store)).await;
    let key = create(
        &a,
        json!({"name": "vk-b", "limits": {"max_concurrency": 1}}),
    )
    .await;
    let seen = |gw: SocketAddr, key: String, want: StatusCode| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
        loop {
            let status = chat(gw, &key, 2).await.status;
            if status == want || tokio::time::Instant::now() >= deadline {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert_eq!(
        seen(b.addr(), key.clone(), StatusCode::OK).await,
        StatusCode::OK
    );

    // Its limit is the fleet's: a stream held open through one replica fills it on the other.
    // First the chats above must have left both replicas' counts (a round may lag, and on a
    // machine busy with the rest of the suite, by seconds). A zero read before `a` ever saw
    // `b`'s chat proves nothing, so the count must stay zero for many rounds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut idle_since = None;
    loop {
        let (_, keys) = call(&a, Method::GET, "/admin/keys/vk-b", None).await;
        let now = tokio::time::Instant::now();
        if keys["in_flight"] == 0 && keys["peers_in_flight"] == 0 {
            let since = *idle_since.get_or_insert(now);
            if now - since >= Duration::from_millis(400) {
                break;
            }
        } else {
            idle_since = None;
        }
        if now >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = held_stream(a.addr(), &key, 2000).await;
    let full = seen(b.addr(), key.clone(), StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(
        full,
        StatusCode::TOO_MANY_REQUESTS,
        "max_concurrency 1 across both replicas"
    );
    drop(held);

    let (status, _) = admin(
        b.admin_addr(),
        Method::DELETE,
        "/admin/keys/vk-b",
        None,
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "revoked through the other replica");
    assert_eq!(
        seen(a.addr(), key, StatusCode::UNAUTHORIZED).await,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpsgate_keys_makes_lists_rotates_and_revokes_from_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let (_fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let store = format!(
        "virtual_keys: {{file: {}}}\n",
        dir.path().join("keys.json").display()
    );
    let gw = support::gateway(&config(sim, &store)).await;
    let url = format!("http://{}", gw.admin_addr());
    let keys = |args: &[&str], token: bool| {
        let mut command = support::tpsgate();
        command.args(["keys", "--url", &url]).args(args);
        if token {
            command.env("TPSGATE_ADMIN_TOKEN", TOKEN);
        } else {
            command.env_remove("TPSGATE_ADMIN_TOKEN");
        }
        let out = command.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.success(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, made, err) = keys(
        &[
            "create",
            "cli-key",
            "--rpm",
            "50",
            "--models",
            "m",
            "--json",
            r#"{"metadata": {"ticket": "OPS-1"}}"#,
        ],
        true,
    );
    assert!(ok, "{err}");
    let made: Value = serde_json::from_str(&made).unwrap();
    assert_eq!(made["limits"]["requests_per_minute"], 50);
    assert_eq!(made["metadata"]["ticket"], "OPS-1");
    let key = made["key"].as_str().unwrap().to_owned();
    assert_eq!(chat(gw.addr(), &key, 2).await.status, StatusCode::OK);

    let (ok, _, err) = keys(&["revoke", "cli-key"], false);
    assert!(!ok, "without the token nothing changes");
    assert!(err.contains("401"), "{err}");

    let (ok, listed, err) = keys(&["list"], true);
    assert!(ok, "{err}");
    assert!(
        listed.contains("cli-key") && !listed.contains(&key),
        "{listed}"
    );
    let (ok, updated, err) = keys(&["update", "cli-key", "--max-concurrency", "2"], true);
    assert!(ok, "{err}");
    assert!(updated.contains("\"max_concurrency\": 2"), "{updated}");
    let (ok, rotated, err) = keys(&["rotate", "cli-key", "--grace-s", "0"], true);
    assert!(ok, "{err}");
    let rotated: Value = serde_json::from_str(&rotated).unwrap();
    assert_eq!(
        chat(gw.addr(), &key, 2).await.status,
        StatusCode::UNAUTHORIZED
    );
    let (ok, _, err) = keys(&["revoke", "cli-key"], true);
    assert!(ok, "{err}");
    assert_eq!(
        chat(gw.addr(), rotated["key"].as_str().unwrap(), 2)
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let (ok, _, err) = keys(&["show", "cli-key"], true);
    assert!(!ok && err.contains("404"), "{err}");
}
