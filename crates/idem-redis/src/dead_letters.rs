//! Dead letters on Redis: [`DeadLetterStore`]. Each letter is a hash, its id
//! taken from a counter, and a sorted set indexes the ids; all three share
//! the hash tag `{dlq}`, so recording a letter is one script on one slot.
//! Dead letters are few (a message given up on) and are listed whole.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use idem_core::{
    DeadLetter, DeadLetterStats, DeadLetterStore, Error, ErrorKind, IdempotencyKey, NewDeadLetter,
    StoreError, Timestamp, no_such_dead_letter,
};
use redis::Script;

use crate::error::map_error;
use crate::names;
use crate::store::RedisStore;

/// KEYS: the counter, the index. ARGV: the letter's hash prefix, then the
/// letter's fields and values.
static RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local id = redis.call('INCR', KEYS[1])
local letter = ARGV[1] .. id
redis.call('HSET', letter, unpack(ARGV, 2))
redis.call('ZADD', KEYS[2], id, id)
return id
",
    )
});

/// KEYS: the letter. ARGV: now. Answers 0 for no such letter.
static MARK_REDRIVEN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'redriven_at', ARGV[1])
return 1
",
    )
});

/// KEYS: the letter, the index. ARGV: the id.
static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
",
    )
});

impl DeadLetterStore for RedisStore {
    async fn record_dead_letter(&self, letter: &NewDeadLetter) -> Result<i64, Error> {
        let now = self.clock().now();
        let prefix = self.prefix();
        let headers = serde_json::to_string(&letter.headers).expect("a string map serializes");
        let counter = names::dead_letter_counter(prefix);
        let mut invocation = RECORD.key(&counter);
        invocation
            .key(names::dead_letter_index(prefix))
            .arg(names::dead_letter_prefix(prefix))
            .arg("origin")
            .arg(&letter.origin)
            .arg("destination")
            .arg(&letter.destination)
            .arg("key")
            .arg(letter.key.as_str())
            .arg("payload")
            .arg(letter.payload.as_slice())
            .arg("headers")
            .arg(headers)
            .arg("attempts")
            .arg(letter.attempts)
            .arg("last_error")
            .arg(&letter.last_error)
            .arg("first_seen_at")
            .arg(letter.first_seen_at.0)
            .arg("dead_at")
            .arg(now.0);
        let what = format!("recording a dead letter for key {}", letter.key);
        let id: i64 = invocation
            .invoke_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&what, true, e))?;
        self.wait_for_replicas(&counter, || what).await?;
        Ok(id)
    }

    async fn list_dead_letters(
        &self,
        limit: usize,
        include_redriven: bool,
    ) -> Result<Vec<DeadLetter>, Error> {
        let mut letters = Vec::new();
        for letter in self.all_dead_letters().await? {
            if letters.len() >= limit {
                break;
            }
            if include_redriven || letter.is_waiting() {
                letters.push(letter);
            }
        }
        Ok(letters)
    }

    async fn get_dead_letter(&self, id: i64) -> Result<Option<DeadLetter>, Error> {
        let name = names::dead_letter(self.prefix(), id);
        let fields: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
            .arg(&name)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&format!("reading dead letter {id}"), false, e))?;
        if fields.is_empty() {
            return Ok(None);
        }
        letter(&name, id, &fields).map(Some)
    }

    async fn mark_redriven(&self, id: i64) -> Result<(), Error> {
        let name = names::dead_letter(self.prefix(), id);
        let what = format!("marking dead letter {id} redriven");
        let marked: i64 = MARK_REDRIVEN
            .key(&name)
            .arg(self.clock().now().0)
            .invoke_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&what, true, e))?;
        if marked == 0 {
            return Err(no_such_dead_letter(id));
        }
        self.wait_for_replicas(&name, || what).await
    }

    async fn dead_letter_stats(&self) -> Result<DeadLetterStats, Error> {
        let mut stats = DeadLetterStats::default();
        for letter in self.all_dead_letters().await? {
            if letter.archived_at.is_some() {
                stats.archived += 1;
            } else if letter.redriven_at.is_some() {
                stats.redriven += 1;
            } else {
                stats.waiting += 1;
                stats.oldest_waiting = Some(
                    stats
                        .oldest_waiting
                        .map_or(letter.dead_at, |t| t.min(letter.dead_at)),
                );
            }
        }
        Ok(stats)
    }

    async fn sweep_dead_letters(&self, retention: Duration, limit: usize) -> Result<u64, Error> {
        let before = self.clock().now().minus(retention);
        let index = names::dead_letter_index(self.prefix());
        let mut deleted = 0;
        for letter in self.all_dead_letters().await? {
            if deleted >= limit as u64 {
                break;
            }
            if letter.dead_at >= before {
                continue;
            }
            let name = names::dead_letter(self.prefix(), letter.id);
            let gone: u64 = DELETE
                .key(&name)
                .key(&index)
                .arg(letter.id)
                .invoke_async(&mut self.connection())
                .await
                .map_err(|e| map_error(&format!("sweeping dead letter {}", letter.id), true, e))?;
            deleted += gone;
        }
        Ok(deleted)
    }
}

impl RedisStore {
    /// Every dead letter, by id.
    async fn all_dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let ids: Vec<i64> = redis::cmd("ZRANGE")
            .arg(names::dead_letter_index(self.prefix()))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| map_error("listing the dead letters", false, e))?;
        let mut letters = Vec::with_capacity(ids.len());
        for id in ids {
            letters.extend(self.get_dead_letter(id).await?);
        }
        Ok(letters)
    }
}

/// The dead letter in the hash `name`.
fn letter(name: &str, id: i64, fields: &HashMap<String, Vec<u8>>) -> Result<DeadLetter, Error> {
    let corrupt = |what: &str| -> Error {
        StoreError::new(
            ErrorKind::Corrupt,
            format!(
                "the Redis hash {name} is not a dead letter Idem wrote ({what}); delete it, or give the store a key prefix no other program writes under"
            ),
        )
        .into()
    };
    let text = |field: &str| -> Result<String, Error> {
        fields
            .get(field)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .ok_or_else(|| corrupt(&format!("no field {field:?}")))
    };
    let number = |field: &str| -> Result<i64, Error> {
        text(field)?
            .parse()
            .map_err(|_| corrupt(&format!("field {field:?} is not a number")))
    };
    Ok(DeadLetter {
        id,
        origin: text("origin")?,
        destination: text("destination")?,
        key: IdempotencyKey::new(text("key")?).map_err(|e| corrupt(&e.to_string()))?,
        payload: fields.get("payload").cloned().unwrap_or_default(),
        headers: serde_json::from_str(&text("headers")?)
            .map_err(|e| corrupt(&format!("headers are not a JSON string map: {e}")))?,
        attempts: u32::try_from(number("attempts")?).unwrap_or(u32::MAX),
        last_error: text("last_error")?,
        first_seen_at: Timestamp(number("first_seen_at")?),
        dead_at: Timestamp(number("dead_at")?),
        redriven_at: match fields.get("redriven_at") {
            Some(_) => Some(Timestamp(number("redriven_at")?)),
            None => None,
        },
        archived_at: match fields.get("archived_at") {
            Some(_) => Some(Timestamp(number("archived_at")?)),
            None => None,
        },
    })
}
