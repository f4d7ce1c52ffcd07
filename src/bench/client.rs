//! One timed streaming request, as a client sees it.
//!
//! TTFT runs from just before the request is sent to the first *content* event (a role-only chunk,
//! `message_start` and pings are not content). The token count comes from the stream's usage;
//! without usage, content events are counted instead and the sample says it is an estimate.
//!
//! TPOT is `(t_last - t_first) / (tokens - first_chunk_tokens)`: the tokens that arrived with the
//! first content event were made before `t_first`, so the decode window covers only the rest.
//! `first_chunk_tokens` is estimated as `tokens / content_events`. With one token per event this
//! is the usual `(t_last - t_first) / (tokens - 1)`; with several (stream intervals, speculative
//! decoding, hosted APIs) the usual formula overstates speed by `(T - 1) / (T - k)`, 10% for 32
//! tokens in chunks of 4.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::sse::{SseEvent, SseParser};

/// The API bench speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchDialect {
    /// OpenAI chat completions (`/v1/chat/completions`).
    Openai,
    /// Anthropic messages (`/v1/messages`).
    Anthropic,
}

/// What to send.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// Full URL of the endpoint.
    pub uri: Uri,
    /// Dialect of the body and the stream.
    pub dialect: BenchDialect,
    /// The JSON body, rendered once.
    pub body: Bytes,
    /// Extra headers (credentials, class).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    model: String,
    prompt_tokens: u32,
    /// Output tokens asked for.
    pub max_tokens: u32,
    /// Ask for a stream (the default) or one JSON response.
    pub stream: bool,
}

impl RequestSpec {
    /// A streaming request for `model` with a prompt of about `prompt_tokens` tokens (4 bytes
    /// each) and `max_tokens` of output.
    pub fn new(
        base: &str,
        dialect: BenchDialect,
        model: &str,
        prompt_tokens: u32,
        max_tokens: u32,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Result<Self, String> {
        let path = match dialect {
            BenchDialect::Openai => "/v1/chat/completions",
            BenchDialect::Anthropic => "/v1/messages",
        };
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--url: `{base}` is not a valid URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--url: `{base}` must start with http:// (https is not supported by bench yet)"
            ));
        }
        let spec = Self {
            uri,
            dialect,
            body: Bytes::new(),
            headers,
            model: model.to_owned(),
            prompt_tokens,
            max_tokens: 0,
            stream: true,
        };
        Ok(spec.with_max_tokens(max_tokens))
    }

    /// The same request asking for one JSON response instead of a stream.
    #[must_use]
    pub fn unstreamed(&self) -> Self {
        Self {
            stream: false,
            ..self.clone()
        }
        .with_max_tokens(self.max_tokens)
    }

    /// The same request asking for `max_tokens` of output.
    #[must_use]
    pub fn with_max_tokens(&self, max_tokens: u32) -> Self {
        let prompt = "word".repeat(self.prompt_tokens as usize);
        let messages = json!([{"role": "user", "content": prompt}]);
        let body = match (self.dialect, self.stream) {
            (BenchDialect::Openai, true) => json!({
                "model": self.model, "messages": messages, "max_tokens": max_tokens,
                "stream": true, "stream_options": {"include_usage": true},
            }),
            (_, stream) => json!({
                "model": self.model, "messages": messages, "max_tokens": max_tokens, "stream": stream,
            }),
        };
        Self {
            body: Bytes::from(body.to_string()),
            max_tokens,
            ..self.clone()
        }
    }
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Seconds from send to the first content event.
    pub ttft: Option<f64>,
    /// Seconds from the first to the last content event.
    pub decode: f64,
    /// Output tokens (from usage, else the number of content events).
    pub output_tokens: u32,
    /// Events that carried content.
    pub content_events: u32,
    /// Body frames (reads) that carried data: equal to the events when nothing coalesced them.
    pub frames: u32,
    /// `output_tokens` came from counting events, not from usage.
    pub estimated: bool,
    /// Gaps between successive content events, seconds.
    pub gaps: Vec<f64>,
    /// Seconds from send to the end of the body.
    pub total: f64,
    /// The `x-tpsgate-backend` of the response, when a tpsgate answered.
    pub backend: Option<String>,
}

