//! Any body as a request translated for a backend of the other dialect, both ways, and as a
//! Responses request for a chat completions backend (hosted tools dropped or refused) and on
//! to an Anthropic one: no panic, and a translation is a JSON object (anything else is refused
//! with a reason).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpsgate::translate::{
    HostedTools, Thinking, chat_to_messages, messages_to_chat, responses_to_chat,
};

fuzz_target!(|data: &[u8]| {
    let responses = [HostedTools::Drop, HostedTools::Refuse]
        .map(|hosted| responses_to_chat(data, "up", Thinking::ReasoningEffort, hosted));
    let through_chat = match &responses[0] {
        Ok(chat) => chat_to_messages(&chat.body, "up", 16),
        Err(refused) => Err(refused.clone()),
    };
    let responses = responses.map(|r| r.map(|chat| chat.body));
    for translated in [
        messages_to_chat(data, "up", Thinking::ChatTemplate),
        chat_to_messages(data, "up", 16),
        through_chat,
    ]
    .into_iter()
    .chain(responses)
    {
        match translated {
            Ok(body) => assert!(matches!(
                serde_json::from_slice::<serde_json::Value>(&body),
                Ok(serde_json::Value::Object(_))
            )),
            Err(refused) => assert!(!refused.0.is_empty()),
        }
    }
});
