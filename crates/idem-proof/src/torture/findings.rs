//! What one trial of a fault campaign found: the faults injected
//! ([`Fault`]) and the counts and violations the verdict drew from its
//! history and effects ([`TrialResult`]).

use std::path::PathBuf;

use idem_check::Report;

use super::client::Sample;

/// A fault, as injected.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    /// What: `sigkill`, `crash apply.after-claim`, `drop`, …
    pub what: String,
    /// When it started, ms since the Unix epoch.
    pub at_ms: i64,
    /// When it ended (the process was back, the proxy passed again).
    pub until_ms: i64,
}

/// What one trial found.
#[derive(Debug)]
pub(crate) struct TrialResult {
    /// The trial's number.
    pub index: usize,
    /// The faults injected (a crash point counts once it fired).
    pub faults: Vec<Fault>,
    /// The checker's report on the history and the upstream's effects.
    pub report: Report,
    /// Keys applied more than once where each extra effect follows an
    /// attempt of the key whose outcome was unknown: the leased gateway's
    /// at-least-once cost, counted in effects beyond the first.
    pub expected_repeats: usize,
    /// Keys applied again after the gateway answered but could not store
    /// the answer (its store failed at that moment), each counted against
    /// one such failure the gateway logged: the same at-least-once cost,
    /// although the client was told `ok`.
    pub unstored_repeats: usize,
    /// Extra effects not explained either way: violations.
    pub double_effects: usize,
    /// Copies the downstream received and answered from its records (the
    /// relay scenario's redeliveries).
    pub suppressed_downstream: usize,
    /// Acknowledged operations with no effect.
    pub lost_acked: usize,
    /// Violations: the checker's, less the explained repeats.
    pub violations: Vec<String>,
    /// Processes that ended by themselves, not killed and not at a crash
    /// point (each restarted), by name: how a process took a fault in what
    /// it depends on.
    pub exits: Vec<&'static str>,
    /// What the trial saw besides its violations, printed with them: how
    /// far the outbox got, for a relay trial that lost acknowledged keys.
    pub notes: Vec<String>,
    /// Requests `idem dup-proxy` sent twice, in the scenario that has it.
    pub proxy_copies: Option<u64>,
    /// Every attempt, for the plots.
    pub samples: Vec<Sample>,
    /// The history file.
    pub history: PathBuf,
}
