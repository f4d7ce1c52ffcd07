//! The floor under tpsgate's overhead: a reverse proxy with nothing but hyper's HTTP/1 server and
//! hyper-util's pooled client, both bodies streamed through untouched. `benches/overhead.sh`
//! runs it as its own arm, so the table can say how much of tpsgate's cost is the HTTP stack it
//! is built on and how much is tpsgate.
//!
//! Usage: `cargo run --release --example bare_proxy -- LISTEN UPSTREAM`
//! (e.g. `127.0.0.1:9204 127.0.0.1:9201`); one thread, like the benchmark's tpsgate.

use std::net::SocketAddr;

use http::Uri;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Upstream = Client<HttpConnector, Incoming>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare_proxy LISTEN UPSTREAM";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstream: String = args.next().ok_or(usage)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(listen, upstream))
}

async fn serve(listen: SocketAddr, upstream: String) -> Result<(), Box<dyn std::error::Error>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new()).build(connector);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let client = client.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let service = service_fn(move |mut request: http::Request<Incoming>| {
                let client = client.clone();
                let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
                let uri = format!("http://{upstream}{path}").parse::<Uri>();
                async move {
                    let uri = uri.map_err(|e| e.to_string())?;
                    *request.uri_mut() = uri;
                    client.request(request).await.map_err(|e| e.to_string())
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
