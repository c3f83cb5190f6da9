//! The relay against the real services: no double claims across relays, no
//! row lost to out-of-order commits, a crash between publish and "sent" is
//! republished and deduped by the consumer, webhooks carry the key, sent
//! rows are swept by retention, and relays poll through PgBouncer.

mod outbox_support;

use std::collections::HashSet;
use std::time::Duration;

use idem::{
    AnyStore, AtomicStore, Fingerprint, IdempotencyKey, ManualClock, Outcome, Scope, SqliteStore,
};
use idem_broker::outbox::{self, Outbox, OutboxStore, Route};
use idem_broker::publish::Message;
use idem_broker::relay::{FailPoint, Relay, RelayConfig};
use outbox_support::{Hook, Nats, PgDb, Rabbit, Received, sqlite};

fn message(key: &str) -> Message {
    Message::new(IdempotencyKey::new(key).unwrap(), key.as_bytes().to_vec())
}

#[tokio::test]
async fn two_relays_on_one_postgres_publish_each_row_once() {
    let Some(db) = PgDb::new().await else { return };
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let to = Rabbit::destination(&queue);
    let clock = ManualClock::starting_now();
    let store = AnyStore::Postgres(db.store(&clock).await);
    outbox::migrate(&store).await.unwrap();
    const ROWS: usize = 200;
    for i in 0..ROWS {
        outbox::enqueue_now(&store, Route::To(&to), &message(&format!("evt-{i}")))
            .await
            .unwrap();
    }

    let config = RelayConfig {
        batch: 7,
        ..RelayConfig::default()
    };
    let first = Relay::new(store.clone(), config.clone());
    let second = Relay::new(store.clone(), config);
    let (a, b) = tokio::join!(first.drain(), second.drain());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.sent + b.sent, ROWS, "{a:?} {b:?}");
    assert!(
        a.sent > 0 && b.sent > 0,
        "both relays took part: {a:?} {b:?}"
    );

    let received = rabbit.drain(&queue).await;
    assert_eq!(received.len(), ROWS, "each row published exactly once");
    let ids: HashSet<_> = received
        .iter()
        .filter_map(|r| r.message_id.clone())
        .collect();
    assert_eq!(ids.len(), ROWS);
}

#[tokio::test]
async fn a_row_committed_late_with_a_smaller_id_is_still_sent() {
    let Some(db) = PgDb::new().await else { return };
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let to = Nats::destination(&subject);
    let clock = ManualClock::starting_now();
    let pg = db.store(&clock).await;
    let store = AnyStore::Postgres(pg.clone());
    outbox::migrate(&store).await.unwrap();

    // A takes the smaller id, B the larger; B commits first.
    let mut a = pg.pool().begin().await.unwrap();
    let id_a = Outbox::of(&pg)
        .enqueue(&mut a, &to, &message("late-a"))
        .await
        .unwrap();
    let mut b = pg.pool().begin().await.unwrap();
    let id_b = Outbox::of(&pg)
        .enqueue(&mut b, &to, &message("early-b"))
        .await
        .unwrap();
    assert!(id_a < id_b);
    b.commit().await.unwrap();

    let relay = Relay::new(store.clone(), RelayConfig::default());
    assert_eq!(relay.run_once().await.unwrap().sent, 1);
    a.commit().await.unwrap();
    assert_eq!(relay.run_once().await.unwrap().sent, 1);

    let ids: Vec<_> = nats
        .messages(&stream)
        .await
        .into_iter()
        .filter_map(|m| m.msg_id)
        .collect();
    assert_eq!(ids, ["early-b", "late-a"]);
}

