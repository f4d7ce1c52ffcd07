//! Rewrite: turn the client's request into the upstream's. Only these change:
//! - the URL: the backend's base URL plus the client's path and query;
//! - `model`: the alias resolved to the upstream name (only those bytes of the body);
//! - for OpenAI streams, `stream_options.include_usage: true` when the client did not ask for
//!   usage (the gateway strips that usage chunk from the response again);
//! - headers: hop-by-hop headers dropped, the client's credentials dropped (unless the backend
//!   says `forward_client_auth`), the backend's credentials and extra headers added.
//!
//! A request for a backend of the other dialect is translated instead (`crate::translate`):
//! its body rebuilt, its path the backend's endpoint; a field the backend cannot express is a
//! 400 naming it.

use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Uri};
use tower::{Layer, Service};

use super::classify::Classified;
use super::route::Routed;
use crate::config::{BackendConfig, BackendDialect};
use crate::error::{Error, ErrorKind};
use crate::translate::{self, Direction};
use crate::upstream::UpstreamBody;

/// Rewrites requests for their backend.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RewriteLayer;

impl RewriteLayer {
    /// The layer.
    pub(crate) const fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for RewriteLayer {
    type Service = Rewrite<S>;

    fn layer(&self, inner: S) -> Rewrite<S> {
        Rewrite { inner }
    }
}

/// See [`RewriteLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Rewrite<S> {
    inner: S,
}

impl<S> Service<Request<Bytes>> for Rewrite<S>
where
    S: Service<Request<UpstreamBody>, Error = Error>,
{
    type Response = S::Response;
    type Error = Error;
    type Future = futures_util::future::Either<
        futures_util::future::Ready<Result<S::Response, Error>>,
        S::Future,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        match rewrite(req) {
            Ok(req) => futures_util::future::Either::Right(self.inner.call(req)),
            Err(err) => futures_util::future::Either::Left(futures_util::future::ready(Err(err))),
        }
    }
}

/// Builds the upstream request.
pub(crate) fn rewrite(req: Request<Bytes>) -> Result<Request<UpstreamBody>, Error> {
    let (mut parts, body) = req.into_parts();
    let classified = parts
        .extensions
        .get::<Classified>()
        .ok_or_else(|| Error::internal("rewrite: the request was not classified"))?;
    let routed = parts
        .extensions
        .get::<Routed>()
        .ok_or_else(|| Error::internal("rewrite: the request has no route"))?;
    let backend = &routed.backend.config;
    let mut told = Told::default();
    let room = classified.model.as_deref().and_then(|model| {
        let window = routed.backend.windows.of(backend, model)?;
        Some(crate::fleet::window::room(window, classified.prompt_tokens))
    });
    // The output budget cut to what the backend's context window leaves beside the prompt.
    let clamped = room.filter(|room| classified.max_tokens.is_some_and(|n| n > *room));
    if let Some(room) = clamped {
        tracing::debug!(
            backend = %backend.name,
            asked = classified.max_tokens,
            room,
            "max_tokens cut to fit the backend's context window"
        );
        told.clamped_max_tokens = Some(HeaderValue::from(room));
    }

    let body = match routed.translate {
        None => {
            let inject = classified.usage_injected();
            let edits = Edits {
                upstream_model: routed.upstream_model.as_deref(),
                inject_usage: inject,
                max_tokens: clamped,
            };
            rewrite_body(&body, classified, edits)
        }
        Some(direction) => {
            let model = routed
                .upstream_model
                .as_deref()
                .or(classified.model.as_deref())
                .unwrap_or_default();
            // The cut budget goes into the client's body, which the translation then reads; a
            // request that set none gets the backend's default, within the room.
            let body = match (clamped, &classified.max_tokens_span) {
                (Some(room), Some(span)) => {
                    splice(&body, &[(span.clone(), room.to_string().into_bytes())])
                }
                _ => body,
            };
            let default_max_tokens = room.map_or(backend.default_max_tokens, |room| {
                backend.default_max_tokens.min(room)
            });
            let translated = match direction {
                Direction::ChatToMessages => {
                    translate::chat_to_messages(&body, model, default_max_tokens)
                }
                Direction::MessagesToChat => {
                    translate::messages_to_chat(&body, model, backend.thinking)
                }
                Direction::CountToTokenize => translate::count_to_tokenize(&body, model),
                Direction::ResponsesToChat => translate::responses_to_chat(
                    &body,
                    model,
                    backend.thinking,
                    backend.hosted_tools,
                )
                .map(|chat| dropped_tools(&mut told, backend, chat)),
                // Through chat completions: no reasoning switch of the chat kind is written.
                Direction::ResponsesToMessages => {
                    let thinking = translate::Thinking::Drop;
                    translate::responses_to_chat(&body, model, thinking, backend.hosted_tools)
                        .and_then(|chat| {
                            let chat = dropped_tools(&mut told, backend, chat);
                            translate::chat_to_messages(&chat, model, default_max_tokens)
                        })
                }
            };
            let translated = translated.map_err(|refused| {
                let why = if direction == Direction::ResponsesToChat {
                    "serves chat completions only (responses_api: translate)"
                } else {
                    "speaks the other dialect"
                };
                Error::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "backend {} {why} and this request cannot be translated for it: {refused}",
                        backend.name
                    ),
                )
            })?;
            if !matches!(
                direction,
                Direction::ChatToMessages | Direction::ResponsesToMessages
            ) {
                parts.headers.remove("anthropic-version");
                parts.headers.remove("anthropic-beta");
            }
            Bytes::from(translated)
        }
    };

    let path = routed.translate.map(Direction::backend_path);
    parts.uri = upstream_uri(backend, &parts.uri, path)?;
    // The version stays the client's: the pool sets its connection's own.
    rewrite_headers(&mut parts.headers, backend, body.len());
    if told.any() {
        parts.extensions.insert(told);
    }
    Ok(Request::from_parts(parts, UpstreamBody::new(body)))
}

