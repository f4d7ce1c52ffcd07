//! The HTTP face of one simulated backend: OpenAI and Anthropic endpoints over the engine, and
//! the `/sim/*` control endpoints.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::config::{
    BackendRaw, BackendSpec, FaultAction, Params, PrefixCacheSpec, Timing, merge_json,
};
use super::engine::{Engine, Seat, StatsSnapshot, TokenRx};
use super::faults::FaultPlan;
use super::seen::{SeenRequest, reasoning_of};
use super::truth;
use super::wire::{Dialect, Finish, Framer, GenRequest, complete_body};
use crate::prefix::Held;

/// Response body of the simulator.
pub(crate) type SimBody = UnsyncBoxBody<Bytes, io::Error>;

/// Largest request body the simulator reads.
const MAX_BODY: usize = 16 << 20;

/// One simulated backend: its engine and its live parameters.
#[derive(Debug)]
pub struct SimBackend {
    name: String,
    models: Vec<String>,
    engine: Engine,
    live: ArcSwap<Live>,
    ids: AtomicU64,
    seen: std::sync::Mutex<std::collections::VecDeque<SeenRequest>>,
    cache: Option<PrefixCache>,
    max_model_len: Option<u32>,
}

/// The engine's prefix cache: which prompt blocks it holds, and what it has served from them.
#[derive(Debug)]
struct PrefixCache {
    block_tokens: u32,
    held: std::sync::Mutex<Held>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
}

/// An engine's cached block stays until memory pushes it out: no age limit.
const SIM_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(365 * 86_400);

impl PrefixCache {
    fn new(spec: PrefixCacheSpec) -> Self {
        Self {
            block_tokens: spec.block_tokens,
            held: std::sync::Mutex::new(Held::new(spec.blocks, SIM_CACHE_TTL)),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
        }
    }

    /// Looks `req`'s prompt up and holds it from now on; returns the tokens served from cache.
    /// Whole blocks only, and never the prompt's last token, which the engine must compute to
    /// produce the first output (vLLM recomputes a fully cached prompt's last block).
    fn admit(&self, req: &GenRequest) -> u32 {
        let now = tokio::time::Instant::now();
        let matched = match self.held.lock() {
            Ok(mut held) => {
                let matched = held.longest(&req.prefix, now);
                held.insert(req.prefix.iter().copied(), now);
                matched
            }
            Err(_) => 0,
        };
        let most = req.prompt_tokens.saturating_sub(1) / self.block_tokens;
        let cached = u32::try_from(matched).unwrap_or(u32::MAX).min(most) * self.block_tokens;
        self.prompt_tokens
            .fetch_add(u64::from(req.prompt_tokens), Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(u64::from(cached), Ordering::Relaxed);
        cached
    }

    fn stats(&self) -> serde_json::Value {
        let blocks = self.held.lock().map_or(0, |h| h.len());
        json!({
            "blocks": blocks,
            "block_tokens": self.block_tokens,
            "prompt_tokens": self.prompt_tokens.load(Ordering::Relaxed),
            "cached_tokens": self.cached_tokens.load(Ordering::Relaxed),
        })
    }
}

/// A request's body, or the 413 in `dialect`'s shape for one over [`MAX_BODY`] or unreadable.
pub(super) async fn read_body(
    dialect: Dialect,
    req: Request<Incoming>,
) -> Result<Bytes, Response<SimBody>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(_) => Err(error(
            dialect,
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            "request body over 16 MiB or unreadable",
        )),
    }
}

/// A 400 in `dialect`'s shape for a body the simulator cannot read.
pub(super) fn bad_request(dialect: Dialect, why: &str) -> Response<SimBody> {
    error(
        dialect,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        why,
    )
}

