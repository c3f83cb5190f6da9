//! The payment workload's SQL, per database: the one part of the workload
//! that is written per store, because an effect gets the store's own
//! connection (`rusqlite` on SQLite, `sqlx` on PostgreSQL, with feature
//! `postgres`) and the tables are created with each database's types.
//! Everything around it — bare transactions, atomic apply, claim-first,
//! batches, and the benchmarks' consumers — is written once, in
//! [`crate::workload`], against [`AtomicStore`].

use std::future::Future;

#[cfg(feature = "postgres")]
use idem::PgStore;
use idem::protocol::RecordSeed;
use idem::rusqlite::{Connection, params};
#[cfg(feature = "postgres")]
use idem::sqlx::PgConnection;
use idem::{AnyConnection, AnyStore, AnyTx, AtomicStore, Outcome, SqliteStore};
use serde_json::json;

use crate::payment::{Payment, Totals};

/// What the workload's SQL can fail with.
pub type DebitError = Box<dyn std::error::Error + Send + Sync>;

/// The workload's tables and statements on one store's database, run on the
/// connection the store hands its effects ([`AtomicStore::Tx`]), inside the
/// transaction the store opened.
pub trait Ledger: AtomicStore + Clone + 'static {
    /// Drops and recreates the tables: `accounts` accounts holding
    /// `opening_balance` each, and an empty ledger.
    fn create(
        tx: &mut Self::Tx,
        accounts: i64,
        opening_balance: i64,
    ) -> impl Future<Output = Result<(), DebitError>> + Send;

    /// The debit: takes the amount off the account and appends it to the
    /// ledger; the outcome carries the new balance.
    fn debit(
        tx: &mut Self::Tx,
        payment: &Payment,
    ) -> impl Future<Output = Result<Outcome, DebitError>> + Send;

    /// The debits of a batch as a set: one statement for all of them where
    /// round trips cost (PostgreSQL), a loop where they do not (SQLite).
    /// Answers one outcome per payment, in order, each carrying the balance
    /// right after its own debit, as one debit after another would.
    fn debit_set(
        tx: &mut Self::Tx,
        payments: &[Payment],
    ) -> impl Future<Output = Result<Vec<Outcome>, DebitError>> + Send;

    /// What the ledger holds.
    fn totals(tx: &mut Self::Tx) -> impl Future<Output = Result<Totals, DebitError>> + Send;

    /// Adds the completed records `fill` describes to the dedupe table, in
    /// one statement, through the store's test hook (`seed_records`).
    fn prefill(
        tx: &mut Self::Tx,
        fill: RecordSeed,
    ) -> impl Future<Output = Result<(), DebitError>> + Send;

    /// Refreshes the planner's statistics of the dedupe table (as autovacuum
    /// would after a bulk load) and returns its size on disk, its indexes
    /// included, in bytes.
    fn analyze_records(tx: &mut Self::Tx) -> impl Future<Output = Result<u64, DebitError>> + Send;

    /// Whether [`AtomicStore::apply_replay_first`] is a path of its own on
    /// this store (PostgreSQL), rather than `apply` under another name: the
    /// benchmark measures it only where it is.
    fn replays_first(&self) -> bool;
}

const SQLITE_TABLES: &str = "
    DROP TABLE IF EXISTS idem_demo_accounts;
    DROP TABLE IF EXISTS idem_demo_ledger;
    CREATE TABLE idem_demo_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
    CREATE TABLE idem_demo_ledger (payment_id TEXT NOT NULL, account INTEGER NOT NULL, amount INTEGER NOT NULL);";
#[cfg(feature = "postgres")]
const PG_TABLES: &str = "
    DROP TABLE IF EXISTS idem_demo_accounts;
    DROP TABLE IF EXISTS idem_demo_ledger;
    CREATE TABLE idem_demo_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE idem_demo_ledger (payment_id TEXT NOT NULL, account BIGINT NOT NULL, amount BIGINT NOT NULL);";
// The statements below read the same in both dialects.
const DEBIT: &str =
    "UPDATE idem_demo_accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance";
const RECORD: &str =
    "INSERT INTO idem_demo_ledger (payment_id, account, amount) VALUES ($1, $2, $3)";
#[cfg(feature = "postgres")]
/// PostgreSQL: locks a batch's accounts in one order, so batches committed at
/// once do not deadlock each other.
const PG_LOCK_ACCOUNTS: &str =
    "SELECT id FROM idem_demo_accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE";
