//! Classify: read the request body once (bounded), check method and content type, and find the
//! few things the gateway needs in the JSON — model, stream, stream_options — with their byte
//! positions, so that rewriting touches only those bytes.

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Body;
use serde::Deserialize;
use tower::{Layer, Service};

use super::endpoint::Endpoint;
use super::skim;
use crate::config::Slo;
use crate::config::{ClassConfig, KeyGrant, RouteRule};
use crate::error::{Error, ErrorKind};

/// What classification found, in the request's extensions.
#[derive(Debug, Clone, PartialEq)]
pub struct Classified {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The requested model (absent only on pass-through paths and `GET /v1/models`).
    pub model: Option<String>,
    /// `"stream": true`.
    pub stream: bool,
    /// Bytes of the `model` value (quotes included).
    pub model_span: Option<Range<usize>>,
    /// The traffic class's name (see [`Classes::pick`]); `None` when no classes are configured.
    pub class: Option<Arc<str>>,
    /// Its index in the config.
    pub class_index: Option<usize>,
    /// The class's SLO with the request's overrides applied.
    pub slo: Slo,
    /// The `stream_options` object, if present.
    pub stream_options: Option<StreamOptions>,
    /// `max_tokens` (or `max_completion_tokens`, `max_output_tokens`), if set.
    pub max_tokens: Option<u32>,
    /// The bytes of that value, where it is cut to fit a context window.
    pub max_tokens_span: Option<Range<usize>>,
    /// Prompt size estimated from the body: a token per [`BYTES_PER_TOKEN`] bytes.
    pub prompt_tokens: u64,
    /// The bytes of the prompt's parts, in a fixed order whatever the body's (`system`,
    /// `instructions`, `tools`, `messages`, `prompt`, `input`): what the prefix index hashes.
    pub prompt_spans: [Option<Range<usize>>; PROMPT_FIELDS],
    /// The `prompt_cache_key` string (quotes included), a hint joining requests to one prefix.
    pub cache_key_span: Option<Range<usize>>,
    /// It may go to a backend of the other dialect, translated: a chat completion, a response
    /// or a message that no `routes[]` rule with `translate: false` matches.
    pub translate: bool,
}

impl Classified {
    /// The output tokens it may ask for: its `max_tokens`, else the router's assumption on an
    /// endpoint that generates (none on one that does not).
    pub(crate) fn output_estimate(&self) -> u64 {
        match self.max_tokens {
            Some(n) => u64::from(n),
            None if self.endpoint.generates() => crate::router::ASSUMED_OUTPUT_TOKENS as u64,
            None => 0,
        }
    }

    /// The backends it can reach: of its own dialect, and translated where it may be.
    pub(crate) fn reach(&self) -> crate::router::Reach {
        crate::router::Reach {
            dialect: self.endpoint.dialect(),
            translate: self.translate,
        }
    }

    /// Whether the gateway asks the upstream for the usage chunk itself (an OpenAI chat or
    /// completions stream whose client did not): rewrite adds `include_usage`, and the usage
    /// chunk is then the gateway's to remove before the client sees it.
    pub(crate) fn usage_injected(&self) -> bool {
        self.stream
            && self.endpoint.takes_include_usage()
            && self
                .stream_options
                .as_ref()
                .is_none_or(|o| o.include_usage != Some(true))
    }
}

/// Bytes of request body per prompt token, for the prompt-size estimate that TTFT prediction
/// needs (English text with JSON around it; tokenizing would cost far more than it buys).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

/// A `stream_options` object in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOptions {
    /// Its bytes.
    pub span: Range<usize>,
    /// Its `include_usage`, if set.
    pub include_usage: Option<bool>,
}

/// The top-level keys classify reads; [`find`] returns their spans in this order.
const FIELDS: [&str; 13] = [
    "model",
    "stream",
    "stream_options",
    // Read leniently: a value we cannot use is the upstream's to judge, not ours.
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    // The prompt, in the order its prefix is hashed (PROMPT_FIELDS), and its hint.
    "system",
    "instructions",
    "tools",
    "messages",
    "prompt",
    "input",
    "prompt_cache_key",
];

/// How many of [`FIELDS`] carry the prompt: the spans in [`Classified::prompt_spans`].
pub(crate) const PROMPT_FIELDS: usize = 6;

#[derive(Deserialize)]
struct RawStreamOptions {
    include_usage: Option<bool>,
}

