//! The simulated engine's context window (`max_model_len`): what vLLM reports of it and how it
//! refuses a request past it, so that the gateway's windows are tested against an engine that
//! enforces one.

use super::wire::GenRequest;

/// The message of vLLM's 400 for `req` past `window`: its prompt and the output it may ask
/// for together (none asked: the prompt must leave one token).
pub(super) fn past_window(window: u32, req: &GenRequest) -> Option<String> {
    let asked = req.max_tokens.unwrap_or(1);
    let total = u64::from(req.prompt_tokens) + u64::from(asked);
    (total > u64::from(window)).then(|| {
        format!(
            "This model's maximum context length is {window} tokens. However, you requested {total} tokens ({} in the messages, {asked} in the completion). Please reduce the length of the messages or completion.",
            req.prompt_tokens
        )
    })
}

/// `max_model_len` added to a model listing's entry or a `/tokenize` answer, as vLLM adds it.
pub(super) fn report(value: &mut serde_json::Value, window: Option<u32>) {
    if let (Some(window), Some(object)) = (window, value.as_object_mut()) {
        object.insert("max_model_len".to_owned(), window.into());
    }
}
