//! The transport to upstream providers: per backend, a [`Pool`] of connections made by the
//! [`connector`] (TCP, and rustls for `https`), speaking HTTP/1.1 through our own client ([`h1`])
//! or HTTP/2 through hyper's.
//!
//! Transport only: it imports `config` (a backend's URL, TLS files and timeouts) and `tls`, and
//! nothing of routing, curves or the request stack.

pub(crate) mod connector;
pub(crate) mod h1;
pub(crate) mod pool;

pub(crate) use pool::{Pool, PooledBody, SendError};

/// Request body sent upstream: the (possibly rewritten) client body, read once.
pub(crate) type UpstreamBody = http_body_util::Full<bytes::Bytes>;

/// Errors a response body can end with: an upstream's (our HTTP/1.1 client's, hyper's HTTP/2),
/// or the gateway's own.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;