/// `x-tpsgate-class`: the traffic class a client asks for.
pub(crate) const X_TPSGATE_CLASS: http::HeaderName =
    http::HeaderName::from_static("x-tpsgate-class");

/// `x-tpsgate-slo-tps`: a per-request minimum per-user TPS, replacing the class's.
pub(crate) const X_TPSGATE_SLO_TPS: http::HeaderName =
    http::HeaderName::from_static("x-tpsgate-slo-tps");
/// `x-tpsgate-slo-ttft-ms`: a per-request maximum TTFT in ms, replacing the class's.
pub(crate) const X_TPSGATE_SLO_TTFT_MS: http::HeaderName =
    http::HeaderName::from_static("x-tpsgate-slo-ttft-ms");

/// Bounds of `x-tpsgate-slo-tps`: above nothing any server streams, and not zero.
pub(crate) const SLO_TPS_RANGE: (f64, f64) = (0.1, 10_000.0);
/// Bounds of `x-tpsgate-slo-ttft-ms`: a millisecond to ten minutes.
pub(crate) const SLO_TTFT_MS_RANGE: (f64, f64) = (1.0, 600_000.0);

/// What a gateway API key gives its requests and lets them claim, put in the extensions by the
/// auth layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyClass {
    /// The class its requests get when nothing else gives one (by name; none where the
    /// config has no class of that name).
    pub class: Option<Arc<str>>,
    /// The classes and SLO overrides its requests may claim.
    pub grant: Arc<KeyGrant>,
}

/// `x-slo-ttft-ms`: the Gateway API inference extension's name for a maximum TTFT in ms.
pub(crate) const X_SLO_TTFT_MS: http::HeaderName = http::HeaderName::from_static("x-slo-ttft-ms");
/// `x-slo-tpot-ms`: the inference extension's maximum time per output token, ms (a minimum
/// speed of 1000 / it tokens per second).
pub(crate) const X_SLO_TPOT_MS: http::HeaderName = http::HeaderName::from_static("x-slo-tpot-ms");
/// Bounds of `x-slo-tpot-ms`: those of `x-tpsgate-slo-tps`, as times per token.
pub(crate) const SLO_TPOT_MS_RANGE: (f64, f64) = (0.1, 10_000.0);

/// The configured classes, the default, and the route rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct Classes {
    classes: Vec<ClassConfig>,
    default: Option<usize>,
    routes: Vec<RouteRule>,
}

impl Classes {
    /// Classes with their default index and the rules that assign them.
    pub(crate) fn new(
        classes: Vec<ClassConfig>,
        default: Option<usize>,
        routes: Vec<RouteRule>,
    ) -> Self {
        Self {
            classes,
            default,
            routes,
        }
    }

    /// The class of a request, by precedence: `x-tpsgate-class` (where its API key, if any,
    /// allows that class: else 403); else the first route rule matching its path and model;
    /// else its API key's class; else the default class.
    fn pick(
        &self,
        header: Option<&http::HeaderValue>,
        path: &str,
        model: Option<&str>,
        key: Option<&KeyClass>,
    ) -> Result<Option<usize>, Error> {
        if let Some(value) = header {
            let wanted = value.to_str().unwrap_or("");
            return match self.classes.iter().position(|c| *c.name == *wanted) {
                Some(i) => match key {
                    Some(k) if !k.grant.classes.iter().any(|c| **c == *wanted) => {
                        Err(self.not_allowed(wanted, &k.grant))
                    }
                    _ => Ok(Some(i)),
                },
                None => {
                    let known: Vec<&str> = self.classes.iter().map(|c| &*c.name).collect();
                    let known = if known.is_empty() {
                        "none are configured".to_owned()
                    } else {
                        known.join(", ")
                    };
                    Err(Error::new(
                        ErrorKind::InvalidRequest,
                        format!("unknown class `{wanted}` in x-tpsgate-class; configured: {known}"),
                    ))
                }
            };
        }
        let rule = self.routes.iter().find(|r| {
            r.class.is_some()
                && r.path.as_deref().is_none_or(|p| p == path)
                && r.model.as_deref().is_none_or(|m| Some(m) == model)
        });
        Ok(rule
            .and_then(|r| r.class)
            .or(key
                .and_then(|k| k.class.as_deref())
                .and_then(|name| self.classes.iter().position(|c| *c.name == *name)))
            .or(self.default))
    }

