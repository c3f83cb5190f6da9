//! What the consumer tests share: a queue or stream of their own on the real
//! brokers (random suffix, deleted after), a bank on either store (effects
//! counted in the database), the scenarios, generic over both, and the
//! consumer at the end of the outbox tests ([`shipments`]).
//!
//! Brokers: `IDEM_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`),
//! `IDEM_TEST_NATS_URL` (default `nats://127.0.0.1:4222`); PostgreSQL as in the
//! store tests; a Kafka broker of a test's own is started by [`tansu`]; SQS
//! on `IDEM_TEST_SQS_ENDPOINT` (default `http://127.0.0.1:5000`, moto's
//! server). A
//! missing service skips the test, or fails it when
//! `IDEM_REQUIRE_SERVICES` is set.

#![allow(dead_code, unused_imports)]

pub(crate) mod bank;
pub(crate) mod brokers;
pub(crate) mod cuts;
pub(crate) mod scenarios;
pub(crate) mod shipments;
pub(crate) mod sqs;
pub(crate) mod tansu;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::Scope;
use idem_broker::consume::{ConsumeError, ConsumerConfig, KeyRule, Stats, StatsSnapshot};
use idem_retry::Backoff;
use tokio::sync::oneshot;

pub(crate) use bank::{Bank, DynamoBank, OPENING_BALANCE, PgBank, SqliteBank};
#[allow(unused_imports)]
pub(crate) use brokers::{Broker, Jet, Kafka, Rabbit};
#[allow(unused_imports)]
pub(crate) use sqs::Sqs;

/// A random lower-case hex suffix.
pub(crate) fn suffix() -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{:012x}",
        RandomState::new().hash_one(Instant::now()) & 0xffff_ffff_ffff
    )
}

/// The consumer config of the tests: fast redeliveries.
pub(crate) fn config(rule: KeyRule) -> ConsumerConfig {
    ConsumerConfig::new(Scope::new("ledger").unwrap())
        .key(rule)
        .concurrency(4)
        .redelivery(
            Backoff::default()
                .with_base(Duration::from_millis(5))
                .with_cap(Duration::from_millis(20)),
        )
}

/// A consumer running in its own task until [`Running::stop`].
pub(crate) struct Running {
    stats: Arc<Stats>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<StatsSnapshot, ConsumeError>>,
}

impl Running {
    /// Starts `run(shutdown)` (a consumer's `run` or `run_batched`).
    pub(crate) fn start<F, Fut>(stats: Arc<Stats>, run: F) -> Running
    where
        F: FnOnce(futures::future::BoxFuture<'static, ()>) -> Fut,
        Fut: Future<Output = Result<StatsSnapshot, ConsumeError>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown: futures::future::BoxFuture<'static, ()> = Box::pin(async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(run(shutdown));
        Running {
            stats,
            stop: Some(stop),
            task,
        }
    }

    /// Waits (at most 60 s) until `done` holds for the counters.
    pub(crate) async fn until(
        &self,
        what: &str,
        done: impl Fn(&StatsSnapshot) -> bool,
    ) -> StatsSnapshot {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.stats.snapshot();
            if done(&now) {
                return now;
            }
            assert!(
                !self.task.is_finished(),
                "the consumer stopped before {what}: {now:?}"
            );
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The counters now.
    pub(crate) fn stats_now(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Stops the consumer and returns its final counters.
    pub(crate) async fn stop(mut self) -> StatsSnapshot {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task
            .await
            .expect("consumer task")
            .expect("consumer ran without error")
    }
}

/// One test per scenario for `$broker`, on each store: modules `sqlite` and
/// `postgres`, each with the crash tests' child (an ignored test).
#[macro_export]
macro_rules! consumer_tests {
    ($broker:ty) => {
        $crate::consumer_tests!(@store sqlite, $broker, consumer_support::SqliteBank);
        $crate::consumer_tests!(@store postgres, $broker, consumer_support::PgBank);
    };
    (@store $store:ident, $broker:ty, $bank:ty) => {
        mod $store {
            use super::*;
            use consumer_support::scenarios;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn duplicates_and_redeliveries_apply_once() {
                scenarios::duplicates_and_redeliveries::<$broker, $bank>().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn poison_is_dead_lettered_with_its_key_then_redriven_once() {
                scenarios::poison_then_redrive::<$broker, $bank>().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_window_shorter_than_the_producer_horizon_stops_the_start() {
                scenarios::window_shorter_than_the_producer_horizon::<$broker, $bank>().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_message_without_a_key_is_dead_lettered() {
                scenarios::keyless::<$broker, $bank>().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batches_apply_once_and_ack_together() {
                scenarios::batches::<$broker, $bank>().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_after_commit_before_ack_the_redelivery_is_suppressed() {
                scenarios::crash::<$broker, $bank>(
                    idem::crash::BEFORE_ACK,
                    concat!(stringify!($store), "::crash_child"),
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_before_commit_the_redelivery_applies_it() {
                scenarios::crash::<$broker, $bank>(
                    idem::crash::INSIDE_EFFECT,
                    concat!(stringify!($store), "::crash_child"),
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "the child process of the crash tests; does nothing on its own"]
            async fn crash_child() {
                scenarios::crash_child::<$broker, $bank>().await
            }
        }
    };
}
