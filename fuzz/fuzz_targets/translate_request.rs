//! Any body as a request translated for a backend of the other dialect, both ways: no panic,
//! and a translation is a JSON object (anything else is refused with a reason).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpsgate::translate::{Thinking, chat_to_messages, messages_to_chat};

fuzz_target!(|data: &[u8]| {
    for translated in [
        messages_to_chat(data, "up", Thinking::ChatTemplate),
        chat_to_messages(data, "up", 16),
    ] {
        match translated {
            Ok(body) => assert!(matches!(
                serde_json::from_slice::<serde_json::Value>(&body),
                Ok(serde_json::Value::Object(_))
            )),
            Err(refused) => assert!(!refused.0.is_empty()),
        }
    }
});
