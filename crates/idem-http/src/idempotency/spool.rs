//! [`Spool`]: a small local file that keeps the answers the store could not
//! take yet, so an answer handed to a client is never lost with the process.
//!
//! # Why a file next to the store
//!
//! When the upstream has answered and the store refuses the completion (the
//! database restarts, the network blinks), the answer exists only in this
//! process. Retrying the completion in memory covers a short outage; a
//! process that dies meanwhile would take the answer with it, and a retry of
//! the request after the lease would run the effect again. So, before such an
//! answer goes to its client, it is appended to the spool and the file is
//! synced. The completion is retried in the background; once stored, the
//! entry is marked done. At start-up the layer's owner calls
//! [`IdempotencyLayer::flush_spool`](crate::IdempotencyLayer::flush_spool)
//! before serving: every entry left is completed with the claim's fencing
//! token (a claim taken over meanwhile is fenced, and its entry dropped).
//!
//! # Format
//!
//! JSON lines, appended: `{"kept":N, "scope", "key", "token", "lease_until",
//! "took_over", "kind", "meta", "body"}` (the body in hex) for an answer
//! kept, `{"stored":N}` once it is in the store. The file is emptied
//! whenever no entry is pending, so it stays small. A last line cut short by
//! a crash during its write is ignored: its answer was never handed out
//! (the write is synced before the answer is sent). The file is locked while
//! a spool is open, so two processes never share one.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use idem_core::{Claim, FencingToken, IdempotencyKey, Outcome, OutcomeKind, Scope, Timestamp};
use serde::{Deserialize, Serialize};

/// Why a spool cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// Reading, writing or syncing the file failed.
    #[error("the answer spool {path} cannot be used: {source}")]
    Io {
        /// The spool's path.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the file.
    #[error(
        "the answer spool {path} is in use by another process: give each gateway a spool of its own (--spool PATH)"
    )]
    Locked {
        /// The spool's path.
        path: PathBuf,
    },
    /// A line in the middle of the file cannot be read.
    #[error(
        "line {line} of the answer spool {path} cannot be read ({reason}); move the file away to start without it (the answers it keeps are then not stored)"
    )]
    Damaged {
        /// The spool's path.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// One spooled answer: the claim it completes and the outcome to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spooled {
    pub(crate) id: u64,
    pub(crate) claim: Claim,
    pub(crate) outcome: Outcome,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Kept(Kept),
    Stored { stored: u64 },
}

#[derive(Serialize, Deserialize)]
struct Kept {
    kept: u64,
    scope: String,
    key: String,
    token: i64,
    lease_until: i64,
    took_over: bool,
    /// The end of the key's window; absent from lines written before it was
    /// kept (0: the epoch, which only the expiry header shows).
    #[serde(default)]
    expires_at: i64,
    kind: String,
    meta: BTreeMap<String, String>,
    body: String,
}

impl Kept {
    fn of(entry: &Spooled) -> Self {
        Self {
            kept: entry.id,
            scope: entry.claim.scope.as_str().to_owned(),
            key: entry.claim.key.as_str().to_owned(),
            token: entry.claim.token.get(),
            lease_until: entry.claim.lease_until.0,
            took_over: entry.claim.took_over,
            expires_at: entry.claim.expires_at.0,
            kind: entry.outcome.kind.as_str().to_owned(),
            meta: entry.outcome.meta.clone(),
            body: to_hex(&entry.outcome.body),
        }
    }

    fn into_entry(self) -> Result<Spooled, String> {
        let scope = Scope::new(self.scope).map_err(|e| e.to_string())?;
        let key = IdempotencyKey::new(self.key).map_err(|e| e.to_string())?;
        let token = FencingToken::new(self.token).ok_or("the token is not positive")?;
        let kind = OutcomeKind::from_str(&self.kind).map_err(|e| e.to_string())?;
        let body = from_hex(&self.body).ok_or("the body is not hex")?;
        Ok(Spooled {
            id: self.kept,
            claim: Claim {
                scope,
                key,
                token,
                lease_until: Timestamp(self.lease_until),
                took_over: self.took_over,
                expires_at: Timestamp(self.expires_at),
            },
            outcome: Outcome {
                kind,
                body,
                meta: self.meta,
            },
        })
    }
}

