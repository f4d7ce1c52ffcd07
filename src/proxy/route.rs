//! Route: ask the [`Router`] for a backend and take an in-flight slot there, or wait in the
//! class's line until one is feasible; then send the request on with the decision, and move the
//! slot into the response body, so that it is released when the body ends, fails or is dropped
//! (not when the head arrives).
//!
//! A retry attempt ([`Tried`] in the extensions, with backends in it) avoids the backends the
//! request already went to, and never waits in line: with no other backend to take it now, it
//! fails at once, and [`Retry`](super::retry::Retry) answers with the earlier attempt's result.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
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
use crate::config::{BackendConfig, BackendDialect, PrefixRouting, ResponsesApi};
use crate::curve::Prediction;
use crate::error::{Error, ErrorKind};
use crate::fleet::{Backend, InFlightGuard, Share};
use crate::prefix::{Chain, RequestPrefix};
use crate::router::{Ask, Decision, Reason, Router, wait};
use crate::tenant::Charge;
use crate::translate::Direction;

/// The routing decision, in the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct Routed {
    /// The chosen backend.
    pub backend: Arc<Backend>,
    /// The model name the backend knows (the alias resolved), where it is not the name the
    /// client sent (then the body is rewritten; otherwise it goes as it came).
    pub upstream_model: Option<String>,
    /// What the router expected this request to see there.
    pub prediction: Option<Prediction>,
    /// Why it was chosen.
    pub reason: Reason,
    /// The backend speaks the other dialect: the request and its response are translated.
    pub translate: Option<Direction>,
}

/// Which way a request to the client's `endpoint` is translated for `backend`, if it is: for
/// the other dialect, and a Responses request for an OpenAI backend without its own Responses
/// API.
pub(crate) fn translation(endpoint: Endpoint, backend: &BackendConfig) -> Option<Direction> {
    match (endpoint, backend.dialect) {
        (Endpoint::CountTokens, BackendDialect::Openai) => Some(Direction::CountToTokenize),
        (Endpoint::Responses, BackendDialect::Openai) => {
            (backend.responses_api == ResponsesApi::Translate).then_some(Direction::ResponsesToChat)
        }
        (Endpoint::Responses, BackendDialect::Anthropic) => Some(Direction::ResponsesToMessages),
        (e, BackendDialect::Anthropic) if e.dialect() == BackendDialect::Openai => {
            Some(Direction::ChatToMessages)
        }
        (e, BackendDialect::Openai) if e.dialect() == BackendDialect::Anthropic => {
            Some(Direction::MessagesToChat)
        }
        _ => None,
    }
}

/// The backends (by router index) a request that may be retried was sent to, in its
/// extensions: Route adds each one it chooses, and a later attempt avoids them. Shared by the
/// copies of the request each attempt sends.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tried(Arc<Mutex<Vec<usize>>>);

impl Tried {
    /// The backends tried so far.
    pub(crate) fn backends(&self) -> Vec<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn add(&self, index: usize) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(index);
    }
}

/// What the router needs to know of a classified request for `model`, received at `received`,
/// avoiding `avoid`, its prompt's prefix `prefix` (when the index is on).
pub(crate) fn ask<'a>(
    c: &'a Classified,
    model: &'a str,
    received: Instant,
    avoid: &'a [usize],
    prefix: Option<&'a RequestPrefix>,
) -> Ask<'a> {
    Ask {
        prefix,
        model,
        reach: c.reach(),
        prompt_tokens: c.prompt_tokens,
        max_tokens: c.max_tokens,
        class: c.class_index,
        slo: c.slo,
        received,
        now: Instant::now(),
        avoid,
    }
}

/// `x-session-id`: a client's name for its conversation, a hint that joins its requests to one
/// prefix (as OpenAI's `prompt_cache_key` in the body does).
pub(crate) const X_SESSION_ID: http::HeaderName = http::HeaderName::from_static("x-session-id");

/// The prefix of `req`'s prompt for `model`: the prompt's parts in their fixed order, cut into
/// blocks of `routing.block_tokens` and hashed in a chain seeded by the model (each part's
/// JSON bytes as the client sent them: a client re-sends its history byte for byte), and
/// the hint (`prompt_cache_key`, else `x-session-id`). One pass over the prompt's bytes.
pub fn prefix_of(
    req: &Request<Bytes>,
    c: &Classified,
    model: &str,
    routing: PrefixRouting,
) -> RequestPrefix {
    let body = req.body();
    let mut chain = Chain::new(model.as_bytes(), routing.block_bytes());
    for span in c.prompt_spans.iter().flatten() {
        chain.feed(&body[span.clone()]);
    }
    let hint = c
        .cache_key_span
        .as_ref()
        .map(|span| &body[span.start + 1..span.end - 1])
        .or_else(|| req.headers().get(&X_SESSION_ID).map(|v| v.as_bytes()))
        .filter(|h| !h.is_empty())
        .map(|h| RequestPrefix::hint_hash(model.as_bytes(), h));
    RequestPrefix {
        hashes: chain.finish(),
        hint,
    }
}

