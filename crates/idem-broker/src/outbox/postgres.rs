//! The outbox on PostgreSQL: [`enqueue`] on the caller's connection (inside
//! its transaction), and the relay's statements ([`OutboxStore`] for
//! [`PgStore`]).
//!
//! How several relays share one table without sending a row twice at once:
//! a claim is one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`
//! that sets a lease. A row another relay is claiming right now is locked and
//! skipped, not waited for; a row claimed earlier has a live lease and is
//! not due. A relay that dies leaves its lease to run out, and the row is
//! claimed again (and published again: the key lets the consumer drop it).
//!
//! How a late commit is never missed: claims select by state (`pending`),
//! never "ids above the last one sent". Ids come from a sequence and commit
//! out of order (transaction A takes id 1, B takes 2, B commits first); a
//! high-water mark would skip 1 for ever, a state query finds it on the next
//! pass.
//!
//! How a relay hears of new rows: an `AFTER INSERT` trigger calls
//! `pg_notify('idem_outbox', '')`, delivered when the inserting transaction
//! commits; [`WakeUps`] listens for it. Notifications are a hint, not a
//! queue: one lost while the listener reconnects is caught by the relay's
//! polling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem::PgStore;
use idem_core::{Clock, Error, SharedClock, SystemClock, Timestamp};
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, Row};

use super::{OutboxStats, OutboxStore, Pending, Route, limit, millis, sqlite};
use crate::db;
use crate::dead_letter::{self, NewDeadLetter};
use crate::publish::Message;
use crate::schema;

/// The channel the insert trigger notifies.
pub const CHANNEL: &str = "idem_outbox";

pub(crate) static MIGRATIONS: &[&str] = &[r#"
CREATE TABLE IF NOT EXISTS idem_outbox (
    id           BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination  TEXT    NULL,
    key          TEXT    NOT NULL,
    payload      BYTEA   NOT NULL,
    headers      TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent')),
    attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error   TEXT    NULL,
    created_at   BIGINT  NOT NULL,
    available_at BIGINT  NULL,
    lease_owner  TEXT    NULL,
    lease_until  BIGINT  NULL,
    sent_at      BIGINT  NULL
);
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_sent_at ON idem_outbox (sent_at) WHERE state = 'sent';
CREATE OR REPLACE FUNCTION idem_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_outbox', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS idem_outbox_notify ON idem_outbox;
CREATE TRIGGER idem_outbox_notify AFTER INSERT ON idem_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION idem_outbox_notify();
"#];

const INSERT: &str = "INSERT INTO idem_outbox (destination, key, payload, headers, created_at)
    VALUES ($1, $2, $3, $4, $5) RETURNING id";

const EXISTS: &str = "SELECT to_regclass('idem_outbox') IS NOT NULL";

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

const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE state = 'pending'),
    COUNT(*) FILTER (WHERE state = 'sent'),
    MIN(created_at) FILTER (WHERE state = 'pending')
    FROM idem_outbox";

/// Set once this process has seen the outbox table exist (or made it exist
/// and committed), so later enqueues skip the check.
static SEEN: AtomicBool = AtomicBool::new(false);

/// Enqueues `message` on the caller's connection, inside its transaction: it
/// commits or rolls back with the business change. Returns the row id.
///
/// The first enqueue of a process checks that the table exists and, if not,
/// creates it inside the caller's transaction. (A process that enqueues into
/// several databases should call [`migrate`](super::migrate) on each: after
/// the first, the check is skipped, and a missing table fails that one
/// transaction with an error saying so, then is created by the next enqueue.)
///
/// ```no_run
/// # async fn demo(store: idem::PgStore) -> Result<(), Box<dyn std::error::Error>> {
/// use futures::FutureExt;
/// use idem::{Fingerprint, IdempotencyKey, Outcome, Scope};
/// use idem_broker::outbox::{self, derive_key};
/// use idem_broker::publish::{Destination, Message};
///
/// let to: Destination = "amqp://guest:guest@127.0.0.1:5672/%2f?queue=emails".parse()?;
/// let request = IdempotencyKey::new("signup-7")?;
/// let message = Message::new(derive_key(&request, "welcome-email")?, b"user 7".to_vec());
/// store
///     .apply(&Scope::new("signup")?, &request, Fingerprint::of_bytes(b"user 7"), |conn| {
///         async move {
///             sqlx::query("INSERT INTO users (id) VALUES (7)").execute(&mut *conn).await
///                 .map_err(|e| e.to_string())?;
///             outbox::postgres::enqueue(conn, &to, &message).await.map_err(|e| e.to_string())?;
///             Ok::<_, String>(Outcome::success("signed up"))
///         }
///         .boxed()
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub async fn enqueue<'a>(
    conn: &mut PgConnection,
    route: impl Into<Route<'a>>,
    message: &Message,
) -> Result<i64, Error> {
    insert(conn, route.into().stored(), message).await
}

