//! Every statement on `idem_records`, and the mapping between its rows and
//! [`Record`]. Nothing else in the crate writes SQL for this table.

use std::time::Duration;

use idem_core::{
    Error, FencingToken, Fingerprint, IdempotencyKey, Operation, Outcome, OutcomeKind, Record,
    RecordFilter, RecordGlance, RecordState, Scope, Timestamp,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::{corrupt, map_error};

const COLUMNS: &str = "scope, key, fingerprint, state, token, lease_until, outcome_kind, \
                       outcome_body, outcome_meta, created_at, updated_at, expires_at";

struct RawRow {
    scope: String,
    key: String,
    fingerprint: Vec<u8>,
    state: String,
    token: i64,
    lease_until: Option<i64>,
    outcome_kind: Option<String>,
    outcome_body: Option<Vec<u8>>,
    outcome_meta: Option<String>,
    created_at: i64,
    updated_at: i64,
    expires_at: i64,
}

fn raw(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        scope: row.get(0)?,
        key: row.get(1)?,
        fingerprint: row.get(2)?,
        state: row.get(3)?,
        token: row.get(4)?,
        lease_until: row.get(5)?,
        outcome_kind: row.get(6)?,
        outcome_body: row.get(7)?,
        outcome_meta: row.get(8)?,
        created_at: row.get(9)?,
        updated_at: row.get(10)?,
        expires_at: row.get(11)?,
    })
}

impl RawRow {
    fn into_record(self) -> Result<Record, Error> {
        let at = || format!("{}/{}", self.scope, self.key);
        let outcome = match (self.outcome_kind, self.outcome_body) {
            (Some(kind), Some(body)) => Some(Outcome {
                kind: kind
                    .parse::<OutcomeKind>()
                    .map_err(|e| corrupt(format!("record {}: {e}", at())))?,
                body,
                meta: Outcome::parse_meta(self.outcome_meta.as_deref().unwrap_or("{}"))
                    .map_err(|e| corrupt(format!("outcome metadata of {}: {e}", at())))?,
            }),
            _ => None,
        };
        Ok(Record {
            fingerprint: Fingerprint::from_slice(&self.fingerprint)
                .ok_or_else(|| corrupt(format!("fingerprint of {} is not 32 bytes", at())))?,
            state: self
                .state
                .parse()
                .map_err(|e| corrupt(format!("record {}: {e}", at())))?,
            token: FencingToken::new(self.token)
                .ok_or_else(|| corrupt(format!("record {} has token {}", at(), self.token)))?,
            lease_until: self.lease_until.map(Timestamp),
            outcome,
            created_at: Timestamp(self.created_at),
            updated_at: Timestamp(self.updated_at),
            expires_at: Timestamp(self.expires_at),
            scope: Scope::new(self.scope).map_err(|e| corrupt(e.to_string()))?,
            key: IdempotencyKey::new(self.key).map_err(|e| corrupt(e.to_string()))?,
        })
    }
}

/// Reads one record.
pub(crate) fn select(conn: &Connection, scope: &str, key: &str) -> Result<Option<Record>, Error> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM idem_records WHERE scope = ?1 AND key = ?2"
        ))
        .map_err(|e| map_error("prepare the record lookup", e))?;
    stmt.query_row(params![scope, key], raw)
        .optional()
        .map_err(|e| map_error("read a record", e))?
        .map(RawRow::into_record)
        .transpose()
}

/// Reads the records for many `(scope, key)` pairs with one statement.
pub(crate) fn select_many(conn: &Connection, pairs: &[(&str, &str)]) -> Result<Vec<Record>, Error> {
    let wanted = serde_json::to_string(pairs).expect("string pairs always serialize");
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM idem_records WHERE (scope, key) IN \
             (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1))"
        ))
        .map_err(|e| map_error("prepare the batch lookup", e))?;
    let rows = stmt
        .query_map(params![wanted], raw)
        .map_err(|e| map_error("read records", e))?;
    rows.map(|row| {
        row.map_err(|e| map_error("read records", e))
            .and_then(RawRow::into_record)
    })
    .collect()
}

