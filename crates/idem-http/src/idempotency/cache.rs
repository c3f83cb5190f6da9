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
//! Bounds: the memory the entries hold (bodies, metadata, keys, each heap
//! block with the allocator's overhead, and the cache's slots) stays under
//! the configured capacity (`quick_cache`, weighted by that memory; the
//! least useful entries go first); an entry is served only before its
//! record's expiry by the store's clock, and only for
//! [`ReplayCache::staleness`] after it was cached — the longest another
//! process's eviction of the key (`idem keys rm`) can go unseen here.
//! Entries past that bound are swept out every half bound, so a cache under
//! a steady stream of new keys holds about a bound's worth of answers, not
//! its capacity.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{Fingerprint, IdempotencyKey, Outcome, Scope, Timestamp};
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

/// A look-up key borrowing the request's scope and key: hashed and compared
/// as the owned [`CacheKey`], so a look-up allocates nothing.
#[derive(Hash)]
struct Borrowed<'a>(&'a Scope, &'a IdempotencyKey);

impl quick_cache::Equivalent<CacheKey> for Borrowed<'_> {
    fn equivalent(&self, key: &CacheKey) -> bool {
        *self.0 == key.0 && *self.1 == key.1
    }
}

/// Entries weigh the memory they hold: each heap block as the allocator
/// hands it out (its header and rounding included), the `Arc`'d outcome, the
/// metadata map's nodes, and the cache's own slot.
#[derive(Clone)]
struct ByMemory;

/// A heap block of `bytes` as the allocator hands it out: an 8-byte header,
/// rounded up to 16, at least 32 (glibc's malloc; others are close).
fn heap_block(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        ((bytes + 8).div_ceil(16) * 16).max(32)
    }
}

/// What the cache keeps per entry besides the heap blocks: the slot holding
/// key and value, and the table's bookkeeping around it.
const SLOT: usize = std::mem::size_of::<(CacheKey, Cached)>() + 32;

/// A `BTreeMap<String, String>` node holds up to 11 entries.
const META_NODE: usize = 11 * 2 * std::mem::size_of::<String>() + 16;

/// The memory one cached answer holds.
fn entry_memory(key: &CacheKey, cached: &Cached) -> usize {
    let outcome = &cached.outcome;
    let meta_strings: usize = outcome
        .meta
        .iter()
        .map(|(name, value)| heap_block(name.capacity()) + heap_block(value.capacity()))
        .sum();
    // Nodes are at least half full; a map this small is one node.
    let meta_nodes = match outcome.meta.len() {
        0 => 0,
        n if n <= 11 => 1,
        n => n.div_ceil(6),
    };
    SLOT + heap_block(key.0.as_str().len())
        + heap_block(key.1.as_str().len())
        + heap_block(std::mem::size_of::<Outcome>() + 16)
        + heap_block(outcome.body.capacity())
        + heap_block(META_NODE) * meta_nodes
        + meta_strings
}

impl Weighter<CacheKey, Cached> for ByMemory {
    fn weight(&self, key: &CacheKey, cached: &Cached) -> u64 {
        entry_memory(key, cached) as u64
    }
}

/// The cache of one layer.
pub(crate) struct AnswerCache {
    cache: Option<Cache<CacheKey, Cached, ByMemory>>,
    staleness: Duration,
    /// When the cache was made; sweeps are timed from it.
    born: Instant,
    /// Milliseconds after `born` when the next sweep of entries past the
    /// staleness bound is due.
    next_sweep: AtomicU64,
}