/// When the gateway received `req` (now, if no layer above said).
pub(crate) fn received<B>(req: &Request<B>) -> Instant {
    req.extensions()
        .get::<Received>()
        .map_or_else(Instant::now, |r| r.at)
}

/// Routes each classified request.
#[derive(Debug, Clone)]
pub(crate) struct RouteLayer {
    router: Arc<Router>,
}

impl RouteLayer {
    /// The layer over `router`.
    pub(crate) const fn new(router: Arc<Router>) -> Self {
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
pub(crate) struct Route<S> {
    inner: S,
    router: Arc<Router>,
}

type Queued = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Error>> + Send>>;

/// Puts the decision into the request and calls `inner`, the slot following the response.
fn forward<S>(inner: &mut S, mut req: Request<Bytes>, decision: Decision) -> RouteFuture<S::Future>
where
    S: Service<Request<Bytes>, Response = Response<ProxyBody>, Error = Error>,
{
    if let Some(tried) = req.extensions().get::<Tried>() {
        tried.add(decision.index);
    }
    let translate = req
        .extensions()
        .get::<Classified>()
        .and_then(|c| translation(c.endpoint, &decision.backend.config));
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
        translate,
    });
    RouteFuture {
        inner: inner.call(req),
        slot: Some(decision.guard),
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
            return now(Error::internal("route: the request was not classified"));
        };
        let received = received(&req);
        let avoid = req
            .extensions()
            .get::<Tried>()
            .map(Tried::backends)
            .unwrap_or_default();
        let retrying = !avoid.is_empty();
        let prefix = classified
            .model
            .as_deref()
            .zip(self.router.prefix_routing())
            .map(|(model, routing)| prefix_of(&req, classified, model, routing));
        let decided = match classified.model.as_deref() {
            None => self.router.route_default(req.uri().path()).map(Some),
            Some(model) => {
                self.router
                    .route(&ask(classified, model, received, &avoid, prefix.as_ref()))
            }
        };
        match decided {
            Ok(Some(decision)) if decision.claim.is_none() => {
                Either::Left(Either::Right(forward(&mut self.inner, req, decision)))
            }
            Err(err) => now(err),
            Ok(None) if retrying => now(Error::new(
                ErrorKind::NoBackendAvailable,
                "no other backend can take the request now",
            )),
            // Its class's line, or a slot near the edge to claim from the other replicas.
            Ok(pending) => {
                // The clone that was driven to readiness serves this call (tower's
                // clone-and-swap).
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let router = Arc::clone(&self.router);
                // Its key's flow in the class's fair line (requests without one share a flow),
                // its cost the tokens it was admitted at.
                let share = req.extensions().get::<Arc<Charge>>().map_or_else(
                    || Share {
                        tokens: classified.prompt_tokens + classified.output_estimate(),
                        ..Share::default()
                    },
                    |c| Share {
                        flow: c.tenant().id(),
                        weight: c.tenant().weight(),
                        tokens: c.tokens(),
                    },
                );
                // A request that went into its class's line and was refused there waited
                // for its whole wait.
                let queued = pending
                    .is_none()
                    .then(|| req.extensions().get::<Arc<Charge>>().cloned())
                    .flatten();
                Either::Right(Box::pin(async move {
                    let decision = {
                        let c = req.extensions().get::<Classified>();
                        let (Some(c), Some(model)) = (c, c.and_then(|c| c.model.as_deref())) else {
                            return Err(Error::internal("route: a queued request lost its model"));
                        };
                        match pending {
                            Some(decision) => {
                                let ask = ask(c, model, received, &avoid, prefix.as_ref());
                                wait::settle(&router, &ask, decision, share).await?
                            }
                            None => {
                                let ask = ask(c, model, received, &[], prefix.as_ref());
                                match wait::in_line(&router, &ask, share).await {
                                    Ok(decision) => decision,
                                    Err(e) => {
                                        if let Some(charge) =
                                            queued.filter(|_| e.kind() == ErrorKind::SloUnmet)
                                        {
                                            charge.judged(crate::tenant::Verdict::QueuedTooLong);
                                        }
                                        return Err(e);
                                    }
                                }
                            }
                        }
                    };
                    forward(&mut inner, req, decision).await
                }))
            }
        }
    }
}

pin_project! {
    /// Response future of [`Route`]: moves the in-flight slot into the response body.
    #[derive(Debug)]
    pub(crate) struct RouteFuture<F> {
        #[pin]
        inner: F,
        slot: Option<InFlightGuard>,
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
        if let Some(slot) = this.slot.take() {
            resp.body_mut().keep_slot(slot);
        }
        Poll::Ready(Ok(resp))
    }
}

#[cfg(test)]
mod tests;
