//! Failed attempts per message, counted in the store: how a consumer
//! recognises a poison message where the broker keeps no delivery count
//! (RabbitMQ classic queues), and where the first failure's time is kept for
//! the dead letter.
//!
//! Why a table of its own, written outside the effect's transaction: an
//! effect's failure rolls that transaction back, so nothing about the failure
//! can be written there. The count is written after, in a short transaction
//! of its own. Only failures write, so a healthy consumer never touches the
//! table; a message's row is deleted when it is dead-lettered (a redrive
//! starts again from zero), and rows older than the dedupe window are swept.

use std::future::Future;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::key::{IdempotencyKey, Scope};

/// The count after a failure was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    /// Failed attempts so far, this one included.
    pub count: u32,
    /// When the first of them was recorded.
    pub first_at: Timestamp,
}

/// Failed attempts per `(scope, key)`, stamped with the store's clock.
pub trait AttemptStore: Send + Sync {
    /// Records one more failure of `(scope, key)` with its error text.
    fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> impl Future<Output = Result<Failures, Error>> + Send;

    /// Forgets the failures of `(scope, key)` (after it was dead-lettered).
    fn forget_failures(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes at most `limit` rows last written before `before`; returns how many.
    fn sweep_failures(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Now, by the store's clock: the time failures are stamped with.
    fn now(&self) -> Timestamp;
}
