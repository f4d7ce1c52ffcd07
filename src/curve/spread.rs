//! A distribution kept as a few quantiles: what one level of a curve says of how its requests
//! spread, so that routing can ask how likely one more request is to meet a target there, not
//! only whether a chosen percentile does.
//!
//! Why quantiles at fixed probabilities rather than a histogram: speeds and TTFTs live on scales
//! that differ by orders of magnitude between backends, and a prediction moves a level's
//! distribution along the fit (scaled for speed, shifted for TTFT), which is exact on quantiles.
//! Between knots the distribution function is taken as linear; past the outer knots it goes on
//! with the slope of the nearest segment, down to 0 and up to 1.

use serde::Serialize;

/// The probabilities a [`Spread`] keeps the quantiles of.
pub(crate) const KNOTS: [f64; 11] = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95];

/// Standard normal quantiles at [`KNOTS`]: the shape of a guessed spread.
const NORMAL_AT_KNOTS: [f64; 11] = [
    -1.644_854, -1.281_552, -0.841_621, -0.524_401, -0.253_347, 0.0, 0.253_347, 0.524_401,
    0.841_621, 1.281_552, 1.644_854,
];

/// Index of the median in [`KNOTS`].
const MEDIAN: usize = 5;

/// Quantiles of a distribution at [`KNOTS`], ascending.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread([f64; KNOTS.len()]);

impl Spread {
    /// The spread whose quantile at each of [`KNOTS`] is `quantile(knot)`; values are sorted so
    /// that the result is a distribution whatever rounding gave.
    pub(crate) fn from_fn(quantile: impl Fn(f64) -> f64) -> Self {
        let mut knots = KNOTS.map(quantile);
        knots.sort_unstable_by(f64::total_cmp);
        Self(knots)
    }

    /// A log-normal spread about `median` whose `q` quantile is `ratio` times the median: the
    /// guess where a curve has seen no spread to go by.
    pub(crate) fn log_normal(median: f64, q: f64, ratio: f64) -> Self {
        let z = NORMAL_AT_KNOTS[KNOTS.iter().position(|k| *k == q).unwrap_or(1)];
        let sigma = if z == 0.0 { 0.0 } else { ratio.ln() / z };
        let mut knots = NORMAL_AT_KNOTS.map(|z| median * (sigma * z).exp());
        knots.sort_unstable_by(f64::total_cmp);
        Self(knots)
    }

    /// The `q` quantile, linear between knots (the outer knots beyond them).
    pub(crate) fn quantile(&self, q: f64) -> f64 {
        let i = KNOTS.partition_point(|k| *k < q);
        if i == 0 {
            return self.0[0];
        }
        if i == KNOTS.len() {
            return self.0[KNOTS.len() - 1];
        }
        let (q0, q1) = (KNOTS[i - 1], KNOTS[i]);
        let (v0, v1) = (self.0[i - 1], self.0[i]);
        v0 + (v1 - v0) * (q - q0) / (q1 - q0)
    }

    /// The median.
    pub(crate) fn median(&self) -> f64 {
        self.0[MEDIAN]
    }

    /// The share of the distribution at or below `x`.
    pub(crate) fn share_below(&self, x: f64) -> f64 {
        let v = &self.0;
        let last = v.len() - 1;
        let slope = |i: usize| {
            let dv = v[i + 1] - v[i];
            (dv > 0.0).then(|| (KNOTS[i + 1] - KNOTS[i]) / dv)
        };
        // The knots are sorted: those at or below `x` are the first so many. Counted without
        // a branch (a binary search over eleven mispredicts about half its steps).
        let at_or_below: usize = v.iter().map(|k| usize::from(*k <= x)).sum();
        if at_or_below == 0 {
            // Below every knot: the lowest segment's slope, down to 0.
            let gap = v[0] - x;
            return (0..last)
                .find_map(slope)
                .map_or(0.0, |s| (KNOTS[0] - gap * s).max(0.0));
        }
        if at_or_below == v.len() {
            let gap = x - v[last];
            return (0..last)
                .rev()
                .find_map(slope)
                .map_or(1.0, |s| (KNOTS[last] + gap * s).min(1.0));
        }
        let i = at_or_below - 1;
        let (v0, v1) = (v[i], v[i + 1]);
        KNOTS[i] + (KNOTS[i + 1] - KNOTS[i]) * (x - v0) / (v1 - v0)
    }

    /// A value every `x` below which has [`Spread::share_below`] exactly 0, rounding
    /// included: the lowest knot less what its segment's slope extends below it, and a hair.
    pub(crate) fn surely_above(&self) -> f64 {
        let v = &self.0;
        let slope = (0..v.len() - 1).find_map(|i| {
            let dv = v[i + 1] - v[i];
            (dv > 0.0).then(|| (KNOTS[i + 1] - KNOTS[i]) / dv)
        });
        match slope {
            Some(s) => {
                let reach = KNOTS[0] / s;
                v[0] - reach - 1e-9 * (v[0].abs() + reach)
            }
            None => v[0],
        }
    }

