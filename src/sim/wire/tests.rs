use super::*;

fn req(dialect: Dialect, body: &Value) -> GenRequest {
    dialect.parse(body.to_string().as_bytes()).unwrap()
}

fn options(usage: UsageStyle) -> StreamOptions {
    StreamOptions {
        tokens_per_chunk: 1,
        usage,
        hold_back_tokens: 0,
        send_done: true,
    }
}

fn events(bytes: &[u8]) -> Vec<Value> {
    std::str::from_utf8(bytes)
        .unwrap()
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn prompt_tokens_are_bytes_over_four_rounded_up() {
    let r = req(
        Dialect::Chat,
        &json!({"model": "m", "messages": [{"role": "user", "content": "12345"},
               {"role": "user", "content": [{"type": "text", "text": "abc"}]}]}),
    );
    assert_eq!(r.prompt_tokens, 2);
    let r = req(
        Dialect::Completions,
        &json!({"model": "m", "prompt": "x".repeat(400)}),
    );
    assert_eq!(r.prompt_tokens, 100);
}

#[test]
fn max_completion_tokens_wins_over_max_tokens() {
    let r = req(
        Dialect::Chat,
        &json!({"model": "m", "messages": [], "max_tokens": 5, "max_completion_tokens": 7}),
    );
    assert_eq!(r.max_tokens, Some(7));
}

#[test]
fn missing_fields_are_named() {
    let err = Dialect::Chat.parse(br#"{"messages": []}"#).unwrap_err();
    assert!(err.0.contains("`model`"));
    let err = Dialect::Messages
        .parse(br#"{"model": "m", "messages": []}"#)
        .unwrap_err();
    assert!(err.0.contains("`max_tokens`"));
    let err = Dialect::Chat.parse(b"{nope").unwrap_err();
    assert!(err.0.starts_with("invalid JSON"));
}

#[test]
fn chat_stream_is_valid_json_with_role_first_and_usage_last() {
    let r = req(
        Dialect::Chat,
        &json!({"model": "m\"x", "messages": [], "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let f = Framer::new(Dialect::Chat, &r, "1", 7, options(UsageStyle::FinalChunk));
    let mut all = f.head().unwrap().to_vec();
    all.extend_from_slice(&f.content(0, 2, None));
    all.extend_from_slice(&f.content(2, 1, Some(Finish::Length)));
    all.extend_from_slice(&f.tail(3, Finish::Length));
    let evs = events(&all);
    assert_eq!(evs.len(), 4);
    assert_eq!(evs[0]["choices"][0]["delta"], json!({"role": "assistant"}));
    assert_eq!(evs[1]["choices"][0]["delta"]["content"], " the quick");
    assert_eq!(evs[1]["model"], "m\"x");
    assert_eq!(evs[2]["choices"][0]["finish_reason"], "length");
    assert_eq!(evs[3]["choices"], json!([]));
    assert_eq!(evs[3]["usage"]["completion_tokens"], 3);
    assert!(all.ends_with(b"data: [DONE]\n\n"));
}

#[test]
fn finish_chunk_usage_rides_the_last_content_chunk() {
    let r = req(
        Dialect::Chat,
        &json!({"model": "m", "messages": [], "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let f = Framer::new(Dialect::Chat, &r, "1", 7, options(UsageStyle::FinishChunk));
    let last = events(&f.content(0, 1, Some(Finish::Stop)));
    assert_eq!(last[0]["usage"]["completion_tokens"], 1);
    assert_eq!(&f.tail(1, Finish::Stop)[..], b"data: [DONE]\n\n");
}

#[test]
fn a_transformers_style_stream_ends_at_its_finish_chunk_and_held_text_never_comes() {
    let r = req(
        Dialect::Chat,
        &json!({"model": "m", "messages": [], "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let stream = StreamOptions {
        send_done: false,
        hold_back_tokens: 3,
        ..options(UsageStyle::FinishChunk)
    };
    let f = Framer::new(Dialect::Chat, &r, "1", 7, stream);
    let finish = f.finish_only(5, Finish::Length).unwrap();
    let ev = &events(&finish)[0];
    assert_eq!(ev["choices"][0]["delta"]["content"], "");
    assert_eq!(ev["choices"][0]["finish_reason"], "length");
    assert_eq!(ev["usage"]["completion_tokens"], 5);
    assert!(f.tail(5, Finish::Length).is_empty(), "no [DONE]");
    let anthropic = req(
        Dialect::Messages,
        &json!({"model": "m", "messages": [], "max_tokens": 5, "stream": true}),
    );
    let f = Framer::new(Dialect::Messages, &anthropic, "1", 7, stream);
    assert_eq!(
        f.finish_only(5, Finish::Length),
        None,
        "message_delta in the tail says it"
    );
}

#[test]
fn anthropic_stream_has_every_event_in_order() {
    let r = req(
        Dialect::Messages,
        &json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 2, "stream": true}),
    );
    let f = Framer::new(
        Dialect::Messages,
        &r,
        "1",
        7,
        options(UsageStyle::FinalChunk),
    );
    let mut all = f.head().unwrap().to_vec();
    all.extend_from_slice(&f.content(0, 1, None));
    all.extend_from_slice(&f.content(1, 1, Some(Finish::Length)));
    all.extend_from_slice(&f.tail(2, Finish::Length));
    let types: Vec<String> = events(&all)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        types,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events(&all)[6]["usage"]["output_tokens"], 2);
}

/// A stream's whole output: head, `n` tokens one per event, tail.
fn stream(dialect: Dialect, r: &GenRequest, n: u32, finish: Finish) -> Vec<u8> {
    let f = Framer::new(dialect, r, "1", 7, options(UsageStyle::FinalChunk));
    let mut all = f.head().map(|h| h.to_vec()).unwrap_or_default();
    for i in 0..n {
        all.extend_from_slice(&f.content(i, 1, (i + 1 == n).then_some(finish)));
    }
    all.extend_from_slice(&f.tail(n, finish));
    all
}

#[test]
fn with_tools_the_answer_calls_one_until_a_tool_has_answered() {
    let tools = json!([{"type": "function", "function": {"name": "lookup"}}]);
    let r = req(
        Dialect::Chat,
        &json!({"model": "m", "stream": true, "tools": tools,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.tool.as_ref().map(|t| t.0.as_str()), Some("lookup"));
    let evs = events(&stream(Dialect::Chat, &r, 3, Finish::ToolUse));
    let calls: Vec<&Value> = evs
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[0]["function"]["name"], "lookup");
    let arguments: String = calls
        .iter()
        .map(|c| c["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"text": " the quick brown"})
    );
    assert_eq!(evs[3]["choices"][0]["finish_reason"], "tool_calls");

    let r = req(
        Dialect::Messages,
        &json!({"model": "m", "max_tokens": 2, "tools": [{"name": "f", "input_schema": {}}],
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    let evs = events(&stream(Dialect::Messages, &r, 2, Finish::ToolUse));
    assert_eq!(evs[1]["content_block"]["type"], "tool_use");
    assert_eq!(evs[1]["content_block"]["name"], "f");
    let partial: String = evs
        .iter()
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(partial, r#"{"text":" the quick"}"#);
    assert_eq!(evs[6]["delta"]["stop_reason"], "tool_use");

    let answered = req(
        Dialect::Messages,
        &json!({"model": "m", "max_tokens": 2, "tools": [{"name": "f"}],
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}),
    );
    assert_eq!(answered.tool, None);
    let declined = req(
        Dialect::Chat,
        &json!({"model": "m", "tools": tools, "tool_choice": "none", "messages": []}),
    );
    assert_eq!(declined.tool, None);
}

#[test]
fn a_tool_call_s_arguments_are_valid_for_the_tool_s_schema() {
    // Codex's `exec_command`: its one required string gets the answer's tokens.
    let exec = json!({"type": "object", "required": ["cmd"], "additionalProperties": false,
        "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}, "yield_time_ms": {"type": "number"}}});
    // Every required property is there, each with the least value its type or enum allows.
    let mixed = json!({"type": "object", "required": ["mode", "count", "flag", "tags", "opts", "name"],
        "properties": {"mode": {"type": "string", "enum": ["fast", "slow"]}, "count": {"type": "integer"},
                       "flag": {"type": "boolean"}, "tags": {"type": "array"}, "opts": {"type": "object"},
                       "name": {"type": "string"}}});
    let cases = [
        (exec, json!({"cmd": " the quick brown"})),
        (
            mixed,
            json!({"mode": "fast", "count": 1, "flag": false, "tags": [], "opts": {}, "name": " the quick brown"}),
        ),
        // No string required: the first string property, else `text`.
        (
            json!({"properties": {"n": {"type": "integer"}, "q": {"type": "string"}}}),
            json!({"q": " the quick brown"}),
        ),
        (json!({}), json!({"text": " the quick brown"})),
    ];
    for (schema, expected) in cases {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": schema}}]);
        let body = json!({"model": "m", "stream": true, "tools": tools, "messages": [{"role": "user", "content": "hi"}]});
        let r = req(Dialect::Chat, &body);
        let streamed: String = events(&stream(Dialect::Chat, &r, 3, Finish::ToolUse))
            .iter()
            .filter_map(|e| {
                e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&streamed).unwrap(),
            expected,
            "{schema}"
        );
        let (_, arguments) = r.tool.as_ref().unwrap();
        assert_eq!(arguments.with(" the quick brown"), expected, "{schema}");
        // An Anthropic tool's `input_schema` is read the same way.
        let tools = json!([{"name": "f", "input_schema": schema}]);
        let body = json!({"model": "m", "max_tokens": 3, "tools": tools, "messages": [{"role": "user", "content": "hi"}]});
        let partial: String = events(&stream(
            Dialect::Messages,
            &req(Dialect::Messages, &body),
            3,
            Finish::ToolUse,
        ))
        .iter()
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&partial).unwrap(),
            expected,
            "{schema}"
        );
    }
}

#[test]
fn a_stop_sequence_ends_the_answer_before_it_and_is_named() {
    assert_eq!(
        stop_within(&[" fox".to_owned()], 10),
        Some((3, " fox".to_owned()))
    );
    assert_eq!(stop_within(&["cat".to_owned()], 10), None);
    let mut r = req(
        Dialect::Messages,
        &json!({"model": "m", "max_tokens": 9, "stop_sequences": [" fox"], "messages": []}),
    );
    assert_eq!(r.stop, [" fox"]);
    r.stopped_by = Some(" fox".to_owned());
    let evs = events(&stream(Dialect::Messages, &r, 3, Finish::StopSequence));
    assert_eq!(
        evs[7]["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": " fox"})
    );
    let evs = events(&stream(Dialect::Chat, &r, 3, Finish::StopSequence));
    assert_eq!(evs[3]["choices"][0]["stop_reason"], " fox");
}
