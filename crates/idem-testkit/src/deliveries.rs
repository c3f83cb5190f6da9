//! At-least-once delivery, simulated: every item delivered one or more times,
//! in shuffled order. The property tests use it to show that a handler
//! reaches the same state on `S` as on `S` with duplicates.
//!
//! [`EffectivelyOnce`] is that property for your own handler: give it how
//! to make messages and how to run a list of deliveries in a fresh world, and
//! it checks that the world ends the same with every message delivered once
//! and with each delivered one to three times in a shuffled order.

use std::fmt::Debug;
use std::future::Future;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use rand::Rng;
use rand::seq::SliceRandom;

/// The property "duplicates and reordering change nothing" for a handler of
/// your own, checked over generated message lists.
///
/// `run` receives the deliveries of one world — a fresh database, or a fresh
/// scope and tables in a shared one — applies them as your consumer would,
/// and returns what should not depend on duplicates: balances, row counts,
/// the set of emitted events. It is called twice per case: once with each
/// message delivered once, in order, and once with the same messages each
/// delivered one to three times, shuffled. A handler whose state depends on
/// the order of *different* messages (last write wins) should return a state
/// that ignores that order, or guard its writes with versions.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use idem::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope, SqliteStore};
/// use idem_testkit::deliveries::EffectivelyOnce;
/// use proptest::prelude::*;
///
/// # fn main() {
/// let dir = tempfile::tempdir().unwrap();
/// let store = tokio::runtime::Runtime::new().unwrap().block_on(async {
///     let store = SqliteStore::open(dir.path().join("bank.db")).await.unwrap();
///     store.transaction(async |tx| tx.execute_batch(
///         "CREATE TABLE balances (world INTEGER, account INTEGER, cents INTEGER, PRIMARY KEY (world, account))"
///     )).await.unwrap();
///     store
/// });
/// let worlds = AtomicUsize::new(0);
///
/// // Messages: (message id, account, cents). Each world gets its own scope.
/// let messages = prop::collection::vec((0u32..1000, 0i64..3, 1i64..50), 1..10)
///     .prop_map(|mut m| { m.sort_by_key(|m| m.0); m.dedup_by_key(|m| m.0); m });
/// EffectivelyOnce::new().cases(16).check(messages, |deliveries| {
///     let (store, world) = (store.clone(), worlds.fetch_add(1, Ordering::SeqCst) as i64);
///     async move {
///         let scope = Scope::new(format!("credits-{world}")).unwrap();
///         for (id, account, cents) in deliveries {
///             let key = IdempotencyKey::new(format!("msg-{id}")).unwrap();
///             store.apply(&scope, &key, Fingerprint::of_bytes(&cents.to_le_bytes()), async move |tx| {
///                 tx.execute(
///                     "INSERT INTO balances VALUES (?1, ?2, ?3)
///                      ON CONFLICT (world, account) DO UPDATE SET cents = cents + excluded.cents",
///                     (world, account, cents),
///                 )?;
///                 Ok::<_, idem::rusqlite::Error>(Outcome::empty())
///             }).await.unwrap();
///         }
///         store.transaction(async move |tx| {
///             let mut rows = tx.prepare("SELECT account, cents FROM balances WHERE world = ?1 ORDER BY account")?;
///             rows.query_map([world], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?
///                 .collect::<Result<Vec<_>, _>>()
///         }).await.unwrap()
///     }
/// }).unwrap();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct EffectivelyOnce {
    cases: u32,
}

impl Default for EffectivelyOnce {
    fn default() -> Self {
        Self::new()
    }
}

/// A case where duplicates changed the outcome: the messages, the shuffled
/// deliveries, and the two states.
#[derive(Debug, thiserror::Error)]
#[error("duplicated deliveries changed the state: {0}")]
pub struct NotEffectivelyOnce(String);

impl EffectivelyOnce {
    /// 32 cases.
    pub fn new() -> Self {
        Self { cases: 32 }
    }

    /// How many message lists to try.
    pub fn cases(mut self, cases: u32) -> Self {
        self.cases = cases.max(1);
        self
    }

    /// Checks the property; on a failure, the error shows the smallest case
    /// found (proptest shrinks the message list) with both states. Runs
    /// `run`'s futures on a runtime of its own, so call it from a plain
    /// `#[test]`, not from inside an async one.
    pub fn check<M, St, Fut>(
        &self,
        messages: impl Strategy<Value = Vec<M>>,
        run: impl Fn(Vec<M>) -> Fut,
    ) -> Result<(), NotEffectivelyOnce>
    where
        M: Clone + Debug,
        St: PartialEq + Debug,
        Fut: Future<Output = St>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the property");
        let strategy = messages.prop_flat_map(|once| (Just(once.clone()), redelivered(once)));
        let mut runner = TestRunner::new(Config::with_cases(self.cases));
        let outcome = runner.run(&strategy, |(once, duplicated)| {
            let single = runtime.block_on(run(once.clone()));
            let repeated = runtime.block_on(run(duplicated.clone()));
            if single == repeated {
                Ok(())
            } else {
                Err(TestCaseError::fail(format!(
                    "messages {once:?} delivered once ended in {single:?}; delivered as {duplicated:?} they ended in {repeated:?}"
                )))
            }
        });
        match outcome {
            Ok(()) => Ok(()),
            Err(TestError::Fail(why, _)) => Err(NotEffectivelyOnce(why.to_string())),
            Err(TestError::Abort(why)) => {
                Err(NotEffectivelyOnce(format!("the check stopped: {why}")))
            }
        }
    }
}

/// Each item copied 1 to `max_copies` times, then the whole list shuffled.
pub fn duplicate_and_shuffle<T: Clone>(
    items: &[T],
    max_copies: usize,
    rng: &mut impl Rng,
) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len() * (max_copies + 1) / 2);
    for item in items {
        for _ in 0..rng.random_range(1..=max_copies.max(1)) {
            out.push(item.clone());
        }
    }
    out.shuffle(rng);
    out
}

/// A proptest strategy: `items` delivered 1–3 times each, in a random order.
pub fn redelivered<T: Clone + std::fmt::Debug>(items: Vec<T>) -> impl Strategy<Value = Vec<T>> {
    let n = items.len();
    (proptest::collection::vec(1usize..=3, n), any::<u64>()).prop_map(move |(copies, seed)| {
        let mut out: Vec<T> = items
            .iter()
            .zip(&copies)
            .flat_map(|(item, &k)| std::iter::repeat_n(item.clone(), k))
            .collect();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        out.shuffle(&mut rng);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn every_item_arrives_at_least_once_and_at_most_max_copies() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let items: Vec<u32> = (0..200).collect();
        let delivered = duplicate_and_shuffle(&items, 3, &mut rng);
        for item in &items {
            let n = delivered.iter().filter(|d| *d == item).count();
            assert!((1..=3).contains(&n), "{item} delivered {n} times");
        }
        assert!(delivered.len() > items.len(), "some duplicates expected");
        assert_ne!(&delivered[..items.len()], &items[..], "order shuffled");
    }
}
