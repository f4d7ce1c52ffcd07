//! The upstream connector: TCP with `TCP_NODELAY` and the backend's connect timeout, and rustls
//! for `https` backends, offering HTTP/2 and HTTP/1.1 by ALPN. The connections it makes are kept
//! by the backend's [`Pool`](super::Pool).

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::config::BackendConfig;

/// The connector for `backend`'s connections.
pub fn for_backend(backend: &BackendConfig) -> Result<HttpsConnector<HttpConnector>, String> {
    let what = format!("backend {}", backend.name);
    let tls = crate::tls::client_config(backend.ca_file.as_deref(), &what)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(backend.connect_timeout));
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http))
}
