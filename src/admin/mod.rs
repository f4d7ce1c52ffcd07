//! The admin plane, on its own listener (loopback by default): `/healthz` (the process is up),
//! `/readyz` (accepting traffic; 503 while draining), `/metrics` (Prometheus, [`metrics`]),
//! `/admin/backends`, `/admin/curves`, `/admin/cluster`, `/admin/reload` and the dashboard at
//! `/`.

pub(crate) mod export;
mod keys;
pub(crate) mod keys_cli;
pub(crate) mod metrics;
pub(crate) mod remote;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use serde_json::json;

use crate::config::BackendDialect;
use crate::live::{Live, ReloadStatus};
use crate::router::Router;

/// The dashboard: one self-contained page (inline CSS, JS and SVG; no CDN) that plots every
/// backend's curve from `/admin/curves`.
const DASHBOARD: &str = include_str!("dashboard.html");

/// What the admin endpoints read.
#[derive(Debug)]
pub(crate) struct AdminState {
    /// The running config's stack and router (swapped by reloads).
    pub live: Arc<arc_swap::ArcSwap<Live>>,
    /// False once draining has begun.
    pub ready: AtomicBool,
    /// Bearer token for `/metrics` and `/admin/*`, if configured.
    pub token: Option<crate::config::Secret>,
    /// Host names `/metrics` and `/admin/*` answer to without a token, beside IP addresses and
    /// `localhost`.
    pub hosts: Vec<String>,
    /// How the last reload went.
    pub reload: Arc<Mutex<ReloadStatus>>,
    /// The cluster link, when the gateway runs in a cluster.
    pub cluster: Option<Arc<crate::cluster::Status>>,
}

/// Whether `req` may read the admin data: `Authorization: Bearer` with the token (the scheme in
/// any case; compared in constant time), or, with no token configured, a request addressed to
/// the gateway by an IP address, `localhost` or an allowed host name. A web page that rebinds
/// its own name to 127.0.0.1 (DNS rebinding) sends its own name as `Host`, and is refused.
fn authorized<B>(state: &AdminState, req: &Request<B>) -> bool {
    match &state.token {
        Some(_) => holds_token(state, req),
        None => addressed_directly(req, &state.hosts),
    }
}

/// Whether `req` carries the admin token (`Authorization: Bearer`, the scheme in any case,
/// compared in constant time); never without one configured.
fn holds_token<B>(state: &AdminState, req: &Request<B>) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(token) = &state.token else {
        return false;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
        .and_then(|v| {
            let scheme = b"bearer ";
            (v.len() > scheme.len() && v[..scheme.len()].eq_ignore_ascii_case(scheme))
                .then(|| v[scheme.len()..].trim_ascii())
        })
        .unwrap_or(b"");
    bool::from(given.ct_eq(token.expose().as_bytes()))
}

/// Whether the request names the admin listener by an IP address, `localhost` or one of
/// `hosts` (the `Host` header, or an HTTP/2 `:authority`).
fn addressed_directly<B>(req: &Request<B>, hosts: &[String]) -> bool {
    let authority = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(http::uri::Authority::as_str));
    let Some(authority) = authority else {
        // HTTP/1.0 without Host: not a browser.
        return true;
    };
    let host = match authority.strip_prefix('[') {
        // [IPv6]:port
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.parse::<std::net::IpAddr>().is_ok()
        || host.eq_ignore_ascii_case("localhost")
        || hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
}

/// Headers every admin answer carries: no content sniffing; the dashboard page also loads
/// nothing but itself (its script and style are inline) and talks only to this origin.
fn secure(resp: &mut Response<Full<Bytes>>, page: bool) {
    let headers = resp.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if page {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
        );
    }
}

