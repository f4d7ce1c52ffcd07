//! Auth: when gateway API keys are configured (in the config, or made through the admin API with
//! `virtual_keys:` on), a request must carry one (`Authorization: Bearer` or `x-api-key`, as the
//! OpenAI and Anthropic SDKs send them), else 401. The key's class, if it has one, goes into the
//! extensions for classify, and its tenant (limits and usage) for quota. The config's keys are
//! compared in constant time, every one each time, so that timing tells nothing about how much
//! of a key matched or which one; a virtual key is found by its secret's digest
//! (`keystore::secret` says why that tells nothing either).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{BoxFuture, Either, Ready, ready};
use http::{Request, header};
use subtle::ConstantTimeEq;
use tower::{Layer, Service};

use super::classify::KeyClass;
use crate::config::ApiKey;
use crate::error::{Error, ErrorKind};
use crate::jwt::{self, Jwt, Refused};
use crate::keystore::{Denied, KeyStore};
use crate::tenant::{Tenant, Tenants, unix_now};

/// `x-api-key`: Anthropic's credential header, which clients of either dialect may send.
pub(crate) const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// Checks gateway API keys.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    checks: Arc<Checks>,
}

/// Every way a request may say who it is.
#[derive(Debug)]
struct Checks {
    /// The config's keys, each with its tenant.
    keys: Vec<(ApiKey, Option<Arc<Tenant>>)>,
    /// The keys made through the admin API.
    store: Arc<KeyStore>,
    /// JWT bearer tokens, and what each of their tenants gives and is charged to.
    jwt: Option<(Arc<Jwt>, Vec<Who>)>,
}

impl AuthLayer {
    /// The layer; no keys (`store` off, no `jwt`) means no check. The `i`-th key's requests
    /// are charged to the `i`-th of `tenants`, a JWT tenant's to those after the keys'.
    pub(crate) fn new(
        keys: Vec<ApiKey>,
        tenants: &Tenants,
        store: Arc<KeyStore>,
        jwt: Option<Arc<Jwt>>,
    ) -> Self {
        let offset = keys.len();
        let jwt = jwt.map(|jwt| {
            let identities = jwt
                .tenants()
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let class = KeyClass {
                        class: t.class.clone(),
                        grant: Arc::clone(&t.grant),
                    };
                    (class, tenants.get(offset + i).cloned())
                })
                .collect();
            (jwt, identities)
        });
        let keys = keys
            .into_iter()
            .enumerate()
            .map(|(i, key)| (key, tenants.get(i).cloned()))
            .collect();
        Self {
            checks: Arc::new(Checks { keys, store, jwt }),
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            checks: Arc::clone(&self.checks),
        }
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Auth<S> {
    inner: S,
    checks: Arc<Checks>,
}

/// The key a request presents, if any.
fn presented<B>(req: &Request<B>) -> Option<&[u8]> {
    let headers = req.headers();
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes)
    {
        let scheme = b"bearer ";
        if bearer.len() > scheme.len() && bearer[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(bearer[scheme.len()..].trim_ascii());
        }
    }
    headers.get(&X_API_KEY).map(|v| v.as_bytes().trim_ascii())
}

/// Who a request is: what it gives and may claim, and its tenant.
type Who = (KeyClass, Option<Arc<Tenant>>);

impl Checks {
    /// Whether requests need a credential at all.
    fn any(&self) -> bool {
        !self.keys.is_empty() || self.store.is_on() || self.jwt.is_some()
    }

    /// Who presents `given`: a config key (compared with every one), a JWT, or a virtual key;
    /// `Ok(None)` for a JWT signed by a key the set does not hold (yet).
    fn who(&self, given: &[u8]) -> Result<Option<Who>, Error> {
        let mut found = None;
        for entry in &self.keys {
            if bool::from(entry.0.key.expose().as_bytes().ct_eq(given)) {
                found = Some(entry);
            }
        }
        if let Some((key, tenant)) = found {
            let class = KeyClass {
                class: key.class.clone(),
                grant: Arc::clone(&key.grant),
            };
            return Ok(Some((class, tenant.clone())));
        }
        if let Some((jwt, identities)) = &self.jwt
            && jwt::looks_like_jwt(given)
        {
            let token = std::str::from_utf8(given).unwrap_or_default();
            return match jwt.verify(token) {
                Ok(i) => {
                    if jwt.stale() {
                        let keys = Arc::clone(jwt.keys());
                        tokio::spawn(async move { keys.refresh().await });
                    }
                    Ok(identities.get(i).cloned())
                }
                Err(Refused::Invalid(why)) => Err(Error::new(ErrorKind::Unauthorized, why)),
                Err(Refused::UnknownKey | Refused::Unavailable(_)) => Ok(None),
            };
        }
        match self.store.find(given, unix_now()) {
            Ok(entry) => {
                let class = KeyClass {
                    class: entry.class.clone(),
                    grant: Arc::clone(&entry.grant),
                };
                Ok(Some((class, Some(Arc::clone(&entry.tenant)))))
            }
            Err(denied) => Err(refused(denied)),
        }
    }

