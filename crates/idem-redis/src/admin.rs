//! What operators change by hand, on Redis: [`AdminStore`]. The audit log is
//! a stream under the store's prefix (`PREFIX{audit}:log`, its ids from the
//! counter `PREFIX{audit}:next`), read newest first.
//!
//! Each change is one script that checks the record (or letter) is still as
//! the operator saw it and changes it. On one node, the same script appends
//! the audit entry, so both happen in one step. On Redis Cluster the entry's
//! keys live in another slot than the record's, which one script cannot
//! reach: the entry is appended by a second script right after the change,
//! and a failure of that second step is reported as such (the change is
//! made, its entry is not).

use std::collections::HashMap;
use std::sync::LazyLock;

use idem_core::{
    AdminStore, AuditAction, AuditEntry, AuditSubject, DeadLetterStore, Error, ErrorKind,
    LetterAction, NewAuditEntry, Record, RecordAction, RecordStore, StoreError, Timestamp,
};
use redis::Script;

use crate::error::map_error;
use crate::names;
use crate::store::RedisStore;

/// The Lua function that appends the audit entry given in ARGV[1..7] (time,
/// actor, action, scope, key, dead letter id, before) to the stream whose
/// counter and stream are the last two KEYS, when ARGV[8] is `1`; answers
/// the entry's id, or 0 when it appended nothing.
const AUDIT: &str = r"
local function audit()
  if ARGV[8] ~= '1' then
    return 0
  end
  local id = redis.call('INCR', KEYS[#KEYS - 1])
  redis.call('XADD', KEYS[#KEYS], '*', 'id', id, 'at', ARGV[1], 'actor', ARGV[2],
    'action', ARGV[3], 'scope', ARGV[4], 'key', ARGV[5], 'dead_letter', ARGV[6], 'before', ARGV[7])
  return id
end
";

/// Appends an audit entry only (the second step on Redis Cluster).
static APPEND: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{AUDIT}return audit()")));

/// Evicts a record or ends its claim, if it is as seen.
///
/// KEYS: the record, then (on one node) the audit counter and stream. ARGV:
/// the audit entry (1-8), then the state, token, lease (empty for none) and
/// last change seen, and `evict` or `release`.
static CHANGE_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{AUDIT}
local f = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease', 'updated')
if not f[1] then
  return {{'missing'}}
end
if f[1] ~= ARGV[9] or f[2] ~= ARGV[10] or (f[3] or '') ~= ARGV[11] or f[4] ~= ARGV[12] then
  return {{'changed'}}
end
if ARGV[13] == 'evict' then
  redis.call('DEL', KEYS[1])
else
  if f[1] ~= 'in_flight' or (f[3] or '') == '' then
    return {{'not_held'}}
  end
  redis.call('HSET', KEYS[1], 'token', string.format('%.0f', tonumber(f[2]) + 1), 'lease', '',
    'updated', ARGV[1])
end
return {{'done', tostring(audit())}}
"
    ))
});

/// Discards or archives a dead letter, if it is as seen.
///
/// KEYS: the letter, the index, then (on one node) the audit counter and
/// stream. ARGV: the audit entry (1-8), then the redrive and archive times
/// seen (empty for none), and `discard` or `archive`.
static CHANGE_LETTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{AUDIT}
local f = redis.call('HMGET', KEYS[1], 'key', 'redriven_at', 'archived_at')
if not f[1] then
  return {{'missing'}}
end
if (f[2] or '') ~= ARGV[9] or (f[3] or '') ~= ARGV[10] then
  return {{'changed'}}
end
if ARGV[11] == 'discard' then
  redis.call('ZREM', KEYS[2], ARGV[6])
  redis.call('DEL', KEYS[1])
else
  if f[3] then
    return {{'archived', f[3]}}
  end
  redis.call('HSET', KEYS[1], 'archived_at', ARGV[1])
end
return {{'done', tostring(audit())}}
"
    ))
});

/// What a change script answered.
enum Answer {
    Done(i64),
    Missing,
    Changed,
    NotHeld,
    Archived(Timestamp),
}

