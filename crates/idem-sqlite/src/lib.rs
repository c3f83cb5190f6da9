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
//! - `schema`: migrations, versioned by `PRAGMA user_version`;
//! - `errors`: SQLite error codes mapped to [`idem_core::ErrorKind`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod connection;
mod errors;
mod fences;
mod holds;
mod records;
mod schema;
mod store;
mod write_tx;

pub use connection::Synchronous;
pub use fences::advance;
pub use rusqlite;
pub use schema::SCHEMA_VERSION;
pub use store::{SqliteStore, SqliteStoreBuilder};
