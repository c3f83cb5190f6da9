//! The PostgreSQL store for Idem: one dedupe table shared by many processes and
//! machines, with the user's business SQL joining the record's transaction.
//!
//! Delivery is at-least-once; processing is effectively-once by idempotency
//! keys, within the dedupe window (7 days by default). This crate implements the
//! protocol of [`idem_core`] on PostgreSQL with sqlx.
//!
//! # Modules
//!
//! - `store`: [`PgStore`] and [`PgStoreBuilder`]: connecting, the pool, settings, clock;
//! - `hosts`: several servers in one URL (libpq's `host1:port1,host2:port2`)
//!   and `target_session_attrs`, taken out of the URL before sqlx reads it;
//! - `connect`: which of those servers each new connection goes to, searched
//!   again when the current one goes away or turns read-only (a failover);
//! - `atomic`: [`AtomicStore`](idem_core::AtomicStore) — `apply`, `apply_replay_first`,
//!   `complete_with`, `transaction` — the effect and the record in one transaction,
//!   and (in `atomic::locked`) the two simple-query round trips around the effect;
//! - `batch`: `apply_batch` and `apply_set`, N operations, one transaction;
//! - `leased`: [`LeaseStore`](idem_core::LeaseStore) (claim, renew, complete,
//!   release) and the leased completion with a database effect;
//! - `inspect`: [`RecordStore`](idem_core::RecordStore): migrations, listing, counting, sweeping;
//! - `decision`: the fast-path read and the locked read-and-decide every claim path shares;
//! - `lock`: per-key advisory locks and the transactions they live in;
//! - `pooler`: behind a transaction pooler (PgBouncer; `pgbouncer=true`,
//!   `statement_cache=0` in the URL): no statement, lock or `LISTEN` outlives
//!   its transaction;
//! - `records`: the `idem_records` table: migrations and every SQL statement on it,
//!   (in `records::row`) the conversion of rows to records and back to literals,
//!   and (in `records::session`) the statements each session prepares for apply;
//! - `literal`: values written into SQL text, for the statements sent as simple queries;
//! - `fences`: fencing-token leases ([`FenceStore`](idem_core::FenceStore)) and
//!   [`PgStore::advance`], the guarded write on the application's own tables;
//! - `outbox`: the transactional outbox (`idem_outbox`): the enqueue on the
//!   caller's transaction and the relay's statements, and [`OutboxListener`],
//!   its LISTEN/NOTIFY wake-ups;
//! - `dead_letters`: dead letters (`idem_dead_letters`);
//! - `admin`: what operators change by hand ([`AdminStore`](idem_core::AdminStore)),
//!   each change and its row in the audit log (`idem_audit`) in one transaction;
//! - `attempts`: consumers' failed attempts (`idem_consumer_attempts`);
//! - `headers`: message headers as the JSON text the outbox and dead letters keep;
//! - `seed`: test and benchmark hooks on the records table (bulk records, statistics, size);
//! - `error`: the one mapping of sqlx errors to [`ErrorKind`](idem_core::ErrorKind),
//!   public as [`map_error`] for code that runs its own SQL on the store's pool.
//!
//! Every table's migration is a file of `migrations/`, run by sqlx's migrator
//! ([`RecordStore::migrate`](idem_core::RecordStore::migrate), or
//! [`PgStoreBuilder::migrate`]).
//!
//! # How concurrent callers are kept apart
//!
//! Every path that reads a record and then writes it runs in a READ COMMITTED
//! transaction that first takes a transaction-scoped advisory lock on a 64-bit
//! hash of `(scope, key)`, then reads the record in a *separate* statement (whose
//! snapshot therefore includes whatever the previous lock holder committed;
//! `apply` sends both in one simple query, still as two statements).
//!
//! - Claim paths (`apply`, `apply_batch`, `claim`) only *try* the lock
//!   (`pg_try_advisory_xact_lock`): a concurrent duplicate finds it taken and is
//!   answered `InFlight` at once, never queued behind the original.
//! - Completion paths for a held token (`renew`, `release`, `complete_with`,
//!   and `complete` where the one-statement claim is not used) *wait* for it
//!   (`pg_advisory_xact_lock`): its holder is a short claim, or a takeover
//!   whose commit rightly fences them.
//! - Before any of that, `apply_replay_first` and a `claim` that the one
//!   statement below did not settle read the record once without a
//!   transaction: a replay or a refusal is answered in one round trip.
//! - Completions are fenced in SQL: `UPDATE ... WHERE token = held AND state =
//!   'in_flight'`, which finds nothing once a newer owner took the key over.
//! - A leased claim first tries one statement that claims a new key (or one
//!   past its window, or released) by itself: `INSERT ... ON CONFLICT DO
//!   UPDATE ... WHERE ... RETURNING`, trying the key's lock inside it. Its
//!   completion is then the fenced update alone, without the lock. Writes
//!   made after a locked read replace a row only if it is still the row
//!   they decided on, so a completion that settled it meanwhile is never
//!   overwritten by a stale decision (see `leased`).
//! - Times are the application's [`Clock`](idem_core::Clock), passed as
//!   parameters; the database's `now()` is never used.
//!
//! # Connecting
//!
//! [`PgStoreBuilder::connect`] opens one connection first, without retries, so
//! an unreachable server is reported at once with its real cause; the pool then
//! opens the others as they are needed, up to [`DEFAULT_MAX_CONNECTIONS`] (16)
//! unless [`PgStoreBuilder::max_connections`] says otherwise. An operation waits
//! at most [`DEFAULT_ACQUIRE_TIMEOUT`] (5 s, where sqlx's own default is 30 s)
//! for a pooled connection before it fails as unavailable;
//! [`PgStoreBuilder::acquire_timeout`] changes the wait.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope};
//! use idem_postgres::PgStore;
//!
//! let store = PgStore::connect("postgres://postgres@127.0.0.1:5432/app").await?;
//! let scope = Scope::new("payments")?;
//! let key = IdempotencyKey::new("order-42")?;
//! let applied = store
//!     .apply(&scope, &key, Fingerprint::of_bytes(b"debit 10"), async |conn| -> sqlx::Result<Outcome> {
//!         sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
//!             .execute(&mut *conn)
//!             .await?;
//!         Ok(Outcome::success("debited"))
//!     })
//!     .await?;
//! println!("replayed: {}", applied.is_replay());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod atomic;
mod attempts;
mod batch;
mod connect;
mod dead_letters;
mod decision;
mod error;
mod fences;
mod group;
mod headers;
mod hosts;
mod inspect;
mod leased;
mod literal;
mod lock;
mod outbox;
mod passfile;
mod pooler;
mod records;
mod seed;
mod store;
#[cfg(test)]
mod testing;

pub use error::map_error;
pub use group::{GROUP_QUEUE_WAIT_SECONDS, GROUP_SIZE, GROUPED_CALLS_TOTAL, MAX_GROUP};
pub use outbox::OutboxListener;
pub use records::SWEEP_LOCK;
pub use sqlx;
pub use store::{DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, PgStore, PgStoreBuilder};
