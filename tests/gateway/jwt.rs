//! JWT bearer tokens as identities (`jwt:`): a token of the issuer, for the gateway's audience,
//! names its tenant in a claim and gets that tenant's class and limits; a token refused says
//! why without echoing it; the gateway follows the issuer's key rotation, fetching its key set
//! (served here on loopback) again for a key it does not hold.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use http::{Method, StatusCode};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _,
};
use serde_json::{Value, json};
use tpsgate::bench::http_client;

use super::keys::chat;
use crate::support::{self, raw_backend};

const ISSUER: &str = "https://issuer.test";

/// A signing key of the issuer, and its public half as a JWK.
struct Signer {
    kid: &'static str,
    alg: Algorithm,
    key: EncodingKey,
    jwk: Value,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn ed25519(kid: &'static str) -> Signer {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let x = b64(pair.public_key().as_ref());
    Signer {
        kid,
        alg: Algorithm::EdDSA,
        key: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}),
    }
}

fn p256(kid: &'static str) -> Signer {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    // Uncompressed: 0x04, then x and y.
    let point = pair.public_key().as_ref();
    Signer {
        kid,
        alg: Algorithm::ES256,
        key: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({"kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..]), "kid": kid}),
    }
}

/// A 2048-bit RSA key made for these tests alone (ring makes no RSA keys).
fn rsa(kid: &'static str) -> Signer {
    let der = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/jwt-rsa-test-only.der"
    ))
    .unwrap();
    let public: Value =
        serde_json::from_str(include_str!("../fixtures/jwt-rsa-test-only.pub.json")).unwrap();
    Signer {
        kid,
        alg: Algorithm::RS256,
        key: EncodingKey::from_rsa_der(&der),
        jwk: json!({"kty": "RSA", "n": public["n"], "e": public["e"], "kid": kid, "alg": "RS256"}),
    }
}

impl Signer {
    /// A token of `claims` over the defaults (the issuer, the gateway's audience, an hour).
    fn token(&self, claims: Value) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut all = json!({"iss": ISSUER, "aud": "tpsgate", "exp": now + 3600, "iat": now});
        if let Value::Object(fields) = claims {
            for (k, v) in fields {
                all[k] = v;
            }
        }
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.to_owned());
        jsonwebtoken::encode(&header, &all, &self.key).unwrap()
    }
}

/// The issuer's key set on loopback: what it publishes now, and how often it was asked.
struct Issuer {
    addr: SocketAddr,
    published: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicUsize>,
}

