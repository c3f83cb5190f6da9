//! The embedded SQLite store for Idem: zero set-up, one process, durable by
//! default.
//!
//! Modules:
//! - [`store`](crate::SqliteStore): the protocol — atomic `apply`, `apply_batch`,
//!   the leased [`LeaseStore`](idem_core::LeaseStore) methods, inspection and sweep;
//! - `connection`: the writer thread and reader connections that keep SQLite off
//!   the async runtime (WAL, `BEGIN IMMEDIATE`, busy timeout, `synchronous=FULL`);
//! - `holds`: in-process try-locks that answer concurrent duplicates at once;
//! - `records`: every statement on the `idem_records` table;
//! - `fences`: fencing-token leases (`idem_fences`) and [`advance`], the guarded write;
//! - `outbox`: the transactional outbox (`idem_outbox`), enqueue and relay statements;
//! - `dead_letters`: dead letters (`idem_dead_letters`);
//! - `attempts`: consumers' failed attempts (`idem_consumer_attempts`);
//! - `headers`: message headers as the JSON text the outbox and dead letters keep;
//! - `schema`: migrations of every table above, versioned by `PRAGMA user_version`;
//! - `errors`: SQLite error codes mapped to [`idem_core::ErrorKind`] ([`map_err`],
//!   public for code that runs its own SQL on the store's connection).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attempts;
mod connection;
mod dead_letters;
mod errors;
mod fences;
mod headers;
mod holds;
mod outbox;
mod records;
mod schema;
mod store;
mod write_tx;

pub use connection::Synchronous;
pub use errors::map_err;
pub use fences::advance;
pub use rusqlite;
pub use schema::SCHEMA_VERSION;
pub use store::{SqliteStore, SqliteStoreBuilder};
