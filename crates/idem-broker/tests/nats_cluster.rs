//! NATS JetStream as production runs it: three servers routed into one
//! cluster, a stream replicated on all three (R3), clients given every
//! server's address (`nats://n0,n1,n2/...`), and one node killed with
//! SIGKILL under load, then restarted.
//!
//! - A consumer loses the node it is connected to; another consumer loses
//!   the stream's leader. Every published message's effect is applied
//!   exactly once (counted in the store's database, per message id: none
//!   missing, none twice), and every message whose publish JetStream
//!   acknowledged is among them.
//! - The relay publishes outbox rows while the stream's leader dies: every
//!   row is in the stream once (JetStream drops a republished row by its
//!   `Nats-Msg-Id`).
//!
//! Each test starts a cluster of its own ([`idem_testkit::nats_cluster`]),
//! so a node killed in one is never under another.

mod cluster_support;
mod consumer_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use cluster_support::{OutboxRelay, Tally, assert_each_applied_once, keys, quick};
use consumer_support::{Bank, PgBank, Running, SqliteBank, config};
use idem_broker::consume::{Consumer, KeyRule, KeySource, Source, SourceOptions, Stats};
use idem_broker::outbox::OutboxStore;
use idem_broker::publish::Destination;
use idem_testkit::nats_cluster::{NODES, NatsCluster};

/// Messages published per run.
const MESSAGES: usize = 600;
/// The pause between two publishes: the load runs about three seconds.
const PACE: Duration = Duration::from_millis(5);
/// How long the killed node stays down.
const DOWN_FOR: Duration = Duration::from_secs(3);
/// The durable consumer.
const WORKER: &str = "worker";
/// The name of the tests' publishing client, told apart from the consumer
/// in the nodes' connection lists.
const PUBLISHER: &str = "idem-test-publisher";

/// Which node dies.
#[derive(Debug, Clone, Copy)]
enum Victim {
    /// The node the consumer is connected to.
    ConsumerNode,
    /// The stream's RAFT leader.
    StreamLeader,
}

/// The node the consumer is connected to is killed and comes back later:
/// the consumer reconnects to another server of its list, its durable
/// consumer (replicated) goes on where it was, the messages it had not
/// acked are redelivered and suppressed. One effect per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_outlives_the_loss_of_its_node_on_sqlite() {
    consumes_across_a_node_loss::<SqliteBank>(Victim::ConsumerNode).await
}

/// The stream's leader is killed: publishes and acks wait for the election
/// of a new one; one effect per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_outlives_the_loss_of_the_stream_leader_on_postgres() {
    consumes_across_a_node_loss::<PgBank>(Victim::StreamLeader).await
}

/// A stream replicated on every node, keeping messages a day.
async fn r3_stream(js: &jetstream::Context, name: &str, subject: &str) {
    js.create_stream(stream::Config {
        name: name.into(),
        subjects: vec![subject.into()],
        num_replicas: NODES,
        max_age: Duration::from_secs(24 * 3600),
        ..stream::Config::default()
    })
    .await
    .expect("create the R3 stream");
}

/// What the publisher saw.
#[derive(Debug, Default)]
struct Published {
    /// Publishes JetStream acknowledged (each message once, at last).
    acked: usize,
    /// Attempts that failed or timed out and were made again.
    retried: u64,
    /// The longest stretch one message waited for its ack.
    longest_wait: Duration,
}

