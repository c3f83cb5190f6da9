//! What is Redis's own: claims racing over separate connections, records
//! expiring by the server's clock, a server killed and restarted with its
//! append-only file, `WAIT` for replicas, failed attempts and dead letters,
//! and the errors a caller sees.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    AttemptStore, Claimed, Clock, DeadLetterStore, Error, ErrorKind, FencingToken, Fingerprint,
    IdempotencyKey, LeaseStore, ManualClock, NewDeadLetter, Outcome, RecordStore, Scope, Settings,
    SystemClock,
};
use idem_redis::{Durability, RedisStore};
use idem_testkit::redis::{RedisServer, machine_redis_answers, redis_url, test_prefix};

use common::{Prefix, Redis};

fn scope() -> Scope {
    Scope::new("orders").unwrap()
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(name).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes(b"payload")
}

/// Sixteen stores, each on its own connection, race for each of 40 keys:
/// every key has exactly one fresh claim, and every other answer is
/// `InFlight`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_racing_over_separate_connections_have_one_winner_per_key() {
    if !machine_redis_answers() {
        return;
    }
    let first = Redis::at(&redis_url(), "race").await;
    let mut stores = vec![first.store.clone()];
    for _ in 1..16 {
        stores.push(
            RedisStore::builder(redis_url())
                .clock(Arc::new(first.clock.clone()))
                .prefix(first.prefix.prefix.clone())
                .connect()
                .await
                .unwrap(),
        );
    }
    let mut fresh = 0;
    let mut in_flight = 0;
    for k in 0..40 {
        let racers = stores.iter().cloned().map(|store| {
            let key = key(&format!("race-{k}"));
            tokio::spawn(async move { store.claim(&scope(), &key, fp()).await })
        });
        for answer in futures::future::join_all(racers).await {
            match answer.unwrap() {
                Ok(Claimed::Fresh(_)) => fresh += 1,
                Err(Error::InFlight { .. }) => in_flight += 1,
                other => panic!("expected a claim or InFlight, got {other:?}"),
            }
        }
    }
    assert_eq!((fresh, in_flight), (40, 40 * 15));
    assert_eq!(first.keys().await, 40, "one hash per key");
}

