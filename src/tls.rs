//! TLS both ways, with rustls over ring (the project's one crypto provider): the server side of
//! a listener, and the client side of upstream connections.
//!
//! Client roots: the platform's, else webpki's bundle, plus a backend's own `ca_file`.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The process-wide crypto provider: ring, as the project chose.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The platform's roots (else webpki's bundle), read from disk once per process: every backend
/// (hundreds, with DNS discovery, and again at each reload) trusts the same ones.
fn platform_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        roots
    })
}

/// A client config trusting the platform's roots and, if given, the certificates in `ca_file`;
/// errors name `what` (the config field it came from). Without a `ca_file` every caller gets a
/// copy of one config, sharing its verifier and roots but with a session cache of its own (a
/// backend resumes only its own sessions, as when each built its config).
pub(crate) fn client_config(
    ca_file: Option<&Path>,
    what: &str,
) -> Result<rustls::ClientConfig, String> {
    static PLATFORM: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    match ca_file {
        None => {
            let mut config = PLATFORM
                .get_or_init(|| trusting(platform_roots().clone()))
                .clone()?;
            config.resumption = rustls::client::Resumption::default();
            Ok(config)
        }
        Some(ca) => {
            let mut roots = platform_roots().clone();
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{what}: ca_file {}: {e}", ca.display()))?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("{what}: ca_file {}: {e}", ca.display()))?;
            }
            trusting(roots)
        }
    }
}

/// A client config over ring that trusts `roots`.
fn trusting(roots: RootCertStore) -> Result<rustls::ClientConfig, String> {
    Ok(
        rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS acceptor for PEM certificate chain and key files, offering h2 and http/1.1.
pub(crate) fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, String> {
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("listen.tls.cert_file {}: {e}", cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("listen.tls.key_file {}: {e}", key_file.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("listen.tls: certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A pooled client for `http://` and `https://` servers (HTTP/1.1, Nagle off): what bench, the
/// trace exporter and `tpsgate curves` send with.
pub type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

/// Builds an [`HttpClient`]: HTTPS with the platform's roots (as the gateway trusts them) and,
/// if given, the certificates in `ca_file`; plain HTTP as well.
pub fn http_client(ca_file: Option<&Path>) -> Result<HttpClient, String> {
    let tls = client_config(ca_file, "--ca-file")?;
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
    connector.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(https),
    )
}