    /// The 403 for a class a key does not allow: the class and the ones it does (never the key).
    fn not_allowed(&self, wanted: &str, grant: &KeyGrant) -> Error {
        let allowed: Vec<&str> = grant.classes.iter().map(|c| &**c).collect();
        let allowed = if allowed.is_empty() {
            "none (requests with it get the classes routes and defaults give)".to_owned()
        } else {
            allowed.join(", ")
        };
        Error::new(
            ErrorKind::Forbidden,
            format!(
                "this API key may not claim class `{wanted}` in x-tpsgate-class; it allows: {allowed}"
            ),
        )
    }

    /// Classifies: the class, and its SLO with the request's overrides.
    fn apply(
        &self,
        c: &mut Classified,
        headers: &http::HeaderMap,
        path: &str,
        key: Option<&KeyClass>,
    ) -> Result<(), Error> {
        let model = c.model.as_deref();
        if let (Some(allowed), Some(model)) = (key.and_then(|k| k.grant.models.as_ref()), model)
            && !allowed.iter().any(|m| m == model)
        {
            return Err(Error::new(
                ErrorKind::Forbidden,
                format!(
                    "this API key may not use model `{model}`; it allows: {}",
                    allowed.join(", ")
                ),
            ));
        }
        c.translate &= !self.routes.iter().any(|r| {
            !r.translate
                && r.path.as_deref().is_none_or(|p| p == path)
                && r.model.as_deref().is_none_or(|m| Some(m) == model)
        });
        let index = self.pick(headers.get(&X_TPSGATE_CLASS), path, c.model.as_deref(), key)?;
        let class = index.and_then(|i| self.classes.get(i));
        c.class_index = index;
        c.class = class.map(|k| Arc::clone(&k.name));
        let mut slo = class.map_or_else(Slo::default, |k| k.slo);
        // One pass over the names, rather than four hashed look-ups, where (as nearly always)
        // the request sets no SLO of its own.
        let sets_slo = headers.keys().any(|name| {
            let name = name.as_str();
            name.starts_with("x-tpsgate-slo-") || name.starts_with("x-slo-")
        });
        if !sets_slo {
            c.slo = with_percentiles(slo);
            return Ok(());
        }
        let tps = bounded(headers, &X_TPSGATE_SLO_TPS, SLO_TPS_RANGE)?.or(bounded(
            headers,
            &X_SLO_TPOT_MS,
            SLO_TPOT_MS_RANGE,
        )?
        .map(|ms| 1e3 / ms));
        let ttft_ms = bounded(headers, &X_TPSGATE_SLO_TTFT_MS, SLO_TTFT_MS_RANGE)?.or(bounded(
            headers,
            &X_SLO_TTFT_MS,
            SLO_TTFT_MS_RANGE,
        )?);
        if (tps.is_some() || ttft_ms.is_some()) && key.is_some_and(|k| !k.grant.slo_overrides) {
            return Err(Error::new(
                ErrorKind::Forbidden,
                "this API key may not set its own SLO (x-tpsgate-slo-*, x-slo-*): its class's targets apply",
            ));
        }
        if let Some(tps) = tps {
            slo.min_tps = Some(tps);
        }
        if let Some(ms) = ttft_ms {
            slo.max_ttft_s = Some(ms / 1e3);
        }
        c.slo = with_percentiles(slo);
        Ok(())
    }
}

/// `slo` with the class default percentiles where it has none (a request without a class).
fn with_percentiles(mut slo: Slo) -> Slo {
    if slo.tps_percentile == 0 {
        slo.tps_percentile = 90;
        slo.ttft_percentile = 90;
    }
    slo
}

/// A number header within `range`, or a 400 naming the header and the range.
fn bounded(
    headers: &http::HeaderMap,
    name: &http::HeaderName,
    (lo, hi): (f64, f64),
) -> Result<Option<f64>, Error> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    match value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        Some(v) if (lo..=hi).contains(&v) => Ok(Some(v)),
        _ => Err(Error::new(
            ErrorKind::InvalidRequest,
            format!("{name} must be a number from {lo} to {hi}"),
        )),
    }
}

/// Reads bodies up to `max_body_bytes` and classifies them.
#[derive(Debug, Clone)]
pub(crate) struct ClassifyLayer {
    max_body_bytes: usize,
    pace: BodyPace,
    classes: Arc<Classes>,
}

