//! What operators change by hand, on PostgreSQL: [`AdminStore`]. Each change
//! and its row in `idem_audit` commit in one transaction. A record's change
//! first waits for the key's advisory lock, as a completion does, so it never
//! interleaves with a claim or a completion of the same key; the record is
//! read again under it.

use idem_core::{
    AdminStore, AuditAction, AuditEntry, AuditSubject, Error, LetterAction, NewAuditEntry, Record,
    RecordAction, Timestamp, is_held, unchanged,
};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Postgres, Row, Transaction};

use crate::error::BadRow;
use crate::store::PgStore;
use crate::{dead_letters, lock, records};

const INSERT: &str =
    "INSERT INTO idem_audit (at, actor, action, scope, key, dead_letter_id, before)
    VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id";
const LIST: &str = "SELECT id, at, actor, action, scope, key, dead_letter_id, before
    FROM idem_audit ORDER BY id DESC LIMIT $1";

/// Writes `entry` at `now` inside the caller's transaction.
async fn log(
    conn: &mut PgConnection,
    entry: NewAuditEntry,
    now: Timestamp,
) -> sqlx::Result<AuditEntry> {
    let (scope, key, letter) = entry.subject.columns();
    let id: i64 = sqlx::query_scalar(INSERT)
        .bind(now.0)
        .bind(&entry.actor)
        .bind(entry.action.as_str())
        .bind(scope)
        .bind(key)
        .bind(letter)
        .bind(&entry.before)
        .fetch_one(conn)
        .await?;
    Ok(entry.stored(id, now))
}

fn entry(row: &PgRow) -> sqlx::Result<AuditEntry> {
    let id: i64 = row.try_get(0)?;
    let bad = |why: String| BadRow::into_sqlx(format!("audit entry {id} {why}"));
    Ok(AuditEntry {
        id,
        at: Timestamp(row.try_get(1)?),
        actor: row.try_get(2)?,
        action: row
            .try_get::<&str, _>(3)?
            .parse()
            .map_err(|e| bad(format!("{e}")))?,
        subject: AuditSubject::from_columns(row.try_get(4)?, row.try_get(5)?, row.try_get(6)?)
            .map_err(bad)?,
        before: row.try_get(7)?,
    })
}

/// The change an operator makes to a record.
#[derive(Clone, Copy)]
enum Change {
    Evict,
    EndClaim,
}

impl PgStore {
    /// Locks the key of `seen`, reads its record again, and makes `change` if
    /// it is still as seen, with its audit row, in one transaction.
    async fn change_record(
        &self,
        seen: &Record,
        actor: &str,
        change: Change,
    ) -> Result<RecordAction, Error> {
        let mut tx = self.begin().await?;
        match self.change_record_in(&mut tx, seen, actor, change).await {
            Ok(RecordAction::Done(logged)) => {
                self.commit(tx).await?;
                Ok(RecordAction::Done(logged))
            }
            Ok(other) => {
                self.roll_back(tx).await;
                Ok(other)
            }
            Err(error) => {
                self.roll_back(tx).await;
                Err(self.fail(error))
            }
        }
    }

    async fn change_record_in(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        seen: &Record,
        actor: &str,
        change: Change,
    ) -> sqlx::Result<RecordAction> {
        lock::lock(tx, lock::lock_key(&seen.scope, &seen.key)).await?;
        let now = self.clock().now();
        let Some(found) = records::fetch(&mut **tx, &seen.scope, &seen.key).await? else {
            return Ok(RecordAction::Missing);
        };
        if !unchanged(seen, &found) {
            return Ok(RecordAction::Changed(found));
        }
        let action = match change {
            Change::Evict => {
                records::delete(tx, &found.scope, &found.key).await?;
                AuditAction::Evict
            }
            Change::EndClaim => {
                if !is_held(&found) {
                    return Ok(RecordAction::NotHeld(found));
                }
                records::end_claim(tx, &found, now).await?;
                AuditAction::Release
            }
        };
        let logged = log(tx, NewAuditEntry::for_record(actor, action, &found), now).await?;
        Ok(RecordAction::Done(logged))
    }

    /// Locks dead letter `id`, and deletes or archives it with its audit row,
    /// in one transaction.
    async fn change_letter(
        &self,
        id: i64,
        actor: &str,
        action: AuditAction,
    ) -> Result<LetterAction, Error> {
        let mut tx = self.begin().await?;
        match self.change_letter_in(&mut tx, id, actor, action).await {
            Ok(LetterAction::Done(logged)) => {
                self.commit(tx).await?;
                Ok(LetterAction::Done(logged))
            }
            Ok(other) => {
                self.roll_back(tx).await;
                Ok(other)
            }
            Err(error) => {
                self.roll_back(tx).await;
                Err(self.fail(error))
            }
        }
    }

    async fn change_letter_in(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        id: i64,
        actor: &str,
        action: AuditAction,
    ) -> sqlx::Result<LetterAction> {
        let now = self.clock().now();
        let Some(row) = sqlx::query(dead_letters::GET_FOR_UPDATE)
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
        else {
            return Ok(LetterAction::Missing);
        };
        let letter = dead_letters::letter(&row)?;
        if action == AuditAction::Archive {
            if let Some(at) = letter.archived_at {
                return Ok(LetterAction::AlreadyArchived(at));
            }
            sqlx::query("UPDATE idem_dead_letters SET archived_at = $2 WHERE id = $1")
                .bind(id)
                .bind(now.0)
                .execute(&mut **tx)
                .await?;
        } else {
            sqlx::query("DELETE FROM idem_dead_letters WHERE id = $1")
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
        let logged = log(
            tx,
            NewAuditEntry::for_dead_letter(actor, action, &letter),
            now,
        )
        .await?;
        Ok(LetterAction::Done(logged))
    }
}

impl AdminStore for PgStore {
    async fn evict(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        self.change_record(seen, actor, Change::Evict).await
    }

    async fn release_claim(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        self.change_record(seen, actor, Change::EndClaim).await
    }

    async fn discard_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        self.change_letter(id, actor, AuditAction::Discard).await
    }

    async fn archive_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        self.change_letter(id, actor, AuditAction::Archive).await
    }

    async fn audit_log(&self, limit: usize) -> Result<Vec<AuditEntry>, Error> {
        crate::pooler::one_shot!(self, |conn| sqlx::query(LIST)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(conn)
            .await
            .and_then(|rows| rows.iter().map(entry).collect())
            .map_err(|e| self.fail(e)))
    }
}
