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

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::curve::observation::decode_tpot;
use crate::sse::events::StreamDialect;
use crate::sse::{SseEvent, SseParser};
use crate::sse::{StreamTiming, read_event};

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
    prompt: Prompt,
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
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(format!(
                "--url: `{base}` must start with http:// or https://"
            ));
        }
        let spec = Self {
            uri,
            dialect,
            body: Bytes::new(),
            headers,
            model: model.to_owned(),
            prompt: Prompt::Words(prompt_tokens),
            max_tokens: 0,
            stream: true,
        };
        Ok(spec.with_max_tokens(max_tokens))
    }

    /// The same request asking for one JSON response instead of a stream.
    #[must_use]
    pub(crate) fn unstreamed(&self) -> Self {
        Self {
            stream: false,
            ..self.clone()
        }
        .with_max_tokens(self.max_tokens)
    }

    /// The same request named `id` (`x-request-id`, in place of any it had). The simulator
    /// draws a named request's speed from its name, so runs that send the same names get the
    /// same speeds, and arms replaying the same arrivals differ only in where they sent them.
    #[must_use]
    pub(crate) fn named(mut self, id: &str) -> Self {
        let name = HeaderName::from_static("x-request-id");
        self.headers.retain(|(n, _)| *n != name);
        if let Ok(value) = HeaderValue::from_str(id) {
            self.headers.push((name, value));
        }
        self
    }

    /// The same request asking for `max_tokens` of output.
    #[must_use]
    pub fn with_max_tokens(&self, max_tokens: u32) -> Self {
        self.with_shape(self.prompt.clone(), max_tokens)
    }

    /// The same request with `prompt` and `max_tokens` of output.
    #[must_use]
    pub(crate) fn with_shape(&self, prompt: Prompt, max_tokens: u32) -> Self {
        let (system, turns) = match &prompt {
            Prompt::Words(n) => (None, vec!["word".repeat(*n as usize)]),
            Prompt::Text(text) => (None, vec![text.to_string()]),
            Prompt::Chat { system, turns } => (
                system.as_deref(),
                turns.iter().map(|t| t.to_string()).collect(),
            ),
        };
        let mut messages: Vec<Value> = turns
            .into_iter()
            .enumerate()
            .map(|(i, text)| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                json!({"role": role, "content": text})
            })
            .collect();
        if let (Some(system), BenchDialect::Openai) = (system, self.dialect) {
            messages.insert(0, json!({"role": "system", "content": system}));
        }
        let mut body = match (self.dialect, self.stream) {
            (BenchDialect::Openai, true) => json!({
                "model": self.model, "messages": messages, "max_tokens": max_tokens,
                "stream": true, "stream_options": {"include_usage": true},
            }),
            (_, stream) => json!({
                "model": self.model, "messages": messages, "max_tokens": max_tokens, "stream": stream,
            }),
        };
        if let (Some(system), BenchDialect::Anthropic) = (system, self.dialect) {
            body["system"] = json!(system);
        }
        Self {
            body: Bytes::from(body.to_string()),
            max_tokens,
            prompt,
            ..self.clone()
        }
    }

    /// The prompt's size in tokens, as sent (a text's estimated at 4 bytes a token).
    pub(crate) fn prompt_tokens(&self) -> u32 {
        let bytes = match &self.prompt {
            Prompt::Words(n) => return *n,
            Prompt::Text(text) => text.len(),
            Prompt::Chat { system, turns } => {
                system.as_ref().map_or(0, |s| s.len())
                    + turns.iter().map(|t| t.len()).sum::<usize>()
            }
        };
        u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX)
    }

    /// The conversation's next turn: this request's prompt, the reply it got (`reply_tokens`
    /// long; a placeholder of that length, since what a prefix cache sees is that the next
    /// turn re-sends the same bytes), and `question`.
    #[must_use]
    pub(crate) fn next_turn(&self, reply_tokens: u32, question: String) -> Self {
        let (system, mut turns) = match &self.prompt {
            Prompt::Chat { system, turns } => (system.clone(), turns.to_vec()),
            Prompt::Words(n) => (None, vec![Arc::from("word".repeat(*n as usize))]),
            Prompt::Text(text) => (None, vec![Arc::clone(text)]),
        };
        turns.push(Arc::from("said".repeat(reply_tokens.max(1) as usize)));
        turns.push(Arc::from(question));
        self.with_shape(
            Prompt::Chat {
                system,
                turns: turns.into(),
            },
            self.max_tokens,
        )
    }
}