/// How many tokens `req` gets and why it ends: its `max_tokens` (the engine's default where it
/// sets none), a natural reply's length where that is shorter (drawn from `seed`), a tool call
/// where it offers a tool (on the engine's share of such turns, drawn alike), or the first of
/// its stop sequences the text would hold (noted in the request).
fn ending(
    req: &mut GenRequest,
    dialect: Dialect,
    timing: &Timing,
    seed: Option<u64>,
) -> (u32, Finish) {
    let (mut target, mut finish) = match req.max_tokens {
        Some(n) => (n, Finish::Length),
        None => (timing.default_max_tokens, Finish::Stop),
    };
    let mut drawn = seed.map_or_else(
        || SmallRng::from_rng(&mut rand::rng()),
        SmallRng::seed_from_u64,
    );
    if let Some(mean) = timing.reply_tokens {
        let natural = drawn.random_range(mean / 2..=mean + mean / 2).max(1);
        if natural < target {
            (target, finish) = (natural, Finish::Stop);
        }
    }
    // On a share of the turns offering tools the answer calls one; on the others it is text.
    if req.tool.is_some()
        && timing.tool_call_share < 1.0
        && drawn.random::<f64>() >= timing.tool_call_share
    {
        req.tool = None;
    }
    if req.tool.is_some() && dialect != Dialect::Completions {
        finish = Finish::ToolUse;
    } else if let Some((tokens, sequence)) = super::wire::stop_within(&req.stop, target) {
        (target, finish) = (tokens, Finish::StopSequence);
        req.stopped_by = Some(sequence);
    }
    (target, finish)
}

/// How many requests `GET /sim/requests` remembers.
const SEEN_KEPT: usize = 64;

/// Parameters in force, swapped whole by `POST /sim/params`.
#[derive(Debug)]
struct Live {
    params: Params,
    raw: BackendRaw,
    faults: FaultPlan,
}

impl Live {
    fn new(params: Params, raw: BackendRaw) -> Self {
        let faults = FaultPlan::new(params.faults.clone());
        Self {
            params,
            raw,
            faults,
        }
    }
}

impl SimBackend {
    /// Starts the engine of `spec` on the current runtime, on `seat` of a shared device.
    pub(crate) fn new(spec: &BackendSpec, seat: Option<Seat>) -> Arc<Self> {
        Arc::new(Self {
            name: spec.name.clone(),
            models: spec.models.clone(),
            engine: Engine::spawn(spec.params.timing.clone(), seat),
            live: ArcSwap::from_pointee(Live::new(spec.params.clone(), spec.raw.clone())),
            ids: AtomicU64::new(0),
            seen: std::sync::Mutex::new(std::collections::VecDeque::with_capacity(SEEN_KEPT)),
            cache: spec.prefix_cache.map(PrefixCache::new),
            max_model_len: spec.max_model_len,
        })
    }