/// Writes a whole record, inserting it or replacing the one stored under the
/// same `(scope, key)`. Callers have decided, inside the same transaction, that
/// the replacement is allowed.
pub(crate) fn write(conn: &Connection, record: &Record) -> Result<(), Error> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "INSERT INTO idem_records ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
             ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, \
             state = excluded.state, token = excluded.token, lease_until = excluded.lease_until, \
             outcome_kind = excluded.outcome_kind, outcome_body = excluded.outcome_body, \
             outcome_meta = excluded.outcome_meta, created_at = excluded.created_at, \
             updated_at = excluded.updated_at, expires_at = excluded.expires_at"
        ))
        .map_err(|e| map_error("prepare the record write", e))?;
    let outcome = record.outcome.as_ref();
    stmt.execute(params![
        record.scope.as_str(),
        record.key.as_str(),
        &record.fingerprint.as_bytes()[..],
        record.state.as_str(),
        record.token.get(),
        record.lease_until.map(|t| t.0),
        outcome.map(|o| o.kind.as_str()),
        outcome.map(|o| &o.body[..]),
        outcome.map(Outcome::meta_json),
        record.created_at.0,
        record.updated_at.0,
        record.expires_at.0,
    ])
    .map_err(|e| map_error("write a record", e))?;
    Ok(())
}

/// A change to an in-flight record, accepted only from the holder of its token.
#[derive(Debug)]
pub(crate) enum HeldChange<'a> {
    /// Store the outcome and settle the record. Its window (`created_at`,
    /// `expires_at`) stays as the first claim set it.
    Settle(&'a Outcome),
    /// Move the end of the lease (renew), or clear it (release: the key is
    /// free, and the next claim is not a takeover).
    Lease(Option<Timestamp>),
}

/// Applies `change` if `token` is still the record's token and it is in flight.
/// Returns whether a row was changed.
pub(crate) fn update_held(
    conn: &Connection,
    scope: &str,
    key: &str,
    token: FencingToken,
    change: HeldChange<'_>,
    now: Timestamp,
) -> Result<bool, Error> {
    let changed = match change {
        HeldChange::Settle(outcome) => {
            let mut stmt = conn
                .prepare_cached(
                    "UPDATE idem_records SET state = ?1, outcome_kind = ?2, outcome_body = ?3, \
                     outcome_meta = ?4, lease_until = NULL, updated_at = ?5 \
                     WHERE scope = ?6 AND key = ?7 AND token = ?8 AND state = 'in_flight'",
                )
                .map_err(|e| map_error("prepare the completion", e))?;
            stmt.execute(params![
                RecordState::settled_by(outcome.kind).as_str(),
                outcome.kind.as_str(),
                &outcome.body[..],
                outcome.meta_json(),
                now.0,
                scope,
                key,
                token.get(),
            ])
            .map_err(|e| map_error("complete a record", e))?
        }
        HeldChange::Lease(until) => {
            let mut stmt = conn
                .prepare_cached(
                    "UPDATE idem_records SET lease_until = ?1, updated_at = ?2 \
                     WHERE scope = ?3 AND key = ?4 AND token = ?5 AND state = 'in_flight'",
                )
                .map_err(|e| map_error("prepare the lease update", e))?;
            stmt.execute(params![until.map(|t| t.0), now.0, scope, key, token.get()])
                .map_err(|e| map_error("update a lease", e))?
        }
    };
    Ok(changed == 1)
}

/// Deletes the record of `(scope, key)` (an operator's eviction).
pub(crate) fn delete(conn: &Connection, scope: &str, key: &str) -> Result<(), Error> {
    conn.prepare_cached("DELETE FROM idem_records WHERE scope = ?1 AND key = ?2")
        .and_then(|mut stmt| stmt.execute(params![scope, key]))
        .map_err(|e| map_error("remove a record", e))?;
    Ok(())
}

