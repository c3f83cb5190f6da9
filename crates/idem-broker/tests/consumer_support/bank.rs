//! The effect under test, on either store: debit an account and write a
//! ledger row per applied message. Effects are counted from the ledger.
//!
//! Payloads are JSON: `{"amount": 10}`; `{"amount": 10, "poison": true}`
//! fails until the `poison_fixed` switch is turned on (the "fix" before a
//! redrive).

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use futures::FutureExt;
use idem::sqlite::rusqlite;
use idem::{Outcome, PgStore, SqliteStore};
use idem_broker::consume::{ApplyBatch, ConsumerStore, KeyedMessage, PgApply, SqliteApply};
use idem_testkit::crash::{CrashPoint, reach};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// The opening balance of account 1.
pub const OPENING_BALANCE: i64 = 1_000_000;

#[derive(Debug, serde::Deserialize)]
struct Order {
    amount: i64,
    #[serde(default)]
    poison: bool,
}

fn order(message: &KeyedMessage) -> Result<Order, String> {
    serde_json::from_slice(message.payload()).map_err(|e| format!("not an order: {e}"))
}

/// A store with the bank's tables, and the effect that writes them.
pub trait Bank: Sized + Send + Sync + 'static {
    /// The store.
    type Store: ConsumerStore;
    /// The effect applied through the store.
    type Apply: ApplyBatch<Store = Self::Store>;
    /// What the bank calls itself in test output.
    const NAME: &'static str;

    /// A fresh bank, or `None` when the store's server is missing.
    fn start() -> impl Future<Output = Option<Self>> + Send;
    /// The bank at `location` (a child process's view of its parent's bank).
    fn at(location: &str) -> impl Future<Output = Self> + Send;
    /// Where it lives, for a child process.
    fn location(&self) -> String;
    /// The store.
    fn store(&self) -> Self::Store;
    /// The debit effect; with `crash_inside`, it writes, then stops the
    /// process at [`CrashPoint::InsideEffect`] before anything commits.
    fn apply(&self, crash_inside: bool) -> Self::Apply;
    /// The keys in the ledger, one per applied effect, sorted.
    fn ledger(&self) -> impl Future<Output = Vec<String>> + Send;
    /// The balance of account 1.
    fn balance(&self) -> impl Future<Output = i64> + Send;
    /// Makes poison messages apply from now on.
    fn fix_poison(&self) -> impl Future<Output = ()> + Send;
}

use std::future::Future;

/// The bank on the embedded store, in a temporary directory.
pub struct SqliteBank {
    store: SqliteStore,
    _dir: Option<tempfile::TempDir>,
}

