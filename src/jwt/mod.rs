//! JWT bearer tokens as identities (`jwt:`): a token signed by the configured issuer (RS256,
//! ES256 or EdDSA, verified against its published key set, [`keyset`]), for the configured
//! audience, within its `exp` and `nbf`, names its tenant in a claim; the tenant's class, grant
//! and limits are configured as an API key's are. A refusal says why (expired, wrong audience,
//! bad signature, ...), never echoing the token.

pub(crate) mod keyset;

use std::sync::Arc;

use jsonwebtoken::{Algorithm, Validation};
use serde_json::Value;

use crate::config::{Identity, JwtConfig};
use keyset::KeySet;

/// The algorithms accepted. No HMAC: a gateway holding the issuer's secret could mint tokens.
const ACCEPTED: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// Bearer tokens of one issuer, and the tenants they may name.
#[derive(Debug)]
pub(crate) struct Jwt {
    config: JwtConfig,
    keys: Arc<KeySet>,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a JWT, or not one this gateway takes; the reason.
    Invalid(String),
    /// Signed by a key the set (as last fetched) does not hold: fetch it again, then judge.
    UnknownKey,
    /// The key set could not be fetched, so the token cannot be judged.
    Unavailable(String),
}

impl Jwt {
    /// The tokens of `config`, verified with `keys` (carried over a reload of the same URL).
    pub(crate) fn new(config: JwtConfig, keys: Option<Arc<KeySet>>) -> Result<Self, String> {
        let keys = match keys {
            Some(k) if *k.url() == config.jwks_url => k,
            _ => Arc::new(KeySet::new(config.jwks_url.clone())?),
        };
        Ok(Self { config, keys })
    }

    /// Its key set.
    pub(crate) fn keys(&self) -> &Arc<KeySet> {
        &self.keys
    }

    /// Its tenants, in `jwt.tenants` order.
    pub(crate) fn tenants(&self) -> &[Identity] {
        &self.config.tenants
    }

    /// The index in [`Jwt::tenants`] of the tenant `token` names, or why it is refused.
    pub(crate) fn verify(&self, token: &str) -> Result<usize, Refused> {
        let invalid = |why: &str| Refused::Invalid(why.to_owned());
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| invalid("the bearer token is not a well-formed JWT"))?;
        if !ACCEPTED.contains(&header.alg) {
            return Err(Refused::Invalid(format!(
                "the token is signed with {:?}; this gateway takes RS256, ES256 and EdDSA",
                header.alg
            )));
        }
        let keys = self.keys.keys();
        let Some(key) = keys.find(header.kid.as_deref(), header.alg) else {
            // Never fetched, and the last try failed: the token cannot be judged.
            return Err(
                match self.keys.failure().filter(|_| keys.fetched.is_none()) {
                    Some(failure) => Refused::Unavailable(failure),
                    None => Refused::UnknownKey,
                },
            );
        };
        if key.alg != header.alg {
            return Err(invalid("the token's algorithm is not its key's"));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&self.config.audience);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = self.config.leeway_s;
        let claims = jsonwebtoken::decode::<Value>(token, &key.decoding, &validation)
            .map_err(|e| Refused::Invalid(reason(e.kind()).to_owned()))?
            .claims;
        let named = self
            .config
            .tenant_claim
            .iter()
            .try_fold(&claims, |at, field| at.get(field))
            .and_then(Value::as_str);
        let claim = || self.config.tenant_claim.join(".");
        let Some(name) = named else {
            let claim = claim();
            return Err(Refused::Invalid(format!(
                "the token names no tenant: it has no string claim `{claim}` (jwt.tenant_claim)"
            )));
        };
        self.config
            .tenants
            .iter()
            .position(|t| *t.name == *name)
            .ok_or_else(|| {
                Refused::Invalid(format!(
                    "the token's tenant (claim `{}`) is not one of jwt.tenants",
                    claim()
                ))
            })
    }

    /// Whether the key set is due a refresh (`jwt.jwks_refresh_s` since the last fetch).
    pub(crate) fn stale(&self) -> bool {
        self.keys
            .keys()
            .fetched
            .is_none_or(|at| at.elapsed() >= self.config.jwks_refresh)
    }
}

/// Whether a presented credential is shaped like a JWT (three base64url parts, a JSON header).
pub(crate) fn looks_like_jwt(given: &[u8]) -> bool {
    given.starts_with(b"eyJ") && given.iter().filter(|&&b| b == b'.').count() == 2
}

/// What a verification error tells the client: the reason, never the token.
fn reason(kind: &jsonwebtoken::errors::ErrorKind) -> &'static str {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::ExpiredSignature => "the token has expired",
        K::ImmatureSignature => "the token is not valid yet (nbf)",
        K::InvalidAudience => "the token is for another audience (aud)",
        K::InvalidIssuer => "the token is from another issuer (iss)",
        K::InvalidSignature => "the token's signature does not verify",
        K::MissingRequiredClaim(_) => {
            "the token lacks a claim this gateway requires (exp, iss, aud)"
        }
        K::InvalidAlgorithm => "the token's algorithm is not its key's",
        _ => "the bearer token is not a well-formed JWT",
    }
}
