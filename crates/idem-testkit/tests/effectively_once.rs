//! The public property, on a handler of the test's own: a credit handler
//! that applies each message once through Idem passes; the same handler
//! without the dedupe is caught, with the case that shows it.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{AtomicStore, Fingerprint, IdempotencyKey, Outcome, Scope, SqliteStore};
use idem_testkit::deliveries::EffectivelyOnce;
use proptest::prelude::*;

type Credit = (u32, i64, i64);

fn credits() -> impl Strategy<Value = Vec<Credit>> {
    prop::collection::vec((0u32..1000, 0i64..3, 1i64..50), 1..10).prop_map(|mut m| {
        m.sort_by_key(|m| m.0);
        m.dedup_by_key(|m| m.0);
        m
    })
}

fn bank(dir: &tempfile::TempDir) -> SqliteStore {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = SqliteStore::open(dir.path().join("bank.db")).await.unwrap();
        store
            .transaction(async |tx| {
                tx.execute_batch(
                    "CREATE TABLE balances (world INTEGER, account INTEGER, cents INTEGER, \
                     PRIMARY KEY (world, account))",
                )
            })
            .await
            .unwrap();
        store
    })
}

const CREDIT: &str = "INSERT INTO balances VALUES (?1, ?2, ?3) \
     ON CONFLICT (world, account) DO UPDATE SET cents = cents + excluded.cents";

async fn balances(store: &SqliteStore, world: i64) -> Vec<(i64, i64)> {
    store
        .transaction(async move |tx| {
            let mut rows = tx
                .prepare("SELECT account, cents FROM balances WHERE world = ?1 ORDER BY account")?;
            rows.query_map([world], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .unwrap()
}

#[test]
fn a_handler_that_applies_through_idem_passes() {
    let dir = tempfile::tempdir().unwrap();
    let store = bank(&dir);
    let worlds = AtomicUsize::new(0);
    EffectivelyOnce::new()
        .cases(24)
        .check(credits(), |deliveries| {
            let (store, world) = (store.clone(), worlds.fetch_add(1, Ordering::SeqCst) as i64);
            async move {
                let scope = Scope::new(format!("credits-{world}")).unwrap();
                for (id, account, cents) in deliveries {
                    let key = IdempotencyKey::new(format!("msg-{id}")).unwrap();
                    store
                        .apply(
                            &scope,
                            &key,
                            Fingerprint::of_bytes(&cents.to_le_bytes()),
                            async move |tx| {
                                tx.execute(CREDIT, (world, account, cents))?;
                                Ok::<_, idem::rusqlite::Error>(Outcome::empty())
                            },
                        )
                        .await
                        .unwrap();
                }
                balances(&store, world).await
            }
        })
        .unwrap();
}

#[test]
fn the_same_handler_without_the_dedupe_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let store = bank(&dir);
    let worlds = AtomicUsize::new(0);
    let caught = EffectivelyOnce::new()
        .cases(24)
        .check(credits(), |deliveries| {
            let (store, world) = (store.clone(), worlds.fetch_add(1, Ordering::SeqCst) as i64);
            async move {
                for (_, account, cents) in deliveries {
                    store
                        .transaction(async move |tx| tx.execute(CREDIT, (world, account, cents)))
                        .await
                        .unwrap();
                }
                balances(&store, world).await
            }
        })
        .unwrap_err()
        .to_string();
    assert!(
        caught.contains("delivered once ended in") && caught.contains("they ended in"),
        "{caught}"
    );
}
