//! The consumer scenarios, generic over the broker and the store. Effects are
//! counted in the bank's ledger, never in logs.

use std::process::Command;
use std::time::Duration;

use idem::crash;
use idem_broker::consume::{Apply, ConsumeError, Consumer, MissingKey, Settle, Transport};
use idem_broker::dead_letter::{self, DeadLetterStore};
use idem_broker::relay::RelayConfig;
use idem_testkit::crash::run_until_crash;

use super::{Bank, Broker, OPENING_BALANCE, Running, config};

const ORDER_10: &[u8] = br#"{"amount": 10}"#;
const ORDER_5: &[u8] = br#"{"amount": 5}"#;
const POISON: &[u8] = br#"{"amount": 7, "poison": true}"#;

async fn start<B: Broker, K: Bank>() -> Option<(B, K)> {
    let broker = B::start().await?;
    let bank = K::start().await?;
    eprintln!("scenario on {} with {}", B::NAME, K::NAME);
    Some((broker, bank))
}

/// The same message published twice, one delivery given back to the broker
/// (nack/requeue), and a late copy after the first was acked: one effect.
pub(crate) async fn duplicates_and_redeliveries<B: Broker, K: Bank>() {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    broker.publish(Some("order-1"), ORDER_10).await;
    broker.publish(Some("order-1"), ORDER_10).await;
    broker.publish(Some("order-2"), ORDER_5).await;
    {
        let mut peek = broker.transport().await;
        let delivery = peek.receive().await.expect("receive").expect("a delivery");
        delivery
            .settle
            .requeue(Duration::ZERO)
            .await
            .expect("nack with requeue");
        peek.close().await;
    }

    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("three deliveries acked", |s| s.acked() >= 3)
        .await;
    broker.publish(Some("order-1"), ORDER_10).await;
    running
        .until("the late copy acked", |s| s.acked() >= 4)
        .await;
    let stats = running.stop().await;

    assert_eq!(bank.ledger().await, ["order-1", "order-2"]);
    assert_eq!(bank.balance().await, OPENING_BALANCE - 15);
    assert_eq!((stats.applied, stats.replayed), (2, 2), "{stats:?}");
    assert_eq!(stats.dead_lettered, 0);
}

/// A dedupe window shorter than the producer's retry horizon stops the
/// consumer at start-up, before it applies anything; a horizon inside the
/// window (a relay's, with the defaults) lets the next one run.
pub(crate) async fn window_shorter_than_the_producer_horizon<B: Broker, K: Bank>() {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    broker.publish(Some("order-1"), ORDER_10).await;
    let window = bank
        .apply(false)
        .dedupe_window()
        .expect("the store's window");
    let horizon = window + Duration::from_secs(24 * 3600);

    let too_long = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()).producer_horizon(horizon),
    );
    match too_long.run(std::future::pending()).await {
        Err(error @ ConsumeError::WindowTooShort { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("7days") && message.contains("8days"),
                "{message}"
            );
        }
        other => panic!("expected WindowTooShort, got {other:?}"),
    }
    let replays_too_far = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()).manual_replay_allowance(horizon),
    );
    match replays_too_far.run(std::future::pending()).await {
        Err(error @ ConsumeError::WindowTooShort { .. }) => {
            let message = error.to_string();
            assert!(
                message
                    .contains("the allowance for manual replays: 8days (longer than the window)")
                    && message.contains("the producer's retry horizon: not given"),
                "{message}"
            );
        }
        other => panic!("expected WindowTooShort, got {other:?}"),
    }
    assert!(bank.ledger().await.is_empty());

    let relay_horizon = RelayConfig::default().retry_horizon();
    assert!(relay_horizon < window);
    let fits = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()).producer_horizon(relay_horizon),
    );
    let running = Running::start(fits.stats(), |stop| fits.run(stop));
    running.until("the message acked", |s| s.acked() >= 1).await;
    running.stop().await;
    assert_eq!(bank.ledger().await, ["order-1"]);
}

