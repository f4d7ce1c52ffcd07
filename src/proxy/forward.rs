//! Forward: send the rewritten request on one of the backend's pooled connections, wait for the
//! response head within the first-token deadline, and wrap the body so that it is timed and
//! metered on its way out. The innermost service of the stack.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::Service;

use super::body::{Metered, ProxyBody};
use super::classify::Classified;
use super::deadline::{Deadlines, Timed};
use super::end::{self, RequestEnd};
use super::request_id::Received;
use super::rewrite::is_hop_by_hop;
use super::route::Routed;
use super::whole::WholeUsage;
use crate::error::{Error, ErrorKind};
use crate::fleet::Backend;
use crate::signal::Signal;
use crate::sse::events::StreamDialect;
use crate::tenant::Charge;
use crate::translate::{Direction, ResponseTranslator, client_status};
use crate::upstream::{PooledBody, SendError, UpstreamBody};

/// `x-tpsgate-backend`: which backend answered.
pub(crate) const X_TPSGATE_BACKEND: HeaderName = HeaderName::from_static("x-tpsgate-backend");
/// `x-tpsgate-predicted-tps`: the per-user TPS (median) the router expected on that backend.
pub(crate) const X_TPSGATE_PREDICTED_TPS: HeaderName =
    HeaderName::from_static("x-tpsgate-predicted-tps");
/// `x-tpsgate-predicted-ttft-ms`: the TTFT (median) the router expected there, ms.
pub(crate) const X_TPSGATE_PREDICTED_TTFT_MS: HeaderName =
    HeaderName::from_static("x-tpsgate-predicted-ttft-ms");
/// `x-tpsgate-route-reason`: why the router chose it (the `reason` of the decision counter).
pub(crate) const X_TPSGATE_ROUTE_REASON: HeaderName =
    HeaderName::from_static("x-tpsgate-route-reason");

/// Sends requests upstream.
#[derive(Debug, Clone, Default)]
pub(crate) struct Forward {
    /// Cancelled when the drain deadline passes: streams still open then end with an error
    /// event.
    drained: Signal,
}

impl Forward {
    /// The service; `drained` ends the streams still open at the drain deadline.
    pub(crate) const fn new(drained: Signal) -> Self {
        Self { drained }
    }
}

/// What the response needs from the request.
#[derive(Debug)]
struct Pending {
    backend: Arc<Backend>,
    request: end::RequestFacts,
    stream: Option<(StreamDialect, bool)>,
    /// Not a stream, from a generation endpoint: the dialect its body's usage is read in.
    whole: Option<StreamDialect>,
    deadlines: Deadlines,
    prediction: Option<crate::curve::Prediction>,
    drained: Signal,
    /// The response's translation: which way, the client's stream dialect, and whether an
    /// OpenAI client asked for the usage chunk.
    translate: Option<(Direction, StreamDialect, bool)>,
    /// What the rewrite changed that the response tells the client.
    told: Option<super::rewrite::Told>,
}

impl Pending {
    /// The backend sent no head in time: the error says which timeout ran out, and the
    /// backend's health counts it.
    fn head_timed_out(&self) -> Error {
        self.backend.note_upstream(false);
        let timeouts = self.backend.config.timeouts;
        let name = &self.backend.config.name;
        // A stream that sent nothing may go elsewhere (nothing reached the client); a
        // response that is not a stream was accepted and may be running there: sending
        // it again would run (and bill) it twice.
        if self.deadlines.streamed() {
            crate::telemetry::count_timeout(name, "first_token");
            let ms = timeouts.first_token.as_millis();
            Error::new(
                ErrorKind::UpstreamTimeout,
                format!("backend {name} sent no response within {ms} ms (first_token_timeout_ms)"),
            )
        } else {
            crate::telemetry::count_timeout(name, "response");
            let ms = timeouts.response.as_millis();
            Error::new(
                ErrorKind::UpstreamResponseTimeout,
                format!("backend {name} did not answer within {ms} ms (response_timeout_ms)"),
            )
        }
    }

