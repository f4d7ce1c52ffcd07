//! The upstream connector: TCP with `TCP_NODELAY` and the backend's connect timeout, and rustls
//! for `https` backends, offering HTTP/2 and HTTP/1.1 by ALPN. The connections it makes are kept
//! by the backend's [`Pool`](super::Pool).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};

use crate::config::BackendConfig;

/// A backend's connector.
pub(crate) type Connector = HttpsConnector<HttpConnector<Dial>>;

/// The connector for `backend`'s connections.
pub(crate) fn for_backend(backend: &BackendConfig) -> Result<Connector, String> {
    let what = format!("backend {}", backend.name);
    let tls = crate::tls::client_config(backend.ca_file.as_deref(), &what)?;
    let dial = match backend.dial {
        Some(address) => Dial::At(address),
        None => Dial::Host(GaiResolver::new()),
    };
    let mut http = HttpConnector::new_with_resolver(dial);
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

/// Where a backend's connections go. The URI keeps the configured host either way, so TLS
/// names (SNI, the certificate's check) and the `Host` header stay the host's.
#[derive(Debug, Clone)]
pub(crate) enum Dial {
    /// The URL's host, through the system resolver.
    Host(GaiResolver),
    /// One address discovery found for the host (the URL's port still applies).
    At(IpAddr),
}

/// What [`Dial`] resolves to.
type Addrs = std::vec::IntoIter<SocketAddr>;

impl tower::Service<Name> for Dial {
    type Response = Addrs;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Addrs>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        match self {
            // Port 0: the connector puts the URL's port in.
            Self::At(address) => {
                let at = vec![SocketAddr::new(*address, 0)].into_iter();
                Box::pin(std::future::ready(Ok(at)))
            }
            Self::Host(system) => {
                let lookup = system.call(name);
                Box::pin(async move { Ok(lookup.await?.collect::<Vec<_>>().into_iter()) })
            }
        }
    }
}