    /// Backend name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Engine counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.engine.stats()
    }

    fn remember(&self, seen: SeenRequest) {
        if let Ok(mut list) = self.seen.lock() {
            if list.len() == SEEN_KEPT {
                list.pop_front();
            }
            list.push_back(seen);
        }
    }

    /// The last generation requests received, oldest first.
    pub(crate) fn seen_requests(&self) -> Vec<SeenRequest> {
        self.seen
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Answers one HTTP request.
    pub(crate) async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<SimBody> {
        // By the end of the path: a hosted API's endpoints sit under prefixes of their own
        // (`/v1beta/openai/chat/completions`, `/openai/deployments/D/chat/completions`), and the
        // simulator stands in for them too.
        let path = req.uri().path();
        let dialect = if path.ends_with("/chat/completions") {
            Some(Dialect::Chat)
        } else if path.ends_with("/completions") {
            Some(Dialect::Completions)
        } else if path.ends_with("/messages") {
            Some(Dialect::Messages)
        } else {
            None
        };
        match (req.method(), req.uri().path(), dialect) {
            (&Method::POST, _, Some(dialect)) => self.generate(dialect, req).await,
            (&Method::GET, "/v1/models", _) => self.models(),
            (&Method::GET, "/sim/truth", _) => self.truth(req.uri().query().unwrap_or("")),
            (&Method::GET, "/sim/stats", _) => json_response(
                StatusCode::OK,
                &json!({"backend": self.name, "stats": self.engine.stats(),
                        "prefix_cache": self.cache.as_ref().map(PrefixCache::stats)}),
            ),
            (&Method::GET, "/sim/params", _) => self.params_response(),
            (&Method::GET, "/sim/requests", _) => {
                json_response(StatusCode::OK, &json!({"requests": self.seen_requests()}))
            }
            (&Method::POST, "/sim/params", _) => self.patch_params(req).await,
            (&Method::POST, "/tokenize", _) => self.count(Dialect::Chat, req).await,
            (&Method::POST, p, _) if p.ends_with("/v1/responses") => self.responses(req).await,
            (&Method::POST, p, _) if p.ends_with("/messages/count_tokens") => {
                self.count(Dialect::Messages, req).await
            }
            (
                _,
                "/v1/models" | "/sim/truth" | "/sim/stats" | "/sim/params" | "/sim/requests"
                | "/tokenize",
                _,
            )
            | (_, _, Some(_)) => error(
                Dialect::Chat,
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
                "method not allowed on this path",
            ),
            _ => error(
                Dialect::Chat,
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "not_found",
                "no such endpoint",
            ),
        }
    }

    /// A prompt's tokens counted as a generation request's are: vLLM's `/tokenize` for chat
    /// messages (`{"count", "tokens"}`, and `max_model_len` where it has a window), Anthropic's
    /// `count_tokens` (`{"input_tokens"}`).
    async fn count(&self, dialect: Dialect, req: Request<Incoming>) -> Response<SimBody> {
        let body = match read_body(dialect, req).await {
            Ok(body) => body,
            Err(refused) => return refused,
        };
        // Read as chat messages whatever the dialect: Anthropic's count needs no `max_tokens`,
        // and both dialects' prompts are counted alike.
        let r = match Dialect::Chat.parse_for_cache(&body, None) {
            Ok(r) if self.models.contains(&r.model) => r,
            Ok(r) => return self.unknown_model(dialect, &r.model),
            Err(bad) => return bad_request(dialect, &bad.0),
        };
        let n = r.prompt_tokens;
        let mut answer = match dialect {
            Dialect::Messages => json!({"input_tokens": n}),
            _ => json!({"count": n, "tokens": (0..n).collect::<Vec<_>>()}),
        };
        let window = self.max_model_len.filter(|_| dialect != Dialect::Messages);
        super::window::report(&mut answer, window);
        json_response(StatusCode::OK, &answer)
    }

    async fn generate(&self, dialect: Dialect, req: Request<Incoming>) -> Response<SimBody> {
        let seen = SeenRequest::of(&req);
        match read_body(dialect, req).await {
            Ok(body) => self.generate_from(dialect, seen, &body).await,
            Err(refused) => refused,
        }
    }

    /// A generation request's answer, its body read (`seen` what is recorded of it).
    pub(super) async fn generate_from(
        &self,
        dialect: Dialect,
        mut seen: SeenRequest,
        body: &[u8],
    ) -> Response<SimBody> {
        let block_bytes = self.cache.as_ref().map(|c| c.block_tokens as usize * 4);
        let mut parsed = dialect.parse_for_cache(body, block_bytes);
        if let (Ok(r), Some(cache)) = (&mut parsed, &self.cache)
            && self.models.contains(&r.model)
        {
            r.cached_tokens = cache.admit(r);
            r.reports_cache = true;
            seen.cached_tokens = Some(r.cached_tokens);
        }
        seen.reasoning = reasoning_of(body);
        if let Ok(r) = &parsed {
            seen.model = Some(r.model.clone());
            seen.prompt_tokens = Some(r.prompt_tokens);
            seen.max_tokens = r.max_tokens;
        }
        let request_id = seen.request_id.clone();
        self.remember(seen);
        let mut gen_req = match parsed {
            Ok(r) => r,
            Err(bad) => return bad_request(dialect, &bad.0),
        };
        if !self.models.contains(&gen_req.model) {
            return self.unknown_model(dialect, &gen_req.model);
        }
        if let Some(refused) = self
            .max_model_len
            .and_then(|window| super::window::past_window(window, &gen_req))
        {
            return bad_request(dialect, &refused);
        }
        let live = self.live.load_full();
        let fault = live.faults.pick();
        match fault {
            Some(FaultAction::Status {
                status,
                retry_after,
            }) => {
                return fault_status(dialect, status, retry_after);
            }
            Some(FaultAction::SlowFirstByte(delay)) => tokio::time::sleep(delay).await,
            _ => {}
        }
        let timing = &live.params.timing;
        // A request's speed (and natural length) is drawn from its x-request-id, where it has
        // one: two runs that send the same requests (`tpsgate bench --seed`) then draw the same
        // speeds, whichever engine each lands on, and two routers are compared on their choices
        // alone.
        let seed = request_id
            .as_deref()
            .map(|id| BuildHasherDefault::<DefaultHasher>::default().hash_one(id));
        let (target, finish) = ending(&mut gen_req, dialect, timing, seed);
        let tokens = self.engine.submit_after(
            timing.extra_ttft,
            gen_req.prompt_tokens - gen_req.cached_tokens,
            target,
            seed,
        );
        // A client's x-request-id becomes the response id, so that two runs of the same request
        // can be compared byte for byte.
        let id = request_id
            .filter(|r| r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            .unwrap_or_else(|| self.ids.fetch_add(1, Ordering::Relaxed).to_string());
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if gen_req.stream {
            let state = StreamState {
                framer: Framer::new(dialect, &gen_req, &id, created, live.params.stream),
                tokens,
                target,
                shown: target - live.params.stream.hold_back_tokens.min(target),
                sent: 0,
                per_chunk: live.params.stream.tokens_per_chunk,
                finish,
                fault,
                phase: Phase::Head,
            };
            state.response()
        } else {
            self.complete(
                dialect, &gen_req, tokens, target, finish, fault, &id, created,
            )
            .await
        }
    }

    /// The 404 for a model this backend does not serve, naming those it does.
    fn unknown_model(&self, dialect: Dialect, model: &str) -> Response<SimBody> {
        let message = format!(
            "The model `{model}` does not exist. Available: {}",
            self.models.join(", ")
        );
        let kind = if dialect == Dialect::Messages {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        error(
            dialect,
            StatusCode::NOT_FOUND,
            kind,
            "model_not_found",
            &message,
        )
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; a struct would only rename them"
    )]
    async fn complete(
        &self,
        dialect: Dialect,
        req: &GenRequest,
        mut tokens: TokenRx,
        target: u32,
        finish: Finish,
        fault: Option<FaultAction>,
        id: &str,
        created: u64,
    ) -> Response<SimBody> {
        let mut got = 0;
        while tokens.recv().await.is_some() {
            got += 1;
        }
        match fault {
            Some(FaultAction::Stall { pause, .. }) => tokio::time::sleep(pause).await,
            Some(FaultAction::Reset { .. }) => {
                let reset = futures_util::stream::once(async { Err(reset_error()) });
                return Response::new(UnsyncBoxBody::new(StreamBody::new(reset)));
            }
            _ => {}
        }
        if got < target {
            return error(
                dialect,
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "engine_stopped",
                "the engine stopped before the response was complete",
            );
        }
        let body = complete_body(dialect, req, id, created, got, finish);
        let mut resp = Response::new(full(body));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }

    fn models(&self) -> Response<SimBody> {
        let data: Vec<_> = self
            .models
            .iter()
            .map(|m| {
                let mut entry =
                    json!({"id": m, "object": "model", "created": 0, "owned_by": "tpsgate-sim"});
                super::window::report(&mut entry, self.max_model_len);
                entry
            })
            .collect();
        json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
    }

    fn truth(&self, query: &str) -> Response<SimBody> {
        let live = self.live.load();
        let timing = &live.params.timing;
        let mut prompt_tokens = 0;
        let mut output_tokens = timing.default_max_tokens;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "prompt_tokens" => &mut prompt_tokens,
                "output_tokens" => &mut output_tokens,
                _ => {
                    return error(
                        Dialect::Chat,
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "unknown_parameter",
                        &format!(
                            "unknown query parameter `{key}`; use prompt_tokens and output_tokens"
                        ),
                    );
                }
            };
            match value.parse::<u32>() {
                Ok(n) => *slot = n,
                Err(_) => {
                    return error(
                        Dialect::Chat,
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "invalid_parameter",
                        &format!("`{key}` must be a whole number, got `{value}`"),
                    );
                }
            }
        }
        let per_chunk = live.params.stream.tokens_per_chunk;
        let curve = truth::curve(
            &self.name,
            timing,
            per_chunk,
            prompt_tokens,
            output_tokens.max(1),
        );
        json_response(StatusCode::OK, &curve)
    }

    fn params_response(&self) -> Response<SimBody> {
        let raw = &self.live.load().raw;
        json_response(
            StatusCode::OK,
            &json!({"engine": raw.engine, "stream": raw.stream, "faults": raw.faults}),
        )
    }

    /// Applies a JSON patch to engine, stream and faults; the whole patch is validated before any
    /// of it takes effect.
    async fn patch_params(&self, req: Request<Incoming>) -> Response<SimBody> {
        let bad = |msg: &str| {
            error(
                Dialect::Chat,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_params",
                msg,
            )
        };
        let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
            return bad("unreadable body");
        };
        let patch: serde_json::Value = match serde_json::from_slice(&body.to_bytes()) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            Ok(_) => return bad("the patch must be a JSON object with engine, stream or faults"),
            Err(e) => return bad(&format!("invalid JSON: {e}")),
        };
        if let Some(key) = patch.as_object().and_then(|o| {
            o.keys()
                .find(|k| !matches!(k.as_str(), "engine" | "stream" | "faults"))
        }) {
            return bad(&format!(
                "`{key}` cannot be changed at runtime; patch engine, stream or faults"
            ));
        }
        let current = self.live.load_full();
        let Ok(mut merged) = serde_json::to_value(&current.raw) else {
            return bad("internal: cannot serialise the current parameters");
        };
        merge_json(&mut merged, patch);
        let raw: BackendRaw = match serde_path_to_error::deserialize(merged) {
            Ok(raw) => raw,
            Err(e) => return bad(&format!("{}: {}", e.path(), e.inner())),
        };
        let params = match raw.params("") {
            Ok(p) => p,
            Err(e) => {
                return bad(&format!(
                    "{}: {}",
                    e.path.trim_start_matches('.'),
                    e.message
                ));
            }
        };
        if params.timing != current.params.timing {
            self.engine.retime(params.timing.clone());
        }
        self.live.store(Arc::new(Live::new(params, raw)));
        self.params_response()
    }
}

