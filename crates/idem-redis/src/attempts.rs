//! Failed attempts per message on Redis: [`AttemptStore`], one hash per
//! `(scope, key)` beside the record, counted by one script and expiring with
//! the retention (a message failing for longer than the dedupe window starts
//! counting again, as after a sweep on the other stores).

use std::sync::LazyLock;

use idem_core::{AttemptStore, Error, Failures, IdempotencyKey, Scope, Timestamp};
use redis::Script;

use crate::error::map_error;
use crate::names;
use crate::store::RedisStore;

/// KEYS: the attempts hash. ARGV: now, error text, retention (ms).
static RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
redis.call('HSETNX', KEYS[1], 'first', ARGV[1])
redis.call('HSET', KEYS[1], 'updated', ARGV[1], 'error', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {count, redis.call('HGET', KEYS[1], 'first')}
",
    )
});

/// KEYS: the attempts hash. ARGV: the time before which it is deleted.
static SWEEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local updated = redis.call('HGET', KEYS[1], 'updated')
if updated and tonumber(updated) < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
",
    )
});

impl AttemptStore for RedisStore {
    async fn record_failure(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        error: &str,
    ) -> Result<Failures, Error> {
        let name = names::attempts(self.prefix(), scope, key);
        let now = self.clock().now();
        let retention = i64::try_from(self.settings().retention.as_millis()).unwrap_or(i64::MAX);
        let what = format!("recording a failed attempt of {scope}/{key}");
        let (count, first): (u32, i64) = RECORD
            .key(&name)
            .arg(now.0)
            .arg(error)
            .arg(retention.max(1))
            .invoke_async(&mut self.connection())
            .await
            .map_err(|e| map_error(&what, true, e))?;
        self.wait_for_replicas(&name, || what).await?;
        Ok(Failures {
            count,
            first_at: Timestamp(first),
        })
    }

    async fn forget_failures(&self, scope: &Scope, key: &IdempotencyKey) -> Result<(), Error> {
        let name = names::attempts(self.prefix(), scope, key);
        let _: i64 = redis::cmd("DEL")
            .arg(&name)
            .query_async(&mut self.connection())
            .await
            .map_err(|e| {
                map_error(
                    &format!("forgetting the failures of {scope}/{key}"),
                    true,
                    e,
                )
            })?;
        Ok(())
    }

    async fn sweep_failures(&self, before: Timestamp, limit: usize) -> Result<u64, Error> {
        let names = self
            .connection()
            .scan_hashes(&names::attempts_pattern(self.prefix()))
            .await
            .map_err(|e| map_error("listing failed attempts", false, e))?;
        let mut deleted = 0;
        for name in names {
            if deleted >= limit as u64 {
                break;
            }
            let gone: u64 = SWEEP
                .key(&name)
                .arg(before.0)
                .invoke_async(&mut self.connection())
                .await
                .map_err(|e| map_error(&format!("sweeping {name}"), true, e))?;
            deleted += gone;
        }
        Ok(deleted)
    }

    fn now(&self) -> Timestamp {
        self.clock().now()
    }
}