    /// The share of the distribution at or above `x`.
    pub(crate) fn share_above(&self, x: f64) -> f64 {
        1.0 - self.share_below(x)
    }

    /// Every quantile times `factor` (a speed moved along the fit).
    pub(crate) fn scaled(&self, factor: f64) -> Self {
        Self(self.0.map(|v| v * factor))
    }

    /// Every quantile plus `by`, never below zero (a wait moved along the fit).
    pub(crate) fn shifted(&self, by: f64) -> Self {
        Self(self.0.map(|v| (v + by).max(0.0)))
    }

    /// The shape of this spread: every quantile over the median (`None` for a median of 0).
    pub(crate) fn relative(&self) -> Option<Self> {
        let m = self.median();
        (m > 0.0 && m.is_finite()).then(|| self.scaled(1.0 / m))
    }

    /// Moved up so that the median is at least `p50` and the 90th percentile at least `p90`
    /// (what a floor on a TTFT says: the whole distribution shifts up to the median's floor,
    /// and the tail is raised to its own).
    pub(crate) fn at_least(&self, p50: f64, p90: f64) -> Self {
        let shifted = self.shifted((p50 - self.median()).max(0.0));
        let mut knots = shifted.0;
        for (v, k) in knots.iter_mut().zip(KNOTS) {
            if k >= 0.9 {
                *v = v.max(p90);
            }
        }
        Self(knots)
    }

    /// The weighted mean of spreads, knot by knot (a pooled shape); `None` without weight.
    pub(crate) fn pooled(spreads: impl Iterator<Item = (f64, Self)>) -> Option<Self> {
        let mut sum = [0.0; KNOTS.len()];
        let mut total = 0.0;
        for (w, s) in spreads {
            total += w;
            for (acc, v) in sum.iter_mut().zip(s.0) {
                *acc += w * v;
            }
        }
        (total > 0.0).then(|| Self(sum.map(|v| v / total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn below_its_sure_floor_a_spread_holds_nothing(
            median in 0.01f64..1000.0,
            ratio in 0.01f64..1.0,
            below in 0.0f64..1.0,
        ) {
            let spread = Spread::log_normal(median, 0.1, ratio);
            let floor = spread.surely_above();
            proptest::prop_assert!(floor < spread.quantile(0.0) || ratio == 1.0);
            proptest::prop_assert_eq!(spread.share_below(floor - below * floor.abs()), 0.0);
            // And it is not far below: at the lowest knot the share is the lowest knot's.
            proptest::prop_assert!(spread.share_below(spread.quantile(0.0)) > 0.0);
        }
    }

    #[test]
    fn quantiles_read_back_at_the_knots_and_between_them() {
        let s = Spread::from_fn(|q| 100.0 * q);
        assert!((s.quantile(0.1) - 10.0).abs() < 1e-12);
        assert!((s.quantile(0.5) - 50.0).abs() < 1e-12);
        assert!((s.quantile(0.25) - 25.0).abs() < 1e-12);
        assert!((s.share_below(25.0) - 0.25).abs() < 1e-12);
        assert!((s.share_above(90.0) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn past_the_outer_knots_the_share_goes_on_to_zero_and_one() {
        let s = Spread::from_fn(|q| 100.0 * q);
        assert!((s.share_below(2.5) - 0.025).abs() < 1e-12);
        assert_eq!(s.share_below(-10.0), 0.0);
        assert_eq!(s.share_below(1_000.0), 1.0);
        // A point mass: all or nothing.
        let point = Spread::from_fn(|_| 7.0);
        assert_eq!(point.share_below(6.9), 0.0);
        assert_eq!(point.share_below(7.0), 1.0);
        assert_eq!(point.share_above(7.1), 0.0);
    }

    #[test]
    fn a_guessed_spread_has_the_asked_ratio_at_its_percentile() {
        let s = Spread::log_normal(50.0, 0.1, 0.9);
        assert!((s.median() - 50.0).abs() < 1e-9);
        assert!((s.quantile(0.1) - 45.0).abs() < 1e-9);
        let t = Spread::log_normal(1.0, 0.9, 1.25);
        assert!((t.quantile(0.9) - 1.25).abs() < 1e-9);
    }

    #[test]
    fn a_floor_moves_the_median_and_raises_the_tail() {
        let s = Spread::from_fn(|q| q);
        let f = s.at_least(0.7, 1.5);
        assert!((f.median() - 0.7).abs() < 1e-12);
        assert!((f.quantile(0.1) - 0.3).abs() < 1e-12);
        assert_eq!(f.quantile(0.9), 1.5);
        assert_eq!(s.at_least(0.0, 0.0), s);
    }
}