/// The local file of answers not yet stored. Cheap to clone: clones share
/// the file.
///
/// ```
/// use idem_http::Spool;
///
/// let dir = tempfile::tempdir()?;
/// let spool = Spool::open(dir.path().join("answers.spool"))?;
/// assert_eq!(spool.pending(), 0);
/// // A second process (or a second open) cannot share it.
/// assert!(Spool::open(dir.path().join("answers.spool")).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    file: File,
    next: u64,
    pending: HashMap<u64, Spooled>,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("path", &self.inner.path)
            .field("pending", &self.pending())
            .finish()
    }
}

impl Spool {
    /// Opens (or creates, with its directory) the spool at `path`, locks it,
    /// and reads the answers it still keeps.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, SpoolError> {
        let path = path.into();
        let io = |source| SpoolError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(SpoolError::Locked { path }),
            Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
        }
        let (pending, next) = read_entries(&path)?;
        let spool = Self {
            inner: Arc::new(Inner {
                path,
                state: Mutex::new(State {
                    file,
                    next,
                    pending,
                }),
            }),
        };
        if spool.pending() == 0 {
            // Nothing kept: start from an empty file (a torn line goes too).
            let emptied = spool.state().file.set_len(0);
            emptied.map_err(|e| spool.io(e))?;
        }
        Ok(spool)
    }

    /// Where the spool is.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How many answers wait for the store.
    pub fn pending(&self) -> usize {
        self.state().pending.len()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves the file as it was written.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answers waiting for the store, oldest first.
    pub(crate) fn unsettled(&self) -> Vec<Spooled> {
        let mut entries: Vec<Spooled> = self.state().pending.values().cloned().collect();
        entries.sort_by_key(|e| e.id);
        entries
    }

    /// Appends an answer (the outcome `claim` is to be completed with) and
    /// syncs the file; the answer may go out once this returns. Returns the
    /// entry's id for [`stored`](Self::stored). Any front end's outcome can
    /// be kept: the gRPC layer keeps its answers here too.
    pub async fn keep(&self, claim: &Claim, outcome: &Outcome) -> Result<u64, SpoolError> {
        let spool = self.clone();
        let (claim, outcome) = (claim.clone(), outcome.clone());
        tokio::task::spawn_blocking(move || spool.keep_now(claim, outcome))
            .await
            .unwrap_or_else(|joined| Err(self.io(std::io::Error::other(joined))))
    }

    fn keep_now(&self, claim: Claim, outcome: Outcome) -> Result<u64, SpoolError> {
        let mut state = self.state();
        let entry = Spooled {
            id: state.next,
            claim,
            outcome,
        };
        let mut line = serde_json::to_vec(&Line::Kept(Kept::of(&entry)))
            .expect("a spool line always serializes");
        line.push(b'\n');
        state.file.write_all(&line).map_err(|e| self.io(e))?;
        state.file.sync_data().map_err(|e| self.io(e))?;
        state.next += 1;
        let id = entry.id;
        state.pending.insert(id, entry);
        Ok(id)
    }

    /// Marks an answer stored. Not synced: an entry whose mark is lost is
    /// completed again at start-up, which the store answers as already done.
    pub async fn stored(&self, id: u64) -> Result<(), SpoolError> {
        let spool = self.clone();
        tokio::task::spawn_blocking(move || spool.stored_now(id))
            .await
            .unwrap_or_else(|joined| Err(self.io(std::io::Error::other(joined))))
    }

    fn stored_now(&self, id: u64) -> Result<(), SpoolError> {
        let mut state = self.state();
        if state.pending.remove(&id).is_none() {
            return Ok(());
        }
        if state.pending.is_empty() {
            return state.file.set_len(0).map_err(|e| self.io(e));
        }
        let mut line = serde_json::to_vec(&Line::Stored { stored: id })
            .expect("a spool line always serializes");
        line.push(b'\n');
        state.file.write_all(&line).map_err(|e| self.io(e))
    }

    fn io(&self, source: std::io::Error) -> SpoolError {
        SpoolError::Io {
            path: self.inner.path.clone(),
            source,
        }
    }
}