/// The consumer side of the test: applies each delivery under its
/// `message_id` and counts effects in its own table.
async fn consume(store: &SqliteStore, deliveries: &[Received]) -> (usize, usize) {
    let scope = Scope::new("emails").unwrap();
    let (mut applied, mut replayed) = (0, 0);
    for delivery in deliveries {
        let key = IdempotencyKey::new(delivery.message_id.clone().expect("message_id")).unwrap();
        let result = store
            .apply(
                &scope,
                &key,
                Fingerprint::of_bytes(&delivery.payload),
                async |tx| -> idem::rusqlite::Result<Outcome> {
                    tx.execute_batch(
                        "CREATE TABLE IF NOT EXISTS sent_emails (n INTEGER); INSERT INTO sent_emails VALUES (1);",
                    )?;
                    Ok(Outcome::success("sent"))
                },
            )
            .await
            .unwrap();
        if result.is_replay() {
            replayed += 1;
        } else {
            applied += 1;
        }
    }
    (applied, replayed)
}

#[tokio::test]
async fn a_relay_that_dies_between_publish_and_sent_is_republished_and_the_consumer_keeps_one_effect()
 {
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let to = Rabbit::destination(&queue);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store.clone());
    outbox::enqueue_now(&any, Route::To(&to), &message("welcome/user-5"))
        .await
        .unwrap();

    // The first relay publishes, the broker confirms, and it "crashes"
    // before marking the row sent.
    let crashing =
        Relay::new(any.clone(), RelayConfig::default()).with_fail_point(FailPoint::AfterPublish);
    assert!(crashing.run_once().await.is_err());

    // Its lease protects the row until it ends...
    let survivor = Relay::new(any.clone(), RelayConfig::default());
    assert_eq!(survivor.run_once().await.unwrap().claimed, 0);
    // ...then another relay publishes it again.
    clock.advance(RelayConfig::default().lease + Duration::from_millis(1));
    assert_eq!(survivor.run_once().await.unwrap().sent, 1);
    clock.advance(Duration::from_secs(3600));
    assert_eq!(
        survivor.run_once().await.unwrap().claimed,
        0,
        "sent rows stay sent"
    );

    let received = rabbit.drain(&queue).await;
    assert_eq!(received.len(), 2, "at-least-once: the broker got it twice");
    assert!(
        received
            .iter()
            .all(|r| r.message_id.as_deref() == Some("welcome/user-5"))
    );

    let (_consumer_dir, consumer) = sqlite(&clock).await;
    assert_eq!(consume(&consumer, &received).await, (1, 1));
    let effects: i64 = consumer
        .with_connection(|c| c.query_row("SELECT count(*) FROM sent_emails", [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(effects, 1, "the consumer's dedupe keeps one effect");
}

#[tokio::test]
async fn webhooks_carry_the_key_are_retried_on_503_and_deduped_by_the_receiver() {
    let hook = Hook::start().await;
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store.clone());
    let to = hook.destination();
    outbox::enqueue_now(&any, Route::To(&to), &message("invoice-9/paid"))
        .await
        .unwrap();

    // 503: retried later, not dead-lettered.
    hook.answer(503);
    let relay = Relay::new(any.clone(), RelayConfig::default());
    let pass = relay.run_once().await.unwrap();
    assert_eq!(
        (pass.sent, pass.retried, pass.dead_lettered),
        (0, 1, 0),
        "{pass:?}"
    );

    // Recovered; a relay crash after the 2xx makes the receiver see it twice.
    hook.answer(200);
    clock.advance(Duration::from_secs(60));
    let crashing =
        Relay::new(any.clone(), RelayConfig::default()).with_fail_point(FailPoint::AfterPublish);
    assert!(crashing.run_once().await.is_err());
    clock.advance(Duration::from_secs(60));
    assert_eq!(relay.run_once().await.unwrap().sent, 1);

    assert_eq!(hook.calls(), 3);
    assert_eq!(hook.keys().get("invoice-9/paid"), Some(&3));
    assert_eq!(hook.effects(), 1, "one effect per key");
}

#[tokio::test]
async fn sent_rows_are_swept_after_the_retention() {
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (_stream, subject) = nats.stream().await;
    let to = Nats::destination(&subject);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let any = AnyStore::Sqlite(store.clone());
    for i in 0..3 {
        outbox::enqueue_now(&any, Route::To(&to), &message(&format!("k-{i}")))
            .await
            .unwrap();
    }
    let config = RelayConfig {
        retention: Duration::from_secs(3600),
        sweep_batch: 2,
        ..RelayConfig::default()
    };
    let relay = Relay::new(any.clone(), config);
    assert_eq!(relay.drain().await.unwrap().sent, 3);
    assert_eq!(
        relay.sweep().await.unwrap().sent_rows,
        0,
        "still inside the retention"
    );
    clock.advance(Duration::from_secs(3601));
    assert_eq!(relay.sweep().await.unwrap().sent_rows, 3);
    let stats = any.outbox_stats().await.unwrap();
    assert_eq!((stats.pending, stats.sent), (0, 0));
}

#[tokio::test]
async fn the_run_loop_wakes_on_notify_on_postgres() {
    let Some(db) = PgDb::new().await else { return };
    let Some(nats) = Nats::new().await else {
        return;
    };
    let (stream, subject) = nats.stream().await;
    let to = Nats::destination(&subject);
    let clock = ManualClock::starting_now();
    let store = AnyStore::Postgres(db.store(&clock).await);
    outbox::migrate(&store).await.unwrap();

    // A poll interval far longer than the test: only NOTIFY can wake it.
    let config = RelayConfig {
        poll_interval: Duration::from_secs(600),
        ..RelayConfig::default()
    };
    let relay = Relay::new(store.clone(), config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                stopped.await.ok();
            })
            .await
    });
    // Let it finish its first (empty) pass and start listening.
    tokio::time::sleep(Duration::from_millis(500)).await;
    outbox::enqueue_now(&store, Route::To(&to), &message("notified"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while nats.messages(&stream).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay was not woken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
}

/// Through a PgBouncer in transaction pooling mode (`pgbouncer=true`): two
/// running relays, which cannot LISTEN there and poll instead, publish every
/// row exactly once to a webhook, rows enqueued after they started included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_polling_relays_through_pgbouncer_publish_each_row_once() {
    let Some(db) = PgDb::new().await else { return };
    let Some(bouncer) = idem_testkit::pgbouncer::PgBouncer::start() else {
        return;
    };
    let url = format!("{}?pgbouncer=true", bouncer.route(&db.url));
    let hook = Hook::start().await;
    let to = hook.destination();
    let store = AnyStore::Postgres(idem::PgStore::connect(&url).await.unwrap());
    outbox::migrate(&store).await.unwrap();
    const ROWS: usize = 40;
    for i in 0..ROWS / 2 {
        outbox::enqueue_now(&store, Route::To(&to), &message(&format!("early-{i}")))
            .await
            .unwrap();
    }
    let config = RelayConfig {
        poll_interval: Duration::from_millis(100),
        ..RelayConfig::default()
    };
    let mut running = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..2 {
        let own = AnyStore::Postgres(idem::PgStore::connect(&url).await.unwrap());
        let relay = Relay::new(own, config.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop);
        running.push(tokio::spawn(async move {
            relay
                .run(async {
                    stopped.await.ok();
                })
                .await
        }));
    }
    for i in 0..ROWS / 2 {
        outbox::enqueue_now(&store, Route::To(&to), &message(&format!("late-{i}")))
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while (hook.effects() as usize) < ROWS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {ROWS} rows published",
            hook.effects()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for stop in stops {
        stop.send(()).unwrap();
    }
    for relay in running {
        relay.await.unwrap().unwrap();
    }
    assert_eq!(hook.effects() as usize, ROWS);
    assert_eq!(hook.calls() as usize, ROWS, "no row published twice");
    assert!(hook.keys().values().all(|&n| n == 1), "{:?}", hook.keys());
    let stats = store.outbox_stats().await.unwrap();
    assert_eq!((stats.pending, stats.sent), (0, ROWS as u64));
}

/// Waits (at most 60 s) until `rabbit` has handed out `count` messages of
/// `queue` in all, adding them to `received`.
async fn receive_until(
    rabbit: &Rabbit,
    queue: &str,
    received: &mut Vec<Received>,
    count: usize,
    what: &str,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        received.extend(rabbit.drain(queue).await);
        let keys: HashSet<_> = received
            .iter()
            .filter_map(|r| r.message_id.clone())
            .collect();
        if keys.len() >= count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {} keys received",
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn health_until(name: &str, down: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while idem::health::unready().iter().any(|d| d.name == name) != down {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {name} to be reported {}",
            if down { "down" } else { "up" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `idem relay`'s loop outlives its connections: its broker connection is
/// cut, then its database connection, with rows enqueued during each cut;
/// the health reports each cut while it lasts, and every row is published
/// and applied once by a consumer that dedupes on the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_outlives_cut_broker_and_database_connections() {
    use idem_testkit::faultproxy::{FaultProxy, Mode};

    let Some(db) = PgDb::new().await else { return };
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let pg_proxy = FaultProxy::start("127.0.0.1:5432".parse().unwrap())
        .await
        .unwrap();
    let amqp_proxy = FaultProxy::start("127.0.0.1:5672".parse().unwrap())
        .await
        .unwrap();
    let mut url = url::Url::parse(&db.url).unwrap();
    url.set_port(Some(pg_proxy.addr().port())).unwrap();
    let relayed = AnyStore::Postgres(idem::PgStore::connect(url.as_str()).await.unwrap());
    let direct = AnyStore::Postgres(idem::PgStore::connect(&db.url).await.unwrap());
    outbox::migrate(&direct).await.unwrap();
    let to: idem_broker::publish::Destination = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f?queue={queue}",
        amqp_proxy.addr().port()
    )
    .parse()
    .unwrap();
    let quick = idem_broker::consume::Reconnect::default()
        .min(Duration::from_millis(20))
        .max(Duration::from_millis(200));
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(2),
        max_attempts: 50,
        backoff: idem_retry::Backoff::default()
            .with_base(Duration::from_millis(10))
            .with_cap(Duration::from_millis(100)),
        reconnect: quick,
        ..RelayConfig::default()
    };
    let relay = Relay::new(relayed, config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    let enqueue = async |prefix: &str| {
        for i in 0..10 {
            outbox::enqueue_now(&direct, Route::To(&to), &message(&format!("{prefix}-{i}")))
                .await
                .unwrap();
        }
    };
    let mut received = Vec::new();

    enqueue("before").await;
    receive_until(&rabbit, &queue, &mut received, 10, "the first ten").await;

    amqp_proxy.set(Mode::Drop);
    enqueue("broker-cut").await;
    health_until(&to.redacted(), true).await;
    amqp_proxy.set(Mode::Pass);
    receive_until(
        &rabbit,
        &queue,
        &mut received,
        20,
        "the rows of the broker cut",
    )
    .await;
    health_until(&to.redacted(), false).await;

    pg_proxy.set(Mode::Drop);
    enqueue("database-cut").await;
    health_until("the relay's outbox store", true).await;
    pg_proxy.set(Mode::Pass);
    receive_until(
        &rabbit,
        &queue,
        &mut received,
        30,
        "the rows of the database cut",
    )
    .await;
    health_until("the relay's outbox store", false).await;

    assert!(!running.is_finished(), "the relay is still running");
    let _ = stop.send(());
    running.await.unwrap().expect("the relay stopped cleanly");

    let (_dir, consumer) = sqlite(&ManualClock::starting_now()).await;
    let (applied, _replayed) = consume(&consumer, &received).await;
    assert_eq!(applied, 30, "each row applied once by the consumer");
}
