//! Dead letters: a poison message ends there after 5 attempts with its key,
//! a rejection at once; a redrive publishes it with the same key; the table
//! works the same on PostgreSQL; the retry budget postpones retries instead of
//! spending attempts; the relay's upkeep reports the oldest waiting letter's
//! age.

mod outbox_support;

use std::sync::Arc;
use std::time::Duration;

use idem::{AnyStore, Clock, IdempotencyKey, ManualClock, Timestamp};
use idem_broker::dead_letter::{self, DeadLetterStore, NewDeadLetter};
use idem_broker::outbox::{self, OutboxStore, Route};
use idem_broker::publish::Message;
use idem_broker::relay::{Relay, RelayConfig};
use idem_retry::{BudgetSettings, RetryBudget};
use outbox_support::{Hook, Nats, PgDb, sqlite};

fn message(key: &str) -> Message {
    Message::new(IdempotencyKey::new(key).unwrap(), b"payload".to_vec()).with_header("tenant", "7")
}

#[tokio::test]
async fn a_poison_message_is_dead_lettered_after_5_attempts_with_its_key_and_redriven_with_it() {
    let hook = Hook::start().await;
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store.clone());
    let to = hook.destination();
    outbox::enqueue_now(&any, Route::To(&to), &message("shipment-3/label"))
        .await
        .unwrap();

    hook.answer(500);
    let relay = Relay::new(any.clone(), RelayConfig::default());
    let mut passes = Vec::new();
    for _ in 0..5 {
        passes.push(relay.run_once().await.unwrap());
        clock.advance(Duration::from_secs(30)); // past any backoff (cap 20 s)
    }
    let retried: usize = passes.iter().map(|p| p.retried).sum();
    let dead: usize = passes.iter().map(|p| p.dead_lettered).sum();
    assert_eq!((retried, dead), (4, 1), "{passes:?}");
    assert_eq!(hook.calls(), 5);
    assert_eq!(
        relay.run_once().await.unwrap().claimed,
        0,
        "the row left the outbox"
    );

    let letters = any.list_dead_letters(10, false).await.unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.key.as_str(), "shipment-3/label");
    assert_eq!(letter.attempts, 5);
    assert_eq!(letter.origin, "relay");
    assert_eq!(letter.destination, to.to_string());
    assert_eq!(letter.headers.get("tenant").map(String::as_str), Some("7"));
    assert!(letter.last_error.contains("500"), "{}", letter.last_error);
    assert_eq!(letter.redriven_at, None);
    let stats = any.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.redriven), (1, 0));

    // Fixed: the redrive delivers it with the same key, once.
    hook.answer(200);
    let redriven = dead_letter::redrive(&any, letter.id).await.unwrap();
    assert_eq!(redriven.key, letter.key);
    assert_eq!(hook.keys().get("shipment-3/label"), Some(&6));
    assert_eq!(hook.effects(), 1);
    assert!(any.list_dead_letters(10, false).await.unwrap().is_empty());
    let again = any.get_dead_letter(letter.id).await.unwrap().unwrap();
    assert!(again.redriven_at.is_some());
    // A second redrive of the same letter is deduped by the receiver.
    dead_letter::redrive(&any, letter.id).await.unwrap();
    assert_eq!(hook.effects(), 1);
}

#[tokio::test]
async fn a_rejection_is_dead_lettered_at_once() {
    let hook = Hook::start().await;
    hook.answer(422);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store);
    let to = hook.destination();
    outbox::enqueue_now(&any, Route::To(&to), &message("bad-1"))
        .await
        .unwrap();
    let pass = Relay::new(any.clone(), RelayConfig::default())
        .run_once()
        .await
        .unwrap();
    assert_eq!(pass.dead_lettered, 1, "{pass:?}");
    let letter = &any.list_dead_letters(10, false).await.unwrap()[0];
    assert_eq!(letter.attempts, 1);
    assert!(letter.last_error.contains("422"), "{}", letter.last_error);
}

#[tokio::test]
async fn an_exhausted_budget_postpones_retries_without_spending_attempts() {
    let hook = Hook::start().await;
    hook.answer(503);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store);
    let to = hook.destination();
    outbox::enqueue_now(&any, Route::To(&to), &message("m-1"))
        .await
        .unwrap();
    let budget = RetryBudget::with_clock(
        BudgetSettings {
            retry_ratio: 0.0,
            min_retries_per_second: 0,
            ..BudgetSettings::default()
        },
        Arc::new(clock.clone()),
    )
    .unwrap();
    let relay = Relay::new(any.clone(), RelayConfig::default()).with_budget(Arc::new(budget));
    assert_eq!(relay.run_once().await.unwrap().retried, 1);
    for _ in 0..8 {
        clock.advance(Duration::from_secs(30));
        let pass = relay.run_once().await.unwrap();
        assert_eq!((pass.postponed, pass.dead_lettered), (1, 0), "{pass:?}");
    }
    assert_eq!(hook.calls(), 1, "no retry was sent without budget");
    assert_eq!(any.outbox_stats().await.unwrap().pending, 1);
}

