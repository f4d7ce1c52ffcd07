//! What an event of an LLM stream means for timing: does it carry content, and does it carry
//! usage. Cheap byte searches first; JSON is parsed only for the rare event that mentions usage.

use memchr::memmem;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// The stream dialect, as far as reading events is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamDialect {
    /// OpenAI chat completions and completions.
    OpenAi,
    /// OpenAI responses API.
    Responses,
    /// Anthropic messages.
    Anthropic,
}

/// Whether the event carries generated content: non-empty text, reasoning, or tool-call
/// arguments. A role-only chunk, `message_start`, pings and usage chunks do not.
pub(crate) fn is_content(dialect: StreamDialect, event: &[u8], data: &[u8]) -> bool {
    match dialect {
        StreamDialect::OpenAi => {
            let f = finders();
            non_empty_string(data, &f.content)
                || non_empty_string(data, &f.text)
                || non_empty_string(data, &f.reasoning_content)
                || non_empty_string(data, &f.reasoning)
                || f.tool_calls.find(data).is_some()
        }
        StreamDialect::Anthropic => event == b"content_block_delta",
        StreamDialect::Responses => event.ends_with(b".delta") && event.starts_with(b"response."),
    }
}

/// Whether the event ends the generation: OpenAI's chunk with a `finish_reason` (or its closing
/// `[DONE]`), Anthropic's `message_delta` with a `stop_reason` (or `message_stop`), the
/// Responses API's `response.completed` (or `response.incomplete`, an answer cut at its
/// limit). A stream that ended cleanly after one is complete,
/// with or without `[DONE]` (transformers serve sends none), content or not.
pub(crate) fn is_finish(dialect: StreamDialect, event: &[u8], data: &[u8]) -> bool {
    let f = finders();
    match dialect {
        StreamDialect::OpenAi => data == b"[DONE]" || non_empty_string(data, &f.finish_reason),
        StreamDialect::Anthropic => {
            event == b"message_stop"
                || (event == b"message_delta" && non_empty_string(data, &f.stop_reason))
        }
        StreamDialect::Responses => {
            event == b"response.completed" || event == b"response.incomplete"
        }
    }
}

/// Searchers built once: building a memmem searcher per call costs more than the search.
struct Finders {
    content: memmem::Finder<'static>,
    text: memmem::Finder<'static>,
    reasoning_content: memmem::Finder<'static>,
    reasoning: memmem::Finder<'static>,
    tool_calls: memmem::Finder<'static>,
    usage: memmem::Finder<'static>,
    finish_reason: memmem::Finder<'static>,
    stop_reason: memmem::Finder<'static>,
}

fn finders() -> &'static Finders {
    static FINDERS: std::sync::LazyLock<Finders> = std::sync::LazyLock::new(|| Finders {
        content: memmem::Finder::new(b"\"content\":"),
        text: memmem::Finder::new(b"\"text\":"),
        reasoning_content: memmem::Finder::new(b"\"reasoning_content\":"),
        reasoning: memmem::Finder::new(b"\"reasoning\":"),
        tool_calls: memmem::Finder::new(b"\"tool_calls\":[{"),
        usage: memmem::Finder::new(b"\"usage\""),
        finish_reason: memmem::Finder::new(b"\"finish_reason\":"),
        stop_reason: memmem::Finder::new(b"\"stop_reason\":"),
    });
    &FINDERS
}

/// True when the key is followed (after optional spaces) by a string with at least one character.
fn non_empty_string(data: &[u8], key: &memmem::Finder<'_>) -> bool {
    let len = key.needle().len();
    key.find_iter(data).any(|at| {
        let rest = &data[at + len..];
        let rest = &rest[rest.iter().take_while(|b| **b == b' ').count()..];
        rest.len() >= 2 && rest[0] == b'"' && rest[1] != b'"'
    })
}

/// Token counts reported by a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Usage {
    /// Prompt tokens, when reported.
    pub prompt_tokens: Option<u64>,
    /// Output tokens, when reported (Anthropic's `message_start` reports input tokens only).
    pub output_tokens: Option<u64>,
    /// Of the prompt tokens, those the backend served from its prefix cache, when reported:
    /// OpenAI's `prompt_tokens_details.cached_tokens` (vLLM and SGLang send it too), the
    /// responses API's `input_tokens_details.cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`.
    pub cached_tokens: Option<u64>,
}

