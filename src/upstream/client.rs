//! The upstream connector: TCP, and rustls (ring) for `https` backends, offering HTTP/2 and
//! HTTP/1.1 by ALPN. Roots: the platform's, else webpki's bundle, plus a backend's `ca_file`.
//! The connections it makes are kept by the backend's [`Pool`].

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::pool::Pool;
use crate::config::BackendConfig;

/// Request body sent upstream: the (possibly rewritten) client body, read once.
pub type UpstreamBody = Full<Bytes>;

/// The process-wide crypto provider: ring, as the project chose.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the connection pool for `backend`.
pub fn build(backend: &BackendConfig) -> Result<Arc<Pool>, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    if let Some(ca) = &backend.ca_file {
        let certs = CertificateDer::pem_file_iter(ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("backend {}: ca_file {}: {e}", backend.name, ca.display()))?;
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("backend {}: ca_file {}: {e}", backend.name, ca.display()))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(backend.connect_timeout));
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Pool::new(
        connector,
        backend.url.clone(),
        backend.connect_timeout,
    ))
}
