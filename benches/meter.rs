//! Cost of the timed body per forwarded chunk: the stream meter on a vLLM-shaped content chunk,
//! with and without usage stripping armed, and the SSE parser alone; and the same chunk metered
//! and translated for an Anthropic client, beside an Anthropic chunk metered and translated for
//! an OpenAI client, and for a Responses client (`translate_*`: the meter's work included, as the
//! gateway does both; a Responses stream's first events apart); and a request's translation each
//! way and from the Responses API (`per_request`).
//!
//! Run: `cargo bench --bench meter`. Results are in docs/benchmarks/overhead.md.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::time::Instant;
use tpsgate::StreamMeter;
use tpsgate::sse::SseParser;
use tpsgate::sse::events::StreamDialect;
use tpsgate::translate::{Direction, ResponseTranslator};

// The gateway's allocator (src/main.rs), so that a request's translation costs what it costs there.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ANTHROPIC: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" quick\"}}\n\n";
const ANTHROPIC_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n";

const CHUNK: &str = "data: {\"id\":\"chatcmpl-6a1d3a2c\",\"object\":\"chat.completion.chunk\",\"created\":1795371613,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" quick\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";

fn meter(c: &mut Criterion) {
    let chunk = Bytes::from_static(CHUNK.as_bytes());
    let now = Instant::now();
    let mut group = c.benchmark_group("per_chunk");
    group.throughput(Throughput::Elements(1));
    for (name, strip) in [("meter", false), ("meter_stripping_usage", true)] {
        let mut m = StreamMeter::new(StreamDialect::OpenAi, strip);
        group.bench_function(name, |b| {
            b.iter(|| black_box(m.frame(black_box(chunk.clone()), now)))
        });
    }
    let mut parser = SseParser::new();
    group.bench_function("sse_parser_only", |b| {
        b.iter(|| {
            parser.feed(black_box(CHUNK.as_bytes()), &mut |ev| {
                black_box(ev.data.len());
            })
        })
    });
    let cases = [
        (
            "translate_openai_to_anthropic",
            Direction::MessagesToChat,
            StreamDialect::OpenAi,
            CHUNK,
            CHUNK,
        ),
        (
            "translate_anthropic_to_openai",
            Direction::ChatToMessages,
            StreamDialect::Anthropic,
            ANTHROPIC_START,
            ANTHROPIC,
        ),
        (
            "translate_openai_to_responses",
            Direction::ResponsesToChat,
            StreamDialect::OpenAi,
            CHUNK,
            CHUNK,
        ),
        (
            "meter_anthropic",
            Direction::ChatToMessages,
            StreamDialect::Anthropic,
            "",
            ANTHROPIC,
        ),
    ];
    for (name, direction, dialect, start, chunk) in cases {
        let mut m = StreamMeter::new(dialect, false);
        let chunk = Bytes::from_static(chunk.as_bytes());
        let mut t = ResponseTranslator::new(direction, true, 200, false);
        t.frame(start.as_bytes());
        let translate = name.starts_with("translate");
        group.bench_function(name, |b| {
            b.iter(|| {
                let (out, _) = m.frame(black_box(chunk.clone()), now);
                if translate {
                    black_box(t.frame(&out));
                } else {
                    black_box(out);
                }
            })
        });
    }
    // A Responses stream's first content: the response opened, its message item and part, the
    // first delta (what the first token waits for, once).
    group.bench_function("translate_first_chunk_to_responses", |b| {
        b.iter(|| {
            let mut t = ResponseTranslator::new(Direction::ResponsesToChat, true, 200, false);
            black_box(t.frame(black_box(CHUNK.as_bytes())))
        })
    });
    group.finish();
}

