//! What the auditor reports: a double effect, a missing effect, an effect
//! without a record, each with the rows and the record involved, for people
//! ([`Display`](fmt::Display)) and as one JSON object per line.

use std::fmt;

use idem_core::Record;
use serde::Serialize;

use crate::effects::LoggedEffect;

/// Which rule a finding breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// One key, two or more effects inside its dedupe window.
    DoubleEffect,
    /// A completed record whose effect the log does not hold, a grace
    /// period after the record completed.
    MissingEffect,
    /// An effect of an audited scope whose key has no record.
    EffectWithoutRecord,
}

impl FindingKind {
    /// Every kind, in the order the auditor checks them.
    pub const ALL: [FindingKind; 3] = [
        Self::DoubleEffect,
        Self::MissingEffect,
        Self::EffectWithoutRecord,
    ];

    /// The name in logs, JSON and the `kind` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DoubleEffect => "double_effect",
            Self::MissingEffect => "missing_effect",
            Self::EffectWithoutRecord => "effect_without_record",
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A record as a finding shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordSeen {
    /// `in_flight`, `completed` or `failed`.
    pub state: &'static str,
    /// Its fencing token.
    pub token: i64,
    /// When the key was first claimed (milliseconds since the Unix epoch).
    pub created_at_ms: i64,
    /// When it last changed.
    pub updated_at_ms: i64,
    /// When its window ends.
    pub expires_at_ms: i64,
}

impl From<&Record> for RecordSeen {
    fn from(record: &Record) -> Self {
        Self {
            state: record.state.as_str(),
            token: record.token.get(),
            created_at_ms: record.created_at.0,
            updated_at_ms: record.updated_at.0,
            expires_at_ms: record.expires_at.0,
        }
    }
}

/// One thing that must never happen, found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which rule.
    pub kind: FindingKind,
    /// The key's scope, when the effect log or the record names one.
    pub scope: Option<String>,
    /// The key.
    pub key: String,
    /// The effect rows involved: for a double effect, the key's first effect
    /// in its window and the one that repeated it; for an effect without a
    /// record, that effect; none for a missing effect.
    pub effects: Vec<LoggedEffect>,
    /// For a double effect, how many effects the key has had in its window
    /// so far (2 for the first repeat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// The key's record, where one was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordSeen>,
    /// When the auditor found it (milliseconds since the Unix epoch).
    pub found_at_ms: i64,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scope = self.scope.as_deref().unwrap_or("(none)");
        let rows = self
            .effects
            .iter()
            .map(|e| e.cursor.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        match self.kind {
            FindingKind::DoubleEffect => write!(
                f,
                "double effect: key {:?} in scope {scope:?} has {} effects within its window (rows {rows})",
                self.key,
                self.count.unwrap_or(2),
            ),
            FindingKind::MissingEffect => {
                write!(
                    f,
                    "missing effect: key {:?} in scope {scope:?} has a completed record and no effect in the log",
                    self.key
                )?;
                if let Some(record) = &self.record {
                    write!(
                        f,
                        " (claimed at {} ms, completed at {} ms, token {})",
                        record.created_at_ms, record.updated_at_ms, record.token
                    )?;
                }
                Ok(())
            }
            FindingKind::EffectWithoutRecord => write!(
                f,
                "effect without record: key {:?} in scope {scope:?} has an effect (row {rows}) and no record",
                self.key
            ),
        }
    }
}
