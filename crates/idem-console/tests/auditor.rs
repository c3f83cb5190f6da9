//! The live auditor as a console panel, against real SQLite and PostgreSQL
//! stores: an effect log in the store's database where one key has two
//! effects shows the double effect after the first pass; a correct log
//! shows nothing; a console without an auditor says how to run one.

#[macro_use]
mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::{Client, Served, TestStore};
use idem::{Clock, Scope, StoreLocation};
use idem_check::audit::{AuditSettings, PassLimits, SqlLog};
use idem_check::effects::query::{Pages, PgPages, SqlitePages};
use idem_console::auditor::AuditorOptions;
use idem_console::{Access, Console};

on_every_store!(
    a_key_with_two_effects_is_shown_after_one_pass,
    a_correct_effect_log_shows_nothing,
);

const QUERY: &str = "SELECT id, key, at_ms FROM payments_applied";

/// Writes the effect log `keys` (one row each, in order) to the store's
/// database.
async fn effect_log(t: &TestStore, keys: &[&str]) {
    let at = t.clock.now().0;
    match &t.location {
        StoreLocation::Sqlite(path) => {
            let db = rusqlite::Connection::open(path).unwrap();
            db.execute_batch(
                "CREATE TABLE payments_applied (id INTEGER PRIMARY KEY, key TEXT NOT NULL, at_ms INTEGER NOT NULL)",
            )
            .unwrap();
            for key in keys {
                db.execute(
                    "INSERT INTO payments_applied (key, at_ms) VALUES (?1, ?2)",
                    rusqlite::params![key, at],
                )
                .unwrap();
            }
        }
        StoreLocation::Postgres(url) => {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query(
                "CREATE TABLE payments_applied (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, at_ms BIGINT NOT NULL)",
            )
            .execute(&pool)
            .await
            .unwrap();
            for key in keys {
                sqlx::query("INSERT INTO payments_applied (key, at_ms) VALUES ($1, $2)")
                    .bind(key)
                    .bind(at)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
        other => panic!("no effect log on {other}"),
    }
}

/// A console running the auditor over the effect log, one pass an hour
/// (so the first pass is the only one a test sees).
async fn console_with_auditor(t: &TestStore) -> (Served, tokio::task::JoinHandle<()>) {
    let pages = Pages::new(QUERY, "id").unwrap();
    let log = match &t.location {
        StoreLocation::Sqlite(path) => SqlLog::Sqlite(SqlitePages::open(path, pages).unwrap()),
        StoreLocation::Postgres(url) => SqlLog::Postgres(
            PgPages::connect(url, &t.location.to_string(), pages)
                .await
                .unwrap(),
        ),
        other => panic!("no effect log on {other}"),
    };
    let console = Console::new(t.store.clone(), Access::open());
    let auditor = console.start_auditor(
        log,
        AuditorOptions {
            effects_query: QUERY.to_owned(),
            cursor_column: "id".to_owned(),
            settings: AuditSettings {
                scopes: vec![Scope::new("payments").unwrap()],
                window: Duration::from_secs(3600),
                grace: Duration::from_secs(30),
            },
            limits: PassLimits {
                batch: 100,
                pause: Duration::from_millis(10),
            },
            interval: Duration::from_secs(3600),
            after: None,
        },
    );
    (Served::console(console).await, auditor)
}

/// The panel once its first pass is done.
async fn after_first_pass(served: &Served) -> serde_json::Value {
    let client = Client::new();
    for _ in 0..500 {
        let panel = client.get(&served.url("/api/v1/auditor"), &[]).await;
        assert_eq!(panel.status, StatusCode::OK, "{}", panel.body);
        let panel = panel.json();
        if panel["passes"].as_u64().unwrap() > 0 || panel["errors"].as_u64().unwrap() > 0 {
            return panel;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the auditor made no pass in 10 s");
}

async fn a_key_with_two_effects_is_shown_after_one_pass(t: TestStore) {
    t.record("payments", "pay-1", Some("paid")).await;
    t.record("payments", "pay-2", Some("paid")).await;
    effect_log(&t, &["pay-1", "pay-2", "pay-1"]).await;
    // Past the grace period: every record is judged in the first pass.
    t.clock.advance(Duration::from_secs(60));
    let (served, auditor) = console_with_auditor(&t).await;
    let panel = after_first_pass(&served).await;
    assert_eq!(panel["passes"], 1, "{panel}");
    assert_eq!(panel["errors"], 0, "{panel}");
    assert_eq!(panel["configured"], true);
    assert_eq!(panel["cursor"], 3);
    assert_eq!(panel["findings_by_kind"]["double_effect"], 1, "{panel}");
    assert_eq!(panel["findings_by_kind"]["missing_effect"], 0, "{panel}");
    assert_eq!(
        panel["findings_by_kind"]["effect_without_record"], 0,
        "{panel}"
    );
    let finding = &panel["latest"][0];
    assert_eq!(finding["kind"], "double_effect");
    assert_eq!(finding["scope"], "payments");
    assert_eq!(finding["key"], "pay-1");
    assert_eq!(finding["effects"][0]["cursor"], 1);
    assert_eq!(finding["effects"][1]["cursor"], 3);
    assert_eq!(finding["record"]["state"], "completed");
    assert_eq!(panel["latest"].as_array().unwrap().len(), 1);

    let page = Client::new().get(&served.url("/auditor"), &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("double effect: key &quot;pay-1&quot;"),
        "{}",
        page.body
    );
    assert!(page.body.contains(QUERY));
    auditor.abort();
}

async fn a_correct_effect_log_shows_nothing(t: TestStore) {
    let client = Client::new();
    let plain = Served::start(&t.store, Access::open()).await;
    let panel = client.get(&plain.url("/api/v1/auditor"), &[]).await.json();
    assert_eq!(panel["configured"], false);
    let page = client.get(&plain.url("/auditor"), &[]).await;
    assert!(page.body.contains("No auditor runs in this console"));
    assert!(page.body.contains("--audit-effects-query"));

    t.record("payments", "pay-1", Some("paid")).await;
    t.record("payments", "pay-2", Some("paid")).await;
    effect_log(&t, &["pay-1", "pay-2"]).await;
    t.clock.advance(Duration::from_secs(60));
    let (served, auditor) = console_with_auditor(&t).await;
    let panel = after_first_pass(&served).await;
    assert_eq!(
        (panel["passes"].as_u64(), panel["errors"].as_u64()),
        (Some(1), Some(0)),
        "{panel}"
    );
    assert_eq!(panel["cursor"], 2);
    for kind in ["double_effect", "missing_effect", "effect_without_record"] {
        assert_eq!(panel["findings_by_kind"][kind], 0, "{kind}: {panel}");
    }
    assert!(panel["latest"].as_array().unwrap().is_empty());
    let page = client.get(&served.url("/auditor"), &[]).await;
    assert!(page.body.contains("Nothing found."), "{}", page.body);
    auditor.abort();
}