const SQLITE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
    INSERT OR IGNORE INTO accounts VALUES (1, 1000000);
    CREATE TABLE IF NOT EXISTS ledger (key TEXT NOT NULL, amount INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS switches (name TEXT PRIMARY KEY, flag INTEGER NOT NULL);
    INSERT OR IGNORE INTO switches VALUES ('poison_fixed', 0);";

fn sqlite_debit(
    tx: &rusqlite::Transaction<'_>,
    message: &KeyedMessage,
    crash_inside: bool,
) -> Result<Outcome, String> {
    let order = order(message)?;
    let fixed: i64 = tx
        .query_row(
            "SELECT flag FROM switches WHERE name = 'poison_fixed'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    if order.poison && fixed == 0 {
        return Err("poison: this order cannot be applied".into());
    }
    tx.execute(
        "UPDATE accounts SET balance = balance - ?1 WHERE id = 1",
        [order.amount],
    )
    .map_err(|e| e.to_string())?;
    tx.execute(
        "INSERT INTO ledger (key, amount) VALUES (?1, ?2)",
        rusqlite::params![message.key.as_str(), order.amount],
    )
    .map_err(|e| e.to_string())?;
    if crash_inside {
        reach(CrashPoint::InsideEffect);
    }
    Ok(Outcome::success(format!("debited {}", order.amount)))
}

type SqliteEffect =
    Box<dyn Fn(&rusqlite::Transaction<'_>, &KeyedMessage) -> Result<Outcome, String> + Send + Sync>;

impl Bank for SqliteBank {
    type Store = SqliteStore;
    type Apply = SqliteApply<SqliteEffect>;
    const NAME: &'static str = "sqlite";

    async fn start() -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut bank = Self::at(&dir.path().join("bank.db").display().to_string()).await;
        bank._dir = Some(dir);
        Some(bank)
    }

    async fn at(location: &str) -> Self {
        let store = SqliteStore::open(location)
            .await
            .expect("open sqlite store");
        store
            .with_connection(|c| c.execute_batch(SQLITE_TABLES))
            .await
            .expect("writer")
            .expect("bank tables");
        Self { store, _dir: None }
    }

    fn location(&self) -> String {
        self.store.path().display().to_string()
    }

    fn store(&self) -> SqliteStore {
        self.store.clone()
    }

    fn apply(&self, crash_inside: bool) -> Self::Apply {
        let effect: SqliteEffect =
            Box::new(move |tx, message| sqlite_debit(tx, message, crash_inside));
        SqliteApply::new(self.store.clone(), effect)
    }

    async fn ledger(&self) -> Vec<String> {
        self.store
            .with_connection(|c| {
                let mut statement = c.prepare("SELECT key FROM ledger ORDER BY key")?;
                statement
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .await
            .expect("writer")
            .expect("read ledger")
    }

    async fn balance(&self) -> i64 {
        self.store
            .with_connection(|c| {
                c.query_row("SELECT balance FROM accounts WHERE id = 1", [], |r| {
                    r.get(0)
                })
            })
            .await
            .expect("writer")
            .expect("read balance")
    }

    async fn fix_poison(&self) {
        self.store
            .with_connection(|c| {
                c.execute(
                    "UPDATE switches SET flag = 1 WHERE name = 'poison_fixed'",
                    [],
                )
            })
            .await
            .expect("writer")
            .expect("fix");
    }
}

/// The bank on PostgreSQL, in a database of its own, dropped after.
pub struct PgBank {
    store: PgStore,
    url: String,
    _db: Option<TestDb>,
}

const PG_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL);
    INSERT INTO accounts VALUES (1, 1000000) ON CONFLICT DO NOTHING;
    CREATE TABLE IF NOT EXISTS ledger (key TEXT NOT NULL, amount BIGINT NOT NULL);
    CREATE TABLE IF NOT EXISTS switches (name TEXT PRIMARY KEY, flag INT NOT NULL);
    INSERT INTO switches VALUES ('poison_fixed', 0) ON CONFLICT DO NOTHING;";

async fn pg_debit(
    conn: &mut PgConnection,
    message: &KeyedMessage,
    crash_inside: bool,
) -> Result<Outcome, String> {
    let order = order(message)?;
    let fixed: i32 = sqlx::query_scalar("SELECT flag FROM switches WHERE name = 'poison_fixed'")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    if order.poison && fixed == 0 {
        return Err("poison: this order cannot be applied".into());
    }
    sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = 1")
        .bind(order.amount)
        .execute(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query("INSERT INTO ledger (key, amount) VALUES ($1, $2)")
        .bind(message.key.as_str())
        .bind(order.amount)
        .execute(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    if crash_inside {
        reach(CrashPoint::InsideEffect);
    }
    Ok(Outcome::success(format!("debited {}", order.amount)))
}

type PgEffect = Box<
    dyn for<'c> Fn(
            &'c mut PgConnection,
            &'c KeyedMessage,
        ) -> futures::future::BoxFuture<'c, Result<Outcome, String>>
        + Send
        + Sync,
>;

impl Bank for PgBank {
    type Store = PgStore;
    type Apply = PgApply<PgEffect>;
    const NAME: &'static str = "postgres";

    async fn start() -> Option<Self> {
        let db = TestDb::new().await?;
        let mut bank = Self::at(&db.url).await;
        bank._db = Some(db);
        Some(bank)
    }

    async fn at(location: &str) -> Self {
        let store = PgStore::connect(location).await.expect("connect store");
        sqlx::raw_sql(PG_TABLES)
            .execute(store.pool())
            .await
            .expect("bank tables");
        Self {
            store,
            url: location.to_owned(),
            _db: None,
        }
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    fn store(&self) -> PgStore {
        self.store.clone()
    }

    fn apply(&self, crash_inside: bool) -> Self::Apply {
        let effect: PgEffect =
            Box::new(move |conn, message| pg_debit(conn, message, crash_inside).boxed());
        PgApply::new(self.store.clone(), effect)
    }

    async fn ledger(&self) -> Vec<String> {
        sqlx::query_scalar("SELECT key FROM ledger ORDER BY key")
            .fetch_all(self.store.pool())
            .await
            .expect("read ledger")
    }

    async fn balance(&self) -> i64 {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 1")
            .fetch_one(self.store.pool())
            .await
            .expect("read balance")
    }

    async fn fix_poison(&self) {
        sqlx::query("UPDATE switches SET flag = 1 WHERE name = 'poison_fixed'")
            .execute(self.store.pool())
            .await
            .expect("fix");
    }
}

/// A throwaway PostgreSQL database, dropped when the test ends.
pub struct TestDb {
    pub url: String,
    _database: idem_testkit::postgres::TestDatabase,
}

impl TestDb {
    pub async fn new() -> Option<TestDb> {
        let database = idem_testkit::postgres::TestDatabase::create("idem_broker_t").await?;
        Some(TestDb {
            url: database.url().to_owned(),
            _database: database,
        })
    }
}

/// Shares a bank between the test and a consumer task.
pub type Shared<B> = Arc<B>;
