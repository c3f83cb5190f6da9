//! The payment workload that the demo and the benchmarks run: accounts
//! with balances, a ledger of debits, and one debit effect — run bare (its
//! own transaction, no dedupe: the baseline) or through Idem's atomic apply.
//!
//! [`Bank`] is written once against [`AtomicStore`](idem::AtomicStore); only
//! the SQL it runs is per database, in [`crate::ledger`].

use anyhow::Context;
use idem::{
    AnyStore, Applied, ApplyError, AtomicEffect, BatchApplied, Operation, Outcome, SetApplied,
    StoreLocation,
};

use crate::ledger::{DebitError, Ledger};
pub use crate::payment::{Payment, Totals, scope};

/// The workload's tables in one store's database, and the ways to debit them.
#[derive(Debug, Clone)]
pub struct Bank<S> {
    store: S,
}

impl Bank<AnyStore> {
    /// Opens the store at `location` (creating its schema) for the workload.
    pub async fn open(location: &StoreLocation) -> anyhow::Result<Self> {
        let store = AnyStore::open(location)
            .await
            .with_context(|| format!("cannot open the store at {location}"))?;
        Ok(Self::new(store))
    }
}

impl<S: Ledger> Bank<S> {
    /// The workload on `store`'s database.
    pub fn new(store: S) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Recreates the accounts and an empty ledger.
    pub async fn reset(&self, accounts: i64, opening_balance: i64) -> anyhow::Result<()> {
        self.store
            .transaction(async move |tx| S::create(tx, accounts, opening_balance).await)
            .await
            .context("cannot create the workload's tables")
    }

    /// The debit in its own transaction, with no dedupe at all.
    pub async fn debit_bare(&self, p: &Payment) -> anyhow::Result<()> {
        self.store.transaction(debit::<S>(p)).await?;
        Ok(())
    }

    /// Several debits in one transaction, with no dedupe at all.
    pub async fn debit_bare_batch(&self, payments: &[Payment]) -> anyhow::Result<()> {
        // Accounts locked in one order, so batches committed at once do not
        // deadlock each other.
        let mut payments = payments.to_vec();
        payments.sort_by_key(|p| p.account);
        self.store
            .transaction(async move |tx| {
                for p in &payments {
                    S::debit(tx, p).await?;
                }
                Ok::<_, DebitError>(())
            })
            .await?;
        Ok(())
    }

    /// Several debits in one transaction as one set statement (see
    /// [`Ledger::debit_set`]), with no dedupe at all.
    pub async fn debit_bare_set(&self, payments: &[Payment]) -> anyhow::Result<()> {
        let payments = payments.to_vec();
        self.store
            .transaction(async move |tx| S::debit_set(tx, &payments).await)
            .await?;
        Ok(())
    }

    /// The debit through Idem's atomic apply: once per key.
    pub async fn debit_once(&self, p: &Payment) -> Result<Applied, ApplyError<DebitError>> {
        self.store
            .apply(&scope(), &p.id, p.fingerprint(), debit::<S>(p))
            .await
    }

    /// The debit through the replay-first atomic apply, for keys likely to
    /// be duplicates; `None` where the store has no such path of its own.
    pub async fn debit_replay_first(
        &self,
        p: &Payment,
    ) -> Option<Result<Applied, ApplyError<DebitError>>> {
        if !self.store.replays_first() {
            return None;
        }
        let applied = self
            .store
            .apply_replay_first(&scope(), &p.id, p.fingerprint(), debit::<S>(p))
            .await;
        Some(applied)
    }

    /// A batch of debits in one transaction, each once per key.
    pub async fn debit_batch(&self, payments: &[Payment]) -> BatchApplied<DebitError> {
        let ops: Vec<Operation> = payments.iter().map(Payment::operation).collect();
        let payments = payments.to_vec();
        self.store
            .apply_batch(&ops, move |i| debit::<S>(&payments[i]))
            .await
    }

    /// A batch of debits in one transaction, each once per key, the new ones
    /// debited by one set-based effect.
    pub async fn debit_set(&self, payments: &[Payment]) -> SetApplied<DebitError> {
        let ops: Vec<Operation> = payments.iter().map(Payment::operation).collect();
        let payments = payments.to_vec();
        self.store
            .apply_set(&ops, move |new| {
                let chosen: Vec<Payment> = new.iter().map(|&i| payments[i].clone()).collect();
                async move |tx: &mut S::Tx| S::debit_set(tx, &chosen).await
            })
            .await
    }

