//! The effect under test, on each store: debit an account and write a
//! ledger row (on DynamoDB, a ledger item) per applied message. Effects are
//! counted from the ledger.
//!
//! Payloads are JSON: `{"amount": 10}`; `{"amount": 10, "poison": true}`
//! fails until the `poison_fixed` switch is turned on (the "fix" before a
//! redrive).

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use idem::dynamodb::Transaction;
use idem::dynamodb::aws_sdk_dynamodb::types::{AttributeValue, Put, Update};
use idem::sqlite::rusqlite;
use idem::{AtomicStore, DynamoStore, Outcome, PgStore, RecordStore, SqliteStore};
use idem_broker::consume::{ApplyBatch, AtomicApply, ConsumerStore, KeyedMessage};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

/// The opening balance of account 1.
pub(crate) const OPENING_BALANCE: i64 = 1_000_000;

#[derive(Debug, serde::Deserialize)]
struct Order {
    amount: i64,
    #[serde(default)]
    poison: bool,
}

fn order(message: &KeyedMessage) -> Result<Order, String> {
    serde_json::from_slice(message.payload()).map_err(|e| format!("not an order: {e}"))
}

/// The bank's connection: the store's, inside its transaction.
pub(crate) type Tx<B> = <<B as Bank>::Store as AtomicStore>::Tx;

/// A store with the bank's tables, and the effect that writes them. A bank
/// gives the SQL for its database; the effect and the reads are written once.
pub(crate) trait Bank: Sized + Send + Sync + 'static {
    /// The store.
    type Store: AtomicStore + RecordStore + ConsumerStore + std::fmt::Debug;
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

    /// Whether poison messages apply now.
    fn poison_fixed(tx: &mut Tx<Self>) -> impl Future<Output = Result<bool, String>> + Send;
    /// Debits account 1 by `amount` and writes the ledger row for `key`.
    fn debit(
        tx: &mut Tx<Self>,
        key: &str,
        amount: i64,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// The keys in the ledger, sorted.
    fn read_ledger(tx: &mut Tx<Self>) -> impl Future<Output = Result<Vec<String>, String>> + Send;
    /// The balance of account 1.
    fn read_balance(tx: &mut Tx<Self>) -> impl Future<Output = Result<i64, String>> + Send;
    /// Turns the `poison_fixed` switch on.
    fn set_poison_fixed(tx: &mut Tx<Self>) -> impl Future<Output = Result<(), String>> + Send;

    /// The debit effect; with `crash_inside`, it marks the crash point
    /// `apply.inside-effect` after its write, before anything commits (the
    /// process aborts there when `IDEM_CRASH` arms it).
    fn apply(&self, crash_inside: bool) -> impl ApplyBatch<Store = Self::Store> {
        AtomicApply::new(self.store(), move |message: Arc<KeyedMessage>| {
            async move |tx: &mut Tx<Self>| -> Result<Outcome, String> {
                let order = order(&message)?;
                if order.poison && !Self::poison_fixed(tx).await? {
                    return Err("poison: this order cannot be applied".into());
                }
                Self::debit(tx, message.key.as_str(), order.amount).await?;
                if crash_inside {
                    idem::crash::point(idem::crash::INSIDE_EFFECT);
                }
                Ok(Outcome::success(format!("debited {}", order.amount)))
            }
        })
    }

    /// The keys in the ledger, one per applied effect, sorted.
    fn ledger(&self) -> impl Future<Output = Vec<String>> + Send {
        async move {
            self.store()
                .transaction(async |tx: &mut Tx<Self>| Self::read_ledger(tx).await)
                .await
                .expect("read the ledger")
        }
    }

    /// The balance of account 1.
    fn balance(&self) -> impl Future<Output = i64> + Send {
        async move {
            self.store()
                .transaction(async |tx: &mut Tx<Self>| Self::read_balance(tx).await)
                .await
                .expect("read the balance")
        }
    }

    /// Makes poison messages apply from now on.
    fn fix_poison(&self) -> impl Future<Output = ()> + Send {
        async move {
            self.store()
                .transaction(async |tx: &mut Tx<Self>| Self::set_poison_fixed(tx).await)
                .await
                .expect("fix the poison")
        }
    }
}

use std::future::Future;

/// The bank on the embedded store, in a temporary directory.
pub(crate) struct SqliteBank {
    store: SqliteStore,
    _dir: Option<tempfile::TempDir>,
}

