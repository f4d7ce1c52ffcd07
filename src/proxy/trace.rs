//! Traces, when `tracing:` is configured: each request gets a span ([`crate::otel`]) that
//! continues the client's `traceparent`. Below it, `forward` tells the backend the span's
//! context and the request's end (`end.rs`) ends it with what the stream measured; an answer
//! the gateway gives itself (an error, `/v1/models`) ends it here.
//!
//! Without `tracing:` the layer passes requests and responses through untouched. It stays in
//! the stack all the same: an optional layer (an `Either` in the stack's type) cost every
//! request 600 instructions more than this pass-through (BENCHMARKS.md, "Traces").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use opentelemetry::KeyValue;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::body::ProxyBody;
use super::request_id::Received;
use crate::error::Error;
use crate::otel::{RequestSpan, Tracing};

/// Adds [`Trace`].
#[derive(Debug, Clone)]
pub struct TraceLayer {
    tracing: Option<Tracing>,
}

impl TraceLayer {
    /// Spans from `tracing`, if configured.
    pub fn new(tracing: Option<Tracing>) -> Self {
        Self { tracing }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Trace<S> {
        Trace {
            inner,
            tracing: self.tracing.clone(),
        }
    }
}

/// Starts each request's span and ends those no backend answered.
#[derive(Debug, Clone)]
pub struct Trace<S> {
    inner: S,
    tracing: Option<Tracing>,
}

impl<S, B> Service<Request<B>> for Trace<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Error>,
{
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future = TraceFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let span = self.tracing.as_ref().map(|tracing| {
            let span =
                tracing.start_request(req.headers(), req.method().as_str(), req.uri().path());
            if let Some(received) = req.extensions_mut().get_mut::<Received>() {
                received.span = Some(span.clone());
            }
            span
        });
        TraceFuture {
            inner: self.inner.call(req),
            span,
        }
    }
}

pin_project! {
    /// Response future of [`Trace`].
    pub struct TraceFuture<F> {
        #[pin]
        inner: F,
        span: Option<RequestSpan>,
    }
}

impl<F> Future for TraceFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Error>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(span) = this.span.as_ref() else {
            return this.inner.poll(cx);
        };
        let result = std::task::ready!(this.inner.poll(cx));
        match &result {
            // A backend's body carries the span to the request's end.
            Ok(resp) if matches!(resp.body(), ProxyBody::Upstream { .. }) => {}
            Ok(resp) => span.end(
                None,
                [KeyValue::new(
                    "http.response.status_code",
                    i64::from(resp.status().as_u16()),
                )],
                None,
            ),
            Err(err) => span.end(
                None,
                [KeyValue::new(
                    "http.response.status_code",
                    i64::from(err.kind().status().as_u16()),
                )],
                Some(err.kind().code()),
            ),
        }
        Poll::Ready(result)
    }
}