    /// The response head as the client gets it: the backend's 429 noted (with its Retry-After),
    /// hop-by-hop and upstream-only headers out, the decision's headers in.
    fn annotate(&self, parts: &mut http::response::Parts) {
        if parts.status == http::StatusCode::TOO_MANY_REQUESTS {
            // Seconds only: the HTTP-date form of Retry-After falls back to the default.
            let retry_after = parts
                .headers
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(std::time::Duration::from_secs);
            self.backend.note_rate_limited(retry_after);
        }
        clean_head(parts);
        if let Some(value) = &self.backend.name_header {
            parts.headers.insert(X_TPSGATE_BACKEND, value.clone());
        }
        if let Some(value) = self
            .request
            .class
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok())
        {
            parts
                .headers
                .insert(super::classify::X_TPSGATE_CLASS, value);
        }
        parts.headers.insert(
            X_TPSGATE_ROUTE_REASON,
            HeaderValue::from_static(self.request.reason.label()),
        );
        if let Some(told) = &self.told {
            told.tell(&mut parts.headers);
        }
        if let Some(p) = self.prediction {
            let mut text = [0u8; 24];
            for (name, value) in [
                (X_TPSGATE_PREDICTED_TPS, p.per_user_tps_p50),
                (X_TPSGATE_PREDICTED_TTFT_MS, p.ttft_p50_s * 1e3),
            ] {
                if let Some(v) = one_decimal(&mut text, value) {
                    parts.headers.insert(name, v);
                }
            }
        }
    }
}

impl Service<Request<UpstreamBody>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future = ForwardFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<UpstreamBody>) -> ForwardFuture {
        let (start, id, span) = req.extensions().get::<Received>().map_or_else(
            || (Instant::now(), HeaderValue::from_static("-"), None),
            |r| (r.at, r.id.clone(), r.span.clone()),
        );
        let Some(routed) = req.extensions_mut().remove::<Routed>() else {
            return ForwardFuture::failed(Error::internal("forward: the request has no route"));
        };
        let classified = req.extensions_mut().remove::<Classified>();
        let charge = req.extensions_mut().remove::<Arc<Charge>>();
        let told = req.extensions_mut().remove::<super::rewrite::Told>();
        let mut translate = None;
        let mut whole = None;
        let (model, stream, class, prompt_tokens) = match classified {
            Some(c) => {
                // Read as the backend sends it; a translation owns the usage it sends on.
                let (answer, strip) = match routed.translate {
                    None => (c.endpoint.stream_dialect(), c.usage_injected()),
                    Some(Direction::ChatToMessages | Direction::ResponsesToMessages) => {
                        (StreamDialect::Anthropic, false)
                    }
                    Some(
                        Direction::MessagesToChat
                        | Direction::CountToTokenize
                        | Direction::ResponsesToChat,
                    ) => (StreamDialect::OpenAi, false),
                };
                let stream = c.stream.then_some((answer, strip));
                whole = (!c.stream && c.endpoint.generates()).then_some(answer);
                translate = routed.translate.map(|d| {
                    let asked = c.stream_options.as_ref().and_then(|o| o.include_usage);
                    (d, c.endpoint.stream_dialect(), asked == Some(true))
                });
                (c.model, stream, c.class, c.prompt_tokens)
            }
            None => (None, None, None, 0),
        };
        // Traced: the backend's work is a child of this request's span (untraced, a client's
        // own `traceparent` passes as it came).
        if let Some(span) = &span {
            span.inject(req.headers_mut());
            span.set([
                opentelemetry::KeyValue::new(
                    "tpsgate.backend",
                    routed.backend.config.name.to_string(),
                ),
                opentelemetry::KeyValue::new("tpsgate.route.reason", routed.reason.label()),
            ]);
        }
        let inner = Box::pin(Arc::clone(&routed.backend.pool).send(req));
        // A backend's timeouts run from when the request is sent to it, not from its arrival
        // (time spent waiting in a queue line is not the backend's).
        let deadlines = Deadlines::new(
            routed.backend.config.timeouts,
            Instant::now(),
            stream.is_some(),
        );
        ForwardFuture {
            inner: Some(inner),
            head_timer: tokio::time::sleep_until(deadlines.first_token()),
            pending: Some(Pending {
                backend: Arc::clone(&routed.backend),
                request: end::RequestFacts {
                    id,
                    model,
                    class,
                    prompt_estimate: prompt_tokens,
                    start,
                    span,
                    charge,
                    reason: routed.reason,
                },
                stream,
                whole,
                deadlines,
                prediction: routed.prediction,
                drained: self.drained.clone(),
                translate,
                told,
            }),
            failed: None,
        }
    }
}

