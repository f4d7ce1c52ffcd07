use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

mod responses;

fn to_chat(request: &Value) -> Value {
    to_chat_reading(request, Thinking::Drop)
}

/// `request` for a backend that reads its reasoning switches as `thinking` says.
fn to_chat_reading(request: &Value, thinking: Thinking) -> Value {
    let out = messages_to_chat(request.to_string().as_bytes(), "up", thinking).unwrap();
    serde_json::from_slice(&out).unwrap()
}

fn to_messages(request: &Value) -> Value {
    let out = chat_to_messages(request.to_string().as_bytes(), "up", 4096).unwrap();
    serde_json::from_slice(&out).unwrap()
}

fn refusal_to_chat(request: &Value) -> String {
    messages_to_chat(
        request.to_string().as_bytes(),
        "up",
        Thinking::ReasoningEffort,
    )
    .unwrap_err()
    .0
}

fn refusal_to_messages(request: &Value) -> String {
    chat_to_messages(request.to_string().as_bytes(), "up", 4096)
        .unwrap_err()
        .0
}

/// The data of each SSE event in `bytes`, parsed; `[DONE]` as the string.
pub(super) fn events(bytes: &[u8]) -> Vec<Value> {
    std::str::from_utf8(bytes)
        .unwrap()
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_owned())))
        .collect()
}

/// Feeds `stream` to `translator` in pieces of `step` bytes, then ends it.
pub(super) fn run(mut translator: ResponseTranslator, stream: &str, step: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in stream.as_bytes().chunks(step) {
        out.extend_from_slice(&translator.frame(piece));
    }
    out.extend_from_slice(&translator.finish());
    out
}

#[test]
fn an_anthropic_conversation_with_images_and_tools_becomes_openai_messages() {
    let chat = to_chat(&json!({
        "model": "claude", "max_tokens": 100, "stream": true,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "png"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a logo", "is_error": false},
                {"type": "text", "text": "And?"},
            ]},
        ],
        "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "metadata": {"user_id": "u-7"}, "service_tier": "auto",
        "tools": [{"name": "lookup", "description": "Looks up", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    }));
    assert_eq!(
        chat,
        json!({
            "model": "up", "max_tokens": 100, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
                ]},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"png\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "a logo"},
                {"role": "user", "content": [{"type": "text", "text": "And?"}]},
            ],
            "stop": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 40, "user": "u-7",
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "Looks up", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "parallel_tool_calls": false,
        })
    );
}

#[test]
fn an_openai_conversation_with_images_and_tools_becomes_anthropic_messages() {
    let messages = to_messages(&json!({
        "model": "gpt", "stream": true, "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"}},
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"png\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a logo"},
            {"role": "user", "content": "And?"},
        ],
        "stop": "END", "temperature": 0.5, "user": "u-7", "n": 1, "seed": 3,
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "parallel_tool_calls": false,
    }));
    assert_eq!(
        messages,
        json!({
            "model": "up", "max_tokens": 4096, "stream": true, "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "png"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "a logo"}]},
                    {"type": "text", "text": "And?"},
                ]},
            ],
            "stop_sequences": ["END"], "temperature": 0.5, "metadata": {"user_id": "u-7"},
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": true},
        })
    );
    let limited = to_messages(&json!({"model": "m", "max_completion_tokens": 9, "messages": []}));
    assert_eq!(limited["max_tokens"], 9);
}