/// Answers one admin request.
pub(crate) async fn handle<B>(
    state: Arc<AdminState>,
    req: Request<B>,
) -> Result<Response<Full<Bytes>>, Infallible>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let page = req.uri().path() == "/";
    let keys = req.uri().path() == "/admin/keys" || req.uri().path().starts_with("/admin/keys/");
    let mut resp = if keys && authorized(&state, &req) {
        let (status, body) = keys::answer(&state, req).await;
        let mut resp = json_response(status, &body);
        // Some answers carry a secret, shown once: no cache may keep it.
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    } else {
        answer(&state, &req)
    };
    secure(&mut resp, page);
    Ok(resp)
}

/// A JSON answer.
fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn answer<B>(state: &AdminState, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() == "/" {
        let mut resp = Response::new(Full::new(Bytes::from_static(DASHBOARD.as_bytes())));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        return resp;
    }
    let open = matches!(req.uri().path(), "/healthz" | "/readyz");
    if !open && !authorized(state, req) {
        let message = if state.token.is_some() {
            "the admin plane needs Authorization: Bearer TOKEN (admin.token_env)"
        } else {
            "the admin plane answers only to its IP address, localhost or admin.allowed_hosts (or set admin.token_env)"
        };
        let body = json!({"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}});
        return json_response(StatusCode::UNAUTHORIZED, &body);
    }
    if let Some(format) = export::Format::of_path(req.uri().path()) {
        let doc = curves(&state.live.load().router);
        let mut resp = Response::new(Full::new(Bytes::from(format.render(&doc))));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        );
        headers.insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static(format.disposition()),
        );
        return resp;
    }
    if req.uri().path() == "/metrics" {
        let unix_s = crate::tenant::unix_now();
        for tenant in state.live.load().every_tenant() {
            tenant.publish(unix_s);
        }
        let last_reload = state
            .reload
            .lock()
            .ok()
            .and_then(|s| s.last_at_unix_s.zip(s.last_ok));
        let mut resp = Response::new(Full::new(Bytes::from(metrics::render(
            &state.live.load().router,
            last_reload,
        ))));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return resp;
    }
    let (status, body) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, json!({"status": "ok"})),
        "/readyz" if state.ready.load(Ordering::Relaxed) => {
            (StatusCode::OK, json!({"status": "ready"}))
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining"}),
        ),
        "/admin/backends" => (StatusCode::OK, backends(&state.live.load().router)),
        "/admin/curves" => (StatusCode::OK, curves(&state.live.load().router)),
        "/admin/cluster" => (StatusCode::OK, cluster(state.cluster.as_deref())),
        "/admin/reload" => {
            let status = state.reload.lock().map(|s| s.clone()).unwrap_or_default();
            (StatusCode::OK, json!(status))
        }
        _ => (
            StatusCode::NOT_FOUND,
            json!({"error": {"message": "no such admin endpoint; try /metrics, /healthz, /readyz, /admin/backends, /admin/curves (.svg, .csv), /admin/cluster, /admin/keys, /admin/reload", "type": "invalid_request_error", "code": "not_found"}}),
        ),
    };
    json_response(status, &body)
}

fn backends(router: &Router) -> serde_json::Value {
    let list: Vec<_> = router
        .backends()
        .iter()
        .map(|b| {
            let c = &b.config;
            let (health, health_for_s) = b.health();
            json!({
                "name": &*c.name,
                "url": c.url.to_string(),
                "address": c.dial.map(|a| a.to_string()),
                "dialect": match c.dialect { BackendDialect::Openai => "openai", BackendDialect::Anthropic => "anthropic" },
                "models": c.models.aliases,
                "passthrough": c.models.passthrough,
                "health": health.label(),
                "health_for_s": health_for_s,
                "in_flight": b.in_flight(),
                "in_flight_here": b.local_in_flight(),
                "max_concurrency": c.max_concurrency,
                "ramp_allowance": b.ramp.allowance(),
                "prefix_index": b.prefix.as_ref().map(|i| i.view()),
                "context_windows": b.windows.view(),
            })
        })
        .collect();
    json!({"backends": list})
}