const SQLITE_TABLES: &str = "
    CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
    INSERT OR IGNORE INTO accounts VALUES (1, 1000000);
    CREATE TABLE IF NOT EXISTS ledger (key TEXT NOT NULL, amount INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS switches (name TEXT PRIMARY KEY, flag INTEGER NOT NULL);
    INSERT OR IGNORE INTO switches VALUES ('poison_fixed', 0);";

impl Bank for SqliteBank {
    type Store = SqliteStore;
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

    async fn poison_fixed(tx: &mut rusqlite::Connection) -> Result<bool, String> {
        tx.query_row(
            "SELECT flag FROM switches WHERE name = 'poison_fixed'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|flag| flag != 0)
        .map_err(|e| e.to_string())
    }

    async fn debit(tx: &mut rusqlite::Connection, key: &str, amount: i64) -> Result<(), String> {
        tx.execute(
            "UPDATE accounts SET balance = balance - ?1 WHERE id = 1",
            [amount],
        )
        .map_err(|e| e.to_string())?;
        tx.execute(
            "INSERT INTO ledger (key, amount) VALUES (?1, ?2)",
            rusqlite::params![key, amount],
        )
        .map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn read_ledger(tx: &mut rusqlite::Connection) -> Result<Vec<String>, String> {
        let mut statement = tx
            .prepare("SELECT key FROM ledger ORDER BY key")
            .map_err(|e| e.to_string())?;
        statement
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| e.to_string())
    }

    async fn read_balance(tx: &mut rusqlite::Connection) -> Result<i64, String> {
        tx.query_row("SELECT balance FROM accounts WHERE id = 1", [], |r| {
            r.get(0)
        })
        .map_err(|e| e.to_string())
    }

    async fn set_poison_fixed(tx: &mut rusqlite::Connection) -> Result<(), String> {
        tx.execute(
            "UPDATE switches SET flag = 1 WHERE name = 'poison_fixed'",
            [],
        )
        .map(drop)
        .map_err(|e| e.to_string())
    }
}

/// The bank on PostgreSQL, in a database of its own, dropped after.
pub(crate) struct PgBank {
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

impl Bank for PgBank {
    type Store = PgStore;
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

    async fn poison_fixed(tx: &mut PgConnection) -> Result<bool, String> {
        sqlx::query_scalar::<_, i32>("SELECT flag FROM switches WHERE name = 'poison_fixed'")
            .fetch_one(tx)
            .await
            .map(|flag| flag != 0)
            .map_err(|e| e.to_string())
    }

    async fn debit(tx: &mut PgConnection, key: &str, amount: i64) -> Result<(), String> {
        sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = 1")
            .bind(amount)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query("INSERT INTO ledger (key, amount) VALUES ($1, $2)")
            .bind(key)
            .bind(amount)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    async fn read_ledger(tx: &mut PgConnection) -> Result<Vec<String>, String> {
        sqlx::query_scalar("SELECT key FROM ledger ORDER BY key")
            .fetch_all(tx)
            .await
            .map_err(|e| e.to_string())
    }

    async fn read_balance(tx: &mut PgConnection) -> Result<i64, String> {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 1")
            .fetch_one(tx)
            .await
            .map_err(|e| e.to_string())
    }

    async fn set_poison_fixed(tx: &mut PgConnection) -> Result<(), String> {
        sqlx::query("UPDATE switches SET flag = 1 WHERE name = 'poison_fixed'")
            .execute(tx)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// A throwaway PostgreSQL database, dropped when the test ends.
pub(crate) struct TestDb {
    pub url: String,
    _database: idem_testkit::postgres::TestDatabase,
}

impl TestDb {
    pub(crate) async fn new() -> Option<TestDb> {
        let database = idem_testkit::postgres::TestDatabase::create("idem_broker_t").await?;
        Some(TestDb {
            url: database.url().to_owned(),
            _database: database,
        })
    }
}

/// Shares a bank between the test and a consumer task.
pub(crate) type Shared<B> = Arc<B>;

/// The bank on DynamoDB (moto's, a table of its own): the account, the
/// ledger and the switch are items of the store's own table under partition
/// keys of their own (`bank/…`), written by the effect in the
/// `TransactWriteItems` that completes the record. Each applied effect puts
/// a ledger item of its own, so an effect applied twice shows twice.
///
/// Its lease is short (5 s), so a consumer that died inside an effect,
/// holding the key, is taken over within the scenarios' patience. A batch
/// of its effects would write the one account item several times in one
/// transaction, which DynamoDB refuses: the batch scenario is not run on it.
pub(crate) struct DynamoBank {
    store: DynamoStore,
    url: String,
}

/// The lease of the DynamoDB bank's claims.
pub(crate) const DYNAMO_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

const DYNAMO_ACCOUNT: &str = "bank/account/1";
const DYNAMO_SWITCH: &str = "bank/switch/poison_fixed";
const DYNAMO_LEDGER: &str = "bank/ledger/";

fn dynamo_key(pk: &str) -> std::collections::HashMap<String, AttributeValue> {
    std::collections::HashMap::from([(
        idem::dynamodb::PARTITION_KEY.to_owned(),
        AttributeValue::S(pk.to_owned()),
    )])
}

fn dynamo_number(
    item: Option<&std::collections::HashMap<String, AttributeValue>>,
    name: &str,
) -> Result<i64, String> {
    match item.and_then(|item| item.get(name)) {
        Some(AttributeValue::N(n)) => n.parse().map_err(|e| format!("{name}: {e}")),
        other => Err(format!("{name} is not a number: {other:?}")),
    }
}

impl Bank for DynamoBank {
    type Store = DynamoStore;
    const NAME: &'static str = "dynamodb";

    async fn start() -> Option<Self> {
        let url = idem_testkit::dynamodb::fresh_table_url("broker")?;
        let bank = Self::at(&url).await;
        for (pk, name, value) in [
            (DYNAMO_ACCOUNT, "balance", OPENING_BALANCE),
            (DYNAMO_SWITCH, "flag", 0),
        ] {
            bank.store
                .client()
                .put_item()
                .table_name(bank.store.table())
                .set_item(Some(dynamo_key(pk)))
                .item(name, AttributeValue::N(value.to_string()))
                .send()
                .await
                .expect("the bank's items");
        }
        Some(bank)
    }

    async fn at(location: &str) -> Self {
        let store = DynamoStore::builder(location)
            .settings(idem::Settings::default().with_lease(DYNAMO_LEASE))
            .open()
            .await
            .expect("open the DynamoDB store on moto");
        Self {
            store,
            url: location.to_owned(),
        }
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    fn store(&self) -> DynamoStore {
        self.store.clone()
    }

    async fn poison_fixed(tx: &mut Transaction) -> Result<bool, String> {
        let found = tx
            .client()
            .get_item()
            .table_name(tx.table())
            .set_key(Some(dynamo_key(DYNAMO_SWITCH)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(dynamo_number(found.item(), "flag")? != 0)
    }

    async fn debit(tx: &mut Transaction, key: &str, amount: i64) -> Result<(), String> {
        let debit = Update::builder()
            .table_name(tx.table())
            .set_key(Some(dynamo_key(DYNAMO_ACCOUNT)))
            .update_expression("ADD balance :minus")
            .expression_attribute_values(":minus", AttributeValue::N((-amount).to_string()))
            .build()
            .map_err(|e| e.to_string())?;
        let entry = RandomState::new().hash_one((key, std::time::Instant::now()));
        let mut item = dynamo_key(&format!("{DYNAMO_LEDGER}{key}/{entry:016x}"));
        item.insert("key".to_owned(), AttributeValue::S(key.to_owned()));
        item.insert("amount".to_owned(), AttributeValue::N(amount.to_string()));
        let written = Put::builder()
            .table_name(tx.table())
            .set_item(Some(item))
            .build()
            .map_err(|e| e.to_string())?;
        tx.update(debit).put(written);
        Ok(())
    }

    async fn read_ledger(tx: &mut Transaction) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        let mut start = None;
        loop {
            let page = tx
                .client()
                .scan()
                .table_name(tx.table())
                .filter_expression("begins_with(#pk, :ledger)")
                .expression_attribute_names("#pk", idem::dynamodb::PARTITION_KEY)
                .expression_attribute_values(":ledger", AttributeValue::S(DYNAMO_LEDGER.into()))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| format!("{e:?}"))?;
            for item in page.items() {
                match item.get("key") {
                    Some(AttributeValue::S(key)) => keys.push(key.clone()),
                    other => return Err(format!("a ledger item without its key: {other:?}")),
                }
            }
            start = page.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        keys.sort();
        Ok(keys)
    }

    async fn read_balance(tx: &mut Transaction) -> Result<i64, String> {
        let found = tx
            .client()
            .get_item()
            .table_name(tx.table())
            .set_key(Some(dynamo_key(DYNAMO_ACCOUNT)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| format!("{e:?}"))?;
        dynamo_number(found.item(), "balance")
    }

    async fn set_poison_fixed(tx: &mut Transaction) -> Result<(), String> {
        let fixed = Update::builder()
            .table_name(tx.table())
            .set_key(Some(dynamo_key(DYNAMO_SWITCH)))
            .update_expression("SET flag = :on")
            .expression_attribute_values(":on", AttributeValue::N("1".into()))
            .build()
            .map_err(|e| e.to_string())?;
        tx.update(fixed);
        Ok(())
    }
}
