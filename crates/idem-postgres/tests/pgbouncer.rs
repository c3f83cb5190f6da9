//! The store through a private PgBouncer in transaction pooling mode
//! (`idem_testkit::pgbouncer`), beyond the conformance suite (which runs
//! through it too): how a refused start-up parameter is explained, migrations
//! run by several processes at once, and no `LISTEN` where nothing would be
//! delivered.

mod common;

use std::sync::Arc;

use idem_core::{
    AtomicStore, ErrorKind, Fingerprint, IdempotencyKey, OutboxStore, Outcome, RecordStore, Scope,
};
use idem_postgres::PgStore;
use idem_testkit::pgbouncer::{PgBouncer, PgBouncerConfig};
use sqlx::{Connection, PgConnection};

use common::TestDb;

/// Applies one debit of account 1 under `key`; whether it was a replay.
async fn debit(store: &PgStore, key: &str) -> bool {
    let scope = Scope::new("payments").unwrap();
    let key = IdempotencyKey::new(key).unwrap();
    store
        .apply(
            &scope,
            &key,
            Fingerprint::of_bytes(b"debit 10"),
            async |conn| -> sqlx::Result<Outcome> {
                sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
                    .execute(&mut *conn)
                    .await?;
                Ok(Outcome::success("debited"))
            },
        )
        .await
        .unwrap()
        .is_replay()
}

/// A test database, and a PgBouncer in front of its server that does not
/// ignore `extra_float_digits`; `None` when either cannot start.
async fn refusing_bouncer() -> Option<(TestDb, PgBouncer)> {
    let db = TestDb::new().await?;
    let config = PgBouncerConfig {
        ignore_extra_float_digits: false,
        ..PgBouncerConfig::default()
    };
    let bouncer = PgBouncer::start_with(&config)?;
    Some((db, bouncer))
}

/// A PgBouncer that does not ignore `extra_float_digits` refuses sqlx's
/// connections. That refusal gives it away: the store connects as with
/// `pgbouncer=true` and applies each key once.
#[tokio::test]
async fn a_pgbouncer_refusing_extra_float_digits_is_detected() {
    let Some((db, bouncer)) = refusing_bouncer().await else {
        return;
    };
    let store = PgStore::connect(&bouncer.route(&db.url))
        .await
        .expect("detected, connected without extra_float_digits");
    assert!(
        !store.can_listen("this test"),
        "pgbouncer=true was not turned on"
    );
    assert!(store.wake_ups().await.unwrap().is_none());
    assert!(!debit(&store, "order-1").await);
    assert!(debit(&store, "order-1").await);
    assert!(debit(&store, "order-1").await);
    assert_eq!(db.balance(&store, 1).await, 90, "one debit for one key");
}

/// Where the refusal is not looked into (a URL naming the session it wants,
/// which sends the store through its list of servers), the error says which
/// setting to add.
#[tokio::test]
async fn a_refused_startup_parameter_is_explained() {
    let Some((db, bouncer)) = refusing_bouncer().await else {
        return;
    };
    let url = format!("{}?target_session_attrs=any", bouncer.route(&db.url));
    let refused = PgStore::connect(&url).await.unwrap_err();
    assert!(
        matches!(&refused, idem_core::Error::Store(e) if e.kind() == ErrorKind::Config),
        "{refused:?}"
    );
    let said = refused.to_string();
    assert!(
        said.contains("ignore_startup_parameters = extra_float_digits"),
        "{said}"
    );
    assert!(said.contains("pgbouncer=true"), "{said}");
    let store = PgStore::connect(&format!("{url}&pgbouncer=true"))
        .await
        .expect("pgbouncer=true does not send extra_float_digits");
    assert!(!debit(&store, "order-2").await);
    assert!(debit(&store, "order-2").await);
    assert_eq!(db.balance(&store, 1).await, 90);
}

/// Several processes starting at once on an empty database all migrate
/// through the pooler, one after the other, and leave no advisory lock
/// behind on PgBouncer's server connections (sqlx's migrator would leave its
/// session lock on one of them, and every later migration would wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_through_pgbouncer_hold_no_session_lock() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let Some(bouncer) = PgBouncer::start() else {
        return;
    };
    let url = Arc::new(format!("{}?pgbouncer=true", bouncer.route(&db.url)));
    let mut starting = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let url = Arc::clone(&url);
        starting.spawn(async move { PgStore::connect(&url).await });
    }
    let stores: Vec<PgStore> = starting
        .join_all()
        .await
        .into_iter()
        .map(|started| started.expect("migrated through PgBouncer"))
        .collect();
    // Migrating again is a no-op, through the pooler too.
    stores[0].migrate().await.unwrap();

    let mut direct = PgConnection::connect(&db.url).await.unwrap();
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
         WHERE l.locktype = 'advisory' AND d.datname = current_database()",
    )
    .fetch_one(&mut direct)
    .await
    .unwrap();
    assert_eq!(held, 0, "an advisory lock outlived its transaction");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert!(applied >= 9, "{applied} migrations applied");
    direct.close().await.ok();

    // Every process applies each key once, whichever server connection it
    // is lent.
    for (i, store) in stores.iter().enumerate() {
        assert_eq!(debit(store, "order-7").await, i > 0);
    }
    assert_eq!(db.balance(&stores[0], 1).await, 90);
}

/// With `pgbouncer=true` the relay gets no wake-ups (it polls): a `LISTEN`
/// through a transaction pooler would never hear anything.
#[tokio::test]
async fn pgbouncer_true_offers_no_wake_ups() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let Some(bouncer) = PgBouncer::start() else {
        return;
    };
    let pooled = PgStore::connect(&format!("{}?pgbouncer=true", bouncer.route(&db.url)))
        .await
        .unwrap();
    assert!(pooled.wake_ups().await.unwrap().is_none());
    assert!(!pooled.can_listen("this test"));
    let direct = db.store().await;
    assert!(direct.wake_ups().await.unwrap().is_some());
    assert!(direct.can_listen("this test"));
}
