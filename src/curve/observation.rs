//! What one request teaches its backend's curve: an [`Observation`], built from a stream's
//! timing and the backend's occupancy integral. The arithmetic of TPOT and experienced
//! concurrency lives here, beside the curve that learns from it, and runs on exact numbers.
//!
//! - TPOT: the tokens of the first content event were made before it arrived (prefill and the
//!   first decode steps), so the decode window from the first content event to the end of the
//!   generation covers the other tokens ([`decode_tpot`]: `tokens - tokens / events` when text
//!   flowed to the end, `tokens - 1` when every event is a token). The window ends at the finish
//!   event when usage counts the tokens (text held back by the engine still took its decode
//!   steps), else at the last content event.
//! - Experienced concurrency: the occupancy integral read at the first content event and at the
//!   end, the latter taken back to the end of the decode window (nothing accrued after it is this
//!   request's decode), divided by the time between.

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::occupancy::Reading;
use crate::sse::StreamTiming;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The stream ended normally.
    Completed,
    /// The client went away first.
    Cancelled,
    /// The upstream failed mid-stream.
    Failed,
}

/// What one request taught us about its backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// When it ended.
    pub at: Instant,
    /// How it ended.
    pub outcome: Outcome,
    /// Seconds from the gateway sending the request to this backend to the first content byte.
    pub ttft: Option<f64>,
    /// Seconds per output token after the first chunk.
    pub tpot: Option<f64>,
    /// Output tokens.
    pub output_tokens: u64,
    /// The token count came from counting content events (no usage in the stream).
    pub estimated: bool,
    /// Prompt tokens, when the stream reported them.
    pub prompt_tokens: Option<u64>,
    /// Time-weighted mean in-flight count of the backend over the decode window.
    pub concurrency: Option<f64>,
    /// The time-weighted mean count of requests decoding on the backends sharing its device
    /// (`device:`) over the same window: 0 for a backend that shares none. Their load slows
    /// its decode as its own does (a request waiting in their queues costs the device nothing).
    pub neighbours: f64,
}

/// Seconds per output token after the first content event: `tokens` over `events` content
/// events, the first and last of them `visible_s` apart, the generation ending `window_s` after
/// the first (the same, unless text was held back at the end).
///
/// The first event's tokens were made before the window. Events are taken to carry equal
/// shares while text flows (`k` tokens each, `events - 1` of them in `visible_s`), and tokens to
/// come at one rate through the window: `(events - 1) * k / visible_s = (tokens - k) / window_s`,
/// so `k = tokens / (1 + (events - 1) * window_s / visible_s)`. With no text held back that is
/// `tokens / events` (`1` when every event is a token); with text held back it stays the tokens
/// an event carried, not the average over the silent tokens too.
pub(crate) fn decode_tpot(tokens: f64, events: u32, visible_s: f64, window_s: f64) -> Option<f64> {
    if events < 2 || visible_s <= 0.0 || window_s < visible_s {
        return None;
    }
    let first = tokens / (1.0 + f64::from(events - 1) * window_s / visible_s);
    let after_first = tokens - first;
    (after_first > 0.0).then(|| window_s / after_first)
}

impl Observation {
    /// A stream's observation as of its end `now`: `sent` is when it went to the backend (TTFT
    /// runs from there), `first` the occupancy reading at its first content event and `end` the
    /// reading at `now`.
    pub(crate) fn of_stream(
        timing: &StreamTiming,
        outcome: Outcome,
        sent: Instant,
        first: Option<&Reading>,
        end: &Reading,
        now: Instant,
    ) -> Self {
        let estimated = timing.output_tokens.is_none();
        let tokens = timing
            .output_tokens
            .unwrap_or(u64::from(timing.content_events));
        let window = (
            timing.first_content,
            timing.last_content,
            timing.decode_end(),
        );
        let (tpot, concurrency, neighbours) = match (window, first) {
            ((Some(first_at), Some(last_at), Some(end_at)), Some(first))
                if timing.content_events >= 2 && last_at > first_at =>
            {
                let tpot = decode_tpot(
                    tokens as f64,
                    timing.content_events,
                    (last_at - first_at).as_secs_f64(),
                    (end_at - first_at).as_secs_f64(),
                );
                let end = end.rewound_to(end_at);
                (
                    tpot,
                    first.mean_until(&end),
                    first.neighbours_mean_until(&end),
                )
            }
            _ => (None, None, 0.0),
        };
        Self {
            at: now,
            outcome,
            ttft: timing.first_content.map(|t| (t - sent).as_secs_f64()),
            tpot,
            output_tokens: tokens,
            estimated,
            prompt_tokens: timing.prompt_tokens,
            concurrency,
            neighbours,
        }
    }