impl Issuer {
    async fn start(keys: &[&Signer]) -> Self {
        let published = Arc::new(Mutex::new(keys.iter().map(|s| s.jwk.clone()).collect()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (serve, count) = (Arc::clone(&published), Arc::clone(&fetches));
        let addr = raw_backend(
            move |_, _| {
                count.fetch_add(1, Ordering::Relaxed);
                let body = json!({"keys": *serve.lock().unwrap()}).to_string();
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            },
            false,
        )
        .await;
        Self {
            addr,
            published,
            fetches,
        }
    }

    fn publish(&self, keys: &[&Signer]) {
        *self.published.lock().unwrap() = keys.iter().map(|s| s.jwk.clone()).collect();
    }
}

/// A gateway over one sim whose tokens come from the key set at `jwks`.
async fn gateway(jwks: SocketAddr) -> (tpsgate::sim::Fleet, tpsgate::gateway::Gateway) {
    let (fleet, sim) = support::start_engine("sim", support::engine(5.0, 0.0, 8)).await;
    let text = format!(
        "backends:\n{}classes:\n  - {{name: chat}}\n  - {{name: batch}}\njwt:\n  issuer: '{ISSUER}'\n  audience: tpsgate\n  jwks_url: 'http://{jwks}/jwks.json'\n  tenant_claim: org.team\n  tenants:\n    jwt-a: {{class: chat, limits: {{requests_per_minute: 100}}}}\n    jwt-b: {{class: batch, models: [other]}}\n",
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    );
    (fleet, support::gateway(&text).await)
}

/// The error message of a refused request, after checking that it is 401 and does not echo
/// the token.
fn refusal(ex: &support::Exchange, token: &str) -> String {
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    let body = String::from_utf8_lossy(&ex.body()).into_owned();
    assert!(
        !body.contains(token) && !body.contains(&token[token.len().saturating_sub(20)..]),
        "{body}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    v["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_the_issuer_names_its_tenant_whose_class_and_limits_apply() {
    let (ed, ec, rs) = (ed25519("ed"), p256("ec"), rsa("rs"));
    let issuer = Issuer::start(&[&ed, &ec, &rs]).await;
    let (_fleet, gw) = gateway(issuer.addr).await;
    let team_a = json!({"org": {"team": "jwt-a"}});
    for signer in [&ed, &ec, &rs] {
        let ex = chat(gw.addr(), &signer.token(team_a.clone()), 4).await;
        assert_eq!(ex.status, StatusCode::OK, "{:?}", signer.alg);
        assert_eq!(ex.headers["x-tpsgate-class"], "chat", "the tenant's class");
        assert!(
            ex.headers.contains_key("x-ratelimit-limit-requests"),
            "the tenant's limits"
        );
    }
    let b = ed.token(json!({"org": {"team": "jwt-b"}}));
    let ex = chat(gw.addr(), &b, 4).await;
    assert_eq!(
        ex.status,
        StatusCode::FORBIDDEN,
        "jwt-b may use `other` only"
    );

    let keys = support::get_json(gw.admin_addr(), "/admin/keys").await;
    let a = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "jwt-a")
        .unwrap()
        .clone();
    assert_eq!(a["source"], "jwt");
    assert_eq!(a["requests_total"], 3, "{a}");

    let late = ed.token(json!({"org": {"team": "jwt-a"}, "exp": 1000}));
    assert!(refusal(&chat(gw.addr(), &late, 4).await, &late).contains("expired"));
    let elsewhere = ed.token(json!({"org": {"team": "jwt-a"}, "aud": "another-app"}));
    assert!(refusal(&chat(gw.addr(), &elsewhere, 4).await, &elsewhere).contains("audience"));
    let foreign = ed.token(json!({"org": {"team": "jwt-a"}, "iss": "https://evil.test"}));
    assert!(refusal(&chat(gw.addr(), &foreign, 4).await, &foreign).contains("issuer"));
    let forged = Signer {
        kid: "ed",
        ..ed25519("ed")
    }
    .token(team_a.clone());
    assert!(refusal(&chat(gw.addr(), &forged, 4).await, &forged).contains("signature"));
    let nobody = ed.token(json!({"org": {"team": "jwt-z"}}));
    assert!(refusal(&chat(gw.addr(), &nobody, 4).await, &nobody).contains("jwt.tenants"));
    let unnamed = ed.token(json!({"sub": "x"}));
    assert!(refusal(&chat(gw.addr(), &unnamed, 4).await, &unnamed).contains("org.team"));
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("ed".to_owned());
    let hmac = jsonwebtoken::encode(&hs, &json!({"iss": ISSUER, "aud": "tpsgate", "exp": 9_999_999_999u64, "org": {"team": "jwt-a"}}), &EncodingKey::from_secret(b"guess")).unwrap();
    assert!(refusal(&chat(gw.addr(), &hmac, 4).await, &hmac).contains("EdDSA"));
    assert!(refusal(&chat(gw.addr(), "eyJ.not.ajwt", 4).await, "eyJ.not.ajwt").contains("JWT"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_follows_the_issuers_key_rotation_and_asks_it_at_most_once_a_second() {
    let (old, new) = (ed25519("2026-11"), p256("2026-12"));
    let issuer = Issuer::start(&[&old]).await;
    let (_fleet, gw) = gateway(issuer.addr).await;
    let team = json!({"org": {"team": "jwt-a"}});
    assert_eq!(
        chat(gw.addr(), &old.token(team.clone()), 4).await.status,
        StatusCode::OK
    );
    assert_eq!(
        issuer.fetches.load(Ordering::Relaxed),
        1,
        "fetched once, kept"
    );
    assert_eq!(
        chat(gw.addr(), &old.token(team.clone()), 4).await.status,
        StatusCode::OK
    );
    assert_eq!(issuer.fetches.load(Ordering::Relaxed), 1);

    // The issuer rotates: the new key is fetched as soon as a token names it.
    tokio::time::sleep(keyset_gap()).await;
    issuer.publish(&[&new]);
    assert_eq!(
        chat(gw.addr(), &new.token(team.clone()), 4).await.status,
        StatusCode::OK
    );
    assert_eq!(issuer.fetches.load(Ordering::Relaxed), 2);

    // A key no longer published is refused; tokens naming unknown keys do not hammer the
    // issuer: within a second, at most one more fetch.
    let stale = old.token(team.clone());
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (gw, stale) = (gw.addr(), stale.clone());
            tokio::spawn(async move { chat(gw, &stale, 4).await })
        })
        .collect();
    for task in tasks {
        let ex = task.await.unwrap();
        assert!(refusal(&ex, &stale).contains("does not publish"));
    }
    assert!(
        issuer.fetches.load(Ordering::Relaxed) <= 3,
        "{} fetches",
        issuer.fetches.load(Ordering::Relaxed)
    );
}

/// The least time between two fetches of a key set, and a little.
fn keyset_gap() -> std::time::Duration {
    std::time::Duration::from_millis(1100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_cannot_be_judged_for_want_of_the_key_set_gets_503() {
    let (_socket, refusing) = support::refusing_port();
    let (_fleet, gw) = gateway(refusing).await;
    let token = ed25519("k").token(json!({"org": {"team": "jwt-a"}}));
    let auth = format!("Bearer {token}");
    let ex = support::send(
        &http_client(None).unwrap(),
        gw.addr(),
        Method::POST,
        "/v1/chat/completions",
        Some(br#"{"model":"m","messages":[],"max_tokens":2}"#),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
    )
    .await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE);
    let v = ex.json();
    assert_eq!(v["error"]["code"], "identity_provider_unavailable", "{v}");
    assert!(!v.to_string().contains(&token));
}
