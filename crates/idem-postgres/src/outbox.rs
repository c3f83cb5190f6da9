//! The `idem_outbox` table on PostgreSQL: every statement on it, the enqueue
//! on the caller's transaction ([`AtomicOutbox`](idem_core::AtomicOutbox))
//! and the relay's side ([`OutboxStore`]) for [`PgStore`]. Its migration is
//! `migrations/0004_idem_outbox.sql`.
//!
//! How several relays share one table without sending a row twice at once:
//! a claim is one `UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)` that
//! sets a lease. A row another relay is claiming right now is locked and
//! skipped, not waited for; a row claimed earlier has a live lease and is not
//! due. A relay that dies leaves its lease to run out, and the row is claimed
//! again (and published again: its key lets the consumer drop it).
//!
//! How a late commit is never missed: claims select by state (`pending`),
//! never "ids above the last one sent". Ids come from a sequence and commit
//! out of order (transaction A takes id 1, B takes 2, B commits first); a
//! high-water mark would skip 1 for ever, a state query finds it on the next
//! pass.
//!
//! How a relay hears of new rows: an `AFTER INSERT` trigger calls
//! `pg_notify('idem_outbox', '')`, delivered when the inserting transaction
//! commits; [`OutboxListener`] listens for it. Notifications are a hint, not a
//! queue: one lost while the listener reconnects is caught by the relay's
//! polling.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::{
    AtomicOutbox, Clock, Error, IdempotencyKey, NewDeadLetter, OutboxMessage, OutboxStats,
    OutboxStore, Pending, SentMessage, SharedClock, SystemClock, Timestamp, WakeUps,
};
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgListener, PgRow};

use crate::error::{BadRow, Endpoint, store_error};
use crate::store::PgStore;
use crate::{dead_letters, headers};

/// The channel the insert trigger notifies.
const CHANNEL: &str = "idem_outbox";

const INSERT: &str = "INSERT INTO idem_outbox (destination, key, payload, headers, created_at)
    VALUES ($1, $2, $3, $4, $5) RETURNING id";

const CLAIM: &str = "UPDATE idem_outbox AS o
    SET lease_owner = $1, lease_until = $2, attempts = o.attempts + 1
    FROM (
        SELECT id FROM idem_outbox
        WHERE state = 'pending'
          AND (available_at IS NULL OR available_at <= $3)
          AND (lease_until IS NULL OR lease_until <= $3)
          AND (destination IS NOT NULL OR $5)
        ORDER BY id
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ) AS due
    WHERE o.id = due.id
    RETURNING o.id, o.destination, o.key, o.payload, o.headers, o.attempts, o.created_at";

const MARK_SENT: &str = "UPDATE idem_outbox
    SET state = 'sent', sent_at = $2, lease_owner = NULL, lease_until = NULL
    WHERE id = ANY($1) AND state = 'pending'";

const RETRY_LATER: &str = "UPDATE idem_outbox
    SET attempts = $3, available_at = $4, last_error = $5, lease_owner = NULL, lease_until = NULL
    WHERE id = $1 AND lease_owner = $2 AND state = 'pending'";

const DELETE_HELD: &str =
    "DELETE FROM idem_outbox WHERE id = $1 AND lease_owner = $2 AND state = 'pending'";

const SWEEP_SENT: &str = "DELETE FROM idem_outbox WHERE id IN
    (SELECT id FROM idem_outbox WHERE state = 'sent' AND sent_at < $1 ORDER BY sent_at LIMIT $2)";

const RECENT_SENDS: &str = "SELECT id, destination, key, attempts, created_at, sent_at
    FROM idem_outbox WHERE state = 'sent' ORDER BY sent_at DESC, id DESC LIMIT $1";

const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE state = 'pending'),
    COUNT(*) FILTER (WHERE state = 'sent'),
    MIN(created_at) FILTER (WHERE state = 'pending')
    FROM idem_outbox";

/// Writes `message` on `conn`, inside whatever transaction it is in, stamped
/// `now`. Returns the row id.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    message: &OutboxMessage,
    now: Timestamp,
) -> sqlx::Result<i64> {
    sqlx::query_scalar(INSERT)
        .bind(message.destination.as_deref())
        .bind(message.key.as_str())
        .bind(&message.payload)
        .bind(headers::to_json(&message.headers))
        .bind(now.0)
        .fetch_one(conn)
        .await
}

fn pending(row: &PgRow) -> sqlx::Result<Pending> {
    let id: i64 = row.try_get(0)?;
    let key = IdempotencyKey::new(row.try_get::<String, _>(2)?)
        .map_err(|e| BadRow::into_sqlx(format!("outbox row {id} has an invalid key: {e}")))?;
    Ok(Pending {
        id,
        message: OutboxMessage {
            destination: row.try_get(1)?,
            key,
            payload: row.try_get(3)?,
            headers: headers::from_json(row.try_get::<&str, _>(4)?)?,
        },
        attempts: u32::try_from(row.try_get::<i32, _>(5)?).unwrap_or(u32::MAX),
        created_at: Timestamp(row.try_get(6)?),
    })
}

