//! The payment workload's SQL, per database: the one part of the workload
//! that is written per store, because an effect gets the store's own
//! connection (`rusqlite` on SQLite, `sqlx` on PostgreSQL) and the tables are
//! created with each database's types. Everything around it — bare
//! transactions, atomic apply, claim-first, batches, the consumers — is
//! written once, in [`crate::workload`], against [`AtomicStore`].

use std::future::Future;

use idem::rusqlite::{Connection, params};
use idem::sqlx::PgConnection;
use idem::{AnyConnection, AnyStore, AnyTx, AtomicStore, Outcome, PgStore, SqliteStore};
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

    /// What the ledger holds.
    fn totals(tx: &mut Self::Tx) -> impl Future<Output = Result<Totals, DebitError>> + Send;

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

    fn replays_first(&self) -> bool {
        false
    }
}

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

    async fn totals(tx: &mut PgConnection) -> Result<Totals, DebitError> {
        let (entries, distinct, debited) = idem::sqlx::query_as(TOTALS).fetch_one(tx).await?;
        Ok(Totals {
            entries,
            distinct,
            debited,
        })
    }

    fn replays_first(&self) -> bool {
        true
    }
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
            AnyConnection::Postgres(c) => PgStore::create(c, accounts, opening_balance).await,
        }
    }

    async fn debit(
        tx: &mut (dyn AnyTx + 'static),
        payment: &Payment,
    ) -> Result<Outcome, DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::debit(c, payment).await,
            AnyConnection::Postgres(c) => PgStore::debit(c, payment).await,
        }
    }

    async fn totals(tx: &mut (dyn AnyTx + 'static)) -> Result<Totals, DebitError> {
        match tx.connection() {
            AnyConnection::Sqlite(c) => SqliteStore::totals(c).await,
            AnyConnection::Postgres(c) => PgStore::totals(c).await,
        }
    }

    fn replays_first(&self) -> bool {
        match self {
            AnyStore::Sqlite(s) => s.replays_first(),
            AnyStore::Postgres(s) => s.replays_first(),
            _ => false,
        }
    }
}
