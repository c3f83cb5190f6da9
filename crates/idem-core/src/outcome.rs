//! The stored outcome: what the first execution returned, replayed byte for byte
//! to every duplicate.
//!
//! An outcome is opaque bytes plus a small string map, so each front end keeps
//! what it needs without the core knowing about it: HTTP keeps status and headers
//! in the map and the body in the bytes; a message consumer keeps a JSON result.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Whether the stored outcome is a success or a terminal failure. Both are
/// replayed; only the record state differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// The effect was applied.
    Success,
    /// The effect failed in a way a retry cannot fix (for example a declined card);
    /// the failure itself is the answer every duplicate gets.
    TerminalFailure,
}

impl OutcomeKind {
    /// Both kinds.
    pub const ALL: [OutcomeKind; 2] = [Self::Success, Self::TerminalFailure];

    /// The text stored in the database (`success`, `terminal_failure`) and shown
    /// to people.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::TerminalFailure => "terminal_failure",
        }
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An outcome kind name that is not one of `success`, `terminal_failure`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown outcome kind {0:?}: expected one of success, terminal_failure")]
pub struct UnknownOutcomeKind(pub String);

impl FromStr for OutcomeKind {
    type Err = UnknownOutcomeKind;
    fn from_str(s: &str) -> Result<Self, UnknownOutcomeKind> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownOutcomeKind(s.to_owned()))
    }
}

/// Bytes plus metadata, stored with the record when it completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Success or terminal failure.
    pub kind: OutcomeKind,
    /// The response body, message result or any other payload.
    pub body: Vec<u8>,
    /// Small string metadata (HTTP status and headers, content type, ...).
    pub meta: BTreeMap<String, String>,
}

impl Outcome {
    /// A successful outcome carrying `body`.
    pub fn success(body: impl Into<Vec<u8>>) -> Self {
        Self {
            kind: OutcomeKind::Success,
            body: body.into(),
            meta: BTreeMap::new(),
        }
    }

    /// A terminal failure carrying `body`; stored and replayed like a success.
    pub fn terminal_failure(body: impl Into<Vec<u8>>) -> Self {
        Self {
            kind: OutcomeKind::TerminalFailure,
            body: body.into(),
            meta: BTreeMap::new(),
        }
    }

    /// An empty success.
    pub fn empty() -> Self {
        Self::success(Vec::new())
    }

    /// Adds one metadata entry.
    pub fn with_meta(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.meta.insert(name.into(), value.into());
        self
    }

    /// Whether this is a terminal failure.
    pub fn is_failure(&self) -> bool {
        self.kind == OutcomeKind::TerminalFailure
    }

    /// The metadata as JSON text, the form stores keep it in.
    pub fn meta_json(&self) -> String {
        serde_json::to_string(&self.meta).expect("a string map always serializes")
    }

    /// Parses metadata written by [`Outcome::meta_json`].
    pub fn parse_meta(text: &str) -> Result<BTreeMap<String, String>, serde_json::Error> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_text() {
        for kind in OutcomeKind::ALL {
            assert_eq!(kind.as_str().parse::<OutcomeKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert_eq!(OutcomeKind::Success.as_str(), "success");
        assert_eq!(OutcomeKind::TerminalFailure.as_str(), "terminal_failure");
    }

    #[test]
    fn an_unknown_kind_names_the_expected_ones() {
        for text in ["ok", "Success", "", "terminal-failure"] {
            let error = text.parse::<OutcomeKind>().unwrap_err();
            assert_eq!(error, UnknownOutcomeKind(text.to_owned()));
            let message = error.to_string();
            assert!(
                message.contains("success") && message.contains("terminal_failure"),
                "{message}"
            );
        }
    }
}
