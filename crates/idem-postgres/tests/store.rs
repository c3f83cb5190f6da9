//! Connecting, migrating, inspecting and sweeping, and the errors a user sees
//! when the server or the schema is not there.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestDb, clock};
use idem_core::{
    AtomicStore, Clock, Error, ErrorKind, Fingerprint, IdempotencyKey, Outcome, RecordCount,
    RecordFilter, RecordState, RecordStore, Scope, Settings, SystemClock,
};
use idem_postgres::PgStore;
use sqlx::{Connection, PgConnection};

fn scope() -> Scope {
    Scope::new("jobs").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

async fn apply_noop(store: &PgStore, k: &str) {
    store
        .apply(
            &scope(),
            &key(k),
            Fingerprint::of_bytes(k.as_bytes()),
            async |conn| {
                sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
                    .execute(&mut *conn)
                    .await?;
                Ok::<_, sqlx::Error>(Outcome::empty())
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn sweep_deletes_only_expired_records_and_count_sees_them() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await; // retention 1 h

    apply_noop(&store, "old-1").await;
    apply_noop(&store, "old-2").await;
    clock.advance(Duration::from_secs(2 * 3600));
    apply_noop(&store, "new").await;

    assert_eq!(
        store.count().await.unwrap(),
        RecordCount {
            total: 3,
            expired: 2
        }
    );
    assert_eq!(store.sweep_batch(1).await.unwrap(), 1);
    assert_eq!(store.sweep(10).await.unwrap(), 1);
    assert_eq!(store.sweep(10).await.unwrap(), 0);
    assert!(store.get(&scope(), &key("old-1")).await.unwrap().is_none());
    assert!(store.get(&scope(), &key("old-2")).await.unwrap().is_none());
    assert!(store.get(&scope(), &key("new")).await.unwrap().is_some());
    assert_eq!(
        store.count().await.unwrap(),
        RecordCount {
            total: 1,
            expired: 0
        }
    );
    assert_eq!(db.balance(&store, 1).await, 103);
}

#[tokio::test]
async fn sweepers_of_several_processes_take_turns() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;
    for k in ["a", "b", "c"] {
        apply_noop(&store, k).await;
    }
    clock.advance(Duration::from_secs(2 * 3600));

    // Another process's sweeper, mid-batch: it holds the sweep lock.
    let mut other = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(idem_postgres::SWEEP_LOCK)
        .execute(&mut other)
        .await
        .unwrap();
    assert_eq!(store.sweep_batch_alone(10).await.unwrap(), None);
    assert_eq!(store.count().await.unwrap().total, 3, "nothing deleted");

    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    assert_eq!(store.sweep_batch_alone(2).await.unwrap(), Some(2));
    assert_eq!(store.sweep_batch_alone(2).await.unwrap(), Some(1));

    let glance = store.glance().await.unwrap();
    assert_eq!(glance.oldest_age, None);
}

#[tokio::test]
async fn an_expired_record_is_replaced_with_a_greater_token() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;
    apply_noop(&store, "k").await;
    clock.advance(Duration::from_secs(3600));
    apply_noop(&store, "k").await; // the window ended: applied again
    let record = store.get(&scope(), &key("k")).await.unwrap().unwrap();
    assert_eq!(record.token, idem_core::FencingToken::first_at(clock.now()));
    assert_eq!(record.created_at, clock.now());
    assert_eq!(db.balance(&store, 1).await, 102);
}

#[tokio::test]
async fn list_filters_and_shows_newest_first() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = clock();
    let store = db.store_at(&clock).await;
    for k in ["a", "b", "c"] {
        apply_noop(&store, k).await;
        clock.advance(Duration::from_secs(1));
    }
    let all = store.list(&RecordFilter::default()).await.unwrap();
    let keys: Vec<&str> = all.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["c", "b", "a"]);

    let two = store
        .list(&RecordFilter {
            limit: Some(2),
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(two.len(), 2);

    let in_flight = store
        .list(&RecordFilter {
            state: Some(RecordState::InFlight),
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert!(in_flight.is_empty());

    let other_scope = store
        .list(&RecordFilter {
            scope: Some(Scope::new("other").unwrap()),
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert!(other_scope.is_empty());
}

#[tokio::test]
async fn unreachable_server_is_unavailable_with_a_clear_message() {
    let started = Instant::now();
    let err = PgStore::connect("postgres://postgres:s3cret@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "failed fast");
    let Error::Store(store_error) = &err else {
        panic!("expected a store error, got {err:?}");
    };
    assert_eq!(store_error.kind(), ErrorKind::Unavailable);
    assert!(err.is_retryable());
    let text = err.to_string();
    assert!(
        text.contains("cannot reach PostgreSQL at 127.0.0.1:1"),
        "{text}"
    );
    assert!(text.contains("is the server running"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

#[tokio::test]
async fn missing_database_is_a_configuration_error() {
    if common::admin().await.is_none() {
        return;
    }
    let err = PgStore::connect(&common::server_url_with("idem_no_such_database"))
        .await
        .unwrap_err();
    let Error::Store(store_error) = &err else {
        panic!("expected a store error, got {err:?}");
    };
    assert_eq!(store_error.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("create the database"), "{err}");
}

#[tokio::test]
async fn missing_schema_says_to_run_the_migrations_and_migrate_fixes_it() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let store = PgStore::from_pool(pool, Settings::default(), Arc::new(SystemClock));

    let err = store.get(&scope(), &key("k")).await.unwrap_err();
    let Error::Store(store_error) = &err else {
        panic!("expected a store error, got {err:?}");
    };
    assert_eq!(store_error.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("run the migrations"), "{err}");

    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert!(store.get(&scope(), &key("k")).await.unwrap().is_none());
}

#[tokio::test]
async fn concurrent_connects_migrate_once() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let stores = futures::future::join_all((0..4).map(|_| PgStore::connect(&db.url))).await;
    for store in &stores {
        assert!(store.is_ok(), "{store:?}");
    }
    let store = stores.into_iter().next().unwrap().unwrap();
    apply_noop(&store, "k").await;
    assert_eq!(db.balance(&store, 1).await, 101);
}

/// Type-checks, never runs: every public future is `Send`, so it can be
/// spawned and used from generic code such as the conformance harness.
fn _public_futures_are_send(store: &PgStore, claim: &idem_core::Claim) {
    use idem_core::LeaseStore;

    fn send<T: Send>(_: T) {}
    let (s, k, fp) = (scope(), key("k"), Fingerprint::of_bytes(b""));
    send(PgStore::connect(""));
    send(PgStore::builder("").connect());
    send(store.apply(&s, &k, fp, async |_| Ok::<_, String>(Outcome::empty())));
    send(store.apply_replay_first(&s, &k, fp, async |_| Ok::<_, String>(Outcome::empty())));
    send(store.apply_batch(&[], |_| {
        async |_: &mut PgConnection| Ok::<_, String>(Outcome::empty())
    }));
    send(store.complete_with(claim, async |_| Ok::<_, String>(Outcome::empty())));
    send(store.transaction(async |_| Ok::<_, String>(())));
    send(store.apply_leased(&s, &k, fp, |_| async { Ok::<_, String>(Outcome::empty()) }));
    send(store.claim(&s, &k, fp));
    send(store.complete(claim, &Outcome::empty()));
    send(store.renew(claim));
    send(store.release(claim));
    send(store.migrate());
    send(store.sweep(10));
}