#[test]
fn a_field_the_target_cannot_express_is_refused_by_name() {
    let base = |extra: Value| {
        let mut r =
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        r
    };
    assert!(
        refusal_to_chat(&base(json!({"thinking": {"type": "sometimes"}})))
            .contains("`thinking.type` `sometimes`")
    );
    assert!(
        refusal_to_chat(&base(
            json!({"output_config": {"format": {"type": "json_schema"}}})
        ))
        .contains("`output_config.format`")
    );
    assert!(
        refusal_to_chat(&base(json!({"output_config": {"effort": "extreme"}})))
            .contains("`output_config.effort` `extreme`")
    );
    assert!(
        refusal_to_chat(&base(
            json!({"tools": [{"type": "web_search_20250305", "name": "w"}]})
        ))
        .contains("`tools[0].type` `web_search_20250305`")
    );
    let document =
        json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]});
    assert!(refusal_to_chat(&base(document)).contains("`messages[0].content[0].type` `document`"));
    assert!(refusal_to_messages(&base(json!({"n": 2}))).contains("`n`"));
    assert!(refusal_to_messages(&base(json!({"logprobs": true}))).contains("`logprobs`"));
    assert!(refusal_to_messages(&base(json!({"temperature": 1.5}))).contains("`temperature`"));
    assert!(
        refusal_to_messages(&base(json!({"response_format": {"type": "json_object"}})))
            .contains("`response_format`")
    );
    let bad_arguments = json!({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}]});
    assert!(refusal_to_messages(&base(bad_arguments)).contains("arguments"));
    let late_system =
        json!({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]});
    assert!(refusal_to_messages(&base(late_system)).contains("`messages[1].role` `system`"));
    // Hints and defaults pass without a word.
    to_messages(&base(
        json!({"n": 1, "logprobs": false, "store": false, "presence_penalty": 0}),
    ));
}

/// The first request of Claude Code 2.1.328 (`claude -p`), as captured in front of a server of
/// our own, cut to one tool and the first words of each text.
fn claude_code_request(thinking: &Value) -> Value {
    json!({
        "model": "qwen3-8b",
        "max_tokens": 32000,
        "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328.593;"},
            {"type": "text", "text": "You are a Claude agent", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "You are an interactive CLI tool", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>skills</system-reminder>"},
                {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}
            ]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}
        ],
        "tools": [
            {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}},
            {"name": "DeferredToolPlaceholder", "description": "", "input_schema": {"type": "object"}, "defer_loading": true}
        ],
        "metadata": {"user_id": "{\"device_id\":\"59\",\"session_id\":\"12\"}"},
        "thinking": thinking,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}
    })
}

