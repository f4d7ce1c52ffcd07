//! The Responses API in front of a chat completions or messages engine: what a Responses client
//! (Codex) sends, and what it reads back.

use serde_json::{Value, json};

use super::super::*;
use super::{ANTHROPIC_STREAM, OPENAI_STREAM, events, run};

fn to_chat(request: &Value, thinking: Thinking) -> (Value, Vec<String>) {
    let chat = responses_to_chat(
        request.to_string().as_bytes(),
        "up",
        thinking,
        HostedTools::Drop,
    )
    .unwrap();
    (
        serde_json::from_slice(&chat.body).unwrap(),
        chat.dropped_tools,
    )
}

fn refusal(request: &Value, hosted: HostedTools) -> String {
    responses_to_chat(request.to_string().as_bytes(), "up", Thinking::Drop, hosted)
        .unwrap_err()
        .0
}

fn message(role: &str, kind: &str, text: &str) -> Value {
    json!({"type": "message", "id": "msg_1", "role": role, "content": [{"type": kind, "text": text}]})
}

/// The shape of Codex 0.169's first request (`codex exec`), its long texts cut short.
fn codex_request(input: &[Value]) -> Value {
    let function = |name: &str| {
        json!({"type": "function", "name": name, "description": "d", "strict": false,
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}})
    };
    json!({
        "model": "gpt-5.1-codex", "instructions": "You are Codex.", "input": input,
        "tools": [
            function("exec_command"), function("write_stdin"),
            {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [function("spawn")]},
            {"type": "web_search", "external_web_access": false},
        ],
        "tool_choice": "auto", "parallel_tool_calls": true, "reasoning": {"summary": "auto"},
        "store": false, "stream": true, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a2", "client_metadata": {"x": "y"},
    })
}

#[test]
fn what_codex_sends_reaches_a_chat_engine_its_hosted_tools_left_out_by_name() {
    let (chat, dropped) = to_chat(
        &codex_request(&[
            message("developer", "input_text", "<permissions>"),
            message("user", "input_text", "<environment_context>"),
            message("user", "input_text", "say hi"),
        ]),
        Thinking::Drop,
    );
    assert_eq!(dropped, ["multi_agent_v1", "web_search"]);
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": "You are Codex."},
            {"role": "system", "content": [{"type": "text", "text": "<permissions>"}]},
            {"role": "user", "content": [{"type": "text", "text": "<environment_context>"}]},
            {"role": "user", "content": [{"type": "text", "text": "say hi"}]},
        ])
    );
    assert_eq!(chat["model"], "up");
    assert_eq!(chat["stream"], true);
    assert_eq!(chat["stream_options"], json!({"include_usage": true}));
    let names: Vec<&str> = chat["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exec_command", "write_stdin"]);
    assert_eq!(chat["tools"][0]["type"], "function");
    assert_eq!(
        chat["tools"][0]["function"]["parameters"]["required"],
        json!(["cmd"])
    );
    assert_eq!(chat["tool_choice"], "auto");
    assert_eq!(chat["parallel_tool_calls"], true);
    // Hints that change no answer are not sent on.
    for hint in [
        "store",
        "include",
        "prompt_cache_key",
        "client_metadata",
        "reasoning",
    ] {
        assert!(chat.get(hint).is_none(), "{hint}: {chat}");
    }
}

#[test]
fn a_tool_round_trip_becomes_an_assistant_message_with_its_calls_then_their_results() {
    let (chat, _) = to_chat(
        &codex_request(&[
            message("user", "input_text", "run ls"),
            json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "…"}),
            message("assistant", "output_text", "Running it."),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}),
            json!({"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "exec_command", "arguments": "{\"cmd\":\"pwd\"}"}),
            json!({"type": "function_call_output", "call_id": "call_1", "output": "a\nb"}),
            json!({"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "/w"}]}),
        ]),
        Thinking::Drop,
    );
    assert_eq!(
        chat["messages"].as_array().unwrap()[1..],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "run ls"}]},
            {"role": "assistant", "content": "Running it.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"pwd\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a\nb"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "/w"}]},
        ])
        .as_array()
        .unwrap()[..]
    );
}

