//! The `idem_records` table: its migrations and every SQL statement that reads or
//! writes it, each written once, here.
//!
//! The protocol modules (`atomic`, `batch`, `leased`, `inspect`) say *when* a
//! statement runs and under which lock; this module says *what* it is. Functions
//! return raw sqlx results; callers map failures through
//! [`store_error`](crate::error::store_error).

use std::time::Duration;

use idem_core::{
    Claim, FencingToken, IdempotencyKey, Outcome, Record, RecordCount, RecordFilter, RecordGlance,
    RecordState, Scope, Timestamp,
};
use sqlx::Row;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnection, PgExecutor};

/// The schema migrations shipped with this crate (`migrations/`). The migrator
/// takes a session advisory lock, so several processes may run it at once.
pub(crate) static MIGRATOR: Migrator = sqlx::migrate!();

/// The columns a full record is read from, in one place for every `SELECT`.
macro_rules! record_columns {
    () => {
        "scope, key, fingerprint, state, token, lease_until, outcome_kind, outcome_body, \
         outcome_meta, created_at, updated_at, expires_at"
    };
}

/// What an upsert does on an existing row: replace it whole, but only if it is
/// still the row the writer's decision was made on. Tokens only grow, so a
/// row whose token is not smaller changed since it was read. A completion
/// takes no lock (see `leased`) and settles an in-flight row without
/// changing its token, so the row must also be the one decided on: past its
/// window when the new record starts a window of its own (`created_at` no
/// earlier than the row's end), or else still in flight in the same window
/// (a takeover, or a claim after a release, keeps the window).
macro_rules! replace_if_newer {
    () => {
        "ON CONFLICT (scope, key) DO UPDATE SET \
           fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, token = EXCLUDED.token, \
           lease_until = EXCLUDED.lease_until, outcome_kind = EXCLUDED.outcome_kind, \
           outcome_body = EXCLUDED.outcome_body, outcome_meta = EXCLUDED.outcome_meta, \
           created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, \
           expires_at = EXCLUDED.expires_at \
         WHERE idem_records.token < EXCLUDED.token \
           AND (idem_records.expires_at <= EXCLUDED.created_at \
                OR (idem_records.state = 'in_flight' \
                    AND idem_records.expires_at = EXCLUDED.expires_at))"
    };
}

mod row;
mod session;

pub(crate) use session::{
    CLAIM_WAITED, INSERT_FAILED, REPLACE_FAILED, STATEMENT_MISSING, execute_claim, execute_fetch,
    execute_insert, execute_replace, execute_settle, fetch_alone, from_row, prepare_session,
    prepare_statements,
};

/// The record of `(scope, key)`, if any.
pub(crate) async fn fetch<'e>(
    db: impl PgExecutor<'e>,
    scope: &Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<Option<Record>> {
    sqlx::query(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idem_records WHERE scope = $1 AND key = $2"
    ))
    .bind(scope.as_str())
    .bind(key.as_str())
    .fetch_optional(db)
    .await?
    .as_ref()
    .map(row::record)
    .transpose()
}

/// The records of several `(scope, key)` pairs, in one statement, in no
/// particular order.
pub(crate) async fn fetch_all(
    conn: &mut PgConnection,
    keys: &[(&Scope, &IdempotencyKey)],
) -> sqlx::Result<Vec<Record>> {
    let scopes: Vec<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    sqlx::query(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idem_records WHERE (scope, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
    ))
    .bind(scopes)
    .bind(names)
    .fetch_all(conn)
    .await?
    .iter()
    .map(row::record)
    .collect()
}