#[test]
fn what_claude_code_sends_reaches_an_openai_engine_with_its_reasoning_switch_where_it_reads_one() {
    // Claude Code sends adaptive thinking for a model it does not know, and a budget for one
    // it does.
    let adaptive = json!({"type": "adaptive", "display": "omitted"});
    let budget = json!({"type": "enabled", "budget_tokens": 31999, "display": "omitted"});
    for thinking in [&adaptive, &budget] {
        let plain = to_chat(&claude_code_request(thinking));
        assert_eq!(plain["model"], "up");
        assert_eq!(plain["max_tokens"], 32000);
        assert_eq!(
            plain["messages"][2],
            json!({"role": "system", "content": [{"type": "text", "text": "# Environment"}]}),
            "instructions within the conversation stay where they stand"
        );
        assert_eq!(plain["tools"].as_array().unwrap().len(), 2);
        for dropped in [
            "thinking",
            "context_management",
            "output_config",
            "reasoning_effort",
        ] {
            assert!(plain.get(dropped).is_none(), "{dropped} in {plain}");
        }
        assert!(plain.get("chat_template_kwargs").is_none());
        // vLLM and SGLang: the chat template's switch.
        let vllm = to_chat_reading(&claude_code_request(thinking), Thinking::ChatTemplate);
        assert_eq!(
            vllm["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        assert!(vllm.get("reasoning_effort").is_none());
        // OpenAI's reasoning models: the client's effort.
        let openai = to_chat_reading(&claude_code_request(thinking), Thinking::ReasoningEffort);
        assert_eq!(openai["reasoning_effort"], "high");
        assert!(openai.get("chat_template_kwargs").is_none());
    }
    let off = claude_code_request(&json!({"type": "disabled"}));
    assert_eq!(
        to_chat_reading(&off, Thinking::ChatTemplate)["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    // Without an effort, a budget says how hard to think; `max` is OpenAI's `high`.
    let mut budgeted = claude_code_request(&json!({"type": "enabled", "budget_tokens": 2048}));
    budgeted.as_object_mut().unwrap().remove("output_config");
    assert_eq!(
        to_chat_reading(&budgeted, Thinking::ReasoningEffort)["reasoning_effort"],
        "low"
    );
    let mut max = claude_code_request(&adaptive);
    max["output_config"] = json!({"effort": "max"});
    assert_eq!(
        to_chat_reading(&max, Thinking::ReasoningEffort)["reasoning_effort"],
        "high"
    );
}

#[test]
fn a_count_asks_the_engine_to_template_the_same_messages_and_tools_a_request_would_send() {
    let request = claude_code_request(&json!({"type": "adaptive"}));
    let tokenize: Value =
        serde_json::from_slice(&count_to_tokenize(request.to_string().as_bytes(), "up").unwrap())
            .unwrap();
    let chat = to_chat(&request);
    assert_eq!(tokenize["model"], "up");
    assert_eq!(tokenize["messages"], chat["messages"]);
    assert_eq!(tokenize["tools"], chat["tools"]);
    assert_eq!(tokenize["add_generation_prompt"], true);
    for absent in ["max_tokens", "stream", "stream_options", "user"] {
        assert!(tokenize.get(absent).is_none(), "{absent}: {tokenize}");
    }
    let counted: Value = serde_json::from_slice(&whole::response_body(
        Direction::CountToTokenize,
        br#"{"count": 42, "max_model_len": 32768, "tokens": []}"#,
    ))
    .unwrap();
    assert_eq!(counted, json!({"input_tokens": 42}));
}

#[test]
fn an_engine_s_reasoning_reaches_an_anthropic_client_as_a_thinking_block_before_the_answer() {
    let chunk = |delta: &str| {
        format!(
            "data: {{\"id\":\"c\",\"model\":\"up\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
        )
    };
    // vLLM names it `reasoning_content`, and from 0.10 `reasoning`.
    for field in ["reasoning_content", "reasoning"] {
        let stream = [
            chunk(r#"{"role":"assistant","content":""}"#),
            chunk(&format!(r#"{{"{field}":"Think"}}"#)),
            chunk(&format!(r#"{{"{field}":"ing."}}"#)),
            chunk(r#"{"content":"Hi"}"#),
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".to_owned(),
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let out = run(
            ResponseTranslator::new(Direction::MessagesToChat, true, 200, false),
            &stream,
            7,
        );
        let events = events(&out);
        let starts: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| &e["content_block"])
            .collect();
        assert_eq!(starts[0]["type"], "thinking", "{events:?}");
        assert_eq!(starts[1]["type"], "text");
        let thinking: String = events
            .iter()
            .filter_map(|e| e["delta"]["thinking"].as_str())
            .collect();
        assert_eq!(thinking, "Thinking.");
        let stops = events
            .iter()
            .filter(|e| e["type"] == "content_block_stop")
            .count();
        assert_eq!(stops, 2, "the thinking block closes before the text opens");
    }
    let whole = json!({"id": "c", "object": "chat.completion", "model": "up", "choices": [{
        "index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "Hi", "reasoning_content": "Thinking."}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4}});
    let message: Value = serde_json::from_slice(&whole::response_body(
        Direction::MessagesToChat,
        whole.to_string().as_bytes(),
    ))
    .unwrap();
    assert_eq!(
        message["content"],
        json!([{"type": "thinking", "thinking": "Thinking.", "signature": ""}, {"type": "text", "text": "Hi"}])
    );
}

pub(super) const OPENAI_STREAM: &str = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello \\\"you\\\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"lookup\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"q\\\":\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"up\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":7,\"total_tokens\":27,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n\
data: [DONE]\n\n";

#[test]
fn an_openai_stream_becomes_anthropic_events_however_it_is_cut() {
    let whole = run(
        ResponseTranslator::new(Direction::MessagesToChat, true, 200, false),
        OPENAI_STREAM,
        usize::MAX,
    );
    for step in [1, 7, 64] {
        let cut = run(
            ResponseTranslator::new(Direction::MessagesToChat, true, 200, false),
            OPENAI_STREAM,
            step,
        );
        assert_eq!(cut, whole, "cut every {step} bytes");
    }
    let events = events(&whole);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[0]["message"]["id"], "chatcmpl-1");
    assert_eq!(
        events[3]["delta"],
        json!({"type": "text_delta", "text": "Hello \"you\""})
    );
    assert_eq!(
        events[5]["content_block"],
        json!({"type": "tool_use", "id": "call_1", "name": "lookup", "input": {}})
    );
    assert_eq!(events[5]["index"], 1);
    let json: String = events[6..8]
        .iter()
        .map(|e| e["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(json, "{\"q\":1}");
    assert_eq!(
        events[9],
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"input_tokens": 4, "cache_read_input_tokens": 16, "output_tokens": 7}})
    );
}

pub(super) const ANTHROPIC_STREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"up\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":16,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\": \"ping\"}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \\n\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"lookup\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\": 1}\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":9}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

#[test]
fn an_anthropic_stream_becomes_openai_chunks_with_the_usage_chunk_when_asked() {
    let whole = run(
        ResponseTranslator::new(Direction::ChatToMessages, true, 200, true),
        ANTHROPIC_STREAM,
        usize::MAX,
    );
    for step in [1, 5, 100] {
        let cut = run(
            ResponseTranslator::new(Direction::ChatToMessages, true, 200, true),
            ANTHROPIC_STREAM,
            step,
        );
        // `created` is the second each chunk was made: equal but across a second's turn.
        assert_eq!(
            events(&cut).len(),
            events(&whole).len(),
            "cut every {step} bytes"
        );
    }
    let chunks = events(&whole);
    assert_eq!(chunks.len(), 7);
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(chunks[0]["id"], "msg_1");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(
        chunks[1]["choices"][0]["delta"],
        json!({"content": "Hi \n"})
    );
    assert_eq!(
        chunks[2]["choices"][0]["delta"]["tool_calls"],
        json!([{"index": 0, "id": "toolu_1", "type": "function", "function": {"name": "lookup", "arguments": ""}}])
    );
    assert_eq!(
        chunks[3]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
        "{\"q\": 1}"
    );
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(
        chunks[5]["usage"],
        json!({"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
               "prompt_tokens_details": {"cached_tokens": 16}})
    );
    assert_eq!(chunks[6], "[DONE]");
    let without = run(
        ResponseTranslator::new(Direction::ChatToMessages, true, 200, false),
        ANTHROPIC_STREAM,
        usize::MAX,
    );
    assert_eq!(events(&without).len(), 6, "no usage chunk unless asked");
}

#[test]
fn a_stop_sequence_vllm_names_is_anthropics_stop_sequence() {
    let stream = "data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":\"END\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
    let out = run(
        ResponseTranslator::new(Direction::MessagesToChat, true, 200, false),
        stream,
        usize::MAX,
    );
    let events = events(&out);
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
    );
    assert_eq!(events.last().unwrap()["type"], "message_stop");
}

#[test]
fn whole_answers_and_errors_take_the_clients_shape() {
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "up",
        "content": [{"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 4, "cache_read_input_tokens": 6, "output_tokens": 2}});
    let out = run(
        ResponseTranslator::new(Direction::ChatToMessages, false, 200, false),
        &message.to_string(),
        3,
    );
    let completion: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["choices"][0]["message"]["content"], "Hi");
    assert_eq!(
        completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":1}"
    );
    assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 6}})
    );
    let back = response_body(Direction::MessagesToChat, &out);
    let back: Value = serde_json::from_slice(&back).unwrap();
    assert_eq!(back["content"], message["content"]);
    assert_eq!(back["stop_reason"], "tool_use");
    assert_eq!(
        back["usage"],
        json!({"input_tokens": 4, "cache_read_input_tokens": 6, "output_tokens": 2})
    );

    let overloaded =
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let openai: Value =
        serde_json::from_slice(&error_body(Direction::ChatToMessages, 529, overloaded)).unwrap();
    assert_eq!(
        openai,
        json!({"error": {"message": "Overloaded", "type": "server_error", "code": "overloaded_error"}})
    );
    assert_eq!(client_status(Direction::ChatToMessages, 529), 503);
    let limited = br#"{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#;
    let anthropic: Value =
        serde_json::from_slice(&error_body(Direction::MessagesToChat, 429, limited)).unwrap();
    assert_eq!(
        anthropic,
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
    );
    let plain: Value =
        serde_json::from_slice(&error_body(Direction::MessagesToChat, 502, b"Bad Gateway"))
            .unwrap();
    assert_eq!(plain["error"]["message"], "Bad Gateway");
}

/// The events of both sample streams, and a few that are not what they claim: the material
/// adversarial streams are made of.
fn event_pieces() -> Vec<String> {
    let mut pieces: Vec<String> = [OPENAI_STREAM, ANTHROPIC_STREAM]
        .iter()
        .flat_map(|s| s.split_inclusive("\n\n").map(str::to_owned))
        .collect();
    pieces.extend(
        [
            "data: {\"choices\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":7,\"function\":{\"arguments\":\"x\"}}]}}]}\n\n",
            "data: {\"error\":{\"message\":1}}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":\"x\"}\n\n",
            "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":5}}\n\n",
            "data: [DONE]\n\n",
            "data: {\"type\":\"message_delta\"}\n\n",
            ": comment\r\n\r\n",
        ]
        .map(str::to_owned),
    );
    pieces
}

proptest! {
    #[test]
    fn any_stream_cut_anywhere_translates_without_panic_and_grows_boundedly(
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        noise in proptest::collection::vec(any::<u8>(), 0..64),
        cut in any::<prop::sample::Index>(),
    ) {
        let pieces = event_pieces();
        let mut stream: Vec<u8> = picks.iter().flat_map(|i| pieces[i.index(pieces.len())].bytes()).collect();
        let at = cut.index(stream.len() + 1);
        stream.splice(at..at, noise);
        for direction in [
            Direction::ChatToMessages,
            Direction::MessagesToChat,
            Direction::ResponsesToChat,
            Direction::ResponsesToMessages,
        ] {
            for streamed in [true, false] {
                let mut t = ResponseTranslator::new(direction, streamed, 200, true);
                let mut out = t.frame(&stream[..at]).len();
                out += t.frame(&stream[at..]).len();
                out += t.finish().len();
                // Each event yields at most a few small ones (names are capped): linear growth.
                prop_assert!(out <= 32 * stream.len() + 4096, "{out} bytes out of {}", stream.len());
            }
        }
    }

    #[test]
    fn any_request_body_translates_or_is_refused_and_a_translation_is_json(
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        noise in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let values = [
            json!({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
            json!({"messages": [{"role": "tool", "content": [{"type": "text", "text": "x"}]}]}),
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]}),
            json!({"tools": [{"name": "f"}], "tool_choice": {"type": "tool"}}),
            json!({"stop": ["a"], "stop_sequences": "b", "system": [{"type": "image"}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}]}),
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "x"}]}]}),
            json!({"input": "hi", "instructions": 3, "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}], "tool_choice": {"type": "function"}}),
            json!({"reasoning": {"effort": "xhigh"}, "text": {"format": {"type": "json_schema", "schema": {}}}, "store": false}),
        ];
        let mut body = serde_json::Map::new();
        for pick in &picks {
            if let Value::Object(o) = &values[pick.index(values.len())] {
                body.extend(o.clone());
            }
        }
        let mut bytes = Value::Object(body).to_string().into_bytes();
        if picks.len() % 2 == 1 {
            bytes.extend_from_slice(&noise);
        }
        let responses = [HostedTools::Drop, HostedTools::Refuse]
            .map(|hosted| responses_to_chat(&bytes, "up", Thinking::ReasoningEffort, hosted).map(|c| c.body));
        for out in [messages_to_chat(&bytes, "up", Thinking::ChatTemplate), chat_to_messages(&bytes, "up", 8)].into_iter().chain(responses).flatten() {
            prop_assert!(serde_json::from_slice::<Value>(&out).is_ok());
        }
    }
}

#[test]
fn a_whole_answer_too_large_to_translate_ends_as_an_error_saying_so() {
    let mut t = ResponseTranslator::new(Direction::ChatToMessages, false, 200, false);
    let mebibyte = vec![b' '; 1 << 20];
    for _ in 0..65 {
        assert!(t.frame(&mebibyte).is_empty());
    }
    let out: Value = serde_json::from_slice(&t.finish()).unwrap();
    let message = out["error"]["message"].as_str().unwrap();
    assert!(message.contains("too large to translate"), "{message}");
}
