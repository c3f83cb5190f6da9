//! The store on Redis Cluster: the leased conformance rows on the machine's
//! three-primary cluster (`scripts/services.sh` starts it), every record in
//! the slot of its hash tag, and a primary killed (`SIGKILL`) mid-run in a
//! private cluster with a replica per primary.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Claimed, Error, Fingerprint, IdempotencyKey, LeaseStore, ManualClock, Outcome, RecordFilter,
    RecordStore, Scope,
};
use idem_redis::redis::AsyncCommands as _;
use idem_redis::{Durability, RedisStore};
use idem_testkit::LeasedHarness;
use idem_testkit::redis::{RedisCluster, machine_cluster_answers, redis_cluster_url};

use common::Redis;

/// The store on the machine's cluster, under a prefix of its own.
struct Cluster(Redis);

impl LeasedHarness for Cluster {
    type Store = RedisStore;

    async fn fresh() -> Option<Self> {
        if !machine_cluster_answers() {
            return None;
        }
        let h = Redis::at(&redis_cluster_url(), "cluster").await;
        assert!(h.store.is_cluster());
        Some(Cluster(h))
    }

    async fn reopen(&self) -> Self {
        Cluster(self.0.reopen().await)
    }

    fn store(&self) -> &RedisStore {
        &self.0.store
    }

    fn clock(&self) -> &ManualClock {
        &self.0.clock
    }
}

mod conformance {
    idem_testkit::leased_conformance_suite!(super::Cluster);
}

fn scope() -> Scope {
    Scope::new("orders").unwrap()
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(name).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes(b"payload")
}

/// Keys spread over all three primaries, each record whole in the slot of
/// its `{scope:key}` tag (with its failed attempts), and listing finds the
/// records of every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_the_primaries_and_each_sits_in_its_tags_slot() {
    let Some(Cluster(h)) = Cluster::fresh().await else {
        return;
    };
    let s = &h.store;
    let mut slots = BTreeSet::new();
    for i in 0..60 {
        let k = key(&format!("spread-{i}"));
        let Claimed::Fresh(claim) = s.claim(&scope(), &k, fp()).await.unwrap() else {
            panic!("a new key is claimed")
        };
        s.complete(&claim, &Outcome::success("ok")).await.unwrap();
        idem_core::AttemptStore::record_failure(s, &scope(), &k, "boom")
            .await
            .unwrap();
        let mut conn = s.connection();
        let record = format!("{}rec:{}:{{orders:{k}}}", h.prefix.prefix, "orders".len());
        let attempts = format!("{}att:{}:{{orders:{k}}}", h.prefix.prefix, "orders".len());
        let tag: u16 = idem_redis::redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("orders:{k}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        for name in [&record, &attempts] {
            let slot: u16 = idem_redis::redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(name)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(slot, tag, "{name}");
            assert!(conn.exists::<_, bool>(name).await.unwrap(), "{name}");
        }
        slots.insert(tag / (16384 / 3 + 1));
    }
    assert_eq!(
        slots.len(),
        3,
        "the keys landed on every third of the slots"
    );
    let listed = s.list(&RecordFilter::default()).await.unwrap();
    assert_eq!(listed.len(), 60);
}

/// A private cluster of three primaries, each with a replica. A writer
/// claims and completes keys with `WAIT` for one replica while one primary
/// is killed: the cluster promotes its replica, the writer's calls to that
/// shard fail (no primary, then no replica to wait for) until the dead node
/// is back as the new primary's replica, and are retried; every completion
/// it was told of is replayed afterwards. A second writer without `WAIT` runs beside it; its
/// acknowledged completions lost in the failover are counted and printed
/// (Redis replicates asynchronously: without `WAIT` a primary can
/// acknowledge a write it never sent to its replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_mid_run_loses_no_completion_acknowledged_after_wait() {
    let Some(mut cluster) = RedisCluster::start(1) else {
        return;
    };
    let clock = ManualClock::starting_now();
    let open = |durability| {
        RedisStore::builder(cluster.url())
            .clock(Arc::new(clock.clone()))
            .durability(durability)
            .connect()
    };
    let waiting = open(Durability::replicas(1, Duration::from_secs(2)))
        .await
        .unwrap();
    let plain = open(Durability::Primary).await.unwrap();
    let writer = |store: RedisStore, name: &'static str| {
        let clock = clock.clone();
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut failed_calls = 0u32;
            for i in 0..400 {
                let k = key(&format!("{name}-{i}"));
                let started = Instant::now();
                loop {
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "{name}: {k} could not be settled for a minute"
                    );
                    match settle(&store, &k).await {
                        Ok(()) => break,
                        Err(Error::InFlight { .. }) => clock.advance(store.settings().lease),
                        Err(error) => {
                            assert!(error.is_retryable(), "{name}: {error}");
                            failed_calls += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                acknowledged.push(k);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (acknowledged, failed_calls)
        })
    };
    let with_wait = writer(waiting.clone(), "waited");
    let without = writer(plain.clone(), "plain");
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiting.count().await.unwrap().total < 100 {
        assert!(Instant::now() < deadline, "the writers made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let victim = cluster
        .ports()
        .iter()
        .position(|&port| cluster.role_of(port).as_deref() == Some("master"))
        .expect("a primary");
    let killed_at = waiting.count().await.unwrap().total;
    cluster.nodes()[victim].kill();
    // The cluster promotes the dead primary's replica; that shard then has
    // no replica, so writes waiting for one wait until the dead node is
    // back, as the new primary's replica.
    tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        let ports = cluster.ports();
        loop {
            let primaries = ports
                .iter()
                .enumerate()
                .filter(|&(i, &port)| {
                    i != victim && cluster.role_of(port).as_deref() == Some("master")
                })
                .count();
            if primaries == 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no replica took over within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster.nodes()[victim].restart();
    });
    let (waited, waited_failures) = with_wait.await.unwrap();
    let (plain_acknowledged, plain_failures) = without.await.unwrap();
    assert!(killed_at < 800, "the primary died while the writers ran");

    let mut lost_after_wait = Vec::new();
    for k in &waited {
        if !matches!(
            waiting.claim(&scope(), k, fp()).await,
            Ok(Claimed::Replayed(_))
        ) {
            lost_after_wait.push(k.clone());
        }
    }
    let mut lost_without_wait = 0;
    for k in &plain_acknowledged {
        if !matches!(
            plain.claim(&scope(), k, fp()).await,
            Ok(Claimed::Replayed(_))
        ) {
            lost_without_wait += 1;
        }
    }
    eprintln!(
        "primary killed with {killed_at} records stored; with WAIT: {} acknowledged, {} lost, {waited_failures} failed calls retried; without WAIT: {} acknowledged, {lost_without_wait} lost, {plain_failures} failed calls retried",
        waited.len(),
        lost_after_wait.len(),
        plain_acknowledged.len(),
    );
    assert_eq!(
        cluster.role_of(cluster.ports()[victim]).as_deref(),
        Some("slave"),
        "the killed primary's replica took over, and the node came back as its replica"
    );
    assert_eq!(
        lost_after_wait,
        Vec::<IdempotencyKey>::new(),
        "completions acknowledged after WAIT survive the failover"
    );
}

/// Claims and completes `k` (a replay counts as done).
async fn settle(store: &RedisStore, k: &IdempotencyKey) -> Result<(), Error> {
    match store.claim(&scope(), k, fp()).await? {
        Claimed::Fresh(claim) => {
            store
                .complete(&claim, &Outcome::success(k.as_str().to_owned()))
                .await
        }
        Claimed::Replayed(_) => Ok(()),
    }
}