/// The entries kept and not marked stored, and the next free id.
fn read_entries(path: &Path) -> Result<(HashMap<u64, Spooled>, u64), SpoolError> {
    let mut pending = HashMap::new();
    let mut next = 0;
    let bytes = std::fs::read(path).map_err(|source| SpoolError::Io {
        path: path.to_owned(),
        source,
    })?;
    let ends_whole = bytes.last().is_none_or(|last| *last == b'\n');
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let count = lines.len();
    for (i, line) in lines.into_iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        let torn = i + 1 == count && !ends_whole;
        let parsed = serde_json::from_slice::<Line>(line)
            .map_err(|e| e.to_string())
            .and_then(|line| match line {
                Line::Kept(kept) => kept.into_entry().map(Some),
                Line::Stored { stored } => {
                    pending.remove(&stored);
                    Ok(None)
                }
            });
        match parsed {
            Ok(Some(entry)) => {
                next = next.max(entry.id + 1);
                pending.insert(entry.id, entry);
            }
            Ok(None) => {}
            Err(_) if torn => {
                tracing::warn!(spool = %path.display(), "the spool's last line was cut short by a crash while it was written; its answer was never sent, so it is dropped");
            }
            Err(reason) => {
                return Err(SpoolError::Damaged {
                    path: path.to_owned(),
                    line: i + 1,
                    reason,
                });
            }
        }
    }
    Ok((pending, next))
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    text
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, token: i64) -> Claim {
        Claim {
            scope: Scope::new("POST:/pay").unwrap(),
            key: IdempotencyKey::new(key).unwrap(),
            token: FencingToken::new(token).unwrap(),
            lease_until: Timestamp(1_000),
            took_over: false,
            expires_at: Timestamp(9_000),
        }
    }

    #[tokio::test]
    async fn kept_answers_survive_a_reopen_until_marked_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let spool = Spool::open(&path).unwrap();
        let mut outcome = Outcome::success(vec![0, 1, 0xfe, b'{']);
        outcome.meta.insert("status".into(), "201".into());
        let a = spool.keep(&claim("a", 7), &outcome).await.unwrap();
        let b = spool
            .keep(&claim("b", 9), &Outcome::terminal_failure("no"))
            .await
            .unwrap();
        spool.stored(a).await.unwrap();
        drop(spool);

        let again = Spool::open(&path).unwrap();
        let left = again.unsettled();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, b);
        assert_eq!(left[0].claim, claim("b", 9));
        assert_eq!(left[0].outcome, Outcome::terminal_failure("no"));
        let c = again.keep(&claim("c", 3), &outcome).await.unwrap();
        assert!(c > b, "ids are not reused");
        again.stored(b).await.unwrap();
        again.stored(c).await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "emptied");
    }

    #[tokio::test]
    async fn a_torn_last_line_is_dropped_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool");
        let spool = Spool::open(&path).unwrap();
        spool
            .keep(&claim("a", 7), &Outcome::success("ok"))
            .await
            .unwrap();
        drop(spool);
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"kept\":1,\"sco").unwrap();
        drop(file);
        let reopened = Spool::open(&path).unwrap();
        assert_eq!(reopened.pending(), 1);
        drop(reopened);

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("not json\n{text}\n")).unwrap();
        let error = Spool::open(&path).unwrap_err().to_string();
        assert!(
            error.contains("line 1") && error.contains("move the file away"),
            "{error}"
        );
    }

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert!(from_hex("abc").is_none() && from_hex("zz").is_none());
    }
}