    /// Who presents the JWT `token`, once its issuer's key set was fetched again (a key
    /// rotated there since the last fetch).
    async fn who_after_refresh(&self, token: &str) -> Result<Who, Error> {
        let Some((jwt, identities)) = &self.jwt else {
            return Err(Error::internal("a JWT was judged without jwt: configured"));
        };
        jwt.keys().refresh().await;
        match jwt.verify(token) {
            Ok(i) => identities
                .get(i)
                .cloned()
                .ok_or_else(|| Error::internal("a JWT tenant without its identity")),
            Err(Refused::Invalid(why)) => Err(Error::new(ErrorKind::Unauthorized, why)),
            Err(Refused::UnknownKey) => Err(Error::new(
                ErrorKind::Unauthorized,
                "the token is signed by a key its issuer does not publish (kid not in jwt.jwks_url)",
            )),
            Err(Refused::Unavailable(why)) => Err(Error::new(
                ErrorKind::IdentityUnavailable,
                format!(
                    "cannot verify the token now: the issuer's key set could not be fetched ({why})"
                ),
            )),
        }
    }
}

/// Puts who the request is into its extensions: the class for classify, the tenant for quota
/// (below classify, which sizes the request).
fn mark<B>(req: &mut Request<B>, (class, tenant): Who) {
    req.extensions_mut().insert(class);
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(tenant);
    }
}

impl<S, B> Service<Request<B>> for Auth<S>
where
    S: Service<Request<B>, Error = Error> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = Error;
    type Future = Either<
        Ready<Result<S::Response, Error>>,
        Either<S::Future, BoxFuture<'static, Result<S::Response, Error>>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if !self.checks.any() {
            return Either::Right(Either::Left(self.inner.call(req)));
        }
        let Some(given) = presented(&req) else {
            return Either::Left(ready(Err(Error::new(
                ErrorKind::Unauthorized,
                "this gateway needs an API key: send Authorization: Bearer KEY (or x-api-key)",
            ))));
        };
        match self.checks.who(given) {
            Ok(Some(who)) => {
                mark(&mut req, who);
                Either::Right(Either::Left(self.inner.call(req)))
            }
            Err(e) => Either::Left(ready(Err(e))),
            // A JWT whose key is not in the set as last fetched: fetch it again, then judge.
            Ok(None) => {
                let token = String::from_utf8_lossy(given).into_owned();
                let checks = Arc::clone(&self.checks);
                // The clone that was driven to readiness serves this call (tower's
                // clone-and-swap).
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Either::Right(Either::Right(Box::pin(async move {
                    let who = checks.who_after_refresh(&token).await?;
                    mark(&mut req, who);
                    inner.call(req).await
                })))
            }
        }
    }
}

/// The 401 of a key that is not (or no longer) one.
fn refused(denied: Denied) -> Error {
    match denied {
        Denied::Unknown => Error::new(ErrorKind::Unauthorized, "invalid API key"),
        Denied::Expired(at) => Error::new(
            ErrorKind::Unauthorized,
            format!("this API key expired at {at} (seconds since the Unix epoch)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::config::{KeyLimits, Secret};

    /// Auth over a stand-in that answers with the class index the key gave (or none).
    async fn check(keys: Vec<ApiKey>, headers: &[(&str, &str)]) -> Result<Option<Arc<str>>, Error> {
        let inner = service_fn(|req: Request<()>| async move {
            Ok::<_, Error>(
                req.extensions()
                    .get::<KeyClass>()
                    .and_then(|k| k.class.clone()),
            )
        });
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        AuthLayer::new(keys, &Tenants::default(), KeyStore::off(), None)
            .layer(inner)
            .oneshot(req)
            .await
    }

    fn keys() -> Vec<ApiKey> {
        vec![
            ApiKey {
                key: Secret::new("sk-batch".to_owned()),
                name: "batch".into(),
                class: Some("batch".into()),
                grant: Arc::default(),
                limits: KeyLimits::default(),
                weight: 1.0,
            },
            ApiKey {
                key: Secret::new("sk-plain".to_owned()),
                name: "plain".into(),
                class: None,
                grant: Arc::default(),
                limits: KeyLimits::default(),
                weight: 1.0,
            },
        ]
    }

    #[tokio::test]
    async fn without_configured_keys_every_request_passes() {
        assert_eq!(check(Vec::new(), &[]).await, Ok(None));
    }

    #[tokio::test]
    async fn a_request_without_a_valid_key_is_refused_with_401() {
        for headers in [&[][..], &[("authorization", "Bearer sk-nope")][..]] {
            let err = check(keys(), headers).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unauthorized);
            assert_eq!(err.kind().status(), 401);
        }
    }

    #[tokio::test]
    async fn a_key_is_taken_from_either_sdks_header_and_gives_its_class() {
        assert_eq!(
            check(keys(), &[("authorization", "bearer  sk-batch ")]).await,
            Ok(Some("batch".into()))
        );
        assert_eq!(
            check(keys(), &[("x-api-key", "sk-batch")]).await,
            Ok(Some("batch".into()))
        );
        assert_eq!(
            check(keys(), &[("authorization", "Bearer sk-plain")]).await,
            Ok(None),
            "a key without a class leaves it to the other rules"
        );
    }
}
