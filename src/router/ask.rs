//! What the router knows of a request ([`Ask`]) and which backends its client can reach
//! ([`Reach`]): the words every rung and the router's callers share.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::{BackendDialect, Slo};
use crate::prefix::RequestPrefix;

/// Output tokens assumed when the request sets no `max_tokens` (for prices and throughput).
pub(crate) const ASSUMED_OUTPUT_TOKENS: f64 = 256.0;

/// What the router needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Client model name.
    pub model: &'a str,
    /// The backends the client can reach: of its own dialect, or translated.
    pub reach: Reach,
    /// Prompt size, estimated from the body.
    pub prompt_tokens: u64,
    /// `max_tokens`, if the body sets it.
    pub max_tokens: Option<u32>,
    /// Index of its class, if any.
    pub class: Option<usize>,
    /// Its targets (the class's, with any per-request overrides).
    pub slo: Slo,
    /// When the gateway received it: queueing counts against the TTFT budget from here.
    pub received: Instant,
    /// The moment of this decision: every check of it reads this, and the router no clock
    /// (its caller reads one; [`line`] again each time a waiting request tries again).
    pub now: Instant,
    /// Backends (by index) not to use: a retry avoids those that failed it.
    pub avoid: &'a [usize],
    /// Its prompt's prefix, when the prefix index is on.
    pub prefix: Option<&'a RequestPrefix>,
}

/// Which backends a client can reach: those of its own dialect, and where its request may be
/// translated, those of the other dialect that translate (`backends[].translate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    /// The dialect the client speaks.
    pub dialect: BackendDialect,
    /// Its request may be translated (a chat completion or a message, no rule forbidding it).
    pub translate: bool,
}

impl Reach {
    /// Reaches only backends of `dialect`.
    pub const fn own(dialect: BackendDialect) -> Self {
        Self {
            dialect,
            translate: false,
        }
    }

    /// Whether a backend of `dialect` that `translates` (or not) is in reach.
    pub(crate) fn reaches(self, dialect: BackendDialect, translates: bool) -> bool {
        dialect == self.dialect || (self.translate && translates)
    }
}

/// The share of a queueing class's TTFT target kept for its line while others wait there: a
/// request is placed only where its first token is predicted within the target less this much,
/// or less the time it has already waited, whichever is more. Without it a backend fills to
/// the edge of the target, where only a request that has not waited at all still fits, and the
/// freshest arrival takes every freed slot whatever the line's fair order says.
pub(crate) const LINE_RESERVE: f64 = 0.2;

impl Ask<'_> {
    /// The same request, decided again at `now`.
    #[must_use]
    pub(crate) fn at(&self, now: Instant) -> Self {
        Self { now, ..*self }
    }

    /// As if it had already waited `reserve_s` at `now` (if it has not waited that long): the
    /// TTFT budget it is held to while requests wait in its class's line.
    pub(crate) fn holding_back(&self, now: Instant, reserve_s: f64) -> Self {
        let reserve = Duration::from_secs_f64(reserve_s.max(0.0));
        Self {
            received: self
                .received
                .min(now.checked_sub(reserve).unwrap_or(self.received)),
            ..*self
        }
    }

    /// The SLO as it stands at `now`: the TTFT budget less the time already spent since the
    /// request arrived (reading it, waiting in line).
    pub(crate) fn slo_at(&self, now: Instant) -> Slo {
        let waited = now.saturating_duration_since(self.received).as_secs_f64();
        Slo {
            max_ttft_s: self.slo.max_ttft_s.map(|t| t - waited),
            ..self.slo
        }
    }
}
