//! Concurrent duplicates that wait for their original (`--concurrent
//! wait:DURATION`), through the gateway over real sockets, on SQLite,
//! PostgreSQL, Redis and DynamoDB: the replay when the original's answer is stored,
//! 409 with `Retry-After` when the wait runs out or the original ends without
//! an answer, the caps, a waiter on another gateway woken by the store, and
//! the default that still answers 409 at once.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::gateway::{Gateway, Options, Upstream};
use common::{Client, Reply, Server};
use idem::{AnyStore, StoreLocation, SystemClock};
use idem_http::{Concurrent, IdempotencyConfig, WaiterCaps};
use serde_json::json;
use tokio::task::JoinHandle;

/// A store the cases run on.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Sqlite,
    Postgres,
    /// PostgreSQL through a private PgBouncer in transaction pooling mode
    /// (`pgbouncer=true`): no notifications, waiters re-read.
    PgBouncer,
    Redis,
    /// A table of the case's own on moto's DynamoDB: waiters re-read.
    DynamoDb,
}

/// Runs a case on SQLite, PostgreSQL and PostgreSQL through PgBouncer (and
/// on the other stores named, `redis: Redis`), one test each.
macro_rules! on_stores {
    ($case:ident $(, $store:ident: $kind:ident)*) => {
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$case(super::Kind::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$case(super::Kind::Postgres).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pgbouncer() {
                super::$case(super::Kind::PgBouncer).await
            }

            $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $store() {
                super::$case(super::Kind::$kind).await
            }
            )*
        }
    };
}

/// Where the cases' records are kept, for as long as the case runs.
struct Place {
    location: StoreLocation,
    _dir: tempfile::TempDir,
    _database: Option<common::pg::PgDatabase>,
    _bouncer: Option<idem_testkit::pgbouncer::PgBouncer>,
}

impl Place {
    /// A fresh store of `kind`; `None` when its server is not reachable (and
    /// services are not required).
    async fn new(kind: Kind) -> Option<Place> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut bouncer = None;
        let (location, database) = match kind {
            Kind::Sqlite => (StoreLocation::Sqlite(dir.path().join("idem.db")), None),
            Kind::PgBouncer => {
                let database = common::pg::PgDatabase::create().await?;
                let started = idem_testkit::pgbouncer::PgBouncer::start()?;
                let url = format!("{}?pgbouncer=true", started.route(&database.url));
                bouncer = Some(started);
                (url.parse().expect("a store URL"), Some(database))
            }
            Kind::Postgres => {
                let database = common::pg::PgDatabase::create().await?;
                (database.url.parse().expect("a store URL"), Some(database))
            }
            Kind::Redis => {
                if !idem_testkit::redis::machine_redis_answers() {
                    return None;
                }
                // Keys unique to each case: every key below carries a random tag.
                (StoreLocation::Redis(idem_testkit::redis::redis_url()), None)
            }
            Kind::DynamoDb => (
                StoreLocation::DynamoDb(idem_testkit::dynamodb::fresh_table_url("wait")?),
                None,
            ),
        };
        Some(Place {
            location,
            _dir: dir,
            _database: database,
            _bouncer: bouncer,
        })
    }

    /// A store on this place, as one more process would open it.
    async fn open(&self, config: &IdempotencyConfig) -> AnyStore {
        AnyStore::open_with(
            &self.location,
            config.store_settings(),
            Arc::new(SystemClock),
        )
        .await
        .expect("open the store")
    }
}

/// An upstream, and gateways in front of it sharing one store's records.
struct Fixture {
    upstream: Upstream,
    place: Place,
    upstream_server: Server,
}

impl Fixture {
    async fn new(kind: Kind) -> Option<Fixture> {
        let place = Place::new(kind).await?;
        let upstream = Upstream::default();
        let upstream_server = upstream.start().await;
        Some(Fixture {
            upstream,
            place,
            upstream_server,
        })
    }

    /// One more gateway (a node) with `options`, on its own connection to the store.
    async fn gateway(&self, options: Options) -> Gateway {
        let store = self.place.open(&options.idempotency).await;
        Gateway::start(self.upstream_server.addr, store, options).await
    }
}

fn waiting(up_to: Duration) -> IdempotencyConfig {
    IdempotencyConfig::default().concurrent(Concurrent::Wait(up_to))
}

fn with(idempotency: IdempotencyConfig) -> Options {
    Options {
        idempotency,
        upstream_timeout: Duration::from_secs(30),
        ..Options::default()
    }
}

/// A key no other case or run uses (Redis keeps every run's keys).
fn key(name: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    format!("{name}-{}-{}", std::process::id(), now.as_nanos())
}

