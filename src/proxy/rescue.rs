//! Rescue: the one place where a gateway [`Error`] becomes a response, shaped like the API the
//! client spoke (OpenAI's `{"error":{...}}`, or Anthropic's `{"type":"error",...}` on
//! `/v1/messages`). Sits right under the request id so that every error carries one.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use pin_project_lite::pin_project;
use serde_json::json;
use tower::{Layer, Service};

use super::body::ProxyBody;
use super::endpoint::Endpoint;
use crate::error::{Error, ErrorKind};

/// Turns errors from the layers below into responses.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RescueLayer;

impl RescueLayer {
    /// The layer.
    pub(crate) const fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;

    fn layer(&self, inner: S) -> Rescue<S> {
        Rescue { inner }
    }
}

/// See [`RescueLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Rescue<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Rescue<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>, Error = Error>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = RescueFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The layers below are always ready (they hold no capacity of their own).
        let _ = ready!(self.inner.poll_ready(cx));
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let anthropic = Endpoint::is_anthropic(req.uri().path());
        RescueFuture {
            inner: self.inner.call(req),
            anthropic,
        }
    }
}

pin_project! {
    /// Response future of [`Rescue`].
    #[derive(Debug)]
    pub(crate) struct RescueFuture<F> {
        #[pin]
        inner: F,
        anthropic: bool,
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response<ProxyBody>, Error>>,
{
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        Poll::Ready(Ok(
            result.unwrap_or_else(|err| error_response(&err, *this.anthropic))
        ))
    }
}

/// The response for `err`, in Anthropic's shape when `anthropic`, else OpenAI's.
pub(crate) fn error_response(err: &Error, anthropic: bool) -> Response<ProxyBody> {
    let kind = err.kind();
    crate::telemetry::count_gateway_error(kind);
    if kind == ErrorKind::Internal {
        tracing::error!(reason = err.message(), "gateway bug: request failed");
    } else {
        tracing::info!(
            status = kind.status().as_u16(),
            code = kind.code(),
            reason = err.message(),
            "request refused"
        );
    }
    let body = if anthropic {
        json!({"type": "error", "error": {"type": anthropic_type(kind), "message": err.message()}})
    } else {
        json!({"error": {"message": err.message(), "type": kind.openai_type(), "code": kind.code()}})
    };
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    *resp.status_mut() = kind.status();
    resp.extensions_mut()
        .insert(super::request_id::ErrorCode(kind.code()));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let retry_after = err
        .retry_after_s()
        .or((kind == ErrorKind::NoBackendAvailable).then_some(1));
    if let Some(seconds) = retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(extra) = err.headers() {
        headers.extend(extra.clone());
    }
    resp
}

/// Anthropic's error types by status, as its API documents them.
fn anthropic_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest
        | ErrorKind::ContextLengthExceeded
        | ErrorKind::MethodNotAllowed
        | ErrorKind::UnsupportedMediaType
        | ErrorKind::HeadersTooLarge
        | ErrorKind::RequestTimeout => "invalid_request_error",
        ErrorKind::NotFound | ErrorKind::ModelNotFound => "not_found_error",
        ErrorKind::PayloadTooLarge => "request_too_large",
        ErrorKind::NoBackendAvailable => "overloaded_error",
        ErrorKind::SloUnmet | ErrorKind::RateLimited | ErrorKind::BudgetExhausted => {
            "rate_limit_error"
        }
        ErrorKind::Unauthorized => "authentication_error",
        ErrorKind::Forbidden => "permission_error",
        ErrorKind::UpstreamUnreachable
        | ErrorKind::UpstreamTimeout
        | ErrorKind::UpstreamResponseTimeout
        | ErrorKind::IdentityUnavailable
        | ErrorKind::Internal => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;
    use tower::{ServiceExt as _, service_fn};

    use super::*;

    /// The response Rescue makes of `err` for a request to `path`.
    async fn rescued(path: &str, err: Error) -> (StatusCode, http::HeaderMap, serde_json::Value) {
        let inner = service_fn(move |_: Request<()>| {
            let err = err.clone();
            async move { Err::<Response<ProxyBody>, _>(err) }
        });
        let req = Request::builder().uri(path).body(()).unwrap();
        let resp = RescueLayer::new().layer(inner).oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (
            parts.status,
            parts.headers,
            serde_json::from_slice(&bytes).unwrap(),
        )
    }

    use http::StatusCode;

    #[tokio::test]
    async fn an_error_becomes_an_openai_shaped_body_with_its_status() {
        let (status, headers, body) = rescued(
            "/v1/chat/completions",
            Error::new(ErrorKind::ModelNotFound, "model `x` is not served"),
        )
        .await;
        assert_eq!(status, 404);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(
            body,
            json!({"error": {"message": "model `x` is not served", "type": "invalid_request_error", "code": "model_not_found"}})
        );
    }

    #[tokio::test]
    async fn an_anthropic_client_gets_anthropics_shape() {
        let (status, _, body) = rescued(
            "/v1/messages",
            Error::new(ErrorKind::NoBackendAvailable, "every backend is full"),
        )
        .await;
        assert_eq!(status, 503);
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "every backend is full"}})
        );
    }

    #[tokio::test]
    async fn shedding_and_a_full_fleet_say_when_to_retry() {
        let (status, headers, body) = rescued(
            "/v1/chat/completions",
            Error::new(ErrorKind::SloUnmet, "no backend meets the SLO").retry_after(7),
        )
        .await;
        assert_eq!(status, 429);
        assert_eq!(headers["retry-after"], "7");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        let (_, headers, _) = rescued(
            "/v1/chat/completions",
            Error::new(ErrorKind::NoBackendAvailable, "full"),
        )
        .await;
        assert_eq!(headers["retry-after"], "1");
    }

    #[tokio::test]
    async fn a_gateway_bug_is_a_500_server_error_not_the_clients_fault() {
        let (status, _, body) = rescued(
            "/v1/chat/completions",
            Error::internal("route: lost its model"),
        )
        .await;
        assert_eq!(status, 500);
        assert_eq!(body["error"]["type"], "server_error");
        assert_eq!(body["error"]["code"], "internal_error");
    }
}
