//! The effects query on PostgreSQL, on a fresh database.

use idem_check::effects::query;
use idem_testkit::postgres::TestDatabase;
use sqlx::{Connection, PgConnection};

#[tokio::test]
async fn rows_become_effects_in_the_order_of_the_query() {
    let Some(db) = TestDatabase::create("idem_check_query").await else {
        return;
    };
    let mut conn = PgConnection::connect(db.url()).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE ledger (id serial PRIMARY KEY, order_id integer NOT NULL,
                              tenant varchar(20), account text, version smallint);
         INSERT INTO ledger (order_id, tenant, account, version) VALUES
           (42, 'acme', 'acc-7', 3), (43, NULL, NULL, NULL);",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let sql = "SELECT order_id AS key, tenant AS scope, account AS resource, version AS fence
               FROM ledger ORDER BY id DESC";
    let effects = query::postgres(db.url(), "test database", sql)
        .await
        .unwrap();
    assert_eq!(effects.len(), 2);
    assert_eq!(effects[0].key, "43");
    assert_eq!(effects[0].scope, None);
    assert_eq!(effects[1].key, "42");
    assert_eq!(effects[1].scope.as_deref(), Some("acme"));
    assert_eq!(effects[1].resource.as_deref(), Some("acc-7"));
    assert_eq!(effects[1].fence, Some(3));

    let no_key = query::postgres(db.url(), "test database", "SELECT id FROM ledger")
        .await
        .unwrap_err();
    assert!(
        no_key
            .to_string()
            .contains("no column \"key\" (it returns: id)"),
        "{no_key}"
    );
    let bad_fence = query::postgres(
        db.url(),
        "test database",
        "SELECT order_id AS key, account AS fence FROM ledger ORDER BY id",
    )
    .await
    .unwrap_err();
    assert!(
        bad_fence
            .to_string()
            .contains("column \"fence\" is not an integer"),
        "{bad_fence}"
    );
    let failed = query::postgres(db.url(), "test database", "SELECT nope FROM ledger")
        .await
        .unwrap_err();
    assert!(
        failed.to_string().contains("the effects query failed"),
        "{failed}"
    );
    let empty = query::postgres(
        db.url(),
        "test database",
        "SELECT order_id AS key FROM ledger WHERE false",
    )
    .await
    .unwrap();
    assert!(empty.is_empty());
    let empty_without_key = query::postgres(
        db.url(),
        "test database",
        "SELECT id FROM ledger WHERE false",
    )
    .await
    .unwrap_err();
    assert!(
        empty_without_key.to_string().contains("no column \"key\""),
        "{empty_without_key}"
    );
}