// === streaming ===

struct StreamState {
    framer: Framer,
    tokens: TokenRx,
    target: u32,
    /// Tokens whose text is sent; the rest are decoded in silence (`hold_back_tokens`).
    shown: u32,
    sent: u32,
    per_chunk: u32,
    finish: Finish,
    fault: Option<FaultAction>,
    phase: Phase,
}

enum Phase {
    Head,
    Tokens,
    Tail,
    Done,
}

type Next = Option<(Result<Frame<Bytes>, io::Error>, StreamState)>;

impl StreamState {
    /// The event stream this state produces, as a response.
    fn response(self) -> Response<SimBody> {
        let body = StreamBody::new(futures_util::stream::unfold(self, Self::next));
        let mut resp = Response::new(UnsyncBoxBody::new(body));
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    }

    /// Produces the next SSE frame: head, one frame per chunk of tokens as the engine emits them,
    /// then the tail. Faults strike at the first chunk boundary at or after their token count.
    async fn next(mut self) -> Next {
        loop {
            match self.phase {
                Phase::Head => {
                    self.phase = Phase::Tokens;
                    if let Some(head) = self.framer.head() {
                        return Some((Ok(Frame::data(head)), self));
                    }
                }
                Phase::Tokens => {
                    match self.fault {
                        Some(FaultAction::Stall {
                            after_tokens,
                            pause,
                        }) if self.sent >= after_tokens => {
                            self.fault = None;
                            tokio::time::sleep(pause).await;
                        }
                        Some(FaultAction::Reset { after_tokens }) if self.sent >= after_tokens => {
                            // Cut when the next token would go out, and a moment later: hyper
                            // drops what it has not written yet when a body fails, and the tokens
                            // before the cut must reach the client (on a loaded machine the
                            // next token alone is not time enough).
                            let _ = self.tokens.recv().await;
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            self.phase = Phase::Done;
                            return Some((Err(reset_error()), self));
                        }
                        _ => {}
                    }
                    let held = self.sent >= self.shown;
                    let want = if held {
                        self.target - self.sent
                    } else {
                        self.per_chunk.min(self.shown - self.sent)
                    };
                    let mut got = 0;
                    while got < want && self.tokens.recv().await.is_some() {
                        got += 1;
                    }
                    if got < want {
                        self.phase = Phase::Done;
                        let err = io::Error::other("engine stopped mid-stream");
                        return Some((Err(err), self));
                    }
                    let first = self.sent;
                    self.sent += got;
                    let last = self.sent == self.target;
                    if last {
                        self.phase = Phase::Tail;
                    }
                    let chunk = if held {
                        // The held tokens' text never comes: only the finish chunk does.
                        match self.framer.finish_only(self.sent, self.finish) {
                            Some(chunk) => chunk,
                            None => continue,
                        }
                    } else {
                        self.framer.content(first, got, last.then_some(self.finish))
                    };
                    return Some((Ok(Frame::data(chunk)), self));
                }
                Phase::Tail => {
                    self.phase = Phase::Done;
                    let tail = self.framer.tail(self.sent, self.finish);
                    if tail.is_empty() {
                        continue;
                    }
                    return Some((Ok(Frame::data(tail)), self));
                }
                Phase::Done => return None,
            }
        }
    }
}

fn reset_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "injected fault: connection reset",
    )
}

// === responses ===

fn full(body: Bytes) -> SimBody {
    UnsyncBoxBody::new(Full::new(body).map_err(|never| match never {}))
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<SimBody> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error(
    dialect: Dialect,
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
) -> Response<SimBody> {
    let mut resp = Response::new(full(dialect.error_body(kind, code, message)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn fault_status(dialect: Dialect, status: u16, retry_after: Option<u32>) -> Response<SimBody> {
    let (status, kind, code) = match status {
        429 => (
            StatusCode::TOO_MANY_REQUESTS,
            if dialect == Dialect::Messages {
                "rate_limit_error"
            } else {
                "rate_limit_exceeded"
            },
            "rate_limit_exceeded",
        ),
        503 => (
            StatusCode::SERVICE_UNAVAILABLE,
            if dialect == Dialect::Messages {
                "overloaded_error"
            } else {
                "server_error"
            },
            "service_unavailable",
        ),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            if dialect == Dialect::Messages {
                "api_error"
            } else {
                "server_error"
            },
            "internal_error",
        ),
    };
    let mut resp = error(dialect, status, kind, code, "injected fault");
    if let Some(secs) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}