/// How fast a client must send its body: within `grace`, plus a second for every `min_rate`
/// bytes received so far. A client that trickles its body (a byte every few seconds) cannot
/// hold a connection, and the slot it takes, for long; one that sends a large body at a
/// reasonable rate has all the time it needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyPace {
    /// Time allowed beyond what the body's size takes.
    pub grace: Duration,
    /// Bytes per second a body must arrive at.
    pub min_rate: u64,
}

impl ClassifyLayer {
    /// Bodies over `max_body_bytes` get 413; classes come from `classes`.
    pub(crate) fn new(max_body_bytes: usize, pace: BodyPace, classes: Classes) -> Self {
        Self {
            max_body_bytes,
            pace,
            classes: Arc::new(classes),
        }
    }
}

impl<S> Layer<S> for ClassifyLayer {
    type Service = Classify<S>;

    fn layer(&self, inner: S) -> Classify<S> {
        Classify {
            inner,
            max_body_bytes: self.max_body_bytes,
            pace: self.pace,
            classes: Arc::clone(&self.classes),
        }
    }
}

/// See [`ClassifyLayer`].
#[derive(Debug, Clone)]
pub(crate) struct Classify<S> {
    inner: S,
    max_body_bytes: usize,
    pace: BodyPace,
    classes: Arc<Classes>,
}

impl<S, B> Service<Request<B>> for Classify<S>
where
    S: Service<Request<Bytes>, Error = Error> + Clone + Send + 'static,
    S::Future: Send,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = Error;
    // The one allocation of the stack: reading the body is asynchronous and must finish before
    // the inner service is called. A hand-written state machine could drop it; measured first.
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this call (tower's clone-and-swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.max_body_bytes;
        let pace = self.pace;
        let classes = Arc::clone(&self.classes);
        Box::pin(async move {
            let req = read(req, limit, pace).await?;
            let (parts, body) = req.into_parts();
            let mut parts = parts;
            let key = parts.extensions.remove::<KeyClass>();
            if let Some(c) = parts.extensions.get_mut::<Classified>() {
                classes.apply(c, &parts.headers, parts.uri.path(), key.as_ref())?;
            }
            inner.call(Request::from_parts(parts, body)).await
        })
    }
}

/// Methods a pass-through `/v1/*` request may use: what the providers' APIs use (a list, a
/// create, a delete). Others (PUT, PATCH, TRACE, CONNECT, ...) have no business going to a
/// backend with its credentials.
const PASS_THROUGH_METHODS: [Method; 4] = [Method::GET, Method::HEAD, Method::POST, Method::DELETE];

/// Whether a pass-through path could reach outside `/v1` at a backend that normalises paths: a
/// `.` or `..` segment, written out or percent-encoded (`%2e`), or followed by `;` parameters
/// (`..;`, which some servers strip); an encoded `/` (`%2f`) or a `\`, which some servers take
/// for a separator. Such a path is refused rather than normalised: a client has no reason to
/// send one.
fn leaves_v1(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if lower.contains('\\') || lower.contains("%2f") || lower.contains("%5c") {
        return true;
    }
    lower.split('/').any(|segment| {
        let segment = segment.split(';').next().unwrap_or("").replace("%2e", ".");
        segment == "." || segment == ".."
    })
}

/// The whole body, at most `limit` bytes, arriving at `pace` (408 otherwise). A body in one
/// frame (the usual case: it came with the head) is not copied.
async fn read_body<B>(body: B, limit: usize, pace: BodyPace) -> Result<Bytes, Error>
where
    B: Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let start = tokio::time::Instant::now();
    let body = std::pin::pin!(Limited::new(body, limit));
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut rest: Option<bytes::BytesMut> = None;
    let mut received: u64 = 0;
    loop {
        let allowed = pace.grace + Duration::from_secs_f64(received as f64 / pace.min_rate as f64);
        let frame = match tokio::time::timeout_at(start + allowed, body.as_mut().frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(err))) if err.is::<http_body_util::LengthLimitError>() => {
                return Err(too_large(limit));
            }
            Ok(Some(Err(err))) => {
                return Err(Error::new(
                    ErrorKind::InvalidRequest,
                    format!("could not read the request body: {err}"),
                ));
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::RequestTimeout,
                    format!(
                        "the request body did not arrive in time: {received} bytes in {:.1} s (limits.body_read_timeout_s, limits.body_min_bytes_per_s)",
                        start.elapsed().as_secs_f64()
                    ),
                ));
            }
        };
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers
        };
        // Zero-copy for `Bytes`, hyper's request data.
        let len = bytes::Buf::remaining(&data);
        let data = bytes::Buf::copy_to_bytes(&mut data, len);
        received += data.len() as u64;
        match (&mut first, &mut rest) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut joined = bytes::BytesMut::with_capacity(f.len() + data.len());
                joined.extend_from_slice(f);
                joined.extend_from_slice(&data);
                rest = Some(joined);
            }
            (Some(_), Some(r)) => r.extend_from_slice(&data),
        }
    }
    Ok(match rest {
        Some(joined) => joined.freeze(),
        None => first.unwrap_or_default(),
    })
}

