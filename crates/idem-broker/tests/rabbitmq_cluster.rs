//! RabbitMQ as production runs it: three nodes in one cluster, a quorum
//! queue replicated on all three, clients given every node's address
//! (`amqp://r0,r1,r2/...`), publishers waiting for confirms, and one node
//! killed with SIGKILL under load, then restarted.
//!
//! - A consumer loses the node it is connected to; another loses the
//!   queue's leader. Every message whose publish RabbitMQ confirmed has its
//!   effect applied exactly once (counted in the store's database, per
//!   message id: none missing, none twice).
//! - The relay publishes outbox rows to the quorum queue while the node it
//!   is connected to, which also leads the queue, dies: every row arrives
//!   and its effect is applied once (a row published again after a lost
//!   confirm arrives twice, and the consumer suppresses the second by its
//!   message id).
//!
//! The tests of this binary take turns on one cluster
//! ([`RabbitCluster::shared`]): it starts once, and a node one test kills
//! is running again before the next test begins.

mod cluster_support;
mod consumer_support;

use std::time::{Duration, Instant};

use cluster_support::{OutboxRelay, assert_each_applied_once, keys, quick};
use consumer_support::{Bank, PgBank, Running, SqliteBank, config, suffix};
use idem::IdempotencyKey;
use idem_broker::consume::{Consumer, KeyRule, KeySource, Source, SourceOptions};
use idem_broker::outbox::OutboxStore;
use idem_broker::publish::{AmqpPublisher, Destination, Message, Publish};
use idem_testkit::rabbitmq_cluster::RabbitCluster;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

/// Messages published per run.
const MESSAGES: usize = 1000;
/// The pause between two publishes: the load runs about five seconds, and
/// the kill comes after a fifth of it.
const PACE: Duration = Duration::from_millis(5);
/// Effects counted past the kill before the consumer counts as applying
/// again: more than the deliveries it can hold unacked (the prefetch, 64),
/// whose effects may still complete after the kill.
const AFTER_THE_KILL: u64 = 120;
/// How long the killed node stays down.
const DOWN_FOR: Duration = Duration::from_secs(3);
/// How long one publish may wait for its confirm before it is made again.
const CONFIRM_WITHIN: Duration = Duration::from_secs(10);
/// Every message's payload: an order of 1 for the bank.
const ORDER: &[u8] = br#"{"amount": 1}"#;

/// Which node dies.
#[derive(Debug, Clone, Copy)]
enum Victim {
    /// The node the consumer is connected to.
    ConsumerNode,
    /// The quorum queue's leader.
    QueueLeader,
}

/// The node the consumer is connected to is killed and comes back later:
/// the consumer connects to the next node of its list, the deliveries it
/// had not acked go back to the queue and are redelivered, and the
/// redeliveries of messages already applied are suppressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_outlives_the_loss_of_its_node_on_sqlite() {
    consumes_across_a_node_loss::<SqliteBank>(Victim::ConsumerNode).await
}

/// The quorum queue's leader is killed: the remaining two elect another,
/// confirms and deliveries wait for it; one effect per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_outlives_the_loss_of_the_queue_leader_on_postgres() {
    consumes_across_a_node_loss::<PgBank>(Victim::QueueLeader).await
}

/// Declares durable quorum queue `queue` on all three nodes through node
/// `through`, which becomes its first leader (RabbitMQ places a new queue's
/// leader on the node the declaring client is connected to).
async fn quorum_queue(cluster: &RabbitCluster, through: usize, queue: &str) {
    let connection =
        Connection::connect(&cluster.url_in(&[through]), ConnectionProperties::default())
            .await
            .expect("connect to a node of the cluster");
    let channel = connection.create_channel().await.expect("a channel");
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert(
        "x-quorum-initial-group-size".into(),
        AMQPValue::LongInt(idem_testkit::rabbitmq_cluster::NODES as i32),
    );
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .expect("declare the quorum queue");
    let _ = connection.close(200, "declared".into()).await;
}

/// What the publisher saw.
#[derive(Debug, Default)]
struct Published {
    /// Messages RabbitMQ confirmed (each once, at last).
    confirmed: usize,
    /// Attempts that failed or were not confirmed in time, made again.
    retried: u64,
    /// The longest stretch one message waited for its confirm.
    longest_wait: Duration,
}

