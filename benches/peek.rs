//! Cost of classify's JSON peek (model, stream, stream_options, token limit and their spans) on
//! request bodies of the sizes and shapes clients send, beside the way it read them before
//! `src/proxy/skim.rs`: serde_json deserializing the same fields (as borrowed raw values, for
//! their spans) and skipping the rest.
//!
//! Run: `cargo bench --bench peek`. Results are in docs/benchmarks/overhead.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde::Deserialize;
use serde_json::value::RawValue;
use tpsgate::Endpoint;
use tpsgate::peek;

/// The former peek's fields: every value borrowed raw, for its span.
#[derive(Deserialize)]
struct SerdePeek<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
    stream: Option<bool>,
    #[serde(borrow)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    max_output_tokens: Option<&'a RawValue>,
}

/// The former peek, down to the model's name.
fn serde_peek(body: &[u8]) -> Option<(String, bool, bool, Option<u32>)> {
    let p: SerdePeek<'_> = serde_json::from_slice(body).ok()?;
    let model: String = serde_json::from_str(p.model?.get()).ok()?;
    let max_tokens = [p.max_tokens, p.max_completion_tokens, p.max_output_tokens]
        .into_iter()
        .flatten()
        .find_map(|raw| raw.get().parse::<u32>().ok());
    Some((
        model,
        p.stream.unwrap_or(false),
        p.stream_options.is_some(),
        max_tokens,
    ))
}

/// A chat request whose user message is `line` repeated to about `bytes`, after a system prompt.
fn chat(line: &str, bytes: usize) -> Vec<u8> {
    let content = line.repeat(bytes.div_ceil(line.len()));
    serde_json::to_vec(&serde_json::json!({
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content},
        ],
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "max_tokens": 256,
        "stream": true,
    }))
    .unwrap_or_default()
}

fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("small", chat("Say hello in one word.", 20)),
        // Prose: a paragraph break (one `\n` escape) every ~250 bytes.
        (
            "prose_32k",
            chat(
                "The quick brown fox jumps over the lazy dog, again and again, and once more for good measure. Then it rests in the shade of an old oak tree, watching the river run by, until the sun goes down behind the hills and the evening comes.\n\n",
                32_000,
            ),
        ),
        // Code: a newline per short line and quoted strings, an escape every ~15 bytes.
        (
            "code_32k",
            chat(
                "    if key == \"model\" {\n        return Some(\"value\");\n    }\n",
                32_000,
            ),
        ),
    ]
}

fn peek_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("peek");
    for (name, body) in bodies() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(format!("{name}/skim"), |b| {
            b.iter(|| black_box(peek(Endpoint::Chat, black_box(&body)).is_ok()))
        });
        group.bench_function(format!("{name}/serde_json"), |b| {
            b.iter(|| black_box(serde_peek(black_box(&body)).is_some()))
        });
    }
    group.finish();
}

criterion_group!(benches, peek_bench);
criterion_main!(benches);
