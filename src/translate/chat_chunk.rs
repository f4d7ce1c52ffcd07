//! An OpenAI chat completion chunk as it stands in the stream: what the translations of chat
//! streams read of it, borrowed (strings raw, never unescaped).

use serde::Deserialize;
use serde_json::value::RawValue;

/// A chunk: its first choice (a translated request asks for one), its usage, or an error.
#[derive(Deserialize)]
pub(super) struct Chunk<'a> {
    #[serde(borrow, default)]
    pub(super) id: Option<&'a RawValue>,
    /// Unix seconds.
    #[serde(default)]
    pub(super) created: Option<u64>,
    #[serde(borrow, default)]
    pub(super) model: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "super::chunks::first")]
    pub(super) choices: Option<Choice<'a>>,
    #[serde(default)]
    pub(super) usage: Option<ChunkUsage>,
    #[serde(borrow, default)]
    pub(super) error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct Choice<'a> {
    #[serde(borrow, default)]
    pub(super) delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    pub(super) finish_reason: Option<&'a RawValue>,
    /// vLLM's: the stop string that ended the generation (or a token id).
    #[serde(borrow, default)]
    pub(super) stop_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct Delta<'a> {
    #[serde(borrow, default)]
    pub(super) content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) tool_calls: Option<Vec<ToolDelta<'a>>>,
}

#[derive(Deserialize)]
pub(super) struct ToolDelta<'a> {
    #[serde(default)]
    pub(super) index: u64,
    #[serde(borrow, default)]
    pub(super) id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
pub(super) struct FunctionDelta<'a> {
    #[serde(borrow, default)]
    pub(super) name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) arguments: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct ChunkUsage {
    #[serde(default)]
    pub(super) prompt_tokens: u64,
    #[serde(default)]
    pub(super) completion_tokens: u64,
    #[serde(default)]
    pub(super) prompt_tokens_details: Option<Details>,
    #[serde(default)]
    pub(super) completion_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
pub(super) struct Details {
    /// Of the prompt's: read from the engine's prefix cache.
    #[serde(default)]
    pub(super) cached_tokens: Option<u64>,
    /// Of the completion's: the model's reasoning.
    #[serde(default)]
    pub(super) reasoning_tokens: Option<u64>,
}

/// A raw JSON string that is neither `null` nor empty.
pub(super) fn text(raw: Option<&RawValue>) -> Option<&str> {
    raw.map(RawValue::get)
        .filter(|t| t.starts_with('"') && *t != "\"\"")
}
