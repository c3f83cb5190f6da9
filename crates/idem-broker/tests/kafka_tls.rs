//! Kafka over SSL and SASL_SSL against a real broker. tansu, the
//! Kafka-protocol broker of these tests, serves no TLS of its own, so each
//! test puts a TLS-terminating proxy (`idem_testkit::tlsproxy`, certificates
//! made on the spot) in front of a tansu of its own that advertises the
//! proxy's address: clients bootstrap through the proxy and the metadata
//! sends them back to it, so every connection (metadata, produce, fetch, the
//! group coordinator) is TLS. With SASL the broker itself requires
//! SCRAM-SHA-256 or SCRAM-SHA-512 inside that TLS.
//!
//! Idem's publisher and consumer publish, consume, apply each key once and
//! commit their offsets over SSL and over SASL_SSL; a client without TLS,
//! one that trusts another CA and one with a wrong password are refused with
//! errors that say so, and the password is printed nowhere. Clients are
//! also created with settings no broker here serves (SASL PLAIN), and a
//! missing CA file is an error at creation that names it.

mod consumer_support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use consumer_support::tansu::{Tansu, free_port};
use consumer_support::{Bank, Running, SqliteBank, config};
use idem::IdempotencyKey;
use idem_broker::consume::{Consumer, KeyRule, KeySource, Source, SourceOptions};
use idem_broker::kafka::Settings;
use idem_broker::publish::{self, Destination, Message, Publish, PublishErrorKind};
use idem_testkit::tls::{TestCa, TlsFiles};
use idem_testkit::tlsproxy::TlsProxy;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::BaseProducer;
use rdkafka::{Offset, TopicPartitionList};

const PASSWORD: &str = "kafka-pw-Xy81";

/// The SCRAM user of the brokers that require SASL.
const USER: &str = "billing";
const USER_PASSWORD: &str = "scram-pw-Q7t2";

fn sasl_ssl(mechanism: &str, ca: &str) -> Settings {
    Settings::new()
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanism", mechanism)
        .set("sasl.username", "app")
        .set("sasl.password", PASSWORD)
        .set("ssl.ca.location", ca)
}

#[test]
fn sasl_ssl_clients_are_created_with_plain_and_scram() {
    let files = TlsFiles::generate();
    let ca = files.ca.display().to_string();
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let settings = sasl_ssl(mechanism, &ca);
        let producer = settings.producer("127.0.0.1:9093").expect("safe settings");
        producer
            .create::<BaseProducer>()
            .unwrap_or_else(|e| panic!("a {mechanism} producer: {e}"));
        let consumer = settings
            .consumer("127.0.0.1:9093", "billing")
            .expect("safe settings");
        consumer
            .create::<BaseConsumer>()
            .unwrap_or_else(|e| panic!("a {mechanism} consumer: {e}"));
        let shown = format!("{settings:?}");
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(shown.contains("SASL_SSL"), "{shown}");
    }
}

#[tokio::test]
async fn a_missing_ca_file_is_an_error_at_creation_that_names_it() {
    let url = format!(
        "kafka://127.0.0.1:9093/orders?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-256&sasl.username=app&sasl.password={PASSWORD}&ssl.ca.location=/nonexistent/ca.pem"
    );
    let destination: Destination = url.parse().expect("the destination parses");
    assert!(!destination.redacted().contains(PASSWORD));
    assert!(!format!("{destination:?}").contains(PASSWORD));
    let error = match publish::connect(&destination).await {
        Ok(_) => panic!("a producer with a missing CA file"),
        Err(error) => format!("{error} ({error:?})"),
    };
    assert!(error.contains("ssl.ca.location"), "{error}");
    assert!(!error.contains(PASSWORD), "{error}");

    let source: Source = format!("{url}&group=billing")
        .parse()
        .expect("the source parses");
    assert!(!source.to_string().contains(PASSWORD));
    assert!(!format!("{source:?}").contains(PASSWORD));
    let error = match source.connect(Default::default()).await {
        Ok(_) => panic!("a consumer with a missing CA file"),
        Err(error) => chain(&error),
    };
    assert!(error.contains("ssl.ca.location"), "{error}");
    assert!(!error.contains(PASSWORD), "{error}");
}

