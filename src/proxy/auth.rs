//! Auth: when gateway API keys are configured (in the config, or made through the admin API with
//! `virtual_keys:` on), a request must carry one (`Authorization: Bearer` or `x-api-key`, as the
//! OpenAI and Anthropic SDKs send them), else 401. The key's class, if it has one, goes into the
//! extensions for classify, and its tenant (limits and usage) for quota. The config's keys are
//! compared in constant time, every one each time, so that timing tells nothing about how much
//! of a key matched or which one; a virtual key is found by its secret's digest
//! (`keystore::secret` says why that tells nothing either).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{Request, header};
use subtle::ConstantTimeEq;
use tower::{Layer, Service};

use super::classify::KeyClass;
use crate::config::ApiKey;
use crate::error::{Error, ErrorKind};
use crate::keystore::{Denied, KeyStore};
use crate::tenant::{Tenant, Tenants, unix_now};

/// `x-api-key`: Anthropic's credential header, which clients of either dialect may send.
pub(crate) const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// Checks gateway API keys.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    keys: Arc<[(ApiKey, Option<Arc<Tenant>>)]>,
    store: Arc<KeyStore>,
}

impl AuthLayer {
    /// The layer; no keys (and `store` off) means no check. The `i`-th key's requests are
    /// charged to the `i`-th of `tenants`.
    pub(crate) fn new(keys: Vec<ApiKey>, tenants: &Tenants, store: Arc<KeyStore>) -> Self {
        Self {
            keys: keys
                .into_iter()
                .enumerate()
                .map(|(i, key)| (key, tenants.get(i).cloned()))
                .collect(),
            store,
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            keys: Arc::clone(&self.keys),
            store: Arc::clone(&self.store),
        }
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Auth<S> {
    inner: S,
    keys: Arc<[(ApiKey, Option<Arc<Tenant>>)]>,
    store: Arc<KeyStore>,
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

impl<S, B> Service<Request<B>> for Auth<S>
where
    S: Service<Request<B>, Error = Error>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = Either<Ready<Result<S::Response, Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if self.keys.is_empty() && !self.store.is_on() {
            return Either::Right(self.inner.call(req));
        }
        let Some(given) = presented(&req) else {
            return Either::Left(ready(Err(Error::new(
                ErrorKind::Unauthorized,
                "this gateway needs an API key: send Authorization: Bearer KEY (or x-api-key)",
            ))));
        };
        let mut found = None;
        for entry in self.keys.iter() {
            if bool::from(entry.0.key.expose().as_bytes().ct_eq(given)) {
                found = Some(entry);
            }
        }
        let (key, tenant) = match found {
            Some((key, tenant)) => (
                KeyClass {
                    class: key.class.clone(),
                    grant: Arc::clone(&key.grant),
                },
                tenant.clone(),
            ),
            None => match self.store.find(given, unix_now()) {
                Ok(entry) => (
                    KeyClass {
                        class: entry.class.clone(),
                        grant: Arc::clone(&entry.grant),
                    },
                    Some(Arc::clone(&entry.tenant)),
                ),
                Err(denied) => return Either::Left(ready(Err(refused(denied)))),
            },
        };
        req.extensions_mut().insert(key);
        // The key's limits and usage, for quota (below classify, which sizes the request).
        if let Some(tenant) = tenant {
            req.extensions_mut().insert(tenant);
        }
        Either::Right(self.inner.call(req))
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
        AuthLayer::new(keys, &Tenants::default(), KeyStore::off())
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
