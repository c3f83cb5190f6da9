//! What operators change by hand, on SQLite: [`AdminStore`]. Each change and
//! its row in `idem_audit` commit in one `BEGIN IMMEDIATE` transaction on
//! the writer, after the record or letter is read again inside it.

use idem_core::{
    AdminStore, AuditAction, AuditEntry, AuditSubject, Error, LetterAction, NewAuditEntry, Record,
    RecordAction, Timestamp, is_held, unchanged,
};
use rusqlite::{Connection, Row, params};

use crate::error::{corrupt, map_error};
use crate::store::SqliteStore;
use crate::write_tx::WriteTx;
use crate::{dead_letters, records};

const INSERT: &str =
    "INSERT INTO idem_audit (at, actor, action, scope, key, dead_letter_id, before)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id";
const LIST: &str = "SELECT id, at, actor, action, scope, key, dead_letter_id, before
    FROM idem_audit ORDER BY id DESC LIMIT ?1";

/// Writes `entry` at `now` inside the caller's transaction.
fn log(conn: &Connection, entry: NewAuditEntry, now: Timestamp) -> Result<AuditEntry, Error> {
    let (scope, key, letter) = entry.subject.columns();
    let id: i64 = conn
        .prepare_cached(INSERT)
        .and_then(|mut statement| {
            statement.query_row(
                params![
                    now.0,
                    entry.actor,
                    entry.action.as_str(),
                    scope,
                    key,
                    letter,
                    entry.before
                ],
                |row| row.get(0),
            )
        })
        .map_err(|e| map_error("write the audit log", e))?;
    Ok(entry.stored(id, now))
}

fn entry(row: &Row<'_>) -> rusqlite::Result<Result<AuditEntry, Error>> {
    let id: i64 = row.get(0)?;
    let action: String = row.get(3)?;
    let subject = AuditSubject::from_columns(row.get(4)?, row.get(5)?, row.get(6)?);
    Ok((|| {
        let bad = |why: String| corrupt(format!("audit entry {id} {why}"));
        Ok(AuditEntry {
            id,
            at: Timestamp(row.get(1).map_err(|e| map_error("read the audit log", e))?),
            actor: row.get(2).map_err(|e| map_error("read the audit log", e))?,
            action: action.parse().map_err(|e| bad(format!("{e}")))?,
            subject: subject.map_err(bad)?,
            before: row.get(7).map_err(|e| map_error("read the audit log", e))?,
        })
    })())
}

/// Reads the record of `seen` again in `tx` and checks it is still as seen
/// (and, for `held`, a claim with a lease): `Ok(record)` to go on, `Err`
/// with the answer otherwise.
fn recheck(
    tx: &Connection,
    seen: &Record,
    held: bool,
) -> Result<Result<Record, RecordAction>, Error> {
    let Some(found) = records::select(tx, seen.scope.as_str(), seen.key.as_str())? else {
        return Ok(Err(RecordAction::Missing));
    };
    if !unchanged(seen, &found) {
        return Ok(Err(RecordAction::Changed(found)));
    }
    if held && !is_held(&found) {
        return Ok(Err(RecordAction::NotHeld(found)));
    }
    Ok(Ok(found))
}

impl AdminStore for SqliteStore {
    async fn evict(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        let (seen, actor, store) = (seen.clone(), actor.to_owned(), self.clone());
        self.connections()
            .write(move |conn| {
                let now = store.clock().now();
                let tx = WriteTx::begin(conn)?;
                let found = match recheck(&tx, &seen, false)? {
                    Ok(found) => found,
                    Err(answer) => return Ok(answer),
                };
                records::delete(&tx, found.scope.as_str(), found.key.as_str())?;
                let logged = log(
                    &tx,
                    NewAuditEntry::for_record(&actor, AuditAction::Evict, &found),
                    now,
                )?;
                tx.commit()?;
                Ok(RecordAction::Done(logged))
            })
            .await?
    }

    async fn release_claim(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        let (seen, actor, store) = (seen.clone(), actor.to_owned(), self.clone());
        self.connections()
            .write(move |conn| {
                let now = store.clock().now();
                let tx = WriteTx::begin(conn)?;
                let found = match recheck(&tx, &seen, true)? {
                    Ok(found) => found,
                    Err(answer) => return Ok(answer),
                };
                records::end_claim(
                    &tx,
                    found.scope.as_str(),
                    found.key.as_str(),
                    found.token,
                    now,
                )?;
                let logged = log(
                    &tx,
                    NewAuditEntry::for_record(&actor, AuditAction::Release, &found),
                    now,
                )?;
                tx.commit()?;
                Ok(RecordAction::Done(logged))
            })
            .await?
    }

    async fn discard_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        let (actor, store) = (actor.to_owned(), self.clone());
        self.connections()
            .write(move |conn| {
                let now = store.clock().now();
                let tx = WriteTx::begin(conn)?;
                let Some(letter) = dead_letters::select(&tx, id)? else {
                    return Ok(LetterAction::Missing);
                };
                tx.execute("DELETE FROM idem_dead_letters WHERE id = ?1", [id])
                    .map_err(|e| map_error("discard a dead letter", e))?;
                let logged = log(
                    &tx,
                    NewAuditEntry::for_dead_letter(&actor, AuditAction::Discard, &letter),
                    now,
                )?;
                tx.commit()?;
                Ok(LetterAction::Done(logged))
            })
            .await?
    }

    async fn archive_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        let (actor, store) = (actor.to_owned(), self.clone());
        self.connections()
            .write(move |conn| {
                let now = store.clock().now();
                let tx = WriteTx::begin(conn)?;
                let Some(letter) = dead_letters::select(&tx, id)? else {
                    return Ok(LetterAction::Missing);
                };
                if let Some(at) = letter.archived_at {
                    return Ok(LetterAction::AlreadyArchived(at));
                }
                tx.execute(
                    "UPDATE idem_dead_letters SET archived_at = ?2 WHERE id = ?1",
                    params![id, now.0],
                )
                .map_err(|e| map_error("archive a dead letter", e))?;
                let logged = log(
                    &tx,
                    NewAuditEntry::for_dead_letter(&actor, AuditAction::Archive, &letter),
                    now,
                )?;
                tx.commit()?;
                Ok(LetterAction::Done(logged))
            })
            .await?
    }

    async fn audit_log(&self, limit: usize) -> Result<Vec<AuditEntry>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.connections()
            .read(move |conn| {
                let mut statement = conn
                    .prepare_cached(LIST)
                    .map_err(|e| map_error("read the audit log", e))?;
                let rows = statement
                    .query_map([limit], entry)
                    .map_err(|e| map_error("read the audit log", e))?;
                rows.map(|row| row.map_err(|e| map_error("read the audit log", e))?)
                    .collect()
            })
            .await
    }
}
