//! The outbox, dead-letter and failed-attempt tables come with the store's
//! own migrations (0004 to 0006). A database an earlier idem-broker had
//! already given those tables (with its own migrations and its own ledger of
//! them) upgrades in place: its rows are kept and served.

mod common;

use common::TestDb;
use idem_core::{AtomicOutbox, ErrorKind, IdempotencyKey, OutboxMessage, RecordStore};
use idem_postgres::PgStore;
use sqlx::{Connection, PgConnection};

#[tokio::test]
async fn a_database_an_earlier_broker_made_upgrades_with_its_rows() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;

    // Back to what an earlier version left: the store's own migrations up to
    // 0003, and the broker's tables (same definitions) with rows in them and
    // the broker's record of its migrations.
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(
        "DELETE FROM _sqlx_migrations WHERE version > 3;
         CREATE TABLE idem_broker_schema (component TEXT NOT NULL PRIMARY KEY, version BIGINT NOT NULL);
         INSERT INTO idem_broker_schema VALUES ('outbox', 1), ('dead_letters', 1);
         INSERT INTO idem_outbox (destination, key, payload, headers, created_at)
             VALUES ('nats://127.0.0.1:4222/orders.created', 'order-1/created', decode('7b7d', 'hex'), '{\"tenant\":\"7\"}', 1000);
         INSERT INTO idem_dead_letters
             (origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at)
             VALUES ('relay', 'http://127.0.0.1:9/hook', 'order-0/created', decode('00', 'hex'), '{}', 5, 'HTTP 500', 10, 20);
         INSERT INTO idem_consumer_attempts VALUES ('ledger', 'poison-1', 2, 500, 600, 'boom');",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    store.migrate().await.unwrap();

    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let ledger_left: bool =
        sqlx::query_scalar("SELECT to_regclass('idem_broker_schema') IS NOT NULL")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(!ledger_left, "the earlier broker's ledger is dropped");
    let triggers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_trigger WHERE tgname = 'idem_outbox_notify'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(triggers, 1);

    idem_testkit::migrations::earlier_rows_read_back(&store).await;
    conn.close().await.ok();
}

#[tokio::test]
async fn an_enqueue_into_a_database_never_migrated_says_to_migrate() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let message = OutboxMessage {
        destination: None,
        key: IdempotencyKey::new("k-1").unwrap(),
        payload: b"x".to_vec(),
        headers: Default::default(),
    };
    let error = <PgStore as AtomicOutbox>::enqueue(&mut tx, &message)
        .await
        .unwrap_err();
    match &error {
        idem_core::Error::Store(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{error}"),
        other => panic!("not a store error: {other}"),
    }
    assert!(error.to_string().contains("migrat"), "{error}");
}
