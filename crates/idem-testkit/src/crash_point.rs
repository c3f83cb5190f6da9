//! [`CrashPoint`]: where a crash test's child process stops, and [`reach`],
//! which an effect calls there. Apart from the crash tests themselves so the
//! harness's effects can stop at a point without depending on them.

use std::time::Duration;

/// The line the child prints when it reaches a point; the parent waits for it.
pub(crate) const MARKER: &str = "IDEM-CRASH-POINT";

/// Where the child stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Atomic mode: the key is held, the effect has not written yet.
    AfterClaim,
    /// Atomic mode: the effect wrote, the record and commit have not happened.
    InsideEffect,
    /// Atomic mode: committed, but the caller was never told (no ack).
    AfterCommit,
    /// Leased mode: the claim is committed, the effect never completes.
    LeasedAfterClaim,
    /// Leased mode, record after the effect: the effect outside the database
    /// happened, its record did not.
    LeasedEffectBeforeRecord,
    /// Leased mode, record before the effect (at most once): the record is
    /// committed, the effect never ran.
    LeasedRecordBeforeEffect,
}

impl CrashPoint {
    /// Every point.
    pub const ALL: [CrashPoint; 6] = [
        Self::AfterClaim,
        Self::InsideEffect,
        Self::AfterCommit,
        Self::LeasedAfterClaim,
        Self::LeasedEffectBeforeRecord,
        Self::LeasedRecordBeforeEffect,
    ];

    /// The point's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AfterClaim => "after-claim",
            Self::InsideEffect => "inside-effect",
            Self::AfterCommit => "after-commit",
            Self::LeasedAfterClaim => "leased-after-claim",
            Self::LeasedEffectBeforeRecord => "leased-effect-before-record",
            Self::LeasedRecordBeforeEffect => "leased-record-before-effect",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// Called by a test effect at `point`: announces it and waits to be killed.
pub fn reach(point: CrashPoint) -> ! {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{MARKER} {}", point.as_str());
    let _ = out.flush();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
