//! The payment workload shared by `idem demo` and `idem bench`: accounts with
//! balances, a ledger of debits, and one debit effect written once per store —
//! run bare (no dedupe) or through Idem's atomic apply.

use std::sync::Arc;

use anyhow::Context;
use futures::future::BoxFuture;
use idem::sqlite::rusqlite::{self, params};
use idem::{
    Applied, ApplyError, Error, Fingerprint, IdempotencyKey, Operation, Outcome, PgStore, Scope,
    SqliteStore, StoreLocation,
};
use serde_json::json;

/// One payment: debit `amount` from `account`, once, under key `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    pub id: IdempotencyKey,
    pub account: i64,
    pub amount: i64,
}

impl Payment {
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_json(&json!({"account": self.account, "amount": self.amount}))
            .expect("a JSON object always canonicalizes")
    }

    pub fn operation(&self) -> Operation {
        Operation::new(scope(), self.id.clone(), self.fingerprint())
    }
}

/// The scope payments are applied in.
pub fn scope() -> Scope {
    Scope::new("payments").expect("valid scope")
}

/// Money totals read back from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// Debits written (effects applied).
    pub entries: i64,
    /// Distinct payments among them.
    pub distinct: i64,
    /// Sum of all debits.
    pub debited: i64,
}

/// The workload's tables in one store's database.
#[derive(Debug, Clone)]
pub enum Bank {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

fn outcome(balance: i64) -> Outcome {
    Outcome::success(json!({ "balance": balance }).to_string())
        .with_meta("content-type", "application/json")
}

const SQLITE_SETUP: &str = "
    DROP TABLE IF EXISTS idem_demo_accounts;
    DROP TABLE IF EXISTS idem_demo_ledger;
    CREATE TABLE idem_demo_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
    CREATE TABLE idem_demo_ledger (payment_id TEXT NOT NULL, account INTEGER NOT NULL, amount INTEGER NOT NULL);";
const PG_SETUP: &str = "
    DROP TABLE IF EXISTS idem_demo_accounts;
    DROP TABLE IF EXISTS idem_demo_ledger;
    CREATE TABLE idem_demo_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
    CREATE TABLE idem_demo_ledger (payment_id TEXT NOT NULL, account BIGINT NOT NULL, amount BIGINT NOT NULL);";
const DEBIT: &str =
    "UPDATE idem_demo_accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance";
const RECORD: &str =
    "INSERT INTO idem_demo_ledger (payment_id, account, amount) VALUES ($1, $2, $3)";
const TOTALS: &str = "SELECT count(*), count(DISTINCT payment_id), CAST(coalesce(sum(amount), 0) AS BIGINT) FROM idem_demo_ledger";

pub(crate) fn sqlite_debit(conn: &rusqlite::Connection, p: &Payment) -> rusqlite::Result<Outcome> {
    let balance: i64 = conn.query_row(DEBIT, params![p.amount, p.account], |r| r.get(0))?;
    conn.execute(RECORD, params![p.id.as_str(), p.account, p.amount])?;
    Ok(outcome(balance))
}

pub(crate) fn pg_debit<'c>(
    conn: &'c mut sqlx::PgConnection,
    p: Payment,
) -> BoxFuture<'c, Result<Outcome, sqlx::Error>> {
    Box::pin(async move {
        let balance: i64 = sqlx::query_scalar(DEBIT)
            .bind(p.amount)
            .bind(p.account)
            .fetch_one(&mut *conn)
            .await?;
        sqlx::query(RECORD)
            .bind(p.id.as_str())
            .bind(p.account)
            .bind(p.amount)
            .execute(&mut *conn)
            .await?;
        Ok(outcome(balance))
    })
}

/// What the debit effect can fail with.
pub type DebitError = Box<dyn std::error::Error + Send + Sync>;

impl Bank {
    /// Opens the store at `location` (creating its schema) for the workload.
    pub async fn open(location: &StoreLocation) -> anyhow::Result<Self> {
        let bank = match idem::AnyStore::open(location)
            .await
            .with_context(|| format!("cannot open the store at {location}"))?
        {
            idem::AnyStore::Sqlite(s) => Self::Sqlite(s),
            idem::AnyStore::Postgres(s) => Self::Postgres(s),
            _ => anyhow::bail!("the demo has no workload for {location}"),
        };
        Ok(bank)
    }