#[test]
fn reasoning_effort_limits_and_formats_map_to_what_the_engine_reads() {
    let request = json!({
        "model": "m", "input": "hi", "reasoning": {"effort": "xhigh", "summary": "auto"},
        "max_output_tokens": 64, "temperature": 0.2,
        "text": {"format": {"type": "json_schema", "name": "answer", "strict": true, "schema": {"type": "object"}}, "verbosity": "low"},
    });
    let (effort, _) = to_chat(&request, Thinking::ReasoningEffort);
    assert_eq!(effort["reasoning_effort"], "high");
    assert_eq!(effort["max_tokens"], 64);
    assert_eq!(effort["temperature"], 0.2);
    assert_eq!(
        effort["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
    assert_eq!(
        effort["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": true}})
    );
    let (template, _) = to_chat(&request, Thinking::ChatTemplate);
    assert_eq!(
        template["chat_template_kwargs"],
        json!({"enable_thinking": true})
    );
    assert!(template.get("reasoning_effort").is_none());
    let (off, _) = to_chat(
        &json!({"input": "hi", "reasoning": {"effort": "none"}}),
        Thinking::ChatTemplate,
    );
    assert_eq!(
        off["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    let (dropped, _) = to_chat(&request, Thinking::Drop);
    assert!(
        dropped.get("reasoning_effort").is_none() && dropped.get("chat_template_kwargs").is_none()
    );
}

#[test]
fn what_a_chat_engine_cannot_serve_is_refused_by_name() {
    let stored = refusal(
        &json!({"input": "hi", "previous_response_id": "resp_1"}),
        HostedTools::Drop,
    );
    assert!(
        stored.contains("`previous_response_id`") && stored.contains("store: false"),
        "{stored}"
    );
    let web = refusal(
        &json!({"input": "hi", "tools": [{"type": "web_search"}]}),
        HostedTools::Refuse,
    );
    assert!(
        web.contains("`tools[0].`")
            && web.contains("web_search")
            && web.contains("hosted_tools: drop"),
        "{web}"
    );
    let cases = [
        (json!({"input": "hi", "background": true}), "`background`"),
        (
            json!({"input": "hi", "conversation": "c"}),
            "`conversation`",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "`input[0].type` `item_reference`",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
            "`input[0].content[0].type` `input_file`",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}),
            "`input[0].content[0].image_url`",
        ),
        (
            json!({"input": "hi", "reasoning": {"effort": "max"}}),
            "`reasoning.effort` `max`",
        ),
        (json!({"input": 3}), "`input`"),
    ];
    for (request, named) in cases {
        let why = refusal(&request, HostedTools::Drop);
        assert!(why.contains(named), "{request}: {why}");
    }
    // Hints that ask for nothing pass.
    let (ok, _) = to_chat(
        &json!({"input": "hi", "background": false, "top_logprobs": 0, "store": true, "truncation": "auto"}),
        Thinking::Drop,
    );
    assert_eq!(ok["messages"][0]["content"], "hi");
}