/// A message whose effect always fails is dead-lettered after 5 attempts
/// with its key; the others go on. After a fix, its redrive is applied once.
pub(crate) async fn poison_then_redrive<B: Broker, K: Bank>() {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    broker.publish(Some("poison-1"), POISON).await;
    broker.publish(Some("fine-1"), ORDER_5).await;

    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("the poison dead-lettered and the other applied", |s| {
            s.dead_lettered >= 1 && s.applied >= 1
        })
        .await;

    let store = bank.store();
    let letters = store
        .list_dead_letters(10, false)
        .await
        .expect("list dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.key.as_str(), "poison-1");
    assert_eq!(letter.attempts, 5);
    assert!(
        letter.last_error.contains("poison"),
        "{}",
        letter.last_error
    );
    assert_eq!(letter.payload, POISON);
    assert!(letter.first_seen_at <= letter.dead_at);
    assert_eq!(bank.ledger().await, ["fine-1"]);

    // The fix, then the redrive: the same key comes back and is applied once.
    bank.fix_poison().await;
    match dead_letter::redrive(&store, letter.id).await {
        Ok(_) => {
            running
                .until("the redriven message applied", |s| s.applied >= 2)
                .await;
            broker.publish(Some("poison-1"), POISON).await;
            running
                .until("a late copy replayed", |s| s.replayed >= 1)
                .await;
            assert_eq!(bank.ledger().await, ["fine-1", "poison-1"]);
        }
        Err(error) => panic!("redrive failed: {error}"),
    }
    let stats = running.stop().await;
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");
}

/// A message without a key is dead-lettered with the reason; with the
/// coordinates fallback it is applied under `STREAM/SEQUENCE` (NATS) or
/// `TOPIC/PARTITION/OFFSET` (Kafka).
pub(crate) async fn keyless<B: Broker, K: Bank>() {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    broker.publish(None, ORDER_10).await;
    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("dead-lettered", |s| s.dead_lettered >= 1)
        .await;
    running.stop().await;
    let letters = bank
        .store()
        .list_dead_letters(10, false)
        .await
        .expect("list");
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].key.as_str().starts_with("no-key/"),
        "{:?}",
        letters[0].key
    );
    assert!(
        letters[0].last_error.contains("no idempotency key"),
        "{}",
        letters[0].last_error
    );
    assert!(bank.ledger().await.is_empty());

    broker.publish(None, ORDER_5).await;
    let rule = broker.key_rule().or_else(MissingKey::Coordinates);
    let consumer = Consumer::new(broker.transport().await, bank.apply(false), config(rule));
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let stats = running
        .until("settled", |s| s.applied + s.dead_lettered >= 1)
        .await;
    running.stop().await;
    if B::NAME != "amqp" {
        assert_eq!(stats.applied, 1, "{stats:?}");
        let ledger = bank.ledger().await;
        assert!(
            ledger[0]
                .to_lowercase()
                .replace('_', "-")
                .starts_with("idem-t-"),
            "keyed by its position in the log: {ledger:?}"
        );
    } else {
        assert_eq!(
            stats.dead_lettered, 1,
            "RabbitMQ has no coordinates: {stats:?}"
        );
    }
}