/// Ends the in-flight claim with `token` (an operator's release): the lease
/// is cleared and the token raised by one, so its holder is fenced and the
/// next claim takes the token after that. Returns whether a row changed.
pub(crate) fn end_claim(
    conn: &Connection,
    scope: &str,
    key: &str,
    token: FencingToken,
    now: Timestamp,
) -> Result<bool, Error> {
    let changed = conn
        .prepare_cached(
            "UPDATE idem_records SET token = token + 1, lease_until = NULL, updated_at = ?1 \
             WHERE scope = ?2 AND key = ?3 AND token = ?4 AND state = 'in_flight'",
        )
        .and_then(|mut stmt| stmt.execute(params![now.0, scope, key, token.get()]))
        .map_err(|e| map_error("end a claim", e))?;
    Ok(changed == 1)
}

/// At most `limit` records of `scopes` after `after`, by window end, then
/// scope, then key: one range of the `expires_at` index. (`+scope` keeps
/// the planner off the primary key, which would read every record of the
/// scope and sort them for each page.)
pub(crate) fn by_expiry(
    conn: &Connection,
    scopes: &[&str],
    after: Option<(i64, &str, &str)>,
    limit: usize,
) -> Result<Vec<Record>, Error> {
    let scopes = serde_json::to_string(scopes).expect("strings always serialize");
    let (expires_at, scope, key) = after.unwrap_or((i64::MIN, "", ""));
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM idem_records \
             WHERE +scope IN (SELECT value FROM json_each(?1)) \
               AND expires_at >= ?2 AND (expires_at, scope, key) > (?2, ?3, ?4) \
             ORDER BY expires_at, scope, key LIMIT ?5"
        ))
        .map_err(|e| map_error("prepare the page of records", e))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt
        .query_map(params![scopes, expires_at, scope, key, limit], raw)
        .map_err(|e| map_error("read a page of records", e))?;
    rows.map(|row| {
        row.map_err(|e| map_error("read a page of records", e))
            .and_then(RawRow::into_record)
    })
    .collect()
}

/// Records matching `filter`, newest first.
pub(crate) fn list(conn: &Connection, filter: &RecordFilter) -> Result<Vec<Record>, Error> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM idem_records \
             WHERE (?1 IS NULL OR scope = ?1) AND (?2 IS NULL OR state = ?2) \
               AND (?4 IS NULL OR substr(key, 1, length(?4)) = ?4) \
               AND (?5 IS NULL OR created_at < ?5 \
                    OR (created_at = ?5 AND (scope > ?6 OR (scope = ?6 AND key > ?7)))) \
             ORDER BY created_at DESC, scope, key LIMIT ?3"
        ))
        .map_err(|e| map_error("prepare the listing", e))?;
    let limit = filter
        .limit
        .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let rows = stmt
        .query_map(
            params![
                filter.scope.as_ref().map(Scope::as_str),
                filter.state.map(RecordState::as_str),
                limit,
                filter.key_prefix.as_deref(),
                filter.after.as_ref().map(|c| c.created_at.0),
                filter.after.as_ref().map(|c| c.scope.as_str()),
                filter.after.as_ref().map(|c| c.key.as_str()),
            ],
            raw,
        )
        .map_err(|e| map_error("list records", e))?;
    rows.map(|row| {
        row.map_err(|e| map_error("list records", e))
            .and_then(RawRow::into_record)
    })
    .collect()
}

/// `(all records, records past retention)`.
pub(crate) fn count(conn: &Connection, now: Timestamp) -> Result<(u64, u64), Error> {
    conn.prepare_cached("SELECT count(*), coalesce(sum(expires_at <= ?1), 0) FROM idem_records")
        .and_then(|mut stmt| {
            stmt.query_row(params![now.0], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
            })
        })
        .map(|(total, expired)| (total.unsigned_abs(), expired.unsigned_abs()))
        .map_err(|e| map_error("count records", e))
}

/// The gauges' figures: an exact count (SQLite keeps no estimate; the
/// sweeper reads it once per pass, not per scrape) and the creation time of
/// the record that expires first, from the expiry index.
pub(crate) fn glance(conn: &Connection, now: Timestamp) -> Result<RecordGlance, Error> {
    conn.prepare_cached(
        "SELECT (SELECT count(*) FROM idem_records), \
                (SELECT created_at FROM idem_records ORDER BY expires_at LIMIT 1)",
    )
    .and_then(|mut stmt| {
        stmt.query_row([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Option<i64>>(1)?))
        })
    })
    .map(|(records, oldest)| RecordGlance {
        records: records.unsigned_abs(),
        oldest_age: oldest.map(|created| Timestamp(created).until(now)),
    })
    .map_err(|e| map_error("glance at the records", e))
}