/// What a usage-bearing event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UsageEvent {
    /// The counts.
    pub usage: Usage,
    /// An OpenAI chunk with empty `choices`: nothing but usage, safe to remove.
    pub usage_only: bool,
}

#[derive(Deserialize)]
struct OpenAiChunk {
    choices: Option<Vec<IgnoredAny>>,
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<CachedDetails>,
}

#[derive(Deserialize)]
struct CachedDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct AnthropicEvent {
    usage: Option<AnthropicUsage>,
    message: Option<AnthropicMessage>,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct AnthropicUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ResponsesEvent {
    response: Option<ResponsesBody>,
}

#[derive(Deserialize)]
struct ResponsesBody {
    usage: Option<ResponsesUsage>,
}

#[derive(Deserialize)]
struct ResponsesUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<CachedDetails>,
}

/// Usage carried by this event, if any: OpenAI's usage chunk (or usage on the finish chunk),
/// Anthropic's `message_delta` (and `message_start` for input tokens), the responses API's
/// `response.completed`.
pub(crate) fn usage(dialect: StreamDialect, event: &[u8], data: &[u8]) -> Option<UsageEvent> {
    finders().usage.find(data)?;
    match dialect {
        StreamDialect::OpenAi => {
            let chunk: OpenAiChunk = serde_json::from_slice(data).ok()?;
            let u = chunk.usage?;
            Some(UsageEvent {
                usage: Usage {
                    prompt_tokens: u.prompt_tokens,
                    output_tokens: Some(u.completion_tokens?),
                    cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
                },
                usage_only: chunk.choices.is_some_and(|c| c.is_empty()),
            })
        }
        StreamDialect::Anthropic => {
            let ev: AnthropicEvent = serde_json::from_slice(data).ok()?;
            let u = ev.usage.or_else(|| ev.message.and_then(|m| m.usage))?;
            let output = if event == b"message_delta" {
                Some(u.output_tokens?)
            } else {
                None
            };
            // Anthropic's input_tokens leave out what was read from or written to the cache.
            let cached = u.cache_read_input_tokens;
            let prompt = u.input_tokens.map(|input| {
                input
                    .saturating_add(cached.unwrap_or(0))
                    .saturating_add(u.cache_creation_input_tokens.unwrap_or(0))
            });
            Some(UsageEvent {
                usage: Usage {
                    prompt_tokens: prompt,
                    output_tokens: output,
                    cached_tokens: cached,
                },
                usage_only: false,
            })
        }
        StreamDialect::Responses => {
            let ev: ResponsesEvent = serde_json::from_slice(data).ok()?;
            Some(UsageEvent {
                usage: ev.response?.usage?.counts()?,
                usage_only: false,
            })
        }
    }
}

impl ResponsesUsage {
    fn counts(self) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: self.input_tokens,
            output_tokens: Some(self.output_tokens?),
            cached_tokens: self.input_tokens_details.and_then(|d| d.cached_tokens),
        })
    }
}