fn sent(row: &PgRow) -> sqlx::Result<SentMessage> {
    let id: i64 = row.try_get(0)?;
    let key = IdempotencyKey::new(row.try_get::<String, _>(2)?)
        .map_err(|e| BadRow::into_sqlx(format!("outbox row {id} has an invalid key: {e}")))?;
    Ok(SentMessage {
        id,
        destination: row.try_get(1)?,
        key,
        attempts: u32::try_from(row.try_get::<i32, _>(3)?).unwrap_or(u32::MAX),
        created_at: Timestamp(row.try_get(4)?),
        sent_at: Timestamp(row.try_get(5)?),
    })
}

fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// "Something was enqueued" signals: LISTEN `idem_outbox` on a connection of
/// its own.
#[derive(Debug)]
pub struct OutboxListener {
    listener: PgListener,
}

impl WakeUps for OutboxListener {
    fn next(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(error) = self.listener.recv().await {
                tracing::warn!(%error, "LISTEN idem_outbox failed; polling until it reconnects");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    }
}

impl AtomicOutbox for PgStore {
    /// On the connection of the caller's transaction. Stamped with the system
    /// clock, and its failures described without the server's address: inside
    /// an effect there is no store at hand.
    async fn enqueue(tx: &mut PgConnection, message: &OutboxMessage) -> Result<i64, Error> {
        insert(tx, message, SystemClock.now())
            .await
            .map_err(|e| store_error(e, &Endpoint::callers_connection()).into())
    }
}

impl OutboxStore for PgStore {
    fn outbox_clock(&self) -> SharedClock {
        self.clock().clone()
    }

    async fn enqueue_now(&self, message: &OutboxMessage) -> Result<i64, Error> {
        crate::pooler::one_shot!(self, |conn| insert(conn, message, self.clock().now())
            .await
            .map_err(|e| self.fail(e)))
    }

    async fn claim_outbox(
        &self,
        owner: &str,
        now: Timestamp,
        lease: Duration,
        limit_to: usize,
        with_default: bool,
    ) -> Result<Vec<Pending>, Error> {
        let mut claimed = crate::pooler::one_shot!(self, |conn| sqlx::query(CLAIM)
            .bind(owner)
            .bind(now.plus(lease).0)
            .bind(now.0)
            .bind(limit(limit_to))
            .bind(with_default)
            .fetch_all(conn)
            .await
            .and_then(|rows| rows.iter().map(pending).collect::<sqlx::Result<Vec<_>>>())
            .map_err(|e| self.fail(e)))?;
        claimed.sort_by_key(|p| p.id);
        Ok(claimed)
    }

    async fn mark_sent(&self, ids: &[i64], now: Timestamp) -> Result<u64, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(MARK_SENT)
            .bind(ids)
            .bind(now.0)
            .execute(conn)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| self.fail(e)))
    }

    async fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: Timestamp,
        error: &str,
    ) -> Result<bool, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(RETRY_LATER)
            .bind(id)
            .bind(owner)
            .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
            .bind(due.0)
            .bind(error)
            .execute(conn)
            .await
            .map(|done| done.rows_affected() == 1)
            .map_err(|e| self.fail(e)))
    }

    async fn bury(
        &self,
        id: i64,
        owner: &str,
        letter: &NewDeadLetter,
        now: Timestamp,
    ) -> Result<Option<i64>, Error> {
        let mut tx = self.begin_transaction().await?;
        let deleted = sqlx::query(DELETE_HELD)
            .bind(id)
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.fail(e))?
            .rows_affected();
        if deleted == 0 {
            return Ok(None);
        }
        let letter_id = dead_letters::insert(&mut tx, letter, now)
            .await
            .map_err(|e| self.fail(e))?;
        tx.commit().await.map_err(|e| self.fail(e))?;
        Ok(Some(letter_id))
    }

    async fn sweep_sent(&self, before: Timestamp, limit_to: usize) -> Result<u64, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(SWEEP_SENT)
            .bind(before.0)
            .bind(limit(limit_to))
            .execute(conn)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| self.fail(e)))
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        let (pending, sent, oldest): (i64, i64, Option<i64>) =
            crate::pooler::one_shot!(self, |conn| sqlx::query_as(STATS)
                .fetch_one(conn)
                .await
                .map_err(|e| self.fail(e)))?;
        Ok(OutboxStats {
            pending: pending.unsigned_abs(),
            sent: sent.unsigned_abs(),
            oldest_pending: oldest.map(Timestamp),
        })
    }

    async fn recent_sends(&self, limit_to: usize) -> Result<Vec<SentMessage>, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(RECENT_SENDS)
            .bind(limit(limit_to))
            .fetch_all(conn)
            .await
            .and_then(|rows| rows.iter().map(sent).collect())
            .map_err(|e| self.fail(e)))
    }

    async fn wake_ups(&self) -> Result<Option<Box<dyn WakeUps>>, Error> {
        if !self.can_listen("the outbox relay") {
            return Ok(None);
        }
        let mut listener = PgListener::connect_with(self.pool())
            .await
            .map_err(|e| self.fail(e))?;
        listener.listen(CHANNEL).await.map_err(|e| self.fail(e))?;
        Ok(Some(Box::new(OutboxListener { listener })))
    }
}
