//! The simulator's Responses API (`POST /v1/responses`), as vLLM serves its own: the request
//! read as chat completions and the answer written as Responses events, by the gateway's own
//! translation both ways, so that a backend with `responses_api: native` can be tested.

use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};

use super::seen::SeenRequest;
use super::server::{SimBackend, SimBody, bad_request, read_body};
use super::wire::Dialect;
use crate::translate::{Direction, HostedTools, ResponseTranslator, Thinking};

impl SimBackend {
    /// The Responses API, as vLLM serves its own: the request read as chat completions and the
    /// answer written as Responses events (the gateway's own translation both ways, so that a
    /// backend with `responses_api: native` can be tested against the simulator).
    pub(super) async fn responses(&self, req: Request<Incoming>) -> Response<SimBody> {
        let seen = SeenRequest::of(&req);
        let body = match read_body(Dialect::Chat, req).await {
            Ok(body) => body,
            Err(refused) => return refused,
        };
        let model = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|b| b["model"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let chat = match crate::translate::responses_to_chat(
            &body,
            &model,
            Thinking::Drop,
            HostedTools::Drop,
        ) {
            Ok(chat) => chat,
            Err(refused) => return bad_request(Dialect::Chat, &refused.0),
        };
        let answer = self.generate_from(Dialect::Chat, seen, &chat.body).await;
        let (mut parts, body) = answer.into_parts();
        let stream = parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if !stream {
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        parts.headers.remove(header::CONTENT_LENGTH);
        let translator = ResponseTranslator::new(
            Direction::ResponsesToChat,
            stream,
            parts.status.as_u16(),
            false,
        );
        let frames = futures_util::stream::unfold(Some((body, translator)), |state| async move {
            let (mut body, mut translator) = state?;
            loop {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else {
                            continue;
                        };
                        let out = translator.frame(&data);
                        if !out.is_empty() {
                            return Some((Ok(Frame::data(out)), Some((body, translator))));
                        }
                    }
                    Some(Err(e)) => return Some((Err(e), None)),
                    None => return Some((Ok(Frame::data(translator.finish())), None)),
                }
            }
        });
        Response::from_parts(parts, StreamBody::new(frames).boxed_unsync())
    }
}
