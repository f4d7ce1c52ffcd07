//! Upstream providers at runtime: the connector ([`client`]) and connection pool ([`pool`]) of
//! each backend, and each backend's live state ([`backend`]).

pub mod backend;
pub mod client;
pub mod h1;
pub mod pool;

pub use backend::{Backend, InFlightGuard};
pub use client::UpstreamBody;
pub use pool::{Pool, PooledBody};

/// Errors a response body can end with: an upstream's (our HTTP/1.1 client's, hyper's HTTP/2),
/// or the gateway's own.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

use http::Request;
use http::request::Parts;

/// A copy of a request, to send again: the body is shared (bytes are reference-counted), the
/// head is copied.
pub fn copy_request<B: Clone>(parts: &Parts, body: &B) -> Request<B> {
    let mut req = Request::new(body.clone());
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    *req.extensions_mut() = parts.extensions.clone();
    req
}
