//! The `idem_outbox` table on SQLite: every statement on it, the enqueue on
//! the store's transaction ([`AtomicOutbox`]) and the relay's side
//! ([`OutboxStore`]) for [`SqliteStore`]. Its migration is in `schema`.
//!
//! SQLite has one writer at a time, and every statement here runs on the
//! store's single writer: a claim cannot interleave with another claim, so
//! the lease columns alone keep two relays (in one or several processes on
//! the same file) from sending the same row at the same time. A relay that
//! dies leaves its lease to run out.

use std::future::Future;
use std::time::Duration;

use idem_core::{
    AtomicOutbox, Clock, Error, IdempotencyKey, NewDeadLetter, OutboxMessage, OutboxStats,
    OutboxStore, Pending, SentMessage, SharedClock, SystemClock, Timestamp, WakeUps,
};
use rusqlite::{Connection, Row, params};

use crate::error::{corrupt, map_error};
use crate::store::SqliteStore;
use crate::write_tx::WriteTx;
use crate::{dead_letters, headers};

const INSERT: &str = "INSERT INTO idem_outbox (destination, key, payload, headers, created_at)
    VALUES (?1, ?2, ?3, ?4, ?5)";

const CLAIM: &str = "UPDATE idem_outbox
    SET lease_owner = ?1, lease_until = ?2, attempts = attempts + 1
    WHERE id IN (
        SELECT id FROM idem_outbox
        WHERE state = 'pending'
          AND (available_at IS NULL OR available_at <= ?3)
          AND (lease_until IS NULL OR lease_until <= ?3)
          AND (destination IS NOT NULL OR ?5)
        ORDER BY id
        LIMIT ?4)
    RETURNING id, destination, key, payload, headers, attempts, created_at";

const MARK_SENT: &str = "UPDATE idem_outbox
    SET state = 'sent', sent_at = ?2, lease_owner = NULL, lease_until = NULL
    WHERE id = ?1 AND state = 'pending'";

const RETRY_LATER: &str = "UPDATE idem_outbox
    SET attempts = ?3, available_at = ?4, last_error = ?5, lease_owner = NULL, lease_until = NULL
    WHERE id = ?1 AND lease_owner = ?2 AND state = 'pending'";

const DELETE_HELD: &str =
    "DELETE FROM idem_outbox WHERE id = ?1 AND lease_owner = ?2 AND state = 'pending'";

const SWEEP_SENT: &str = "DELETE FROM idem_outbox WHERE id IN
    (SELECT id FROM idem_outbox WHERE state = 'sent' AND sent_at < ?1 ORDER BY sent_at LIMIT ?2)";

const RECENT_SENDS: &str = "SELECT id, destination, key, attempts, created_at, sent_at
    FROM idem_outbox WHERE state = 'sent' ORDER BY sent_at DESC, id DESC LIMIT ?1";

const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE state = 'pending'),
    COUNT(*) FILTER (WHERE state = 'sent'),
    MIN(created_at) FILTER (WHERE state = 'pending')
    FROM idem_outbox";

/// Writes `message` on `conn`, inside whatever transaction it is in, stamped
/// `now`. Returns the row id.
pub(crate) fn insert(
    conn: &Connection,
    message: &OutboxMessage,
    now: Timestamp,
) -> Result<i64, Error> {
    conn.prepare_cached(INSERT)
        .and_then(|mut statement| {
            statement.execute(params![
                message.destination,
                message.key.as_str(),
                message.payload,
                headers::to_json(&message.headers),
                now.0,
            ])
        })
        .map_err(|e| map_error("enqueue an outbox message", e))?;
    Ok(conn.last_insert_rowid())
}

/// A claimed row as read: id, destination, key, payload, headers, attempts, created_at.
type Raw = (i64, Option<String>, String, Vec<u8>, String, i64, i64);

