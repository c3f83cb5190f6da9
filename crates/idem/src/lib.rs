//! Idem: delivery at-least-once, processing effectively-once by idempotency
//! keys, within a dedupe window (7 days by default).
//!
//! This is the crate applications depend on. It re-exports the protocol types
//! from `idem-core` and, by feature, the stores:
//! - `sqlite` (default): [`SqliteStore`], embedded, zero set-up;
//! - `postgres`: [`PgStore`], shared by many processes and machines.
//!
//! Modules:
//! - [`StoreLocation`]: `sqlite://PATH` / `postgres://URL` parsing;
//! - [`AnyStore`]: a store chosen at run time, behind the shared traits, and
//!   [`AnyTx`], the connection its atomic effects get;
//! - [`redact_url`]: a URL with its password and query removed, for logs and errors;
//! - [`Sweeper`]: retention that runs itself, a task deleting expired records.
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

mod any;
mod location;
mod redact;
pub mod sweeper;

pub use any::{AnyConnection, AnyStore, AnyTx};
pub use idem_core::*;
pub use location::{LocationError, StoreLocation};
pub use redact::redact_url;
pub use sweeper::{SweepPass, Sweeper, SweeperTask};

#[cfg(feature = "sqlite")]
pub use idem_sqlite::{self as sqlite, SqliteStore, rusqlite};

#[cfg(feature = "postgres")]
pub use idem_postgres::{self as postgres, PgStore, sqlx};
