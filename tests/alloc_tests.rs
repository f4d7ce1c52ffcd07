//! The hot path allocates nothing per forwarded chunk. A counting allocator (installed by
//! `allocation-counter` for this test binary only) watches the stream meter once it is warm, and
//! a stream's translation for a client of the other dialect.

use bytes::Bytes;
use tokio::time::Instant;
use tpsgate::StreamMeter;
use tpsgate::sse::events::StreamDialect;
use tpsgate::translate::{Direction, ResponseTranslator};

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

/// A content chunk translated for a client of the other dialect, metered as the backend sent it
/// first, as the gateway does: no more allocations than passing it through (none).
fn allocations_per_translated_chunk(
    direction: Direction,
    backend: StreamDialect,
    start: &'static [u8],
    chunk: &'static [u8],
) -> u64 {
    let mut meter = StreamMeter::new(backend, false);
    let mut translator = ResponseTranslator::new(direction, true, 200, true);
    let now = Instant::now();
    let chunk = Bytes::from_static(chunk);
    // Warm up: the message's start, then the buffers grow to their working size once.
    translator.frame(start);
    for _ in 0..4 {
        let (out, _) = meter.frame(chunk.clone(), now);
        translator.frame(&out);
    }
    let counts = allocation_counter::measure(|| {
        for _ in 0..1000 {
            let (out, _) = meter.frame(chunk.clone(), now);
            std::hint::black_box(translator.frame(&out));
        }
    });
    counts.count_total
}

#[test]
fn translating_a_content_chunk_allocates_nothing_either_way() {
    let role = b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
    assert_eq!(
        allocations_per_translated_chunk(
            Direction::MessagesToChat,
            StreamDialect::OpenAi,
            role,
            CONTENT
        ),
        0
    );
    let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n";
    assert_eq!(
        allocations_per_translated_chunk(
            Direction::ChatToMessages,
            StreamDialect::Anthropic,
            start,
            ANTHROPIC
        ),
        0
    );
}
