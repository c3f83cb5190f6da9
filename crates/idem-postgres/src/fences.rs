//! Fencing tokens on named resources (`idem_fences`) and guarded writes on the
//! application's own tables, for PostgreSQL.
//!
//! Acquiring is one statement: an upsert that takes the row only when its lease
//! has ended, incrementing the token; a live lease makes it write nothing, and
//! only then is the row read again to say when the lease ends. Rows are never
//! deleted, so tokens are never reused.

use std::fmt::Display;
use std::time::Duration;

use idem_core::{Error, FenceStore, FencingToken, Guard, Lease, Resource, Timestamp};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Postgres};

use crate::PgStore;

const TAKE: &str = "INSERT INTO idem_fences (resource, token, lease_until, updated_at) \
     VALUES ($1, 1, $2, $3) \
     ON CONFLICT (resource) DO UPDATE SET token = idem_fences.token + 1, \
     lease_until = EXCLUDED.lease_until, updated_at = EXCLUDED.updated_at \
     WHERE idem_fences.lease_until <= $3 \
     RETURNING token";
const CURRENT: &str = "SELECT token, lease_until FROM idem_fences WHERE resource = $1";
const MOVE_END: &str = "UPDATE idem_fences SET lease_until = $1, updated_at = $2 \
     WHERE resource = $3 AND token = $4";

impl PgStore {
    async fn current_fence(&self, resource: &Resource) -> Result<Option<(i64, i64)>, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query_as(CURRENT)
            .bind(resource.as_str())
            .fetch_optional(conn)
            .await
            .map_err(|e| self.fail(e)))
    }

    /// Moves the end of `lease`; `Stale` when a newer holder has the resource.
    async fn move_lease_end(&self, lease: &Lease, until: Timestamp) -> Result<(), Error> {
        let now = self.clock().now();
        let changed = crate::pooler::one_shot!(self, |conn| sqlx::query(MOVE_END)
            .bind(until.0)
            .bind(now.0)
            .bind(lease.resource.as_str())
            .bind(lease.token.get())
            .execute(conn)
            .await
            .map_err(|e| self.fail(e)))?
        .rows_affected();
        if changed == 1 {
            return Ok(());
        }
        let stored = self.current_fence(&lease.resource).await?.map(|(t, _)| t);
        let error = Error::Stale {
            target: format!("lease on {}", lease.resource),
            carried: lease.token.get(),
            stored,
        };
        idem_core::observe::refused(&error);
        Err(error)
    }

    /// Advances `guard`'s column of row `id` to `carried` inside the caller's
    /// transaction (`conn`), so the caller's write that follows is applied only
    /// if it is newer: a version greater than the stored one, or a fencing token
    /// at least the stored one. The `UPDATE` also locks the row until the
    /// transaction ends, so two writers cannot both pass. Otherwise nothing
    /// changes and the answer is [`Error::Stale`] — give up, never retry.
    ///
    /// ```no_run
    /// # async fn demo(store: idem_postgres::PgStore, conn: &mut sqlx::PgConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_core::Guard;
    /// // ALTER TABLE accounts ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
    /// let guard = Guard::version("accounts", "id", "version")?;
    /// store.advance(&mut *conn, &guard, 7_i64, 12).await?;   // message v12 for account 7
    /// sqlx::query("UPDATE accounts SET balance = 500 WHERE id = 7").execute(&mut *conn).await?;
    /// # Ok(()) }
    /// ```
    pub async fn advance<I>(
        &self,
        conn: &mut PgConnection,
        guard: &Guard,
        id: I,
        carried: i64,
    ) -> Result<(), Error>
    where
        I: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Display + Send + Clone,
    {
        let changed = sqlx::query(AssertSqlSafe(guard.advance_sql()))
            .bind(carried)
            .bind(id.clone())
            .execute(&mut *conn)
            .await
            .map_err(|e| self.fail(e))?
            .rows_affected();
        if changed == 1 {
            return Ok(());
        }
        let stored: Option<i64> = sqlx::query_scalar(AssertSqlSafe(guard.stored_sql()))
            .bind(id.clone())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fail(e))?;
        Err(guard.stale(&id.to_string(), carried, stored))
    }
}

impl FenceStore for PgStore {
    async fn acquire(&self, resource: &Resource, ttl: Duration) -> Result<Lease, Error> {
        let now = self.clock().now();
        let until = now.plus(ttl);
        let taken: Option<i64> = crate::pooler::one_shot!(self, |conn| sqlx::query_scalar(TAKE)
            .bind(resource.as_str())
            .bind(until.0)
            .bind(now.0)
            .fetch_optional(conn)
            .await
            .map_err(|e| self.fail(e)))?;
        match taken {
            Some(token) => Ok(Lease {
                resource: resource.clone(),
                token: FencingToken::new(token).expect("tokens start at 1"),
                until,
            }),
            None => {
                let ends = self
                    .current_fence(resource)
                    .await?
                    .map_or(now, |(_, until)| Timestamp(until));
                Err(Error::LeaseHeld {
                    resource: resource.clone(),
                    retry_after: now.until(ends),
                })
            }
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, Error> {
        let until = self.clock().now().plus(ttl);
        self.move_lease_end(lease, until).await?;
        Ok(Lease {
            until,
            ..lease.clone()
        })
    }

    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        self.move_lease_end(lease, self.clock().now()).await
    }
}