impl Sample {
    /// Time per output token after the first, seconds; needs two tokens.
    pub fn tpot(&self) -> Option<f64> {
        if self.error.is_some() || self.content_events < 2 || self.decode <= 0.0 {
            return None;
        }
        let tokens = f64::from(self.output_tokens);
        let after_first = tokens - tokens / f64::from(self.content_events);
        (after_first > 0.0).then(|| self.decode / after_first)
    }

    /// Tokens per second this client saw once output flowed.
    pub fn per_user_tps(&self) -> Option<f64> {
        self.tpot().map(|t| 1.0 / t)
    }
}

/// A pooled HTTP/1.1 client with Nagle off.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the client bench uses.
pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// Sends one request and times its stream.
pub async fn run_one(client: &HttpClient, spec: &RequestSpec) -> Sample {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(spec.uri.clone())
        .header(header::CONTENT_TYPE, "application/json");
    for (name, value) in &spec.headers {
        builder = builder.header(name, value);
    }
    let request = match builder.body(Full::new(spec.body.clone())) {
        Ok(r) => r,
        Err(e) => return failed(format!("cannot build the request: {e}")),
    };
    let start = Instant::now();
    let response = match client.request(request).await {
        Ok(r) => r,
        Err(e) => return failed(format!("request failed: {e}")),
    };
    let status = response.status();
    let backend = response
        .headers()
        .get("x-tpsgate-backend")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = response.into_body();
    if !status.is_success() {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let mut sample = failed(format!("HTTP {}: {}", status.as_u16(), text.trim()));
        sample.backend = backend;
        return sample;
    }
    if !spec.stream {
        let collected = body.collect().await;
        let end = Instant::now();
        let mut sample = match collected {
            Ok(b) => unstreamed(spec.dialect, &b.to_bytes()),
            Err(e) => failed(format!("body broke: {e}")),
        };
        sample.total = (end - start).as_secs_f64();
        sample.backend = backend;
        return sample;
    }
    let mut timer = StreamTimer::new(spec.dialect, start);
    let mut parser = SseParser::new();
    let mut frames = 0u32;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    frames += 1;
                    let now = Instant::now();
                    parser.feed(data, &mut |ev| timer.on_event(ev, now));
                }
            }
            Err(e) => {
                let mut sample = timer.finish(Instant::now());
                sample.error = Some(format!(
                    "stream broke after {} tokens: {e}",
                    sample.output_tokens
                ));
                sample.backend = backend;
                sample.frames = frames;
                return sample;
            }
        }
    }
    let mut sample = timer.finish(Instant::now());
    sample.backend = backend;
    sample.frames = frames;
    sample
}

/// A whole JSON response: its output tokens from usage.
fn unstreamed(dialect: BenchDialect, body: &[u8]) -> Sample {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return failed("the response is not JSON".to_owned());
    };
    let tokens = match dialect {
        BenchDialect::Openai => &value["usage"]["completion_tokens"],
        BenchDialect::Anthropic => &value["usage"]["output_tokens"],
    };
    Sample {
        output_tokens: tokens
            .as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(0),
        estimated: tokens.is_null(),
        ..Sample::default()
    }
}

fn failed(error: String) -> Sample {
    Sample {
        error: Some(error),
        ..Sample::default()
    }
}

/// Reads events of one stream and keeps the times that matter.
struct StreamTimer {
    dialect: BenchDialect,
    start: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    content_events: u32,
    usage_tokens: Option<u32>,
    gaps: Vec<f64>,
    error: Option<String>,
    done: bool,
}

impl StreamTimer {
    fn new(dialect: BenchDialect, start: Instant) -> Self {
        Self {
            dialect,
            start,
            first: None,
            last: None,
            content_events: 0,
            usage_tokens: None,
            gaps: Vec::new(),
            error: None,
            done: false,
        }
    }

