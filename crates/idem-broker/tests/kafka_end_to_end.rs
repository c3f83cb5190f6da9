//! Kafka end to end: an HTTP request with `Idempotency-Key` → an atomic
//! handler that writes the order and enqueues its event in the outbox → the
//! relay, with the idempotent producer → Kafka → the effectively-once
//! consumer. Duplicates are injected at every hop (the client retries, the
//! relay dies after Kafka confirmed and sends again, a producer repeats the
//! record); the key is the same at every hop and the effects happen once.
//! Also: what the Kafka publisher puts on a record, and the producer settings
//! it refuses.

mod consumer_support;
mod outbox_support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use consumer_support::{Broker, Kafka, Running, config};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::{AnyStore, IdempotencyKey, ManualClock, Outcome, SqliteStore};
use idem_broker::consume::{AtomicApply, Consumer, KeyedMessage, Transport};
use idem_broker::outbox::{Outbox, derive_key};
use idem_broker::publish::{self, Destination, Message, Publish, PublishErrorKind};
use idem_broker::relay::{FailPoint, Relay, RelayConfig};
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};
use outbox_support::sqlite;

async fn count(store: &SqliteStore, sql: &'static str) -> i64 {
    store
        .with_connection(move |c| c.query_row(sql, [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap()
}

fn destination(kafka: &Kafka, query: &str) -> Destination {
    format!("kafka://{}/{}{query}", kafka.brokers, kafka.topic)
        .parse()
        .expect("a kafka destination")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flows_from_http_through_the_outbox_and_kafka_to_the_consumer() {
    let Some(kafka) = Kafka::with_partitions(2).await else {
        return;
    };
    let to = destination(&kafka, "?record_key=key");
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;

    // Hop 1: the HTTP service writes the order and enqueues its event in one
    // transaction, keyed from the request's key. The client sends it 3 times.
    let outbox = Outbox::of(&store);
    let route = atomic::route(
        store.clone(),
        IdempotencyConfig::default().require_key(KeyRequirement::Always),
        move |request: AtomicRequest| {
            let to = to.clone();
            async move |tx| -> HandlerResult {
                tx.execute_batch("CREATE TABLE IF NOT EXISTS orders (body BLOB)")?;
                tx.execute("INSERT INTO orders VALUES (?1)", [request.body().as_ref()])?;
                let key = derive_key(request.key().expect("required"), "order-created")?;
                outbox
                    .enqueue(tx, &to, &Message::new(key, request.body().to_vec()))
                    .await?;
                Ok(StoredResponse::text(StatusCode::CREATED, "ordered"))
            }
        },
    );
    let app = axum::Router::new().route("/checkout", axum::routing::post_service(route));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut replays = 0;
    for _client_retry in 0..3 {
        let request = Request::post(format!("http://{addr}/checkout"))
            .header("idempotency-key", "\"checkout-1\"")
            .body(Full::new(Bytes::from_static(b"{\"amount\": 10}")))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        replays += usize::from(response.headers().contains_key("idempotent-replayed"));
        response.into_body().collect().await.unwrap();
    }
    assert_eq!(replays, 2);
    assert_eq!(count(&store, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(count(&store, "SELECT count(*) FROM idem_outbox").await, 1);

    // Hop 2: the relay dies after Kafka confirmed the record, before marking
    // the row sent; the next relay sends it again.
    let any = AnyStore::Sqlite(store.clone());
    let crashing =
        Relay::new(any.clone(), RelayConfig::default()).with_fail_point(FailPoint::AfterPublish);
    assert!(crashing.run_once().await.is_err());
    clock.advance(RelayConfig::default().lease + Duration::from_millis(1));
    let relay = Relay::new(any, RelayConfig::default());
    assert_eq!(relay.run_once().await.unwrap().sent, 1);
    // And a producer elsewhere repeats it once more.
    kafka
        .publish(Some("checkout-1/order-created"), b"{\"amount\": 10}")
        .await;

    // Hop 3: the consumer applies under the idempotency-key header.
    let (_consumer_dir, shipments) = sqlite(&clock).await;
    shipments
        .with_connection(|c| c.execute_batch("CREATE TABLE shipments (key TEXT)"))
        .await
        .unwrap()
        .unwrap();
    let apply = AtomicApply::new(shipments.clone(), |message: Arc<KeyedMessage>| {
        async move |tx: &mut idem::rusqlite::Connection| -> idem::rusqlite::Result<Outcome> {
            tx.execute("INSERT INTO shipments VALUES (?1)", [message.key.as_str()])?;
            Ok(Outcome::success("shipped"))
        }
    });
    let consumer = Consumer::new(kafka.transport().await, apply, config(kafka.key_rule()));
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let stats = running
        .until("the three copies settled", |s| s.applied + s.replayed >= 3)
        .await;
    running.stop().await;
    assert_eq!((stats.applied, stats.replayed), (1, 2), "{stats:?}");
    let keys: Vec<String> = shipments
        .with_connection(|c| {
            let mut statement = c.prepare("SELECT key FROM shipments")?;
            let rows = statement.query_map([], |r| r.get(0))?;
            rows.collect::<Result<Vec<String>, _>>()
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(keys, ["checkout-1/order-created"], "one effect, same key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sends_the_key_as_a_header_and_the_record_key_on_request() {
    let Some(kafka) = Kafka::with_partitions(1).await else {
        return;
    };
    let publisher = publish::connect(&destination(&kafka, "?record_key=header:order-id"))
        .await
        .expect("connect");
    let message = Message::new(IdempotencyKey::new("order-7/paid").unwrap(), b"{}".to_vec())
        .with_header("order-id", "order-7");
    publisher.publish(&message).await.expect("confirmed");

    let mut transport = kafka.transport().await;
    let delivery = tokio::time::timeout(Duration::from_secs(30), transport.receive())
        .await
        .expect("a record within 30 s")
        .expect("receive")
        .expect("a record");
    assert_eq!(delivery.message.message_id.as_deref(), Some("order-7/paid"));
    assert_eq!(delivery.message.header("order-id"), Some("order-7"));
    assert_eq!(
        delivery.message.record_key.as_deref(),
        Some(b"order-7".as_slice())
    );
    assert_eq!(
        delivery.message.coordinates.as_deref(),
        Some(format!("{}/0/0", kafka.topic).as_str())
    );
    transport.close().await;

    for unsafe_setting in ["acks=1", "enable.idempotence=false", "max.in.flight=10"] {
        let error = publish::connect(&destination(&kafka, &format!("?{unsafe_setting}")))
            .await
            .expect_err(unsafe_setting);
        assert_eq!(error.kind(), PublishErrorKind::Config, "{error}");
        let name = unsafe_setting.split('=').next().unwrap();
        assert!(error.to_string().contains(name), "{error}");
    }
    let missing = publish::connect(
        &"kafka://127.0.0.1:9092/idem-t-no-such-topic"
            .parse::<Destination>()
            .unwrap(),
    )
    .await
    .expect_err("no such topic");
    assert!(missing.to_string().contains("no topic"), "{missing}");
}