/// Sends a POST with `key` in a task of its own.
fn send(client: &Client, path: &'static str, key: &str) -> JoinHandle<(Reply, Duration)> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        let sent = Instant::now();
        let reply = client
            .post(path)
            .key(&key)
            .json(&json!({ "amount": 10 }))
            .send()
            .await;
        (reply, sent.elapsed())
    })
}

/// Waits until `done` holds, for at most 10 s.
async fn until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still not so after 10 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

on_stores!(
    a_duplicate_waits_for_the_original_and_gets_its_answer_as_a_replay,
    redis: Redis,
    dynamodb: DynamoDb
);
async fn a_duplicate_waits_for_the_original_and_gets_its_answer_as_a_replay(kind: Kind) {
    let Some(f) = Fixture::new(kind).await else {
        return;
    };
    let gateway = f.gateway(with(waiting(Duration::from_secs(20)))).await;
    let client = gateway.client();
    let key = key("slow");
    let original = send(&client, "/slow", &key);
    until("the original reached the upstream", || {
        f.upstream.calls() == 1
    })
    .await;
    let duplicate = send(&client, "/slow", &key);
    until("the duplicate waits", || gateway.layer.waiting() == 1).await;
    assert!(
        !duplicate.is_finished(),
        "the duplicate waits for the original"
    );

    f.upstream.open_gate(1);
    let (original, _) = original.await.unwrap();
    let (duplicate, _) = duplicate.await.unwrap();
    assert_eq!(original.status, StatusCode::CREATED);
    assert!(!original.replayed());
    assert_eq!(
        duplicate.status,
        StatusCode::CREATED,
        "{:?}",
        duplicate.body
    );
    assert!(duplicate.replayed(), "the waiter's answer is a replay");
    assert_eq!(duplicate.body, original.body, "the original's answer");
    assert_eq!(f.upstream.effects(), 1, "applied once");
    assert_eq!(gateway.layer.waiting(), 0, "nobody is left waiting");
}

on_stores!(many_waiters_are_answered_409_within_the_bound_and_none_applied);
async fn many_waiters_are_answered_409_within_the_bound_and_none_applied(kind: Kind) {
    let Some(f) = Fixture::new(kind).await else {
        return;
    };
    let up_to = Duration::from_millis(1500);
    let gateway = f.gateway(with(waiting(up_to))).await;
    let client = gateway.client();
    let key = key("never");
    let original = send(&client, "/slow", &key);
    until("the original reached the upstream", || {
        f.upstream.calls() == 1
    })
    .await;

    let waiters: Vec<_> = (0..50).map(|_| send(&client, "/slow", &key)).collect();
    for waiter in waiters {
        let (reply, took) = waiter.await.unwrap();
        assert_eq!(reply.status, StatusCode::CONFLICT, "{:?}", reply.body);
        assert!(reply.retry_after() >= 1);
        assert!(
            took < up_to + Duration::from_secs(3),
            "answered within the wait and some slack: {took:?}"
        );
    }
    assert_eq!(f.upstream.effects(), 1, "no waiter was applied");
    assert_eq!(f.upstream.calls(), 1, "no waiter reached the upstream");
    assert_eq!(gateway.layer.waiting(), 0);

    // The original still answers, and a retry gets its answer.
    f.upstream.open_gate(1);
    let (original, _) = original.await.unwrap();
    assert_eq!(original.status, StatusCode::CREATED);
    let (retry, _) = send(&client, "/slow", &key).await.unwrap();
    assert!(retry.replayed());
    assert_eq!(retry.body, original.body);
    assert_eq!(f.upstream.effects(), 1);
}

on_stores!(waiters_over_the_caps_get_409_at_once);
async fn waiters_over_the_caps_get_409_at_once(kind: Kind) {
    let Some(f) = Fixture::new(kind).await else {
        return;
    };
    let config = waiting(Duration::from_secs(30)).waiter_caps(WaiterCaps {
        per_key: 3,
        total: 5,
    });
    let gateway = f.gateway(with(config)).await;
    let client = gateway.client();
    let (a, b) = (key("cap-a"), key("cap-b"));
    let originals = [send(&client, "/slow", &a), send(&client, "/slow", &b)];
    until("both originals reached the upstream", || {
        f.upstream.calls() == 2
    })
    .await;

    let mut waiters: Vec<_> = (0..3).map(|_| send(&client, "/slow", &a)).collect();
    until("three wait on the first key", || {
        gateway.layer.waiting() == 3
    })
    .await;
    let (over_key, took) = send(&client, "/slow", &a).await.unwrap();
    assert_eq!(over_key.status, StatusCode::CONFLICT);
    assert!(over_key.retry_after() >= 1);
    assert!(
        took < Duration::from_secs(5),
        "at once, not after the wait: {took:?}"
    );

    waiters.extend((0..2).map(|_| send(&client, "/slow", &b)));
    until("five wait in all", || gateway.layer.waiting() == 5).await;
    let (over_total, took) = send(&client, "/slow", &b).await.unwrap();
    assert_eq!(over_total.status, StatusCode::CONFLICT);
    assert!(
        took < Duration::from_secs(5),
        "at once, not after the wait: {took:?}"
    );
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "the five under the caps still wait"
    );

    f.upstream.open_gate(2);
    let mut answers = Vec::new();
    for original in originals {
        answers.push(original.await.unwrap().0);
    }
    for (i, waiter) in waiters.into_iter().enumerate() {
        let (reply, _) = waiter.await.unwrap();
        assert!(reply.replayed(), "{:?}", reply.body);
        let original = if i < 3 { &answers[0] } else { &answers[1] };
        assert_eq!(reply.body, original.body);
    }
    assert_eq!(f.upstream.effects(), 2, "each key applied once");
}

