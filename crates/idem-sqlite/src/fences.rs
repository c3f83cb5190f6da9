//! Fencing tokens on named resources (`idem_fences`) and guarded writes on the
//! application's own tables, for SQLite.
//!
//! A resource's row is never deleted: releasing a lease only ends it, so the
//! next token is always greater than every token issued before, across restarts.

use std::fmt::Display;
use std::time::Duration;

use idem_core::{Error, FenceStore, FencingToken, Guard, Lease, Resource, Timestamp};
use rusqlite::{Connection, OptionalExtension, ToSql, params};

use crate::error::map_error;
use crate::store::SqliteStore;

fn current(conn: &Connection, resource: &str) -> Result<Option<(i64, i64)>, Error> {
    conn.prepare_cached("SELECT token, lease_until FROM idem_fences WHERE resource = ?1")
        .and_then(|mut stmt| {
            stmt.query_row(params![resource], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(|e| map_error("read a fence", e))
}

fn stale(lease: &Lease, stored: Option<i64>) -> Error {
    let error = Error::Stale {
        target: format!("lease on {}", lease.resource),
        carried: lease.token.get(),
        stored,
    };
    idem_core::observe::refused(&error);
    error
}

/// Moves the lease end of the holder of `lease`; `Stale` if it no longer holds it.
fn set_lease_end(
    conn: &mut Connection,
    lease: &Lease,
    until: Timestamp,
    now: Timestamp,
) -> Result<(), Error> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| map_error("begin a fence update", e))?;
    let changed = tx
        .prepare_cached(
            "UPDATE idem_fences SET lease_until = ?1, updated_at = ?2 WHERE resource = ?3 AND token = ?4",
        )
        .and_then(|mut stmt| stmt.execute(params![until.0, now.0, lease.resource.as_str(), lease.token.get()]))
        .map_err(|e| map_error("update a fence", e))?;
    if changed == 0 {
        let stored = current(&tx, lease.resource.as_str())?.map(|(token, _)| token);
        return Err(stale(lease, stored));
    }
    tx.commit()
        .map_err(|e| map_error("commit a fence update", e))
}

impl FenceStore for SqliteStore {
    async fn acquire(&self, resource: &Resource, ttl: Duration) -> Result<Lease, Error> {
        let resource = resource.clone();
        let clock = self.clock().clone();
        self.with_connection(move |conn| {
            let now = clock.now();
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| map_error("begin a fence acquisition", e))?;
            let token = match current(&tx, resource.as_str())? {
                Some((_, until)) if until > now.0 => {
                    return Err(Error::LeaseHeld {
                        resource,
                        retry_after: now.until(Timestamp(until)),
                    });
                }
                Some((token, _)) => token + 1,
                None => 1,
            };
            let until = now.plus(ttl);
            tx.prepare_cached(
                "INSERT INTO idem_fences (resource, token, lease_until, updated_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (resource) DO UPDATE SET token = excluded.token, \
                 lease_until = excluded.lease_until, updated_at = excluded.updated_at",
            )
            .and_then(|mut stmt| stmt.execute(params![resource.as_str(), token, until.0, now.0]))
            .map_err(|e| map_error("take a fence", e))?;
            tx.commit().map_err(|e| map_error("commit a fence", e))?;
            Ok(Lease {
                resource,
                token: FencingToken::new(token).expect("tokens start at 1"),
                until,
            })
        })
        .await?
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, Error> {
        let (held, clock) = (lease.clone(), self.clock().clone());
        self.with_connection(move |conn| {
            let now = clock.now();
            set_lease_end(conn, &held, now.plus(ttl), now)?;
            Ok(Lease {
                until: now.plus(ttl),
                ..held
            })
        })
        .await?
    }

    async fn release(&self, lease: &Lease) -> Result<(), Error> {
        let (held, clock) = (lease.clone(), self.clock().clone());
        self.with_connection(move |conn| {
            let now = clock.now();
            set_lease_end(conn, &held, now, now)
        })
        .await?
    }
}

impl SqliteStore {
    /// Advances `guard`'s column of row `id` to `carried` inside the caller's
    /// transaction (`conn`, the connection an effect is given), so the
    /// caller's write that follows is applied only if it is newer: a version
    /// greater than the stored one, or a fencing token at least the stored
    /// one. Otherwise nothing changes and the answer is [`Error::Stale`] —
    /// give up, never retry.
    ///
    /// ```
    /// # fn demo(store: &idem_sqlite::SqliteStore, tx: &rusqlite::Connection) -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_core::Guard;
    /// // ALTER TABLE accounts ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
    /// let guard = Guard::version("accounts", "id", "version")?;
    /// store.advance(tx, &guard, &7, 12)?;   // message v12 for account 7
    /// tx.execute("UPDATE accounts SET balance = ?1 WHERE id = 7", [500])?;
    /// # Ok(()) }
    /// ```
    pub fn advance<I: ToSql + Display>(
        &self,
        conn: &Connection,
        guard: &Guard,
        id: &I,
        carried: i64,
    ) -> Result<(), Error> {
        let changed = conn
            .prepare_cached(&guard.advance_sql())
            .and_then(|mut stmt| stmt.execute(params![carried, id]))
            .map_err(|e| map_error("advance a guarded column", e))?;
        if changed == 1 {
            return Ok(());
        }
        let stored: Option<i64> = conn
            .prepare_cached(&guard.stored_sql())
            .and_then(|mut stmt| stmt.query_row(params![id], |row| row.get(0)).optional())
            .map_err(|e| map_error("read a guarded column", e))?;
        Err(guard.stale(&id.to_string(), carried, stored))
    }
}