pub(crate) async fn insert(
    conn: &mut PgConnection,
    destination: Option<String>,
    message: &Message,
) -> Result<i64, Error> {
    if !SEEN.load(Ordering::Relaxed) {
        let exists: bool = sqlx::query_scalar(EXISTS)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| db::postgres("look for the outbox table", e))?;
        if exists {
            SEEN.store(true, Ordering::Relaxed);
        } else {
            schema::apply_postgres(conn, &sqlite::COMPONENT).await?;
            schema::apply_postgres(conn, &dead_letter::table::COMPONENT).await?;
        }
    }
    sqlx::query_scalar(INSERT)
        .bind(destination)
        .bind(message.key.as_str())
        .bind(&message.payload)
        .bind(db::headers_json(&message.headers))
        .bind(SystemClock.now().0)
        .fetch_one(conn)
        .await
        .map_err(|e| {
            let error = db::postgres("enqueue an outbox message", e);
            if matches!(&error, Error::Store(e) if e.kind() == idem_core::ErrorKind::Corrupt) {
                // The table this process thought it had seen is missing here
                // (another database, or dropped): check again next time.
                SEEN.store(false, Ordering::Relaxed);
            }
            super::not_migrated(error)
        })
}

/// "Something was enqueued" signals from PostgreSQL (LISTEN `idem_outbox`).
#[derive(Debug)]
pub struct WakeUps {
    listener: PgListener,
}

impl WakeUps {
    /// Waits for the next signal. A broken connection is reported as a signal
    /// (after a short pause), so the relay polls once and the listener
    /// reconnects on the next call.
    pub async fn next(&mut self) {
        if let Err(error) = self.listener.recv().await {
            tracing::warn!(%error, "LISTEN idem_outbox failed; polling until it reconnects");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

fn fail(doing: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| db::postgres(doing, e)
}

impl OutboxStore for PgStore {
    fn outbox_clock(&self) -> SharedClock {
        self.clock().clone()
    }

    async fn migrate_outbox(&self) -> Result<(), Error> {
        schema::ensure_postgres(self, &sqlite::COMPONENT).await?;
        schema::ensure_postgres(self, &dead_letter::table::COMPONENT).await?;
        SEEN.store(true, Ordering::Relaxed);
        Ok(())
    }

    async fn claim(
        &self,
        owner: &str,
        now: Timestamp,
        lease: Duration,
        limit_to: usize,
        with_default: bool,
    ) -> Result<Vec<Pending>, Error> {
        self.migrate_outbox().await?;
        let rows = sqlx::query(CLAIM)
            .bind(owner)
            .bind(now.0.saturating_add(millis(lease)))
            .bind(now.0)
            .bind(limit(limit_to))
            .bind(with_default)
            .fetch_all(self.pool())
            .await
            .map_err(fail("claim outbox rows"))?;
        let mut claimed = rows
            .iter()
            .map(|row| {
                let raw = (
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                    i64::from(row.try_get::<i32, _>(5)?),
                    row.try_get(6)?,
                );
                Ok(raw)
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(fail("read claimed outbox rows"))?
            .into_iter()
            .map(sqlite::decode)
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|p| p.id);
        Ok(claimed)
    }

    async fn mark_sent(&self, ids: &[i64], now: Timestamp) -> Result<u64, Error> {
        sqlx::query(MARK_SENT)
            .bind(ids)
            .bind(now.0)
            .execute(self.pool())
            .await
            .map(|done| done.rows_affected())
            .map_err(fail("mark outbox rows sent"))
    }

    async fn retry_later(
        &self,
        id: i64,
        owner: &str,
        attempts: u32,
        due: Timestamp,
        error: &str,
    ) -> Result<bool, Error> {
        sqlx::query(RETRY_LATER)
            .bind(id)
            .bind(owner)
            .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
            .bind(due.0)
            .bind(error)
            .execute(self.pool())
            .await
            .map(|done| done.rows_affected() == 1)
            .map_err(fail("reschedule an outbox row"))
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
            .map_err(fail("remove a dead outbox row"))?
            .rows_affected();
        if deleted == 0 {
            return Ok(None);
        }
        let letter_id = dead_letter::table::insert_postgres(&mut tx, letter, now).await?;
        tx.commit().await.map_err(fail("commit a dead letter"))?;
        Ok(Some(letter_id))
    }

    async fn sweep_sent(&self, before: Timestamp, limit_to: usize) -> Result<u64, Error> {
        self.migrate_outbox().await?;
        sqlx::query(SWEEP_SENT)
            .bind(before.0)
            .bind(limit(limit_to))
            .execute(self.pool())
            .await
            .map(|done| done.rows_affected())
            .map_err(fail("sweep sent outbox rows"))
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.migrate_outbox().await?;
        let (pending, sent, oldest): (i64, i64, Option<i64>) = sqlx::query_as(STATS)
            .fetch_one(self.pool())
            .await
            .map_err(fail("count outbox rows"))?;
        Ok(OutboxStats {
            pending: pending.unsigned_abs(),
            sent: sent.unsigned_abs(),
            oldest_pending: oldest.map(Timestamp),
        })
    }

    async fn wake_ups(&self) -> Result<Option<WakeUps>, Error> {
        let mut listener = PgListener::connect_with(self.pool())
            .await
            .map_err(fail("open a LISTEN connection"))?;
        listener
            .listen(CHANNEL)
            .await
            .map_err(fail("LISTEN idem_outbox"))?;
        Ok(Some(WakeUps { listener }))
    }
}