/// The tools a translated Responses request left out, named in the log and, through the
/// upstream request's extensions, in the response's `x-tpsgate-dropped-tools`; the chat request.
fn dropped_tools(
    told: &mut Told,
    backend: &BackendConfig,
    chat: translate::ChatRequest,
) -> Vec<u8> {
    if !chat.dropped_tools.is_empty() {
        let names = chat.dropped_tools.join(", ");
        tracing::info!(
            backend = %backend.name,
            tools = %names,
            "tools the backend cannot run left out of a translated Responses request (hosted_tools: drop)"
        );
        told.dropped_tools = HeaderValue::from_str(&names).ok();
    }
    chat.body
}

/// `x-tpsgate-dropped-tools`: the tools a translated Responses request left out because the
/// backend cannot run them (`hosted_tools: drop`), comma-separated.
pub(crate) const X_TPSGATE_DROPPED_TOOLS: HeaderName =
    HeaderName::from_static("x-tpsgate-dropped-tools");

/// `x-tpsgate-clamped-max-tokens`: the output budget the request was sent with, where its own
/// (`max_tokens`, `max_completion_tokens`, `max_output_tokens`) did not fit in the backend's
/// context window beside its prompt.
pub(crate) const X_TPSGATE_CLAMPED_MAX_TOKENS: HeaderName =
    HeaderName::from_static("x-tpsgate-clamped-max-tokens");

/// What the rewrite changed that the response tells the client, as headers; in the upstream
/// request's extensions for `forward.rs`, where something was.
#[derive(Debug, Clone, Default)]
pub(crate) struct Told {
    /// `x-tpsgate-dropped-tools`.
    dropped_tools: Option<HeaderValue>,
    /// `x-tpsgate-clamped-max-tokens`.
    clamped_max_tokens: Option<HeaderValue>,
}

impl Told {
    fn any(&self) -> bool {
        self.dropped_tools.is_some() || self.clamped_max_tokens.is_some()
    }

    /// Puts them into the response's `headers`.
    pub(crate) fn tell(&self, headers: &mut HeaderMap) {
        let told = [
            (X_TPSGATE_DROPPED_TOOLS, &self.dropped_tools),
            (X_TPSGATE_CLAMPED_MAX_TOKENS, &self.clamped_max_tokens),
        ];
        for (name, value) in told {
            if let Some(value) = value {
                headers.insert(name, value.clone());
            }
        }
    }
}