    /// Recreates the accounts and an empty ledger.
    pub async fn reset(&self, accounts: i64, opening_balance: i64) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(s) => {
                s.with_connection(move |c| -> rusqlite::Result<()> {
                    let tx = c.transaction()?;
                    tx.execute_batch(SQLITE_SETUP)?;
                    for id in 0..accounts {
                        tx.execute(
                            "INSERT INTO idem_demo_accounts (id, balance) VALUES (?1, ?2)",
                            params![id, opening_balance],
                        )?;
                    }
                    tx.commit()
                })
                .await??
            }
            Self::Postgres(s) => {
                let mut tx = s.pool().begin().await?;
                sqlx::raw_sql(PG_SETUP).execute(&mut *tx).await?;
                sqlx::query(
                    "INSERT INTO idem_demo_accounts (id, balance) SELECT id, $2 FROM generate_series(0, $1 - 1) AS id",
                )
                .bind(accounts)
                .bind(opening_balance)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// The debit in its own transaction, with no dedupe at all.
    pub async fn debit_bare(&self, p: &Payment) -> anyhow::Result<()> {
        let p = p.clone();
        match self {
            Self::Sqlite(s) => {
                s.with_connection(move |c| -> rusqlite::Result<()> {
                    let tx = c.transaction()?;
                    sqlite_debit(&tx, &p)?;
                    tx.commit()
                })
                .await??
            }
            Self::Postgres(s) => {
                let mut tx = s.pool().begin().await?;
                pg_debit(&mut tx, p).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Several debits in one transaction, with no dedupe at all.
    pub async fn debit_bare_batch(&self, payments: &[Payment]) -> anyhow::Result<()> {
        let payments = payments.to_vec();
        match self {
            Self::Sqlite(s) => {
                s.with_connection(move |c| -> rusqlite::Result<()> {
                    let tx = c.transaction()?;
                    for p in &payments {
                        sqlite_debit(&tx, p)?;
                    }
                    tx.commit()
                })
                .await??
            }
            Self::Postgres(s) => {
                let mut tx = s.pool().begin().await?;
                for p in payments {
                    pg_debit(&mut tx, p).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// The debit through Idem's atomic apply: once per key.
    pub async fn debit_once(&self, p: &Payment) -> Result<Applied, ApplyError<DebitError>> {
        let (scope, fingerprint) = (scope(), p.fingerprint());
        let payment = p.clone();
        match self {
            Self::Sqlite(s) => {
                s.apply(&scope, &p.id, fingerprint, move |tx| {
                    sqlite_debit(tx, &payment).map_err(DebitError::from)
                })
                .await
            }
            Self::Postgres(s) => {
                s.apply(&scope, &p.id, fingerprint, move |conn| {
                    Box::pin(async move { pg_debit(conn, payment).await.map_err(DebitError::from) })
                })
                .await
            }
        }
    }

    /// The debit through PostgreSQL's claim-first atomic apply, for keys
    /// most likely new; `None` on SQLite, which has one atomic path.
    pub async fn debit_claim_first(
        &self,
        p: &Payment,
    ) -> Option<Result<Applied, ApplyError<DebitError>>> {
        let Self::Postgres(s) = self else {
            return None;
        };
        let payment = p.clone();
        let applied = s
            .apply_claim_first(&scope(), &p.id, p.fingerprint(), move |conn| {
                Box::pin(async move { pg_debit(conn, payment).await.map_err(DebitError::from) })
            })
            .await;
        Some(applied)
    }

    /// A batch of debits in one transaction.
    pub async fn debit_batch(
        &self,
        payments: &[Payment],
    ) -> Result<Vec<Result<Applied, Error>>, ApplyError<(usize, DebitError)>> {
        let ops: Vec<Operation> = payments.iter().map(Payment::operation).collect();
        let payments: Arc<[Payment]> = payments.into();
        match self {
            Self::Sqlite(s) => {
                s.apply_batch(&ops, move |tx, i| {
                    sqlite_debit(tx, &payments[i]).map_err(DebitError::from)
                })
                .await
            }
            Self::Postgres(s) => {
                s.apply_batch(&ops, move |conn, i| {
                    let payment = payments[i].clone();
                    Box::pin(async move { pg_debit(conn, payment).await.map_err(DebitError::from) })
                })
                .await
            }
        }
    }

    /// What the ledger holds.
    pub async fn ledger(&self) -> anyhow::Result<Ledger> {
        let (entries, distinct, debited) = match self {
            Self::Sqlite(s) => {
                s.with_connection(|c| {
                    c.query_row(TOTALS, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                })
                .await??
            }
            Self::Postgres(s) => sqlx::query_as(TOTALS).fetch_one(s.pool()).await?,
        };
        Ok(Ledger {
            entries,
            distinct,
            debited,
        })
    }
}
