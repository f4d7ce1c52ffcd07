//! The gateway's one error type. A [`Error`] carries what callers decide on: the HTTP status, the
//! OpenAI-style `type` and `code`, and who is at fault. The request stack's rescue layer is the
//! one place that turns it into a response, shaped for the request's dialect.

use std::borrow::Cow;
use std::fmt;

use http::StatusCode;

/// What went wrong, in the terms a response needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// 400: the body is not JSON, or a required field is missing or of the wrong type.
    InvalidRequest,
    /// 400: the prompt is longer than the context window of every backend serving its model.
    ContextLengthExceeded,
    /// 404: no such endpoint.
    NotFound,
    /// 404: no backend serves the requested model.
    ModelNotFound,
    /// 405: the endpoint exists but not for this method.
    MethodNotAllowed,
    /// 413: the body is over the configured limit.
    PayloadTooLarge,
    /// 415: the body is not JSON by its content type.
    UnsupportedMediaType,
    /// 431: the request head is over the configured limit.
    HeadersTooLarge,
    /// 408: the client did not send its body in time (or sent it too slowly).
    RequestTimeout,
    /// 401: gateway API keys are configured and the request carries none of them.
    Unauthorized,
    /// 503: the request's bearer token is a JWT whose issuer's key set could not be fetched, so
    /// it can be neither accepted nor refused.
    IdentityUnavailable,
    /// 403: the request's API key does not allow what the request claims (a class, an SLO).
    Forbidden,
    /// 503: every backend that serves the model is at its concurrency limit.
    NoBackendAvailable,
    /// 429: no backend is predicted to meet the request's SLO, and its class sheds (at once, or
    /// when its queue wait runs out).
    SloUnmet,
    /// 429: the request's API key is over its requests, tokens or concurrency limit.
    RateLimited,
    /// 429: the request's API key has spent its budget for the period.
    BudgetExhausted,
    /// 502: the upstream could not be reached, or broke before sending its response head.
    UpstreamUnreachable,
    /// 504: connecting to the upstream timed out, or a stream sent nothing before its
    /// first-token deadline (either may be retried elsewhere).
    UpstreamTimeout,
    /// 504: a request that is not a stream was accepted and not answered within its response
    /// timeout (never retried: it may be running there).
    UpstreamResponseTimeout,
    /// 500: the gateway broke one of its own rules (a layer found the request without what the
    /// layer above it promised): a bug of ours, logged as an error, never the client's fault.
    Internal,
}

/// Which side caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The client sent something we cannot serve.
    Client,
    /// An upstream failed.
    Upstream,
    /// The gateway has no capacity left.
    Gateway,
    /// The gateway itself is at fault (a bug).
    Internal,
}

impl ErrorKind {
    /// The HTTP status.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest | Self::ContextLengthExceeded => StatusCode::BAD_REQUEST,
            Self::NotFound | Self::ModelNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NoBackendAvailable | Self::IdentityUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::SloUnmet | Self::RateLimited | Self::BudgetExhausted => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout | Self::UpstreamResponseTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type` (Anthropic's `error.type` is derived from the status).
    pub(crate) fn openai_type(self) -> &'static str {
        match self {
            Self::SloUnmet | Self::RateLimited => return "rate_limit_error",
            Self::BudgetExhausted => return "insufficient_quota",
            _ => {}
        }
        match self.fault() {
            Fault::Client => "invalid_request_error",
            Fault::Upstream | Fault::Gateway | Fault::Internal => "server_error",
        }
    }

    /// Every kind, so that each error counter exists (at zero) before its first error.
    pub(crate) const ALL: [Self; 20] = [
        Self::InvalidRequest,
        Self::ContextLengthExceeded,
        Self::NotFound,
        Self::ModelNotFound,
        Self::MethodNotAllowed,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::HeadersTooLarge,
        Self::RequestTimeout,
        Self::Unauthorized,
        Self::Forbidden,
        Self::IdentityUnavailable,
        Self::NoBackendAvailable,
        Self::SloUnmet,
        Self::RateLimited,
        Self::BudgetExhausted,
        Self::UpstreamUnreachable,
        Self::UpstreamTimeout,
        Self::UpstreamResponseTimeout,
        Self::Internal,
    ];

    /// A stable `error.code`, also the metric label.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            // OpenAI's own code for it, which agents read to compact their context.
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::NotFound => "not_found",
            Self::ModelNotFound => "model_not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge => "body_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::HeadersTooLarge => "headers_too_large",
            Self::RequestTimeout => "request_timeout",
            Self::Unauthorized => "invalid_api_key",
            Self::Forbidden => "claim_not_allowed",
            Self::IdentityUnavailable => "identity_provider_unavailable",
            Self::NoBackendAvailable => "no_backend_available",
            Self::SloUnmet => "slo_unmet",
            Self::RateLimited => "rate_limit_exceeded",
            Self::BudgetExhausted => "insufficient_quota",
            Self::UpstreamUnreachable => "upstream_unreachable",
            Self::UpstreamTimeout | Self::UpstreamResponseTimeout => "upstream_timeout",
            Self::Internal => "internal_error",
        }
    }

    /// Who is at fault.
    pub(crate) fn fault(self) -> Fault {
        match self {
            Self::InvalidRequest
            | Self::ContextLengthExceeded
            | Self::NotFound
            | Self::ModelNotFound
            | Self::MethodNotAllowed
            | Self::PayloadTooLarge
            | Self::UnsupportedMediaType
            | Self::HeadersTooLarge
            | Self::RequestTimeout
            | Self::Unauthorized
            | Self::Forbidden
            | Self::RateLimited
            | Self::BudgetExhausted => Fault::Client,
            Self::NoBackendAvailable | Self::SloUnmet => Fault::Gateway,
            Self::UpstreamUnreachable
            | Self::UpstreamTimeout
            | Self::UpstreamResponseTimeout
            | Self::IdentityUnavailable => Fault::Upstream,
            Self::Internal => Fault::Internal,
        }
    }
}

/// A gateway error: a kind and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: Cow<'static, str>,
    retry_after_s: Option<u32>,
    /// Headers the response carries besides its own (a key's rate limits).
    headers: Option<Box<http::HeaderMap>>,
}

impl Error {
    /// An error of `kind` with a message for the client.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after_s: None,
            headers: None,
        }
    }

    /// The same error, telling the client to retry after `seconds` (`Retry-After`).
    #[must_use]
    pub(crate) fn retry_after(self, seconds: u32) -> Self {
        Self {
            retry_after_s: Some(seconds),
            ..self
        }
    }

    /// The same error, its response carrying `headers` too (added to any it carries).
    #[must_use]
    pub(crate) fn with_headers(mut self, headers: http::HeaderMap) -> Self {
        match &mut self.headers {
            Some(mine) => mine.extend(headers),
            None => self.headers = Some(Box::new(headers)),
        }
        self
    }

    /// Headers its response carries besides its own.
    pub(crate) fn headers(&self) -> Option<&http::HeaderMap> {
        self.headers.as_deref()
    }

    /// Seconds the client should wait before retrying, if the error says.
    pub(crate) fn retry_after_s(&self) -> Option<u32> {
        self.retry_after_s
    }

    /// Its kind.
    pub(crate) fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message for the client.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// A gateway bug: `what` the layer found missing or broken (logged; the client is told
    /// it is ours).
    pub(crate) fn internal(what: &'static str) -> Self {
        Self::new(ErrorKind::Internal, what)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.code(), self.message)
    }
}

impl std::error::Error for Error {}
