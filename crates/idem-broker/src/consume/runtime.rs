//! The consumer runtime, single mode: for each delivery, take its key, apply
//! it through the store (effect and record in one commit), and only then ack.
//!
//! The order is the guarantee. A crash before the commit leaves nothing
//! behind and the broker redelivers; a crash after the commit and before the
//! ack makes the broker redeliver a message whose record exists, and the
//! redelivery is answered from the store and acked without running the
//! effect. Nothing is ever acked before its effect (or its dead letter) is
//! committed.
//!
//! What becomes of each answer is in `settle`; one delivery's path in
//! `process`; the checks before the first delivery in `start`; the watchdog
//! in `watchdog`; the batch mode in `batch`.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::apply::Apply;
use super::config::ConsumerConfig;
use super::error::ConsumeError;
use super::start::{check_delivery_limit, prepare};
use super::stats::{Stats, StatsSnapshot};
use super::transport::{Route, Transport};
use super::watchdog::Watchdog;

/// How long messages in hand may take to finish once the connection broke.
const DRAIN_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// How long closing the transport may take when the consumer stops.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A consumer: a transport, an effect applied through a store, a config.
///
/// ```no_run
/// # async fn demo(store: idem::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{Outcome, Scope};
/// use idem_broker::consume::{AmqpTransport, AtomicApply, Consumer, ConsumerConfig};
///
/// let transport = AmqpTransport::connect("amqp://127.0.0.1:5672/%2f", "payments", 32).await?;
/// let effect = AtomicApply::new(store, |message| async move |tx| -> idem::rusqlite::Result<Outcome> {
///     tx.execute("INSERT INTO ledger (key) VALUES (?1)", [message.key.as_str()])?;
///     Ok(Outcome::success("recorded"))
/// });
/// let consumer = Consumer::new(transport, effect, ConsumerConfig::new(Scope::new("ledger")?));
/// consumer.run(std::future::pending::<()>()).await?; // or a shutdown signal
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer<T, A> {
    pub(crate) transport: T,
    pub(crate) shared: Arc<Shared<A>>,
}

/// What every task of a consumer shares: the effect, the config, where the
/// messages come from, and the counters.
#[derive(Debug)]
pub(crate) struct Shared<A> {
    pub(crate) apply: A,
    pub(crate) config: ConsumerConfig,
    pub(crate) route: Route,
    pub(crate) stats: Arc<Stats>,
}

impl<T: Transport, A: Apply> Consumer<T, A> {
    /// A consumer of `transport`'s deliveries, applying them with `apply`.
    pub fn new(transport: T, apply: A, config: ConsumerConfig) -> Self {
        let route = transport.route();
        Self {
            transport,
            shared: Arc::new(Shared {
                apply,
                config,
                route,
                stats: Arc::default(),
            }),
        }
    }

    /// Live counters of what the consumer did.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.shared.stats)
    }

    /// Consumes until `shutdown` completes or the subscription ends, working
    /// on up to the configured concurrency of messages at once. On shutdown
    /// it stops receiving, finishes (and settles) what it started, and closes
    /// the transport.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<StatsSnapshot, ConsumeError> {
        let replay = self.transport.replay_horizon();
        if let Err(error) = prepare(&self.shared.apply, &self.shared.config, replay).await {
            self.transport.close().await;
            return Err(error);
        }
        check_delivery_limit(self.transport.delivery_limit(), &self.shared.config);
        let concurrency = self.shared.config.concurrency;
        let mut shutdown = pin!(shutdown);
        let mut working = JoinSet::new();
        let mut watchdog = Watchdog::new(self.shared.config.watchdog);
        let stopped = loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                Some(done) = working.join_next(), if !working.is_empty() => {
                    watchdog.progress();
                    if let Err(error) = joined(done) {
                        break Err(error);
                    }
                }
                () = watchdog.stalled(), if watchdog.on() && !working.is_empty() => {
                    if let Err(error) = watchdog.restart(&mut self.transport, &mut working).await {
                        break Err(error);
                    }
                }
                received = self.transport.receive(), if working.len() < concurrency => match received {
                    Ok(Some(delivery)) => {
                        watchdog.progress();
                        self.shared.stats.received(1);
                        working.spawn(Arc::clone(&self.shared).process(delivery));
                    }
                    Ok(None) => break Ok(()),
                    Err(error) => break Err(error.into()),
                },
            }
        };
        // After a clean stop the work in hand is finished and settled. After
        // a broken connection its settlements may never be answered, so it
        // gets a bounded time and is then dropped: what it did not settle the
        // broker delivers again, and the records answer those copies.
        let broken = stopped.is_err();
        let mut finished = stopped;
        let deadline = tokio::time::Instant::now() + DRAIN_AFTER_FAILURE;
        loop {
            let next = if broken {
                match tokio::time::timeout_at(deadline, working.join_next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        tracing::warn!(
                            unfinished = working.len(),
                            "the connection broke; messages still in hand after {:?} are left for the broker to redeliver",
                            DRAIN_AFTER_FAILURE
                        );
                        working.abort_all();
                        break;
                    }
                }
            } else {
                working.join_next().await
            };
            let Some(done) = next else { break };
            if let (Ok(()), Err(error)) = (&finished, joined(done)) {
                finished = Err(error);
            }
        }
        // Closing a channel on a connection that is gone can wait forever
        // for the broker's answer.
        if tokio::time::timeout(CLOSE_TIMEOUT, self.transport.close())
            .await
            .is_err()
        {
            tracing::warn!(
                "closing the broker connection took longer than {CLOSE_TIMEOUT:?}; leaving it"
            );
        }
        finished.map(|()| self.shared.stats.snapshot())
    }
}
pub(crate) fn joined(
    done: Result<Result<(), ConsumeError>, tokio::task::JoinError>,
) -> Result<(), ConsumeError> {
    match done {
        Ok(result) => result,
        Err(join) => Err(ConsumeError::Panicked(join.to_string())),
    }
}
