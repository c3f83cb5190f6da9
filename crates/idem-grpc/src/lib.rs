//! Idempotency keys for gRPC services built on tonic, and retries that know
//! gRPC's status codes.
//!
//! A gRPC answer is not an HTTP answer: its outcome is the `grpc-status`
//! trailer, its body is length-prefixed messages, and the codes worth a retry
//! are gRPC's own. This crate brings Idem's protocol to it:
//!
//! - server side, [`GrpcIdempotencyLayer`]: a tower layer for a tonic server.
//!   A unary call with an `idempotency-key` metadata entry runs once per key;
//!   its answer (headers, message and trailers) is stored and replayed to
//!   every duplicate with `idempotent-replayed: true`;
//! - [`atomic`] handlers: a unary method whose effect is SQL on the store's
//!   own database runs inside the store's transaction, and its reply commits
//!   with its writes and the key's record;
//! - client side, [`GrpcRetryPolicy`] and [`GrpcRetry`]: retries by status
//!   code with full-jitter backoff, the server's pushback and a shared retry
//!   budget, the key set once and carried by every attempt.
//!
//! | situation | status |
//! |---|---|
//! | key missing where required, key malformed, not exactly one request message | `INVALID_ARGUMENT` |
//! | same key, another message | `FAILED_PRECONDITION` |
//! | same key, the first call still running | `ABORTED` + `grpc-retry-pushback-ms` |
//! | same key, answered | the stored headers, message and trailers + `idempotent-replayed: true` |
//! | request message over the limit | `RESOURCE_EXHAUSTED` |
//! | the store unavailable | `UNAVAILABLE` |
//! | same key, an earlier call's outcome unknown, no hook | `ABORTED` + `grpc-retry-pushback-ms` (the time the key stays reserved) |
//! | same key, an earlier call's outcome unknown, and the hook cannot tell | `UNAVAILABLE` + `grpc-retry-pushback-ms` |
//!
//! What each code a service answers means for its key (stored, released, or
//! unknown and reconciled) is [`GrpcStatusPolicy`]'s table; a
//! [`GrpcReconcile`] hook, such as [`ProbeMethod`] (a lookup method of the
//! service, asked over gRPC), is asked before a call whose outcome is
//! unknown runs again.
//!
//! Key reuse is `FAILED_PRECONDITION`, not `INVALID_ARGUMENT`: the key and the
//! message are each valid, and the call would succeed with a new key or after
//! the record's window; what fails is the state the key's record is in.
//!
//! Streaming calls pass through untouched: only the unary methods named in
//! [`GrpcIdempotencyConfig::unary`] are protected.
//!
//! The `idem-gateway` crate puts the same layer in front of `idem serve`'s
//! forwarding, for gRPC services in any language.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod atomic;
mod body;
pub mod client;
mod config;
mod held;
mod layer;
pub mod observe;
pub mod reconcile;
pub mod status;
mod stored;

pub use client::{GrpcRetry, GrpcRetryPolicy};
pub use config::{DEFAULT_MESSAGE_LIMIT, GrpcIdempotencyConfig, IDEMPOTENCY_KEY};
pub use idem_http::IDEMPOTENCY_RECONCILED;
pub use layer::{GrpcIdempotencyLayer, GrpcIdempotencyService, GrpcResponse, ResponseFuture};
pub use reconcile::{
    DEFAULT_PROBE_TIMEOUT, GrpcProbe, GrpcProbeError, GrpcReconcile, GrpcReconciled, ProbeMethod,
    ReconcileFuture,
};
pub use status::{GrpcStatusPolicy, GrpcStatusPolicyError, RETRY_PUSHBACK};
pub use stored::{IDEMPOTENT_REPLAYED, NotAnAnswer, StoredCall};