/// Writes whole records (new ones, or replacements of the ones read under the
/// lock) in one statement; returns how many rows were written.
///
/// An existing row is replaced only if the new token is greater: tokens only
/// grow, so a smaller or equal one means the row changed after it was read and
/// the caller's decision is stale. Callers compare the count with the number
/// of records and roll back on a shortfall. The keys must be distinct.
pub(crate) async fn write(conn: &mut PgConnection, records: &[Record]) -> sqlx::Result<u64> {
    let c = row::Columns::of(records);
    let done = sqlx::query(concat!(
        "INSERT INTO idem_records (",
        record_columns!(),
        ") SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], \
         $6::bigint[], $7::text[], $8::bytea[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[]) ",
        replace_if_newer!()
    ))
    .bind(c.scope)
    .bind(c.key)
    .bind(c.fingerprint)
    .bind(c.state)
    .bind(c.token)
    .bind(c.lease_until)
    .bind(c.outcome_kind)
    .bind(c.outcome_body)
    .bind(c.outcome_meta)
    .bind(c.created_at)
    .bind(c.updated_at)
    .bind(c.expires_at)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// The token of a row answered by [`execute_claim`].
pub(crate) fn claimed_token(row: &sqlx::postgres::PgRow) -> sqlx::Result<FencingToken> {
    row::token(row.try_get("token")?)
}

/// The end of the dedupe window of a row answered by [`execute_claim`].
pub(crate) fn claimed_window_end(row: &sqlx::postgres::PgRow) -> sqlx::Result<Timestamp> {
    Ok(Timestamp(row.try_get("expires_at")?))
}

/// What a fenced update found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// The caller's token was current and the record in flight: the update was made.
    Held,
    /// The update matched nothing; `current` is the record's token, if it exists.
    Lost {
        /// The record's token as the same statement saw it.
        current: Option<FencingToken>,
    },
}

/// Reads a row with the columns `held` and `current`: the answer of a fenced
/// update.
pub(crate) fn fence(row: &sqlx::postgres::PgRow) -> sqlx::Result<Fence> {
    if row.try_get("held")? {
        return Ok(Fence::Held);
    }
    let current: Option<i64> = row.try_get("current")?;
    Ok(Fence::Lost {
        current: current.map(row::token).transpose()?,
    })
}

/// Settles an in-flight record with `outcome`, if `claim` still holds it.
///
/// The `current` CTE reads the row in the same snapshot as the update, so a
/// refusal names the token that won without another round trip.
pub(crate) async fn settle(
    conn: &mut PgConnection,
    claim: &Claim,
    outcome: &Outcome,
    now: Timestamp,
) -> sqlx::Result<Fence> {
    let row = sqlx::query(
        "WITH current AS (SELECT token FROM idem_records WHERE scope = $1 AND key = $2), \
         changed AS ( \
           UPDATE idem_records SET state = $4, outcome_kind = $5, outcome_body = $6, \
             outcome_meta = $7, lease_until = NULL, updated_at = $8 \
           WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight' \
           RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM changed) AS held, (SELECT token FROM current) AS current",
    )
    .bind(claim.scope.as_str())
    .bind(claim.key.as_str())
    .bind(claim.token.get())
    .bind(RecordState::settled_by(outcome.kind).as_str())
    .bind(outcome.kind.as_str())
    .bind(outcome.body.as_slice())
    .bind(outcome.meta_json())
    .bind(now.0)
    .fetch_one(conn)
    .await?;
    fence(&row)
}

