//! Route: ask the [`Router`] for a backend and take an in-flight slot there; `GET /v1/models` is
//! answered here, from the same backend list. A request whose class queues waits here.
//!
//! Retry and failover, only before any content reached the client: a connect failure or
//! timeout, a 5xx or 429 head, or a stream that fails (or times out) before its first content
//! event is tried again on another backend, up to `routing.max_attempts` and within the retry
//! budget, after a short jittered backoff. A stream's head and role-only first chunk are held
//! until its first content event, so that such a failure stays invisible to the client; once
//! content has gone out, never (no duplicated output). Where no other backend serves the model,
//! none of this is set up: the request goes out once, streamed as it comes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::{Either, Ready, ready};
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::body::ProxyBody;
use super::classify::Classified;
use super::endpoint::Endpoint;
use super::request_id::Received;
use crate::curve::Prediction;
use crate::error::{Error, ErrorKind};
use crate::router::{Ask, Decision, Reason, Router};
use crate::upstream::{Backend, InFlightGuard, copy_request};

/// The routing decision, in the request's extensions.
#[derive(Debug, Clone)]
pub struct Routed {
    /// The chosen backend.
    pub backend: Arc<Backend>,
    /// The model name the backend knows (the alias resolved), where it is not the name the
    /// client sent (then the body is rewritten; otherwise it goes as it came).
    pub upstream_model: Option<String>,
    /// What the router expected this request to see there.
    pub prediction: Option<Prediction>,
    /// Why it was chosen.
    pub reason: Reason,
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

type Queued = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Error>> + Send>>;

fn ask<'a>(c: &'a Classified, model: &'a str, received: Instant) -> Ask<'a> {
    Ask {
        model,
        dialect: c.endpoint.dialect(),
        prompt_tokens: c.prompt_tokens,
        max_tokens: c.max_tokens,
        class: c.class_index,
        slo: c.slo,
        received,
        avoid: 0,
    }
}

/// Whether a failed attempt on `decision`'s backend could be tried again: retries are on and
/// another backend serves the model. Only then is the request copied for a retry and its stream
/// held until the first content.
fn may_retry(router: &Router, c: &Classified, received: Instant, decision: &Decision) -> bool {
    router.max_attempts() > 1
        && c.model
            .as_deref()
            .is_some_and(|model| router.serves_elsewhere(&ask(c, model, received), decision.index))
}

/// Whether an attempt's result may be retried: the upstream failed before anything went out.
fn retryable(result: &Result<Response<ProxyBody>, Error>) -> bool {
    match result {
        Err(e) => matches!(
            e.kind(),
            ErrorKind::UpstreamUnreachable | ErrorKind::UpstreamTimeout
        ),
        Ok(resp) => {
            resp.status().is_server_error() || resp.status() == http::StatusCode::TOO_MANY_REQUESTS
        }
    }
}

/// Attempts `req` on `decision`'s backend, then on others while it fails before content.
async fn attempts<S>(
    router: Arc<Router>,
    mut inner: S,
    req: Request<Bytes>,
    mut decision: Decision,
    received: Instant,
) -> Result<Response<ProxyBody>, Error>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
{
    router.budget().deposit();
    let (parts, body) = req.into_parts();
    let mut avoid = 0u64;
    let mut attempt = 1;
    loop {
        let index = decision.index;
        let mut result = forward(&mut inner, copy_request(&parts, &body), decision).await;
        let failed = match &mut result {
            Ok(resp) if resp.status().is_success() => !resp.body_mut().hold_until_content().await,
            other => retryable(other),
        };
        if !failed || attempt >= router.max_attempts() || !router.budget().withdraw() {
            return result;
        }
        if index < 64 {
            avoid |= 1 << index;
        }
        attempt += 1;
        // Backoff with jitter: 10-30 ms per attempt made, so that retries do not arrive in step.
        let jitter = rand::random_range(10..=30u64);
        tokio::time::sleep(std::time::Duration::from_millis(
            jitter * u64::from(attempt - 1),
        ))
        .await;
        let next = parts.extensions.get::<Classified>().and_then(|c| {
            let model = c.model.as_deref()?;
            let again = Ask {
                avoid,
                ..ask(c, model, received)
            };
            router.route(&again).ok().flatten()
        });
        let Some(next) = next else {
            return result;
        };
        tracing::info!(
            attempt,
            to = &*next.backend.config.name,
            "retrying on another backend (nothing had reached the client)"
        );
        crate::telemetry::count_retry();
        decision = next;
    }
}

/// Puts the decision into the request and calls `inner`, the slot following the response.
fn forward<S>(inner: &mut S, mut req: Request<Bytes>, decision: Decision) -> RouteFuture<S::Future>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
{
    let upstream_model = req
        .extensions()
        .get::<Classified>()
        .and_then(|c| c.model.as_deref())
        .and_then(|m| {
            decision
                .backend
                .config
                .models
                .upstream(m)
                .filter(|up| *up != m)
        })
        .map(str::to_owned);
    req.extensions_mut().insert(Routed {
        backend: decision.backend,
        upstream_model,
        prediction: decision.prediction,
        reason: decision.reason,
    });
    RouteFuture {
        inner: inner.call(req),
        guard: Some(decision.guard),
    }
}

impl<S> Service<Request<Bytes>> for Route<S>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future =
        Either<Either<Ready<Result<Response<ProxyBody>, Error>>, RouteFuture<S::Future>>, Queued>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let now = |e: Error| Either::Left(Either::Left(ready(Err(e))));
        let Some(classified) = req.extensions().get::<Classified>() else {
            return now(Error::new(
                ErrorKind::InvalidRequest,
                "unclassified request",
            ));
        };
        if classified.endpoint == Endpoint::Models {
            return Either::Left(Either::Left(ready(Ok(self.router.models_response()))));
        }
        let received = req
            .extensions()
            .get::<Received>()
            .map_or_else(Instant::now, |r| r.at);
        let decided = match classified.model.as_deref() {
            None => self.router.route_default().map(Some),
            Some(model) => self.router.route(&ask(classified, model, received)),
        };
        match decided {
            Ok(Some(decision)) if may_retry(&self.router, classified, received, &decision) => {
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                Either::Right(Box::pin(attempts(
                    Arc::clone(&self.router),
                    inner,
                    req,
                    decision,
                    received,
                )))
            }
            Ok(Some(decision)) => {
                Either::Left(Either::Right(forward(&mut self.inner, req, decision)))
            }
            Err(err) => now(err),
            Ok(None) => {
                // The clone that was driven to readiness serves this call (tower's
                // clone-and-swap).
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let router = Arc::clone(&self.router);
                Either::Right(Box::pin(async move {
                    let (decision, retry) = {
                        let c = req.extensions().get::<Classified>();
                        let (Some(c), Some(model)) = (c, c.and_then(|c| c.model.as_deref())) else {
                            return Err(Error::new(
                                ErrorKind::InvalidRequest,
                                "unclassified request",
                            ));
                        };
                        let decision = router.wait_in_line(&ask(c, model, received)).await?;
                        let retry = may_retry(&router, c, received, &decision);
                        (decision, retry)
                    };
                    if retry {
                        attempts(router, inner, req, decision, received).await
                    } else {
                        let mut inner = inner;
                        forward(&mut inner, req, decision).await
                    }
                }))
            }
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
