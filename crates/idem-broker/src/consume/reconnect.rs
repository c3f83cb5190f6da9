//! A transport that connects again by itself: [`Reconnecting`] wraps a
//! connector (anything that makes a fresh transport: a [`Source`], a closure
//! around `AmqpTransport::connect`) and, when its transport reports a lost
//! connection, makes a new one after a full-jitter backoff and goes on
//! receiving.
//!
//! Why inside `receive`: the runtime already treats a receive as the one
//! place a broker can fail; reconnecting there keeps the runtime unaware of
//! connections. Deliveries in hand when the connection died are not chased:
//! their settle handles belong to the dead connection, so their acks fail,
//! the broker redelivers them, and the store answers the copies whose effects
//! committed. The runtime logs such failed settlements and goes on.
//!
//! Why a stored attempt: the runtime races `receive` against timers (a
//! batch's linger) and shutdown. The attempt in progress (its backoff sleep
//! and its connect) lives in the wrapper, not in the `receive` future, so a
//! lost race neither loses a delivery nor starts the attempt over.
//!
//! What is not retried: a failure connecting again cannot fix (refused
//! credentials, a deleted queue or stream, a wrong setting;
//! [`TransportErrorKind::is_fatal`](super::TransportErrorKind::is_fatal)) is
//! returned at once, and the consumer stops with it.
//!
//! While a connection is being made again, the process's health says so
//! ([`idem_core::health`], read by the admin listener's `/healthz`), the gauge
//! `consumer_connected{origin}` is 0, and `consumer_reconnects_total{origin}`
//! counts the connections lost.
//!
//! [`Source`]: super::Source

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use idem_core::error_chain;
use idem_core::health;
use idem_retry::Backoff;

use super::BrokerHorizon;
use super::transport::{Delivery, Route, Transport, TransportError};

/// How long closing a transport whose connection was lost may take.
const CLOSE_LOST: Duration = Duration::from_secs(5);

/// How a lost broker connection is made again: attempt `k` (counting from 0)
/// waits a full-jitter draw from `[0, min(cap, base·2^k)]`, then connects,
/// giving up on that attempt after the connect timeout. There is no attempt
/// limit: a consumer waits for its broker as long as it takes.
///
/// ```
/// use std::time::Duration;
/// use idem_broker::consume::Reconnect;
///
/// let reconnect = Reconnect::default().max(Duration::from_secs(10));
/// assert_eq!(reconnect.max_value(), Duration::from_secs(10));
/// assert_eq!(reconnect.min_value(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    backoff: Backoff,
    connect_timeout: Duration,
}

/// The default first ceiling of the reconnect backoff: 100 ms.
pub const DEFAULT_RECONNECT_MIN: Duration = Duration::from_millis(100);
/// The default largest ceiling of the reconnect backoff: 30 s.
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(30);
/// The default time one connect attempt may take, handshake included: 10 s.
/// A broker answers a connect in milliseconds; one that accepted the TCP
/// connection and then says nothing (a cut that has just healed, a listener
/// behind a stalled proxy) is given up on well before the backoff's ceiling.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Reconnect {
    /// 100 ms doubling up to 30 s; 10 s per connect attempt.
    fn default() -> Self {
        Self {
            backoff: Backoff::new(DEFAULT_RECONNECT_MIN, DEFAULT_RECONNECT_MAX, 1),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

impl Reconnect {
    /// The first ceiling (the delay before the first attempt is drawn from
    /// `[0, min]`).
    pub fn min(mut self, min: Duration) -> Self {
        self.backoff = self.backoff.with_base(min);
        self
    }

    /// The largest ceiling.
    pub fn max(mut self, max: Duration) -> Self {
        self.backoff = self.backoff.with_cap(max);
        self
    }

    /// How long one connect attempt may take before it counts as failed.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one connect attempt may take.
    pub fn connect_timeout_value(&self) -> Duration {
        self.connect_timeout
    }

    /// The first ceiling.
    pub fn min_value(&self) -> Duration {
        self.backoff.base()
    }

    /// The largest ceiling.
    pub fn max_value(&self) -> Duration {
        self.backoff.cap()
    }

    /// The delay before attempt `k`.
    pub fn delay(&self, k: u32) -> Duration {
        self.backoff.draw(k)
    }

    /// One attempt of `connect`, bounded by the connect timeout: a broker
    /// that accepts the TCP connection and never answers must not hang it.
    pub async fn attempt<T>(
        &self,
        connect: impl Future<Output = Result<T, TransportError>>,
    ) -> Result<T, TransportError> {
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(connected) => connected,
            Err(_) => Err(TransportError::new(
                "connect to the broker",
                format!(
                    "no answer within {}",
                    humantime::format_duration(self.connect_timeout)
                ),
            )),
        }
    }
}

type Connector<T> = Arc<dyn Fn() -> BoxFuture<'static, Result<T, TransportError>> + Send + Sync>;

/// A transport that connects again after a lost connection; see the module
/// documentation.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_broker::consume::TransportError> {
/// use idem_broker::consume::{AmqpTransport, Reconnect, Reconnecting};
///
/// let transport = Reconnecting::connect("orders", Reconnect::default(), || {
///     AmqpTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "orders", 32)
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub struct Reconnecting<T: Transport> {
    connect: Connector<T>,
    settings: Reconnect,
    current: Option<T>,
    attempt: Option<BoxFuture<'static, Result<T, TransportError>>>,
    /// Failed attempts since the connection was lost.
    failures: u32,
    /// When the connection was lost, while it is being made again.
    lost_at: Option<Instant>,
    route: Route,
    horizon: Option<BrokerHorizon>,
    limit: Option<super::DeliveryLimit>,
    health: health::Connection,
}

impl<T: Transport> fmt::Debug for Reconnecting<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconnecting")
            .field("route", &self.route)
            .field("settings", &self.settings)
            .field("connected", &self.current.is_some())
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> Reconnecting<T> {
    /// Connects with `connect`, trying again after each failure that
    /// connecting again may fix (the broker may be starting), and returns
    /// the transport once connected. `name` names the connection in logs
    /// and in `/healthz` until then. A fatal failure is returned at once.
    pub async fn connect<F, Fut>(
        name: impl Into<String>,
        settings: Reconnect,
        connect: F,
    ) -> Result<Self, TransportError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, TransportError>> + Send + 'static,
    {
        let connect: Connector<T> = Arc::new(move || Box::pin(connect()));
        let name = name.into();
        let health = health::Connection::register(name.clone());
        let mut failures = 0u32;
        let first = loop {
            match settings.attempt(connect()).await {
                Ok(transport) => break transport,
                Err(error) if error.is_fatal() => return Err(error),
                Err(error) => {
                    let delay = settings.delay(failures);
                    failures = failures.saturating_add(1);
                    let error = error_chain(&error);
                    tracing::warn!(source = %name, %error, retry_in_ms = delay.as_millis() as u64, "cannot connect to the broker; trying again");
                    health.down(&error);
                    tokio::time::sleep(delay).await;
                }
            }
        };
        health.up();
        let route = first.route();
        connected_gauge(&route.origin, true);
        Ok(Self {
            connect,
            settings,
            horizon: first.replay_horizon(),
            limit: first.delivery_limit(),
            current: Some(first),
            attempt: None,
            failures: 0,
            lost_at: None,
            route,
            health,
        })
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.current.is_some()
    }

    /// Drops the current connection and makes a new one at the next
    /// receive, as after a lost connection: the deliveries in hand are left
    /// for the broker to redeliver. For a watchdog that found the consumer
    /// stuck.
    pub fn reset(&mut self, why: &str) {
        if let Some(old) = self.current.take() {
            self.lost(old, why);
        }
    }

    fn lost(&mut self, old: T, why: &str) {
        tracing::warn!(
            source = %self.route.origin,
            error = why,
            "the broker connection was lost; connecting again (messages in hand are left for the broker to redeliver)"
        );
        metrics::counter!("consumer_reconnects_total", "origin" => self.route.origin.clone())
            .increment(1);
        connected_gauge(&self.route.origin, false);
        self.health.down(why);
        self.lost_at = Some(Instant::now());
        self.failures = 0;
        // Closing a connection that is gone can wait long for an answer.
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CLOSE_LOST, old.close()).await;
        });
        self.attempt = Some(self.next_attempt());
    }

    fn next_attempt(&self) -> BoxFuture<'static, Result<T, TransportError>> {
        let delay = self.settings.delay(self.failures);
        let connect = Arc::clone(&self.connect);
        let settings = self.settings;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            settings.attempt(connect()).await
        })
    }
}

