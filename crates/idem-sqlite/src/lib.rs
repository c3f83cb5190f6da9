//! The embedded SQLite store for Idem: zero set-up, one process, durable by
//! default.
//!
//! # Modules
//!
//! The parts that both stores have are in files of the same names as in
//! `idem-postgres`:
//!
//! - `store`: [`SqliteStore`] and [`SqliteStoreBuilder`]: opening the file,
//!   settings, clock, and the helpers every protocol path shares;
//! - `atomic`: [`AtomicStore`](idem_core::AtomicStore) — `apply`,
//!   `complete_with`, `transaction` — the effect and the record in one transaction;
//! - `batch`: `apply_batch` and `apply_set`, N operations, one transaction;
//! - `leased`: [`LeaseStore`](idem_core::LeaseStore) (claim, renew, complete,
//!   release) and the leased completion with a database effect;
//! - `inspect`: [`RecordStore`](idem_core::RecordStore): migrations, listing, counting, sweeping;
//! - `decision`: the reader's early answer and the writer's read-and-decide every claim path shares;
//! - `records`: every statement on the `idem_records` table;
//! - `fences`: fencing-token leases ([`FenceStore`](idem_core::FenceStore)) and
//!   [`SqliteStore::advance`], the guarded write on the application's own tables;
//! - `outbox`: the transactional outbox (`idem_outbox`), enqueue and relay statements;
//! - `dead_letters`: dead letters (`idem_dead_letters`);
//! - `admin`: what operators change by hand ([`AdminStore`](idem_core::AdminStore)),
//!   each change and its row in the audit log (`idem_audit`) in one transaction;
//! - `attempts`: consumers' failed attempts (`idem_consumer_attempts`);
//! - `headers`: message headers as the JSON text the outbox and dead letters keep;
//! - `seed`: test and benchmark hooks on the records table (bulk records, statistics, size);
//! - `error`: SQLite error codes mapped to [`ErrorKind`](idem_core::ErrorKind),
//!   public as [`map_error`] for code that runs its own SQL on the store's connection.
//!
//! And the parts only SQLite has:
//!
//! - `connection`: the writer thread and reader connections that keep SQLite off
//!   the async runtime (WAL, `BEGIN IMMEDIATE`, busy timeout, `synchronous=FULL`);
//! - `lease_writes`: leased claims and completions as jobs the writer decides
//!   and writes many to a transaction, without a savepoint each;
//! - `write_tx`: the writer's `BEGIN IMMEDIATE` transaction, handed to effects as the connection;
//! - `holds`: in-process try-locks that answer concurrent duplicates at once;
//! - `schema`: migrations of every table above, versioned by `PRAGMA user_version`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod admit;
mod atomic;
mod attempts;
mod batch;
mod connection;
mod dead_letters;
mod decision;
mod error;
mod fences;
mod headers;
mod holds;
mod inspect;
mod lease_writes;
mod leased;
mod outbox;
mod records;
mod schema;
mod seed;
mod store;
mod write_tx;

pub use connection::Synchronous;
pub use error::map_error;
pub use rusqlite;
pub use schema::SCHEMA_VERSION;
pub use store::{SqliteStore, SqliteStoreBuilder};