/// The backend's URI for the client's `client` (its path replaced by `path` where given).
fn upstream_uri(backend: &BackendConfig, client: &Uri, path: Option<&str>) -> Result<Uri, Error> {
    let unforwardable = || {
        Error::new(
            ErrorKind::InvalidRequest,
            "the request path cannot be forwarded",
        )
    };
    let base = &backend.url;
    let prefix = base.path().trim_end_matches('/');
    // The client's path as it came (already parsed, shared, not copied) unless the backend
    // puts a path in front, replaces its `/v1` or adds to its query.
    let path_and_query = match client.path_and_query() {
        Some(p)
            if path.is_none()
                && prefix.is_empty()
                && backend.path_prefix.is_none()
                && backend.query.is_none() =>
        {
            p.clone()
        }
        _ => {
            let translated = path.is_some();
            let mut path = path.unwrap_or(client.path());
            let mut out = String::with_capacity(128);
            out.push_str(prefix);
            if let Some(replacement) = &backend.path_prefix
                && let Some(rest) = path.strip_prefix("/v1")
                && (rest.is_empty() || rest.starts_with('/'))
            {
                out.push_str(replacement);
                path = rest;
            }
            out.push_str(path);
            // A translated request's query is its own dialect's (`?beta=true` on Anthropic's
            // messages): the backend's endpoint is another API's, and is sent only its own.
            let client_query = client.query().filter(|_| !translated);
            let queries = [client_query, backend.query.as_deref()];
            for (i, q) in queries
                .into_iter()
                .flatten()
                .filter(|q| !q.is_empty())
                .enumerate()
            {
                out.push(if i == 0 { '?' } else { '&' });
                out.push_str(q);
            }
            http::uri::PathAndQuery::try_from(out).map_err(|_| unforwardable())?
        }
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(base.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP));
    parts.authority = base.authority().cloned();
    parts.path_and_query = Some(path_and_query);
    Uri::from_parts(parts).map_err(|_| unforwardable())
}

/// What [`rewrite_body`] changes in a request's bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Edits<'a> {
    /// The model name the backend knows, where it differs from the client's.
    pub upstream_model: Option<&'a str>,
    /// `stream_options.include_usage: true` goes in.
    pub inject_usage: bool,
    /// The output budget that replaces the client's, cut to a context window.
    pub max_tokens: Option<u32>,
}

/// Splices the upstream model name, `include_usage` and a cut output budget into the client's
/// bytes; everything else stays as the client wrote it.
pub fn rewrite_body(body: &Bytes, c: &Classified, edits: Edits<'_>) -> Bytes {
    let rename = match (&c.model_span, edits.upstream_model, c.model.as_deref()) {
        (Some(span), Some(to), Some(from)) if to != from => Some((span.clone(), to)),
        _ => None,
    };
    let max_tokens = edits.max_tokens.zip(c.max_tokens_span.clone());
    if rename.is_none() && !edits.inject_usage && max_tokens.is_none() {
        return body.clone();
    }
    // Edits as (range replaced, new bytes), applied in order of position.
    let mut spliced: Vec<(std::ops::Range<usize>, Vec<u8>)> = Vec::with_capacity(3);
    if let Some((span, to)) = rename {
        spliced.push((span, serde_json::Value::from(to).to_string().into_bytes()));
    }
    if let Some((n, span)) = max_tokens {
        spliced.push((span, n.to_string().into_bytes()));
    }
    if edits.inject_usage {
        match &c.stream_options {
            Some(options) => {
                let mut object: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(&body[options.span.clone()]).unwrap_or_default();
                object.insert("include_usage".to_owned(), serde_json::Value::Bool(true));
                spliced.push((
                    options.span.clone(),
                    serde_json::Value::Object(object).to_string().into_bytes(),
                ));
            }
            None => {
                // Right after the opening brace of the top-level object (a body that is not an
                // object was refused by classify; this stays safe for any bytes all the same).
                let first = body.iter().position(|b| !b.is_ascii_whitespace());
                if let Some(open) = first.filter(|&i| body[i] == b'{') {
                    let empty = body[open + 1..]
                        .iter()
                        .find(|b| !b.is_ascii_whitespace())
                        .is_some_and(|b| *b == b'}');
                    let member: &[u8] = if empty {
                        br#""stream_options":{"include_usage":true}"#
                    } else {
                        br#""stream_options":{"include_usage":true},"#
                    };
                    spliced.push((open + 1..open + 1, member.to_vec()));
                }
            }
        }
    }
    spliced.sort_by_key(|(range, _)| range.start);
    splice(body, &spliced)
}

/// `body` with each range replaced by its bytes (the ranges in order, not overlapping).
fn splice(body: &[u8], edits: &[(std::ops::Range<usize>, Vec<u8>)]) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() + 64);
    let mut at = 0;
    for (range, bytes) in edits {
        out.put_slice(&body[at..range.start]);
        out.put_slice(bytes);
        at = range.end;
    }
    out.put_slice(&body[at..]);
    out.freeze()
}

