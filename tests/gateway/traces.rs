//! OpenTelemetry traces: a span per request, continuing the client's trace and passed on to the
//! backend, exported over OTLP/HTTP to a receiver on loopback; nothing of it without `tracing:`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::support;

/// An OTLP/HTTP receiver: every export request it gets, decoded.
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

impl Receiver {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::clone(&got);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let store = Arc::clone(&store);
                            async move {
                                assert_eq!(req.uri().path(), "/v1/traces");
                                let body = req.into_body().collect().await.unwrap().to_bytes();
                                let export = ExportTraceServiceRequest::decode(body).unwrap();
                                store.lock().unwrap().push(export);
                                let mut resp = http::Response::new(Full::new(Bytes::new()));
                                resp.headers_mut().insert(
                                    http::header::CONTENT_TYPE,
                                    http::HeaderValue::from_static("application/x-protobuf"),
                                );
                                Ok::<_, std::convert::Infallible>(resp)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, got }
    }

    fn spans(&self) -> Vec<Span> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|e| &e.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

async fn chat(gw: SocketAddr, model: &str) -> support::Exchange {
    let body = format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":5,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    support::send(
        &tpsgate::bench::http_client(None).unwrap(),
        gw,
        Method::POST,
        "/v1/chat/completions",
        Some(body.as_bytes()),
        &[
            ("content-type", "application/json"),
            ("traceparent", &traceparent),
        ],
    )
    .await
}

#[tokio::test]
async fn each_request_is_a_span_of_the_clients_trace_and_the_backend_is_its_child() {
    let receiver = Receiver::start().await;
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway(&format!(
        "tracing: {{otlp_endpoint: \"http://{}/v1/traces\"}}\nbackends:\n{}",
        receiver.addr,
        support::backend_yaml("sim", sim, "openai", "    models: {m: m}\n")
    ))
    .await;
    let ok = chat(gw.addr(), "m").await;
    assert_eq!(ok.status, 200);
    assert!(ok.error.is_none());
    let missing = chat(gw.addr(), "nope").await;
    assert_eq!(missing.status, 404);
    gw.stop().await; // exports what is buffered

    let spans = receiver.spans();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let chat_span = spans.iter().find(|s| s.name == "chat m").unwrap();
    assert_eq!(
        hex(&chat_span.trace_id),
        TRACE,
        "the client's trace continues"
    );
    assert_eq!(hex(&chat_span.parent_span_id), CLIENT_SPAN);
    let text = |key| match attribute(chat_span, key) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        other => panic!("{key}: {other:?}"),
    };
    let int = |key| match attribute(chat_span, key) {
        Some(AnyValue::IntValue(n)) => *n,
        other => panic!("{key}: {other:?}"),
    };
    let float = |key| match attribute(chat_span, key) {
        Some(AnyValue::DoubleValue(x)) => *x,
        other => panic!("{key}: {other:?}"),
    };
    assert_eq!(text("gen_ai.operation.name"), "chat");
    assert_eq!(text("gen_ai.request.model"), "m");
    assert_eq!(int("gen_ai.usage.output_tokens"), 5);
    assert_eq!(text("tpsgate.backend"), "sim");
    assert_eq!(
        text("tpsgate.route.reason"),
        ok.headers["x-tpsgate-route-reason"].to_str().unwrap()
    );
    assert_eq!(int("http.response.status_code"), 200);
    assert!(float("tpsgate.ttft_s") > 0.0 && float("tpsgate.backend_ttft_s") > 0.0);
    assert!(chat_span.end_time_unix_nano > chat_span.start_time_unix_nano);

    // The backend saw this span as its parent, in the same trace.
    let seen = support::seen(sim).await;
    let upstream = seen[0]["traceparent"].as_str().unwrap();
    assert_eq!(
        upstream,
        format!("00-{TRACE}-{}-01", hex(&chat_span.span_id)),
        "the backend's parent is the gateway's span"
    );

    // An answer of the gateway's own is a span too, marked as the error it was.
    let error = spans.iter().find(|s| s.name != "chat m").unwrap();
    assert_eq!(error.name, "POST /v1/chat/completions");
    assert_eq!(hex(&error.trace_id), TRACE);
    assert!(
        matches!(attribute(error, "error.type"), Some(AnyValue::StringValue(c)) if c == "model_not_found")
    );
    assert_eq!(
        error.status.as_ref().map(|s| s.code),
        Some(2),
        "status ERROR"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tracing_the_clients_traceparent_passes_unchanged() {
    let (_fleet, sim) = support::start_engine("sim", support::engine(1.0, 0.0, 8)).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    assert_eq!(chat(gw.addr(), "m").await.status, 200);
    let seen = support::seen(sim).await;
    assert_eq!(
        seen[0]["traceparent"],
        format!("00-{TRACE}-{CLIENT_SPAN}-01")
    );
}
