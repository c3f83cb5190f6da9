//! What the broker cluster tests (`nats_cluster`, `rabbitmq_cluster`)
//! share: a client's quick reconnect, an outbox on SQLite with a relay
//! sending it under load, and the count of each key's copies that says
//! whether every message arrived once, or had its effect applied once.
//!
//! The clusters themselves are in `idem_testkit`; what differs per broker
//! (how a message is published, where its copies are counted) stays in the
//! test file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idem::{AnyStore, DeadLetterStore, IdempotencyKey, SqliteStore};
use idem_broker::consume::{Reconnect, StatsSnapshot};
use idem_broker::outbox::{self, OutboxStore, Route};
use idem_broker::publish::{Destination, Message};
use idem_broker::relay::{Relay, RelayConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::consumer_support::{Bank, OPENING_BALANCE};

/// A quick reconnect, as `idem forward` would be configured in a test.
pub(crate) fn quick() -> Reconnect {
    Reconnect::default()
        .min(Duration::from_millis(50))
        .max(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(10))
}

/// How many copies of each key were seen, against the keys expected.
#[derive(Debug)]
pub(crate) struct Tally {
    /// Keys seen, each once however many copies.
    pub(crate) keys: usize,
    /// Expected keys never seen.
    pub(crate) missing: Vec<String>,
    /// Keys seen more than once, with their copies.
    pub(crate) twice: Vec<(String, usize)>,
}

impl Tally {
    /// Counts `seen` (one entry per copy) against `expected`.
    pub(crate) fn of(
        seen: impl IntoIterator<Item = String>,
        expected: impl Iterator<Item = String>,
    ) -> Tally {
        let mut copies: BTreeMap<String, usize> = BTreeMap::new();
        for key in seen {
            *copies.entry(key).or_default() += 1;
        }
        Tally {
            keys: copies.len(),
            missing: expected.filter(|key| !copies.contains_key(key)).collect(),
            twice: copies.into_iter().filter(|(_, n)| *n > 1).collect(),
        }
    }
}

/// `prefix-0` … `prefix-{count-1}`: the keys a test publishes.
pub(crate) fn keys(
    prefix: &'static str,
    count: usize,
) -> impl Iterator<Item = String> + Send + 'static {
    (0..count).map(move |i| format!("{prefix}-{i}"))
}

/// Checks that each of the `count` keys `prefix-…` had its effect applied
/// once in `bank`, and that the consumer's counters agree; `sent` names
/// what made a key due ("confirmed", "acknowledged").
pub(crate) async fn assert_each_applied_once<K: Bank>(
    bank: &K,
    stats: &StatsSnapshot,
    prefix: &'static str,
    count: usize,
    sent: &str,
) {
    let Tally {
        keys: applied,
        missing,
        twice,
    } = Tally::of(bank.ledger().await, keys(prefix, count));
    assert!(missing.is_empty(), "{sent} but never applied: {missing:?}");
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(applied, count, "no effect for a key never sent");
    assert_eq!(bank.balance().await, OPENING_BALANCE - count as i64);
    assert_eq!(stats.applied, count as u64, "{stats:?}");
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
}

/// An outbox on SQLite of the test's own and a relay sending it; stopped by
/// [`stop`](Self::stop).
pub(crate) struct OutboxRelay {
    /// The outbox's store.
    pub(crate) store: AnyStore,
    // Removed (with the database) when the value is dropped.
    dir: tempfile::TempDir,
    stop: oneshot::Sender<()>,
    relaying: JoinHandle<Result<(), idem::Error>>,
}

impl OutboxRelay {
    /// Makes the outbox and starts a relay on it: quick polls and
    /// reconnects, a publish given `publish_timeout`, up to 100 attempts a
    /// row.
    pub(crate) async fn start(publish_timeout: Duration) -> OutboxRelay {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = AnyStore::Sqlite(
            SqliteStore::open(dir.path().join("outbox.db"))
                .await
                .expect("open the outbox"),
        );
        outbox::migrate(&store).await.expect("migrate the outbox");
        let config = RelayConfig {
            poll_interval: Duration::from_millis(20),
            lease: Duration::from_secs(10),
            publish_timeout,
            max_attempts: 100,
            backoff: idem_retry::Backoff::default()
                .with_base(Duration::from_millis(20))
                .with_cap(Duration::from_millis(200)),
            reconnect: quick(),
            ..RelayConfig::default()
        };
        let relay = Relay::new(store.clone(), config);
        let (stop, stopped) = oneshot::channel::<()>();
        let relaying = tokio::spawn(async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        });
        OutboxRelay {
            store,
            dir,
            stop,
            relaying,
        }
    }

    /// Enqueues a row to `to` per key of `keys`, one every `pace`, with
    /// the payload `payload` makes of its key.
    pub(crate) fn enqueue_all(
        &self,
        to: &Destination,
        keys: impl Iterator<Item = String> + Send + 'static,
        pace: Duration,
        payload: fn(&str) -> Vec<u8>,
    ) -> JoinHandle<()> {
        let (store, to) = (self.store.clone(), to.clone());
        tokio::spawn(async move {
            let mut pace = tokio::time::interval(pace);
            for key in keys {
                pace.tick().await;
                let message = Message::new(IdempotencyKey::new(&key).unwrap(), payload(&key));
                outbox::enqueue_now(&store, Route::To(&to), &message)
                    .await
                    .expect("enqueue");
            }
        })
    }

    /// Waits (at most a minute) until the outbox has `count` rows sent and
    /// none pending.
    pub(crate) async fn until_sent(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let stats = self.store.outbox_stats().await.expect("outbox stats");
            if stats.pending == 0 && stats.sent == count as u64 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the relay did not send every row within a minute: {stats:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the relay, checks that it stopped cleanly and dead-lettered no
    /// row, and gives back the store to read what it sent.
    pub(crate) async fn stop(self) -> (AnyStore, tempfile::TempDir) {
        let _ = self.stop.send(());
        self.relaying
            .await
            .expect("the relay task")
            .expect("the relay stopped cleanly");
        let dead = self
            .store
            .dead_letter_stats()
            .await
            .expect("dead-letter stats");
        assert_eq!(dead.waiting, 0, "no row dead-lettered: {dead:?}");
        (self.store, self.dir)
    }
}