/// [`settle`] for several claims of distinct keys in one statement; one
/// [`Fence`] per claim, in order.
pub(crate) async fn settle_all(
    conn: &mut PgConnection,
    settled: &[(&Claim, &Outcome)],
    now: Timestamp,
) -> sqlx::Result<Vec<Fence>> {
    let scopes: Vec<&str> = settled.iter().map(|(c, _)| c.scope.as_str()).collect();
    let keys: Vec<&str> = settled.iter().map(|(c, _)| c.key.as_str()).collect();
    let tokens: Vec<i64> = settled.iter().map(|(c, _)| c.token.get()).collect();
    let states: Vec<&str> = settled
        .iter()
        .map(|(_, o)| RecordState::settled_by(o.kind).as_str())
        .collect();
    let kinds: Vec<&str> = settled.iter().map(|(_, o)| o.kind.as_str()).collect();
    let bodies: Vec<&[u8]> = settled.iter().map(|(_, o)| o.body.as_slice()).collect();
    let metas: Vec<String> = settled.iter().map(|(_, o)| o.meta_json()).collect();
    let rows = sqlx::query(
        "WITH u AS (            SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[],              $6::bytea[], $7::text[]) WITH ORDINALITY AS u(scope, key, token, state, kind, body, meta, i)),          changed AS (            UPDATE idem_records AS r SET state = u.state, outcome_kind = u.kind,              outcome_body = u.body, outcome_meta = u.meta, lease_until = NULL, updated_at = $8            FROM u            WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token              AND r.state = 'in_flight'            RETURNING u.i)          SELECT u.i, EXISTS (SELECT 1 FROM changed WHERE changed.i = u.i) AS held,            (SELECT r.token FROM idem_records AS r WHERE r.scope = u.scope AND r.key = u.key) AS current          FROM u ORDER BY u.i",
    )
    .bind(scopes)
    .bind(keys)
    .bind(tokens)
    .bind(states)
    .bind(kinds)
    .bind(bodies)
    .bind(metas)
    .bind(now.0)
    .fetch_all(conn)
    .await?;
    if rows.len() != settled.len() {
        return Err(sqlx::Error::Protocol(format!(
            "settling {} claims answered {} rows",
            settled.len(),
            rows.len()
        )));
    }
    rows.iter().map(fence).collect()
}

/// Moves the lease end of an in-flight record, if `claim` still holds it: later
/// to renew, to now to release.
pub(crate) async fn set_lease(
    conn: &mut PgConnection,
    claim: &Claim,
    lease_until: Option<Timestamp>,
    now: Timestamp,
) -> sqlx::Result<Fence> {
    let row = sqlx::query(
        "WITH current AS (SELECT token FROM idem_records WHERE scope = $1 AND key = $2), \
         changed AS ( \
           UPDATE idem_records SET lease_until = $4, updated_at = $5 \
           WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight' \
           RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM changed) AS held, (SELECT token FROM current) AS current",
    )
    .bind(claim.scope.as_str())
    .bind(claim.key.as_str())
    .bind(claim.token.get())
    .bind(lease_until.map(|t| t.0))
    .bind(now.0)
    .fetch_one(conn)
    .await?;
    fence(&row)
}

/// The token and state of `(scope, key)`, with the row locked until the
/// transaction ends.
pub(crate) async fn lock_token(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<Option<(FencingToken, RecordState)>> {
    let Some(found) = sqlx::query(
        "SELECT token, state FROM idem_records WHERE scope = $1 AND key = $2 FOR UPDATE",
    )
    .bind(scope.as_str())
    .bind(key.as_str())
    .fetch_optional(conn)
    .await?
    else {
        return Ok(None);
    };
    Ok(Some((
        row::token(found.try_get("token")?)?,
        row::state(found.try_get("state")?)?,
    )))
}

/// Deletes the record of `(scope, key)` (an operator's eviction).
pub(crate) async fn delete(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM idem_records WHERE scope = $1 AND key = $2")
        .bind(scope.as_str())
        .bind(key.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// Ends the in-flight claim of `found` (an operator's release): the lease is
/// cleared and the token raised by one, so its holder is fenced and the next
/// claim takes the token after that.
pub(crate) async fn end_claim(
    conn: &mut PgConnection,
    found: &Record,
    now: Timestamp,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE idem_records SET token = token + 1, lease_until = NULL, updated_at = $1 \
         WHERE scope = $2 AND key = $3 AND token = $4 AND state = 'in_flight'",
    )
    .bind(now.0)
    .bind(found.scope.as_str())
    .bind(found.key.as_str())
    .bind(found.token.get())
    .execute(conn)
    .await?;
    Ok(())
}

/// At most `limit` records of `scopes` after `after`, by window end, then
/// scope, then key: one range of the `expires_at` index.
pub(crate) async fn by_expiry<'e>(
    db: impl PgExecutor<'e>,
    scopes: &[&str],
    after: Option<(Timestamp, &str, &str)>,
    limit: usize,
) -> sqlx::Result<Vec<Record>> {
    let (expires_at, scope, key) = after.unwrap_or((Timestamp(i64::MIN), "", ""));
    sqlx::query(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idem_records \
          WHERE scope = ANY($1) AND expires_at >= $2 \
            AND (expires_at, scope, key) > ($2, $3::text, $4::text) \
          ORDER BY expires_at, scope, key \
          LIMIT $5"
    ))
    .bind(scopes)
    .bind(expires_at.0)
    .bind(scope)
    .bind(key)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(db)
    .await?
    .iter()
    .map(row::record)
    .collect()
}

