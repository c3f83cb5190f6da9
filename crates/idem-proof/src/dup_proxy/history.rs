//! `--history`: every exchange written down in the history format of
//! [`idem_check::history`], so `idem check` (or any reader of the format) can
//! look for double effects and replays that differ.
//!
//! Each request the proxy forwards is an operation of process `dup-proxy`:
//! an `invoke` (the key as the upstream reads it — an RFC 8941 String
//! unquoted —, the hex BLAKE3 of the body as its fingerprint, the method and
//! path), then its completion:
//!
//! | what came back | event |
//! |---|---|
//! | 1xx, 2xx, 3xx | `ok`, with the status, the hex BLAKE3 of the body and `replayed` (`Idempotent-Replayed: true`) |
//! | 4xx | `fail`, with the answer: the request was refused |
//! | 5xx | `unknown`: the upstream may have applied the request before it failed |
//! | no connection (nothing sent) | `fail`, without an answer |
//! | a timeout, a connection broken after sending | `unknown` |
//!
//! A copy is an operation of its own, marked `duplicate_of` the original's.
//! A body too large to hold is streamed, and its `invoke` has no fingerprint.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use idem_check::history::{Answer, Event, Request, Writer};

use super::send::Reply;

/// The process name every event carries.
const PROCESS: &str = "dup-proxy";

/// What an `invoke` says about the request.
#[derive(Debug, Clone)]
pub(crate) struct Asked<'a> {
    pub(crate) key: Option<&'a str>,
    pub(crate) body: Option<&'a [u8]>,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
}

/// The history file, one event per line, flushed after each.
#[derive(Debug)]
pub(crate) struct History {
    writer: Mutex<Writer<BufWriter<File>>>,
}

impl History {
    /// Creates (or truncates) the file at `path`.
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        let file = File::create(path)?;
        Ok(Self {
            writer: Mutex::new(Writer::new(BufWriter::new(file))),
        })
    }

    /// Writes the `invoke` of operation `op`.
    pub(crate) fn invoke(&self, op: u64, asked: &Asked<'_>, duplicate_of: Option<u64>) {
        self.write(&Event::Invoke {
            op,
            process: PROCESS.to_owned(),
            at_ms: now_ms(),
            scope: None,
            key: asked.key.map(str::to_owned),
            fingerprint: asked
                .body
                .map(|body| blake3::hash(body).to_hex().to_string()),
            request: Some(Request {
                method: asked.method.to_owned(),
                path: asked.path.to_owned(),
            }),
            duplicate_of,
        });
    }

    /// Writes the completion of operation `op`, as `reply` ended.
    pub(crate) fn complete(&self, op: u64, reply: &Reply) {
        let process = PROCESS.to_owned();
        let at_ms = now_ms();
        let event = match reply {
            Reply::Failed(failure) if failure.was_sent() => Event::Unknown {
                op,
                process,
                at_ms,
                error: failure.to_string(),
            },
            Reply::Failed(failure) => Event::Fail {
                op,
                process,
                at_ms,
                answer: None,
                error: failure.to_string(),
            },
            Reply::Whole(parts, body) => {
                let answer = Answer {
                    status: parts.status.as_u16(),
                    body_hash: Some(blake3::hash(body).to_hex().to_string()),
                    replayed: super::send::replayed(&parts.headers),
                };
                completion(op, answer)
            }
            Reply::Streaming(response) => completion(
                op,
                Answer {
                    status: response.status().as_u16(),
                    body_hash: None,
                    replayed: super::send::replayed(response.headers()),
                },
            ),
        };
        self.write(&event);
    }

    fn write(&self, event: &Event) {
        let mut writer = self
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(error) = writer.write(event) {
            tracing::warn!(%error, op = event.op(), "could not write to the history");
        }
    }
}

/// The event for an answer: `ok` below 400, `fail` for a 4xx, `unknown` for
/// a 5xx.
fn completion(op: u64, answer: Answer) -> Event {
    let process = PROCESS.to_owned();
    let at_ms = now_ms();
    match answer.status {
        ..400 => Event::Ok {
            op,
            process,
            at_ms,
            answer,
        },
        400..500 => Event::Fail {
            op,
            process,
            at_ms,
            error: format!("answered {}", answer.status),
            answer: Some(answer),
        },
        _ => Event::Unknown {
            op,
            process,
            at_ms,
            error: format!(
                "answered {} after the request was sent: it may have been applied",
                answer.status
            ),
        },
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}
