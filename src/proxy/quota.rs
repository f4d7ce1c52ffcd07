//! Quota: each API key within its limits (`api_keys[].limits`: requests and tokens per minute,
//! requests in flight, spend per period; `crate::tenant` keeps them). Over one: 429 with
//! `Retry-After`, shaped for the client's dialect by rescue (`rate_limit_exceeded`, or
//! `insufficient_quota` for a spent budget). Every answer below this layer to a key with
//! per-minute limits carries them: OpenAI's `x-ratelimit-*` headers, or Anthropic's
//! `anthropic-ratelimit-*` on `/v1/messages`. An admitted request carries its
//! [`Charge`](crate::tenant::Charge) to its end, which settles it with the tokens used.
//!
//! Above retry: a request counts once, however many attempts it takes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::body::ProxyBody;
use super::classify::Classified;
use super::endpoint::Endpoint;
use crate::config::BackendDialect;
use crate::error::{Error, ErrorKind};
use crate::tenant::{self, Allowance, Charge, Limit, Quota, Refusal, Tenant, Verdict};

/// Holds each API key to its limits.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QuotaLayer;

impl<S> Layer<S> for QuotaLayer {
    type Service = Quotas<S>;

    fn layer(&self, inner: S) -> Quotas<S> {
        Quotas { inner }
    }
}

/// See [`QuotaLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Quotas<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Quotas<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Error>,
{
    type Response = Response<ProxyBody>;
    type Error = Error;
    type Future = QuotaFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let Some(tenant) = req.extensions().get::<Arc<Tenant>>().cloned() else {
            return QuotaFuture::pass(self.inner.call(req));
        };
        let classified = req.extensions().get::<Classified>();
        let (prompt, output, anthropic) = match classified {
            Some(c) => (
                c.prompt_tokens,
                c.output_estimate(),
                c.endpoint.dialect() == BackendDialect::Anthropic,
            ),
            None => (0, 0, Endpoint::is_anthropic(req.uri().path())),
        };
        let class = classified
            .filter(|c| c.model.is_some() && c.endpoint.generates())
            .map(|c| (c.class.clone(), c.slo));
        let unix_s = tenant::unix_now();
        match tenant.admit(prompt, output, tokio::time::Instant::now(), unix_s) {
            Ok((charge, quota)) => {
                // Generation is judged against its class's SLO; the rest (model lists,
                // token counts, uploads) only counted.
                let judged = class.map(|(class, slo)| {
                    charge.of_class(class, slo);
                    Arc::clone(&charge)
                });
                req.extensions_mut().insert(charge);
                QuotaFuture {
                    inner: Some(self.inner.call(req)),
                    headers: headers(&quota, anthropic, unix_s),
                    refused: None,
                    charge: judged,
                }
            }
            Err(refusal) => QuotaFuture {
                inner: None,
                headers: None,
                refused: Some(refused(&tenant, &refusal, anthropic, unix_s)),
                charge: None,
            },
        }
    }
}

/// The 429 for `refusal` of `tenant`'s request, with its headers.
fn refused(tenant: &Tenant, refusal: &Refusal, anthropic: bool, unix_s: i64) -> Error {
    let name = tenant.name();
    let (kind, what) = match refusal.limit {
        Limit::Requests => (ErrorKind::RateLimited, "requests per minute"),
        Limit::Tokens => (ErrorKind::RateLimited, "tokens per minute"),
        Limit::Concurrency => (ErrorKind::RateLimited, "requests in flight"),
        Limit::Budget => (ErrorKind::BudgetExhausted, "spend budget for this period"),
    };
    let wait = refusal.retry_after.as_secs_f64().ceil().max(1.0);
    let error = Error::new(
        kind,
        format!("API key {name:?} is over its limit of {what}: retry in {wait} s"),
    )
    .retry_after(wait.min(f64::from(u32::MAX)) as u32);
    match headers(&refusal.quota, anthropic, unix_s) {
        Some(h) => error.with_headers(h),
        None => error,
    }
}

/// The rate-limit headers of `quota` in the client's dialect; `None` without per-minute
/// limits. Names are static and counts written without a string between: this runs for every
/// request of a key with limits.
fn headers(quota: &Quota, anthropic: bool, unix_s: i64) -> Option<HeaderMap> {
    if quota.requests.is_none() && quota.tokens.is_none() {
        return None;
    }
    let mut h = HeaderMap::with_capacity(6);
    for (window, names) in [(quota.requests, 0), (quota.tokens, 1)] {
        let Some(w) = window else { continue };
        let [limit, remaining, reset] = &NAMES[usize::from(anthropic)][names];
        h.insert(limit.clone(), HeaderValue::from(w.limit));
        h.insert(remaining.clone(), HeaderValue::from(w.remaining));
        let when = if anthropic {
            reset_at(&w, unix_s)
        } else {
            go_duration(w.reset)
        };
        if let Ok(value) = HeaderValue::try_from(when) {
            h.insert(reset.clone(), value);
        }
    }
    Some(h)
}

