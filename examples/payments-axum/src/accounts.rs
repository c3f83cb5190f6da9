//! The payments' SQL, once per database: [`Accounts`] is what the API needs
//! from a connection, implemented by each store's connection. It is the only
//! code written per database; the routes are written once, against
//! [`AtomicStore`](idem::AtomicStore).

use std::future::Future;

use idem::rusqlite::{self, OptionalExtension, params};
use idem::sqlx::{self, PgConnection};

/// The accounts and payments tables, on the connection of a store's
/// transaction.
pub(crate) trait Accounts: Send {
    /// The driver's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Creates the tables if they are missing, and `account` with `balance`.
    fn prepare(
        &mut self,
        account: &str,
        balance: i64,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The balance of `account`, locked until the transaction ends: two
    /// payments from one account serialise here.
    fn lock_balance(
        &mut self,
        account: &str,
    ) -> impl Future<Output = Result<Option<i64>, Self::Error>> + Send;

    /// Takes `amount` from `account` and records the payment; its id.
    fn pay(
        &mut self,
        account: &str,
        amount: i64,
    ) -> impl Future<Output = Result<i64, Self::Error>> + Send;

    /// The balance of `account`, as committed.
    fn balance(
        &mut self,
        account: &str,
    ) -> impl Future<Output = Result<Option<i64>, Self::Error>> + Send;
}

/// SQLite: the store's writer connection, inside its `BEGIN IMMEDIATE`, which
/// already serialises every writer. The calls are synchronous; the store's
/// writer thread drives these futures.
impl Accounts for rusqlite::Connection {
    type Error = rusqlite::Error;

    async fn prepare(&mut self, account: &str, balance: i64) -> rusqlite::Result<()> {
        self.execute_batch(
            "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL);",
        )?;
        self.execute(
            "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?1, ?2)",
            params![account, balance],
        )?;
        Ok(())
    }

    async fn lock_balance(&mut self, account: &str) -> rusqlite::Result<Option<i64>> {
        self.balance(account).await
    }

    async fn pay(&mut self, account: &str, amount: i64) -> rusqlite::Result<i64> {
        self.execute(
            "UPDATE accounts SET balance = balance - ?1 WHERE id = ?2",
            params![amount, account],
        )?;
        self.execute(
            "INSERT INTO payments (account, amount) VALUES (?1, ?2)",
            params![account, amount],
        )?;
        Ok(self.last_insert_rowid())
    }

    async fn balance(&mut self, account: &str) -> rusqlite::Result<Option<i64>> {
        self.query_row(
            "SELECT balance FROM accounts WHERE id = ?1",
            [account],
            |row| row.get(0),
        )
        .optional()
    }
}

/// PostgreSQL: the connection of the store's transaction.
impl Accounts for PgConnection {
    type Error = sqlx::Error;

    async fn prepare(&mut self, account: &str, balance: i64) -> sqlx::Result<()> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
             CREATE TABLE IF NOT EXISTS payments (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL);",
        )
        .execute(&mut *self)
        .await?;
        sqlx::query(
            "INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        )
        .bind(account)
        .bind(balance)
        .execute(&mut *self)
        .await?;
        Ok(())
    }

    async fn lock_balance(&mut self, account: &str) -> sqlx::Result<Option<i64>> {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE")
            .bind(account)
            .fetch_optional(&mut *self)
            .await
    }

    async fn pay(&mut self, account: &str, amount: i64) -> sqlx::Result<i64> {
        sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2")
            .bind(amount)
            .bind(account)
            .execute(&mut *self)
            .await?;
        sqlx::query_scalar("INSERT INTO payments (account, amount) VALUES ($1, $2) RETURNING id")
            .bind(account)
            .bind(amount)
            .fetch_one(&mut *self)
            .await
    }

    async fn balance(&mut self, account: &str) -> sqlx::Result<Option<i64>> {
        sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1")
            .bind(account)
            .fetch_optional(&mut *self)
            .await
    }
}
