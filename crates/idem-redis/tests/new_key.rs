//! What a new key costs on the wire, and that records written by the earlier
//! scripts (`tests/previous/*.lua`) are read, claimed and replayed as before.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use idem_core::{
    Claimed, Error, FencingToken, Fingerprint, IdempotencyKey, LeaseStore, ManualClock, Outcome,
    RULE_MARK, RecordState, RecordStore, Scope, Settings,
};
use idem_redis::RedisStore;
use idem_redis::redis::{self, Script};
use idem_testkit::redis::{RedisServer, machine_redis_answers, redis_url};

use common::Redis;

fn scope() -> Scope {
    Scope::new("orders").unwrap()
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(name).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes(b"payload")
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}

/// The Redis key of a record, as the store names it.
fn record_name(prefix: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    let scope = scope.as_str();
    format!("{prefix}rec:{}:{{{scope}:{key}}}", scope.len())
}

/// `INFO commandstats` as `command -> calls`, leaving out `CONFIG` and `INFO`.
async fn command_calls(conn: &mut idem_redis::Connection) -> BTreeMap<String, u64> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    text.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| !name.starts_with("config") && name != "info")
        .collect()
}

async fn reset_stats(conn: &mut idem_redis::Connection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .unwrap();
}

async fn connections_received(conn: &mut idem_redis::Connection) -> u64 {
    let text: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// On a private server, a new key's claim is one `EVALSHA` (inside it
/// `HMGET`, `HSET`, `PEXPIRE`) and its completion one more (`HMGET`,
/// `HSET`): no `EVAL`, no `SCRIPT LOAD`, no `DEL`, no read of its own. Many
/// new keys at once share the store's one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_costs_one_script_call_for_its_claim_and_one_for_its_completion() {
    let Some(server) = RedisServer::start(&[]) else {
        return;
    };
    let store = RedisStore::builder(server.url()).connect().await.unwrap();
    let mut conn = store.connection();
    let new_key = async |name: &str| {
        let Claimed::Fresh(claim) = store.claim(&scope(), &key(name), fp()).await.unwrap() else {
            panic!("{name} is a new key")
        };
        store
            .complete(&claim, &Outcome::success("sent"))
            .await
            .unwrap();
    };
    // The first calls on a fresh server load the scripts (NOSCRIPT, then
    // SCRIPT LOAD, then EVALSHA again); later ones find them.
    new_key("first").await;
    reset_stats(&mut conn).await;
    new_key("second").await;
    let calls = command_calls(&mut conn).await;
    let expected: BTreeMap<String, u64> =
        [("evalsha", 2), ("hmget", 2), ("hset", 2), ("pexpire", 1)]
            .into_iter()
            .map(|(name, calls)| (name.to_owned(), calls))
            .collect();
    assert_eq!(calls, expected, "what one new key sent");

    let before = connections_received(&mut conn).await;
    reset_stats(&mut conn).await;
    let racers = (0..64).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let key = key(&format!("many-{i}"));
            let Claimed::Fresh(claim) = store.claim(&scope(), &key, fp()).await.unwrap() else {
                panic!("a new key")
            };
            store.complete(&claim, &Outcome::success("sent")).await
        })
    });
    for done in futures::future::join_all(racers).await {
        done.unwrap().unwrap();
    }
    assert_eq!(command_calls(&mut conn).await["evalsha"], 128);
    assert_eq!(
        connections_received(&mut conn).await,
        before,
        "64 keys at once opened no connection"
    );
}

/// The earlier claim script, run as the earlier store ran it.
async fn earlier_claim(store: &RedisStore, name: &str, fingerprint: Fingerprint) -> Vec<Vec<u8>> {
    let settings: &Settings = store.settings();
    let now = store.clock().now();
    Script::new(include_str!("previous/claim.lua"))
        .key(record_name(store.prefix(), &scope(), &key(name)))
        .arg(scope().as_str())
        .arg(name)
        .arg(fingerprint.as_bytes().as_slice())
        .arg(now.0)
        .arg(FencingToken::first_at(now).get())
        .arg(millis(settings.lease))
        .arg(millis(settings.retention))
        .arg(millis(settings.in_flight_retry_after))
        .arg(RULE_MARK.as_slice())
        .arg(settings.tombstones.map_or(0, millis))
        .invoke_async(&mut store.connection())
        .await
        .unwrap()
}

/// The earlier change script settling a claim of the earlier claim script.
async fn earlier_settle(store: &RedisStore, name: &str, token: &[u8], outcome: &Outcome) {
    let reply: Vec<Vec<u8>> = Script::new(include_str!("previous/change_held.lua"))
        .key(record_name(store.prefix(), &scope(), &key(name)))
        .arg(token)
        .arg(store.clock().now().0)
        .arg("settle")
        .arg(RecordState::settled_by(outcome.kind).as_str())
        .arg(outcome.kind.as_str())
        .arg(outcome.body.as_slice())
        .arg(outcome.meta_json())
        .invoke_async(&mut store.connection())
        .await
        .unwrap();
    assert_eq!(reply, [b"held".to_vec()]);
}