impl AnswerCache {
    pub(crate) fn new(config: ReplayCache) -> Self {
        let cache = config.is_on().then(|| {
            // quick_cache sizes its tables from an estimate of the entries:
            // answers of about 1 KiB.
            let estimated = usize::try_from(config.bytes / 1024)
                .unwrap_or(usize::MAX)
                .max(16);
            Cache::with_weighter(estimated, config.bytes, ByMemory)
        });
        Self {
            cache,
            staleness: config.staleness,
            born: Instant::now(),
            next_sweep: AtomicU64::new(0),
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
        let id = Borrowed(scope, key);
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
        self.sweep_when_due(cache);
        metrics::gauge!(REPLAY_CACHE_BYTES).set(cache.weight() as f64);
        metrics::gauge!(REPLAY_CACHE_ENTRIES).set(cache.len() as f64);
    }

    /// Every half staleness bound, drops the entries past it: they would
    /// never be served again, and would otherwise stay until pushed out by
    /// weight.
    fn sweep_when_due(&self, cache: &Cache<CacheKey, Cached, ByMemory>) {
        let now = millis(self.born.elapsed());
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        let next = now + millis(self.staleness / 2).max(1);
        if self
            .next_sweep
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another request sweeps
        }
        let staleness = self.staleness;
        cache.retain(|_, cached| cached.cached_at.elapsed() < staleness);
    }

    /// Answers in the cache.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.cache.as_ref().map_or(0, Cache::len)
    }

    /// Bytes the cached answers take.
    #[cfg(test)]
    fn weight(&self) -> u64 {
        self.cache.as_ref().map_or(0, Cache::weight)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: usize) -> Arc<Outcome> {
        Arc::new(Outcome::success(vec![7u8; body]).with_meta("http.status", "201"))
    }

    /// Puts a small answer whose record never expires.
    fn put_small(answers: &AnswerCache, scope: &Scope, key: &IdempotencyKey) {
        answers.put(
            scope,
            key,
            Fingerprint::of_bytes(b"x"),
            answer(10),
            Timestamp(i64::MAX),
        );
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
            AnswerCache::new(ReplayCache::bytes(1 << 20).staleness(Duration::from_secs(2)));
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
        std::thread::sleep(Duration::from_millis(2100));
        assert!(answers.get(&scope, &key, Timestamp(0)).is_none(), "stale");
    }

    #[test]
    fn a_small_answer_weighs_its_heap_blocks_not_just_its_bytes() {
        let key = (
            Scope::new("http:anon:POST:/pay").unwrap(),
            IdempotencyKey::new("k-1").unwrap(),
        );
        let outcome = Outcome::success(vec![7u8; 40])
            .with_meta("http.status", "201")
            .with_meta("http.header.content-type", "application/json");
        let bytes = key.0.as_str().len() + key.1.as_str().len() + 40 + 11 + 3 + 24 + 16;
        let cached = Cached {
            fingerprint: Fingerprint::of_bytes(b"x"),
            outcome: Arc::new(outcome),
            expires_at: Timestamp(i64::MAX),
            cached_at: Instant::now(),
        };
        let weight = entry_memory(&key, &cached);
        // A map node, the Arc'd outcome, seven blocks with headers, the slot.
        assert!(weight > 4 * bytes, "{weight} vs {bytes} bytes of content");
        assert!(weight < 2048, "{weight}");
    }

    #[test]
    fn entries_past_the_staleness_bound_are_swept_out() {
        let answers =
            AnswerCache::new(ReplayCache::bytes(1 << 20).staleness(Duration::from_secs(1)));
        let scope = Scope::new("s").unwrap();
        for i in 0..100 {
            let key = IdempotencyKey::new(format!("old-{i}")).unwrap();
            put_small(&answers, &scope, &key);
        }
        assert_eq!(answers.len(), 100);
        std::thread::sleep(Duration::from_millis(1200));
        let key = IdempotencyKey::new("new").unwrap();
        put_small(&answers, &scope, &key);
        assert_eq!(answers.len(), 1, "only the fresh answer is left");
        assert!(answers.get(&scope, &key, Timestamp(0)).is_some());
    }

    #[test]
    fn off_keeps_nothing() {
        let answers = AnswerCache::new(ReplayCache::off());
        let scope = Scope::new("s").unwrap();
        let key = IdempotencyKey::new("k").unwrap();
        put_small(&answers, &scope, &key);
        assert!(answers.get(&scope, &key, Timestamp(0)).is_none());
    }
}