/// The usage of a whole (not streamed) answer of `dialect`: its top-level `usage`, which
/// carries both counts in every dialect (Anthropic's is read as its last stream event's).
pub(crate) fn whole_usage(dialect: StreamDialect, body: &[u8]) -> Option<Usage> {
    match dialect {
        StreamDialect::OpenAi => usage(dialect, b"", body).map(|e| e.usage),
        StreamDialect::Anthropic => usage(dialect, b"message_delta", body).map(|e| e.usage),
        StreamDialect::Responses => {
            finders().usage.find(body)?;
            let whole: ResponsesBody = serde_json::from_slice(body).ok()?;
            whole.usage?.counts()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_only_and_empty_chunks_are_not_content() {
        let d = StreamDialect::OpenAi;
        assert!(!is_content(
            d,
            b"",
            br#"{"choices":[{"delta":{"role":"assistant"}}]}"#
        ));
        assert!(!is_content(
            d,
            b"",
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(is_content(
            d,
            b"",
            br#"{"choices":[{"delta":{"content":"Hi"}}]}"#
        ));
        assert!(is_content(
            d,
            b"",
            br#"{"choices":[{"delta":{"content": "Hi"}}]}"#
        ));
        assert!(is_content(
            d,
            b"",
            br#"{"choices":[{"text":" x","index":0}]}"#
        ));
        assert!(is_content(
            d,
            b"",
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#
        ));
        assert!(!is_content(
            d,
            b"",
            br#"{"choices":[],"usage":{"completion_tokens":3}}"#
        ));
        let a = StreamDialect::Anthropic;
        assert!(!is_content(a, b"message_start", b"{}"));
        assert!(is_content(a, b"content_block_delta", b"{}"));
    }

    #[test]
    fn usage_only_chunk_is_recognised_and_finish_chunk_usage_is_not_removable() {
        let d = StreamDialect::OpenAi;
        let only = usage(
            d,
            b"",
            br#"{"id":"x","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#,
        )
        .unwrap();
        assert_eq!(
            only,
            UsageEvent {
                usage: Usage {
                    prompt_tokens: Some(2),
                    output_tokens: Some(3),
                    cached_tokens: None,
                },
                usage_only: true
            }
        );
        let on_finish = usage(
            d,
            b"",
            br#"{"choices":[{"finish_reason":"length"}],"usage":{"completion_tokens":3}}"#,
        )
        .unwrap();
        assert!(!on_finish.usage_only);
        assert_eq!(
            usage(d, b"", br#"{"choices":[{"delta":{"content":"usage"}}]}"#),
            None
        );
        let a = usage(
            StreamDialect::Anthropic,
            b"message_delta",
            br#"{"type":"message_delta","usage":{"output_tokens":7}}"#,
        )
        .unwrap();
        assert_eq!(a.usage.output_tokens, Some(7));
    }

    #[test]
    fn responses_api_deltas_are_content_and_completed_carries_usage() {
        let r = StreamDialect::Responses;
        assert!(is_content(
            r,
            b"response.output_text.delta",
            br#"{"delta":"Hi"}"#
        ));
        assert!(is_content(
            r,
            b"response.function_call_arguments.delta",
            br#"{"delta":"{"}"#
        ));
        assert!(!is_content(r, b"response.created", b"{}"));
        let done = usage(
            r,
            b"response.completed",
            br#"{"response":{"usage":{"input_tokens":5,"output_tokens":7}}}"#,
        )
        .unwrap();
        assert_eq!(
            done.usage,
            Usage {
                prompt_tokens: Some(5),
                output_tokens: Some(7),
                cached_tokens: None,
            }
        );
    }

    #[test]
    fn the_finish_event_of_each_dialect_is_recognised_and_nothing_else_is() {
        use StreamDialect::{Anthropic, OpenAi, Responses};
        let finish = |d, e: &str, data: &str| is_finish(d, e.as_bytes(), data.as_bytes());
        assert!(finish(
            OpenAi,
            "",
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#
        ));
        assert!(finish(
            OpenAi,
            "",
            r#"{"choices":[{"delta":{}, "finish_reason": "length"}]}"#
        ));
        assert!(finish(OpenAi, "", "[DONE]"));
        assert!(!finish(
            OpenAi,
            "",
            r#"{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}"#
        ));
        assert!(finish(
            Anthropic,
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#
        ));
        assert!(finish(
            Anthropic,
            "message_stop",
            r#"{"type":"message_stop"}"#
        ));
        assert!(!finish(
            Anthropic,
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":null}}"#
        ));
        assert!(finish(Responses, "response.completed", "{}"));
        assert!(!finish(Responses, "response.output_text.delta", "{}"));
    }

    #[test]
    fn cached_prompt_tokens_are_read_in_every_dialect() {
        let openai = usage(
            StreamDialect::OpenAi,
            b"",
            br#"{"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":768}}}"#,
        )
        .unwrap();
        assert_eq!(openai.usage.cached_tokens, Some(768));
        // Anthropic's input_tokens leave the cache out: the prompt is all three together.
        let anthropic = usage(
            StreamDialect::Anthropic,
            b"message_start",
            br#"{"type":"message_start","message":{"usage":{"input_tokens":12,"cache_read_input_tokens":2000,"cache_creation_input_tokens":100,"output_tokens":1}}}"#,
        )
        .unwrap();
        assert_eq!(
            (anthropic.usage.prompt_tokens, anthropic.usage.cached_tokens),
            (Some(2112), Some(2000))
        );
        let responses = usage(
            StreamDialect::Responses,
            b"response.completed",
            br#"{"response":{"usage":{"input_tokens":50,"output_tokens":7,"input_tokens_details":{"cached_tokens":32}}}}"#,
        )
        .unwrap();
        assert_eq!(responses.usage.cached_tokens, Some(32));
    }
}
