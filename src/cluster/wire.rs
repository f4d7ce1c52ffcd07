//! What replicas write to Redis and read back as JSON (small, and readable with `redis-cli`):
//! the curve [`SharedSample`]s a replica learned, the prompts it routed, and the [`HealthNote`] of a
//! backend it ejected or saw cool down (its load travels as fields of the fleet's sums). Times
//! cross machines as Unix milliseconds and become this process's instants on arrival
//! ([`Clock`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::curve::{FirstToken, Observation, Outcome};
use crate::fleet::Learned;

/// A prompt routed to a backend, as it travels (in the stream entry's field `p`, beside the
/// samples in `s`, so that a replica of an earlier version reads its samples as before): its
/// coarse block hashes ([`crate::prefix::coarse`]) and its hint. The hashes are already
/// seeded by the model, so no model travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoutedPrompt {
    /// Backend name.
    #[serde(rename = "b")]
    pub backend: String,
    /// The coarse block hashes.
    #[serde(rename = "h")]
    pub hashes: Box<[u64]>,
    /// The conversation hint's hash.
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<u64>,
}

/// One curve sample, as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SharedSample {
    /// Backend name.
    #[serde(rename = "b")]
    pub backend: String,
    /// Client model name.
    #[serde(rename = "m")]
    pub model: String,
    /// When it was taken, Unix milliseconds.
    #[serde(rename = "w")]
    pub wall_ms: u64,
    /// What it says.
    #[serde(flatten)]
    pub body: SampleBody,
}

/// A first token or a request's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "k")]
pub(crate) enum SampleBody {
    /// [`FirstToken`] without its instant.
    #[serde(rename = "t")]
    FirstToken {
        /// TTFT, seconds.
        ttft: f64,
        /// Prompt tokens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<u64>,
        /// In flight at admission, fleet-wide.
        admitted_with: f64,
        /// Requests still waiting for a first token at admission (absent: none; replicas
        /// before it sent none).
        #[serde(default, skip_serializing_if = "is_zero")]
        queued: u32,
    },
    /// [`Observation`] without its instant.
    #[serde(rename = "e")]
    Ended {
        /// `completed`, `cancelled` or `failed`.
        outcome: Outcome,
        /// TTFT, seconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttft: Option<f64>,
        /// Seconds per output token.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tpot: Option<f64>,
        /// Output tokens.
        tokens: u64,
        /// The token count was estimated.
        #[serde(default)]
        estimated: bool,
        /// Prompt tokens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<u64>,
        /// Experienced concurrency, fleet-wide.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        concurrency: Option<f64>,
        /// The same of the backends sharing its device.
        #[serde(default, skip_serializing_if = "is_none")]
        neighbours: f64,
    },
}

/// What a replica noted of a backend's health: ejected or cooling until these Unix
/// milliseconds (0: not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct HealthNote {
    /// End of an ejection after upstream failures.
    #[serde(rename = "e", default)]
    pub ejected_until_ms: u64,
    /// End of a 429 cool-down.
    #[serde(rename = "c", default)]
    pub cooling_until_ms: u64,
}

/// This process's instants against the wall clock, read once per sync: what turns a sample's
/// instant into Unix milliseconds and back (peers' clocks are assumed in step, as NTP keeps
/// them, to within a few milliseconds).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    now: Instant,
    wall_ms: u64,
}