on_stores!(a_waiter_is_answered_409_when_the_original_ends_without_an_answer);
async fn a_waiter_is_answered_409_when_the_original_ends_without_an_answer(kind: Kind) {
    let Some(f) = Fixture::new(kind).await else {
        return;
    };
    // The upstream never answers within the gateway's timeout: the outcome
    // is unknown, and the waiter hears so instead of waiting out its 30 s.
    // The timeout leaves the waiter time to join on a busy machine.
    let options = Options {
        upstream_timeout: Duration::from_secs(5),
        ..with(waiting(Duration::from_secs(30)))
    };
    let gateway = f.gateway(options).await;
    let client = gateway.client();
    let key = key("unknown");
    let original = send(&client, "/slow", &key);
    until("the original reached the upstream", || {
        f.upstream.calls() == 1
    })
    .await;
    let waiter = send(&client, "/slow", &key);
    until("the duplicate waits", || gateway.layer.waiting() == 1).await;
    let (original, _) = original.await.unwrap();
    assert_eq!(original.status, StatusCode::GATEWAY_TIMEOUT);
    let (reply, took) = waiter.await.unwrap();
    assert_eq!(reply.status, StatusCode::CONFLICT, "{:?}", reply.body);
    assert!(reply.retry_after() >= 1);
    assert!(
        took < Duration::from_secs(20),
        "told when the original ended: {took:?}"
    );
    assert_eq!(f.upstream.effects(), 1, "the waiter was not applied");
    f.upstream.open_gate(1);
}

on_stores!(
    a_waiter_on_another_gateway_gets_the_original_answer,
    redis: Redis,
    dynamodb: DynamoDb
);
async fn a_waiter_on_another_gateway_gets_the_original_answer(kind: Kind) {
    let Some(f) = Fixture::new(kind).await else {
        return;
    };
    // Two nodes on one store: the original runs on A, its duplicate waits
    // on B, woken by PostgreSQL's NOTIFY (re-reading on the other stores).
    let a = f.gateway(with(waiting(Duration::from_secs(20)))).await;
    let b = f.gateway(with(waiting(Duration::from_secs(20)))).await;
    let key = key("two-nodes");
    let original = send(&a.client(), "/slow", &key);
    until("the original reached the upstream", || {
        f.upstream.calls() == 1
    })
    .await;
    let duplicate = send(&b.client(), "/slow", &key);
    until("the duplicate waits on B", || b.layer.waiting() == 1).await;
    assert_eq!(a.layer.waiting(), 0, "nobody waits on A");

    f.upstream.open_gate(1);
    let (original, _) = original.await.unwrap();
    let (duplicate, _) = duplicate.await.unwrap();
    assert_eq!(original.status, StatusCode::CREATED);
    assert_eq!(
        duplicate.status,
        StatusCode::CREATED,
        "{:?}",
        duplicate.body
    );
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, original.body);
    assert_eq!(f.upstream.effects(), 1);
}

on_stores!(by_default_a_concurrent_duplicate_gets_409_at_once);
async fn by_default_a_concurrent_duplicate_gets_409_at_once(kind: Kind) {
    let Some(f) = Fixture::new(kind).await else {
        return;
    };
    let gateway = f.gateway(with(IdempotencyConfig::default())).await;
    let client = gateway.client();
    let key = key("default");
    let original = send(&client, "/slow", &key);
    until("the original reached the upstream", || {
        f.upstream.calls() == 1
    })
    .await;
    let (duplicate, took) = send(&client, "/slow", &key).await.unwrap();
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert!(duplicate.retry_after() >= 1);
    assert!(took < Duration::from_secs(5), "at once: {took:?}");
    assert!(!original.is_finished(), "the original is still running");
    assert_eq!(gateway.layer.waiting(), 0, "nobody waited");
    f.upstream.open_gate(1);
    assert_eq!(original.await.unwrap().0.status, StatusCode::CREATED);
    assert_eq!(f.upstream.effects(), 1);
}
