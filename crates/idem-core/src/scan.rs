//! Reading records in bounded pages, for a process that walks the whole
//! table beside the traffic: the effect auditor (`idem audit`) compares the
//! records with the effects a service wrote, and must not load the table at
//! once nor scan it on every pass.
//!
//! Pages go in the order of the window's end (`expires_at`, then scope and
//! key), which every SQL store indexes for its sweeper: a page costs one
//! index range, and since a record's window counts from its first claim and
//! never moves, the order is the order in which records were first claimed.

use std::future::Future;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::key::{IdempotencyKey, Scope};
use crate::record::Record;

/// Where a walk over the records stopped: the last record it was handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryPosition {
    /// That record's window end.
    pub expires_at: Timestamp,
    /// Its scope.
    pub scope: Scope,
    /// Its key.
    pub key: IdempotencyKey,
}

impl ExpiryPosition {
    /// The position just after `record`.
    pub fn after(record: &Record) -> Self {
        Self {
            expires_at: record.expires_at,
            scope: record.scope.clone(),
            key: record.key.clone(),
        }
    }
}

/// Bounded reads of the records of some scopes, one statement each.
///
/// ```
/// # async fn walk(store: impl idem_core::RecordScan) -> Result<(), idem_core::Error> {
/// use idem_core::{ExpiryPosition, Scope};
/// let scopes = [Scope::new("payments").unwrap()];
/// let mut after = None;
/// loop {
///     let page = store.records_by_expiry(&scopes, after.as_ref(), 500).await?;
///     let Some(last) = page.last() else { break };
///     after = Some(ExpiryPosition::after(last));
/// }
/// # Ok(()) }
/// ```
pub trait RecordScan: Send + Sync {
    /// The records of those of `keys` that have one, in no particular order.
    fn records_of(
        &self,
        keys: &[(Scope, IdempotencyKey)],
    ) -> impl Future<Output = Result<Vec<Record>, Error>> + Send;

    /// At most `limit` records of `scopes` past `after` (from the first when
    /// `None`), by window end, then scope, then key.
    fn records_by_expiry(
        &self,
        scopes: &[Scope],
        after: Option<&ExpiryPosition>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Record>, Error>> + Send;
}