async fn read<B>(req: Request<B>, limit: usize, pace: BodyPace) -> Result<Request<Bytes>, Error>
where
    B: Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path();
    let Some(endpoint) = Endpoint::from_path(path) else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no such endpoint: {path}; tpsgate serves /v1/*"),
        ));
    };
    let method = req.method();
    match endpoint {
        Endpoint::Models if method != Method::GET => {
            return Err(Error::new(
                ErrorKind::MethodNotAllowed,
                "use GET for /v1/models",
            ));
        }
        e if (e.generates() || e == Endpoint::CountTokens) && method != Method::POST => {
            return Err(Error::new(
                ErrorKind::MethodNotAllowed,
                format!("use POST for {path}"),
            ));
        }
        Endpoint::Other { .. } => {
            if !PASS_THROUGH_METHODS.contains(method) {
                return Err(Error::new(
                    ErrorKind::MethodNotAllowed,
                    format!("{method} is not passed through: use GET, HEAD, POST or DELETE"),
                ));
            }
            if leaves_v1(path) {
                return Err(Error::new(
                    ErrorKind::InvalidRequest,
                    "the path has a dot-segment (`.` or `..`, written out, percent-encoded or with `;` parameters), an encoded `/` or a `\\`: it is not passed through",
                ));
            }
        }
        _ => {}
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large(limit));
    }
    let json = json_content_type(req.headers().get(header::CONTENT_TYPE));
    if endpoint.generates() && !json {
        return Err(Error::new(
            ErrorKind::UnsupportedMediaType,
            "the body must be JSON: send Content-Type: application/json",
        ));
    }
    let (mut parts, body) = req.into_parts();
    let body = read_body(body, limit, pace).await?;
    let classified = if json {
        peek(endpoint, &body)?
    } else {
        // Only a pass-through gets here (generation endpoints need JSON, above).
        Classified::unread(endpoint)
    };
    parts.extensions.insert(classified);
    Ok(Request::from_parts(parts, body))
}

impl Classified {
    /// A request whose body is not read for a model: `GET /v1/models`, a pass-through without a
    /// body or with one that is not JSON (a `multipart/form-data` upload to `/v1/audio/*` or
    /// `/v1/files`), which goes unchanged to the backend a route names for its path, else to
    /// `default_backend`.
    fn unread(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            model: None,
            stream: false,
            model_span: None,
            class: None,
            class_index: None,
            slo: Slo::default(),
            stream_options: None,
            max_tokens: None,
            max_tokens_span: None,
            prompt_tokens: 0,
            prompt_spans: Default::default(),
            cache_key_span: None,
            translate: false,
        }
    }
}

fn too_large(limit: usize) -> Error {
    Error::new(
        ErrorKind::PayloadTooLarge,
        format!("the request body is over the gateway's limit of {limit} bytes"),
    )
}

/// Absent, `application/json`, or any `+json` type; parameters (charset) ignored.
fn json_content_type(value: Option<&http::HeaderValue>) -> bool {
    let Some(value) = value else { return true };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().as_bytes();
    let suffix = essence.len().saturating_sub(5);
    essence.eq_ignore_ascii_case(b"application/json")
        || essence
            .get(suffix..)
            .is_some_and(|s| s.eq_ignore_ascii_case(b"+json"))
}

/// Finds model, stream, stream_options and the token limit in the JSON body, keeping their byte
/// spans; the rest of the body is skimmed ([`skim`]), not parsed.
pub fn peek(endpoint: Endpoint, body: &[u8]) -> Result<Classified, Error> {
    if endpoint == Endpoint::Models || (body.is_empty() && !endpoint.generates()) {
        return Ok(Classified::unread(endpoint));
    }
    let [
        model_span,
        stream,
        stream_options,
        max_tokens,
        max_completion_tokens,
        max_output_tokens,
        system,
        instructions,
        tools,
        messages,
        prompt,
        input,
        cache_key_span,
    ] = find(body)?;
    let model = model_span
        .clone()
        .map(|span| serde_json::from_slice::<String>(&body[span]))
        .transpose()
        .map_err(|_| Error::new(ErrorKind::InvalidRequest, "`model` must be a string"))?;
    if endpoint.generates() && model.as_deref().is_none_or(str::is_empty) {
        return Err(Error::new(
            ErrorKind::InvalidRequest,
            "missing required field `model`",
        ));
    }
    let stream = match stream {
        Some(span) => serde_json::from_slice::<bool>(&body[span])
            .map_err(|_| Error::new(ErrorKind::InvalidRequest, "`stream` must be true or false"))?,
        None => false,
    };
    let stream_options = match stream_options {
        Some(span) => {
            let not_an_object = || {
                Error::new(
                    ErrorKind::InvalidRequest,
                    "`stream_options` must be an object",
                )
            };
            // serde's derive would also take an array, positionally.
            if body[span.start] != b'{' {
                return Err(not_an_object());
            }
            let parsed: RawStreamOptions =
                serde_json::from_slice(&body[span.clone()]).map_err(|_| not_an_object())?;
            Some(StreamOptions {
                span,
                include_usage: parsed.include_usage,
            })
        }
        None => None,
    };
    let limit = [max_tokens, max_completion_tokens, max_output_tokens]
        .into_iter()
        .flatten()
        .find_map(|span| {
            Some((
                std::str::from_utf8(&body[span.clone()])
                    .ok()?
                    .parse::<u32>()
                    .ok()?,
                span,
            ))
        });
    Ok(Classified {
        endpoint,
        model,
        stream,
        model_span,
        class: None,
        class_index: None,
        slo: Slo::default(),
        stream_options,
        max_tokens: limit.as_ref().map(|(n, _)| *n),
        max_tokens_span: limit.map(|(_, span)| span),
        prompt_tokens: body.len() as u64 / BYTES_PER_TOKEN,
        prompt_spans: [system, instructions, tools, messages, prompt, input],
        cache_key_span: cache_key_span.filter(|span| body[span.start] == b'"'),
        translate: matches!(
            endpoint,
            Endpoint::Chat | Endpoint::Messages | Endpoint::CountTokens | Endpoint::Responses
        ),
    })
}

/// The spans of the [`FIELDS`] values in the body's top-level object; `null` is absent. A key
/// given twice is refused: parsers disagree on which one wins, and the gateway must not route
/// by one model while the backend serves the other.
fn find(body: &[u8]) -> Result<[Option<Range<usize>>; FIELDS.len()], Error> {
    let invalid = |why: String| {
        Error::new(
            ErrorKind::InvalidRequest,
            format!("invalid JSON body: {why}"),
        )
    };
    let mut found: [Option<Option<Range<usize>>>; FIELDS.len()] = Default::default();
    for member in skim::members(body) {
        let member = member.map_err(|e| invalid(e.describe(body)))?;
        let Some(i) = field(body, &member.key) else {
            continue;
        };
        if found[i].is_some() {
            return Err(invalid(format!("duplicate field `{}`", FIELDS[i])));
        }
        found[i] = Some((body[member.value.clone()] != *b"null").then_some(member.value));
    }
    Ok(found.map(Option::flatten))
}

/// Which of [`FIELDS`] a key (its bytes inside the quotes) names, escapes decoded.
fn field(body: &[u8], key: &Range<usize>) -> Option<usize> {
    let raw = &body[key.clone()];
    if let Some(i) = FIELDS.iter().position(|f| f.as_bytes() == raw) {
        return Some(i);
    }
    if !raw.contains(&b'\\') {
        return None;
    }
    let decoded: String = serde_json::from_slice(&body[key.start - 1..key.end + 1]).ok()?;
    FIELDS.iter().position(|f| *f == decoded)
}

#[cfg(test)]
mod tests;
