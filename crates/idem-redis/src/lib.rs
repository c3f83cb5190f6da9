//! The Redis store for Idem's leased mode: claims, takeovers, renewals,
//! completions and releases kept in Redis (one node, or Redis Cluster behind
//! the `cluster` feature), each one atomic Lua step on the server.
//!
//! Redis holds the records, never the effect: an effect cannot commit in the
//! same step as its record, so this store offers the leased protocol
//! ([`LeaseStore`](idem_core::LeaseStore)), inspection
//! ([`RecordStore`](idem_core::RecordStore)), and what a consumer keeps
//! beside its records (failed attempts, dead letters), not the atomic mode or
//! the transactional outbox.
//!
//! # Modules
//!
//! - `store`: [`RedisStore`] and [`RedisStoreBuilder`]: URLs, connecting (one
//!   node through a connection manager, or a cluster), settings, clock, key prefix;
//! - `durability`: [`Durability`], the optional `WAIT` for replicas after each write;
//! - `names`: the Redis key of a record (one hash per key, its scope and key in a
//!   hash tag, so all of a record sits in one cluster slot);
//! - `scripts`: the Lua scripts (claim, change a held claim, sweep) and the
//!   answers they give;
//! - `record`: a record's hash fields read back into a [`Record`](idem_core::Record);
//! - `leased`: [`LeaseStore`](idem_core::LeaseStore) on those scripts;
//! - `inspect`: [`RecordStore`](idem_core::RecordStore): listing, counting, sweeping
//!   by scanning the prefix on every primary;
//! - `attempts`: [`AttemptStore`](idem_core::AttemptStore), a message's failed
//!   attempts, counted beside its record;
//! - `dead_letters`: [`DeadLetterStore`](idem_core::DeadLetterStore), the messages
//!   a consumer gave up on (`idem forward`, `idem dlq`);
//! - `admin`: [`AdminStore`](idem_core::AdminStore), what operators change by hand,
//!   and the audit log, a stream under the prefix;
//! - `error`: the one mapping of redis-rs errors to [`ErrorKind`](idem_core::ErrorKind).
//!
//! # How concurrent callers are kept apart
//!
//! Redis runs one script at a time, so each script's read and write of a
//! record is a single step no other client can interleave with: a
//! concurrent duplicate reads the first caller's in-flight record and is
//! answered `InFlight` at once. Times are the application's
//! [`Clock`](idem_core::Clock), passed to the scripts as arguments; the
//! server's clock only runs the retention expiry (`PEXPIRE`), relative to the
//! moment of the claim.
//!
//! # Tokens across windows
//!
//! A window's first token is [`FencingToken::first_at`](idem_core::FencingToken::first_at)
//! the window's start, as on every store, so a key claimed anew after its record
//! expired gets a token above every token of its earlier windows, although
//! Redis deleted the record in between.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
mod attempts;
mod dead_letters;
mod durability;
mod error;
mod inspect;
mod leased;
mod names;
mod record;
mod scripts;
mod store;

pub use durability::Durability;
pub use error::map_error;
pub use names::DEFAULT_PREFIX;
pub use store::{Connection, RedisStore, RedisStoreBuilder};

/// The redis-rs crate this store is built on, for callers that run their own
/// commands on [`RedisStore::connection`].
pub use redis;
