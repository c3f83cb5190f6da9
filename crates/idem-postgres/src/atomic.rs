//! Atomic mode: the effect is a write to this database, so it and the record
//! commit in one transaction. A crash at any point leaves both or neither.
//!
//! The steps, and their round trips:
//!
//! 1. the fast path ([`PgStore::peek`]): one `SELECT`, which answers a replay or
//!    a refusal on its own;
//! 2. otherwise `BEGIN`, try the key's lock (taken → `InFlight` at once), read
//!    the record, [`decide`](idem_core::decide);
//! 3. on a claim or takeover, run the effect in the transaction, write the
//!    record settled with the decided token and the outcome, `COMMIT`.
//!
//! An effect that fails rolls everything back, so the key is free for the next
//! retry; a terminal failure is an outcome and is stored like a success.

use futures::future::BoxFuture;
use idem_core::{Applied, ApplyError, Fingerprint, IdempotencyKey, Outcome, Scope};
use sqlx::PgConnection;

use crate::decision::Next;
use crate::store::PgStore;

impl PgStore {
    /// Applies `effect` once for `(scope, key)`: runs it in the store's
    /// transaction and commits it with the record, or replays the stored outcome.
    ///
    /// Refuses with `KeyReuse` (the key was used with another payload) or
    /// `InFlight` (another call holds the key right now; never waits for it). An
    /// effect error rolls back its writes and the claim, and comes back as
    /// [`ApplyError::Effect`]; the next retry runs the effect again.
    ///
    /// ```no_run
    /// # async fn demo(store: idem_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use futures::FutureExt;
    /// use idem_core::{Fingerprint, IdempotencyKey, Outcome, Scope};
    ///
    /// let scope = Scope::new("payments")?;
    /// let key = IdempotencyKey::new("order-42")?;
    /// let applied = store
    ///     .apply(&scope, &key, Fingerprint::of_bytes(b"debit 10"), |conn| {
    ///         async move {
    ///             sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///                 .execute(&mut *conn)
    ///                 .await?;
    ///             Ok::<_, sqlx::Error>(Outcome::success("debited"))
    ///         }
    ///         .boxed()
    ///     })
    ///     .await?;
    /// assert_eq!(applied.outcome().body, b"debited");
    /// # Ok(()) }
    /// ```
    pub async fn apply<F, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        effect: F,
    ) -> Result<Applied, ApplyError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Outcome, E>> + Send,
        E: Send,
    {
        if let Some(outcome) = self.peek(scope, key, &fingerprint).await? {
            return Ok(Applied::Replayed(outcome));
        }

        let now = self.clock().now();
        let mut tx = self.begin().await?;
        let (decision, found) = match self
            .decide_locked(&mut tx, scope, key, &fingerprint, now)
            .await
        {
            Ok(decided) => decided,
            Err(error) => {
                self.roll_back(tx).await;
                return Err(error.into());
            }
        };
        let plan = match Next::after(decision, found.as_ref(), now, self.settings()) {
            Next::Run(plan) => plan,
            Next::Replay(outcome) => {
                self.roll_back(tx).await;
                return Ok(Applied::Replayed(outcome));
            }
        };

        let outcome = match effect(&mut tx).await {
            Ok(outcome) => outcome,
            Err(error) => {
                self.roll_back(tx).await;
                return Err(ApplyError::Effect(error));
            }
        };
        let record = plan.settled(scope, key, fingerprint, outcome.clone(), self.clock().now());
        self.write(&mut tx, std::slice::from_ref(&record)).await?;
        self.commit(tx).await?;
        Ok(Applied::Fresh(outcome))
    }
}