    /// Where its token count was estimated from its content events (no usage reported, or
    /// not yet), each event counted as `per_event` tokens, as the backend's finished streams
    /// showed theirs carry: the time per token shrinks alike (a stream's TPOT is its window
    /// over its tokens after the first event's share).
    pub(crate) fn counted_at(mut self, per_event: f64) -> Self {
        if self.estimated && per_event > 0.0 {
            self.output_tokens = (self.output_tokens as f64 * per_event).round() as u64;
            self.tpot = self.tpot.map(|t| t / per_event);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn reading(area: f64, count: u32, at: Instant) -> Reading {
        Reading {
            area,
            count,
            at,
            busy_area: 0.0,
            busy: 0,
            neighbours_area: 0.0,
            neighbours: 0,
        }
    }

    #[test]
    fn tpot_spreads_the_decode_window_over_the_tokens_after_the_first_event() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // 10 content events carrying 20 tokens from 100 ms to 280 ms: the first event's 2
        // tokens came before it, so 18 tokens in 180 ms.
        let timing = StreamTiming {
            cached_tokens: None,
            first_content: Some(ms(100)),
            last_content: Some(ms(280)),
            content_events: 10,
            output_tokens: Some(20),
            prompt_tokens: Some(7),
            finished: None,
        };
        let first = reading(1.0, 2, ms(100));
        let end = reading(1.0 + 2.0 * 0.2, 2, ms(300));
        let obs =
            Observation::of_stream(&timing, Outcome::Completed, t0, Some(&first), &end, ms(300));
        assert!((obs.tpot.unwrap() - 0.010).abs() < 1e-12);
        assert!((obs.ttft.unwrap() - 0.100).abs() < 1e-12);
        assert_eq!((obs.output_tokens, obs.estimated), (20, false));
        assert_eq!(obs.prompt_tokens, Some(7));
        // Two in flight the whole time: the 20 ms after the last event are taken back.
        assert!((obs.concurrency.unwrap() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn with_usage_decode_runs_to_the_finish_event_through_text_held_back() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // 64 tokens at 10 ms each from 100 ms: the engine showed text for 26 of them (one
        // event each), held back the other 38 and finished at 730 ms.
        let timing = StreamTiming {
            cached_tokens: None,
            first_content: Some(ms(100)),
            last_content: Some(ms(350)),
            content_events: 26,
            output_tokens: Some(64),
            prompt_tokens: None,
            finished: Some(ms(730)),
        };
        let r = reading(0.0, 1, ms(100));
        let end = reading(0.63, 1, ms(730));
        let obs = Observation::of_stream(&timing, Outcome::Completed, t0, Some(&r), &end, ms(730));
        // The 63 tokens after the first event, in 630 ms.
        let tpot = obs.tpot.unwrap();
        assert!((tpot - 0.010).abs() < 1e-12, "tpot {tpot}");
        assert!((obs.concurrency.unwrap() - 1.0).abs() < 1e-9);
        // Without usage the finish event cannot stretch a window of counted events.
        let counted = StreamTiming {
            output_tokens: None,
            ..timing
        };
        assert_eq!(counted.decode_end(), Some(ms(350)));
    }

    #[test]
    fn without_usage_content_events_are_counted_at_the_tokens_they_carry_and_marked_estimated() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let timing = StreamTiming {
            cached_tokens: None,
            first_content: Some(ms(50)),
            last_content: Some(ms(150)),
            content_events: 11,
            output_tokens: None,
            prompt_tokens: None,
            finished: None,
        };
        let first = reading(0.0, 1, ms(50));
        let end = reading(0.1, 1, ms(150));
        let obs =
            Observation::of_stream(&timing, Outcome::Completed, t0, Some(&first), &end, ms(150));
        assert_eq!((obs.output_tokens, obs.estimated), (11, true));
        assert!((obs.tpot.unwrap() - 0.010).abs() < 1e-12);
        // Read before its usage came, on a backend whose streams showed two tokens an event:
        // twice the tokens, at twice the speed.
        let obs = obs.counted_at(2.0);
        assert_eq!((obs.output_tokens, obs.estimated), (22, true));
        assert!((obs.tpot.unwrap() - 0.005).abs() < 1e-12);
    }

    #[test]
    fn a_stream_with_one_content_event_has_a_ttft_but_no_speed() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_millis(40);
        let timing = StreamTiming {
            cached_tokens: None,
            first_content: Some(at),
            last_content: Some(at),
            content_events: 1,
            output_tokens: Some(1),
            prompt_tokens: None,
            finished: None,
        };
        let r = reading(0.0, 1, at);
        let obs = Observation::of_stream(&timing, Outcome::Completed, t0, Some(&r), &r, at);
        assert_eq!((obs.tpot, obs.concurrency), (None, None));
        assert!((obs.ttft.unwrap() - 0.040).abs() < 1e-12);
    }
}