/// Records matching `filter`, newest first.
pub(crate) async fn list<'e>(
    db: impl PgExecutor<'e>,
    filter: &RecordFilter,
) -> sqlx::Result<Vec<Record>> {
    sqlx::query(concat!(
        "SELECT ",
        record_columns!(),
        " FROM idem_records \
          WHERE ($1::text IS NULL OR scope = $1) AND ($2::text IS NULL OR state = $2) \
            AND ($4::text IS NULL OR starts_with(key, $4)) \
            AND ($5::bigint IS NULL OR created_at < $5 \
                 OR (created_at = $5 AND (scope > $6 OR (scope = $6 AND key > $7)))) \
          ORDER BY created_at DESC, scope, key \
          LIMIT $3"
    ))
    .bind(filter.scope.as_ref().map(Scope::as_str))
    .bind(filter.state.map(RecordState::as_str))
    .bind(filter.limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
    .bind(filter.key_prefix.as_deref())
    .bind(filter.after.as_ref().map(|c| c.created_at.0))
    .bind(filter.after.as_ref().map(|c| c.scope.as_str()))
    .bind(filter.after.as_ref().map(|c| c.key.as_str()))
    .fetch_all(db)
    .await?
    .iter()
    .map(row::record)
    .collect()
}

/// How many records there are, and how many are past retention at `now`.
pub(crate) async fn count<'e>(
    db: impl PgExecutor<'e>,
    now: Timestamp,
) -> sqlx::Result<RecordCount> {
    let row = sqlx::query(
        "SELECT count(*) AS total, count(*) FILTER (WHERE expires_at <= $1) AS expired \
         FROM idem_records",
    )
    .bind(now.0)
    .fetch_one(db)
    .await?;
    let total: i64 = row.try_get("total")?;
    let expired: i64 = row.try_get("expired")?;
    Ok(RecordCount {
        total: total.unsigned_abs(),
        expired: expired.unsigned_abs(),
    })
}

/// The advisory lock a sweeper holds for one batch, so the sweepers of many
/// processes on one database take turns instead of deleting side by side.
/// The number is the text `idem_records sweep` hashed once; it only has to
/// differ from the per-key locks, which are drawn from a 64-bit hash too.
pub const SWEEP_LOCK: i64 = 0x1de3_5eef_0000_0001;