/// A tansu of the test's own behind a TLS proxy: the proxy listens with TLS
/// on a loopback port and forwards to the broker's own port; the broker
/// advertises the proxy's address.
struct Secured {
    _dir: tempfile::TempDir,
    /// The CA that signed the proxy's certificate.
    ca: PathBuf,
    /// A CA that signed nothing here.
    other_ca: PathBuf,
    /// A client certificate and its key, signed by `ca`.
    client: (PathBuf, PathBuf),
    proxy: TlsProxy,
    tansu: Tansu,
}

impl Secured {
    /// Without SASL.
    async fn start() -> Option<Self> {
        Self::launch(&[], false).await
    }

    /// Requiring SCRAM authentication of [`USER`].
    async fn with_scram() -> Option<Self> {
        Self::launch(&[(USER, USER_PASSWORD)], false).await
    }

    /// Requiring a client certificate signed by the CA.
    async fn with_client_certificates() -> Option<Self> {
        Self::launch(&[], true).await
    }

    async fn launch(users: &[(&str, &str)], client_certificates: bool) -> Option<Self> {
        let dir = tempfile::tempdir().expect("a directory for certificates");
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a certificate file");
            path
        };
        let authority = TestCa::new("Idem Kafka test CA");
        let client = authority.client("idem-client");
        let ca = write("ca.pem", &authority.pem());
        let other_ca = write("other-ca.pem", &TestCa::new("Idem other CA").pem());
        let client = (
            write("client.pem", &client.cert_pem),
            write("client-key.pem", &client.key_pem),
        );
        let broker = free_port();
        let server = authority.server("kafka");
        let proxy = if client_certificates {
            TlsProxy::start_requiring_client_certs(broker, &server, authority.der()).await
        } else {
            TlsProxy::start(broker, &server).await
        }
        .expect("the TLS proxy listens");
        let tansu = if users.is_empty() {
            Tansu::start_at(Some(broker), Some(proxy.addr())).await?
        } else {
            Tansu::start_with_users_at(users, Some(broker), Some(proxy.addr())).await?
        };
        Some(Self {
            _dir: dir,
            ca,
            other_ca,
            client,
            proxy,
            tansu,
        })
    }

    /// `bootstrap.servers`: the proxy.
    fn brokers(&self) -> String {
        self.proxy.addr().to_string()
    }

    /// The settings of a client that trusts the CA.
    fn ssl(&self) -> Settings {
        Settings::new()
            .set("security.protocol", "SSL")
            .set("ssl.ca.location", self.ca.display().to_string())
    }

    /// The settings of [`USER`] with `mechanism` and `password`.
    fn scram(&self, mechanism: &str, password: &str) -> Settings {
        Settings::new()
            .set("security.protocol", "SASL_SSL")
            .set("ssl.ca.location", self.ca.display().to_string())
            .set("sasl.mechanism", mechanism)
            .set("sasl.username", USER)
            .set("sasl.password", password)
    }

    /// `settings` as a URL query.
    fn query(settings: &Settings) -> String {
        settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// A new topic of one partition, made through the proxy with `settings`.
    async fn topic(&self, settings: &Settings) -> String {
        let name = format!("orders-{}", consumer_support::suffix());
        let admin: AdminClient<DefaultClientContext> = settings
            .producer(&self.brokers())
            .expect("safe settings")
            .create()
            .expect("an admin client");
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let created = admin
            .create_topics(
                [&NewTopic::new(&name, 1, TopicReplication::Fixed(1))],
                &options,
            )
            .await
            .unwrap_or_else(|e| panic!("create a topic: {e}; {}", self.diagnosis()));
        for result in created {
            result.unwrap_or_else(|(name, e)| panic!("create {name}: {e}"));
        }
        name
    }

    /// The destination `topic` through the proxy, with `settings`.
    fn destination(&self, topic: &str, settings: &Settings) -> Destination {
        format!(
            "kafka://{}/{topic}?{}",
            self.brokers(),
            Self::query(settings)
        )
        .parse()
        .expect("the destination parses")
    }

    /// The source `topic` for `group` through the proxy, with `settings`.
    fn source(&self, topic: &str, group: &str, settings: &Settings) -> Source {
        format!(
            "kafka://{}/{topic}?group={group}&{}",
            self.brokers(),
            Self::query(settings)
        )
        .parse()
        .expect("the source parses")
    }

    /// The broker's log and the proxy's failed handshakes.
    fn diagnosis(&self) -> String {
        format!(
            "failed handshakes at the proxy: {:?}; broker log:\n{}",
            self.proxy.failures(),
            self.tansu.log()
        )
    }

    /// Publishes `order-1` twice and `order-2` once with Idem's publisher,
    /// consumes them with Idem's consumer in `group`, and checks each key
    /// applied once and the group's offset committed past all three.
    async fn publish_and_consume_once(&self, settings: &Settings, group: &str) {
        let topic = self.topic(settings).await;
        let to = self.destination(&topic, settings);
        let publisher = publish::connect(&to).await.unwrap_or_else(|e| {
            panic!("connect the publisher: {}; {}", chain(&e), self.diagnosis())
        });
        for key in ["order-1", "order-1", "order-2"] {
            let message = Message::new(
                IdempotencyKey::new(key).unwrap(),
                br#"{"amount": 10}"#.to_vec(),
            );
            publisher
                .publish(&message)
                .await
                .unwrap_or_else(|e| panic!("publish {key}: {}", chain(&e)));
        }

        let source = self.source(&topic, group, settings);
        let bank = SqliteBank::start().await.expect("sqlite");
        let transport = source
            .connect(SourceOptions::default())
            .await
            .unwrap_or_else(|e| panic!("connect to {source}: {}; {}", chain(&e), self.diagnosis()));
        let consumer = Consumer::new(
            transport,
            bank.apply(false),
            config(KeyRule::new(KeySource::MessageId)),
        );
        let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
        running
            .until("three records settled", |s| s.applied + s.replayed >= 3)
            .await;
        let stats = running.stop().await;
        assert_eq!(bank.ledger().await, ["order-1", "order-2"], "{stats:?}");
        assert_eq!((stats.applied, stats.replayed), (2, 1), "{stats:?}");
        assert_eq!(
            self.committed(settings, &topic, group).await,
            Offset::Offset(3)
        );
    }

    /// The offset `group` committed on partition 0 of `topic`, asked through
    /// the proxy.
    async fn committed(&self, settings: &Settings, topic: &str, group: &str) -> Offset {
        let consumer: BaseConsumer = settings
            .consumer(&self.brokers(), group)
            .expect("safe settings")
            .create()
            .expect("a consumer");
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(topic, 0);
        let committed = tokio::task::spawn_blocking(move || {
            consumer.committed_offsets(partitions, Duration::from_secs(10))
        })
        .await
        .expect("the request ran")
        .unwrap_or_else(|e| panic!("the committed offsets: {e}; {}", self.diagnosis()));
        committed
            .find_partition(topic, 0)
            .expect("partition 0")
            .offset()
    }
}