/// The headers' names: by dialect (OpenAI, Anthropic), by limit (requests, tokens): limit,
/// remaining, reset.
static NAMES: [[[HeaderName; 3]; 2]; 2] = [
    [
        [
            HeaderName::from_static("x-ratelimit-limit-requests"),
            HeaderName::from_static("x-ratelimit-remaining-requests"),
            HeaderName::from_static("x-ratelimit-reset-requests"),
        ],
        [
            HeaderName::from_static("x-ratelimit-limit-tokens"),
            HeaderName::from_static("x-ratelimit-remaining-tokens"),
            HeaderName::from_static("x-ratelimit-reset-tokens"),
        ],
    ],
    [
        [
            HeaderName::from_static("anthropic-ratelimit-requests-limit"),
            HeaderName::from_static("anthropic-ratelimit-requests-remaining"),
            HeaderName::from_static("anthropic-ratelimit-requests-reset"),
        ],
        [
            HeaderName::from_static("anthropic-ratelimit-tokens-limit"),
            HeaderName::from_static("anthropic-ratelimit-tokens-remaining"),
            HeaderName::from_static("anthropic-ratelimit-tokens-reset"),
        ],
    ],
];

/// When the window is full again, as Anthropic says it: RFC 3339, UTC.
fn reset_at(w: &Allowance, unix_s: i64) -> String {
    let secs = i64::try_from(w.reset.as_secs()).unwrap_or(0);
    let at = unix_s.saturating_add(secs + i64::from(w.reset.subsec_nanos() > 0));
    format!("{}Z", crate::logging::date_time(at))
}

/// A duration as OpenAI writes its resets: `20ms`, `1s`, `6m0s`, `1m30.5s`.
fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let minutes = ms / 60_000;
    let rest = (ms % 60_000) as f64 / 1_000.0;
    if minutes == 0 {
        format!("{rest}s")
    } else {
        format!("{minutes}m{rest}s")
    }
}

pin_project! {
    /// Response future of [`Quotas`]: the inner answer with the key's rate-limit headers, or
    /// the refusal.
    #[derive(Debug)]
    pub(crate) struct QuotaFuture<F> {
        #[pin]
        inner: Option<F>,
        headers: Option<HeaderMap>,
        refused: Option<Error>,
        // The request's charge, to judge it by the error it ends in, if it does; dropped before
        // its answer (the client went away while it waited), it was cancelled.
        charge: Option<Arc<Charge>>,
    }

    impl<F> PinnedDrop for QuotaFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(charge) = this.project().charge.take() {
                charge.judged(Verdict::Cancelled);
            }
        }
    }
}

impl<F> QuotaFuture<F> {
    fn pass(inner: F) -> Self {
        Self {
            inner: Some(inner),
            headers: None,
            refused: None,
            charge: None,
        }
    }
}

impl<F> Future for QuotaFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Error>>,
{
    type Output = Result<Response<ProxyBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(Err(this
                .refused
                .take()
                .unwrap_or_else(|| Error::internal("quota polled after its answer"))));
        };
        let result = ready!(inner.poll(cx));
        if let (Some(charge), Err(e)) = (this.charge.take(), &result)
            && let Some(verdict) = verdict_of(e)
        {
            charge.judged(verdict);
        }
        let Some(headers) = this.headers.take() else {
            return Poll::Ready(result);
        };
        Poll::Ready(match result {
            Ok(mut resp) => {
                resp.headers_mut().extend(headers);
                Ok(resp)
            }
            Err(e) => Err(e.with_headers(headers)),
        })
    }
}

/// What a request that ended in `e` became against its SLO; `None` for an error that says
/// nothing of the fleet (a bad request, an unknown model).
fn verdict_of(e: &Error) -> Option<Verdict> {
    match e.kind() {
        ErrorKind::SloUnmet | ErrorKind::NoBackendAvailable => Some(Verdict::Shed),
        ErrorKind::UpstreamUnreachable
        | ErrorKind::UpstreamTimeout
        | ErrorKind::UpstreamResponseTimeout => Some(Verdict::UpstreamError),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_are_written_as_openai_writes_them() {
        assert_eq!(go_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_millis(90_500)), "1m30.5s");
    }

    #[test]
    fn anthropic_resets_are_rfc_3339_times_rounded_up_to_the_second() {
        let w = Allowance {
            limit: 10,
            remaining: 0,
            reset: Duration::from_millis(1_500),
        };
        // 2026-11-25 12:00:00 UTC.
        assert_eq!(reset_at(&w, 1_795_608_000), "2026-11-25T12:00:02Z");
    }
}
