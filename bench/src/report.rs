//! One row of the results table, and its formatting.

use std::fmt::Write as _;
use std::time::Duration;

use crate::util::percentile;

/// How a measured row compares to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// The target is met.
    Pass,
    /// The target is not met.
    Below,
    /// No target for this row (a breakdown or a supporting figure).
    Info,
    /// The figure could not be measured on this machine (the reason is in the value column).
    NotMeasured,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Below => "BELOW",
            Status::Info => "info",
            Status::NotMeasured => "not measured",
        }
    }

    /// `Pass` when `ok`, else `Below`.
    pub(crate) fn from_bool(ok: bool) -> Status {
        if ok { Status::Pass } else { Status::Below }
    }
}

/// One line of the table.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// The figure number (1..=15).
    pub figure: u8,
    /// What is measured.
    pub what: String,
    /// The measured value, formatted.
    pub value: String,
    /// The baseline(s), formatted.
    pub baseline: String,
    /// measured / baseline, formatted (may be empty).
    pub ratio: String,
    /// The target, formatted (may be empty).
    pub target: String,
    /// Verdict.
    pub status: Status,
    /// The raw numbers behind the row (checked for finiteness by the smoke test).
    pub numbers: Vec<f64>,
}

impl Row {
    /// A row with a verdict.
    pub(crate) fn new(figure: u8, what: impl Into<String>, value: impl Into<String>) -> Row {
        Row {
            figure,
            what: what.into(),
            value: value.into(),
            baseline: String::new(),
            ratio: String::new(),
            target: String::new(),
            status: Status::Info,
            numbers: Vec::new(),
        }
    }

    /// Sets the baseline text.
    pub(crate) fn baseline(mut self, b: impl Into<String>) -> Row {
        self.baseline = b.into();
        self
    }

    /// Sets the ratio text.
    pub(crate) fn ratio(mut self, r: impl Into<String>) -> Row {
        self.ratio = r.into();
        self
    }

    /// Sets the target text and the verdict.
    pub(crate) fn target(mut self, t: impl Into<String>, status: Status) -> Row {
        self.target = t.into();
        self.status = status;
        self
    }

    /// Records the raw numbers of the row.
    pub(crate) fn numbers(mut self, n: &[f64]) -> Row {
        self.numbers.extend_from_slice(n);
        self
    }

    /// A "not measured" row.
    pub(crate) fn not_measured(figure: u8, what: impl Into<String>, why: impl Into<String>) -> Row {
        let mut r = Row::new(figure, what, format!("not measured: {}", why.into()));
        r.status = Status::NotMeasured;
        r
    }
}

/// The header of the markdown table.
pub(crate) fn header() -> String {
    "| fig | measured | value | baseline (same run) | ratio | target | verdict |\n\
     |----:|----------|-------|---------------------|------:|--------|---------|"
        .to_string()
}

/// One markdown table line. The raw numbers go last, as `[a, b, ...]`, for machine checks.
pub(crate) fn line(r: &Row) -> String {
    let mut s = String::new();
    let esc = |t: &str| t.replace('|', "\\|");
    let _ = write!(
        s,
        "| {} | {} | {} | {} | {} | {} | {} |",
        r.figure,
        esc(&r.what),
        esc(&r.value),
        esc(&r.baseline),
        esc(&r.ratio),
        esc(&r.target),
        r.status.label()
    );
    s
}

/// Bytes per second, human readable (binary units).
pub(crate) fn rate(bytes_per_s: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if bytes_per_s >= GIB {
        format!("{:.2} GiB/s", bytes_per_s / GIB)
    } else {
        format!("{:.1} MiB/s", bytes_per_s / MIB)
    }
}

/// A count per second.
pub(crate) fn per_s(n: f64, unit: &str) -> String {
    if n >= 1e6 {
        format!("{:.2} M {unit}/s", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1} k {unit}/s", n / 1e3)
    } else {
        format!("{n:.0} {unit}/s")
    }
}

/// Microseconds, no decimals.
pub(crate) fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// A count in thousands or millions when round (`10k`, `1M`).
pub(crate) fn count(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// A row comparing latencies at two store sizes (figures 9 and 10): the large store's p50 / p99
/// as the value, the small store's as the baseline, and their p50 ratio against the target
/// `<= 2x` (`why` says why it should hold). `small` and `large`: (stored batches, latencies).
pub(crate) fn scaling_row(
    figure: u8,
    what: String,
    small: (usize, &mut [Duration]),
    large: (usize, &mut [Duration]),
    why: &str,
) -> Row {
    let (sn, ln) = (count(small.0), count(large.0));
    let (a50, a99) = (percentile(small.1, 0.5), percentile(small.1, 0.99));
    let (b50, b99) = (percentile(large.1, 0.5), percentile(large.1, 0.99));
    let ratio = b50.as_secs_f64() / a50.as_secs_f64();
    Row::new(
        figure,
        what,
        format!("{ln}: p50 {}, p99 {}", us(b50), us(b99)),
    )
    .baseline(format!("{sn} batches: p50 {}, p99 {}", us(a50), us(a99)))
    .ratio(format!("{ratio:.2}x"))
    .target(
        format!("{ln}/{sn} p50 <= 2x ({why})"),
        Status::from_bool(ratio <= 2.0),
    )
    .numbers(&[
        b50.as_secs_f64(),
        b99.as_secs_f64(),
        a50.as_secs_f64(),
        a99.as_secs_f64(),
        ratio,
    ])
}

/// Milliseconds with two decimals.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A percentage.
pub(crate) fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}
