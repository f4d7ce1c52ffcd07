//! Any bytes, split anywhere, through the SSE parser and the stream meter: no panic, and with
//! stripping off every byte comes out unchanged.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tokio::time::Instant;
use tpsgate::StreamMeter;
use tpsgate::sse::events::StreamDialect;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut) % (rest.len() + 1);
    let now = Instant::now();
    for dialect in [
        StreamDialect::OpenAi,
        StreamDialect::Anthropic,
        StreamDialect::Responses,
    ] {
        let mut plain = StreamMeter::new(dialect, false);
        let mut out = Vec::with_capacity(rest.len());
        for piece in [&rest[..cut], &rest[cut..]] {
            out.extend_from_slice(&plain.frame(Bytes::copy_from_slice(piece), now).0);
        }
        assert_eq!(
            out, rest,
            "without stripping the meter must forward every byte unchanged"
        );

        let mut stripping = StreamMeter::new(dialect, true);
        let mut stripped = 0;
        for piece in [&rest[..cut], &rest[cut..]] {
            stripped += stripping.frame(Bytes::copy_from_slice(piece), now).0.len();
        }
        stripped += stripping.finish().map_or(0, |b| b.len());
        assert!(stripped <= rest.len());
    }
});