#[test]
fn through_chat_a_responses_request_reaches_an_anthropic_engine() {
    let chat = responses_to_chat(
        codex_request(&[
            message("developer", "input_text", "<permissions>"),
            message("user", "input_text", "say hi"),
        ])
        .to_string()
        .as_bytes(),
        "claude",
        Thinking::Drop,
        HostedTools::Drop,
    )
    .unwrap();
    let messages: Value =
        serde_json::from_slice(&chat_to_messages(&chat.body, "claude", 4096).unwrap()).unwrap();
    assert_eq!(
        messages["system"],
        json!([{"type": "text", "text": "You are Codex."}, {"type": "text", "text": "<permissions>"}])
    );
    assert_eq!(
        messages["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "say hi"}]}])
    );
    assert_eq!(messages["tools"][0]["name"], "exec_command");
    assert_eq!(messages["max_tokens"], 4096);
}

/// The event types of a Responses stream, in order; each event's sequence number its place.
fn kinds(events: &[Value]) -> Vec<&str> {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// A chat stream with reasoning first, then text, then two tool calls whose fragments
/// interleave.
const REASONING_STREAM: &str = "data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"Think \\\"hard\\\"\"}}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\".\"}}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}},{\"index\":1,\"id\":\"call_b\",\"function\":{\"name\":\"g\",\"arguments\":\"{\"}}]}}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}},{\"index\":1,\"function\":{\"arguments\":\"}\"}}]}}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"up\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":16},\"completion_tokens_details\":{\"reasoning_tokens\":3}}}\n\n\
data: [DONE]\n\n";

#[test]
fn a_chat_stream_becomes_responses_events_however_it_is_cut() {
    let new = || ResponseTranslator::new(Direction::ResponsesToChat, true, 200, false);
    let whole = run(new(), REASONING_STREAM, usize::MAX);
    for step in [1, 7, 64] {
        assert_eq!(
            run(new(), REASONING_STREAM, step),
            whole,
            "cut every {step} bytes"
        );
    }
    let text = std::str::from_utf8(&whole).unwrap();
    // Each event is named as its type says (Codex reads the `event:` line too).
    for block in text.split_terminator("\n\n") {
        let (name, data) = block.split_once('\n').unwrap();
        let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(name.strip_prefix("event: ").unwrap(), data["type"]);
    }
    let events = events(&whole);
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(events[4]["delta"], "Think \"hard\"");
    assert_eq!(events[6]["text"], "Think \"hard\".");
    assert_eq!(events[11]["delta"], "Hi");
    assert_eq!(events[11]["item_id"], "msg_c1_1");
    assert_eq!(
        events[15]["item"],
        json!({"id": "fc_c1_2", "type": "function_call", "status": "in_progress", "call_id": "call_a", "name": "f", "arguments": ""})
    );
    assert_eq!(events[19]["item_id"], "fc_c1_2");
    assert_eq!(events[20]["item_id"], "fc_c1_3");
    let completed = &events[25]["response"];
    assert_eq!(completed["id"], "resp_c1");
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["created_at"], 7);
    assert_eq!(completed["store"], false);
    assert_eq!(
        completed["usage"],
        json!({"input_tokens": 20, "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 16}, "output_tokens": 9,
               "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 29})
    );
    assert_eq!(
        completed["output"],
        json!([
            {"id": "rs_c1_0", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think \"hard\"."}]},
            {"id": "msg_c1_1", "type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}]},
            {"id": "fc_c1_2", "type": "function_call", "status": "completed", "call_id": "call_a", "name": "f", "arguments": "{\"x\":1}"},
            {"id": "fc_c1_3", "type": "function_call", "status": "completed", "call_id": "call_b", "name": "g", "arguments": "{}"},
        ])
    );
}

#[test]
fn an_answer_cut_at_its_limit_is_incomplete_and_a_failure_is_failed() {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let new = || ResponseTranslator::new(Direction::ResponsesToChat, true, 200, false);
    let cut = format!(
        "{}{}data: [DONE]\n\n",
        chunk(r#"{"content":"a"}"#, "null"),
        chunk("{}", r#""length""#)
    );
    let incomplete = events(&run(new(), &cut, usize::MAX));
    let last = incomplete.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(last["response"]["output"][0]["content"][0]["text"], "a");

    let error = "data: {\"error\":{\"message\":\"KV cache full\",\"type\":\"server_error\",\"code\":\"overloaded\"}}\n\n";
    let failed = events(&run(
        new(),
        &format!("{}{error}", chunk(r#"{"content":"a"}"#, "null")),
        5,
    ));
    let last = failed.last().unwrap();
    assert_eq!(last["type"], "response.failed");
    assert_eq!(
        last["response"]["error"],
        json!({"code": "overloaded", "message": "KV cache full"})
    );

    // A stream that stops before its answer ends says so, never ends as if complete.
    let unfinished = events(&run(
        new(),
        &chunk(r#"{"content":"a"}"#, "null"),
        usize::MAX,
    ));
    let last = unfinished.last().unwrap();
    assert_eq!(last["type"], "response.failed");
    assert!(
        last["response"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ended before")
    );
}

#[test]
fn an_anthropic_stream_becomes_responses_events_through_chat_chunks() {
    let new = || ResponseTranslator::new(Direction::ResponsesToMessages, true, 200, false);
    let whole = run(new(), ANTHROPIC_STREAM, usize::MAX);
    assert_eq!(run(new(), ANTHROPIC_STREAM, 3), whole);
    let events = events(&whole);
    let kinds = kinds(&events);
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let completed = &events.last().unwrap()["response"];
    assert_eq!(completed["output"][0]["content"][0]["text"], "Hi \n");
    assert_eq!(completed["output"][1]["call_id"], "toolu_1");
    assert_eq!(completed["output"][1]["arguments"], "{\"q\": 1}");
    assert_eq!(completed["usage"]["input_tokens"], 20);
    assert_eq!(
        completed["usage"]["input_tokens_details"]["cached_tokens"],
        16
    );
    assert_eq!(completed["usage"]["output_tokens"], 9);
}

#[test]
fn the_sample_openai_stream_completes_with_its_call() {
    let events = events(&run(
        ResponseTranslator::new(Direction::ResponsesToChat, true, 200, false),
        OPENAI_STREAM,
        usize::MAX,
    ));
    let completed = &events.last().unwrap()["response"];
    assert_eq!(
        completed["output"][0]["content"][0]["text"],
        "Hello \"you\""
    );
    assert_eq!(completed["output"][1]["arguments"], "{\"q\":1}");
}

#[test]
fn whole_answers_and_errors_take_the_responses_shape() {
    let completion = json!({
        "id": "c9", "created": 5, "model": "up",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": "Sure", "reasoning_content": "hmm",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    });
    let response: Value = serde_json::from_slice(&response_body(
        Direction::ResponsesToChat,
        completion.to_string().as_bytes(),
    ))
    .unwrap();
    assert_eq!(response["object"], "response");
    assert_eq!(response["id"], "resp_c9");
    assert_eq!(response["status"], "completed");
    let kinds: Vec<&str> = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    assert_eq!(response["output"][2]["call_id"], "call_1");
    assert_eq!(response["usage"]["total_tokens"], 7);

    let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "up",
        "content": [{"type": "text", "text": "Hi"}], "stop_reason": "max_tokens",
        "usage": {"input_tokens": 2, "output_tokens": 1}});
    let response: Value = serde_json::from_slice(&response_body(
        Direction::ResponsesToMessages,
        message.to_string().as_bytes(),
    ))
    .unwrap();
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["output"][0]["content"][0]["text"], "Hi");

    let openai = error_body(
        Direction::ResponsesToChat,
        400,
        br#"{"error":{"message":"context too long","type":"BadRequestError","code":400}}"#,
    );
    let openai: Value = serde_json::from_slice(&openai).unwrap();
    assert_eq!(openai["error"]["message"], "context too long");
    assert_eq!(openai["error"]["type"], "BadRequestError");
    let anthropic = error_body(
        Direction::ResponsesToMessages,
        529,
        br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
    );
    let anthropic: Value = serde_json::from_slice(&anthropic).unwrap();
    assert_eq!(anthropic["error"]["message"], "busy");
    assert_eq!(anthropic["error"]["code"], "overloaded_error");
    assert_eq!(client_status(Direction::ResponsesToMessages, 529), 503);
    let plain: Value =
        serde_json::from_slice(&error_body(Direction::ResponsesToChat, 502, b"Bad Gateway"))
            .unwrap();
    assert_eq!(plain["error"]["type"], "server_error");
}
