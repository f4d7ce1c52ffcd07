use serde_json::json;

use super::*;

/// A config with `virtual_keys:` kept in `file`, one class `chat`, and a config key `ops`.
fn config(file: &std::path::Path) -> Config {
    let text = format!(
        "backends:\n  - {{name: a, url: 'http://127.0.0.1:9', dialect: openai, models: {{m: m}}}}\nclasses:\n  - {{name: chat}}\napi_keys:\n  - {{key_env: OPS, name: ops}}\nadmin: {{token_env: ADMIN}}\nvirtual_keys: {{file: {}}}\n",
        file.display()
    );
    crate::config::parse(&text, |_| Some("x".to_owned())).unwrap()
}

fn spec(value: serde_json::Value) -> Spec {
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn a_key_made_works_at_once_and_its_file_keeps_only_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.json");
    let config = config(&file);
    let store = KeyStore::open(&config, None).await.unwrap();
    let (secret, record) = store
        .create(
            "team-a",
            spec(json!({"class": "chat", "limits": {"requests_per_minute": 5}})),
            &config,
        )
        .await
        .unwrap();
    let now = unix_now();
    let entry = store.find(secret.expose().as_bytes(), now).unwrap();
    assert_eq!(entry.class.as_deref(), Some("chat"));
    assert_eq!(entry.tenant.limits().requests_per_minute, Some(5));
    assert_eq!(
        store.find(b"sk-tps-nope", now).unwrap_err(),
        Denied::Unknown
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        !text.contains(secret.expose()),
        "the file never holds a secret"
    );
    assert!(text.contains(&record.sha256));
    assert!(
        !record.view().to_string().contains(&record.sha256),
        "nor does the view"
    );

    // A restart reads the file back.
    let again = KeyStore::open(&config, None).await.unwrap();
    assert!(again.find(secret.expose().as_bytes(), now).is_ok());
}

#[tokio::test]
async fn names_are_unique_among_all_keys_and_specs_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir.path().join("keys.json"));
    let store = KeyStore::open(&config, None).await.unwrap();
    store.create("a", spec(json!({})), &config).await.unwrap();
    for (name, value) in [
        ("a", json!({})),
        ("ops", json!({})),
        ("b c", json!({})),
        ("b", json!({"class": "batch"})),
        ("b", json!({"limits": {"budget_period": "day"}})),
    ] {
        let err = store.create(name, spec(value), &config).await.unwrap_err();
        assert!(
            matches!(err, KeyError::Taken(_) | KeyError::Invalid(_)),
            "{name}: {err:?}"
        );
    }
    assert_eq!(store.listed().len(), 1, "nothing refused was kept");
}

#[tokio::test]
async fn a_change_keeps_the_usage_a_rotation_keeps_the_old_secret_for_its_grace_and_a_revocation_ends_both()
 {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir.path().join("keys.json"));
    let store = KeyStore::open(&config, None).await.unwrap();
    let (old, _) = store.create("k", spec(json!({})), &config).await.unwrap();
    let tenant = Arc::clone(
        &store
            .find(old.expose().as_bytes(), unix_now())
            .unwrap()
            .tenant,
    );

    let changed = store
        .update(
            "k",
            &json!({"limits": {"max_concurrency": 3}, "models": ["m"]}),
            &config,
        )
        .await
        .unwrap();
    assert_eq!(changed.spec.limits.max_concurrency, Some(3));
    let entry = store.find(old.expose().as_bytes(), unix_now()).unwrap();
    assert!(
        Arc::ptr_eq(&entry.tenant, &tenant),
        "its usage is the same tenant's"
    );
    assert_eq!(entry.tenant.limits().max_concurrency, Some(3));
    assert_eq!(entry.grant.models.as_deref(), Some(&["m".to_owned()][..]));
    assert!(matches!(
        store.update("nobody", &json!({}), &config).await,
        Err(KeyError::NotFound(_))
    ));

    let (new, record) = store.rotate("k", 60).await.unwrap();
    let now = unix_now();
    assert!(store.find(new.expose().as_bytes(), now).is_ok());
    assert!(
        store.find(old.expose().as_bytes(), now).is_ok(),
        "within its grace"
    );
    let until = record.previous.as_ref().unwrap().valid_until_unix_s;
    assert_eq!(
        store.find(old.expose().as_bytes(), until).unwrap_err(),
        Denied::Unknown
    );
    let (newest, _) = store.rotate("k", 0).await.unwrap();
    assert!(
        store.find(new.expose().as_bytes(), now).is_err(),
        "no grace: gone at once"
    );

    store.revoke("k").await.unwrap();
    assert!(store.find(newest.expose().as_bytes(), now).is_err());
    assert!(store.listed().is_empty());
    assert!(matches!(
        store.revoke("k").await,
        Err(KeyError::NotFound(_))
    ));
}

#[tokio::test]
async fn an_expired_key_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir.path().join("keys.json"));
    let store = KeyStore::open(&config, None).await.unwrap();
    let at = unix_now() + 100;
    let (secret, _) = store
        .create("k", spec(json!({"expires_at_unix_s": at})), &config)
        .await
        .unwrap();
    assert!(store.find(secret.expose().as_bytes(), at - 1).is_ok());
    assert_eq!(
        store.find(secret.expose().as_bytes(), at).unwrap_err(),
        Denied::Expired(at)
    );
}

#[tokio::test]
async fn a_keys_file_that_is_not_one_stops_the_start_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.json");
    std::fs::write(&file, "{not json").unwrap();
    let err = KeyStore::open(&config(&file), None).await.unwrap_err();
    assert!(
        err.contains("virtual_keys.file") && err.contains("restore it"),
        "{err}"
    );
    let missing = config(&dir.path().join("no/such/dir/keys.json"));
    let err = KeyStore::open(&missing, None).await.unwrap_err();
    assert!(err.contains("does not exist"), "{err}");
}
