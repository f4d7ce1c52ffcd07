//! What the simulator remembers of each generation request (`GET /sim/requests`): what a
//! gateway sent upstream, for the tests to read.

use http::Request;
use hyper::body::Incoming;
use serde_json::Value;

/// What a generation request looked like on arrival, for `GET /sim/requests`: tests read it to
/// check what a gateway sent upstream.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SeenRequest {
    /// Request path.
    pub path: String,
    /// Its query string, if any.
    pub query: Option<String>,
    /// The server it was addressed to: the `Host` header (HTTP/1.1) or the authority (h2).
    pub host: Option<String>,
    /// The `model` of the body, if it parsed.
    pub model: Option<String>,
    /// The prompt's size, tokens (bytes of text over 4), if the body parsed.
    pub prompt_tokens: Option<u32>,
    /// Of those, served from the prefix cache (with one).
    pub cached_tokens: Option<u32>,
    /// Its `max_tokens`, if it set one.
    pub max_tokens: Option<u32>,
    /// The `authorization` header.
    pub authorization: Option<String>,
    /// The `x-api-key` header.
    pub x_api_key: Option<String>,
    /// The `anthropic-version` header.
    pub anthropic_version: Option<String>,
    /// The `x-request-id` header.
    pub request_id: Option<String>,
    /// The W3C `traceparent` header.
    pub traceparent: Option<String>,
    /// Every header name received, in order.
    pub header_names: Vec<String>,
    /// What the body said of reasoning, where it said anything: those of its fields
    /// `chat_template_kwargs`, `reasoning_effort`, `thinking` and `output_config` it carried.
    pub reasoning: Option<serde_json::Map<String, Value>>,
}

/// The body's fields that switch a model's reasoning, in either dialect.
const REASONING_FIELDS: [&str; 4] = [
    "chat_template_kwargs",
    "reasoning_effort",
    "thinking",
    "output_config",
];

/// Those of [`REASONING_FIELDS`] `body` carries, if any.
pub(super) fn reasoning_of(body: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let mut fields: serde_json::Map<String, Value> = serde_json::from_slice(body).ok()?;
    fields.retain(|k, _| REASONING_FIELDS.contains(&k.as_str()));
    (!fields.is_empty()).then_some(fields)
}

impl SeenRequest {
    /// What `req` shows before its body is read.
    pub(super) fn of(req: &Request<Incoming>) -> Self {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Self {
            path: req.uri().path().to_owned(),
            query: req.uri().query().map(str::to_owned),
            host: header("host").or_else(|| req.uri().authority().map(|a| a.to_string())),
            model: None,
            prompt_tokens: None,
            cached_tokens: None,
            max_tokens: None,
            authorization: header("authorization"),
            x_api_key: header("x-api-key"),
            anthropic_version: header("anthropic-version"),
            request_id: header("x-request-id"),
            traceparent: header("traceparent"),
            header_names: req
                .headers()
                .keys()
                .map(|n| n.as_str().to_owned())
                .collect(),
            reasoning: None,
        }
    }
}
