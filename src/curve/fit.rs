//! Weighted least squares, small and exact: the curve's fitted lines.
//!
//! TPOT(c) = a + b·c follows from how batching engines work: a decode step costs a fixed part
//! plus a part per sequence in the batch (see the simulator's engine, and vLLM's scheduler). TTFT
//! is fitted as t0 + t1·(c − 1) + P/r, the queueing part growing with the requests ahead (a lone
//! request waits for none) plus prefill at rate r tokens per second (docs/ARCHITECTURE.md, "Curves").

/// Solves the weighted least-squares problem `min Σ w (y - x·β)²` for up to three parameters by
/// Gaussian elimination on the normal equations. `None` when they are singular (the data cannot
/// tell the parameters apart, e.g. every x the same).
pub(crate) fn wls<const N: usize>(
    rows: impl Iterator<Item = ([f64; N], f64, f64)>,
) -> Option<[f64; N]> {
    let mut a = [[0.0; N]; N];
    let mut b = [0.0; N];
    for (x, y, w) in rows {
        for i in 0..N {
            b[i] += w * x[i] * y;
            for j in 0..N {
                a[i][j] += w * x[i] * x[j];
            }
        }
    }
    solve(a, b)
}

/// Solves the normal equations `a·β = b` (`a = Σ w·x·xᵀ`, `b = Σ w·x·y`), summed elsewhere;
/// `None` when they are singular.
pub(crate) fn solve<const N: usize>(mut a: [[f64; N]; N], mut b: [f64; N]) -> Option<[f64; N]> {
    // A column's own scale before elimination: what is left of it once the columns before it
    // are taken out is compared with that, so that a column that is a multiple of another
    // (every sample at one occupancy) is found singular rather than solved in rounding noise.
    let diagonal: [f64; N] = std::array::from_fn(|i| a[i][i].abs());
    for col in 0..N {
        let pivot = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        // Relative to the diagonal's scale, so that units (seconds, tokens) do not matter.
        let scale = diagonal[col].max(a[col][col].abs()).max(f64::MIN_POSITIVE);
        if a[pivot][col].abs() <= 1e-9 * scale || a[pivot][col] == 0.0 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col];
        for row in col + 1..N {
            let f = a[row][col] / pivot_row[col];
            for (cell, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *cell -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut beta = [0.0; N];
    for i in (0..N).rev() {
        let rest: f64 = (i + 1..N).map(|k| a[i][k] * beta[k]).sum();
        beta[i] = (b[i] - rest) / a[i][i];
    }
    beta.iter().all(|v| v.is_finite()).then_some(beta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_known_line() {
        let rows = [1.0, 2.0, 4.0, 8.0].map(|c| ([1.0, c], 0.010 + 0.002 * c, 1.0));
        let [a, b] = wls(rows.into_iter()).unwrap();
        assert!((a - 0.010).abs() < 1e-12 && (b - 0.002).abs() < 1e-12);
    }

    #[test]
    fn recovers_three_parameters_and_refuses_a_degenerate_design() {
        let rows: Vec<_> = [(1.0, 10.0), (2.0, 500.0), (4.0, 100.0), (8.0, 2000.0)]
            .into_iter()
            .map(|(c, p)| ([1.0, c, p], 0.02 + 0.005 * c + p / 8000.0, 1.0))
            .collect();
        let [t0, t1, k] = wls(rows.into_iter()).unwrap();
        assert!(
            (t0 - 0.02).abs() < 1e-9
                && (t1 - 0.005).abs() < 1e-9
                && (1.0 / k - 8000.0).abs() < 1e-3
        );
        let same_prompt = [1.0, 2.0, 4.0].map(|c| ([1.0, c, 64.0], 0.1, 1.0));
        assert_eq!(wls(same_prompt.into_iter()), None);
        let one_occupancy = [0.15, 0.16, 0.14].map(|t| ([1.0, 7.0], t, 1.0));
        assert_eq!(wls(one_occupancy.into_iter()), None);
    }
}
