//! The heart of Idem: apply an effect once per idempotency key, however many
//! times the request or message carrying it is delivered.
//!
//! Delivery is at-least-once; processing is effectively-once by idempotency keys,
//! within a dedupe window (7 days by default). This crate holds the protocol and
//! its types; it has no database drivers and does no I/O. The stores live in
//! crates of their own: `idem-sqlite` (embedded, the default) and
//! `idem-postgres` implement every store contract below; `idem-redis` the
//! leased contract ([`LeaseStore`]), with attempts, dead letters and the
//! operator's changes, on Redis or Redis Cluster; `idem-etcd` the fencing
//! tokens alone ([`FenceStore`]), etcd revisions as tokens.
//!
//! Modules:
//! - [`key`](crate::IdempotencyKey): validated keys and scopes, and the name of
//!   the header that carries a key ([`IDEMPOTENCY_KEY_HEADER`]);
//! - [`fingerprint`](crate::Fingerprint): payload hashes (RFC 8785 JSON or raw bytes);
//! - [`fingerprint_rule`](crate::FingerprintRule): which parts of a payload a
//!   fingerprint covers (JSON fields selected or ignored, headers added);
//! - [`outcome`](crate::Outcome): the stored result replayed to duplicates;
//! - [`record`](crate::Record): record states and fencing tokens;
//! - [`protocol`]: the decision table every store follows;
//! - [`batch`](crate::decide_batch): in-batch dedupe, which operations of a batch share a key;
//! - [`atomic`](crate::AtomicStore): the atomic contract, effect and record in one transaction;
//! - [`store`](crate::LeaseStore): the leased contract, and inspection and retention of records;
//! - [`scan`](crate::RecordScan): bounded pages of records for a process that walks them all;
//! - [`clock`](crate::Clock): injectable time;
//! - [`settings`](crate::Settings): lease and retention, with defaults;
//! - [`fence`](crate::FenceStore): fencing tokens on named resources and guarded (versioned) writes;
//! - [`outbox`](crate::OutboxStore): the transactional outbox, enqueued in the
//!   business transaction ([`AtomicOutbox`]) and claimed by relays;
//! - [`dead_letter`](crate::DeadLetterStore): messages given up on, kept with their key;
//! - [`admin`](crate::AdminStore): what an operator changes by hand (evict a key, end a
//!   stuck claim, discard or archive a dead letter), each logged in the audit log;
//! - [`attempts`](crate::AttemptStore): failed attempts per message, for consumers;
//! - [`error`](crate::Error): refusals and store failures;
//! - [`error_chain`]: an error and its causes on one line, for messages and logs;
//! - [`redact_url`]: a URL with its password and query removed, for logs and errors;
//! - [`health`]: whether the process's long-lived connections are up, for `/healthz`;
//! - [`observe`]: metrics and logs for protocol events;
//! - [`crash`]: named crash points a process can be made to abort at (`IDEM_CRASH`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod atomic;
mod attempts;
mod batch;
mod clock;
pub mod crash;
mod dead_letter;
mod error;
mod error_chain;
mod fence;
mod fingerprint;
mod fingerprint_rule;
pub mod health;
pub(crate) mod key;
pub mod observe;
mod outbox;
mod outcome;
pub mod protocol;
mod record;
mod redact;
mod scan;
mod settings;
mod store;

pub use admin::{
    AdminStore, AuditAction, AuditEntry, AuditSubject, LetterAction, NewAuditEntry, RecordAction,
    UnknownAction, dead_letter_json, is_held, record_json, unchanged,
};
pub use atomic::{
    AtomicEffect, AtomicStore, BatchApplied, SetApplied, TxCall, outcome_count_mismatch,
};
pub use attempts::{AttemptStore, Failures};
pub use batch::{BatchPlan, decide_batch};
pub use clock::{Clock, ManualClock, SharedClock, SystemClock, Timestamp};
pub use dead_letter::{
    DeadLetter, DeadLetterStats, DeadLetterStore, NewDeadLetter, no_such_dead_letter,
};
pub use error::{ApplyError, Error, ErrorKind, StoreError};
pub use error_chain::error_chain;
pub use fence::{FenceStore, Guard, IdentifierError, Lease, Ordering as GuardOrdering};
pub use fingerprint::{Fingerprint, FingerprintError};
pub use fingerprint_rule::{
    FingerprintMatch, FingerprintRule, FingerprintRuleError, RULE_MARK, RuleId,
};
pub use key::{IDEMPOTENCY_KEY_HEADER, IdempotencyKey, KeyError, MAX_KEY_LEN, Resource, Scope};
pub use outbox::{
    AtomicOutbox, OutboxMessage, OutboxStats, OutboxStore, Pending, SentMessage, WakeUps,
};
pub use outcome::{Outcome, OutcomeKind, UnknownOutcomeKind};
pub use protocol::{Decision, Plan, decide};
pub use record::{FencingToken, Record, RecordSeed, RecordState, UnknownState};
pub use redact::redact_url;
pub use scan::{ExpiryPosition, RecordScan};
pub use settings::{DEFAULT_LEASE, DEFAULT_RETENTION, Settings};
pub use store::{
    Applied, Claim, Claimed, LeaseStore, Operation, RecordCount, RecordCursor, RecordFilter,
    RecordGlance, RecordStore, Replay,
};