#[cfg(feature = "postgres")]
/// PostgreSQL: a batch of debits in one statement. The payments arrive as
/// three arrays; each account is debited once by its payments' total; the
/// ledger gets a row per payment; each payment's balance is the account's new
/// balance plus the payments after it in the batch.
const PG_DEBIT_SET: &str = "
    WITH p AS (
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
            WITH ORDINALITY AS p(id, account, amount, n)
    ), debited AS (
        UPDATE idem_demo_accounts AS a SET balance = a.balance - s.total
        FROM (SELECT account, sum(amount)::bigint AS total FROM p GROUP BY account) AS s
        WHERE a.id = s.account
        RETURNING a.id, a.balance
    ), recorded AS (
        INSERT INTO idem_demo_ledger (payment_id, account, amount)
        SELECT id, account, amount FROM p
    )
    SELECT (d.balance + coalesce(sum(p.amount) OVER (
                PARTITION BY p.account ORDER BY p.n DESC
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))::bigint
    FROM p JOIN debited AS d ON d.id = p.account
    ORDER BY p.n";
const TOTALS: &str = "SELECT count(*), count(DISTINCT payment_id), CAST(coalesce(sum(amount), 0) AS BIGINT) FROM idem_demo_ledger";

/// The debit's answer, stored and replayed to duplicates.
fn outcome(balance: i64) -> Outcome {
    Outcome::success(json!({ "balance": balance }).to_string())
        .with_meta("content-type", "application/json")
}

impl Ledger for SqliteStore {
    async fn create(
        tx: &mut Connection,
        accounts: i64,
        opening_balance: i64,
    ) -> Result<(), DebitError> {
        tx.execute_batch(SQLITE_TABLES)?;
        for id in 0..accounts {
            tx.execute(
                "INSERT INTO idem_demo_accounts (id, balance) VALUES (?1, ?2)",
                params![id, opening_balance],
            )?;
        }
        Ok(())
    }

    async fn debit(tx: &mut Connection, p: &Payment) -> Result<Outcome, DebitError> {
        let balance: i64 = tx.query_row(DEBIT, params![p.amount, p.account], |r| r.get(0))?;
        tx.execute(RECORD, params![p.id.as_str(), p.account, p.amount])?;
        Ok(outcome(balance))
    }

    async fn debit_set(
        tx: &mut Connection,
        payments: &[Payment],
    ) -> Result<Vec<Outcome>, DebitError> {
        let mut outcomes = Vec::with_capacity(payments.len());
        for p in payments {
            outcomes.push(Self::debit(tx, p).await?);
        }
        Ok(outcomes)
    }

    async fn totals(tx: &mut Connection) -> Result<Totals, DebitError> {
        let totals = tx.query_row(TOTALS, [], |r| {
            Ok(Totals {
                entries: r.get(0)?,
                distinct: r.get(1)?,
                debited: r.get(2)?,
            })
        })?;
        Ok(totals)
    }

    async fn prefill(tx: &mut Connection, fill: RecordSeed) -> Result<(), DebitError> {
        Ok(SqliteStore::seed_records(tx, &fill)?)
    }

    async fn analyze_records(tx: &mut Connection) -> Result<u64, DebitError> {
        Ok(SqliteStore::analyze_records(tx)?)
    }

    fn replays_first(&self) -> bool {
        false
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Ledger for PgStore {
    async fn create(
        tx: &mut PgConnection,
        accounts: i64,
        opening_balance: i64,
    ) -> Result<(), DebitError> {
        idem::sqlx::raw_sql(PG_TABLES).execute(&mut *tx).await?;
        idem::sqlx::query(
            "INSERT INTO idem_demo_accounts (id, balance) SELECT id, $2 FROM generate_series(0, $1 - 1) AS id",
        )
        .bind(accounts)
        .bind(opening_balance)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    async fn debit(tx: &mut PgConnection, p: &Payment) -> Result<Outcome, DebitError> {
        let balance: i64 = idem::sqlx::query_scalar(DEBIT)
            .bind(p.amount)
            .bind(p.account)
            .fetch_one(&mut *tx)
            .await?;
        idem::sqlx::query(RECORD)
            .bind(p.id.as_str())
            .bind(p.account)
            .bind(p.amount)
            .execute(&mut *tx)
            .await?;
        Ok(outcome(balance))
    }

    async fn debit_set(
        tx: &mut PgConnection,
        payments: &[Payment],
    ) -> Result<Vec<Outcome>, DebitError> {
        let ids: Vec<&str> = payments.iter().map(|p| p.id.as_str()).collect();
        let accounts: Vec<i64> = payments.iter().map(|p| p.account).collect();
        let amounts: Vec<i64> = payments.iter().map(|p| p.amount).collect();
        idem::sqlx::query(PG_LOCK_ACCOUNTS)
            .bind(&accounts)
            .execute(&mut *tx)
            .await?;
        let balances: Vec<i64> = idem::sqlx::query_scalar(PG_DEBIT_SET)
            .bind(&ids)
            .bind(&accounts)
            .bind(&amounts)
            .fetch_all(&mut *tx)
            .await?;
        if balances.len() != payments.len() {
            return Err(format!(
                "{} payments were debited as {} rows: is an account missing?",
                payments.len(),
                balances.len()
            )
            .into());
        }
        Ok(balances.into_iter().map(outcome).collect())
    }

    async fn totals(tx: &mut PgConnection) -> Result<Totals, DebitError> {
        let (entries, distinct, debited) = idem::sqlx::query_as(TOTALS).fetch_one(tx).await?;
        Ok(Totals {
            entries,
            distinct,
            debited,
        })
    }

    async fn prefill(tx: &mut PgConnection, fill: RecordSeed) -> Result<(), DebitError> {
        Ok(PgStore::seed_records(tx, &fill).await?)
    }

    async fn analyze_records(tx: &mut PgConnection) -> Result<u64, DebitError> {
        Ok(PgStore::analyze_records(tx).await?)
    }

    fn replays_first(&self) -> bool {
        true
    }
}

/// What a store chosen at run time answers on PostgreSQL when this crate was
/// built without its `postgres` feature (the facade may have PostgreSQL
/// through another crate; the workload's SQL for it is not built in).
fn no_postgres() -> DebitError {
    "the payment workload has no SQL for PostgreSQL in this build: enable idem-demo's postgres feature".into()
}

/// A store chosen at run time (`--store`) runs the SQL of whichever database
/// its connection turns out to be.
impl Ledger for AnyStore {
    async fn create(
        tx: &mut (dyn AnyTx + 'static),
        accounts: i64,
        opening_balance: i64,
    ) -> Result<(), DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::create(c, accounts, opening_balance).await,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(c) => PgStore::create(c, accounts, opening_balance).await,
            #[allow(unreachable_patterns)]
            _ => Err(no_postgres()),
        }
    }

    async fn debit(
        tx: &mut (dyn AnyTx + 'static),
        payment: &Payment,
    ) -> Result<Outcome, DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::debit(c, payment).await,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(c) => PgStore::debit(c, payment).await,
            #[allow(unreachable_patterns)]
            _ => Err(no_postgres()),
        }
    }

    async fn debit_set(
        tx: &mut (dyn AnyTx + 'static),
        payments: &[Payment],
    ) -> Result<Vec<Outcome>, DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::debit_set(c, payments).await,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(c) => PgStore::debit_set(c, payments).await,
            #[allow(unreachable_patterns)]
            _ => Err(no_postgres()),
        }
    }

    async fn totals(tx: &mut (dyn AnyTx + 'static)) -> Result<Totals, DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::totals(c).await,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(c) => PgStore::totals(c).await,
            #[allow(unreachable_patterns)]
            _ => Err(no_postgres()),
        }
    }

    async fn prefill(tx: &mut (dyn AnyTx + 'static), fill: RecordSeed) -> Result<(), DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::prefill(c, fill).await,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(c) => PgStore::prefill(c, fill).await,
            #[allow(unreachable_patterns)]
            _ => Err(no_postgres()),
        }
    }

    async fn analyze_records(tx: &mut (dyn AnyTx + 'static)) -> Result<u64, DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => <SqliteStore as Ledger>::analyze_records(c).await,
            #[cfg(feature = "postgres")]
            AnyConnection::Postgres(c) => <PgStore as Ledger>::analyze_records(c).await,
            #[allow(unreachable_patterns)]
            _ => Err(no_postgres()),
        }
    }

    fn replays_first(&self) -> bool {
        match self {
            AnyStore::Sqlite(s) => s.replays_first(),
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => s.replays_first(),
            _ => false,
        }
    }
}
