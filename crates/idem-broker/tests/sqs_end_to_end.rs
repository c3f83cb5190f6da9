//! SQS end to end: an HTTP request with `Idempotency-Key` → an atomic
//! handler that writes the order and enqueues its event in the outbox → the
//! relay → an SQS queue (moto's server) → the effectively-once consumer.
//! Duplicates are injected at every hop (the client retries, the relay dies
//! after SQS accepted the message and sends again, a producer repeats it);
//! the key is the same at every hop and the effects happen once. Also: what
//! the SQS publisher puts on a message, on a standard and a FIFO queue.

mod consumer_support;
mod outbox_support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use consumer_support::{Broker, Running, Sqs, config};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::{AnyStore, IdempotencyKey, ManualClock, Outcome, SqliteStore};
use idem_broker::consume::{AtomicApply, Consumer, KeyedMessage, Transport};
use idem_broker::outbox::{Outbox, derive_key};
use idem_broker::publish::{self, Destination, Message, Publish};
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

fn destination(queue: &Sqs, query: &str) -> Destination {
    let joiner = if query.is_empty() { "" } else { "&" };
    format!("{}{joiner}{query}", queue.url)
        .parse()
        .expect("an sqs destination")
}

/// The HTTP service, the outbox and a relay that dies after SQS accepted the
/// message; then the consumer. Returns the consumer's (applied, replayed)
/// and the keys of its effects.
async fn through_the_outbox(
    queue: &Sqs,
    to: Destination,
    repeat: bool,
) -> ((u64, u64), Vec<String>) {
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

    // Hop 2: the relay dies after SQS accepted the message, before marking
    // the row sent; the next relay sends it again.
    let any = AnyStore::Sqlite(store.clone());
    let crashing =
        Relay::new(any.clone(), RelayConfig::default()).with_fail_point(FailPoint::AfterPublish);
    assert!(crashing.run_once().await.is_err());
    clock.advance(RelayConfig::default().lease + Duration::from_millis(1));
    let relay = Relay::new(any, RelayConfig::default());
    assert_eq!(relay.run_once().await.unwrap().sent, 1);
    if repeat {
        // And a producer elsewhere repeats it once more.
        queue
            .publish(Some("checkout-1/order-created"), b"{\"amount\": 10}")
            .await;
    }

    // Hop 3: the consumer applies under the idempotency-key attribute.
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
    let consumer = Consumer::new(queue.transport().await, apply, config(queue.key_rule()));
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    let copies = if repeat { 3 } else { 1 };
    running
        .until("the copies settled", |s| s.applied + s.replayed >= copies)
        .await;
    // Anything more the queue would hand out arrives within a poll.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = running.stop().await;
    let keys: Vec<String> = shipments
        .with_connection(|c| {
            let mut statement = c.prepare("SELECT key FROM shipments")?;
            let rows = statement.query_map([], |r| r.get(0))?;
            rows.collect::<Result<Vec<String>, _>>()
        })
        .await
        .unwrap()
        .unwrap();
    ((stats.applied, stats.replayed), keys)
}

/// A standard queue keeps every copy: the relay's two sends and the
/// producer's repeat reach the consumer, which applies one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flows_from_http_through_the_outbox_and_sqs_to_the_consumer() {
    let Some(queue) = Sqs::start().await else {
        return;
    };
    let to = destination(&queue, "");
    let (counts, keys) = through_the_outbox(&queue, to, true).await;
    assert_eq!(counts, (1, 2), "one applied, two answered from the record");
    assert_eq!(keys, ["checkout-1/order-created"], "one effect, same key");
    assert_eq!(queue.depth().await, (0, 0));
}

/// A FIFO queue drops the relay's second send (the same deduplication id,
/// the key, within five minutes): one copy reaches the consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_drops_the_relays_second_send_within_its_five_minutes() {
    let Some(queue) = Sqs::create(true, &[]).await else {
        return;
    };
    let to = destination(&queue, "group=orders");
    let (counts, keys) = through_the_outbox(&queue, to, false).await;
    assert_eq!(counts, (1, 0), "the queue kept one copy");
    assert_eq!(keys, ["checkout-1/order-created"]);
    assert_eq!(queue.depth().await, (0, 0));
}

/// The key travels as the `idempotency-key` attribute; on a FIFO queue also
/// as the deduplication id, and the group comes from a header when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sends_the_key_as_an_attribute_and_the_fifo_ids() {
    let Some(queue) = Sqs::create(true, &[]).await else {
        return;
    };
    let publisher = publish::connect(&destination(&queue, "group=header%3Aorder-id"))
        .await
        .expect("connect");
    let message = Message::new(IdempotencyKey::new("order-7/paid").unwrap(), b"{}".to_vec())
        .with_header("order-id", "order-7");
    publisher.publish(&message).await.expect("accepted");

    let mut transport = queue.transport().await;
    let delivery = tokio::time::timeout(Duration::from_secs(10), transport.receive())
        .await
        .expect("a message within 10 s")
        .expect("receive")
        .expect("a message");
    assert_eq!(delivery.message.message_id.as_deref(), Some("order-7/paid"));
    assert_eq!(delivery.message.header("order-id"), Some("order-7"));
    assert_eq!(delivery.message.header("MessageGroupId"), Some("order-7"));
    assert_eq!(
        delivery.message.header("MessageDeduplicationId"),
        Some("order-7/paid")
    );
    assert_eq!(delivery.message.delivery_count, Some(1));
    assert!(
        delivery
            .message
            .coordinates
            .as_deref()
            .is_some_and(|c| c.starts_with(&format!("{}/", queue.queue))),
        "{:?}",
        delivery.message.coordinates
    );
    transport.close().await;

    let binary = Message::new(IdempotencyKey::new("bin-1").unwrap(), vec![0xff, 0xfe]);
    let error = publisher.publish(&binary).await.expect_err("not text");
    assert_eq!(
        error.kind(),
        idem_broker::publish::PublishErrorKind::Rejected,
        "{error}"
    );
    let missing = publish::connect(
        &consumer_support::sqs::queue_url("idem-t-no-such-queue")
            .parse::<Destination>()
            .unwrap(),
    )
    .await
    .expect_err("no such queue");
    assert!(
        missing.to_string().contains("idem-t-no-such-queue"),
        "{missing}"
    );
}
