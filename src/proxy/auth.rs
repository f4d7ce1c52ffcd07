//! Auth: when gateway API keys are configured, a request must carry one (`Authorization: Bearer`
//! or `x-api-key`, as the OpenAI and Anthropic SDKs send them), else 401. The key's class, if it
//! has one, goes into the extensions for classify, and its tenant (limits and usage) for quota.
//! Keys are compared in constant time, every configured key each time, so that timing tells
//! nothing about how much of a key matched or which one.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::{Either, Ready, ready};
use http::{Request, header};
use subtle::ConstantTimeEq;
use tower::{Layer, Service};

use super::classify::KeyClass;
use crate::config::ApiKey;
use crate::error::{Error, ErrorKind};
use crate::tenant::{Tenant, Tenants};

/// `x-api-key`: Anthropic's credential header, which clients of either dialect may send.
pub(crate) const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// Checks gateway API keys.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    keys: Arc<[(ApiKey, Option<Arc<Tenant>>)]>,
}

impl AuthLayer {
    /// The layer; no keys means no check. The `i`-th key's requests are charged to the
    /// `i`-th of `tenants`.
    pub(crate) fn new(keys: Vec<ApiKey>, tenants: &Tenants) -> Self {
        Self {
            keys: keys
                .into_iter()
                .enumerate()
                .map(|(i, key)| (key, tenants.get(i).cloned()))
                .collect(),
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            keys: Arc::clone(&self.keys),
        }
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Auth<S> {
    inner: S,
    keys: Arc<[(ApiKey, Option<Arc<Tenant>>)]>,
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
        if self.keys.is_empty() {
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
        let Some((key, tenant)) = found else {
            return Either::Left(ready(Err(Error::new(
                ErrorKind::Unauthorized,
                "invalid API key",
            ))));
        };
        req.extensions_mut().insert(KeyClass {
            class: key.class,
            grant: Arc::clone(&key.grant),
        });
        // The key's limits and usage, for quota (below classify, which sizes the request).
        if let Some(tenant) = tenant {
            req.extensions_mut().insert(Arc::clone(tenant));
        }
        Either::Right(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use tower::{ServiceExt as _, service_fn};

    use super::*;
    use crate::config::{KeyLimits, Secret};

    /// Auth over a stand-in that answers with the class index the key gave (or none).
    async fn check(keys: Vec<ApiKey>, headers: &[(&str, &str)]) -> Result<Option<usize>, Error> {
        let inner = service_fn(|req: Request<()>| async move {
            Ok::<_, Error>(req.extensions().get::<KeyClass>().and_then(|k| k.class))
        });
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut().insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        AuthLayer::new(keys, &Tenants::default())
            .layer(inner)
            .oneshot(req)
            .await
    }

    fn keys() -> Vec<ApiKey> {
        vec![
            ApiKey {
                key: Secret::new("sk-batch".to_owned()),
                name: "batch".into(),
                class: Some(1),
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
            Ok(Some(1))
        );
        assert_eq!(
            check(keys(), &[("x-api-key", "sk-batch")]).await,
            Ok(Some(1))
        );
        assert_eq!(
            check(keys(), &[("authorization", "Bearer sk-plain")]).await,
            Ok(None),
            "a key without a class leaves it to the other rules"
        );
    }
}
