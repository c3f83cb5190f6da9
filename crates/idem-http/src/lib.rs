//! `Idempotency-Key` for HTTP services: a retry of a request whose answer is
//! stored gets that answer back instead of running again.
//!
//! Delivery over HTTP is at-least-once (clients, proxies and load balancers
//! retry); processing is effectively-once by idempotency keys, within the
//! store's dedupe window (7 days by default). Semantics follow the IETF draft
//! "The Idempotency-Key HTTP Header Field", with a Stripe-compatible mode:
//!
//! | situation                                  | IETF mode                        | Stripe mode                 |
//! |--------------------------------------------|----------------------------------|-----------------------------|
//! | key missing where the route requires one   | 400 problem+json                 | 400 `idempotency_error`     |
//! | key malformed (empty, > 255, not visible ASCII, several headers) | 400        | 400                         |
//! | same key, different payload                | 422 problem+json                 | 400 `idempotency_error`     |
//! | same key, original still running           | 409 problem+json + `Retry-After` | 409 + `Retry-After`         |
//! | same key, completed                        | stored status, headers and body + `Idempotent-Replayed: true` | same |
//! | body over the limit                        | 413                              | 413                         |
//!
//! Two ways in:
//!
//! - [`IdempotencyLayer`], a tower layer for any service (an axum router, a
//!   reverse proxy): the *leased* protocol, for effects the store cannot see;
//! - [`atomic`] handlers, for axum routes whose effect is SQL on the store's own
//!   database (SQLite or PostgreSQL): the handler's writes and the stored
//!   response commit in one transaction.
//!
//! For services in any language, the `idem-gateway` crate (`idem serve`)
//! puts this layer in front of a reverse proxy.
//!
//! # Crate features
//!
//! The layer and the atomic handlers work over any store of the `idem-core`
//! contracts ([`LeaseStore`](idem_core::LeaseStore),
//! [`AtomicStore`](idem_core::AtomicStore)); no store is built in by default.
//!
//! - `sqlite`, `postgres`, `redis`, `dynamodb`: `IdempotencyLayer::open`
//!   for a store named by its URL (`sqlite://PATH`, `postgres://URL`,
//!   `redis://HOST:PORT/DB`, `dynamodb:///TABLE`), through the facade's
//!   `idem::AnyStore`;
//! - `postgres` also lets concurrent duplicates that wait hear other
//!   processes' answers through PostgreSQL's `LISTEN`/`NOTIFY` (on a
//!   `PgStore`, or an `AnyStore` on PostgreSQL) instead of re-reading the
//!   record.
//!
//! # Modules
//!
//! - [`idempotency`]: the layer, its service, config, future, and the refusals
//!   with the one function that maps them to HTTP statuses;
//! - [`atomic`]: route wrappers that run a handler inside the store's atomic `apply`;
//! - `key_header`: reading `Idempotency-Key` (RFC 8941 String, or bare);
//! - `identity`: the scope (principal hash, method, route) and the fingerprint
//!   (method, route, target, canonical body) of a keyed request;
//! - [`observe`]: the protocol's counters for HTTP, with a bounded `route` label;
//! - `stored`: [`StoredResponse`], a response as stored and replayed;
//! - `body`: reading a keyed request's body under the limit;
//! - [`shed`]: [`LoadShedLayer`], 503 + `Retry-After` past a number of
//!   requests in flight instead of a queue.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod atomic;
mod body;
pub mod idempotency;
mod identity;
mod key_header;
pub mod observe;
pub mod shed;
mod stored;

pub use idempotency::{
    CONCURRENT_WAITS_TOTAL, Concurrent, DEFAULT_BODY_LIMIT, DEFAULT_REPLAY_CACHE_BYTES,
    DEFAULT_REPLAY_CACHE_STALENESS, DEFAULT_WAITERS, DEFAULT_WAITERS_PER_KEY,
    IDEMPOTENCY_RECONCILED, IdempotencyConfig, IdempotencyLayer, IdempotencyService, Judged,
    KeyHeld, KeyRequirement, Mode, NothingApplied, Notices, REPLAY_CACHE_BYTES,
    REPLAY_CACHE_ENTRIES, REPLAY_CACHE_LOOKUPS_TOTAL, Reconcile, Reconciled, Refusal, Refused,
    ReplayCache, ResponseFuture, Spool, SpoolError, StatusPolicy, StatusPolicyError, StatusRule,
    UnknownOutcome, Verdict, WaitableStore, WaiterCaps,
};
pub use identity::principal_of;
pub use key_header::{
    IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENCY_KEY_IGNORED, IDEMPOTENT_REPLAYED,
    KeyHeaderError, parse_key, read_key,
};
pub use shed::{InFlightLimit, LoadShed, LoadShedLayer};
pub use stored::{NotAResponse, StoredResponse};