/// A request on its way to the backend, until its response head.
type Sending = Pin<Box<dyn Future<Output = Result<Response<PooledBody>, SendError>> + Send>>;

pin_project! {
    /// Response future of [`Forward`].
    pub(crate) struct ForwardFuture {
        #[pin]
        inner: Option<Sending>,
        // The first-token (or total) deadline while the response head is awaited.
        #[pin]
        head_timer: tokio::time::Sleep,
        pending: Option<Pending>,
        failed: Option<Error>,
    }
}

impl std::fmt::Debug for ForwardFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The request on its way is a boxed future: nothing to show of it but whether it is.
        f.debug_struct("ForwardFuture")
            .field("sending", &self.inner.is_some())
            .field("pending", &self.pending)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl ForwardFuture {
    fn failed(err: Error) -> Self {
        Self {
            inner: None,
            head_timer: tokio::time::sleep_until(Instant::now()),
            pending: None,
            failed: Some(err),
        }
    }
}

impl Future for ForwardFuture {
    type Output = Result<Response<ProxyBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            let err = this
                .failed
                .take()
                .unwrap_or_else(|| Error::internal("forward: polled after completion"));
            return Poll::Ready(Err(err));
        };
        let result = match inner.poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => {
                ready!(this.head_timer.poll(cx));
                let Some(pending) = this.pending.take() else {
                    return Poll::Pending;
                };
                return Poll::Ready(Err(pending.head_timed_out()));
            }
        };
        let Some(pending) = this.pending.take() else {
            return Poll::Ready(Err(Error::internal("forward: polled after completion")));
        };
        let backend = Arc::clone(&pending.backend.config.name);
        let resp = match result {
            Ok(resp) => resp,
            Err(err) => {
                pending.backend.note_upstream(false);
                return Poll::Ready(Err(upstream_error(&backend, &err)));
            }
        };
        let (mut parts, body) = resp.into_parts();
        pending.annotate(&mut parts);
        // Only a successful event stream is read as one; errors pass through untouched.
        let is_sse = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let stream = pending
            .stream
            .filter(|_| parts.status.is_success() && is_sse);
        // A traced request's span now rides in the body to the request's end.
        if pending.request.span.is_some() {
            parts.extensions.insert(super::request_id::CarriesSpan);
        }
        let end = RequestEnd::new(
            pending.request,
            parts.status,
            pending.deadlines.sent(),
            Arc::clone(&backend),
        );
        // Only a stream is cut at the drain deadline (with an error event).
        let drained = stream.is_some().then_some(pending.drained);
        let timed = Timed::new(body, pending.deadlines, drained, backend);
        let max_event = pending.backend.config.max_event_bytes;
        let mut metered = Metered::new(timed, end, stream, max_event);
        if let Some(dialect) = pending
            .whole
            .filter(|_| parts.status.is_success() && !is_sse)
        {
            metered = metered.reading_usage(WholeUsage::new(dialect, max_event));
        }
        if let Some((direction, client, include_usage)) = pending.translate {
            let status = parts.status.as_u16();
            let translator =
                ResponseTranslator::new(direction, stream.is_some(), status, include_usage);
            metered = metered.translated(translator, client);
            if stream.is_none() {
                // Answers and errors are rebuilt as JSON in the client's dialect.
                parts.headers.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                parts.status = http::StatusCode::from_u16(client_status(direction, status))
                    .unwrap_or(parts.status);
            }
        }
        let body = ProxyBody::Upstream {
            body: Box::new(metered),
        };
        Poll::Ready(Ok(Response::from_parts(parts, body)))
    }
}

