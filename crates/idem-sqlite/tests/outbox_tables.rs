//! The outbox, dead-letter and failed-attempt tables come with the store's
//! own migrations (schema versions 3 to 5). A file an earlier idem-broker had
//! already given those tables (with its own migrations and its own ledger of
//! them) upgrades in place: its rows are kept and served.

use idem_sqlite::{SCHEMA_VERSION, SqliteStore};

#[tokio::test]
async fn a_file_an_earlier_broker_made_upgrades_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");

    // Back to what an earlier version left: the store's own schema at version
    // 2, and the broker's tables (same definitions) with rows in them and the
    // broker's record of its migrations; nothing later migrations add.
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .with_connection(|conn| {
            conn.execute_batch(
                "PRAGMA user_version = 2;
                 DROP TABLE idem_audit;
                 DROP TABLE idem_tombstones;
                 ALTER TABLE idem_dead_letters DROP COLUMN archived_at;
                 CREATE TABLE idem_broker_schema (component TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL);
                 INSERT INTO idem_broker_schema VALUES ('outbox', 1), ('dead_letters', 1);
                 INSERT INTO idem_outbox (destination, key, payload, headers, created_at)
                     VALUES ('nats://127.0.0.1:4222/orders.created', 'order-1/created', X'7b7d', '{\"tenant\":\"7\"}', 1000);
                 INSERT INTO idem_dead_letters
                     (origin, destination, key, payload, headers, attempts, last_error, first_seen_at, dead_at)
                     VALUES ('relay', 'http://127.0.0.1:9/hook', 'order-0/created', X'00', '{}', 5, 'HTTP 500', 10, 20);
                 INSERT INTO idem_consumer_attempts VALUES ('ledger', 'poison-1', 2, 500, 600, 'boom');",
            )
        })
        .await
        .unwrap()
        .unwrap();
    drop(store);

    let store = SqliteStore::open(&path).await.unwrap();
    let (version, ledger_left): (i64, bool) = store
        .with_connection(|conn| {
            let version = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
            let left = conn.query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'idem_broker_schema'",
                [],
                |row| row.get(0),
            )?;
            Ok::<_, idem_sqlite::rusqlite::Error>((version, left))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert!(!ledger_left, "the earlier broker's ledger is dropped");

    idem_testkit::migrations::earlier_rows_read_back(&store).await;
}
