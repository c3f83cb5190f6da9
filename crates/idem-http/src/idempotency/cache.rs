//! Settled answers kept in memory, so a replay costs no trip to the store.
//!
//! A completed or failed record never changes inside its window, so its
//! answer can be served from any process that has seen it, until the record
//! expires. The cache holds `(scope, key)` → the record's fingerprint, its
//! stored outcome and the end of its window; it is filled when this process
//! stores an answer or replays one from the store. A hit with the same
//! fingerprint is a replay, a hit with another fingerprint (same rule) is
//! key reuse; both are answered without the store. In-flight and released
//! keys are never cached.
//!
//! Bounds: the entries' bytes (bodies, metadata and keys) stay under the
//! configured capacity (`quick_cache`, weighted by size; the least useful
//! entries go first); an entry is served only before its record's expiry by
//! the store's clock, and only for [`ReplayCache::staleness`] after it was
//! cached — the longest another process's eviction of the key (`idem keys
//! rm`) can go unseen here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Fingerprint, IdempotencyKey, Outcome, Scope, Timestamp};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

/// Counter of cache look-ups, by `result` (`hit`, `miss`).
pub const REPLAY_CACHE_LOOKUPS_TOTAL: &str = "http_replay_cache_lookups_total";
/// Gauge: bytes the cached answers take.
pub const REPLAY_CACHE_BYTES: &str = "http_replay_cache_bytes";
/// Gauge: answers in the cache.
pub const REPLAY_CACHE_ENTRIES: &str = "http_replay_cache_entries";

/// The default capacity: 64 MiB of answers.
pub const DEFAULT_REPLAY_CACHE_BYTES: u64 = 64 << 20;
/// The default staleness bound: 5 s.
pub const DEFAULT_REPLAY_CACHE_STALENESS: Duration = Duration::from_secs(5);

/// What the layer keeps in memory of settled answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCache {
    bytes: u64,
    staleness: Duration,
}

impl Default for ReplayCache {
    /// On: 64 MiB, entries served for at most 5 s after they were cached.
    fn default() -> Self {
        Self {
            bytes: DEFAULT_REPLAY_CACHE_BYTES,
            staleness: DEFAULT_REPLAY_CACHE_STALENESS,
        }
    }
}

impl ReplayCache {
    /// No cache: every replay reads the store.
    pub fn off() -> Self {
        Self {
            bytes: 0,
            staleness: Duration::ZERO,
        }
    }

    /// A cache of at most `bytes` of answers.
    pub fn bytes(bytes: u64) -> Self {
        Self {
            bytes,
            ..Self::default()
        }
    }

    /// The longest an entry is served after it was cached: the bound on how
    /// long an eviction made by another process goes unseen here.
    pub fn staleness(mut self, staleness: Duration) -> Self {
        self.staleness = staleness;
        self
    }

    /// The capacity in bytes (0: off).
    pub fn capacity(&self) -> u64 {
        self.bytes
    }

    /// The staleness bound.
    pub fn staleness_bound(&self) -> Duration {
        self.staleness
    }

    pub(crate) fn is_on(&self) -> bool {
        self.bytes > 0 && !self.staleness.is_zero()
    }
}

/// A settled answer as cached.
#[derive(Clone)]
pub(crate) struct Cached {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) outcome: Arc<Outcome>,
    pub(crate) expires_at: Timestamp,
    cached_at: Instant,
}

type CacheKey = (Scope, IdempotencyKey);

/// Entries weigh what they hold: body, metadata, key, plus a fixed overhead.
#[derive(Clone)]
struct BySize;

const ENTRY_OVERHEAD: u64 = 160;

impl Weighter<CacheKey, Cached> for BySize {
    fn weight(&self, key: &CacheKey, cached: &Cached) -> u64 {
        let meta: usize = cached
            .outcome
            .meta
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum();
        (key.0.as_str().len() + key.1.as_str().len() + cached.outcome.body.len() + meta) as u64
            + ENTRY_OVERHEAD
    }
}

/// The cache of one layer.
pub(crate) struct AnswerCache {
    cache: Option<Cache<CacheKey, Cached, BySize>>,
    staleness: Duration,
}

