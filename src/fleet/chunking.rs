//! How many tokens a backend's content events carry. A hosted API may stream several tokens an
//! event, and a stream's usage says how many only at its end: a stream read before then (a
//! level probe read early, a stream's pace against its target) counts its events at the ratio
//! the backend's finished streams showed, not one token each, which would read a stream of two
//! tokens an event at half its speed.

use std::sync::atomic::{AtomicU64, Ordering};

/// Weight of the latest finished stream in the ratio: a few streams settle it, one odd stream
/// (an answer of reasoning tokens, say) moves it little.
const ALPHA: f64 = 0.25;

/// Tokens per content event, a moving mean over the finished streams that reported their usage
/// (f64 bits; 0 before the first).
#[derive(Debug, Default)]
pub struct Chunking(AtomicU64);

impl Chunking {
    /// A finished stream of `events` content events reported `tokens` output tokens.
    pub(crate) fn learn(&self, tokens: u64, events: u32) {
        if tokens == 0 || events == 0 {
            return;
        }
        let ratio = tokens as f64 / f64::from(events);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let mean = match f64::from_bits(bits) {
                    0.0 => ratio,
                    mean => mean + ALPHA * (ratio - mean),
                };
                Some(mean.to_bits())
            });
    }

    /// Tokens per content event as far as its streams showed; one before any finished.
    pub(crate) fn per_event(&self) -> f64 {
        match f64::from_bits(self.0.load(Ordering::Relaxed)) {
            0.0 => 1.0,
            ratio => ratio,
        }
    }

    /// The tokens `events` content events carry, as far as its streams showed.
    pub(crate) fn tokens(&self, events: u32) -> u32 {
        (f64::from(events) * self.per_event()).round() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_count_as_the_tokens_the_finished_streams_showed_they_carry() {
        let chunking = Chunking::default();
        assert_eq!(chunking.tokens(10), 10, "one an event until a stream tells");
        chunking.learn(128, 64);
        assert_eq!(chunking.tokens(10), 20);
        chunking.learn(0, 0);
        assert_eq!(
            chunking.tokens(10),
            20,
            "a stream that told nothing moves nothing"
        );
        chunking.learn(300, 100);
        assert!((chunking.per_event() - 2.25).abs() < 1e-9);
    }
}