/// A consumer with a fingerprint rule that leaves `/sent_at` out: a copy
/// that differs only there is a duplicate (one effect), one that differs in
/// the amount is key reuse (dead-lettered, not applied).
pub(crate) async fn fingerprint_rule<B: Broker, K: Bank>() {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    broker
        .publish(Some("order-1"), br#"{"amount": 10, "sent_at": 1}"#)
        .await;
    broker
        .publish(Some("order-1"), br#"{"sent_at": 2, "amount": 10}"#)
        .await;
    broker
        .publish(Some("order-1"), br#"{"amount": 11, "sent_at": 3}"#)
        .await;
    let rule = idem::FingerprintRule::default()
        .ignore("json:/sent_at")
        .expect("a valid rule");
    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        // One at a time, in order: the first copy is the one applied.
        config(broker.key_rule()).concurrency(1).fingerprint(rule),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("three deliveries settled", |s| s.acked() >= 3)
        .await;
    let stats = running.stop().await;
    assert_eq!(bank.ledger().await, ["order-1"]);
    assert_eq!(bank.balance().await, OPENING_BALANCE - 10);
    assert_eq!(
        (stats.applied, stats.replayed, stats.dead_lettered),
        (1, 1, 1),
        "{stats:?}"
    );
    let letters = bank
        .store()
        .list_dead_letters(10, false)
        .await
        .expect("list");
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].last_error.contains("different payload"),
        "{}",
        letters[0].last_error
    );
}

/// Batch mode end to end: 200 orders, 50 of them published twice, one
/// without a key and one poison; batches of 100.
pub(crate) async fn batches<B: Broker, K: Bank>() {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    for i in 0..200 {
        broker.publish(Some(&format!("b-{i:03}")), ORDER_5).await;
        if i % 4 == 0 {
            broker.publish(Some(&format!("b-{i:03}")), ORDER_5).await;
        }
    }
    broker.publish(None, ORDER_5).await;
    broker.publish(Some("b-poison"), POISON).await;

    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule())
            .max_attempts(2)
            .batch(100, Duration::from_millis(50)),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run_batched(stop));
    let stats = running
        .until("every message settled", |s| {
            s.applied >= 200 && s.replayed >= 50 && s.dead_lettered >= 2
        })
        .await;
    let stats_after = running.stop().await;
    assert_eq!(stats_after.applied, 200, "{stats_after:?}");
    // Each of the 50 copies is answered from the record. A message held in
    // hand past the broker's redelivery time (the tests' is 2 s) on a busy
    // machine comes again and is answered the same way, so more replays
    // than copies are possible; more effects are not.
    assert!(stats.replayed >= 50, "{stats:?}");
    assert_eq!(stats_after.dead_lettered, 2, "{stats_after:?}");
    let ledger = bank.ledger().await;
    assert_eq!(ledger.len(), 200);
    ledger
        .windows(2)
        .for_each(|w| assert_ne!(w[0], w[1], "applied twice"));
    assert_eq!(bank.balance().await, OPENING_BALANCE - 1000);
}

const CRASH_STORE: &str = "IDEM_T_CRASH_STORE";
const CRASH_KEY: &str = "crash-1";

/// The consumer process aborts at crash `point` of [`idem::crash`]:
/// `apply.inside-effect` (the effect wrote, nothing committed) or
/// `consume.before-ack` (committed, not acked); a fresh consumer then gets
/// the redelivery. One effect either way.
pub(crate) async fn crash<B: Broker, K: Bank>(point: &'static str, child_test: &str) {
    let Some((broker, bank)) = start::<B, K>().await else {
        return;
    };
    broker.publish(Some(CRASH_KEY), ORDER_10).await;

    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe);
    child
        .args([
            "--exact",
            child_test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_STORE, bank.location());
    for (name, value) in broker.env() {
        child.env(name, value);
    }
    run_until_crash(child, point);

    let committed = point == crash::BEFORE_ACK;
    let before: &[&str] = if committed { &[CRASH_KEY] } else { &[] };
    assert_eq!(bank.ledger().await, before, "after the crash at {point:?}");

    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(false),
        config(broker.key_rule()),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let stats = running
        .until("the redelivery settled", |s| s.acked() >= 1)
        .await;
    running.stop().await;
    if committed {
        assert_eq!(
            (stats.applied, stats.replayed),
            (0, 1),
            "suppressed: {stats:?}"
        );
    } else {
        assert_eq!(
            (stats.applied, stats.replayed),
            (1, 0),
            "applied: {stats:?}"
        );
    }
    assert_eq!(bank.ledger().await, [CRASH_KEY], "applied exactly once");
    assert_eq!(bank.balance().await, OPENING_BALANCE - 10);
}

/// The child's side of [`crash`]: does nothing unless started by it. Its
/// effect marks `apply.inside-effect` after its write; the consumer marks
/// `consume.before-ack` after the commit; `IDEM_CRASH` says which aborts.
pub(crate) async fn crash_child<B: Broker, K: Bank>() {
    let Ok(location) = std::env::var(CRASH_STORE) else {
        return;
    };
    crash::arm_from_env().expect("the parent arms a known crash point");
    let broker = B::from_env().await;
    let bank = K::at(&location).await;
    let consumer = Consumer::new(
        broker.transport().await,
        bank.apply(true),
        config(broker.key_rule()),
    );
    let result = consumer.run(std::future::pending()).await;
    panic!("the child should have aborted at its crash point, but its consumer ended: {result:?}");
}