impl AnswerCache {
    pub(crate) fn new(config: ReplayCache) -> Self {
        let cache = config.is_on().then(|| {
            // quick_cache sizes its tables from an estimate of the entries:
            // answers of about 1 KiB.
            let estimated = usize::try_from(config.bytes / 1024)
                .unwrap_or(usize::MAX)
                .max(16);
            Cache::with_weighter(estimated, config.bytes, BySize)
        });
        Self {
            cache,
            staleness: config.staleness,
        }
    }

    /// The answer for `(scope, key)`, if cached, still inside its window at
    /// `now` and not older than the staleness bound.
    pub(crate) fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Option<Cached> {
        let cache = self.cache.as_ref()?;
        let id = (scope.clone(), key.clone());
        let found = cache.get(&id).filter(|cached| {
            now < cached.expires_at && cached.cached_at.elapsed() < self.staleness
        });
        let result = if found.is_some() { "hit" } else { "miss" };
        metrics::counter!(REPLAY_CACHE_LOOKUPS_TOTAL, "result" => result).increment(1);
        if found.is_none() {
            cache.remove(&id);
        }
        found
    }

    /// Keeps the settled answer of `(scope, key)`.
    pub(crate) fn put(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: Fingerprint,
        outcome: Arc<Outcome>,
        expires_at: Timestamp,
    ) {
        let Some(cache) = &self.cache else {
            return;
        };
        cache.insert(
            (scope.clone(), key.clone()),
            Cached {
                fingerprint,
                outcome,
                expires_at,
                cached_at: Instant::now(),
            },
        );
        metrics::gauge!(REPLAY_CACHE_BYTES).set(cache.weight() as f64);
        metrics::gauge!(REPLAY_CACHE_ENTRIES).set(cache.len() as f64);
    }

    /// Bytes the cached answers take.
    #[cfg(test)]
    fn weight(&self) -> u64 {
        self.cache.as_ref().map_or(0, Cache::weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: usize) -> Arc<Outcome> {
        Arc::new(Outcome::success(vec![7u8; body]).with_meta("http.status", "201"))
    }

    #[test]
    fn stays_within_its_byte_cap_under_many_large_answers() {
        let cap = 1 << 20;
        let answers = AnswerCache::new(ReplayCache::bytes(cap));
        let scope = Scope::new("http:anon:POST:/pay").unwrap();
        for i in 0..500 {
            let key = IdempotencyKey::new(format!("k-{i}")).unwrap();
            let fp = Fingerprint::of_bytes(&i.to_string().into_bytes());
            answers.put(&scope, &key, fp, answer(64 * 1024), Timestamp(i64::MAX));
            assert!(answers.weight() <= cap, "{} > {cap}", answers.weight());
        }
        assert!(
            answers.weight() > cap / 2,
            "the cache is used: {}",
            answers.weight()
        );
    }

    #[test]
    fn an_expired_or_stale_entry_is_not_served() {
        let answers =
            AnswerCache::new(ReplayCache::bytes(1 << 20).staleness(Duration::from_millis(50)));
        let scope = Scope::new("s").unwrap();
        let key = IdempotencyKey::new("k").unwrap();
        let fp = Fingerprint::of_bytes(b"x");
        answers.put(&scope, &key, fp, answer(10), Timestamp(1_000));
        assert!(answers.get(&scope, &key, Timestamp(999)).is_some());
        assert!(
            answers.get(&scope, &key, Timestamp(1_000)).is_none(),
            "expired at its window's end"
        );
        answers.put(&scope, &key, fp, answer(10), Timestamp(1_000));
        std::thread::sleep(Duration::from_millis(60));
        assert!(answers.get(&scope, &key, Timestamp(0)).is_none(), "stale");
    }

    #[test]
    fn off_keeps_nothing() {
        let answers = AnswerCache::new(ReplayCache::off());
        let scope = Scope::new("s").unwrap();
        let key = IdempotencyKey::new("k").unwrap();
        answers.put(
            &scope,
            &key,
            Fingerprint::of_bytes(b"x"),
            answer(10),
            Timestamp(i64::MAX),
        );
        assert!(answers.get(&scope, &key, Timestamp(0)).is_none());
    }
}
