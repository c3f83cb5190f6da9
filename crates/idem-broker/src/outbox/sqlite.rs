//! The outbox on the embedded SQLite store: [`enqueue`] in the caller's
//! transaction, and the relay's statements ([`OutboxStore`] for
//! [`SqliteStore`]).
//!
//! SQLite has one writer at a time, and every statement here runs on the
//! store's single writer thread inside `BEGIN IMMEDIATE`: a claim cannot
//! interleave with another claim, so the lease column alone keeps two relays
//! (in one or several processes on the same file) from sending the same row
//! at the same time. A relay that dies leaves its lease to run out.

use std::time::Duration;

use idem::SqliteStore;
use idem::sqlite::rusqlite::{self, Connection, TransactionBehavior, params};
use idem_core::{Clock, Error, IdempotencyKey, SharedClock, SystemClock, Timestamp};

use super::{OutboxStats, OutboxStore, Pending, Route, limit, millis};
use crate::db;
use crate::dead_letter::{self, NewDeadLetter};
use crate::publish::Message;
use crate::schema::{self, Component};

pub(crate) static COMPONENT: Component = Component {
    name: "outbox",
    sqlite: &[r#"
CREATE TABLE IF NOT EXISTS idem_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    destination  TEXT,
    key          TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent')),
    attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    available_at INTEGER,
    lease_owner  TEXT,
    lease_until  INTEGER,
    sent_at      INTEGER
);
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_sent_at ON idem_outbox (sent_at) WHERE state = 'sent';
"#],
    postgres: super::postgres::MIGRATIONS,
};

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

const STATS: &str = "SELECT
    COUNT(*) FILTER (WHERE state = 'pending'),
    COUNT(*) FILTER (WHERE state = 'sent'),
    MIN(created_at) FILTER (WHERE state = 'pending')
    FROM idem_outbox";

/// Enqueues `message` inside the caller's SQLite transaction (or connection):
/// it commits or rolls back with the business change. Returns the row id.
///
/// The first enqueue on a file this process has not migrated creates the
/// tables inside the same transaction.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{Fingerprint, IdempotencyKey, Outcome, Scope, SqliteStore};
/// use idem_broker::outbox::{self, derive_key};
/// use idem_broker::publish::{Destination, Message};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// let to: Destination = "nats://127.0.0.1:4222/orders.created".parse()?;
/// let request = IdempotencyKey::new("checkout-7")?;
/// let message = Message::new(derive_key(&request, "order-created")?, b"{\"order\":7}".to_vec());
/// store
///     .apply(&Scope::new("checkout")?, &request, Fingerprint::of_bytes(b"cart"), move |tx| {
///         tx.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER); INSERT INTO orders VALUES (7);")
///             .map_err(|e| e.to_string())?;
///         outbox::sqlite::enqueue(tx, &to, &message).map_err(|e| e.to_string())?;
///         Ok::<_, String>(Outcome::success("ordered"))
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub fn enqueue<'a>(
    tx: &Connection,
    route: impl Into<Route<'a>>,
    message: &Message,
) -> Result<i64, Error> {
    let path = tx.path().unwrap_or_default().to_owned();
    if !schema::sqlite_done(&path, &COMPONENT) {
        schema::apply_sqlite(tx, &COMPONENT)?;
        schema::apply_sqlite(tx, &dead_letter::table::COMPONENT)?;
    }
    insert(tx, route.into().stored(), message, SystemClock.now())
}

fn insert(
    tx: &Connection,
    destination: Option<String>,
    message: &Message,
    now: Timestamp,
) -> Result<i64, Error> {
    tx.execute(
        INSERT,
        params![
            destination,
            message.key.as_str(),
            message.payload,
            db::headers_json(&message.headers),
            now.0,
        ],
    )
    .map_err(|e| db::sqlite("enqueue an outbox message", e))?;
    Ok(tx.last_insert_rowid())
}

/// Enqueues in a transaction of its own.
pub(crate) async fn enqueue_now(
    store: &SqliteStore,
    route: Route<'_>,
    message: &Message,
) -> Result<i64, Error> {
    let destination = route.stored();
    let message = message.clone();
    let now = store.clock().now();
    store
        .with_connection(move |conn| insert(conn, destination, &message, now))
        .await?
}

fn begin(conn: &mut Connection) -> Result<rusqlite::Transaction<'_>, Error> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| db::sqlite("begin a write transaction", e))
}