/// A request's translation: a short conversation with a system prompt, a tool and a tool's
/// result (about 1 KB), each way: the CPU a translated request spends before it is sent.
fn request(c: &mut Criterion) {
    let messages = serde_json::json!({
        "model": "claude", "max_tokens": 256, "stream": true,
        "system": "You are a careful assistant. Answer briefly and cite the tool's output.",
        "tools": [{"name": "lookup", "description": "Looks a term up",
                   "input_schema": {"type": "object", "properties": {"term": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "What does the gateway do with a request it cannot translate?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"term": "translation"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "A field the target cannot express is refused with a 400 naming it."}]},
        ],
    })
    .to_string();
    // Translated here once (it is valid: the unit tests say so) to be translated back below.
    let chat = tpsgate::translate::messages_to_chat(messages.as_bytes(), "m", Default::default())
        .unwrap_or_default();
    let mut group = c.benchmark_group("per_request");
    group.bench_function("translate_messages_to_chat", |b| {
        b.iter(|| {
            black_box(tpsgate::translate::messages_to_chat(
                black_box(messages.as_bytes()),
                "m",
                Default::default(),
            ))
        })
    });
    // The same conversation as a Responses client sends it, with Codex's hints and a hosted tool.
    let responses = serde_json::json!({
        "model": "codex", "stream": true, "store": false, "max_output_tokens": 256,
        "instructions": "You are a careful assistant. Answer briefly and cite the tool's output.",
        "tools": [{"type": "function", "name": "lookup", "description": "Looks a term up", "strict": false,
                   "parameters": {"type": "object", "properties": {"term": {"type": "string"}}}},
                  {"type": "web_search"}],
        "tool_choice": "auto", "parallel_tool_calls": true, "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0192",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What does the gateway do with a request it cannot translate?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"term\":\"translation\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "A field the target cannot express is refused with a 400 naming it."},
        ],
    })
    .to_string();
    group.bench_function("translate_responses_to_chat", |b| {
        b.iter(|| {
            black_box(tpsgate::translate::responses_to_chat(
                black_box(responses.as_bytes()),
                "m",
                Default::default(),
                Default::default(),
            ))
        })
    });
    // Codex 0.169's first request in shape and size (39 KB: instructions as a 17.7 KB developer
    // message, 7 function tools, a 10 KB namespace of agent tools, web search), made up here.
    let codex = codex_shaped_request();
    group.bench_function("translate_codex_sized_responses_to_chat", |b| {
        b.iter(|| {
            black_box(tpsgate::translate::responses_to_chat(
                black_box(codex.as_bytes()),
                "m",
                Default::default(),
                Default::default(),
            ))
        })
    });
    group.bench_function("translate_chat_to_messages", |b| {
        b.iter(|| {
            black_box(tpsgate::translate::chat_to_messages(
                black_box(&chat),
                "m",
                4096,
            ))
        })
    });
    group.finish();
}

/// A request of the shape and size Codex 0.169 sends first (`codex exec`): prose with line breaks
/// and quotes, JSON schemas, and the hints it sends.
fn codex_shaped_request() -> String {
    let prose = |bytes: usize| {
        "Run \"cargo test\" before you answer.\nKeep changes small; say why in a line. "
            .repeat(bytes / 80)
    };
    let text = |role: &str, bytes: usize| {
        serde_json::json!({"type": "message", "id": "msg_0192", "role": role,
                           "content": [{"type": "input_text", "text": prose(bytes)}]})
    };
    let function = |name: String, bytes: usize| {
        let properties: serde_json::Map<String, serde_json::Value> = (0..bytes / 160)
            .map(|i| {
                (
                    format!("field_{i}"),
                    serde_json::json!({"type": "string", "description": prose(120)}),
                )
            })
            .collect();
        serde_json::json!({"type": "function", "name": name, "description": prose(200), "strict": false,
                           "parameters": {"type": "object", "properties": properties,
                                          "required": ["field_0"], "additionalProperties": false}})
    };
    let mut tools: Vec<serde_json::Value> = [1635, 819, 1425, 391, 297, 785, 2196]
        .iter()
        .enumerate()
        .map(|(i, &bytes)| function(format!("tool_{i}"), bytes))
        .collect();
    let agents: Vec<serde_json::Value> = (0..6)
        .map(|i| function(format!("agent_{i}"), 1600))
        .collect();
    tools.push(serde_json::json!({"type": "namespace", "name": "multi_agent_v1", "description": prose(300), "tools": agents}));
    tools.push(serde_json::json!({"type": "web_search", "external_web_access": false}));
    serde_json::json!({
        "model": "codex", "stream": true, "store": false, "tool_choice": "auto",
        "parallel_tool_calls": true, "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "019ae3c1-5b2e",
        "client_metadata": {"session": prose(1100)},
        "input": [text("developer", 17690), text("developer", 2645), text("user", 545), text("user", 140)],
        "tools": tools,
    })
    .to_string()
}

criterion_group!(benches, meter, request);
criterion_main!(benches);