/// A record expires with its window by the server's own clock (`PEXPIRE`),
/// and the key is then claimed anew with a token above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_by_the_servers_clock_and_tokens_keep_growing() {
    if !machine_redis_answers() {
        return;
    }
    let prefix = test_prefix("expiry");
    let _cleanup = Prefix {
        url: redis_url(),
        prefix: prefix.clone(),
    };
    // Each round's claim, completion and replay must fit in it.
    let retention = Duration::from_secs(2);
    let store = RedisStore::builder(redis_url())
        .clock(Arc::new(SystemClock))
        .settings(Settings::default().with_retention(retention))
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    let mut last = None;
    for round in 0..3 {
        let Claimed::Fresh(claim) = store.claim(&scope(), &key("k"), fp()).await.unwrap() else {
            panic!("round {round}: a key without a record is claimed")
        };
        assert!(last.is_none_or(|t: FencingToken| claim.token > t));
        last = Some(claim.token);
        store
            .complete(&claim, &Outcome::success("done"))
            .await
            .unwrap();
        assert!(
            store
                .claim(&scope(), &key("k"), fp())
                .await
                .unwrap()
                .replayed()
                .is_some()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.get(&scope(), &key("k")).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "Redis did not expire the record");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A private server with `appendfsync always`, killed (`SIGKILL`) and
/// started again while a writer claims and completes keys: every completion
/// the writer was told of is replayed afterwards, and a key claimed and
/// released over and over never gets a token below an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_with_the_append_only_file_forgets_no_completed_key_and_no_token() {
    let Some(mut server) = RedisServer::start_durable() else {
        return;
    };
    let clock = ManualClock::starting_now();
    let store = RedisStore::builder(server.url())
        .clock(Arc::new(clock.clone()))
        .connect()
        .await
        .unwrap();
    let writer = {
        let (store, clock) = (store.clone(), clock.clone());
        tokio::spawn(async move {
            let mut completed = Vec::new();
            let mut tokens = Vec::new();
            let mut failures = 0;
            for i in 0..300 {
                let k = key(&format!("k-{i}"));
                loop {
                    match settle(&store, &k, &mut tokens).await {
                        Ok(()) => break,
                        Err(Error::InFlight { .. }) => {
                            // Our claim was written but its answer was lost:
                            // its lease ends, and the retry takes it over.
                            clock.advance(store.settings().lease);
                        }
                        Err(error) => {
                            assert!(error.is_retryable(), "{error}");
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                completed.push(k);
            }
            (completed, tokens, failures)
        })
    };
    // Let the writer get going, then kill the server under it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut at_restart = 0;
    while at_restart < 100 {
        assert!(Instant::now() < deadline, "the writer made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
        at_restart = store.count().await.unwrap().total;
    }
    tokio::task::block_in_place(|| server.restart());
    let (completed, tokens, failures) = writer.await.unwrap();
    eprintln!(
        "restarted with {at_restart} records stored; the writer met {failures} failed calls and went on"
    );
    assert!(at_restart < 301, "the restart came while the writer ran");
    assert_eq!(completed.len(), 300);
    for k in &completed {
        match store.claim(&scope(), k, fp()).await.unwrap() {
            Claimed::Replayed(replay) => assert_eq!(replay.outcome.body, k.as_str().as_bytes()),
            Claimed::Fresh(_) => panic!("{k} was completed before, and is forgotten"),
        }
    }
    assert!(tokens.len() > 1);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens of the repeated key went back: {tokens:?}"
    );
    // Once more, after a restart with nothing running: every record is read
    // back from the append-only file.
    tokio::task::block_in_place(|| server.restart());
    let deadline = Instant::now() + Duration::from_secs(10);
    let total = loop {
        match store.count().await {
            Ok(count) => break count.total,
            Err(error) => {
                assert!(Instant::now() < deadline, "{error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(total, 300 + 1);
}

/// Claims and completes `k`; also claims and releases the key `repeated`,
/// noting its token.
async fn settle(
    store: &RedisStore,
    k: &IdempotencyKey,
    tokens: &mut Vec<FencingToken>,
) -> Result<(), Error> {
    if let Claimed::Fresh(claim) = store.claim(&scope(), &key("repeated"), fp()).await? {
        tokens.push(claim.token);
        store.release(&claim).await?;
    }
    match store.claim(&scope(), k, fp()).await? {
        Claimed::Fresh(claim) => {
            store
                .complete(&claim, &Outcome::success(k.as_str().to_owned()))
                .await
        }
        Claimed::Replayed(_) => Ok(()),
    }
}

/// With `WAIT` for one replica and none attached, a write is refused as
/// commit-unknown, saying so; with a replica attached it is acknowledged,
/// and the replica holds the completed record once the primary is gone.
/// Prints what the wait costs per claim and completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_replica_is_refused_without_one_and_keeps_writes_on_it() {
    let Some(mut primary) = RedisServer::start(&[]) else {
        return;
    };
    let durable = Durability::replicas(1, Duration::from_millis(100));
    let alone = RedisStore::builder(primary.url())
        .durability(durable)
        .connect()
        .await
        .unwrap();
    match alone.claim(&scope(), &key("alone"), fp()).await {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind(), ErrorKind::CommitUnknown);
            let text = e.to_string();
            assert!(text.contains("only 0 of the 1 replicas"), "{text}");
            assert!(
                text.contains("retrying under the same key is safe"),
                "{text}"
            );
        }
        other => panic!("expected a commit-unknown error, got {other:?}"),
    }

    let port = primary.port().to_string();
    let Some(replica) = RedisServer::start(&["--replicaof", "127.0.0.1", &port]) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !idem_testkit::redis::command("127.0.0.1", primary.port(), &["INFO", "replication"])
        .unwrap()
        .contains("state=online")
    {
        assert!(Instant::now() < deadline, "the replica did not come online");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waiting = RedisStore::builder(primary.url())
        .durability(Durability::replicas(1, Duration::from_secs(2)))
        .connect()
        .await
        .unwrap();
    let plain = RedisStore::connect(&primary.url()).await.unwrap();
    let mut figures = Vec::new();
    for (name, store) in [("primary only", &plain), ("WAIT 1 replica", &waiting)] {
        let started = Instant::now();
        for i in 0..200 {
            let k = key(&format!("{name}-{i}").replace(' ', "-"));
            let Claimed::Fresh(claim) = store.claim(&scope(), &k, fp()).await.unwrap() else {
                panic!("a new key is claimed")
            };
            store
                .complete(&claim, &Outcome::success("kept"))
                .await
                .unwrap();
        }
        figures.push((name, started.elapsed() / 200));
    }
    for (name, per_key) in &figures {
        eprintln!("claim + complete, {name}: {per_key:?} per key");
    }
    primary.kill();
    let on_replica = RedisStore::connect(&replica.url()).await.unwrap();
    for i in 0..200 {
        let k = key(&format!("WAIT-1-replica-{i}"));
        let record = on_replica.get(&scope(), &k).await.unwrap();
        assert_eq!(
            record.and_then(|r| r.outcome),
            Some(Outcome::success("kept")),
            "{k} was acknowledged after WAIT, so the replica has it"
        );
    }
}

/// Failed attempts count per key and are forgotten; dead letters are
/// recorded with increasing ids, listed, marked redriven, counted and swept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_and_dead_letters_are_kept_in_redis() {
    if !machine_redis_answers() {
        return;
    }
    let h = Redis::at(&redis_url(), "letters").await;
    let s = &h.store;
    let first = s
        .record_failure(&scope(), &key("m-1"), "boom")
        .await
        .unwrap();
    h.clock.advance(Duration::from_secs(1));
    let second = s
        .record_failure(&scope(), &key("m-1"), "boom")
        .await
        .unwrap();
    assert_eq!((first.count, second.count), (1, 2));
    assert_eq!(second.first_at, first.first_at);
    s.forget_failures(&scope(), &key("m-1")).await.unwrap();
    assert_eq!(
        s.record_failure(&scope(), &key("m-1"), "again")
            .await
            .unwrap()
            .count,
        1
    );
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(
        s.sweep_failures(h.clock.now().minus(Duration::from_secs(5)), 10)
            .await
            .unwrap(),
        1
    );

    let letter = |n: u32| NewDeadLetter {
        origin: "consumer amqp queue orders".into(),
        destination: "http://127.0.0.1:1/in".into(),
        key: key(&format!("m-{n}")),
        payload: vec![0, 1, 2, 255],
        headers: BTreeMap::from([("content-type".into(), "application/octet-stream".into())]),
        attempts: n,
        last_error: "HTTP 422".into(),
        first_seen_at: h.clock.now(),
    };
    let a = s.record_dead_letter(&letter(1)).await.unwrap();
    h.clock.advance(Duration::from_secs(60));
    let b = s.record_dead_letter(&letter(2)).await.unwrap();
    assert!(b > a);
    let got = s.get_dead_letter(a).await.unwrap().unwrap();
    assert_eq!(
        (got.key, got.payload, got.attempts, got.headers),
        (key("m-1"), vec![0, 1, 2, 255], 1, letter(1).headers)
    );
    s.mark_redriven(a).await.unwrap();
    assert!(s.mark_redriven(a + 100).await.is_err());
    let waiting = s.list_dead_letters(10, false).await.unwrap();
    assert_eq!(waiting.iter().map(|l| l.id).collect::<Vec<_>>(), [b]);
    assert_eq!(s.list_dead_letters(10, true).await.unwrap().len(), 2);
    let stats = s.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.redriven), (1, 1));
    assert_eq!(
        s.sweep_dead_letters(Duration::from_secs(30), 10)
            .await
            .unwrap(),
        1
    );
    assert!(s.get_dead_letter(a).await.unwrap().is_none());
    assert!(s.get_dead_letter(b).await.unwrap().is_some());
}

/// A store that cannot reach Redis says so, and what to do; a prefix with a
/// brace and a cluster URL in a build without the feature are refused before
/// connecting.
#[tokio::test]
async fn connection_and_setting_errors_say_what_to_do() {
    let refused = RedisStore::connect("redis://127.0.0.1:1/0")
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(
        matches!(&refused, Error::Store(e) if e.kind() == ErrorKind::Unavailable),
        "{text}"
    );
    assert!(text.contains("127.0.0.1:1"), "{text}");
    assert!(text.contains("check that it runs"), "{text}");
    let brace = RedisStore::builder(redis_url())
        .prefix("a{b")
        .connect()
        .await
        .unwrap_err();
    assert!(brace.to_string().contains("hash tag"), "{brace}");
    let tls = RedisStore::connect("rediss://127.0.0.1:6380")
        .await
        .unwrap_err();
    assert!(tls.to_string().contains("TLS"), "{tls}");
}