/// A claimed row as read: id, destination, key, payload, headers, attempts, created_at.
pub(crate) type RawPending = (i64, Option<String>, String, Vec<u8>, String, i64, i64);

fn pending(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawPending> {
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

pub(crate) fn decode(
    (id, destination, key, payload, headers, attempts, created_at): RawPending,
) -> Result<Pending, Error> {
    let key = IdempotencyKey::new(key)
        .map_err(|e| db::corrupt(format!("outbox row {id} has an invalid key: {e}")))?;
    Ok(Pending {
        id,
        destination,
        message: Message {
            key,
            payload,
            headers: db::parse_headers(&headers)?,
        },
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        created_at: Timestamp(created_at),
    })
}

impl OutboxStore for SqliteStore {
    fn outbox_clock(&self) -> SharedClock {
        self.clock().clone()
    }

    async fn migrate_outbox(&self) -> Result<(), Error> {
        schema::ensure_sqlite(self, &COMPONENT).await?;
        schema::ensure_sqlite(self, &dead_letter::table::COMPONENT).await
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
        let owner = owner.to_owned();
        let until = now.0.saturating_add(millis(lease));
        let rows = self
            .with_connection(move |conn| {
                let tx = begin(conn)?;
                let rows = {
                    let mut statement = tx
                        .prepare_cached(CLAIM)
                        .map_err(|e| db::sqlite("claim outbox rows", e))?;
                    statement
                        .query_map(
                            params![owner, until, now.0, limit(limit_to), with_default],
                            pending,
                        )
                        .map_err(|e| db::sqlite("claim outbox rows", e))?
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| db::sqlite("read claimed outbox rows", e))?
                };
                tx.commit().map_err(|e| db::sqlite("commit a claim", e))?;
                Ok::<_, Error>(rows)
            })
            .await??;
        let mut claimed: Vec<Pending> = rows.into_iter().map(decode).collect::<Result<_, _>>()?;
        claimed.sort_by_key(|p| p.id);
        Ok(claimed)
    }

    async fn mark_sent(&self, ids: &[i64], now: Timestamp) -> Result<u64, Error> {
        let ids = ids.to_vec();
        self.with_connection(move |conn| {
            let tx = begin(conn)?;
            let mut changed = 0;
            {
                let mut statement = tx
                    .prepare_cached(MARK_SENT)
                    .map_err(|e| db::sqlite("mark outbox rows sent", e))?;
                for id in ids {
                    changed += statement
                        .execute(params![id, now.0])
                        .map_err(|e| db::sqlite("mark outbox rows sent", e))?
                        as u64;
                }
            }
            tx.commit()
                .map_err(|e| db::sqlite("commit sent marks", e))?;
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
            .map_err(|e| db::sqlite("reschedule an outbox row", e))
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
            let tx = begin(conn)?;
            let deleted = tx
                .execute(DELETE_HELD, params![id, owner])
                .map_err(|e| db::sqlite("remove a dead outbox row", e))?;
            if deleted == 0 {
                return Ok(None);
            }
            let letter_id = dead_letter::table::insert_sqlite(&tx, &letter, now)?;
            tx.commit()
                .map_err(|e| db::sqlite("commit a dead letter", e))?;
            Ok(Some(letter_id))
        })
        .await?
    }

    async fn sweep_sent(&self, before: Timestamp, limit_to: usize) -> Result<u64, Error> {
        self.migrate_outbox().await?;
        self.with_connection(move |conn| {
            conn.execute(SWEEP_SENT, params![before.0, limit(limit_to)])
                .map(|n| n as u64)
                .map_err(|e| db::sqlite("sweep sent outbox rows", e))
        })
        .await?
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.migrate_outbox().await?;
        self.with_connection(|conn| {
            conn.query_row(STATS, [], |row| {
                Ok(OutboxStats {
                    pending: row.get::<_, i64>(0)?.unsigned_abs(),
                    sent: row.get::<_, i64>(1)?.unsigned_abs(),
                    oldest_pending: row.get::<_, Option<i64>>(2)?.map(Timestamp),
                })
            })
            .map_err(|e| db::sqlite("count outbox rows", e))
        })
        .await?
    }

    async fn wake_ups(&self) -> Result<Option<super::postgres::WakeUps>, Error> {
        Ok(None)
    }
}