/// Publishes `m-0` … `m-{count-1}` with `Nats-Msg-Id` and `Idem-Key` set to
/// the id, one every `PACE`, each tried again until JetStream acknowledges
/// it: a repeat of an id the stream already holds is dropped by the stream.
async fn publish_all(
    js: jetstream::Context,
    subject: String,
    retried: Arc<AtomicU64>,
) -> Published {
    let mut published = Published::default();
    let mut pace = tokio::time::interval(PACE);
    for i in 0..MESSAGES {
        pace.tick().await;
        let id = format!("m-{i}");
        let started = Instant::now();
        loop {
            let mut headers = HeaderMap::new();
            headers.insert("Nats-Msg-Id", id.as_str());
            headers.insert("Idem-Key", id.as_str());
            headers.insert("Content-Type", "application/json");
            let attempt = async {
                js.publish_with_headers(subject.clone(), headers, r#"{"amount": 1}"#.into())
                    .await?
                    .await
            };
            match attempt.await {
                Ok(_ack) => break,
                Err(_) => {
                    retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        published.acked += 1;
        published.longest_wait = published.longest_wait.max(started.elapsed());
    }
    published.retried = retried.load(Ordering::Relaxed);
    published
}

/// The node holding the consumer's connection: the one unnamed Rust client
/// (the tests' own clients have names).
async fn consumer_node(cluster: &NatsCluster) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for node in (0..NODES).filter(|&node| cluster.is_running(node)) {
            let connections = cluster.connections(node).await;
            if connections
                .iter()
                .any(|c| c.name.is_empty() && c.lang == "rust")
            {
                return node;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no node reports the consumer's connection"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The longest stretch without a new effect, from now until `total`
/// effects: how long the kill held the pipeline (publisher, stream,
/// consumer) up.
async fn longest_stall(stats: Arc<Stats>, total: u64) -> Duration {
    let mut last = stats.snapshot().applied;
    let mut since = Instant::now();
    let mut longest = Duration::ZERO;
    while last < total && since.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = stats.snapshot().applied;
        if now > last {
            longest = longest.max(since.elapsed());
            (last, since) = (now, Instant::now());
        }
    }
    longest
}

/// Waits until the durable consumer has nothing pending and nothing
/// unacknowledged: every message was handed out and settled.
async fn until_settled(js: &jetstream::Context, stream: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(found) = js.get_stream(stream).await
            && let Ok(info) = found.consumer_info(WORKER).await
            && info.num_pending == 0
            && info.num_ack_pending == 0
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the consumer did not settle everything within a minute"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn consumes_across_a_node_loss<K: Bank>(victim: Victim) {
    let began = Instant::now();
    let Some(mut cluster) = NatsCluster::start().await else {
        return;
    };
    let Some(bank) = K::start().await else {
        return;
    };
    let cluster_up = began.elapsed();
    let js = jetstream::new(cluster.client_named(PUBLISHER).await);
    let (stream, subject) = ("ORDERS", "orders.created");
    r3_stream(&js, stream, subject).await;

    // The consumer is given every server, as `idem forward --from` would be.
    let source: Source = format!("{}/{stream}/{WORKER}", cluster.url())
        .parse()
        .expect("a NATS source with three servers");
    let options = SourceOptions {
        prefetch: 64,
        ack_wait: Duration::from_secs(2),
        ..SourceOptions::default()
    };
    let transport = source
        .connect_reconnecting(options, quick())
        .await
        .expect("consume the R3 stream");
    let consumer = Consumer::new(
        transport,
        bank.apply(false),
        config(KeyRule::new(KeySource::Header("Idem-Key".into()))),
    );
    let stats = consumer.stats();
    let running = Running::start(stats.clone(), |stop| consumer.run(stop));

    let retried = Arc::new(AtomicU64::new(0));
    let publishing = tokio::spawn(publish_all(js.clone(), subject.into(), retried.clone()));
    let before = running
        .until("a fifth applied", |s| s.applied >= (MESSAGES / 5) as u64)
        .await;

    let consumer_on = consumer_node(&cluster).await;
    let consumer_leader = cluster.consumer_leader(stream, WORKER).await;
    let leader = cluster
        .stream_leader(stream)
        .await
        .expect("a stream leader");
    let killed = match victim {
        Victim::ConsumerNode => consumer_on,
        Victim::StreamLeader => leader,
    };
    let stall = tokio::spawn(longest_stall(stats.clone(), MESSAGES as u64));
    let killed_at = Instant::now();
    cluster.kill(killed);
    let (new_leader, leader_after) = if killed == leader {
        let (new, after) = cluster.await_stream_leader(stream, Some(killed)).await;
        (new, Some(after))
    } else {
        (leader, None)
    };
    let down = DOWN_FOR.saturating_sub(killed_at.elapsed());
    tokio::time::sleep(down).await;
    // While its server is down, the consumer's connection turns up on a
    // survivor of its list (`consumer_node` looks only at running servers,
    // and fails if none reports it). Once the server is back, the client
    // may as well return to it, so this is checked before the restart.
    if matches!(victim, Victim::ConsumerNode) {
        let moved_to = consumer_node(&cluster).await;
        assert_ne!(
            moved_to, killed,
            "the consumer reconnected to another server of its list"
        );
    }
    let healthy_after_restart = cluster.restart(killed).await;

    let published = publishing.await.expect("the publisher");
    running
        .until("every message applied", |s| s.applied >= MESSAGES as u64)
        .await;
    let stall = stall.await.expect("the stall meter");
    until_settled(&js, stream).await;
    let consumer_after = consumer_node(&cluster).await;
    let stats = running.stop().await;

    // Effects per message id, from the store's database.
    assert_eq!(published.acked, MESSAGES, "{published:?}");
    assert_each_applied_once(&bank, &stats, "m", MESSAGES, "acknowledged").await;

    eprintln!(
        "nats cluster, {victim:?} on {store}: {MESSAGES} published ({retried} publish attempts again, \
         longest wait for an ack {wait:?}), {applied} effects, {replayed} redeliveries suppressed; \
         consumer connected to n{consumer_on} (then n{consumer_after}), led by {consumer_leader:?}, stream leader n{leader}; killed n{killed} after {before_applied} effects; \
         new leader n{new_leader} after {leader_after:?}; longest stretch without a new effect {stall:?}; \
         n{killed} healthy {healthy_after_restart:?} after its restart; \
         cluster up in {cluster_up:?}, test {total:?}",
        store = K::NAME,
        retried = published.retried,
        wait = published.longest_wait,
        applied = stats.applied,
        replayed = stats.replayed,
        before_applied = before.applied,
        total = began.elapsed(),
    );
}

/// The relay publishes outbox rows to the R3 stream through the cluster's
/// server list while the stream's leader is killed: publishes time out or
/// find no responder during the election and are tried again; every row
/// ends up in the stream once (JetStream drops a repeat of its
/// `Nats-Msg-Id`), none is dead-lettered, and the outbox has no row left.
/// The rows that failed during the election drain at the pace of the
/// relay's retry budget (10 retries a second beyond 10 % of first
/// attempts), which is most of this test's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_every_row_once_while_the_stream_leader_dies() {
    let began = Instant::now();
    let Some(mut cluster) = NatsCluster::start().await else {
        return;
    };
    let js = jetstream::new(cluster.client_named(PUBLISHER).await);
    let (stream, subject) = ("EVENTS", "events.created");
    r3_stream(&js, stream, subject).await;
    let to: Destination = format!("{}/{subject}", cluster.url())
        .parse()
        .expect("a NATS destination with three servers");

    let relay = OutboxRelay::start(Duration::from_secs(2)).await;
    let enqueueing = relay.enqueue_all(&to, keys("row", MESSAGES), PACE, |key| {
        key.as_bytes().to_vec()
    });
    let in_stream = async || -> u64 {
        match js.get_stream(stream).await {
            Ok(mut found) => found.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while in_stream().await < (MESSAGES / 5) as u64 {
        assert!(
            Instant::now() < deadline,
            "the relay did not start publishing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let leader = cluster
        .stream_leader(stream)
        .await
        .expect("a stream leader");
    let stored_at_kill = in_stream().await;
    let killed_at = Instant::now();
    cluster.kill(leader);
    let (new_leader, leader_after) = cluster.await_stream_leader(stream, Some(leader)).await;
    while in_stream().await <= stored_at_kill {
        assert!(
            killed_at.elapsed() < Duration::from_secs(60),
            "nothing stored for a minute after the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stored_again = killed_at.elapsed();
    tokio::time::sleep(DOWN_FOR.saturating_sub(killed_at.elapsed())).await;
    let healthy_after_restart = cluster.restart(leader).await;
    enqueueing.await.expect("enqueue every row");

    relay.until_sent(MESSAGES).await;
    let drained_after_kill = killed_at.elapsed();
    let (store, _dir) = relay.stop().await;
    // The rows the kill made the relay publish more than once: a timed-out
    // publish may have been stored, so the stream may have seen them twice.
    let sends = store
        .recent_sends(2 * MESSAGES)
        .await
        .expect("the sent rows");
    assert_eq!(sends.len(), MESSAGES, "each row marked sent once");
    let published_again = sends.iter().filter(|sent| sent.attempts > 1).count();
    assert!(
        published_again > 0,
        "no row needed a second attempt: the kill did not reach the relay's publishes"
    );

    // The stream, read message by message: each row's key once.
    let mut found = js.get_stream(stream).await.expect("the stream");
    let state = found.info().await.expect("stream info").state.clone();
    let mut ids = Vec::new();
    for sequence in state.first_sequence..=state.last_sequence {
        let message = found
            .get_raw_message(sequence)
            .await
            .expect("read a stored message");
        let id = message
            .headers
            .get("Nats-Msg-Id")
            .map(|v| v.as_str().to_owned())
            .expect("every message carries its key as Nats-Msg-Id");
        ids.push(id);
    }
    let Tally { missing, twice, .. } = Tally::of(ids, keys("row", MESSAGES));
    assert!(missing.is_empty(), "rows not in the stream: {missing:?}");
    assert!(twice.is_empty(), "rows in the stream twice: {twice:?}");
    assert_eq!(state.messages, MESSAGES as u64, "{state:?}");

    eprintln!(
        "nats cluster, relay: {MESSAGES} rows ({published_again} published more than once), {stored} in \
         the stream, none twice; leader n{leader} killed \
         after {stored_at_kill} rows stored, new leader n{new_leader} after {leader_after:?}, rows stored \
         again after {stored_again:?}; n{leader} healthy {healthy_after_restart:?} after \
         its restart; outbox empty {drained_after_kill:?} after the kill; test {total:?}",
        stored = state.messages,
        total = began.elapsed(),
    );
}
