//! The ONE function that composes the request stack, outermost first. Tower runs the first layer
//! added first on the way in (tower `ServiceBuilder`, "Order").

use std::sync::Arc;

use tower::ServiceBuilder;

use crate::config::{ApiKey, Limits};
use crate::proxy::auth::{Auth, AuthLayer};
use crate::proxy::classify::{Classes, Classify, ClassifyLayer};
use crate::proxy::forward::Forward;
use crate::proxy::request_id::{RequestIdLayer, RequestIdService};
use crate::proxy::rescue::{Rescue, RescueLayer};
use crate::proxy::rewrite::{Rewrite, RewriteLayer};
use crate::proxy::route::{Route, RouteLayer};
use crate::router::Router;

/// The gateway's request stack, outermost first.
pub type Stack = RequestIdService<Rescue<Auth<Classify<Route<Rewrite<Forward>>>>>>;

/// The gateway's request stack.
pub fn build(
    router: Arc<Router>,
    limits: Limits,
    classes: Classes,
    api_keys: Vec<ApiKey>,
    drained: crate::signal::Signal,
) -> Stack {
    ServiceBuilder::new()
        // Outermost: every response, errors included, carries the request id.
        .layer(RequestIdLayer::new())
        // Errors from any layer below become one response, shaped for the client's dialect.
        .layer(RescueLayer::new())
        // Gateway API keys, when configured (401 without one); a key may carry a class.
        .layer(AuthLayer::new(api_keys))
        // The body is read once, bounded; method, content type and JSON checked; model and
        // class found.
        .layer(ClassifyLayer::new(limits.max_body_bytes, classes))
        // A backend is chosen and an in-flight slot taken there (or 404/503).
        .layer(RouteLayer::new(router))
        // URL, credentials, model alias and include_usage for that backend.
        .layer(RewriteLayer::new())
        // The pooled upstream client; the response body is observed on its way out.
        .service(Forward::new(drained))
}
