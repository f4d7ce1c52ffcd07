//! The issuer's signing keys: its JWK set, fetched with bounded retries, kept until the next
//! refresh, and fetched again at once for a key it does not hold (a rotation), at most once a
//! [`MIN_GAP`] however many tokens name unknown keys.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http_body_util::BodyExt as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::time::Instant;

use crate::tls::HttpClient;

/// The least time between two fetches of the key set.
pub(crate) const MIN_GAP: Duration = Duration::from_secs(1);
/// Tries per fetch, and the time each may take.
const TRIES: u32 = 3;
const TRY_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest key set read.
const MAX_BYTES: usize = 1 << 20;

/// One signing key and the algorithm it verifies.
pub(crate) struct Key {
    pub decoding: DecodingKey,
    pub alg: Algorithm,
}

/// The keys as last fetched.
#[derive(Default)]
pub(crate) struct Keys {
    by_kid: HashMap<String, Arc<Key>>,
    /// Keys without a `kid`, for tokens without one.
    unnamed: Vec<Arc<Key>>,
    /// When they were fetched; `None`: never (or never with success).
    pub fetched: Option<Instant>,
}

impl Keys {
    /// The key a token names (or, naming none, the one key without a `kid` for its algorithm).
    pub(crate) fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<Arc<Key>> {
        match kid {
            Some(kid) => self.by_kid.get(kid).cloned(),
            None => {
                let mut fitting = self.unnamed.iter().filter(|k| k.alg == alg);
                match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(Arc::clone(only)),
                    _ => None,
                }
            }
        }
    }
}

/// An issuer's key set, shared by every request.
pub(crate) struct KeySet {
    url: http::Uri,
    client: HttpClient,
    current: ArcSwap<Keys>,
    /// Held while fetching; when the last fetch began.
    fetching: tokio::sync::Mutex<Option<Instant>>,
    /// Why the last fetch failed, if it did.
    failure: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySet({})", self.url)
    }
}

impl KeySet {
    /// The key set at `url`, not fetched yet.
    pub(crate) fn new(url: http::Uri) -> Result<Self, String> {
        Ok(Self {
            url,
            client: crate::tls::http_client(None)?,
            current: ArcSwap::default(),
            fetching: tokio::sync::Mutex::new(None),
            failure: std::sync::Mutex::new(None),
        })
    }

    /// Its URL.
    pub(crate) fn url(&self) -> &http::Uri {
        &self.url
    }

    /// The keys as last fetched.
    pub(crate) fn keys(&self) -> arc_swap::Guard<Arc<Keys>> {
        self.current.load()
    }

    /// Why the last fetch failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Fetches the set again, unless a fetch began less than [`MIN_GAP`] ago (then waits for
    /// it, if it is still going); the keys stay as they were where it fails.
    pub(crate) async fn refresh(&self) {
        let mut last = self.fetching.lock().await;
        let now = Instant::now();
        if last.is_some_and(|at| now.saturating_duration_since(at) < MIN_GAP) {
            return;
        }
        *last = Some(now);
        let result = self.fetch().await;
        let mut failure = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(keys) => {
                if failure.take().is_some() {
                    tracing::info!(url = %self.url, "the JWT issuer's key set answers again");
                }
                self.current.store(Arc::new(keys));
            }
            Err(e) => {
                if failure.is_none() {
                    tracing::warn!(url = %self.url, error = %e, "cannot fetch the JWT issuer's key set; the last fetched stand");
                }
                *failure = Some(e);
            }
        }
    }

    /// The set, within [`TRIES`] tries.
    async fn fetch(&self) -> Result<Keys, String> {
        let mut wait = Duration::from_millis(100);
        let mut last = String::new();
        for attempt in 1..=TRIES {
            match tokio::time::timeout(TRY_TIMEOUT, self.fetch_once()).await {
                Ok(Ok(keys)) => return Ok(keys),
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("no answer within {} s", TRY_TIMEOUT.as_secs()),
            }
            if attempt < TRIES {
                tokio::time::sleep(wait).await;
                wait *= 3;
            }
        }
        Err(format!("{}: {last} ({TRIES} tries)", self.url))
    }

    async fn fetch_once(&self) -> Result<Keys, String> {
        let request = http::Request::get(self.url.clone())
            .header(http::header::ACCEPT, "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        parse(&body)
    }
}

/// A JWK set's signing keys for the algorithms accepted (RS256, ES256, EdDSA); a key of another
/// kind is left out, and so is a symmetric one, which a published set has no business holding.
pub(crate) fn parse(body: &[u8]) -> Result<Keys, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("not a JWK set: {e}"))?;
    let mut keys = Keys {
        fetched: Some(Instant::now()),
        ..Keys::default()
    };
    for value in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let Some(alg) = algorithm(&jwk) else { continue };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        let key = Arc::new(Key { decoding, alg });
        match jwk.common.key_id {
            Some(kid) => {
                keys.by_kid.insert(kid, key);
            }
            None => keys.unnamed.push(key),
        }
    }
    Ok(keys)
}

/// The algorithm a key verifies: what it says, where that agrees with its kind, else its kind's.
fn algorithm(jwk: &Jwk) -> Option<Algorithm> {
    let by_kind = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let said = jwk
        .common
        .key_algorithm
        .and_then(|a| a.to_string().parse::<Algorithm>().ok());
    match said {
        Some(alg) if alg != by_kind => None,
        _ => Some(by_kind),
    }
}
