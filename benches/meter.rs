//! Cost of the timed body per forwarded chunk: the stream meter on a vLLM-shaped content chunk,
//! with and without usage stripping armed, and the SSE parser alone.
//!
//! Run: `cargo bench --bench meter`. Results are in BENCHMARKS.md.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::time::Instant;
use tpsgate::proxy::meter::StreamMeter;
use tpsgate::sse::SseParser;
use tpsgate::sse::events::StreamDialect;

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
    group.finish();
}

criterion_group!(benches, meter);
criterion_main!(benches);
