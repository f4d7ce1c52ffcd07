//! Any request body through the JSON peek and the byte-level rewrite: no panic; of a body that is
//! valid JSON the peek reads the model a parser reads, and the rewrite keeps it valid JSON with
//! the new model, include_usage and a cut output budget in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpsgate::peek;
use tpsgate::Endpoint;
use tpsgate::{Edits, rewrite_body};

fuzz_target!(|data: &[u8]| {
    for endpoint in [
        Endpoint::Chat,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::Other { anthropic: false },
    ] {
        let Ok(classified) = peek(endpoint, data) else {
            continue;
        };
        let body = bytes::Bytes::copy_from_slice(data);
        let edits = Edits {
            upstream_model: Some("upstream/\"model\""),
            inject_usage: true,
            max_tokens: Some(7),
        };
        let out = rewrite_body(&body, &classified, edits);
        if let Ok(serde_json::Value::Object(parsed)) =
            serde_json::from_slice::<serde_json::Value>(data)
        {
            assert_eq!(
                classified.model.as_deref(),
                parsed.get("model").and_then(|m| m.as_str())
            );
            let value: serde_json::Value =
                serde_json::from_slice(&out).expect("the rewrite keeps JSON valid");
            if classified.model.is_some() {
                assert_eq!(value["model"], "upstream/\"model\"");
            }
            if classified.max_tokens.is_some() {
                let limits = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
                assert!(limits.iter().any(|k| value[k] == 7));
            }
        }
    }
});
