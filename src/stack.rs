//! The ONE function that composes the request stack, outermost first. Tower runs the first layer
//! added first on the way in (tower `ServiceBuilder`, "Order").

use std::sync::Arc;

use http::{HeaderName, Method};
use tower::ServiceBuilder;
use tower::util::Either;
use tower_http::cors::{AllowOrigin, Any, Cors, CorsLayer};

use crate::config::{self, Config};
use crate::jwt::Jwt;
use crate::keystore::KeyStore;
use crate::otel::Tracing;
use crate::proxy::auth::{Auth, AuthLayer};
use crate::proxy::classify::{BodyPace, Classes, Classify, ClassifyLayer};
use crate::proxy::forward::Forward;
use crate::proxy::limits::{HeadLimit, HeadLimitLayer};
use crate::proxy::models::{Models, ModelsLayer};
use crate::proxy::quota::{QuotaLayer, Quotas};
use crate::proxy::request_id::{RequestIdLayer, RequestIdService};
use crate::proxy::rescue::{Rescue, RescueLayer};
use crate::proxy::retry::{Retry, RetryBudget, RetryLayer};
use crate::proxy::rewrite::{Rewrite, RewriteLayer};
use crate::proxy::route::{Route, RouteLayer};
use crate::router::Router;
use crate::signal::Signal;
use crate::tenant::Tenants;

/// The gateway's request stack, outermost first.
pub(crate) type Stack = RequestIdService<Either<Cors<Inner>, Inner>>;

/// Below the optional CORS layer.
pub(crate) type Inner =
    Rescue<HeadLimit<Auth<Classify<Models<Quotas<Retry<Route<Rewrite<Forward>>>>>>>>>;

/// The gateway's request stack for `config`, routing with `router`, holding its API keys to
/// `tenants` (one per key, then one per JWT tenant, in order) and accepting the virtual
/// `keys` and the tokens of `jwt`; `drained` ends the streams still open at the drain
/// deadline; `tracing` makes a span of each request.
pub(crate) fn build(
    config: &Config,
    router: Arc<Router>,
    tenants: &Tenants,
    keys: &Arc<KeyStore>,
    jwt: Option<&Arc<Jwt>>,
    drained: Signal,
    tracing: Option<&Tracing>,
) -> Stack {
    let classes = Classes::new(
        config.classes.clone(),
        config.default_class,
        config.routes.clone(),
    );
    let budget = RetryBudget::new(config.routing.retry_budget);
    ServiceBuilder::new()
        // Outermost: every response, errors included, carries the request id; with tracing:,
        // every request a span (errors included) continuing the client's trace.
        .layer(RequestIdLayer::new(tracing.cloned()))
        // Browser clients, when configured: preflights answered here (no key needed), and every
        // response, errors included, readable by an allowed origin.
        .option_layer(config.cors.as_ref().map(cors))
        // Errors from any layer below become one response, shaped for the client's dialect.
        .layer(RescueLayer::new())
        // The head within its limit (431), on HTTP/1.1 and HTTP/2 alike, before anything reads it.
        .layer(HeadLimitLayer::new(config.limits.max_header_bytes))
        // Gateway API keys, the config's and the admin API's, when there are any (401 without
        // one); a key may carry a class and limits.
        .layer(AuthLayer::new(
            config.api_keys.clone(),
            tenants,
            Arc::clone(keys),
            jwt.cloned(),
        ))
        // The body is read once, bounded; method, content type and JSON checked; model and
        // class found.
        .layer(ClassifyLayer::new(
            config.limits.max_body_bytes,
            BodyPace {
                grace: config.limits.body_read_timeout,
                min_rate: config.limits.body_min_rate,
            },
            classes,
        ))
        // `GET /v1/models` is the gateway's own answer, from the backends it routes to.
        .layer(ModelsLayer::new(Arc::clone(&router)))
        // Each key within its limits (429 over one), its rate limits in every answer; above
        // Retry, so that a request counts once.
        .layer(QuotaLayer)
        // Above Route: each attempt is routed afresh, avoiding the backends that failed it.
        .layer(RetryLayer::new(
            Arc::clone(&router),
            config.routing.max_attempts,
            budget,
        ))
        // A backend is chosen and an in-flight slot taken there (or 404/429/503, or a wait in
        // the class's line).
        .layer(RouteLayer::new(router))
        // URL, credentials, model alias and include_usage for that backend.
        .layer(RewriteLayer::new())
        // The pooled upstream client; the response body is timed and metered on its way out.
        .service(Forward::new(drained))
}

/// The CORS layer of `cors:`: the gateway's endpoints' methods, any request header (keys,
/// classes and SLO headers included; no cookies are ever allowed), and the gateway's response
/// headers readable by the page.
fn cors(c: &config::Cors) -> CorsLayer {
    let origin = match &c.origins {
        None => AllowOrigin::any(),
        Some(list) => AllowOrigin::list(list.iter().cloned()),
    };
    CorsLayer::new()
        .allow_origin(origin)
        .allow_methods([Method::GET, Method::HEAD, Method::POST, Method::DELETE])
        .allow_headers(Any)
        .expose_headers([
            HeaderName::from_static("x-request-id"),
            HeaderName::from_static("x-tpsgate-backend"),
            HeaderName::from_static("x-tpsgate-class"),
        ])
        .max_age(c.max_age)
}