/// The tombstone of `op`'s key, read as the expired record it stands for,
/// if the key's window ended less than `grace` before `now`.
pub(crate) fn select_tombstone(
    conn: &Connection,
    op: &Operation,
    now: Timestamp,
    grace: Duration,
) -> Result<Option<Record>, Error> {
    let since = now.0.saturating_sub(millis(grace));
    let mut stmt = conn
        .prepare_cached(
            "SELECT fingerprint, token, expired_at FROM idem_tombstones \
             WHERE scope = ?1 AND key = ?2 AND expired_at > ?3",
        )
        .map_err(|e| map_error("prepare the tombstone lookup", e))?;
    let found = stmt
        .query_row(params![op.scope.as_str(), op.key.as_str(), since], |row| {
            Ok((
                row.get::<_, Vec<u8>>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .optional()
        .map_err(|e| map_error("read a tombstone", e))?;
    let Some((fingerprint, token, expired_at)) = found else {
        return Ok(None);
    };
    let at = || format!("{}/{}", op.scope, op.key);
    Ok(Some(Record::tombstone(
        op.scope.clone(),
        op.key.clone(),
        Fingerprint::from_slice(&fingerprint).ok_or_else(|| {
            corrupt(format!(
                "tombstone {} has a fingerprint of {} bytes",
                at(),
                fingerprint.len()
            ))
        })?,
        FencingToken::new(token)
            .ok_or_else(|| corrupt(format!("tombstone {} has token {token}", at())))?,
        Timestamp(expired_at),
    )))
}

fn millis(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).unwrap_or(i64::MAX)
}

/// Deletes at most `limit` records past retention, oldest first, and with
/// tombstones kept (`grace`) leaves one in place of each record whose window
/// ended less than `grace` ago, then deletes at most `limit` tombstones whose
/// grace period is over. Returns how many rows (records and tombstones) it
/// deleted.
pub(crate) fn sweep_batch(
    conn: &Connection,
    now: Timestamp,
    limit: usize,
    grace: Option<Duration>,
) -> Result<u64, Error> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let tx = conn
        .unchecked_transaction()
        .map_err(|e| map_error("begin the sweep", e))?;
    let deleted = match grace {
        None => tx
            .prepare_cached(
                "DELETE FROM idem_records WHERE (scope, key) IN \
                 (SELECT scope, key FROM idem_records WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)",
            )
            .and_then(|mut stmt| stmt.execute(params![now.0, limit]))
            .map_err(|e| map_error("sweep expired records", e))?,
        Some(grace) => {
            let since = now.0.saturating_sub(millis(grace));
            let records = tx
                .prepare_cached(
                    "DELETE FROM idem_records WHERE (scope, key) IN \
                     (SELECT scope, key FROM idem_records WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2) \
                     RETURNING scope, key, fingerprint, token, expires_at",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![now.0, limit], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, Vec<u8>>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, i64>(4)?,
                        ))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| map_error("sweep expired records", e))?;
            let mut bury = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO idem_tombstones (scope, key, fingerprint, token, expired_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(|e| map_error("prepare the tombstones", e))?;
            for (scope, key, fingerprint, token, expired_at) in &records {
                if *expired_at > since {
                    bury.execute(params![scope, key, fingerprint, token, expired_at])
                        .map_err(|e| map_error("leave a tombstone", e))?;
                }
            }
            drop(bury);
            let tombstones = tx
                .prepare_cached(
                    "DELETE FROM idem_tombstones WHERE (scope, key) IN \
                     (SELECT scope, key FROM idem_tombstones WHERE expired_at <= ?1 ORDER BY expired_at LIMIT ?2)",
                )
                .and_then(|mut stmt| stmt.execute(params![since, limit]))
                .map_err(|e| map_error("sweep tombstones", e))?;
            records.len() + tombstones
        }
    };
    tx.commit().map_err(|e| map_error("commit the sweep", e))?;
    Ok(deleted as u64)
}
