//! RabbitMQ over TLS, against a node of the test's own that listens with
//! TLS only (the shared broker is not touched), with certificates made on
//! the spot. The node requires a client certificate: the publisher and the
//! consumer reach it through `amqps://` with the CA file and the client's
//! certificate and key, and a message published twice is consumed
//! effectively once; without the client certificate the server refuses;
//! the wrong CA and a missing CA file each fail with an error that says so,
//! and the password is never printed. One node serves every case: it takes
//! 10 to 20 seconds to boot.

mod consumer_support;

use std::time::Duration;

use consumer_support::{Bank, Running, SqliteBank, config};
use idem::IdempotencyKey;
use idem_broker::consume::{Consumer, KeyRule, KeySource, Source, SourceOptions, Transport};
use idem_broker::publish::{self, Destination, Message, Publish};
use idem_testkit::rabbitmq::RabbitTls;
use idem_testkit::tls::TlsFiles;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

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

async fn connect_error(source: &str) -> String {
    let source: Source = source.parse().expect("the source parses");
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        source.connect(SourceOptions::default()),
    )
    .await
    .expect("a refusal, not a hang");
    match result {
        Ok(mut transport) => {
            let _ = transport.receive().await;
            panic!("{source} should not connect")
        }
        Err(error) => chain(&error),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_the_ca_file_publishes_and_consumes_once() {
    let files = TlsFiles::generate();
    let Some(node) = RabbitTls::start(&files.server_cert, &files.server_key, Some(&files.ca)).await
    else {
        return;
    };
    let base = format!("amqps://guest:guest@127.0.0.1:{}/%2f", node.port());
    let ca = files.ca.display().to_string();
    let client = format!(
        "certfile={}&keyfile={}",
        files.client_cert.display(),
        files.client_key.display()
    );

    // The publisher declares nothing: the queue is made through the same
    // TLS connection code the consumer uses.
    let to: Destination = format!("{base}?cacertfile={ca}&{client}&queue=orders")
        .parse()
        .expect("the destination parses");
    assert!(!to.redacted().contains("guest@"), "{}", to.redacted());
    {
        let source: Source = format!("{base}/orders?cacertfile={ca}&{client}")
            .parse()
            .unwrap();
        let Source::Amqp { url, .. } = &source else {
            unreachable!()
        };
        let (connection, _) = declare(url).await;
        drop(connection);
    }
    let publisher = publish::connect(&to)
        .await
        .unwrap_or_else(|e| panic!("publish over TLS: {}\n{}", chain(&e), node.log()));
    let message = Message::new(
        IdempotencyKey::new("order-1").unwrap(),
        br#"{"amount": 10}"#.to_vec(),
    );
    publisher.publish(&message).await.expect("published");
    publisher.publish(&message).await.expect("published again");

    // The consumer takes the other spelling of the options.
    let source: Source = format!(
        "{base}/orders?tls_ca={ca}&tls_cert={}&tls_key={}",
        files.client_cert.display(),
        files.client_key.display()
    )
    .parse()
    .expect("the source parses");
    assert_eq!(
        source.to_string(),
        format!("amqps://guest:***@127.0.0.1:{}/%2f/orders", node.port())
    );
    let bank = SqliteBank::start().await.expect("sqlite");
    let transport = source
        .connect(SourceOptions::default())
        .await
        .unwrap_or_else(|e| panic!("consume over TLS: {}", chain(&e)));
    let consumer = Consumer::new(
        transport,
        bank.apply(false),
        config(KeyRule::new(KeySource::MessageId)),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("both copies", |s| s.applied + s.replayed >= 2)
        .await;
    let stats = running.stop().await;
    assert_eq!(bank.ledger().await, ["order-1"], "{stats:?}");
    assert_eq!(stats.applied, 1, "{stats:?}");

    // Without the client certificate the server ends the handshake.
    let anonymous = connect_error(&format!("{base}/orders?cacertfile={ca}")).await;
    assert!(anonymous.contains("client certificate"), "{anonymous}");

    // A CA that did not sign the server's certificate.
    let password = "s3cret-Hq7-password";
    let wrong = connect_error(&format!(
        "amqps://guest:{password}@127.0.0.1:{}/%2f/orders?cacertfile={}",
        node.port(),
        files.other_ca.display()
    ))
    .await;
    assert!(wrong.contains("certificate did not verify"), "{wrong}");
    assert!(wrong.contains("cacertfile"), "{wrong}");
    assert!(!wrong.contains(password), "{wrong}");

    // No CA file at all: the system's roots do not know the test CA.
    let unknown = connect_error(&format!("{base}/orders")).await;
    assert!(unknown.contains("certificate did not verify"), "{unknown}");

    // A CA file that is not there.
    let missing = connect_error(&format!("{base}/orders?cacertfile=/nonexistent/ca.pem")).await;
    assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");

    // The publisher reports the same.
    let to: Destination = format!(
        "amqps://guest:{password}@127.0.0.1:{}/%2f?cacertfile={}&queue=orders",
        node.port(),
        files.other_ca.display()
    )
    .parse()
    .unwrap();
    let refused = match publish::connect(&to).await {
        Ok(publisher) => chain(&publisher.publish(&message).await.unwrap_err()),
        Err(error) => chain(&error),
    };
    assert!(refused.contains("certificate did not verify"), "{refused}");
    assert!(!refused.contains(password), "{refused}");
}

/// Declares the test's queue over the source's own URL (TLS files included).
async fn declare(url: &str) -> (lapin::Connection, lapin::Channel) {
    let (uri, tls) = split(url);
    let connection = lapin::Connection::connect_with_config(
        &uri,
        lapin::ConnectionProperties::default(),
        tls,
        lapin::runtime::default_runtime().unwrap(),
    )
    .await
    .expect("the test's own connection");
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_declare(
            "orders".into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare the queue");
    (connection, channel)
}

/// The URL without its query, and the files it names as lapin's TLS
/// settings.
fn split(url: &str) -> (String, lapin::tcp::OwnedTLSConfig) {
    let (base, query) = url.split_once('?').expect("a query");
    let file = |name: &str| {
        let path = query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name}"));
        std::fs::read(path).expect("a TLS file")
    };
    (
        base.to_owned(),
        lapin::tcp::OwnedTLSConfig {
            identity: Some(lapin::tcp::OwnedIdentity::PKCS8 {
                pem: file("certfile="),
                key: file("keyfile="),
            }),
            cert_chain: Some(String::from_utf8(file("cacertfile=")).unwrap()),
        },
    )
}
