//! Paired sampling: a figure and its baseline run in alternating rounds (A B A B ...), and the
//! result is the median of the per-round ratios.
//!
//! A shared, noisy machine changes speed from one second to the next. Pairing each round of the
//! figure with a round of its baseline taken right after it, and keeping the median of the
//! per-round ratios, cancels most of that drift; a single absolute time would not.

use serde::Serialize;

/// What one round of one side measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    /// Seconds per operation (lower is better).
    SecondsPerOp(f64),
    /// Operations per second (higher is better).
    OpsPerSecond(f64),
}

impl Quantity {
    /// The number, whatever its unit.
    pub fn value(self) -> f64 {
        match self {
            Quantity::SecondsPerOp(v) | Quantity::OpsPerSecond(v) => v,
        }
    }

    /// Seconds one operation takes, whatever the unit measured.
    pub fn seconds_per_op(self) -> f64 {
        match self {
            Quantity::SecondsPerOp(s) => s,
            Quantity::OpsPerSecond(r) => 1.0 / r,
        }
    }

    /// Human form: `12.3 µs/op`, `4,210 op/s`.
    pub fn display(self) -> String {
        match self {
            Quantity::SecondsPerOp(s) => format!("{}/op", format_seconds(s)),
            Quantity::OpsPerSecond(r) => format!("{} op/s", group_thousands(r)),
        }
    }

    fn with_value(self, v: f64) -> Quantity {
        match self {
            Quantity::SecondsPerOp(_) => Quantity::SecondsPerOp(v),
            Quantity::OpsPerSecond(_) => Quantity::OpsPerSecond(v),
        }
    }
}

/// The rounds of one paired measurement.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    figure: Vec<Quantity>,
    baseline: Vec<Quantity>,
}

/// The medians of a paired measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PairSummary {
    /// Median of the figure's rounds.
    pub figure: Quantity,
    /// Median of the baseline's rounds.
    pub baseline: Quantity,
    /// Median of the per-round ratios figure / baseline.
    pub ratio: f64,
    /// Number of rounds (each side ran this many times).
    pub rounds: usize,
}

impl Pairs {
    /// An empty set of rounds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one round: the figure, then the baseline run right after it.
    pub fn push(&mut self, figure: Quantity, baseline: Quantity) {
        self.figure.push(figure);
        self.baseline.push(baseline);
    }

    /// Medians and the median ratio, or `None` before the first round.
    pub fn summary(&self) -> Option<PairSummary> {
        let first_figure = *self.figure.first()?;
        let first_baseline = *self.baseline.first()?;
        let ratios: Vec<f64> = self
            .figure
            .iter()
            .zip(&self.baseline)
            .map(|(f, b)| f.value() / b.value())
            .collect();
        let figure: Vec<f64> = self.figure.iter().map(|q| q.value()).collect();
        let baseline: Vec<f64> = self.baseline.iter().map(|q| q.value()).collect();
        Some(PairSummary {
            figure: first_figure.with_value(median(&figure)?),
            baseline: first_baseline.with_value(median(&baseline)?),
            ratio: median(&ratios)?,
            rounds: ratios.len(),
        })
    }
}

/// The median of `values` (the mean of the two middle values for an even count); `None` when
/// empty. NaNs sort last.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// `0.000_012_3` -> `12.3 µs`.
pub fn format_seconds(seconds: f64) -> String {
    let (value, unit) = if seconds >= 1.0 {
        (seconds, "s")
    } else if seconds >= 1e-3 {
        (seconds * 1e3, "ms")
    } else if seconds >= 1e-6 {
        (seconds * 1e6, "µs")
    } else {
        (seconds * 1e9, "ns")
    };
    format!("{} {unit}", three_significant(value))
}

fn three_significant(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// `12345.6` -> `12,346`.
pub fn group_thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        let cases: &[(&[f64], Option<f64>)] = &[
            (&[], None),
            (&[3.0], Some(3.0)),
            (&[3.0, 1.0, 2.0], Some(2.0)),
            (&[4.0, 1.0, 3.0, 2.0], Some(2.5)),
            (&[1.0, 100.0, 2.0], Some(2.0)),
        ];
        for (values, expected) in cases {
            assert_eq!(median(values), *expected, "median of {values:?}");
        }
    }

    #[test]
    fn ratio_is_the_median_of_per_round_ratios_not_the_ratio_of_medians() {
        // Round 2 ran on a machine twice as slow for both sides: the paired ratio stays 2.
        let mut pairs = Pairs::new();
        pairs.push(Quantity::SecondsPerOp(2.0), Quantity::SecondsPerOp(1.0));
        pairs.push(Quantity::SecondsPerOp(4.0), Quantity::SecondsPerOp(2.0));
        pairs.push(Quantity::SecondsPerOp(2.2), Quantity::SecondsPerOp(1.0));
        let summary = pairs.summary().expect("three rounds");
        assert_eq!(summary.rounds, 3);
        assert_eq!(summary.ratio, 2.0);
        assert_eq!(summary.figure, Quantity::SecondsPerOp(2.2));
        assert_eq!(summary.baseline, Quantity::SecondsPerOp(1.0));
        assert!(Pairs::new().summary().is_none());
    }

    #[test]
    fn human_forms() {
        let cases = [
            (Quantity::SecondsPerOp(0.000_012_34), "12.3 µs/op"),
            (Quantity::SecondsPerOp(0.000_000_5), "500 ns/op"),
            (Quantity::SecondsPerOp(0.002_5), "2.50 ms/op"),
            (Quantity::SecondsPerOp(1.5), "1.50 s/op"),
            (Quantity::OpsPerSecond(12_345.6), "12,346 op/s"),
            (Quantity::OpsPerSecond(999.0), "999 op/s"),
            (Quantity::OpsPerSecond(1_000.0), "1,000 op/s"),
        ];
        for (quantity, text) in cases {
            assert_eq!(quantity.display(), text);
        }
    }
}