fn connected_gauge(origin: &str, up: bool) {
    metrics::gauge!("consumer_connected", "origin" => origin.to_owned()).set(if up {
        1.0
    } else {
        0.0
    });
}

impl<T: Transport> Transport for Reconnecting<T> {
    type Settle = T::Settle;

    /// The next delivery, connecting again first if the connection was
    /// lost. Cancel-safe: an attempt in progress is kept for the next call.
    async fn receive(&mut self) -> Result<Option<Delivery<T::Settle>>, TransportError> {
        loop {
            if let Some(attempt) = self.attempt.as_mut() {
                let made = attempt.await;
                self.attempt = None;
                match made {
                    Ok(transport) => {
                        let down_for = self.lost_at.take().map(|at| at.elapsed());
                        tracing::info!(
                            source = %self.route.origin,
                            down_ms = down_for.map(|d| d.as_millis() as u64),
                            attempts = self.failures + 1,
                            "connected to the broker again; consuming"
                        );
                        self.current = Some(transport);
                        self.failures = 0;
                        self.health.up();
                        connected_gauge(&self.route.origin, true);
                    }
                    Err(error) if error.is_fatal() => {
                        self.health.down(error_chain(&error));
                        return Err(error);
                    }
                    Err(error) => {
                        let error = error_chain(&error);
                        tracing::warn!(source = %self.route.origin, %error, attempt = self.failures + 1, "connecting to the broker again failed; trying again");
                        self.health.down(&error);
                        self.failures = self.failures.saturating_add(1);
                        self.attempt = Some(self.next_attempt());
                    }
                }
                continue;
            }
            let Some(transport) = self.current.as_mut() else {
                self.attempt = Some(self.next_attempt());
                continue;
            };
            match transport.receive().await {
                Err(error) if !error.is_fatal() => {
                    let old = self.current.take().expect("a transport was in use");
                    self.lost(old, &error_chain(&error));
                }
                other => return other,
            }
        }
    }

    fn route(&self) -> Route {
        self.route.clone()
    }

    fn replay_horizon(&self) -> Option<BrokerHorizon> {
        self.horizon.clone()
    }

    fn delivery_limit(&self) -> Option<super::DeliveryLimit> {
        self.limit.clone()
    }

    fn end_batch(&mut self) {
        if let Some(transport) = self.current.as_mut() {
            transport.end_batch();
        }
    }

    fn restart(&mut self, why: &str) -> bool {
        self.reset(why);
        true
    }

    async fn close(mut self) {
        self.attempt = None;
        if let Some(transport) = self.current.take() {
            transport.close().await;
        }
    }
}
