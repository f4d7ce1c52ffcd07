//! Test helpers shared by the proxy's unit tests: a response body fed frame by frame from the
//! test, as an upstream would send it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;

use crate::upstream::BodyError;

/// A body whose frames the test sends; it ends when the sender is dropped.
#[derive(Debug)]
pub(crate) struct Fed(mpsc::UnboundedReceiver<Result<Bytes, BodyError>>);

/// The sending side of a [`Fed`] body.
pub(crate) type Feed = mpsc::UnboundedSender<Result<Bytes, BodyError>>;

/// A body and its feed.
pub(crate) fn fed() -> (Feed, Fed) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, Fed(rx))
}

impl Body for Fed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.0.poll_recv(cx).map(|f| f.map(|r| r.map(Frame::data)))
    }
}

/// A backend `b` serving model `m` on a port nothing listens on (for tests that never send
/// upstream), with classes `interactive` and `batch`.
pub(crate) fn backend() -> std::sync::Arc<crate::fleet::Backend> {
    let text = "backends:\n\
        - {name: b, url: 'http://127.0.0.1:1', dialect: openai, models: {m: m}}\n\
        classes:\n\
        - {name: interactive, min_tps: 20}\n\
        - {name: batch}\n";
    let config = crate::config::parse(text, |_| None).unwrap();
    let line = std::sync::Arc::new(crate::fleet::Line::new(config.classes.len()));
    crate::fleet::Backend::new(config.backends[0].clone(), 300.0, 2, line, None).unwrap()
}

/// A router over backends `names` (each serving `m` on a port nothing listens on), with
/// `classes` (YAML flow mappings) and no exploration.
pub(crate) fn router(names: &[&str], classes: &[&str]) -> std::sync::Arc<crate::router::Router> {
    let backends: String = names
        .iter()
        .map(|name| {
            format!(
                "- {{name: {name}, url: 'http://127.0.0.1:1', dialect: openai, models: {{m: m}}}}\n"
            )
        })
        .collect();
    let classes: String = classes.iter().map(|c| format!("- {c}\n")).collect();
    let classes = if classes.is_empty() {
        String::new()
    } else {
        format!("classes:\n{classes}")
    };
    let text = format!("backends:\n{backends}{classes}routing: {{exploration: 0}}\n");
    let config = crate::config::parse(&text, |_| None).unwrap();
    let line = std::sync::Arc::new(crate::fleet::Line::new(config.classes.len()));
    let backends = config
        .backends
        .iter()
        .map(|b| {
            crate::fleet::Backend::new(
                b.clone(),
                300.0,
                config.classes.len(),
                std::sync::Arc::clone(&line),
                None,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    std::sync::Arc::new(crate::router::Router::new(
        backends,
        Default::default(),
        config.classes,
        config.routing,
        line,
    ))
}

/// A classified chat request for model `m` of class `class` (an index into the router's).
pub(crate) fn chat(router: &crate::router::Router, class: Option<usize>) -> http::Request<Bytes> {
    let mut req = http::Request::new(Bytes::from_static(b"{\"model\":\"m\"}"));
    req.extensions_mut().insert(super::classify::Classified {
        endpoint: super::endpoint::Endpoint::Chat,
        model: Some("m".to_owned()),
        stream: false,
        model_span: None,
        class: class.map(|c| std::sync::Arc::clone(&router.classes()[c].name)),
        class_index: class,
        slo: class.map(|c| router.classes()[c].slo).unwrap_or_default(),
        stream_options: None,
        max_tokens: None,
        max_tokens_span: None,
        prompt_tokens: 3,
        prompt_spans: Default::default(),
        cache_key_span: None,
        translate: true,
    });
    req
}

/// A response of `status` the gateway made (a stand-in for an upstream's answer).
pub(crate) fn answer(status: u16) -> http::Response<super::body::ProxyBody> {
    let mut resp = http::Response::new(super::body::ProxyBody::full(Bytes::new()));
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
    resp
}

/// The name of the backend a request was routed to.
pub(crate) fn routed_to<B>(req: &http::Request<B>) -> String {
    req.extensions()
        .get::<super::route::Routed>()
        .map(|r| r.backend.config.name.to_string())
        .unwrap_or_default()
}

/// Where each request a stand-in served was routed, in order.
pub(crate) type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// An OpenAI role-only first chunk: no content.
pub(crate) const ROLE: &[u8] = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
/// An OpenAI usage-only chunk (5 prompt tokens, 2 completion tokens).
pub(crate) const USAGE: &[u8] =
    b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n";

/// An OpenAI content chunk carrying `text`.
pub(crate) fn content(text: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    ))
}