/// One sweep batch under [`SWEEP_LOCK`], in a transaction of its own; `None`
/// when another sweeper holds the lock.
pub(crate) async fn sweep_alone(
    pool: &sqlx::PgPool,
    now: Timestamp,
    limit: usize,
    grace: Option<Duration>,
    begin: &'static str,
) -> sqlx::Result<Option<u64>> {
    let mut tx = crate::lock::begin(pool, begin).await?;
    let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(SWEEP_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !held {
        tx.rollback().await?;
        return Ok(None);
    }
    let deleted = sweep(&mut *tx, now, limit, grace).await?;
    tx.commit().await?;
    Ok(Some(deleted))
}

/// The gauges' figures without a scan: the planner's row estimate (an exact
/// count while the table has never been analysed) and the creation time of
/// the record that expires first, read from the expiry index.
pub(crate) async fn glance(conn: &mut PgConnection, now: Timestamp) -> sqlx::Result<RecordGlance> {
    let row = sqlx::query(
        "SELECT (SELECT reltuples::BIGINT FROM pg_class WHERE oid = 'idem_records'::regclass) AS estimate, \
                (SELECT created_at FROM idem_records ORDER BY expires_at LIMIT 1) AS oldest",
    )
    .fetch_one(&mut *conn)
    .await?;
    let estimate: Option<i64> = row.try_get("estimate")?;
    let oldest: Option<i64> = row.try_get("oldest")?;
    let records = match estimate {
        Some(n) if n >= 0 => n.unsigned_abs(),
        _ => sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idem_records")
            .fetch_one(conn)
            .await?
            .unsigned_abs(),
    };
    Ok(RecordGlance {
        records,
        oldest_age: oldest.map(|created| Timestamp(created).until(now)),
    })
}

/// Deletes at most `limit` records past retention at `now`, oldest first, and
/// returns how many rows it deleted. With tombstones kept (`grace`), one is
/// left in place of each record whose window ended less than `grace` ago, and
/// at most `limit` tombstones whose grace period is over are deleted too (and
/// counted), all in one statement.
///
/// Rows another transaction is writing are skipped, not waited for; the
/// outer `expires_at` test re-checks a row that was renewed after the inner
/// select saw it.
pub(crate) async fn sweep<'e>(
    db: impl PgExecutor<'e>,
    now: Timestamp,
    limit: usize,
    grace: Option<Duration>,
) -> sqlx::Result<u64> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let Some(grace) = grace else {
        let done = sqlx::query(
            "DELETE FROM idem_records AS r \
             USING (SELECT scope, key FROM idem_records WHERE expires_at <= $1 \
                    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS due \
             WHERE r.scope = due.scope AND r.key = due.key AND r.expires_at <= $1",
        )
        .bind(now.0)
        .bind(limit)
        .execute(db)
        .await?;
        return Ok(done.rows_affected());
    };
    let deleted: i64 = sqlx::query_scalar(
        "WITH gone AS ( \
           DELETE FROM idem_records AS r \
           USING (SELECT scope, key FROM idem_records WHERE expires_at <= $1 \
                  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS due \
           WHERE r.scope = due.scope AND r.key = due.key AND r.expires_at <= $1 \
           RETURNING r.scope, r.key, r.fingerprint, r.token, r.expires_at), \
         buried AS ( \
           INSERT INTO idem_tombstones (scope, key, fingerprint, token, expired_at) \
           SELECT scope, key, fingerprint, token, expires_at FROM gone WHERE expires_at > $3 \
           ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
             token = EXCLUDED.token, expired_at = EXCLUDED.expired_at \
           RETURNING 1), \
         forgotten AS ( \
           DELETE FROM idem_tombstones AS t \
           USING (SELECT scope, key FROM idem_tombstones WHERE expired_at <= $3 \
                  ORDER BY expired_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS due \
           WHERE t.scope = due.scope AND t.key = due.key \
           RETURNING 1) \
         SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM forgotten) \
                + 0 * (SELECT count(*) FROM buried)",
    )
    .bind(now.0)
    .bind(limit)
    .bind(now.0.saturating_sub(millis(grace)))
    .fetch_one(db)
    .await?;
    Ok(deleted.unsigned_abs())
}

fn millis(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).unwrap_or(i64::MAX)
}

/// The tombstones of `keys` whose window ended less than `grace` before
/// `now`, each read as the expired record it stands for (its end clamped to
/// `now`, should another node's clock have run ahead), in one statement.
pub(crate) async fn fetch_tombstones(
    conn: &mut PgConnection,
    keys: &[(&Scope, &IdempotencyKey)],
    now: Timestamp,
    grace: Duration,
) -> sqlx::Result<Vec<Record>> {
    let scopes: Vec<&str> = keys.iter().map(|(s, _)| s.as_str()).collect();
    let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    sqlx::query(
        "SELECT scope, key, fingerprint, token, expired_at FROM idem_tombstones \
         WHERE (scope, key) IN (SELECT * FROM unnest($1::text[], $2::text[])) AND expired_at > $3",
    )
    .bind(scopes)
    .bind(names)
    .bind(now.0.saturating_sub(millis(grace)))
    .fetch_all(conn)
    .await?
    .iter()
    .map(|row| row::tombstone(row, now))
    .collect()
}
