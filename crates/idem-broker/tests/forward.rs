//! The sidecar (`idem forward`) against the real brokers and a local axum
//! endpoint behind idem-http's Idempotency-Key layer: duplicates, a 503, and
//! a key reused with another payload. Effects are counted by the endpoint.

mod consumer_support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use consumer_support::{Broker, Jet, Kafka, Rabbit, Running, config};
use idem::SqliteStore;
use idem_broker::consume::{Consumer, Source, SourceOptions};
use idem_broker::dead_letter::DeadLetterStore;
use idem_broker::forward::{ForwardConfig, HttpForward};
use idem_http::{IdempotencyConfig, IdempotencyLayer};

#[derive(Clone, Default)]
struct Endpoint {
    effects: Arc<AtomicUsize>,
    failed_once: Arc<Mutex<HashSet<String>>>,
}

/// Applies an order; the first call for key `flaky-1` answers 503.
async fn orders(
    State(endpoint): State<Endpoint>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    if key == "flaky-1" && endpoint.failed_once.lock().unwrap().insert(key.clone()) {
        return (StatusCode::SERVICE_UNAVAILABLE, "try again".into());
    }
    let effect = endpoint.effects.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!("effect {effect} for {key}: {body}"),
    )
}

struct Server {
    url: String,
    endpoint: Endpoint,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve() -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("endpoint.db"))
        .await
        .expect("endpoint store");
    let endpoint = Endpoint::default();
    let app = Router::new()
        .route("/orders", post(orders))
        .layer(IdempotencyLayer::new(store, IdempotencyConfig::default()))
        .with_state(endpoint.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/orders", listener.local_addr().expect("address"));
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    Server {
        url,
        endpoint,
        task,
        _dir: dir,
    }
}

const ORDER: &[u8] = br#"{"amount": 10}"#;
const OTHER: &[u8] = br#"{"amount": 99}"#;

async fn forward_scenario<B: Broker>(broker: B, source: Source) {
    let server = serve().await;
    broker.publish(Some("order-1"), ORDER).await;
    broker.publish(Some("order-1"), ORDER).await;
    broker.publish(Some("order-2"), ORDER).await;
    broker.publish(Some("flaky-1"), ORDER).await;
    broker.publish(Some("order-3"), ORDER).await;
    broker.publish(Some("order-3"), OTHER).await; // the key reused: 422

    let dir = tempfile::tempdir().expect("temp dir");
    let sidecar_store = SqliteStore::open(dir.path().join("sidecar.db"))
        .await
        .expect("sidecar store");
    let transport = source
        .connect(SourceOptions::default())
        .await
        .expect("connect the source");
    let forward = HttpForward::new(
        sidecar_store.clone(),
        ForwardConfig::new(server.url.parse().expect("endpoint URL")),
    );
    let consumer = Consumer::new(
        transport,
        forward,
        config(broker.key_rule())
            .concurrency(1)
            .dead_letter_terminal_failures(true),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let stats = running
        .until("every message settled", |s| s.acked() >= 6)
        .await;
    running.stop().await;

    assert_eq!(
        server.endpoint.effects.load(Ordering::SeqCst),
        4,
        "{stats:?}"
    );
    assert_eq!(
        (stats.applied, stats.replayed, stats.dead_lettered),
        (4, 1, 1),
        "{stats:?}"
    );
    assert!(stats.requeued >= 1, "the 503 was retried: {stats:?}");
    let letters = sidecar_store
        .list_dead_letters(10, false)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].key.as_str(), "order-3");
    assert_eq!(letters[0].payload, OTHER);
    assert!(
        letters[0].last_error.contains("422"),
        "{}",
        letters[0].last_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_from_rabbitmq_once_per_key() {
    let Some(broker) = Rabbit::start().await else {
        return;
    };
    let source: Source = format!("{}/{}", broker.url.trim_end_matches("/%2f"), broker.queue)
        .parse()
        .expect("source URL");
    forward_scenario(broker, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_from_jetstream_once_per_key() {
    let Some(broker) = Jet::start().await else {
        return;
    };
    let source: Source = format!("{}/{}/worker", broker.url, broker.stream)
        .parse()
        .expect("source URL");
    forward_scenario(broker, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_from_kafka_once_per_key() {
    // One partition: the reused key's second payload comes after its first.
    let Some(broker) = Kafka::with_partitions(1).await else {
        return;
    };
    let source: Source = format!(
        "kafka://{}/{}?group={}&session.timeout.ms=6000",
        broker.brokers, broker.topic, broker.group
    )
    .parse()
    .expect("source URL");
    forward_scenario(broker, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_from_sqs_once_per_key() {
    // The reused key's second payload must come after its first: moto's
    // standard queues hand messages out in the order they were sent (SQS's
    // own only try to).
    let Some(broker) = consumer_support::Sqs::start().await else {
        return;
    };
    let source: Source = format!("{}&visibility=2s&wait=1s", broker.url)
        .parse()
        .expect("source URL");
    forward_scenario(broker, source).await;
}
