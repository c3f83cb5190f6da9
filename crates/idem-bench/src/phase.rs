//! A measured phase of a benchmark that sends requests (`idem bench http`,
//! `idem bench grpc`): its latencies and time, and the table of phases with
//! each one's ratio to the first.

use std::time::Duration;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

/// The latencies of one phase's requests and the time they took together.
pub(crate) struct Phase {
    pub(crate) name: &'static str,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) elapsed: Duration,
}

impl Phase {
    pub(crate) fn empty(name: &'static str) -> Self {
        Self {
            name,
            latencies: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Adds a round's share of the phase.
    pub(crate) fn add(&mut self, part: Phase) {
        self.latencies.extend(part.latencies);
        self.elapsed += part.elapsed;
    }

    pub(crate) fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// The `q` quantile of the latencies, in milliseconds; sort first.
    pub(crate) fn percentile_ms(&self, q: f64) -> f64 {
        let index =
            ((self.latencies.len() as f64 * q).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[index - 1].as_secs_f64() * 1000.0
    }
}

/// The phases as a table: count, rate, p50, p99, and the rate's ratio to
/// `base`'s, the column named `ratio`.
pub(crate) fn table(phases: &[Phase], base: f64, ratio: &str) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["phase", "requests", "req/s", "p50 ms", "p99 ms", ratio]);
    for phase in phases {
        table.add_row([
            phase.name.to_owned(),
            phase.latencies.len().to_string(),
            format!("{:.0}", phase.per_second()),
            format!("{:.2}", phase.percentile_ms(0.50)),
            format!("{:.2}", phase.percentile_ms(0.99)),
            format!("{:.2}", phase.per_second() / base),
        ]);
    }
    table
}
