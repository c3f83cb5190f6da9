//! The consumer runtime against an SQS-compatible server (moto's, started by
//! the test command), on SQLite, PostgreSQL and DynamoDB (moto's too, a
//! table per test): each test creates a queue of its own and deletes it
//! after.
//!
//! Where moto differs from SQS: it checks visibility timeouts when a receive
//! asks, in whole seconds, so the timings below leave a second of slack; it
//! takes any credentials; its receive counts and dead-letter moves follow
//! the same rules.

mod consumer_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use consumer_support::bank::Tx;
use consumer_support::{
    Bank, Broker, DynamoBank, OPENING_BALANCE, PgBank, Running, SqliteBank, Sqs, config,
};
use idem::Outcome;
use idem_broker::consume::{
    ApplyBatch, AtomicApply, ConsumeError, Consumer, KeyRule, KeySource, KeyedMessage, SqsOptions,
    Transport,
};

consumer_tests!(Sqs);

/// The scenarios on a DynamoDB store: the effect's ledger item and debit
/// commit with the record in one `TransactWriteItems`. (Batches are not run
/// here: a batch's effects would write the one account item several times
/// in one transaction, which DynamoDB refuses.)
mod dynamodb {
    use super::*;
    use consumer_support::scenarios;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn duplicates_and_redeliveries_apply_once() {
        scenarios::duplicates_and_redeliveries::<Sqs, DynamoBank>().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn poison_is_dead_lettered_with_its_key_then_redriven_once() {
        scenarios::poison_then_redrive::<Sqs, DynamoBank>().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_shorter_than_the_producer_horizon_stops_the_start() {
        scenarios::window_shorter_than_the_producer_horizon::<Sqs, DynamoBank>().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_without_a_key_is_dead_lettered() {
        scenarios::keyless::<Sqs, DynamoBank>().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_after_commit_before_ack_the_redelivery_is_suppressed() {
        scenarios::crash::<Sqs, DynamoBank>(idem::crash::BEFORE_ACK, "dynamodb::crash_child").await
    }

    /// The child died holding the key's claim (written before the effect
    /// ran, unlike a SQL transaction's): the redelivery is refused as in
    /// flight until the claim's lease ends, then takes it over and applies.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_before_commit_the_redelivery_applies_it() {
        scenarios::crash::<Sqs, DynamoBank>(idem::crash::INSIDE_EFFECT, "dynamodb::crash_child")
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "the child process of the crash tests; does nothing on its own"]
    async fn crash_child() {
        scenarios::crash_child::<Sqs, DynamoBank>().await
    }

    /// Three consumers on one queue, 40 orders each sent three times: every
    /// copy is settled, each order debited once, whichever consumer got it
    /// first; the copies racing an original in flight are refused by the
    /// claim's conditional write and answered from the record once it
    /// commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn competing_consumers_apply_each_order_once() {
        let Some(queue) = Sqs::start().await else {
            return;
        };
        let Some(bank) = DynamoBank::start().await else {
            return;
        };
        let orders: Vec<String> = (0..40).map(|i| format!("order-{i:02}")).collect();
        for _ in 0..3 {
            for order in &orders {
                queue.publish(Some(order), br#"{"amount": 3}"#).await;
            }
        }
        let mut running = Vec::new();
        for _ in 0..3 {
            let consumer = Consumer::new(
                queue.transport().await,
                bank.apply(false),
                config(queue.key_rule()),
            );
            running.push(Running::start(consumer.stats(), |stop| consumer.run(stop)));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let settled: u64 = running
                .iter()
                .map(|r| {
                    let s = r.stats_now();
                    s.applied + s.replayed
                })
                .sum();
            // Every copy settled and deleted (a copy held past its
            // visibility timeout on a busy machine comes again, and is
            // answered from the record too).
            if settled >= 120 && queue.depth().await == (0, 0) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{settled} of 120 copies settled in 60 s, the queue at {:?}",
                queue.depth().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut applied = 0;
        for consumer in running {
            let stats = consumer.stop().await;
            assert_eq!(stats.dead_lettered, 0, "{stats:?}");
            applied += stats.applied;
        }
        assert_eq!(applied, 40, "one effect per order");
        assert_eq!(bank.ledger().await, orders, "one ledger item per order");
        assert_eq!(bank.balance().await, OPENING_BALANCE - 3 * 40);
    }
}

/// Waits inside an effect: on the runtime (PostgreSQL's effects), or on the
/// thread (SQLite's effects run on its writer thread, outside the runtime).
async fn pause_here(pause: Duration) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::time::sleep(pause).await;
    } else {
        std::thread::sleep(pause);
    }
}

/// An effect that writes its ledger row, then holds its transaction until
/// `released` is set (at most 30 s).
fn held<K: Bank>(bank: &K, released: Arc<AtomicBool>) -> impl ApplyBatch<Store = K::Store> {
    AtomicApply::new(bank.store(), move |message: Arc<KeyedMessage>| {
        let released = Arc::clone(&released);
        async move |tx: &mut Tx<K>| -> Result<Outcome, String> {
            K::debit(tx, message.key.as_str(), 1).await?;
            for _ in 0..1500 {
                if released.load(Ordering::Acquire) {
                    break;
                }
                pause_here(Duration::from_millis(20)).await;
            }
            Ok(Outcome::success("held"))
        }
    })
}

/// An effect held longer than the visibility timeout: with the extension on,
/// a second consumer on the queue never receives the message; with it off,
/// the second consumer gets a copy while the first still works, and that copy
/// is answered from the record. One effect either way.
async fn a_slow_effect_and_the_visibility<K: Bank>(extend: bool) {
    let Some(queue) = Sqs::start().await else {
        return;
    };
    let Some(bank) = K::start().await else {
        return;
    };
    queue.publish(Some("slow-1"), br#"{"amount": 1}"#).await;
    // Extended every 2 s: a late extension still has 2 s of slack on a busy
    // machine.
    let visibility = Duration::from_secs(4);
    let options = SqsOptions {
        extend,
        visibility,
        ..queue.options
    };
    let released = Arc::new(AtomicBool::new(false));
    // One message at a time: the first consumer does not receive again
    // while its effect runs, so a copy can only reach the second.
    let first = Consumer::new(
        queue.transport_with(options).await,
        held(&bank, Arc::clone(&released)),
        config(queue.key_rule()).concurrency(1),
    );
    let first = Running::start(first.stats(), |stop| first.run(stop));
    first.until("received", |s| s.received >= 1).await;
    let second = Consumer::new(
        queue.transport_with(options).await,
        held(&bank, Arc::new(AtomicBool::new(true))),
        config(queue.key_rule()),
    );
    let second = Running::start(second.stats(), |stop| second.run(stop));
    if extend {
        // Twice the visibility timeout and more: without the extensions the
        // message would have been visible again by now.
        tokio::time::sleep(visibility * 2 + Duration::from_secs(1)).await;
    } else {
        second
            .until("a copy while the first still works", |s| s.received >= 1)
            .await;
    }
    released.store(true, Ordering::Release);
    first.until("applied", |s| s.applied >= 1).await;
    if extend {
        // Past the commit and the delete: nothing is left for the second.
        tokio::time::sleep(Duration::from_secs(3)).await;
    } else {
        second
            .until("the copy answered from the record", |s| s.replayed >= 1)
            .await;
    }
    let (first, second) = (first.stop().await, second.stop().await);
    assert_eq!(bank.ledger().await, ["slow-1"], "one effect");
    assert_eq!(first.applied, 1, "{first:?}");
    if extend {
        assert_eq!(
            second.received, 0,
            "the extension kept the copy hidden: {second:?}"
        );
    } else {
        // Every copy it got (the visibility may lapse again while it waits
        // for the first's commit) is answered from the record.
        assert_eq!(second.applied, 0, "{second:?}");
        assert!(second.replayed >= 1, "{second:?}");
    }
    assert_eq!(queue.depth().await, (0, 0), "the message was deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_visibility_extension_keeps_a_slow_message_from_a_second_consumer() {
    a_slow_effect_and_the_visibility::<SqliteBank>(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_extension_the_second_copy_is_answered_from_the_record() {
    a_slow_effect_and_the_visibility::<PgBank>(false).await;
}

/// A FIFO queue, two groups of five orders each, every order sent twice:
/// once more with the same deduplication id (SQS drops it within five
/// minutes) and once more with a new one (a producer retrying after those
/// minutes, which SQS keeps). Each group is applied in its order, one
/// effect per order, groups in parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_groups_apply_in_order_under_duplicates() {
    let Some(queue) = Sqs::create(true, &[]).await else {
        return;
    };
    let Some(bank) = SqliteBank::start().await else {
        return;
    };
    for seq in 0..5 {
        for group in ["a", "b"] {
            let key = format!("{group}-{seq}");
            let payload = format!(r#"{{"amount": 1, "group": "{group}", "seq": {seq}}}"#);
            let attributes = [("idempotency-key", key.as_str())];
            queue
                .send(payload.as_bytes(), &attributes, Some((group, &key)))
                .await;
            queue
                .send(payload.as_bytes(), &attributes, Some((group, &key)))
                .await;
            let retried = format!("{key}/retried");
            queue
                .send(payload.as_bytes(), &attributes, Some((group, &retried)))
                .await;
        }
    }
    // What each group's effects saw, in the order they committed.
    let seen: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let record = Arc::clone(&seen);
    let apply = AtomicApply::new(bank.store(), move |message: Arc<KeyedMessage>| {
        let record = Arc::clone(&record);
        async move |tx: &mut Tx<SqliteBank>| -> Result<Outcome, String> {
            let order: serde_json::Value =
                serde_json::from_slice(message.payload()).map_err(|e| e.to_string())?;
            SqliteBank::debit(tx, message.key.as_str(), 1).await?;
            pause_here(Duration::from_millis(30)).await;
            let group = order["group"].as_str().unwrap_or_default().to_owned();
            record
                .lock()
                .unwrap()
                .entry(group)
                .or_default()
                .push(order["seq"].as_i64().unwrap_or(-1));
            Ok(Outcome::success("ordered"))
        }
    });
    let consumer = Consumer::new(
        queue.transport().await,
        apply,
        config(KeyRule::new(KeySource::MessageId)),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let stats = running
        .until("every copy settled", |s| s.applied + s.replayed >= 20)
        .await;
    running.stop().await;
    assert_eq!((stats.applied, stats.replayed), (10, 10), "{stats:?}");
    assert_eq!(bank.ledger().await.len(), 10, "one effect per order");
    let seen = seen.lock().unwrap().clone();
    for group in ["a", "b"] {
        assert_eq!(seen[group], [0, 1, 2, 3, 4], "group {group} in order");
    }
    assert_eq!(queue.depth().await, (0, 0));
}

/// A queue whose redrive policy moves a message to its dead-letter queue
/// after two receives: the transport reads the limit, and the consumer
/// (five attempts) warns at start-up that SQS would move a failing message
/// before Idem dead-letters it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_redrive_limit_is_read() {
    let Some(dead) = Sqs::start().await else {
        return;
    };
    let arn = dead
        .client
        .get_queue_attributes()
        .queue_url(&dead.queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("the dead-letter queue's ARN")
        .attributes
        .unwrap_or_default()
        .remove(&QueueAttributeName::QueueArn)
        .expect("an ARN");
    let policy = serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": 2});
    let Some(queue) = Sqs::create(
        false,
        &[(QueueAttributeName::RedrivePolicy, policy.to_string())],
    )
    .await
    else {
        return;
    };
    let transport = queue.transport().await;
    let limit = transport
        .delivery_limit()
        .expect("the redrive policy's limit");
    assert_eq!(limit.deliveries, 2);
    assert!(limit.origin.contains(&queue.queue), "{}", limit.origin);
}

/// A queue that keeps messages longer than the dedupe window (14 days
/// against 7) stops the start: a message could still be handed out after
/// its record is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_longer_than_the_window_stops_the_start() {
    let fourteen_days = (14 * 24 * 3600).to_string();
    let Some(queue) = Sqs::create(
        false,
        &[(QueueAttributeName::MessageRetentionPeriod, fourteen_days)],
    )
    .await
    else {
        return;
    };
    let Some(bank) = SqliteBank::start().await else {
        return;
    };
    let refused = Consumer::new(
        queue.transport().await,
        bank.apply(false),
        config(queue.key_rule()),
    )
    .run(std::future::pending())
    .await;
    match refused {
        Err(error @ ConsumeError::ReplayBeyondWindow { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("MessageRetentionPeriod") && message.contains("14days"),
                "{message}"
            );
        }
        other => panic!("expected ReplayBeyondWindow, got {other:?}"),
    }
}

/// A consumer that cannot extend a message's visibility stops: here the
/// queue is deleted under an effect in hand, the extension is refused, and
/// the consumer ends with the transport's error instead of working on while
/// SQS could hand the message to someone else. The effect in hand still
/// commits once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_cannot_extend_the_visibility_stops() {
    let Some(queue) = Sqs::start().await else {
        return;
    };
    let Some(bank) = SqliteBank::start().await else {
        return;
    };
    queue.publish(Some("slow-1"), br#"{"amount": 1}"#).await;
    let released = Arc::new(AtomicBool::new(false));
    let consumer = Consumer::new(
        queue.transport().await,
        held(&bank, Arc::clone(&released)),
        config(queue.key_rule()).concurrency(1),
    );
    let stats = consumer.stats();
    let run = tokio::spawn(consumer.run(std::future::pending()));
    while stats.snapshot().received < 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    queue
        .client
        .delete_queue()
        .queue_url(&queue.queue_url)
        .send()
        .await
        .expect("delete the queue");
    // The effect is held until the queue has been gone for three extension
    // periods (one per second with the tests' 2 s visibility), so at least
    // one extension is refused while the message is in hand however slowly
    // the server answers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    released.store(true, Ordering::Release);
    let ended = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the consumer stops within 30 s")
        .expect("consumer task");
    match ended {
        Err(ConsumeError::Transport(error)) => {
            let chain = format!("{error}: {:?}", std::error::Error::source(&error));
            assert!(chain.contains("visibility"), "{chain}");
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert_eq!(
        bank.ledger().await,
        ["slow-1"],
        "the effect in hand committed once"
    );
}

/// The connection to the endpoint is cut under the consumer: it connects
/// again by itself, says so to the health while it is down, and applies every
/// message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_across_a_connection_cut() {
    consumer_support::cuts::consumes_across_a_cut::<Sqs, SqliteBank>().await
}

/// The same in batch mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_consuming_batches_across_a_connection_cut() {
    consumer_support::cuts::consumes_batches_across_a_cut::<Sqs, SqliteBank>().await
}
