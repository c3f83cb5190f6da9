//! A consumer whose broker connection is cut: it connects again by itself and
//! goes on, and every message published before, during and after the cut is
//! applied exactly once (counted in the bank's ledger). The connection goes
//! through a fault proxy of the test's own, so the shared broker is never
//! touched.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use idem_broker::consume::{Consumer, Reconnect, Reconnecting};
use idem_testkit::faultproxy::{FaultProxy, Mode};

use super::{Bank, Broker, OPENING_BALANCE, Running, config, suffix};

const ORDER_1: &[u8] = br#"{"amount": 1}"#;

/// A broker a consumer can reach through a fault proxy.
pub(crate) trait Cuttable: Broker {
    /// The broker's own address (the proxy's target).
    fn server(&self) -> SocketAddr;
    /// A reconnecting transport that connects through `via`, named `name` in
    /// the process's health.
    fn reconnecting(
        &self,
        via: SocketAddr,
        name: String,
    ) -> impl Future<Output = Reconnecting<Self::Transport>> + Send;
}

/// The backoff of the tests: quick attempts.
pub(crate) fn quick() -> Reconnect {
    Reconnect::default()
        .min(Duration::from_millis(50))
        .max(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(10))
}

/// The address in `url` (`scheme://[user@]host:port/...`).
pub(crate) fn address(url: &str) -> SocketAddr {
    let parsed = url::Url::parse(url).expect("a URL");
    let host = parsed.host_str().expect("a host");
    let port = parsed.port().expect("a port");
    format!("{host}:{port}").parse().expect("an IP address")
}

/// `url` with its host and port replaced by `via`.
pub(crate) fn through(url: &str, via: SocketAddr) -> String {
    let mut parsed = url::Url::parse(url).expect("a URL");
    parsed.set_ip_host(via.ip()).expect("an IP host");
    parsed.set_port(Some(via.port())).expect("a port");
    parsed.to_string()
}

/// Waits (at most 30 s) until `done` holds.
pub(crate) async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn reported_down(name: &str) -> bool {
    idem::health::unready().iter().any(|down| down.name == name)
}

/// Ten messages, a cut (the connection closed and refused for a while, ten
/// more published meanwhile and a copy of an early one), the connection back,
/// ten more: thirty effects, one per key; the health said "down" while it was.
pub(crate) async fn consumes_across_a_cut<B: Cuttable, K: Bank>() {
    across_a_cut::<B, K>(false).await
}

/// The same in batch mode.
pub(crate) async fn consumes_batches_across_a_cut<B: Cuttable, K: Bank>() {
    across_a_cut::<B, K>(true).await
}

async fn across_a_cut<B: Cuttable, K: Bank>(batched: bool) {
    let Some(broker) = B::start().await else {
        return;
    };
    let Some(bank) = K::start().await else {
        return;
    };
    let proxy = FaultProxy::start(broker.server())
        .await
        .expect("start the fault proxy");
    let name = format!("cut-{}", suffix());
    let transport = broker.reconnecting(proxy.addr(), name.clone()).await;
    let consumer = Consumer::new(
        transport,
        bank.apply(false),
        config(broker.key_rule()).batch(4, Duration::from_millis(10)),
    );
    let running = if batched {
        Running::start(consumer.stats(), |stop| consumer.run_batched(stop))
    } else {
        Running::start(consumer.stats(), |stop| consumer.run(stop))
    };

    for i in 0..10 {
        broker.publish(Some(&format!("before-{i}")), ORDER_1).await;
    }
    running.until("ten applied", |s| s.applied >= 10).await;

    proxy.set(Mode::Drop);
    wait_until("the consumer reports its lost connection", || {
        reported_down(&name)
    })
    .await;
    for i in 0..10 {
        broker.publish(Some(&format!("during-{i}")), ORDER_1).await;
    }
    broker.publish(Some("before-3"), ORDER_1).await;
    proxy.set(Mode::Pass);

    running
        .until("the ten published during the cut applied", |s| {
            s.applied >= 20
        })
        .await;
    wait_until("the consumer reports its connection back", || {
        !reported_down(&name)
    })
    .await;
    for i in 0..10 {
        broker.publish(Some(&format!("after-{i}")), ORDER_1).await;
    }
    running
        .until("thirty applied and the copy answered", |s| {
            s.applied >= 30 && s.replayed >= 1
        })
        .await;
    let stats = running.stop().await;

    let ledger = bank.ledger().await;
    let mut keys = ledger.clone();
    keys.dedup();
    assert_eq!(ledger.len(), 30, "one effect per key: {ledger:?}");
    assert_eq!(keys.len(), 30, "no key applied twice: {ledger:?}");
    assert_eq!(bank.balance().await, OPENING_BALANCE - 30);
    assert_eq!(stats.applied, 30, "{stats:?}");
}

impl Cuttable for super::Rabbit {
    fn server(&self) -> SocketAddr {
        address(&self.url)
    }

    async fn reconnecting(
        &self,
        via: SocketAddr,
        name: String,
    ) -> Reconnecting<idem_broker::consume::AmqpTransport> {
        let (url, queue) = (through(&self.url, via), self.queue.clone());
        Reconnecting::connect(name, quick(), move || {
            let (url, queue) = (url.clone(), queue.clone());
            async move { idem_broker::consume::AmqpTransport::connect(&url, &queue, 32).await }
        })
        .await
        .expect("consume the test queue")
    }
}

impl Cuttable for super::Jet {
    fn server(&self) -> SocketAddr {
        address(&self.url)
    }

    async fn reconnecting(
        &self,
        via: SocketAddr,
        name: String,
    ) -> Reconnecting<idem_broker::consume::NatsTransport> {
        let (url, stream) = (through(&self.url, via), self.stream.clone());
        let options = idem_broker::consume::NatsOptions {
            ack_wait: Duration::from_secs(2),
            prefetch: 64,
        };
        Reconnecting::connect(name, quick(), move || {
            let (url, stream) = (url.clone(), stream.clone());
            async move {
                idem_broker::consume::NatsTransport::connect(
                    &url,
                    &stream,
                    super::brokers::WORKER,
                    options,
                )
                .await
            }
        })
        .await
        .expect("consume the test stream")
    }
}

impl Cuttable for super::Sqs {
    fn server(&self) -> SocketAddr {
        address(&super::sqs::endpoint())
    }

    async fn reconnecting(
        &self,
        via: SocketAddr,
        name: String,
    ) -> Reconnecting<idem_broker::consume::SqsTransport> {
        let url = through(&self.url, via);
        let options = self.options;
        Reconnecting::connect(name, quick(), move || {
            let url = url.clone();
            async move { idem_broker::consume::SqsTransport::connect(&url, options).await }
        })
        .await
        .expect("consume the test queue")
    }
}