/// An error and its sources, as `idem forward` prints them.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

/// Why Idem's consumer could not connect to `source`.
async fn consumer_error(source: &Source) -> String {
    let connected = tokio::time::timeout(
        Duration::from_secs(30),
        source.connect(SourceOptions::default()),
    )
    .await
    .expect("a refusal within 30 s, not a hang");
    match connected {
        Ok(_) => panic!("{source} should not connect"),
        Err(error) => chain(&error),
    }
}

/// Why Idem's publisher could not connect to `to`, and the kind of error.
async fn publisher_error(to: &Destination) -> (String, PublishErrorKind) {
    let connected = tokio::time::timeout(Duration::from_secs(30), publish::connect(to))
        .await
        .expect("a refusal within 30 s, not a hang");
    match connected {
        Ok(_) => panic!("{} should not connect", to.redacted()),
        Err(error) => (chain(&error), error.kind()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssl_publishes_consumes_once_and_commits_through_tls() {
    let Some(kafka) = Secured::start().await else {
        return;
    };
    kafka
        .publish_and_consume_once(&kafka.ssl(), "billing-ssl")
        .await;
    assert!(
        kafka.proxy.failures().is_empty(),
        "{:?}",
        kafka.proxy.failures()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_with_scram_sha_256_and_512_publishes_and_consumes_once() {
    let Some(kafka) = Secured::with_scram().await else {
        return;
    };
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let settings = kafka.scram(mechanism, USER_PASSWORD);
        let group = format!("billing-{}", mechanism.to_ascii_lowercase());
        let source = kafka.source("orders", &group, &settings);
        assert!(!source.to_string().contains(USER_PASSWORD), "{source}");
        assert!(!format!("{source:?}").contains(USER_PASSWORD));
        kafka.publish_and_consume_once(&settings, &group).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_to_a_listener_that_requires_one() {
    let Some(kafka) = Secured::with_client_certificates().await else {
        return;
    };
    let settings = kafka
        .ssl()
        .set(
            "ssl.certificate.location",
            kafka.client.0.display().to_string(),
        )
        .set("ssl.key.location", kafka.client.1.display().to_string());
    kafka
        .publish_and_consume_once(&settings, "billing-mtls")
        .await;

    let error = consumer_error(&kafka.source("orders", "billing-mtls", &kafka.ssl())).await;
    assert!(error.contains("requires a client certificate"), "{error}");
    let (error, _) = publisher_error(&kafka.destination("orders", &kafka.ssl())).await;
    assert!(error.contains("requires a client certificate"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_tls_is_refused_and_told_to_use_ssl() {
    let Some(kafka) = Secured::start().await else {
        return;
    };
    let plain = Settings::new().set("security.protocol", "PLAINTEXT");
    let error = consumer_error(&kafka.source("orders", "billing", &plain)).await;
    assert!(error.contains("security.protocol=SSL"), "{error}");
    let (error, kind) = publisher_error(&kafka.destination("orders", &plain)).await;
    assert!(error.contains("security.protocol=SSL"), "{error}");
    assert_eq!(kind, PublishErrorKind::Config, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_ca_says_the_certificate_did_not_verify() {
    let Some(kafka) = Secured::start().await else {
        return;
    };
    let settings = Settings::new()
        .set("security.protocol", "SSL")
        .set("ssl.ca.location", kafka.other_ca.display().to_string());
    let error = consumer_error(&kafka.source("orders", "billing", &settings)).await;
    assert!(error.contains("did not verify"), "{error}");
    assert!(error.contains("ssl.ca.location"), "{error}");
    let (error, kind) = publisher_error(&kafka.destination("orders", &settings)).await;
    assert!(error.contains("did not verify"), "{error}");
    assert_eq!(kind, PublishErrorKind::Config, "{error}");
}

/// Everything the test process logs, from every thread (librdkafka calls
/// back on threads of its own).
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = Captured(Arc::clone(&logs));
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        // Another test of this process may have set it first: then its
        // subscriber captures nothing here, and the test below says so.
        let _ = tracing::subscriber::set_global_default(subscriber);
        logs
    })
}

#[derive(Clone)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_says_authentication_failed_and_is_never_printed() {
    let logs = captured_logs();
    let Some(kafka) = Secured::with_scram().await else {
        return;
    };
    let wrong = "wrong-pw-Zr55";
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let settings = kafka.scram(mechanism, wrong);
        let source = kafka.source("orders", "billing", &settings);
        tracing::info!(%source, "consuming");
        let error = consumer_error(&source).await;
        eprintln!(
            "DEBUG LOGS {}",
            String::from_utf8_lossy(&logs.lock().unwrap())
        );
        assert!(error.contains("authentication failed"), "{error}");
        assert!(!error.contains(wrong), "{error}");

        let to = kafka.destination("orders", &settings);
        let (error, kind) = publisher_error(&to).await;
        assert!(error.contains("authentication failed"), "{error}");
        assert!(!error.contains(wrong), "{error}");
        assert_eq!(kind, PublishErrorKind::Config, "{error}");
        for shown in [
            source.to_string(),
            format!("{source:?}"),
            to.redacted(),
            format!("{to:?}"),
        ] {
            assert!(!shown.contains(wrong), "{shown}");
        }
    }
    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        logs.contains("consuming"),
        "the logs were not captured: {logs}"
    );
    assert!(
        logs.contains("librdkafka reported an error"),
        "librdkafka's errors were not captured: {logs}"
    );
    assert!(!logs.contains(wrong), "{logs}");
}
