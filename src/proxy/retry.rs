//! Retry and failover, only before any content reached the client: a connect failure or
//! timeout, a 5xx or 429 head, or a stream that fails (or times out) before its first content
//! event is tried again on another backend, up to `routing.max_attempts` and within the retry
//! budget, after a short jittered backoff. A stream's head and role-only first chunk are read
//! ahead until its first content event, so that such a failure stays invisible to the client;
//! once content has gone out, never (no duplicated output).
//!
//! Above [`Route`](super::route::Route): each attempt is routed afresh, avoiding the backends
//! earlier attempts went to ([`Tried`]). Where no other backend serves the model, none of this
//! is set up: the request goes down once, streamed as it comes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response};
use tower::{Layer, Service, ServiceExt as _};

use super::body::ProxyBody;
use super::classify::Classified;
use super::route::Tried;
use crate::error::{Error, ErrorKind};
use crate::router::Router;

/// Retries as a share of requests, as linkerd and Envoy bound them (tower's
/// `retry/budget/tps_budget.rs` is the same idea over a time window): every request that may
/// be retried deposits `ratio` of a retry, a retry spends one, and the balance starts (and is
/// capped) at [`RetryBudget::RESERVE`] so that a quiet gateway can still retry a few.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    /// Balance in thousandths of a retry.
    milli: AtomicI64,
    deposit: i64,
}

impl RetryBudget {
    /// Retries available to a gateway that has seen no requests yet.
    pub(crate) const RESERVE: i64 = 10;

    /// A budget allowing `ratio` retries per request.
    pub(crate) fn new(ratio: f64) -> Self {
        Self {
            milli: AtomicI64::new(Self::RESERVE * 1000),
            deposit: (ratio * 1000.0).round() as i64,
        }
    }

    /// One request passed.
    pub(crate) fn deposit(&self) {
        let cap = Self::RESERVE * 1000 * 10;
        let _ = self
            .milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m + self.deposit).min(cap))
            });
    }

    /// Spends one retry if the balance allows.
    pub(crate) fn withdraw(&self) -> bool {
        self.milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                (m >= 1000).then_some(m - 1000)
            })
            .is_ok()
    }
}

/// A copy of a request, to send again: the body is shared (bytes are reference-counted), the
/// head is copied.
fn copy_request<B: Clone>(parts: &http::request::Parts, body: &B) -> Request<B> {
    let mut req = Request::new(body.clone());
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    *req.extensions_mut() = parts.extensions.clone();
    req
}

/// Retries requests that failed before any content.
#[derive(Debug, Clone)]
pub(crate) struct RetryLayer {
    // One shared part: the stack is cloned per request, and each `Arc` in it is an atomic
    // increment and decrement there.
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    router: Arc<Router>,
    max_attempts: u32,
    budget: RetryBudget,
}

impl RetryLayer {
    /// At most `max_attempts` attempts per request, retries spent from `budget`; `router` tells
    /// whether another backend serves the model.
    pub(crate) fn new(router: Arc<Router>, max_attempts: u32, budget: RetryBudget) -> Self {
        Self {
            shared: Arc::new(Shared {
                router,
                max_attempts,
                budget,
            }),
        }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// See [`RetryLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Retry<S> {
    inner: S,
    shared: Arc<Shared>,
}

type Attempts = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Error>> + Send>>;

impl<S> Retry<S> {
    /// Whether a failed attempt of `req` could be tried again: retries are on and more than
    /// one backend serves its model. Only then is the request copied for a retry and its stream
    /// read ahead to the first content.
    fn may_retry<B>(&self, req: &Request<B>) -> bool {
        if self.shared.max_attempts <= 1 {
            return false;
        }
        let Some(c) = req.extensions().get::<Classified>() else {
            return false;
        };
        c.model
            .as_deref()
            .is_some_and(|model| self.shared.router.serving_count(model, c.reach()) > 1)
    }
}

/// Whether an attempt failed upstream (rather than not being made at all).
fn upstream_failed(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UpstreamUnreachable | ErrorKind::UpstreamTimeout
    )
}

/// Whether an attempt's result may be retried: the upstream failed before anything went out.
fn retryable(result: &Result<Response<ProxyBody>, Error>) -> bool {
    match result {
        Err(e) => upstream_failed(e),
        Ok(resp) => {
            resp.status().is_server_error() || resp.status() == http::StatusCode::TOO_MANY_REQUESTS
        }
    }
}

/// Whether an attempt's response failed before its first content (a stream is read ahead to
/// find out; then nothing of it has reached the client yet).
async fn failed(result: &mut Result<Response<ProxyBody>, Error>) -> bool {
    match result {
        Ok(resp) if resp.status().is_success() => !resp.body_mut().read_ahead_to_content().await,
        other => retryable(other),
    }
}

/// Sends `req` down, then again (to another backend) while it fails before content.
async fn attempts<S>(
    layer: Arc<Shared>,
    mut inner: S,
    req: Request<Bytes>,
) -> Result<Response<ProxyBody>, Error>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
{
    layer.budget.deposit();
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(Tried::default());
    let mut result = inner.call(copy_request(&parts, &body)).await;
    let mut attempt = 1;
    while failed(&mut result).await && attempt < layer.max_attempts && layer.budget.withdraw() {
        attempt += 1;
        // Backoff with jitter: 10-30 ms per attempt made, so that retries do not arrive in step.
        let jitter = rand::random_range(10..=30u64);
        tokio::time::sleep(std::time::Duration::from_millis(
            jitter * u64::from(attempt - 1),
        ))
        .await;
        let next = match inner.ready().await {
            Ok(inner) => inner.call(copy_request(&parts, &body)).await,
            Err(err) => Err(err),
        };
        if next.as_ref().is_err_and(|e| !upstream_failed(e)) {
            // No other backend could take it (at its limit, or predicted to miss): the earlier
            // attempt's answer stands.
            return result;
        }
        tracing::info!(
            attempt,
            to = next
                .as_ref()
                .ok()
                .and_then(|r| r.headers().get(super::forward::X_TPSGATE_BACKEND))
                .and_then(|v| v.to_str().ok()),
            "retried on another backend (nothing had reached the client)"
        );
        crate::telemetry::count_retry();
        result = next;
    }
    result
}

impl<S> Service<Request<Bytes>> for Retry<S>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future = Either<S::Future, Attempts>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        if !self.may_retry(&req) {
            return Either::Left(self.inner.call(req));
        }
        // The clone that was driven to readiness serves this call (tower's clone-and-swap).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Either::Right(Box::pin(attempts(Arc::clone(&self.shared), inner, req)))
    }
}

#[cfg(test)]
mod tests;
