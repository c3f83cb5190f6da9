//! What `idem bench consume` prints: a table of the phases' totals, and the
//! ratios that answer the benchmark's questions — effectively-once against
//! plain (one per transaction and batched) and batched against one per
//! transaction — each the median of the rounds' own ratios, so one round
//! disturbed by something outside the benchmark does not move it.

use std::time::Duration;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

/// A phase's totals over the rounds.
struct Phase {
    name: String,
    messages: usize,
    elapsed: Duration,
}

impl Phase {
    fn per_second(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
}

/// The phases' totals and each round's ratios. The phases are, in order:
/// plain and effectively-once one per transaction, then plain and
/// effectively-once batched.
pub(super) struct Report {
    phases: [Phase; 4],
    /// Effectively-once ÷ plain, one per transaction, per round.
    single: Vec<f64>,
    /// Effectively-once ÷ plain, batched, per round.
    batched: Vec<f64>,
    /// Effectively-once batched ÷ effectively-once one per transaction.
    batch_gain: Vec<f64>,
}

impl Report {
    /// An empty report on the phases called `names`, for `rounds` rounds.
    pub(super) fn new(names: [String; 4], rounds: usize) -> Self {
        Self {
            phases: names.map(|name| Phase {
                name,
                messages: 0,
                elapsed: Duration::ZERO,
            }),
            single: Vec::with_capacity(rounds),
            batched: Vec::with_capacity(rounds),
            batch_gain: Vec::with_capacity(rounds),
        }
    }

    /// Says on stderr that phase `i` of `round` consumed `messages` in `elapsed`.
    pub(super) fn progress(&self, round: usize, i: usize, messages: usize, elapsed: Duration) {
        eprintln!(
            "round {}: {}: {messages} messages in {:.2}s",
            round + 1,
            self.phases[i].name,
            elapsed.as_secs_f64()
        );
    }

    /// Adds a round in which every phase consumed `messages`, taking `elapsed`.
    pub(super) fn round(&mut self, messages: usize, elapsed: [Duration; 4]) {
        let mut rates = [0.0; 4];
        for ((phase, elapsed), rate) in self.phases.iter_mut().zip(elapsed).zip(&mut rates) {
            phase.messages += messages;
            phase.elapsed += elapsed;
            *rate = messages as f64 / elapsed.as_secs_f64();
        }
        self.single.push(rates[1] / rates[0]);
        self.batched.push(rates[3] / rates[2]);
        self.batch_gain.push(rates[3] / rates[1]);
    }

    /// Prints the table and the median ratios; `batch` is the batch size.
    pub(super) fn print(mut self, batch: usize) {
        let rounds = self.single.len();
        let base = self.phases[0].per_second();
        let mut table = Table::new();
        table.load_preset(UTF8_FULL_CONDENSED).set_header([
            "consumer",
            "messages",
            "seconds",
            "msg/s",
            "× plain 1/tx",
        ]);
        for phase in &self.phases {
            table.add_row([
                phase.name.clone(),
                phase.messages.to_string(),
                format!("{:.2}", phase.elapsed.as_secs_f64()),
                format!("{:.0}", phase.per_second()),
                format!("{:.2}", phase.per_second() / base),
            ]);
        }
        println!("{table}");
        // The median sorts the rounds' ratios, so they are listed in order.
        let single = median(&mut self.single);
        println!(
            "effectively-once ÷ plain, median of {rounds} rounds: {single:.2}× one per transaction (rounds {}), {:.2}× batched   (target ≥ 0.8×)",
            list(&self.single),
            median(&mut self.batched),
        );
        println!(
            "effectively-once batch {batch} ÷ one per transaction, median of {rounds} rounds: {:.2}×   (target ≥ 3×)",
            median(&mut self.batch_gain)
        );
    }
}

/// Prints the delay the latency relay was configured with and the one it
/// measured.
pub(super) fn delay(configured: Duration, measured: Duration) {
    println!(
        "delay to and from PostgreSQL: {} each way as configured, {} measured (mean over the run, with the relay's wake-up)",
        humantime::format_duration(configured),
        humantime::format_duration(measured)
    );
}

/// The median (the mean of the middle two for an even count); sorts `values`.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Ratios as `0.71 0.74 0.69`.
fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_odd_count_is_the_middle_and_of_an_even_count_the_mean_of_two() {
        assert_eq!(median(&mut [0.9, 0.7, 0.8]), 0.8);
        assert_eq!(median(&mut [1.0, 0.5, 0.75, 0.25]), 0.625);
        assert!(median(&mut []).is_nan());
    }
}
