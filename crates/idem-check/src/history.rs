//! The history format: JSON Lines, one [`Event`] per line, in the order the
//! events happened.
//!
//! An operation is one logical request with one idempotency key, however many
//! times it is sent. Its first line is an `invoke`; its last is the outcome
//! its client saw:
//!
//! - `ok`: the client was told it succeeded (a 2xx, an ack);
//! - `fail`: the client was told it did not happen (a 4xx refusal, a
//!   connection refused before anything was sent);
//! - `unknown`: the client cannot tell (a timeout, a reset after sending).
//!
//! Retries of one operation share its `op` number and key; each attempt may
//! be recorded with its own `invoke`, and the operation's outcome is its last
//! completion. Duplicates sent on purpose (by `idem dup-proxy`) are separate
//! operations with the same key, marked `duplicate_of`.
//!
//! ```json
//! {"type":"invoke","op":17,"process":"client-3","at_ms":1764734400123,"scope":"payments","key":"order-42","fingerprint":"9f2c…","request":{"method":"POST","path":"/payments"}}
//! {"type":"ok","op":17,"process":"client-3","at_ms":1764734400131,"answer":{"status":201,"body_hash":"5e1d…","replayed":false}}
//! ```

use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// An operation (or one attempt of it) was sent.
    Invoke {
        /// The operation's number, unique in the history.
        op: u64,
        /// Who sent it: a client, a proxy, a worker.
        process: String,
        /// When, in milliseconds since the Unix epoch.
        at_ms: i64,
        /// The key's scope, when the system scopes keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
        /// The idempotency key; `None` for a request sent without one.
        key: Option<String>,
        /// A hash of the payload (hex), to tell a retry from a key reuse.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fingerprint: Option<String>,
        /// What was asked, for the report (method and path, a subject).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<Request>,
        /// This operation is a copy of operation `duplicate_of`, sent on purpose.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duplicate_of: Option<u64>,
    },
    /// The client was told the operation succeeded.
    Ok {
        /// The operation's number.
        op: u64,
        /// Who was told.
        process: String,
        /// When.
        at_ms: i64,
        /// What it was told.
        answer: Answer,
    },
    /// The client was told the operation did not happen.
    Fail {
        /// The operation's number.
        op: u64,
        /// Who was told.
        process: String,
        /// When.
        at_ms: i64,
        /// The answer, when there was one (a 4xx), for the report.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<Answer>,
        /// Why, in words.
        error: String,
    },
    /// The client cannot tell whether the operation happened.
    Unknown {
        /// The operation's number.
        op: u64,
        /// Who is left wondering.
        process: String,
        /// When.
        at_ms: i64,
        /// Why, in words (a timeout, a reset).
        error: String,
    },
}

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The HTTP method, or the broker's verb (`publish`).
    pub method: String,
    /// The path, subject or queue.
    pub path: String,
}

/// What a client was told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The HTTP status (200 for an ack).
    pub status: u16,
    /// A hash of the body (hex), compared between an original and its replays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_hash: Option<String>,
    /// The answer was a replay of a stored one (`Idempotent-Replayed: true`).
    #[serde(default)]
    pub replayed: bool,
}

impl Event {
    /// The operation the event belongs to.
    pub fn op(&self) -> u64 {
        match self {
            Self::Invoke { op, .. }
            | Self::Ok { op, .. }
            | Self::Fail { op, .. }
            | Self::Unknown { op, .. } => *op,
        }
    }
}

/// A line that is not an [`Event`].
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be read.
    #[error("cannot read the history: {0}")]
    Io(#[from] io::Error),
    /// A line is not an event.
    #[error(
        "line {line} of the history is not an event ({error}); each line is one JSON object with \"type\": invoke, ok, fail or unknown"
    )]
    Line {
        /// 1-based.
        line: usize,
        /// What the parser said.
        error: serde_json::Error,
    },
}

/// Reads every event of a JSON Lines history; blank lines are skipped.
pub fn read(input: impl BufRead) -> Result<Vec<Event>, ReadError> {
    let mut events = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|error| ReadError::Line {
            line: index + 1,
            error,
        })?;
        events.push(event);
    }
    Ok(events)
}

/// A history whose events do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// An answer for an operation with no `invoke` before it.
    #[error(
        "event {event} of the history answers op {op}, which was never invoked before it; every operation starts with an \"invoke\""
    )]
    NotInvoked {
        /// 1-based, counting events (blank lines are not events).
        event: usize,
        /// The operation.
        op: u64,
    },
}

/// Checks that every answer follows an `invoke` of its operation.
pub fn validate(events: &[Event]) -> Result<(), ShapeError> {
    let mut invoked = std::collections::HashSet::new();
    for (index, event) in events.iter().enumerate() {
        match event {
            Event::Invoke { op, .. } => {
                invoked.insert(*op);
            }
            other if !invoked.contains(&other.op()) => {
                return Err(ShapeError::NotInvoked {
                    event: index + 1,
                    op: other.op(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes events as JSON Lines, one per line, flushing after each so a
/// history survives its writer being killed.
#[derive(Debug)]
pub struct Writer<W> {
    out: W,
}

impl<W: Write> Writer<W> {
    /// A writer to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// Appends one event.
    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, event)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_back_as_written() {
        let events = vec![
            Event::Invoke {
                op: 1,
                process: "client-1".into(),
                at_ms: 10,
                scope: Some("payments".into()),
                key: Some("order-1".into()),
                fingerprint: Some("ab".into()),
                request: Some(Request {
                    method: "POST".into(),
                    path: "/payments".into(),
                }),
                duplicate_of: None,
            },
            Event::Ok {
                op: 1,
                process: "client-1".into(),
                at_ms: 12,
                answer: Answer {
                    status: 201,
                    body_hash: Some("cd".into()),
                    replayed: false,
                },
            },
            Event::Unknown {
                op: 2,
                process: "client-2".into(),
                at_ms: 13,
                error: "timed out".into(),
            },
        ];
        let mut bytes = Vec::new();
        let mut writer = Writer::new(&mut bytes);
        for event in &events {
            writer.write(event).unwrap();
        }
        assert_eq!(read(bytes.as_slice()).unwrap(), events);
    }

    #[test]
    fn a_bad_line_is_named() {
        let text = "{\"type\":\"unknown\",\"op\":1,\"process\":\"c\",\"at_ms\":1,\"error\":\"x\"}\n\n{\"type\":\"maybe\"}\n";
        let error = read(text.as_bytes()).unwrap_err().to_string();
        assert!(error.starts_with("line 3 of the history"), "{error}");
    }
}