fn answer(reply: &[Vec<u8>]) -> Result<Answer, Error> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let number = |b: &[u8]| {
        text(b).parse::<i64>().map_err(|_| {
            Error::from(StoreError::new(
                ErrorKind::Corrupt,
                format!("an operator's change answered {:?}, not a number", text(b)),
            ))
        })
    };
    match reply {
        [done, id] if done == b"done" => Ok(Answer::Done(number(id)?)),
        [missing] if missing == b"missing" => Ok(Answer::Missing),
        [changed] if changed == b"changed" => Ok(Answer::Changed),
        [held] if held == b"not_held" => Ok(Answer::NotHeld),
        [archived, at] if archived == b"archived" => Ok(Answer::Archived(Timestamp(number(at)?))),
        _ => Err(StoreError::new(
            ErrorKind::Corrupt,
            "an operator's change script answered in an unknown form",
        )
        .into()),
    }
}

fn when(t: Option<Timestamp>) -> String {
    t.map(|t| t.0.to_string()).unwrap_or_default()
}

impl RedisStore {
    /// Runs `invocation` (built with the audit entry's arguments first),
    /// then, on Redis Cluster, appends the entry in its own slot.
    async fn change_and_log(
        &self,
        mut invocation: redis::ScriptInvocation<'static>,
        entry: &NewAuditEntry,
        now: Timestamp,
        subject_key: &str,
        what: &str,
    ) -> Result<(Answer, Option<AuditEntry>), Error> {
        let (counter, log) = (
            names::audit_counter(self.prefix()),
            names::audit_log(self.prefix()),
        );
        let one_step = !self.is_cluster();
        if one_step {
            invocation.key(&counter).key(&log);
        }
        let reply: Vec<Vec<u8>> = invocation
            .invoke_async(&mut self.connection())
            .await
            .map_err(|e| map_error(what, true, e))?;
        let Answer::Done(id) = answer(&reply)? else {
            return Ok((answer(&reply)?, None));
        };
        self.wait_for_replicas(subject_key, || what.to_owned())
            .await?;
        let id = if one_step {
            id
        } else {
            let mut append = APPEND.key(&counter);
            append.key(&log);
            audit_args(&mut append, entry, now, true);
            append
                .invoke_async(&mut self.connection())
                .await
                .map_err(|e| {
                    StoreError::with_source(
                        ErrorKind::Other,
                        format!("{what}: done, but its audit entry could not be written to {log}; write down who did it"),
                        e,
                    )
                })?
        };
        if !one_step {
            self.wait_for_replicas(&log, || what.to_owned()).await?;
        }
        Ok((Answer::Done(id), Some(entry.clone().stored(id, now))))
    }

    async fn change_record(
        &self,
        seen: &Record,
        actor: &str,
        action: AuditAction,
    ) -> Result<RecordAction, Error> {
        let now = self.clock().now();
        let name = names::record(self.prefix(), &seen.scope, &seen.key);
        let entry = NewAuditEntry::for_record(actor, action, seen);
        let mut invocation = CHANGE_RECORD.key(&name);
        audit_args(&mut invocation, &entry, now, !self.is_cluster());
        invocation
            .arg(seen.state.as_str())
            .arg(seen.token.get().to_string())
            .arg(when(seen.lease_until))
            .arg(seen.updated_at.0.to_string())
            .arg(if action == AuditAction::Evict {
                "evict"
            } else {
                "release"
            });
        let what = format!("the {action} of {}/{}", seen.scope, seen.key);
        match self
            .change_and_log(invocation, &entry, now, &name, &what)
            .await?
        {
            (Answer::Done(_), Some(logged)) => Ok(RecordAction::Done(logged)),
            (Answer::Missing, _) => Ok(RecordAction::Missing),
            (Answer::NotHeld, _) => Ok(match self.get(&seen.scope, &seen.key).await? {
                Some(now) => RecordAction::NotHeld(now),
                None => RecordAction::Missing,
            }),
            _ => Ok(match self.get(&seen.scope, &seen.key).await? {
                Some(now) => RecordAction::Changed(now),
                None => RecordAction::Missing,
            }),
        }
    }

