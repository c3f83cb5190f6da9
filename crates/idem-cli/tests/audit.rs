//! `idem audit`, run as an operator would beside a service, on a real
//! SQLite file and a real PostgreSQL database: the service writes its
//! ledger rows through Idem's atomic apply (or, for the broken handler, a
//! second time by hand), and the auditor reads them with an effects query.

mod common;

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use idem::{
    AnyConnection, AnyStore, AtomicStore, Fingerprint, IdempotencyKey, ManualClock, Outcome, Scope,
    Settings, StoreLocation,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::store::TestStore;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const QUERY: &str = "SELECT id, order_id AS key FROM ledger";

/// The tests' use of their store: the service's ledger table in its
/// database, and `idem audit` run on it.
impl TestStore {
    /// The store, its clock standing `ago` in the past, with the ledger.
    async fn store_at(&self, ago: Duration) -> AnyStore {
        let clock = ManualClock::starting_now();
        clock.set(idem::Timestamp(
            idem::Clock::now(&clock).0 - ago.as_millis() as i64,
        ));
        let store = AnyStore::open_with(&self.location(), Settings::default(), Arc::new(clock))
            .await
            .unwrap();
        let ledger = match self.location() {
            StoreLocation::Sqlite(_) => {
                "CREATE TABLE IF NOT EXISTS ledger (id INTEGER PRIMARY KEY, order_id TEXT NOT NULL, amount INTEGER NOT NULL)"
            }
            _ => {
                "CREATE TABLE IF NOT EXISTS ledger (id SERIAL PRIMARY KEY, order_id TEXT NOT NULL, amount INTEGER NOT NULL)"
            }
        };
        self.execute(&store, ledger).await;
        store
    }

    async fn store(&self) -> AnyStore {
        self.store_at(Duration::ZERO).await
    }

    /// Runs SQL on the store's database, outside any record.
    async fn execute(&self, store: &AnyStore, sql: &str) {
        match store {
            AnyStore::Sqlite(_) => {
                let StoreLocation::Sqlite(path) = self.location() else {
                    unreachable!()
                };
                let conn = idem::rusqlite::Connection::open(path).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                conn.execute_batch(sql).unwrap();
            }
            AnyStore::Postgres(pg) => {
                idem::sqlx::raw_sql(idem::sqlx::AssertSqlSafe(sql.to_owned()))
                    .execute(pg.pool())
                    .await
                    .unwrap();
            }
            _ => unreachable!("SQL stores only"),
        }
    }

    /// A ledger row for `key` written without Idem: the broken handler.
    async fn insert_bare(&self, store: &AnyStore, key: &str) {
        self.execute(
            store,
            &format!("INSERT INTO ledger (order_id, amount) VALUES ('{key}', 10)"),
        )
        .await;
    }

    /// `idem --store URL audit --once --json --scope payments ARGS…`.
    async fn audit(&self, args: &[&str]) -> Output {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("--store")
            .arg(&self.url)
            .args(["audit", "--once", "--json", "--scope", "payments"])
            .args(["--effects-query", QUERY, "--pause", "0s"])
            .args(args)
            .env_remove("IDEM_STORE")
            .output()
            .await
            .expect("run idem audit")
    }
}

/// Delivers `key` through atomic apply: the ledger row and the record
/// commit together, and a duplicate is replayed without a second row.
/// `write` false completes the record without writing the row (an effect
/// lost by the handler).
async fn deliver(store: &AnyStore, key: &str, write: bool) -> bool {
    let (scope, key) = (
        Scope::new("payments").unwrap(),
        IdempotencyKey::new(key).unwrap(),
    );
    let row = key.to_string();
    let applied = store
        .apply(
            &scope,
            &key,
            Fingerprint::of_bytes(b"10 EUR"),
            async move |tx| -> Result<Outcome, BoxError> {
                if write {
                    match tx.connection() {
                        AnyConnection::Sqlite(conn) => {
                            conn.execute(
                                "INSERT INTO ledger (order_id, amount) VALUES (?1, 10)",
                                [&row],
                            )?;
                        }
                        AnyConnection::Postgres(conn) => {
                            idem::sqlx::query(
                                "INSERT INTO ledger (order_id, amount) VALUES ($1, 10)",
                            )
                            .bind(&row)
                            .execute(conn)
                            .await?;
                        }
                    }
                }
                Ok(Outcome::success("paid"))
            },
        )
        .await
        .unwrap();
    !applied.is_replay()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The findings of a `--json` run, after checking its exit status: 0 when
/// it found nothing, 1 otherwise.
fn findings(out: &Output) -> Vec<Value> {
    let found: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON finding per line"))
        .collect();
    let expected = if found.is_empty() { 0 } else { 1 };
    assert_eq!(
        out.status.code(),
        Some(expected),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    found
}

/// `(kind, key, effect row cursors)` of each finding.
fn summary(found: &[Value]) -> Vec<(String, String, Vec<i64>)> {
    let mut rows: Vec<_> = found
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_owned(),
                f["key"].as_str().unwrap().to_owned(),
                f["effects"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["cursor"].as_i64().unwrap())
                    .collect(),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// The number in the pass summary, such as "12 effect rows".
fn read_rows(out: &Output) -> u64 {
    let stderr = text(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("pass: "))
        .unwrap_or_else(|| panic!("no pass summary in:\n{stderr}"));
    line["pass: ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_handler_that_applies_twice_is_found_within_one_pass() {
    for backend in TestStore::sqlite_and_postgres("idem_t_audit").await {
        let store = backend.store().await;
        for key in ["order-1", "order-2", "order-3"] {
            assert!(deliver(&store, key, true).await);
        }
        // The broken handler: order-2's row written again, and a row for a
        // key that never went through Idem.
        backend.insert_bare(&store, "order-2").await;
        backend.insert_bare(&store, "order-9").await;

        let found = findings(&backend.audit(&[]).await);
        assert_eq!(
            summary(&found),
            [
                ("double_effect".to_owned(), "order-2".to_owned(), vec![2, 4]),
                (
                    "effect_without_record".to_owned(),
                    "order-9".to_owned(),
                    vec![5]
                ),
            ],
            "{} {found:#?}",
            backend.url
        );
        let double = found.iter().find(|f| f["kind"] == "double_effect").unwrap();
        assert_eq!(double["scope"], "payments");
        assert_eq!(double["count"], 2);
        assert_eq!(double["record"]["state"], "completed");
    }
}

#[tokio::test]
async fn a_correct_handler_under_duplicates_yields_nothing() {
    for backend in TestStore::sqlite_and_postgres("idem_t_audit").await {
        let store = backend.store().await;
        let mut applied = 0;
        for n in 0..300 {
            let key = format!("order-{n}");
            // Each message delivered one to three times.
            for _ in 0..=(n % 3) {
                applied += usize::from(deliver(&store, &key, true).await);
            }
        }
        assert_eq!(applied, 300);
        let out = backend.audit(&["--batch", "64"]).await;
        assert!(findings(&out).is_empty());
        assert_eq!(read_rows(&out), 300, "{}", backend.url);
    }
}

#[tokio::test]
async fn a_completed_record_without_its_effect_is_found_only_after_the_grace() {
    for backend in TestStore::sqlite_and_postgres("idem_t_audit").await {
        // Completed ten minutes ago, without its row; and one with its row.
        let earlier = backend.store_at(Duration::from_secs(600)).await;
        assert!(deliver(&earlier, "order-lost", false).await);
        assert!(deliver(&earlier, "order-kept", true).await);

        let within = findings(&backend.audit(&["--grace", "15m"]).await);
        assert!(within.is_empty(), "{} {within:#?}", backend.url);

        let after = findings(&backend.audit(&["--grace", "5m"]).await);
        assert_eq!(
            summary(&after),
            [("missing_effect".to_owned(), "order-lost".to_owned(), vec![])],
            "{}",
            backend.url
        );
        assert_eq!(after[0]["record"]["state"], "completed");
    }
}

#[tokio::test]
async fn a_start_cursor_reads_only_the_rows_past_it() {
    for backend in TestStore::sqlite_and_postgres("idem_t_audit").await {
        let store = backend.store().await;
        for n in 0..40 {
            deliver(&store, &format!("order-{n}"), true).await;
        }
        let out = backend.audit(&["--batch", "16"]).await;
        assert!(findings(&out).is_empty());
        assert_eq!(read_rows(&out), 40);
        for n in 40..50 {
            deliver(&store, &format!("order-{n}"), true).await;
        }
        let out = backend.audit(&["--after", "40"]).await;
        assert!(findings(&out).is_empty());
        assert_eq!(read_rows(&out), 10, "{}", backend.url);
    }
}

/// `GET /metrics` on `addr`, as text.
async fn scrape(addr: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// A sample's value in a scrape (0 when absent).
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Scrapes until `done` holds for the metrics, for up to 30 s.
async fn until(addr: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(metrics) = scrape(addr).await
            && done(&metrics)
        {
            return metrics;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_running_auditor_reads_each_row_once_and_reports_each_finding_once() {
    for backend in TestStore::sqlite_and_postgres("idem_t_audit").await {
        let store = backend.store().await;
        for n in 0..30 {
            deliver(&store, &format!("order-{n}"), true).await;
        }
        let addr = format!("127.0.0.1:{}", free_port());
        let mut auditor = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("--store")
            .arg(&backend.url)
            .args([
                "audit",
                "--json",
                "--scope",
                "payments",
                "--effects-query",
                QUERY,
            ])
            .args(["--batch", "8", "--pause", "0s", "--interval", "100ms"])
            .args(["--admin-listen", &addr])
            .env_remove("IDEM_STORE")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let rows = |n: f64| move |m: &str| sample(m, "audit_rows_read_total") == n;
        until(&addr, "30 rows read", rows(30.0)).await;

        for n in 30..40 {
            deliver(&store, &format!("order-{n}"), true).await;
        }
        backend.insert_bare(&store, "order-35").await;
        let metrics = until(&addr, "41 rows read", rows(41.0)).await;
        let double = "audit_findings_total{kind=\"double_effect\"}";
        assert_eq!(sample(&metrics, double), 1.0, "{metrics}");
        // Further passes read nothing new and report nothing again.
        let passes = sample(&metrics, "audit_passes_total");
        let metrics = until(&addr, "three more passes", |m| {
            sample(m, "audit_passes_total") >= passes + 3.0
        })
        .await;
        assert_eq!(sample(&metrics, "audit_rows_read_total"), 41.0);
        assert_eq!(sample(&metrics, double), 1.0);
        assert_eq!(
            sample(
                &metrics,
                "audit_findings_total{kind=\"effect_without_record\"}"
            ),
            0.0
        );
        assert_eq!(sample(&metrics, "audit_cursor"), 41.0);

        auditor.start_kill().unwrap();
        let out = auditor.wait_with_output().await.unwrap();
        let found: Vec<Value> = text(&out.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(
            summary(&found),
            [(
                "double_effect".to_owned(),
                "order-35".to_owned(),
                vec![36, 41]
            )],
            "{}",
            backend.url
        );
    }
}

#[tokio::test]
async fn record_pages_walk_each_record_of_the_scopes_once_in_window_order() {
    use idem::{ExpiryPosition, RecordScan};
    for backend in TestStore::sqlite_and_postgres("idem_t_audit").await {
        let store = backend.store().await;
        let other = Scope::new("refunds").unwrap();
        for n in 0..23 {
            deliver(&store, &format!("order-{n}"), true).await;
            store
                .apply(
                    &other,
                    &IdempotencyKey::new(format!("refund-{n}")).unwrap(),
                    Fingerprint::of_bytes(b"1 EUR"),
                    async |_| -> Result<Outcome, BoxError> { Ok(Outcome::success("ok")) },
                )
                .await
                .unwrap();
        }
        let scopes = [Scope::new("payments").unwrap()];
        let (mut after, mut walked) = (None::<ExpiryPosition>, Vec::new());
        loop {
            let page = store
                .records_by_expiry(&scopes, after.as_ref(), 4)
                .await
                .unwrap();
            assert!(page.len() <= 4);
            let Some(last) = page.last() else { break };
            after = Some(ExpiryPosition::after(last));
            walked.extend(page);
        }
        assert_eq!(walked.len(), 23, "{}", backend.url);
        assert!(walked.iter().all(|r| r.scope == scopes[0]));
        let order: Vec<_> = walked
            .iter()
            .map(|r| (r.expires_at, r.scope.to_string(), r.key.to_string()))
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(order, sorted, "{}", backend.url);

        let wanted = [
            (scopes[0].clone(), IdempotencyKey::new("order-3").unwrap()),
            (other.clone(), IdempotencyKey::new("refund-4").unwrap()),
            (
                scopes[0].clone(),
                IdempotencyKey::new("order-none").unwrap(),
            ),
        ];
        let mut found: Vec<_> = store
            .records_of(&wanted)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.key.to_string())
            .collect();
        found.sort();
        assert_eq!(found, ["order-3", "refund-4"], "{}", backend.url);
    }
}