/// A request's prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// `n` repetitions of a four-byte word: about `n` tokens.
    Words(u32),
    /// A text, e.g. the first user turn of a recorded conversation.
    Text(Arc<str>),
    /// A system prompt and the turns of a conversation, user first and last.
    Chat {
        /// The system prompt, if any.
        system: Option<Arc<str>>,
        /// User and assistant turns, alternating.
        turns: Arc<[Arc<str>]>,
    },
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Measurement {
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Seconds from send to the first content event.
    pub ttft: Option<f64>,
    /// Seconds from the first content event to the end of the generation: its finish event
    /// when usage counts the tokens, else the last content event.
    pub decode: f64,
    /// Seconds from the first to the last content event.
    pub visible: f64,
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
    /// The prompt's size as sent, tokens (estimated for a text).
    pub prompt_tokens: u32,
    /// The output asked for (`max_tokens`).
    pub max_tokens: u32,
    /// Prompt tokens as the server's usage reported them.
    pub reported_prompt_tokens: Option<u32>,
    /// Of those, served from the server's prefix cache, as its usage reported.
    pub cached_tokens: Option<u32>,
}

impl Measurement {
    /// Time per output token after the first, seconds; needs two content events.
    pub(crate) fn tpot(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        let tokens = f64::from(self.output_tokens);
        decode_tpot(tokens, self.content_events, self.visible, self.decode)
    }

    /// Tokens per second this client saw once output flowed.
    pub fn per_user_tps(&self) -> Option<f64> {
        self.tpot().map(|t| 1.0 / t)
    }
}

pub use crate::tls::{HttpClient, http_client};

/// Sends one request and times its stream.
pub async fn run_one(client: &HttpClient, spec: &RequestSpec) -> Measurement {
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
fn unstreamed(dialect: BenchDialect, body: &[u8]) -> Measurement {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return failed("the response is not JSON".to_owned());
    };
    let tokens = match dialect {
        BenchDialect::Openai => &value["usage"]["completion_tokens"],
        BenchDialect::Anthropic => &value["usage"]["output_tokens"],
    };
    Measurement {
        output_tokens: tokens
            .as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(0),
        estimated: tokens.is_null(),
        ..Measurement::default()
    }
}

fn failed(error: String) -> Measurement {
    Measurement {
        error: Some(error),
        ..Measurement::default()
    }
}

/// Reads events of one stream and keeps the times that matter, through the gateway's own
/// reading of events ([`read_event`]): bench and the gateway count alike.
struct StreamTimer {
    dialect: StreamDialect,
    start: Instant,
    timing: StreamTiming,
    gaps: Vec<f64>,
    error: Option<String>,
}

impl StreamTimer {
    fn new(dialect: BenchDialect, start: Instant) -> Self {
        Self {
            dialect: match dialect {
                BenchDialect::Openai => StreamDialect::OpenAi,
                BenchDialect::Anthropic => StreamDialect::Anthropic,
            },
            start,
            timing: StreamTiming::default(),
            gaps: Vec::new(),
            error: None,
        }
    }

    fn on_event(&mut self, ev: SseEvent<'_>, now: Instant) {
        let last = self.timing.last_content;
        let read = read_event(&mut self.timing, self.dialect, ev.event, ev.data, now);
        if let (true, Some(last)) = (read.content, last) {
            self.gaps.push((now - last).as_secs_f64());
        }
        if ev.event == b"error" || memchr::memmem::find(ev.data, b"\"error\"").is_some() {
            let error = serde_json::from_slice::<Value>(ev.data)
                .ok()
                .and_then(|v| v.get("error").cloned());
            if let Some(err) = error {
                self.error = Some(format!("error event: {err}"));
            }
        }
    }