    async fn change_letter(
        &self,
        id: i64,
        actor: &str,
        action: AuditAction,
    ) -> Result<LetterAction, Error> {
        // A letter redriven between the read and the change is read again.
        for _ in 0..3 {
            let Some(letter) = self.get_dead_letter(id).await? else {
                return Ok(LetterAction::Missing);
            };
            if let (AuditAction::Archive, Some(at)) = (action, letter.archived_at) {
                return Ok(LetterAction::AlreadyArchived(at));
            }
            let now = self.clock().now();
            let name = names::dead_letter(self.prefix(), id);
            let entry = NewAuditEntry::for_dead_letter(actor, action, &letter);
            let mut invocation = CHANGE_LETTER.key(&name);
            invocation.key(names::dead_letter_index(self.prefix()));
            audit_args(&mut invocation, &entry, now, !self.is_cluster());
            invocation
                .arg(when(letter.redriven_at))
                .arg(when(letter.archived_at))
                .arg(action.as_str());
            let what = format!("the {action} of dead letter {id}");
            match self
                .change_and_log(invocation, &entry, now, &name, &what)
                .await?
            {
                (Answer::Done(_), Some(logged)) => return Ok(LetterAction::Done(logged)),
                (Answer::Missing, _) => return Ok(LetterAction::Missing),
                (Answer::Archived(at), _) => return Ok(LetterAction::AlreadyArchived(at)),
                _ => continue,
            }
        }
        Err(StoreError::new(
            ErrorKind::SerializationFailure,
            format!(
                "dead letter {id} kept changing while it was being changed; run the command again"
            ),
        )
        .into())
    }
}

/// Adds the audit entry's arguments (ARGV 1-8) to `invocation`.
fn audit_args(
    invocation: &mut redis::ScriptInvocation<'static>,
    entry: &NewAuditEntry,
    now: Timestamp,
    append: bool,
) {
    let (scope, key, letter) = entry.subject.columns();
    invocation
        .arg(now.0)
        .arg(&entry.actor)
        .arg(entry.action.as_str())
        .arg(scope.unwrap_or(""))
        .arg(key)
        .arg(letter.map(|id| id.to_string()).unwrap_or_default())
        .arg(&entry.before)
        .arg(if append { "1" } else { "0" });
}

/// One entry of the stream, its fields as `XREVRANGE` gives them.
fn entry(log: &str, fields: &HashMap<String, String>) -> Result<AuditEntry, Error> {
    let corrupt = |what: String| -> Error {
        StoreError::new(
            ErrorKind::Corrupt,
            format!("an entry of the Redis stream {log} is not one Idem wrote ({what})"),
        )
        .into()
    };
    let field = |name: &str| {
        fields
            .get(name)
            .cloned()
            .ok_or_else(|| corrupt(format!("no field {name:?}")))
    };
    let number = |name: &str| {
        field(name)?
            .parse::<i64>()
            .map_err(|_| corrupt(format!("field {name:?} is not a number")))
    };
    let scope = field("scope")?;
    let letter = field("dead_letter")?;
    let letter = if letter.is_empty() {
        None
    } else {
        Some(number("dead_letter")?)
    };
    Ok(AuditEntry {
        id: number("id")?,
        at: Timestamp(number("at")?),
        actor: field("actor")?,
        action: field("action")?
            .parse()
            .map_err(|e| corrupt(format!("{e}")))?,
        subject: AuditSubject::from_columns(
            (!scope.is_empty()).then_some(scope),
            field("key")?,
            letter,
        )
        .map_err(corrupt)?,
        before: field("before")?,
    })
}

impl AdminStore for RedisStore {
    async fn evict(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        self.change_record(seen, actor, AuditAction::Evict).await
    }

    async fn release_claim(&self, seen: &Record, actor: &str) -> Result<RecordAction, Error> {
        if !idem_core::is_held(seen) {
            return Ok(RecordAction::NotHeld(seen.clone()));
        }
        self.change_record(seen, actor, AuditAction::Release).await
    }

    async fn discard_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        self.change_letter(id, actor, AuditAction::Discard).await
    }

    async fn archive_dead_letter(&self, id: i64, actor: &str) -> Result<LetterAction, Error> {
        self.change_letter(id, actor, AuditAction::Archive).await
    }

    async fn audit_log(&self, limit: usize) -> Result<Vec<AuditEntry>, Error> {
        let log = names::audit_log(self.prefix());
        type Entries = Vec<(String, HashMap<String, String>)>;
        let entries: Entries = redis::cmd("XREVRANGE")
            .arg(&log)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(limit.max(1))
            .query_async(&mut self.connection())
            .await
            .map_err(|e| map_error("reading the audit log", false, e))?;
        entries
            .iter()
            .take(limit)
            .map(|(_, fields)| entry(&log, fields))
            .collect()
    }
}
