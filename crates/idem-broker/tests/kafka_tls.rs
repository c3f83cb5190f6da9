//! Kafka over SASL_SSL: the URL's settings reach librdkafka, which this
//! build makes with TLS. No broker speaks SASL_SSL here, so the TLS tests stop at
//! what the client does alone: clients are created with SASL_SSL and PLAIN or
//! SCRAM, a CA file that is not there is an error at creation that names it,
//! and the password shows nowhere.

use idem_broker::consume::Source;
use idem_broker::kafka::Settings;
use idem_broker::publish::{self, Destination};
use idem_testkit::tls::TlsFiles;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::BaseProducer;

const PASSWORD: &str = "kafka-pw-Xy81";

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

#[test]
fn a_client_certificate_is_taken() {
    let files = TlsFiles::generate();
    let settings = Settings::new()
        .set("security.protocol", "SSL")
        .set("ssl.ca.location", files.ca.display().to_string())
        .set(
            "ssl.certificate.location",
            files.client_cert.display().to_string(),
        )
        .set("ssl.key.location", files.client_key.display().to_string());
    settings
        .producer("127.0.0.1:9093")
        .expect("safe settings")
        .create::<BaseProducer>()
        .unwrap_or_else(|e| panic!("an SSL producer with a client certificate: {e}"));
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
        Err(error) => {
            let mut text = error.to_string();
            let mut next = std::error::Error::source(&error);
            while let Some(source) = next {
                text.push_str(": ");
                text.push_str(&source.to_string());
                next = source.source();
            }
            text
        }
    };
    assert!(error.contains("ssl.ca.location"), "{error}");
    assert!(!error.contains(PASSWORD), "{error}");
}

/// SASL/SCRAM against a real broker: the test's own tansu, which requires
/// authentication. tansu 0.6 takes `--cert`/`--key` but does not serve TLS
/// on its listener, so the handshake is SASL over plain TCP
/// (`SASL_PLAINTEXT`); the SASL exchange is the one SASL_SSL runs inside TLS.
#[path = "consumer_support/tansu.rs"]
mod tansu;

mod scram_against_tansu {
    use std::time::Duration;

    use super::tansu::Tansu;
    use idem_broker::kafka::Settings;
    use rdkafka::Message;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    const USER: &str = "billing";
    const USER_PASSWORD: &str = "scram-pw-Q7t2";

    fn scram(password: &str) -> Settings {
        Settings::new()
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", USER)
            .set("sasl.password", password)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scram_user_publishes_and_consumes() {
        let Some(tansu) = Tansu::start_with_users(&[(USER, USER_PASSWORD)]).await else {
            return;
        };
        let brokers = tansu.brokers();
        let settings = scram(USER_PASSWORD);
        let topic = "scram-orders";
        let admin: AdminClient<DefaultClientContext> = settings
            .producer(&brokers)
            .expect("safe settings")
            .create()
            .expect("an admin client");
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let created = admin
            .create_topics(
                [&NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
                &options,
            )
            .await
            .unwrap_or_else(|e| panic!("create a topic as {USER}: {e}; {}", tansu.log()));
        for result in created {
            result.unwrap_or_else(|(name, e)| panic!("create {name}: {e}"));
        }

        let producer: FutureProducer = settings
            .producer(&brokers)
            .expect("safe settings")
            .create()
            .expect("a producer");
        producer
            .send(
                FutureRecord::to(topic).key("k").payload("order-1"),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|(e, _)| panic!("publish as {USER}: {e}; {}", tansu.log()));

        let consumer: StreamConsumer = settings
            .consumer(&brokers, "scram-group")
            .expect("safe settings")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("a consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("no record within 30 s; {}", tansu.log()))
            .expect("a record");
        assert_eq!(message.payload(), Some(&b"order-1"[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrong_password_is_an_authentication_error_without_the_password() {
        let Some(tansu) = Tansu::start_with_users(&[(USER, USER_PASSWORD)]).await else {
            return;
        };
        let wrong = "wrong-pw-Zr55";
        let context = Errors::default();
        let seen = context.0.clone();
        let consumer: rdkafka::consumer::BaseConsumer<Errors> = scram(wrong)
            .consumer(&tansu.brokers(), "scram-group")
            .expect("safe settings")
            .create_with_context(context)
            .expect("a consumer");
        let refused = tokio::task::spawn_blocking(move || {
            consumer
                .fetch_metadata(None, Duration::from_secs(5))
                .map(|_| ())
        })
        .await
        .expect("the metadata request ran");
        assert!(refused.is_err(), "metadata with a wrong password");
        let error = seen.lock().expect("the errors").join("; ");
        assert!(
            error.contains("SASL SCRAM authentication failed"),
            "{error}"
        );
        assert!(!error.contains(wrong), "{error}");
    }

    /// A client context that keeps what librdkafka reports as errors.
    #[derive(Default, Clone)]
    struct Errors(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl rdkafka::ClientContext for Errors {
        fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
            self.0
                .lock()
                .expect("the errors")
                .push(format!("{error}: {reason}"));
        }
    }

    impl rdkafka::consumer::ConsumerContext for Errors {}
}