fn read(row: &Row<'_>) -> rusqlite::Result<Raw> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

fn check(
    (id, destination, key, payload, headers, attempts, created_at): Raw,
) -> Result<Pending, Error> {
    let key = IdempotencyKey::new(key)
        .map_err(|e| corrupt(format!("outbox row {id} has an invalid key: {e}")))?;
    Ok(Pending {
        id,
        message: OutboxMessage {
            destination,
            key,
            payload,
            headers: headers::from_json(&headers)?,
        },
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        created_at: Timestamp(created_at),
    })
}

fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl AtomicOutbox for SqliteStore {
    /// Done at once on the connection (inside the store's `BEGIN IMMEDIATE`),
    /// before the future is polled: SQLite's calls do not wait on the network.
    /// Stamped with the system clock: inside an effect there is no store at hand.
    fn enqueue(
        tx: &mut Connection,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<i64, Error>> + Send {
        let enqueued = insert(tx, message, SystemClock.now());
        async move { enqueued }
    }
}

impl OutboxStore for SqliteStore {
    fn outbox_clock(&self) -> SharedClock {
        self.clock().clone()
    }

    async fn enqueue_now(&self, message: &OutboxMessage) -> Result<i64, Error> {
        let message = message.clone();
        let now = self.clock().now();
        self.with_connection(move |conn| insert(conn, &message, now))
            .await?
    }

    async fn claim_outbox(
        &self,
        owner: &str,
        now: Timestamp,
        lease: Duration,
        limit_to: usize,
        with_default: bool,
    ) -> Result<Vec<Pending>, Error> {
        let owner = owner.to_owned();
        let until = now.plus(lease).0;
        let rows = self
            .with_connection(move |conn| {
                let tx = WriteTx::begin(conn)?;
                let rows = {
                    let mut statement = tx
                        .prepare_cached(CLAIM)
                        .map_err(|e| map_error("claim outbox rows", e))?;
                    statement
                        .query_map(
                            params![owner, until, now.0, limit(limit_to), with_default],
                            read,
                        )
                        .map_err(|e| map_error("claim outbox rows", e))?
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| map_error("read claimed outbox rows", e))?
                };
                tx.commit()?;
                Ok::<_, Error>(rows)
            })
            .await??;
        let mut claimed: Vec<Pending> = rows.into_iter().map(check).collect::<Result<_, _>>()?;
        claimed.sort_by_key(|p| p.id);
        Ok(claimed)
    }

    async fn mark_sent(&self, ids: &[i64], now: Timestamp) -> Result<u64, Error> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| {
            let tx = WriteTx::begin(conn)?;
            let mut changed = 0;
            {
                let mut statement = tx
                    .prepare_cached(MARK_SENT)
                    .map_err(|e| map_error("mark outbox rows sent", e))?;
                for id in ids {
                    changed += statement
                        .execute(params![id, now.0])
                        .map_err(|e| map_error("mark outbox rows sent", e))?
                        as u64;
                }
            }
            tx.commit()?;
            Ok(changed)
        })
        .await?
    }

    async fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: Timestamp,
        error: &str,
    ) -> Result<bool, Error> {
        let (owner, error) = (owner.to_owned(), error.to_owned());
        self.with_connection(move |conn| {
            conn.execute(
                RETRY_LATER,
                params![id, owner, i64::from(attempts), due.0, error],
            )
            .map(|n| n == 1)
            .map_err(|e| map_error("reschedule an outbox row", e))
        })
        .await?
    }

    async fn bury(
        &self,
        id: i64,
        owner: &str,
        letter: &NewDeadLetter,
        now: Timestamp,
    ) -> Result<Option<i64>, Error> {
        let (owner, letter) = (owner.to_owned(), letter.clone());
        self.with_connection(move |conn| {
            let tx = WriteTx::begin(conn)?;
            let deleted = tx
                .execute(DELETE_HELD, params![id, owner])
                .map_err(|e| map_error("remove a dead outbox row", e))?;
            if deleted == 0 {
                return Ok(None);
            }
            let letter_id = dead_letters::insert(&tx, &letter, now)?;
            tx.commit()?;
            Ok(Some(letter_id))
        })
        .await?
    }

    async fn sweep_sent(&self, before: Timestamp, limit_to: usize) -> Result<u64, Error> {
        self.with_connection(move |conn| {
            conn.execute(SWEEP_SENT, params![before.0, limit(limit_to)])
                .map(|n| n as u64)
                .map_err(|e| map_error("sweep sent outbox rows", e))
        })
        .await?
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.with_connection(|conn| {
            conn.query_row(STATS, [], |row| {
                Ok(OutboxStats {
                    pending: row.get::<_, i64>(0)?.unsigned_abs(),
                    sent: row.get::<_, i64>(1)?.unsigned_abs(),
                    oldest_pending: row.get::<_, Option<i64>>(2)?.map(Timestamp),
                })
            })
            .map_err(|e| map_error("count outbox rows", e))
        })
        .await?
    }

    async fn recent_sends(&self, limit_to: usize) -> Result<Vec<SentMessage>, Error> {
        let rows = self
            .with_connection(move |conn| {
                let mut statement = conn
                    .prepare_cached(RECENT_SENDS)
                    .map_err(|e| map_error("read recent outbox sends", e))?;
                let rows = statement
                    .query_map(params![limit(limit_to)], |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, Option<String>>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, i64>(4)?,
                            row.get::<_, i64>(5)?,
                        ))
                    })
                    .map_err(|e| map_error("read recent outbox sends", e))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| map_error("read recent outbox sends", e))?;
                Ok::<_, Error>(rows)
            })
            .await??;
        rows.into_iter()
            .map(|(id, destination, key, attempts, created_at, sent_at)| {
                Ok(SentMessage {
                    id,
                    destination,
                    key: IdempotencyKey::new(key)
                        .map_err(|e| corrupt(format!("outbox row {id} has an invalid key: {e}")))?,
                    attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
                    created_at: Timestamp(created_at),
                    sent_at: Timestamp(sent_at),
                })
            })
            .collect()
    }

    /// SQLite sends no signals: the relay polls.
    async fn wake_ups(&self) -> Result<Option<Box<dyn WakeUps>>, Error> {
        Ok(None)
    }
}
