//! Kafka over SASL_SSL: the URL's settings reach librdkafka, which this
//! build makes with TLS. No broker speaks SASL_SSL here, so the tests stop at
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