    /// The sample of a stream that ended at `end`. It is complete when an event finished the
    /// generation (`[DONE]` or not: transformers serve sends none); with usage, decode runs to
    /// that event, through any text the engine held back.
    fn finish(self, end: Instant) -> Measurement {
        let t = &self.timing;
        let error = self.error.or_else(|| {
            t.finished
                .is_none()
                .then(|| "stream ended before the event that finishes a generation".to_owned())
        });
        Measurement {
            error,
            ttft: t.first_content.map(|f| (f - self.start).as_secs_f64()),
            decode: match (t.first_content, t.decode_end()) {
                (Some(f), Some(l)) => (l - f).as_secs_f64(),
                _ => 0.0,
            },
            visible: match (t.first_content, t.last_content) {
                (Some(f), Some(l)) => (l - f).as_secs_f64(),
                _ => 0.0,
            },
            output_tokens: t
                .output_tokens
                .map_or(t.content_events, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            content_events: t.content_events,
            estimated: t.output_tokens.is_none(),
            gaps: self.gaps,
            total: (end - self.start).as_secs_f64(),
            reported_prompt_tokens: t.prompt_tokens.and_then(|n| u32::try_from(n).ok()),
            cached_tokens: t.cached_tokens.and_then(|n| u32::try_from(n).ok()),
            ..Measurement::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn tpot_excludes_the_tokens_of_the_first_chunk() {
        // 32 tokens in 8 chunks of 4, one chunk every 40 ms: 4 tokens per 40 ms = 10 ms a token.
        let chunked = Measurement {
            decode: 0.280,
            visible: 0.280,
            output_tokens: 32,
            content_events: 8,
            ..Measurement::default()
        };
        assert!((chunked.tpot().unwrap() - 0.010).abs() < 1e-12);
        let single = Measurement {
            decode: 0.310,
            visible: 0.310,
            output_tokens: 32,
            content_events: 32,
            ..Measurement::default()
        };
        assert!((single.tpot().unwrap() - 0.010).abs() < 1e-12);
    }

    /// Feeds `events` (name, data, ms after the start) to a timer.
    fn timed(dialect: BenchDialect, events: &[(&str, &str, u64)]) -> Measurement {
        let t0 = Instant::now();
        let mut timer = StreamTimer::new(dialect, t0);
        let mut parser = SseParser::new();
        for (event, data, ms) in events {
            let wire = if event.is_empty() {
                format!("data: {data}\n\n")
            } else {
                format!("event: {event}\ndata: {data}\n\n")
            };
            let at = t0 + Duration::from_millis(*ms);
            parser.feed(wire.as_bytes(), &mut |ev| timer.on_event(ev, at));
        }
        timer.finish(t0 + Duration::from_secs(1))
    }

    const ROLE: &str = r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#;
    const HI: &str = r#"{"choices":[{"delta":{"content":"hi"}}]}"#;

    #[test]
    fn a_stream_that_ends_after_its_finish_chunk_without_done_is_complete() {
        let finish = r#"{"choices":[{"delta":{},"finish_reason":"length"}],"usage":{"completion_tokens":2}}"#;
        let s = timed(
            BenchDialect::Openai,
            &[("", ROLE, 5), ("", HI, 10), ("", HI, 20), ("", finish, 20)],
        );
        assert_eq!(s.error, None);
        assert_eq!(
            (s.output_tokens, s.content_events, s.estimated),
            (2, 2, false)
        );
        let anthropic = timed(
            BenchDialect::Anthropic,
            &[
                ("content_block_delta", r#"{"delta":{"text":"a"}}"#, 10),
                ("content_block_delta", r#"{"delta":{"text":"b"}}"#, 20),
                (
                    "message_delta",
                    r#"{"delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
                    21,
                ),
            ],
        );
        assert_eq!((anthropic.error, anthropic.output_tokens), (None, 2));
    }

    #[test]
    fn a_stream_cut_before_its_finish_event_is_an_error() {
        let s = timed(
            BenchDialect::Openai,
            &[("", ROLE, 5), ("", HI, 10), ("", HI, 20)],
        );
        assert!(s.error.unwrap().contains("before the event that finishes"));
        let e = timed(
            BenchDialect::Openai,
            &[
                ("", HI, 10),
                ("", r#"{"error":{"message":"overloaded"}}"#, 20),
                ("", "[DONE]", 21),
            ],
        );
        assert!(e.error.unwrap().contains("overloaded"));
    }

    #[test]
    fn with_usage_decode_runs_to_the_finish_chunk_through_text_held_back() {
        // 11 tokens at 10 ms each: text for the first 3, then silence until the finish chunk.
        let finish = r#"{"choices":[{"delta":{"content":""},"finish_reason":"length"}],"usage":{"completion_tokens":11}}"#;
        let s = timed(
            BenchDialect::Openai,
            &[("", HI, 10), ("", HI, 20), ("", HI, 30), ("", finish, 110)],
        );
        assert!((s.decode - 0.100).abs() < 1e-9, "decode {}", s.decode);
        // The 10 tokens after the first event in 100 ms, not 7.3 tokens in 20 ms.
        assert!((s.tpot().unwrap() - 0.010).abs() < 1e-9);
        assert_eq!(s.gaps.len(), 2, "gaps are between content events");
    }
}
