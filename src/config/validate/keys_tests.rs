//! `api_keys`, `virtual_keys`, `jwt` and the admin token: what each takes, and the errors
//! that name the field and the fix.

use super::super::parse;

const BASE: &str = "backends:\n  - name: a\n    url: http://127.0.0.1:9101/\n    dialect: openai\n    models: {small: upstream-small}\n";

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn virtual_keys_need_an_admin_token_and_one_place_to_live() {
    let env = |_: &str| Some("t".to_owned());
    let with = |extra: &str| parse(&format!("{BASE}{extra}"), env);
    let err = with("virtual_keys: {file: keys.json}\n").unwrap_err();
    assert_eq!(err.path, "virtual_keys");
    assert!(err.message.contains("admin.token_env"), "{}", err.message);
    let err = with("admin: {token_env: T}\nvirtual_keys: {}\n").unwrap_err();
    assert_eq!(err.path, "virtual_keys.file");
    let err = with("admin: {token_env: T}\nvirtual_keys: {file: k.json}\ncluster: {redis_url: 'redis://127.0.0.1:1'}\n").unwrap_err();
    assert_eq!(err.path, "virtual_keys.file");
    assert!(err.message.contains("remove file"), "{}", err.message);
    let c = with("admin: {token_env: T}\nvirtual_keys: {file: k.json}\n").unwrap();
    assert!(c.virtual_keys.unwrap().file.unwrap().ends_with("k.json"));
}

#[test]
fn the_admin_token_may_come_from_a_file_but_not_from_two_places() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "  s3cret\n").unwrap();
    let text = format!("{BASE}admin: {{token_file: {}}}\n", file.display());
    let c = parse(&text, no_env).unwrap();
    assert_eq!(c.admin_token.unwrap().expose(), "s3cret");
    let both = text.replace("{token_file", "{token_env: T, token_file");
    let err = parse(&both, |_| Some("t".to_owned())).unwrap_err();
    assert_eq!(err.path, "admin.token_file");
    std::fs::write(&file, "\n").unwrap();
    assert_eq!(parse(&text, no_env).unwrap_err().path, "admin.token_file");
}

#[test]
fn a_key_may_be_held_to_some_models() {
    let env = |_: &str| Some("sk".to_owned());
    let c = parse(
        &format!("{BASE}api_keys:\n  - {{key_env: A, models: [small]}}\n"),
        env,
    )
    .unwrap();
    assert_eq!(
        c.api_keys[0].grant.models.as_deref(),
        Some(&["small".to_owned()][..])
    );
    let err = parse(
        &format!("{BASE}api_keys:\n  - {{key_env: A, models: []}}\n"),
        env,
    )
    .unwrap_err();
    assert_eq!(err.path, "api_keys[0].models");
}

#[test]
fn jwt_names_its_issuer_audience_key_set_and_tenants() {
    let jwt = |extra: &str| {
        format!(
            "{BASE}classes:\n  - {{name: chat}}\napi_keys:\n  - {{key_env: K, name: ops}}\njwt:\n  issuer: https://id.example\n  audience: [gw, gw2]\n  jwks_url: https://id.example/jwks.json\n  tenant_claim: org.team\n  tenants:\n    team-a: {{class: chat, limits: {{requests_per_minute: 5}}}}\n{extra}"
        )
    };
    let env = |_: &str| Some("k".to_owned());
    let c = parse(&jwt(""), env).unwrap();
    let j = c.jwt.unwrap();
    assert_eq!(j.audience, ["gw", "gw2"]);
    assert_eq!(j.tenant_claim, ["org", "team"]);
    assert_eq!(j.tenants[0].class.as_deref(), Some("chat"));
    assert_eq!(j.tenants[0].limits.requests_per_minute, Some(5));
    for (bad, field) in [
        (
            "jwks_url: https://id.example/jwks.json",
            "jwks_url: ftp://x",
        ),
        ("class: chat", "class: gold"),
        ("team-a:", "ops:"),
        ("tenant_claim: org.team", "tenant_claim: org..team"),
    ] {
        let text = jwt("").replace(bad, field);
        let err = parse(&text, env).unwrap_err();
        assert!(
            err.path.starts_with("jwt."),
            "{bad} -> {field}: {} {}",
            err.path,
            err.message
        );
    }
    let err = parse(&jwt("  leeway_s: 9000\n"), env).unwrap_err();
    assert_eq!(err.path, "jwt.leeway_s");
}
