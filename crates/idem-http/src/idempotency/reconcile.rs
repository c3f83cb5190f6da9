//! [`Reconcile`]: asking the service whether an earlier attempt whose outcome
//! is unknown was applied, before a retry runs the request again.
//!
//! # Why
//!
//! A claim taken over from an ended lease means an earlier attempt ended
//! without a stored answer: the service answered with a status whose outcome
//! is unknown (a 502 or 504), timed out, a connection broke after the request
//! was sent, or the process holding the claim died. Whether its effect
//! happened is unknown, and running the retry may apply it twice. Many
//! services can tell — the payment is in their table, under the key they
//! were sent — so the layer asks first, at the first retry: it ends the lease
//! of an unknown outcome at once when it has a hook. A service that answers
//! "applied" gets its answer stored and replayed; "not applied" lets the
//! retry run; "unknown" refuses the retry for now (503 with `Retry-After`)
//! and keeps the key reserved, its lease ended again, so the next retry
//! takes it over and asks again.
//!
//! The gateway's `--probe` is an implementation that sends an HTTP request
//! to the upstream.

use futures::future::BoxFuture;
use idem_core::{IdempotencyKey, Scope};

use crate::StoredResponse;

/// What the service says about an earlier attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// It was applied, and this is its answer: it is stored and replayed.
    Applied(StoredResponse),
    /// It was not applied: the retry runs.
    NotApplied,
    /// The service cannot tell now (it failed, timed out, was unreachable):
    /// the retry is refused with 503, and the next retry asks again.
    Unknown(String),
}

/// Asks whether the request keyed `key` in `scope` was applied. Called by the
/// leased layer before it runs a request whose claim took over an expired
/// one; `request` is the retry's head (method, target, headers).
///
/// ```
/// use futures::future::BoxFuture;
/// use http::StatusCode;
/// use idem::{IdempotencyKey, Scope};
/// use idem_http::{Reconcile, Reconciled, StoredResponse};
///
/// /// Payments it has made, by key.
/// struct Ledger(std::sync::Mutex<std::collections::HashMap<String, String>>);
///
/// impl Reconcile for Ledger {
///     fn reconcile<'a>(
///         &'a self,
///         _scope: &'a Scope,
///         key: &'a IdempotencyKey,
///         _request: &'a http::request::Parts,
///     ) -> BoxFuture<'a, Reconciled> {
///         Box::pin(async move {
///             match self.0.lock().unwrap().get(key.as_str()) {
///                 Some(id) => Reconciled::Applied(StoredResponse::text(StatusCode::CREATED, id.clone())),
///                 None => Reconciled::NotApplied,
///             }
///         })
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem::SqliteStore::open(dir.path().join("idem.db")).await?;
/// let layer = idem_http::IdempotencyLayer::new(store, Default::default())
///     .with_reconcile(Ledger(Default::default()));
/// # drop(layer); Ok(()) }
/// ```
pub trait Reconcile: Send + Sync + 'static {
    /// The service's word on the earlier attempt.
    fn reconcile<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a IdempotencyKey,
        request: &'a http::request::Parts,
    ) -> BoxFuture<'a, Reconciled>;
}