/// A new key's record holds the same fields and time to live as the
/// earlier claim script wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_keys_record_is_the_one_the_earlier_script_wrote() {
    if !machine_redis_answers() {
        return;
    }
    let redis = Redis::at(&redis_url(), "same-record").await;
    let store = &redis.store;
    let reply = earlier_claim(store, "k", fp()).await;
    assert_eq!(reply[0], b"claimed");
    let Claimed::Fresh(claim) = store.claim(&scope(), &key("k2"), fp()).await.unwrap() else {
        panic!("k2 is a new key")
    };
    assert_eq!(
        claim.token.get().to_string().as_bytes(),
        reply[1].as_slice()
    );
    assert_eq!(
        claim.lease_until.0.to_string().as_bytes(),
        reply[2].as_slice()
    );
    assert_eq!(
        claim.expires_at.0.to_string().as_bytes(),
        reply[4].as_slice()
    );
    assert!(!claim.took_over);
    let mut conn = store.connection();
    let hash = |name: &str| {
        redis::cmd("HGETALL")
            .arg(record_name(store.prefix(), &scope(), &key(name)))
            .clone()
    };
    let mut earlier: BTreeMap<String, Vec<u8>> = hash("k").query_async(&mut conn).await.unwrap();
    let mut now: BTreeMap<String, Vec<u8>> = hash("k2").query_async(&mut conn).await.unwrap();
    assert_eq!(earlier.remove("key").unwrap(), b"k");
    assert_eq!(now.remove("key").unwrap(), b"k2");
    assert_eq!(now, earlier);
    let ttl = |name: &str| {
        redis::cmd("PTTL")
            .arg(record_name(store.prefix(), &scope(), &key(name)))
            .clone()
    };
    let earlier: i64 = ttl("k").query_async(&mut conn).await.unwrap();
    let now: i64 = ttl("k2").query_async(&mut conn).await.unwrap();
    let retention = millis(store.settings().retention);
    for pttl in [earlier, now] {
        assert!(
            (retention - 60_000..=retention).contains(&pttl),
            "{pttl} ms to live"
        );
    }
}

/// Records the earlier scripts wrote: a settled one is replayed, an
/// in-flight one refused while its lease runs and taken over after it, and
/// one past its window claimed anew with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_earlier_scripts_wrote_are_claimed_and_replayed() {
    if !machine_redis_answers() {
        return;
    }
    let redis = Redis::at(&redis_url(), "earlier-records").await;
    let (store, clock): (&RedisStore, &ManualClock) = (&redis.store, &redis.clock);
    let outcome = Outcome::success("sent");

    let settled = earlier_claim(store, "settled", fp()).await;
    earlier_settle(store, "settled", &settled[1], &outcome).await;
    let old = earlier_claim(store, "old", fp()).await;
    earlier_settle(store, "old", &old[1], &outcome).await;
    let held = earlier_claim(store, "held", fp()).await;
    assert_eq!(held[0], b"claimed");

    let replayed = store.claim(&scope(), &key("settled"), fp()).await.unwrap();
    assert_eq!(
        replayed.replayed(),
        Some(&outcome),
        "a replay of the earlier completion"
    );
    assert!(matches!(
        store
            .claim(&scope(), &key("settled"), Fingerprint::of_bytes(b"other"))
            .await,
        Err(Error::KeyReuse { .. })
    ));
    let record = store.get(&scope(), &key("settled")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::settled_by(outcome.kind));
    assert_eq!(record.outcome, Some(outcome.clone()));

    assert!(matches!(
        store.claim(&scope(), &key("held"), fp()).await,
        Err(Error::InFlight { .. })
    ));
    clock.advance(store.settings().lease + Duration::from_millis(1));
    let Claimed::Fresh(taken) = store.claim(&scope(), &key("held"), fp()).await.unwrap() else {
        panic!("the earlier claim's lease ran out")
    };
    assert!(taken.took_over);
    assert_eq!(taken.token.get().to_string().as_bytes(), {
        let earlier: i64 = std::str::from_utf8(&held[1]).unwrap().parse().unwrap();
        (earlier + 1).to_string().into_bytes()
    });
    store.complete(&taken, &outcome).await.unwrap();
    assert!(
        store
            .claim(&scope(), &key("held"), fp())
            .await
            .unwrap()
            .replayed()
            .is_some()
    );

    // Past the earlier record's window by the application's clock (Redis
    // keeps it: its time to live runs by the server's clock).
    clock.advance(store.settings().retention);
    let Claimed::Fresh(anew) = store.claim(&scope(), &key("old"), fp()).await.unwrap() else {
        panic!("a key past its window is claimed anew")
    };
    let earlier: i64 = std::str::from_utf8(&old[1]).unwrap().parse().unwrap();
    assert!(anew.token.get() > earlier);
    let record = store.get(&scope(), &key("old")).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.outcome),
        (RecordState::InFlight, None)
    );
}