    fn on_event(&mut self, ev: SseEvent<'_>, now: Instant) {
        if ev.data == b"[DONE]" {
            self.done = true;
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(ev.data) else {
            return;
        };
        let (content, usage) = match self.dialect {
            BenchDialect::Openai => openai_event(&value),
            BenchDialect::Anthropic => anthropic_event(&value),
        };
        if let Some(err) = value.get("error") {
            self.error = Some(format!("error event: {err}"));
        }
        if self.dialect == BenchDialect::Anthropic && value["type"] == "message_stop" {
            self.done = true;
        }
        if let Some(tokens) = usage {
            self.usage_tokens = Some(tokens);
        }
        if content {
            self.content_events += 1;
            if let Some(last) = self.last {
                self.gaps.push((now - last).as_secs_f64());
            }
            self.first.get_or_insert(now);
            self.last = Some(now);
        }
    }

    fn finish(self, end: Instant) -> Sample {
        let error = self
            .error
            .or_else(|| (!self.done).then(|| "stream ended without its closing event".to_owned()));
        Sample {
            error,
            ttft: self.first.map(|f| (f - self.start).as_secs_f64()),
            decode: match (self.first, self.last) {
                (Some(f), Some(l)) => (l - f).as_secs_f64(),
                _ => 0.0,
            },
            output_tokens: self.usage_tokens.unwrap_or(self.content_events),
            content_events: self.content_events,
            estimated: self.usage_tokens.is_none(),
            gaps: self.gaps,
            total: (end - self.start).as_secs_f64(),
            backend: None,
            frames: 0,
        }
    }
}

fn non_empty(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.is_empty())
}

/// (carries content, completion tokens from usage) for an OpenAI chunk.
fn openai_event(v: &Value) -> (bool, Option<u32>) {
    let content = v["choices"].as_array().is_some_and(|choices| {
        choices.iter().any(|c| {
            let d = &c["delta"];
            non_empty(&d["content"])
                || non_empty(&d["reasoning_content"])
                || non_empty(&d["reasoning"])
                || d["tool_calls"].as_array().is_some_and(|t| !t.is_empty())
                || non_empty(&c["text"])
        })
    });
    let usage = v["usage"]["completion_tokens"].as_u64().map(clamp_u32);
    (content, usage)
}

/// (carries content, output tokens from usage) for an Anthropic event.
fn anthropic_event(v: &Value) -> (bool, Option<u32>) {
    match v["type"].as_str() {
        Some("content_block_delta") => {
            let d = &v["delta"];
            let content =
                non_empty(&d["text"]) || non_empty(&d["thinking"]) || non_empty(&d["partial_json"]);
            (content, None)
        }
        Some("message_delta") => (false, v["usage"]["output_tokens"].as_u64().map(clamp_u32)),
        _ => (false, None),
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpot_excludes_the_tokens_of_the_first_chunk() {
        // 32 tokens in 8 chunks of 4, one chunk every 40 ms: 4 tokens per 40 ms = 10 ms a token.
        let chunked = Sample {
            decode: 0.280,
            output_tokens: 32,
            content_events: 8,
            ..Sample::default()
        };
        assert!((chunked.tpot().unwrap() - 0.010).abs() < 1e-12);
        let single = Sample {
            decode: 0.310,
            output_tokens: 32,
            content_events: 32,
            ..Sample::default()
        };
        assert!((single.tpot().unwrap() - 0.010).abs() < 1e-12);
    }

    #[test]
    fn role_only_chunk_is_not_content() {
        let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]});
        assert_eq!(openai_event(&role), (false, None));
        let empty = json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]});
        assert_eq!(openai_event(&empty), (false, None));
        let text = json!({"choices": [{"delta": {"content": "hi"}}]});
        assert_eq!(openai_event(&text), (true, None));
    }

    #[test]
    fn usage_comes_from_the_final_chunk_or_message_delta() {
        let usage = json!({"choices": [], "usage": {"completion_tokens": 12}});
        assert_eq!(openai_event(&usage), (false, Some(12)));
        let delta = json!({"type": "message_delta", "usage": {"output_tokens": 7}});
        assert_eq!(anthropic_event(&delta), (false, Some(7)));
    }
}
