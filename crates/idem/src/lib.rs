//! Idem: delivery at-least-once, processing effectively-once by idempotency
//! keys, within a dedupe window (7 days by default).
//!
//! This is the crate applications depend on. It re-exports the protocol types
//! from `idem-core` (the root: what an application writes) and, by feature, the stores:
//! - `sqlite` (default): `SqliteStore`, embedded, zero set-up;
//! - `postgres`: `PgStore`, shared by many processes and machines;
//! - `redis`: `RedisStore`, leased mode on Redis (`redis-cluster`: on Redis Cluster too);
//! - `dynamodb`: `DynamoStore`, leased mode on DynamoDB, and atomic mode for
//!   effects that are DynamoDB writes.
//!
//! Modules:
//! - [`StoreLocation`]: `sqlite://PATH` / `postgres://URL` / `redis://HOST:PORT/DB` /
//!   `dynamodb:///TABLE` parsing;
//! - [`AnyStore`]: a store chosen at run time, behind the shared traits, and
//!   [`AnyTx`], the connection its atomic effects get;
//! - [`redact_url`]: a URL with its password and query removed, for logs and errors;
//! - [`Sweeper`]: retention that runs itself, a task deleting expired records;
//! - [`protocol`]: the decision table and the pieces a store implementation
//!   needs (not what an application writes);
//! - [`crash`], [`health`], [`observe`]: named crash points (`IDEM_CRASH`),
//!   the process's connections for `/healthz`, and the protocol's metrics.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope, SqliteStore};
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("idem.db")).await?;
//! let (scope, key) = (Scope::new("payments")?, IdempotencyKey::new("pay-1")?);
//! let applied = store
//!     .apply(&scope, &key, Fingerprint::of_bytes(b"10 EUR"), async |tx| -> idem::rusqlite::Result<Outcome> {
//!         tx.execute_batch("CREATE TABLE IF NOT EXISTS t (x INTEGER); INSERT INTO t VALUES (1);")?;
//!         Ok(Outcome::success("paid"))
//!     })
//!     .await?;
//! assert!(!applied.is_replay());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod any;
mod location;
pub mod protocol;
pub mod sweeper;

pub use any::{AnyConnection, AnyStore, AnyTx};
// What an application writes: keys, payloads and results.
pub use idem_core::{
    Fingerprint, FingerprintError, FingerprintMatch, FingerprintRule, FingerprintRuleError,
    IDEMPOTENCY_KEY_HEADER, IdempotencyKey, KeyError, MAX_KEY_LEN, Outcome, OutcomeKind, Scope,
    UnknownOutcomeKind,
};
// The effect and its record committed together; the leased protocol for
// effects the store cannot see.
pub use idem_core::{
    Applied, AtomicEffect, AtomicStore, BatchApplied, Claim, Claimed, FencingToken, LeaseStore,
    Operation, Replay, SetApplied,
};
// Records: inspection, retention and their settings; time.
pub use idem_core::{
    Clock, DEFAULT_LEASE, DEFAULT_RETENTION, ManualClock, Record, RecordCount, RecordCursor,
    RecordFilter, RecordGlance, RecordState, RecordStore, Settings, SharedClock, SystemClock,
    Timestamp,
};
// Bounded pages of records, for a process that walks them all (the effect auditor).
pub use idem_core::{ExpiryPosition, RecordScan};
// Errors.
pub use idem_core::{ApplyError, Error, ErrorKind, StoreError, error_chain};
// The outbox, dead letters and failed attempts per message.
pub use idem_core::{
    AtomicOutbox, AttemptStore, DeadLetter, DeadLetterStats, DeadLetterStore, Failures,
    NewDeadLetter, OutboxMessage, OutboxStats, OutboxStore, Pending, SentMessage, WakeUps,
};
// What operators change by hand, and the audit log that keeps it.
pub use idem_core::{
    AdminStore, AuditAction, AuditEntry, AuditSubject, LetterAction, NewAuditEntry, RecordAction,
    UnknownAction, dead_letter_json, is_held, record_json, unchanged,
};
// Fencing tokens on named resources, and guarded writes.
pub use idem_core::redact_url;
pub use idem_core::{FenceStore, Guard, GuardOrdering, IdentifierError, Lease, Resource};
pub use idem_core::{crash, health, observe};
pub use location::{LocationError, StoreLocation};
pub use sweeper::{SweepPass, Sweeper, SweeperTask};

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use idem_sqlite::{self as sqlite, SqliteStore, rusqlite};

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use idem_postgres::{self as postgres, PgStore, sqlx};

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use idem_redis::{self as redis, Durability, RedisStore};

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use idem_dynamodb::{self as dynamodb, DynamoStore};