/// Hop-by-hop headers (RFC 9110 section 7.6.1) and others the gateway sets itself.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn rewrite_headers(headers: &mut HeaderMap, backend: &BackendConfig, body_len: usize) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    // Hop-by-hop headers and the gateway's own (`x-tpsgate-*`): usually none, found and removed
    // one at a time, nothing collected.
    while let Some(name) = headers
        .keys()
        .find(|n| is_hop_by_hop(n) || n.as_str().starts_with("x-tpsgate-"))
        .cloned()
    {
        headers.remove(name);
    }
    // The backend's own Host (the client's names the gateway), made once at load.
    headers.insert(header::HOST, backend.host.clone());
    // The client's Content-Length goes on while it states the body's length (a rewrite may
    // change it); where removed, hyper writes one for the body it sends, allocating it.
    let mut digits = itoa::Buffer::new();
    let length = digits.format(body_len).as_bytes();
    if headers
        .get(header::CONTENT_LENGTH)
        .is_none_or(|v| v.as_bytes() != length)
    {
        headers.remove(header::CONTENT_LENGTH);
    }
    if !backend.forward_client_auth {
        headers.remove(header::AUTHORIZATION);
        headers.remove(super::auth::X_API_KEY);
    }
    for (name, value) in &backend.headers {
        headers.insert(name.clone(), value.clone());
    }
    if let Some((name, value)) = &backend.api_key {
        headers.insert(name.clone(), value.clone());
    }
    if backend.dialect == BackendDialect::Anthropic && !headers.contains_key("anthropic-version") {
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            backend.anthropic_version.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::classify::{Classified, peek};
    use crate::proxy::endpoint::Endpoint;

    fn apply(body: &str, to: Option<&str>, inject: bool) -> String {
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let c = peek(Endpoint::Chat, &bytes).unwrap();
        let edits = Edits {
            upstream_model: to,
            inject_usage: inject,
            max_tokens: None,
        };
        String::from_utf8(rewrite_body(&bytes, &c, edits).to_vec()).unwrap()
    }

    #[test]
    fn only_the_model_bytes_change() {
        let body = r#"{ "model": "small", "messages": [ {"role":"user","content":"keep  spacing 1.0e3"} ] }"#;
        assert_eq!(
            apply(body, Some("org/Big-Model"), false),
            r#"{ "model": "org/Big-Model", "messages": [ {"role":"user","content":"keep  spacing 1.0e3"} ] }"#
        );
        assert_eq!(apply(body, Some("small"), false), body);
    }

    #[test]
    fn a_cut_output_budget_replaces_only_the_bytes_of_the_client_s() {
        let body = r#"{"max_completion_tokens" : 32000, "model": "small", "messages": []}"#;
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let c = peek(Endpoint::Chat, &bytes).unwrap();
        let edits = Edits {
            upstream_model: Some("big"),
            inject_usage: false,
            max_tokens: Some(1234),
        };
        assert_eq!(
            rewrite_body(&bytes, &c, edits),
            r#"{"max_completion_tokens" : 1234, "model": "big", "messages": []}"#
        );
    }

    /// Found by the request_rewrite fuzz target: an empty body (a pass-through request without
    /// one) made the include_usage insertion slice past the end.
    #[test]
    fn bodies_that_are_empty_or_an_empty_object_stay_valid() {
        let empty = Classified {
            endpoint: Endpoint::Other { anthropic: false },
            model: None,
            stream: false,
            model_span: None,
            class: None,
            class_index: None,
            slo: crate::config::Slo::default(),
            stream_options: None,
            max_tokens: None,
            max_tokens_span: None,
            prompt_tokens: 0,
            prompt_spans: Default::default(),
            cache_key_span: None,
            translate: false,
        };
        let inject = Edits {
            inject_usage: true,
            ..Edits::default()
        };
        assert_eq!(rewrite_body(&Bytes::new(), &empty, inject), Bytes::new());
        let out = rewrite_body(&Bytes::from_static(b" { } "), &empty, inject);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"stream_options": {"include_usage": true}})
        );
    }

    #[test]
    fn include_usage_is_added_when_absent_or_not_true() {
        let out = apply(r#"{"model":"m","stream":true}"#, None, true);
        assert_eq!(
            out,
            r#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#
        );
        let out = apply(
            r#"{"model":"a","stream":true,"stream_options":{"continuous_usage_stats":false}}"#,
            Some("b"),
            true,
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["model"], "b");
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"continuous_usage_stats": false, "include_usage": true})
        );
    }
}
