//! Request id: keeps the client's `x-request-id` (when it is a sane token) or mints one, passes it
//! upstream, records it for logs, and echoes it on every response. Outermost, so that errors
//! carry it too, and so that the time it stamps ([`Received`]) is when the gateway got the
//! request: TTFT includes the gateway's own work.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::otel::{RequestSpan, Tracing};

/// `x-request-id`.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id and when the gateway received it (its head), in its extensions (one entry:
/// each costs an allocation): TTFT counts from `at`.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// The id, as sent upstream and echoed to the client.
    pub id: HeaderValue,
    /// The moment the head arrived.
    pub at: tokio::time::Instant,
    /// Its span, when traced (the trace layer puts it here: no entry of its own, so that an
    /// untraced request looks nothing up).
    pub span: Option<crate::otel::RequestSpan>,
}

/// Adds [`Received`] to requests and `x-request-id` to responses; with `tracing:`, starts each
/// request's span (a request's trace context is part of who it is) and ends the span of an
/// answer the gateway gave itself. A span a backend's body carries ends with the request
/// (`end.rs`). Kept in this layer rather than one of its own: an extra layer around the whole
/// stack cost every request hundreds of instructions even as a pass-through (docs/benchmarks/overhead.md,
/// "Traces and discovery off").
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestIdLayer {
    tracing: Option<Tracing>,
}

impl RequestIdLayer {
    /// The layer; `tracing`, when configured, makes a span of each request.
    pub(crate) fn new(tracing: Option<Tracing>) -> Self {
        Self { tracing }
    }
}

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;

    fn layer(&self, inner: S) -> RequestIdService<S> {
        RequestIdService {
            inner,
            tracing: self.tracing.clone(),
        }
    }
}

/// See [`RequestIdLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RequestIdService<S> {
    inner: S,
    tracing: Option<Tracing>,
}

/// On a response: its body carries the request's span to the request's end (put there by
/// `forward`, only when traced).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CarriesSpan;

/// On an error response the gateway made: the error's code (`rescue`), for the span.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorCode(pub &'static str);

/// Ids minted here: a per-process random prefix and a counter, so they are unique without a
/// random draw per request.
fn mint() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static PREFIX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let prefix = *PREFIX.get_or_init(rand::random);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // `tg-{prefix:08x}-{n:x}`, written on the stack by hand (the formatting machinery costs ten
    // times as much here): the header value is the only allocation.
    let mut text = *b"tg-00000000-0000000000000000";
    hex_into(&mut text[3..11], u64::from(prefix));
    let digits = (u64::BITS - n.leading_zeros()).div_ceil(4).max(1) as usize;
    hex_into(&mut text[12..12 + digits], n);
    HeaderValue::from_bytes(&text[..12 + digits]).unwrap_or_else(|_| HeaderValue::from_static("tg"))
}

/// The low `out.len()` hex digits of `n`, most significant first.
fn hex_into(out: &mut [u8], mut n: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// A client id is kept when it is 1..=128 visible ASCII characters.
fn acceptable(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    (1..=128).contains(&bytes.len()) && bytes.iter().all(|b| b.is_ascii_graphic())
}

impl<S, B, R> Service<Request<B>> for RequestIdService<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = RequestIdFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = match req.headers().get(&X_REQUEST_ID) {
            Some(v) if acceptable(v) => v.clone(),
            _ => {
                let id = mint();
                req.headers_mut().insert(X_REQUEST_ID, id.clone());
                id
            }
        };
        let span = self.tracing.as_ref().map(|tracing| {
            tracing.start_request(req.headers(), req.method().as_str(), req.uri().path())
        });
        req.extensions_mut().insert(Received {
            id: id.clone(),
            at: tokio::time::Instant::now(),
            span: span.clone(),
        });
        RequestIdFuture {
            inner: self.inner.call(req),
            id: Some(id),
            span,
        }
    }
}

pin_project! {
    /// Response future of [`RequestIdService`].
    #[derive(Debug)]
    pub(crate) struct RequestIdFuture<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
        span: Option<RequestSpan>,
    }
}

impl<F, R, E> Future for RequestIdFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = ready!(this.inner.poll(cx))?;
        if let Some(id) = this.id.take() {
            resp.headers_mut().insert(X_REQUEST_ID, id);
        }
        if let Some(span) = this.span.take()
            && resp.extensions().get::<CarriesSpan>().is_none()
        {
            end_local(&span, &resp);
        }
        Poll::Ready(Ok(resp))
    }
}

/// Ends the span of an answer the gateway gave itself: its status, and as an error its code.
fn end_local<R>(span: &RequestSpan, resp: &Response<R>) {
    let status = resp.status();
    let code = resp.extensions().get::<ErrorCode>().map(|c| c.0);
    span.end(
        None,
        [opentelemetry::KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        )],
        code.or((status.is_client_error() || status.is_server_error()).then_some("http_error")),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_are_a_fixed_prefix_and_a_hex_counter() {
        let (a, b) = (mint(), mint());
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        assert_eq!(a[..12], b[..12], "one prefix per process");
        assert!(a.starts_with("tg-") && a.as_bytes()[11] == b'-', "{a}");
        let counter = |id: &str| u64::from_str_radix(&id[12..], 16).unwrap();
        assert_eq!(counter(b), counter(a) + 1);
        assert!(!a[12..].starts_with('0') || &a[12..] == "0", "{a}");
    }

    #[test]
    fn hex_digits_are_written_most_significant_first() {
        let mut out = [0u8; 8];
        hex_into(&mut out, 0x0012_abcd);
        assert_eq!(&out, b"0012abcd");
        let mut one = [0u8; 1];
        hex_into(&mut one, 0);
        assert_eq!(&one, b"0");
    }
}