    /// Adds one chunk of completed records to the dedupe table, in a
    /// transaction of its own.
    pub async fn prefill(&self, fill: idem::protocol::RecordSeed) -> anyhow::Result<()> {
        self.store
            .transaction(async move |tx| S::prefill(tx, fill).await)
            .await
            .context("cannot prefill the dedupe table")
    }

    /// Refreshes the dedupe table's statistics and returns its size on disk,
    /// indexes included, in bytes.
    pub async fn analyze_records(&self) -> anyhow::Result<u64> {
        self.store
            .transaction(async |tx| S::analyze_records(tx).await)
            .await
            .context("cannot read the dedupe table's size")
    }

    /// What the ledger holds.
    pub async fn totals(&self) -> anyhow::Result<Totals> {
        self.store
            .transaction(async |tx| S::totals(tx).await)
            .await
            .context("cannot read the ledger")
    }
}

/// The debit of `p` as an effect, for any of the store's transactions.
fn debit<S: Ledger>(p: &Payment) -> impl AtomicEffect<S::Tx, Outcome, DebitError> + use<S> {
    let p = p.clone();
    async move |tx: &mut S::Tx| S::debit(tx, &p).await
}

#[cfg(test)]
mod tests {
    use idem::{IdempotencyKey, SqliteStore};

    use super::*;

    fn payment(id: &str, account: i64, amount: i64) -> Payment {
        Payment {
            id: IdempotencyKey::new(id).expect("valid key"),
            account,
            amount,
        }
    }

    /// Every way of debiting, on one store: the atomic ones debit a payment
    /// once however often it comes, the bare ones every time.
    async fn debits_once_through_idem_and_every_time_bare<S: Ledger>(bank: Bank<S>) {
        bank.reset(3, 100).await.unwrap();
        let (a, b, c) = (payment("a", 0, 10), payment("b", 1, 20), payment("c", 2, 5));
        assert!(!bank.debit_once(&a).await.unwrap().is_replay());
        let again = bank.debit_once(&a).await.unwrap();
        assert!(again.is_replay());
        assert_eq!(again.outcome().body, br#"{"balance":90}"#);
        if let Some(first) = bank.debit_replay_first(&b).await {
            assert!(!first.unwrap().is_replay());
        } else {
            assert!(!bank.debit_once(&b).await.unwrap().is_replay());
        }
        let answers = bank.debit_batch(&[a.clone(), c.clone(), c]).await.unwrap();
        let replays: Vec<bool> = answers
            .iter()
            .map(|a| a.as_ref().unwrap().is_replay())
            .collect();
        assert_eq!(replays, [true, false, true]);
        bank.debit_bare(&a).await.unwrap();
        bank.debit_bare_batch(&[a.clone(), b.clone()])
            .await
            .unwrap();
        bank.debit_bare_set(&[b]).await.unwrap();
        // A set: two payments on one account, a repeat, a known key. Each new
        // payment answers the balance right after its own debit.
        let (d, e, f) = (payment("d", 0, 1), payment("e", 0, 2), payment("f", 1, 3));
        let answers = bank
            .debit_set(&[d.clone(), a.clone(), e, d, f])
            .await
            .unwrap();
        let bodies: Vec<(bool, String)> = answers
            .iter()
            .map(|a| {
                let a = a.as_ref().unwrap();
                (
                    a.is_replay(),
                    String::from_utf8_lossy(&a.outcome().body).into_owned(),
                )
            })
            .collect();
        let balance = |replay, b: i64| (replay, format!(r#"{{"balance":{b}}}"#));
        assert_eq!(
            bodies,
            [
                balance(false, 69),
                balance(true, 90),
                balance(false, 67),
                balance(true, 69),
                balance(false, 37),
            ]
        );
        let totals = bank.totals().await.unwrap();
        assert_eq!(
            totals,
            Totals {
                entries: 10,
                distinct: 6,
                debited: 10 + 20 + 5 + 10 + 10 + 20 + 20 + 1 + 2 + 3,
            }
        );
    }

    #[tokio::test]
    async fn on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
        debits_once_through_idem_and_every_time_bare(Bank::new(store)).await;
    }

    /// On a database made for the test (on `IDEM_TEST_POSTGRES_URL`, by
    /// default the local server) and dropped after it; skipped when the server
    /// cannot be reached, unless `IDEM_REQUIRE_SERVICES=1`.
    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread")]
    async fn on_postgres() {
        let Some(db) = idem_testkit::postgres::TestDatabase::create("idem_demo_workload").await
        else {
            return;
        };
        let store = idem::PgStore::connect(db.url()).await.unwrap();
        assert!(store.replays_first());
        debits_once_through_idem_and_every_time_bare(Bank::new(store.clone())).await;
        store.pool().close().await;
    }
}