impl Clock {
    /// The clocks now.
    pub(crate) fn read() -> Self {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            now: Instant::now(),
            wall_ms,
        }
    }

    #[cfg(test)]
    /// The pair given (for tests).
    pub(crate) const fn at(now: Instant, wall_ms: u64) -> Self {
        Self { now, wall_ms }
    }

    /// The local instant of the clock's reading.
    pub(crate) const fn now(&self) -> Instant {
        self.now
    }

    /// `at` in Unix milliseconds.
    pub(crate) fn wall(&self, at: Instant) -> u64 {
        let ago = u64::try_from(self.now.saturating_duration_since(at).as_millis()).unwrap_or(0);
        let ahead = u64::try_from(at.saturating_duration_since(self.now).as_millis()).unwrap_or(0);
        self.wall_ms.saturating_sub(ago).saturating_add(ahead)
    }

    /// Unix milliseconds `wall_ms` as an instant of this process; one in the future is now (a
    /// sample cannot be from later than its arrival), one before the process began is `None`.
    pub(crate) fn local(&self, wall_ms: u64) -> Option<Instant> {
        self.now
            .checked_sub(Duration::from_millis(self.wall_ms.saturating_sub(wall_ms)))
    }

    /// Unix milliseconds `wall_ms` as an instant of this process, future ones kept (the end of
    /// an ejection); `None` when already past.
    pub(crate) fn until(&self, wall_ms: u64) -> Option<Instant> {
        (wall_ms > self.wall_ms).then(|| self.now + Duration::from_millis(wall_ms - self.wall_ms))
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A load of none (a backend that shares no device): left out of a sample on the wire.
fn is_none(load: &f64) -> bool {
    *load == 0.0
}

impl SharedSample {
    /// A sample of `backend` for `model`, its instant read against `clock`.
    pub(crate) fn new(backend: &str, model: &str, learned: &Learned, clock: &Clock) -> Self {
        let (at, body) = match learned {
            Learned::FirstToken(t) => (
                t.at,
                SampleBody::FirstToken {
                    ttft: t.ttft,
                    prompt: t.prompt_tokens,
                    admitted_with: t.admitted_with,
                    queued: t.queued_with,
                },
            ),
            Learned::Ended(o) => (
                o.at,
                SampleBody::Ended {
                    outcome: o.outcome,
                    ttft: o.ttft,
                    tpot: o.tpot,
                    tokens: o.output_tokens,
                    estimated: o.estimated,
                    prompt: o.prompt_tokens,
                    concurrency: o.concurrency,
                    neighbours: o.neighbours,
                },
            ),
        };
        Self {
            backend: backend.to_owned(),
            model: model.to_owned(),
            wall_ms: clock.wall(at),
            body,
        }
    }

    /// What it teaches, dated in this process's time; `None` for a sample older than the
    /// process.
    pub(crate) fn learned(&self, clock: &Clock) -> Option<Learned> {
        let at = clock.local(self.wall_ms)?;
        Some(match self.body {
            SampleBody::FirstToken {
                ttft,
                prompt,
                admitted_with,
                queued,
            } => Learned::FirstToken(FirstToken {
                at,
                ttft,
                prompt_tokens: prompt,
                admitted_with,
                queued_with: queued,
            }),
            SampleBody::Ended {
                outcome,
                ttft,
                tpot,
                tokens,
                estimated,
                prompt,
                concurrency,
                neighbours,
            } => Learned::Ended(Observation {
                at,
                outcome,
                ttft,
                tpot,
                output_tokens: tokens,
                estimated,
                prompt_tokens: prompt,
                concurrency,
                neighbours,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_crosses_as_json_and_arrives_at_the_same_moment() {
        let now = Instant::now();
        let clock = Clock::at(now, 1_700_000_000_000);
        let taken = now.checked_sub(Duration::from_millis(250)).unwrap();
        for learned in [
            Learned::FirstToken(FirstToken {
                at: taken,
                ttft: 0.125,
                prompt_tokens: Some(64),
                admitted_with: 3.0,
                queued_with: 2,
            }),
            Learned::Ended(Observation {
                at: taken,
                outcome: Outcome::Completed,
                ttft: Some(0.125),
                tpot: Some(0.02),
                output_tokens: 64,
                estimated: false,
                prompt_tokens: None,
                concurrency: Some(2.5),
                neighbours: 0.0,
            }),
        ] {
            let sample = SharedSample::new("vllm", "llama", &learned, &clock);
            assert_eq!(sample.wall_ms, 1_699_999_999_750);
            let json = serde_json::to_string(&sample).unwrap();
            let back: SharedSample = serde_json::from_str(&json).unwrap();
            assert_eq!(back, sample, "{json}");
            // Read by a peer whose process started later: the same moment, in its own time.
            let later = Instant::now() + Duration::from_secs(5);
            let peer = Clock::at(later, 1_700_000_000_100);
            let at = match back.learned(&peer).unwrap() {
                Learned::FirstToken(t) => t.at,
                Learned::Ended(o) => o.at,
            };
            assert_eq!(later - at, Duration::from_millis(350));
        }
    }

    #[test]
    fn the_end_of_an_ejection_is_kept_in_the_future_and_gone_once_past() {
        let now = Instant::now();
        let clock = Clock::at(now, 10_000);
        assert_eq!(clock.until(12_500), Some(now + Duration::from_millis(2500)));
        assert_eq!(clock.until(9_000), None);
        assert_eq!(clock.wall(now + Duration::from_millis(2500)), 12_500);
    }
}