/// Takes out of an upstream response head what must not reach the client:
/// - its framing (`Content-Length`, `Transfer-Encoding`): hyper frames the response from the
///   body, an exact length as a `Content-Length` and anything else chunked, so that what the
///   client is told always matches what it gets (RFC 9112 section 6.3), also when the gateway
///   removes the usage chunk or ends a stream with an error event;
/// - hop-by-hop headers, and those the upstream's `Connection` header names;
/// - any `x-tpsgate-*` header: only the gateway says those;
/// - its HTTP version: the client's connection has its own.
fn clean_head(parts: &mut http::response::Parts) {
    parts.version = http::Version::HTTP_11;
    // Connection tokens other than the usual ones name headers to drop (rare: collected only
    // then).
    let named: Option<Vec<HeaderName>> = parts
        .headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|t| !t.eq_ignore_ascii_case("keep-alive") && !t.eq_ignore_ascii_case("close"))
        .then(|| {
            parts
                .headers
                .get_all(http::header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter_map(|t| HeaderName::try_from(t.trim()).ok())
                .collect()
        });
    for name in named.into_iter().flatten() {
        parts.headers.remove(name);
    }
    // Usually one or two (`connection`, `content-length`): found and removed one at a time.
    while let Some(name) = parts
        .headers
        .keys()
        .find(|n| {
            is_hop_by_hop(n)
                || *n == http::header::CONTENT_LENGTH
                || n.as_str().starts_with("x-tpsgate-")
        })
        .cloned()
    {
        parts.headers.remove(name);
    }
}

/// 504 when connecting timed out, 502 for any other failure before the response head. The
/// client is told which backend and what kind of failure; the error itself (addresses, TLS
/// and parser details) goes to the log only.
fn upstream_error(backend: &str, err: &SendError) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    let mut timed_out = false;
    let mut detail = err.to_string();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            timed_out = true;
        }
        detail = e.to_string();
        source = e.source();
    }
    tracing::warn!(backend, error = %detail, "upstream failed before its response head");
    if timed_out && err.is_connect() {
        Error::new(
            ErrorKind::UpstreamTimeout,
            format!("backend {backend}: connect timed out"),
        )
    } else if err.is_connect() {
        Error::new(
            ErrorKind::UpstreamUnreachable,
            format!("backend {backend}: cannot connect (the gateway's log has the cause)"),
        )
    } else {
        Error::new(
            ErrorKind::UpstreamUnreachable,
            format!(
                "backend {backend}: failed before its response head (the gateway's log has the cause)"
            ),
        )
    }
}

/// `value` with one decimal as a header value, written in a stack buffer: the integer and the
/// tenth apart, as float formatting with a precision costs several times more (two per streamed
/// request).
fn one_decimal(buf: &mut [u8; 24], value: f64) -> Option<HeaderValue> {
    let tenths = (value * 10.0).round();
    // Negative, NaN or beyond what fits the buffer: no header (predictions are none of these).
    if !(0.0..1e18).contains(&tenths) {
        return None;
    }
    let tenths = tenths as u64;
    let mut digits = itoa::Buffer::new();
    let whole = digits.format(tenths / 10).as_bytes();
    buf[..whole.len()].copy_from_slice(whole);
    buf[whole.len()] = b'.';
    buf[whole.len() + 1] = b'0' + (tenths % 10) as u8;
    HeaderValue::from_bytes(&buf[..whole.len() + 2]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_are_sent_with_one_decimal() {
        let text = |v: f64| one_decimal(&mut [0; 24], v).map(|h| h.to_str().unwrap().to_owned());
        assert_eq!(text(41.26).as_deref(), Some("41.3"));
        assert_eq!(text(0.04).as_deref(), Some("0.0"));
        assert_eq!(text(1234.5678).as_deref(), Some("1234.6"));
        assert_eq!(text(9.96).as_deref(), Some("10.0"));
        assert_eq!(text(f64::NAN), None);
        assert_eq!(text(f64::INFINITY), None);
        assert_eq!(text(-1.0), None);
    }
}