/// Publishes `m-0` … `m-{count-1}` (message id = the id) through the
/// product's publisher (persistent, mandatory, confirms; a lost connection
/// made again through the node list on the next publish), one every
/// `PACE`, each tried again until RabbitMQ confirms it. A message whose
/// confirm was lost may be in the queue twice.
async fn publish_all(to: Destination) -> Published {
    let publisher = AmqpPublisher::connect(&to)
        .await
        .expect("connect the publisher");
    let mut published = Published::default();
    let mut pace = tokio::time::interval(PACE);
    for i in 0..MESSAGES {
        pace.tick().await;
        let id = format!("m-{i}");
        let message = Message::new(IdempotencyKey::new(&id).unwrap(), ORDER.to_vec());
        let started = Instant::now();
        loop {
            match tokio::time::timeout(CONFIRM_WITHIN, publisher.publish(&message)).await {
                Ok(Ok(())) => break,
                Ok(Err(_)) | Err(_) => {
                    published.retried += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        published.confirmed += 1;
        published.longest_wait = published.longest_wait.max(started.elapsed());
    }
    published
}

/// Waits until the queue holds nothing, ready or unacknowledged.
async fn until_drained(cluster: &RabbitCluster, queue: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while cluster.queue_messages(queue).await != Some(0) {
        assert!(
            Instant::now() < deadline,
            "queue {queue} still holds messages a minute on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node names of `cluster` without their host (`rabbit-0`, …).
fn short_name(cluster: &RabbitCluster, node: usize) -> String {
    cluster
        .name(node)
        .split('@')
        .next()
        .unwrap_or("")
        .to_owned()
}

/// Starts a consumer of the quorum queue `source` names, keyed by message
/// id, applying to `bank`, reconnecting quickly through the node list.
async fn consume<K: Bank>(bank: &K, source: Source, options: SourceOptions) -> Running {
    let transport = source
        .connect_reconnecting(options, quick())
        .await
        .expect("consume the quorum queue");
    let consumer = Consumer::new(
        transport,
        bank.apply(false),
        config(KeyRule::new(KeySource::MessageId)),
    );
    Running::start(consumer.stats(), |stop| consumer.run(stop))
}

async fn consumes_across_a_node_loss<K: Bank>(victim: Victim) {
    let began = Instant::now();
    let Some(mut cluster) = RabbitCluster::shared().await else {
        return;
    };
    let Some(bank) = K::start().await else {
        return;
    };
    let cluster_up = began.elapsed();
    let queue = format!("idem-cluster-{}", suffix());
    // The leader on node 1, the consumer on node 0 (first in its list), the
    // publisher on node 2 (first in its list): each victim is a different
    // node from the others' first choice.
    quorum_queue(&cluster, 1, &queue).await;

    let source: Source = format!("{}/{queue}", cluster.url())
        .parse()
        .expect("an AMQP source with three nodes");
    let running = consume(
        &bank,
        source,
        SourceOptions {
            prefetch: 64,
            ..SourceOptions::default()
        },
    )
    .await;
    let consumer_on = cluster
        .connection_node(&format!("idem consumer of {queue}"))
        .await
        .expect("a node lists the consumer's connection");
    let leader = cluster.queue_leader(&queue).await.expect("a queue leader");
    let killed = match victim {
        Victim::ConsumerNode => consumer_on,
        Victim::QueueLeader => leader,
    };

    let to: Destination = format!("{}?queue={queue}", cluster.url_in(&[2, 0, 1]))
        .parse()
        .expect("an AMQP destination with three nodes");
    let publishing = tokio::spawn(publish_all(to));
    let before = running
        .until("a fifth applied", |s| s.applied >= (MESSAGES / 5) as u64)
        .await;
    let killed_at = Instant::now();
    cluster.kill(killed);
    let (new_leader, leader_after) = if killed == leader {
        let (new, after) = cluster.await_queue_leader(&queue, Some(killed)).await;
        (new, Some(after))
    } else {
        (leader, None)
    };
    let resumed = running
        .until("applying again after the kill", |s| {
            s.applied >= before.applied + AFTER_THE_KILL || s.applied >= MESSAGES as u64
        })
        .await;
    let applying_again = killed_at.elapsed();
    tokio::time::sleep(DOWN_FOR.saturating_sub(killed_at.elapsed())).await;
    let running_after_restart = cluster.restart(killed).await;

    let published = publishing.await.expect("the publisher");
    running
        .until("every message applied", |s| s.applied >= MESSAGES as u64)
        .await;
    until_drained(&cluster, &queue).await;
    let stats = running.stop().await;

    assert_eq!(published.confirmed, MESSAGES, "{published:?}");
    assert_each_applied_once(&bank, &stats, "m", MESSAGES, "confirmed").await;

    let name = |node: usize| short_name(&cluster, node);
    eprintln!(
        "rabbitmq cluster, {victim:?} on {store}: {MESSAGES} confirmed ({retried} publishes made again, \
         longest wait for a confirm {wait:?}), {applied} effects, {replayed} redeliveries suppressed; \
         consumer on {consumer_on}, leader {leader}; killed {killed_name} after {before_applied} effects; \
         new leader {new_leader} after {leader_after:?}; effects again {applying_again:?} after the kill \
         ({resumed_applied} by then); {killed_name} running {running_after_restart:?} after its restart; \
         cluster ready in {cluster_up:?} (started in {started:?}), test {total:?}",
        store = K::NAME,
        retried = published.retried,
        wait = published.longest_wait,
        applied = stats.applied,
        replayed = stats.replayed,
        consumer_on = name(consumer_on),
        leader = name(leader),
        killed_name = name(killed),
        new_leader = name(new_leader),
        before_applied = before.applied,
        resumed_applied = resumed.applied,
        started = cluster.started_in(),
        total = began.elapsed(),
    );
}

/// The relay publishes outbox rows to the quorum queue through the node
/// list; the node it is connected to, which leads the queue, is killed.
/// Publishes in flight lose their confirms and are made again on the next
/// node once the queue has a new leader; every row is sent, none is
/// dead-lettered, and a consumer applies each row's effect exactly once,
/// suppressing the copies a lost confirm left in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_delivers_every_row_while_its_node_and_the_queue_leader_die() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let began = Instant::now();
    let Some(mut cluster) = RabbitCluster::shared().await else {
        return;
    };
    let Some(bank) = SqliteBank::start().await else {
        return;
    };
    let queue = format!("idem-relay-{}", suffix());
    quorum_queue(&cluster, 0, &queue).await;
    let leader = cluster.queue_leader(&queue).await.expect("a queue leader");
    // The relay connects to node 0 first; the consumer to node 2.
    let to: Destination = format!("{}?queue={queue}", cluster.url())
        .parse()
        .expect("an AMQP destination with three nodes");
    let source: Source = format!("{}/{queue}", cluster.url_in(&[2, 1, 0]))
        .parse()
        .expect("an AMQP source with three nodes");
    let running = consume(&bank, source, SourceOptions::default()).await;

    let relay = OutboxRelay::start(Duration::from_secs(5)).await;
    let enqueueing = relay.enqueue_all(&to, keys("row", MESSAGES), PACE, |_| ORDER.to_vec());
    let before = running
        .until("a fifth applied", |s| s.applied >= (MESSAGES / 5) as u64)
        .await;
    let killed = 0;
    let killed_at = Instant::now();
    cluster.kill(killed);
    let (new_leader, leader_after) = if leader == killed {
        let (new, after) = cluster.await_queue_leader(&queue, Some(killed)).await;
        (new, Some(after))
    } else {
        (leader, None)
    };
    // Where rows stand when they stop arriving: in the outbox, or in the
    // queue.
    loop {
        let now = running.until("a look at the counters", |_| true).await;
        if now.applied >= before.applied + AFTER_THE_KILL || now.applied >= MESSAGES as u64 {
            break;
        }
        if killed_at.elapsed() > Duration::from_secs(60) {
            panic!(
                "no effects a minute after the kill: {now:?}; outbox {:?}; queue holds {:?}; leader {:?}; consumer on {:?}",
                relay.store.outbox_stats().await,
                cluster.queue_messages(&queue).await,
                cluster.queue_leader(&queue).await,
                cluster
                    .connection_node(&format!("idem consumer of {queue}"))
                    .await,
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applying_again = killed_at.elapsed();
    tokio::time::sleep(DOWN_FOR.saturating_sub(killed_at.elapsed())).await;
    let running_after_restart = cluster.restart(killed).await;
    enqueueing.await.expect("enqueue every row");

    relay.until_sent(MESSAGES).await;
    let sent_after_kill = killed_at.elapsed();
    relay.stop().await;

    running
        .until("every row applied", |s| s.applied >= MESSAGES as u64)
        .await;
    until_drained(&cluster, &queue).await;
    let stats = running.stop().await;
    assert_each_applied_once(&bank, &stats, "row", MESSAGES, "sent").await;

    let name = |node: usize| short_name(&cluster, node);
    eprintln!(
        "rabbitmq cluster, relay: {MESSAGES} rows sent, {applied} effects, {replayed} copies suppressed; \
         killed {killed_name} (the relay's node; leader was {leader}) after {before_applied} effects, \
         new leader {new_leader} after {leader_after:?}, effects again {applying_again:?} after the kill; \
         {killed_name} running {running_after_restart:?} after its restart; outbox sent \
         {sent_after_kill:?} after the kill; test {total:?}",
        applied = stats.applied,
        replayed = stats.replayed,
        killed_name = name(killed),
        leader = name(leader),
        new_leader = name(new_leader),
        before_applied = before.applied,
        total = began.elapsed(),
    );
}