/// Every backend's curve per model: counters, measured buckets, the fit, and the derived
/// concurrency cap per class.
fn curves(router: &Router) -> serde_json::Value {
    let now = tokio::time::Instant::now();
    let classes = router.classes();
    let caps = router.caps(now);
    let mut list = Vec::new();
    for b in router.backends() {
        for entry in &b.curves {
            let curve = entry.value();
            let counts = curve.counts();
            let attainment: serde_json::Map<String, serde_json::Value> = classes
                .iter()
                .filter(|c| !c.slo.is_batch())
                .map(|c| {
                    let share = curve.attainment(c.slo.min_tps, c.slo.max_ttft_s);
                    (c.name.to_string(), json!(share))
                })
                .collect();
            let derived_caps: serde_json::Map<String, serde_json::Value> = caps
                .iter()
                .filter(|cap| cap.backend == b.config.name && cap.model == *entry.key())
                .map(|cap| (cap.class.to_string(), json!(cap.cap)))
                .collect();
            list.push(json!({
                "backend": &*b.config.name,
                "concurrency_caps": derived_caps,
                "slo_attainment": attainment,
                "model": &**entry.key(),
                "in_flight": b.in_flight(),
                "observations": counts.observations,
                "estimated_share": counts.estimated_share,
                "cancelled": counts.cancelled,
                "half_life_s": b.half_life_s,
                "points": curve.points(now),
                "fit": curve.fit(now),
                "predicted": predicted(curve),
            }));
        }
    }
    let standings = router.standings();
    let classes: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let standing = standings.iter().find(|s| s.class == c.name);
            let refusals: serde_json::Map<String, serde_json::Value> = router
                .refusals(i)
                .into_iter()
                .map(|(cause, n)| (cause.to_owned(), json!(n)))
                .collect();
            json!({"name": &*c.name, "min_tps": c.slo.min_tps, "max_ttft_s": c.slo.max_ttft_s, "tps_percentile": c.slo.tps_percentile, "ttft_percentile": c.slo.ttft_percentile, "policy": c.policy, "on_miss": c.on_miss,
                "feasible": standing.and_then(|s| s.feasible), "best_backend": standing.and_then(|s| s.best.as_ref()).map(best_json),
                "refusals": refusals})
        })
        .collect();
    let capacity: Vec<_> = crate::router::capacity(&caps)
        .into_iter()
        .map(|c| {
            json!({"model": &*c.model, "class": &*c.class, "within_slo": c.within_slo,
                "in_flight": c.in_flight, "spare_requests_per_second": c.spare_rps})
        })
        .collect();
    json!({"curves": list, "classes": classes, "capacity": capacity})
}

/// The backend likeliest to meet a class's SLO alone, as `/admin/curves` shows it.
fn best_json(best: &crate::router::Best) -> serde_json::Value {
    json!({
        "backend": &*best.backend,
        "model": &*best.model,
        "per_user_tps_p50": best.per_user_tps_p50,
        "per_user_tps_p10": best.per_user_tps_p10,
        "ttft_p50_s": best.ttft_p50_s,
        "ttft_p90_s": best.ttft_p90_s,
        "chance": best.chance,
    })
}

/// What the curve's current model predicts for one more request (with a short prompt) joining
/// at each occupancy up to 16: what routing reads, before the live floors of requests still
/// waiting for their first token.
fn predicted(curve: &crate::curve::Curve) -> Vec<serde_json::Value> {
    let Some(model) = curve.model() else {
        return Vec::new();
    };
    (1..=16_u32)
        .map(|n| {
            let p = model.predict(f64::from(n), 0.0, 0);
            json!({"concurrency": n, "ttft_p50_s": p.ttft_p50_s, "per_user_tps_p50": p.per_user_tps_p50})
        })
        .collect()
}

/// `/admin/cluster`: this replica, its link to the cluster's Redis and its peers; or that it
/// runs alone.
fn cluster(status: Option<&crate::cluster::Status>) -> serde_json::Value {
    match status {
        Some(status) => json!({"enabled": true, "cluster": status.report()}),
        None => json!({"enabled": false}),
    }
}
