//! The hot path allocates nothing per forwarded chunk. A counting allocator (installed by
//! `allocation-counter` for this test binary only) watches the stream meter once it is warm.

use bytes::Bytes;
use tokio::time::Instant;
use tpsgate::proxy::meter::StreamMeter;
use tpsgate::sse::events::StreamDialect;

const CONTENT: &[u8] = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" quick\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
const ANTHROPIC: &[u8] = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" quick\"}}\n\n";

fn allocations_per_chunk(dialect: StreamDialect, strip: bool, chunk: &'static [u8]) -> u64 {
    let mut meter = StreamMeter::new(dialect, strip);
    let chunk = Bytes::from_static(chunk);
    let now = Instant::now();
    // Warm up: the parser's buffers grow to their working size once.
    for _ in 0..4 {
        meter.frame(chunk.clone(), now);
    }
    let counts = allocation_counter::measure(|| {
        for _ in 0..1000 {
            std::hint::black_box(meter.frame(chunk.clone(), now));
        }
    });
    counts.count_total
}

#[test]
fn forwarding_a_content_chunk_allocates_nothing() {
    assert_eq!(
        allocations_per_chunk(StreamDialect::OpenAi, false, CONTENT),
        0
    );
    assert_eq!(
        allocations_per_chunk(StreamDialect::Anthropic, false, ANTHROPIC),
        0
    );
}

#[test]
fn forwarding_with_usage_stripping_armed_allocates_nothing_for_whole_events() {
    assert_eq!(
        allocations_per_chunk(StreamDialect::OpenAi, true, CONTENT),
        0
    );
}
