//! The one mapping of redis-rs errors to [`ErrorKind`].

use idem_core::{Error, ErrorKind, StoreError};
use redis::RedisError;

/// Maps a redis-rs error met while doing `what` (for example "claim
/// payments/p-1") onto a store error whose message says what failed and
/// what to do. `write` tells whether the command changes data: a write whose
/// connection broke after it was sent may or may not have run
/// ([`ErrorKind::CommitUnknown`]).
pub fn map_error(what: &str, write: bool, error: RedisError) -> Error {
    let (kind, advice) = if error.is_connection_refusal() {
        (
            ErrorKind::Unavailable,
            "Redis refused the connection: check that it runs and that the store URL names its host and port",
        )
    } else if write && (error.is_connection_dropped() || error.is_timeout()) {
        (
            ErrorKind::CommitUnknown,
            "the connection broke while the write was on its way, so whether it ran is unknown; retrying under the same key is safe",
        )
    } else if error.is_io_error() || error.is_connection_dropped() || error.is_timeout() {
        (
            ErrorKind::Unavailable,
            "Redis could not be reached; retry once it answers",
        )
    } else if error.is_cluster_error() {
        (
            ErrorKind::Unavailable,
            "the cluster is moving slots or electing a primary; retry shortly",
        )
    } else if matches!(error.code(), Some("NOAUTH" | "WRONGPASS")) {
        (
            ErrorKind::Config,
            "Redis wants a user and password: put them in the store URL (redis://USER:PASSWORD@HOST:PORT/DB)",
        )
    } else if matches!(error.code(), Some("WRONGTYPE")) {
        (
            ErrorKind::Corrupt,
            "a key under the store's prefix is not a hash Idem wrote: give the store a key prefix of its own",
        )
    } else if matches!(
        error.code(),
        Some("READONLY" | "MASTERDOWN" | "LOADING" | "TRYAGAIN" | "CLUSTERDOWN")
    ) {
        (
            ErrorKind::Unavailable,
            "Redis cannot take writes right now (a replica, a failover or a restart still loading its data); retry shortly",
        )
    } else {
        (ErrorKind::Other, "see the Redis error for the cause")
    };
    StoreError::with_source(kind, format!("{what} on Redis failed: {advice}"), error).into()
}
