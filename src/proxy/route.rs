//! Route: choose a backend for the request and take an in-flight slot there. Today's policy is
//! round robin over the backends that speak the endpoint's dialect, serve the model and are under
//! their `max_concurrency`. `GET /v1/models` is answered here, from the same backend list.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{Either, Ready, ready};
use http::{HeaderValue, Request, Response, header};
use pin_project_lite::pin_project;
use serde_json::json;
use tower::{Layer, Service};

use super::body::ProxyBody;
use super::classify::Classified;
use super::endpoint::Endpoint;
use crate::error::{Error, ErrorKind};
use crate::upstream::{Backend, InFlightGuard};

/// The routing decision, in the request's extensions.
#[derive(Debug, Clone)]
pub struct Routed {
    /// The chosen backend.
    pub backend: Arc<Backend>,
    /// The model name the backend knows (the alias resolved), if the body names one.
    pub upstream_model: Option<String>,
}

/// The backends and the policy's state.
#[derive(Debug)]
pub struct Router {
    backends: Vec<Arc<Backend>>,
    default_backend: Option<usize>,
    next: AtomicUsize,
}

impl Router {
    /// A router over `backends`; `default_backend` indexes into it.
    pub fn new(backends: Vec<Arc<Backend>>, default_backend: Option<usize>) -> Self {
        Self {
            backends,
            default_backend,
            next: AtomicUsize::new(0),
        }
    }

    /// The backends, in config order.
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    /// Picks a backend for `c` and admits the request there.
    pub fn route(&self, c: &Classified) -> Result<(Routed, InFlightGuard), Error> {
        let dialect = c.endpoint.dialect();
        let Some(model) = c.model.as_deref() else {
            return self.route_default();
        };
        let serves = |b: &&Arc<Backend>| {
            b.config.dialect == dialect && b.config.models.upstream(model).is_some()
        };
        let candidates = self.backends.iter().filter(serves).count();
        if candidates == 0 {
            return Err(Error::new(
                ErrorKind::ModelNotFound,
                format!(
                    "model `{model}` is not served by any backend; available: {}",
                    self.model_list(c.endpoint)
                ),
            ));
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % candidates;
        let ring = self
            .backends
            .iter()
            .filter(serves)
            .cycle()
            .skip(start)
            .take(candidates);
        for backend in ring {
            if let Some(guard) = backend.try_admit() {
                let upstream_model = backend.config.models.upstream(model).map(str::to_owned);
                return Ok((
                    Routed {
                        backend: Arc::clone(backend),
                        upstream_model,
                    },
                    guard,
                ));
            }
        }
        Err(Error::new(
            ErrorKind::NoBackendAvailable,
            format!("every backend serving `{model}` is at its concurrency limit; retry shortly"),
        ))
    }

    fn route_default(&self) -> Result<(Routed, InFlightGuard), Error> {
        let backend = self
            .default_backend
            .and_then(|i| self.backends.get(i))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidRequest,
                    "the body names no `model` and no default_backend is configured",
                )
            })?;
        let guard = backend.try_admit().ok_or_else(|| {
            Error::new(
                ErrorKind::NoBackendAvailable,
                "the default backend is at its concurrency limit",
            )
        })?;
        Ok((
            Routed {
                backend: Arc::clone(backend),
                upstream_model: None,
            },
            guard,
        ))
    }

    /// Client model names served for an endpoint's dialect, sorted.
    fn model_names(&self, endpoint: Endpoint) -> BTreeSet<&str> {
        self.backends
            .iter()
            .filter(|b| b.config.dialect == endpoint.dialect())
            .flat_map(|b| b.config.models.aliases.keys().map(String::as_str))
            .collect()
    }

    fn model_list(&self, endpoint: Endpoint) -> String {
        let names: Vec<&str> = self.model_names(endpoint).into_iter().collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// `GET /v1/models`: the union over all backends, in OpenAI's list format.
    pub fn models_response(&self) -> Response<ProxyBody> {
        let mut owners: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
        for b in &self.backends {
            for name in b.config.models.aliases.keys() {
                owners.entry(name).or_insert(&b.config.name);
            }
        }
        let data: Vec<_> = owners
            .iter()
            .map(
                |(id, owner)| json!({"id": id, "object": "model", "created": 0, "owned_by": owner}),
            )
            .collect();
        let body = json!({"object": "list", "data": data}).to_string();
        let mut resp = Response::new(ProxyBody::full(Bytes::from(body)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// Routes each classified request.
#[derive(Debug, Clone)]
pub struct RouteLayer {
    router: Arc<Router>,
}

impl RouteLayer {
    /// The layer over `router`.
    pub const fn new(router: Arc<Router>) -> Self {
        Self { router }
    }
}

impl<S> Layer<S> for RouteLayer {
    type Service = Route<S>;

    fn layer(&self, inner: S) -> Route<S> {
        Route {
            inner,
            router: Arc::clone(&self.router),
        }
    }
}

/// See [`RouteLayer`].
#[derive(Debug, Clone)]
pub struct Route<S> {
    inner: S,
    router: Arc<Router>,
}

impl<S> Service<Request<Bytes>> for Route<S>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
{
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future = Either<Ready<Result<Response<ProxyBody>, Error>>, RouteFuture<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        let Some(classified) = req.extensions().get::<Classified>() else {
            return Either::Left(ready(Err(Error::new(
                ErrorKind::InvalidRequest,
                "unclassified request",
            ))));
        };
        if classified.endpoint == Endpoint::Models {
            return Either::Left(ready(Ok(self.router.models_response())));
        }
        match self.router.route(classified) {
            Ok((routed, guard)) => {
                req.extensions_mut().insert(routed);
                Either::Right(RouteFuture {
                    inner: self.inner.call(req),
                    guard: Some(guard),
                })
            }
            Err(err) => Either::Left(ready(Err(err))),
        }
    }
}

pin_project! {
    /// Response future of [`Route`]: moves the in-flight slot into the response body, so that it
    /// is released when the body ends, fails or is dropped — not when the head arrives.
    #[derive(Debug)]
    pub struct RouteFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InFlightGuard>,
    }
}

impl<F> Future for RouteFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Error>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = std::task::ready!(this.inner.poll(cx))?;
        if let Some(guard) = this.guard.take() {
            resp.body_mut().hold(guard);
        }
        Poll::Ready(Ok(resp))
    }
}