#[tokio::test]
async fn dead_letters_on_postgres_record_list_mark_and_sweep() {
    let Some(db) = PgDb::new().await else { return };
    let clock = ManualClock::starting_now();
    let store = db.store(&clock).await;
    let letter = NewDeadLetter {
        origin: "consumer nats stream ORDERS".into(),
        destination: "nats://127.0.0.1:4222/orders.created".into(),
        key: IdempotencyKey::new("order-77").unwrap(),
        payload: vec![0, 159, 146, 150],
        headers: [("a".to_owned(), "b".to_owned())].into(),
        attempts: 5,
        last_error: "handler: no such customer".into(),
        first_seen_at: Timestamp(1_000),
    };
    let first = store.record_dead_letter(&letter).await.unwrap();
    let second = store.record_dead_letter(&letter).await.unwrap();
    assert!(second > first);

    let listed = store.list_dead_letters(1, false).await.unwrap();
    assert_eq!(listed.len(), 1);
    let got = &listed[0];
    assert_eq!(got.id, first);
    assert_eq!(
        (&got.key, &got.payload, &got.headers, got.attempts),
        (&letter.key, &letter.payload, &letter.headers, 5)
    );
    assert_eq!(got.destination, letter.destination);
    assert_eq!(got.dead_at, clock.now());

    store.mark_redriven(first).await.unwrap();
    assert!(store.mark_redriven(9_999).await.is_err());
    assert_eq!(store.list_dead_letters(10, false).await.unwrap().len(), 1);
    assert_eq!(store.list_dead_letters(10, true).await.unwrap().len(), 2);
    let stats = store.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.redriven), (1, 1));
    assert!(store.get_dead_letter(12_345).await.unwrap().is_none());

    clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(
        store
            .sweep_dead_letters(idem_broker::relay::DEFAULT_RETENTION, 100)
            .await
            .unwrap(),
        2
    );
}

#[tokio::test]
async fn a_nats_redrive_keeps_the_key_as_nats_msg_id() {
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let id = store
        .record_dead_letter(&NewDeadLetter {
            origin: "consumer".into(),
            destination: Nats::destination(&subject).to_string(),
            key: IdempotencyKey::new("payment-8/captured").unwrap(),
            payload: b"8".to_vec(),
            headers: Default::default(),
            attempts: 5,
            last_error: "boom".into(),
            first_seen_at: clock.now(),
        })
        .await
        .unwrap();
    dead_letter::redrive(&store, id).await.unwrap();
    let stored = nats.messages(&stream).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].msg_id.as_deref(), Some("payment-8/captured"));
    let missing = dead_letter::redrive(&store, id + 100).await.unwrap_err();
    assert!(missing.to_string().contains("no dead letter"), "{missing}");
}

#[tokio::test]
async fn a_message_that_keeps_crashing_relays_ends_in_the_dead_letters() {
    use idem_broker::relay::FailPoint;
    let hook = Hook::start().await;
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store);
    let to = hook.destination();
    outbox::enqueue_now(&any, Route::To(&to), &message("crashy-1"))
        .await
        .unwrap();
    let config = RelayConfig::default();
    for _ in 0..config.max_attempts {
        let crashing =
            Relay::new(any.clone(), config.clone()).with_fail_point(FailPoint::AfterPublish);
        assert!(crashing.run_once().await.is_err());
        clock.advance(config.lease + Duration::from_millis(1));
    }
    let pass = Relay::new(any.clone(), config.clone())
        .run_once()
        .await
        .unwrap();
    assert_eq!((pass.sent, pass.dead_lettered), (0, 1), "{pass:?}");
    assert_eq!(
        hook.calls(),
        config.max_attempts,
        "the sixth claim did not publish"
    );
    let letter = &any.list_dead_letters(10, false).await.unwrap()[0];
    assert_eq!(letter.attempts, 5);
    assert!(
        letter
            .last_error
            .contains("stopped before it was marked sent"),
        "{}",
        letter.last_error
    );
}

/// Records letters at known times of the store's clock (the oldest is then
/// redriven), moves the clock on, runs the relay's upkeep under a recorder
/// and answers the gauges it set: (`dead_letters`,
/// `dead_letter_oldest_age_seconds`).
async fn gauges_after_upkeep(any: AnyStore, clock: &ManualClock) -> (f64, f64) {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let letter = |key: &str| NewDeadLetter {
        origin: "relay".into(),
        destination: "http://127.0.0.1:9/hook".into(),
        key: IdempotencyKey::new(key).unwrap(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
        attempts: 5,
        last_error: "HTTP 500".into(),
        first_seen_at: clock.now(),
    };
    let redriven = any
        .record_dead_letter(&letter("old-redriven"))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    any.record_dead_letter(&letter("oldest-waiting"))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(60));
    any.record_dead_letter(&letter("newer")).await.unwrap();
    any.mark_redriven(redriven).await.unwrap();
    // The oldest waiting letter is 2 h 3 min 4.25 s old from here.
    clock.advance(Duration::from_millis(7_384_250 - 60_000));

    let relay = Relay::new(any, RelayConfig::default());
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        futures::executor::block_on(relay.upkeep()).unwrap();
    });
    let gauges: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(v) => Some((key.key().name().to_owned(), v.into_inner())),
            _ => None,
        })
        .collect();
    let gauge = |name: &str| {
        gauges
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no gauge {name}: {gauges:?}"))
            .1
    };
    (
        gauge("dead_letters"),
        gauge("dead_letter_oldest_age_seconds"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upkeep_reports_the_oldest_waiting_letter_s_age_on_sqlite() {
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let (waiting, age) = gauges_after_upkeep(AnyStore::Sqlite(store), &clock).await;
    assert_eq!(waiting, 2.0);
    assert_eq!(
        age, 7_384.25,
        "the redriven letter is older and not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upkeep_reports_the_oldest_waiting_letter_s_age_on_postgres() {
    let Some(db) = PgDb::new().await else { return };
    let clock = ManualClock::starting_now();
    let store = db.store(&clock).await;
    let (waiting, age) = gauges_after_upkeep(AnyStore::Postgres(store), &clock).await;
    assert_eq!(waiting, 2.0);
    assert_eq!(
        age, 7_384.25,
        "the redriven letter is older and not counted"
    );
}
