//! End to end through the outbox: an HTTP request with `Idempotency-Key` →
//! an atomic handler that writes the order and enqueues a message keyed from
//! the request's key → the relay → RabbitMQ → a deduping consumer. Duplicates
//! are injected at every hop (the client retries, the relay dies after the
//! broker confirmed, the broker redelivers); each hop sees the same key and the
//! effects happen once.

mod outbox_support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::{
    AnyStore, AtomicStore, Fingerprint, IdempotencyKey, ManualClock, Outcome, RecordStore, Scope,
    SqliteStore,
};
use idem_broker::outbox::{Outbox, derive_key};
use idem_broker::publish::Message;
use idem_broker::relay::{FailPoint, Relay, RelayConfig};
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};
use outbox_support::{Rabbit, sqlite};

async fn count(store: &SqliteStore, sql: &'static str) -> i64 {
    store
        .with_connection(move |c| c.query_row(sql, [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flows_from_http_through_the_outbox_and_broker_to_the_consumer() {
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let to = Rabbit::destination(&queue);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;

    // Hop 1: the HTTP service. Its handler writes the order and enqueues the
    // event in the same transaction, keyed from the request's key.
    let config = IdempotencyConfig::default().require_key(KeyRequirement::Always);
    let outbox = Outbox::of(&store);
    let route = atomic::route(store.clone(), config, move |request: AtomicRequest| {
        let to = to.clone();
        async move |tx| -> HandlerResult {
            tx.execute_batch("CREATE TABLE IF NOT EXISTS orders (body BLOB)")?;
            tx.execute("INSERT INTO orders VALUES (?1)", [request.body().as_ref()])?;
            let key = derive_key(request.key().expect("required"), "order-created")?;
            let message = Message::new(key, request.body().to_vec());
            outbox.enqueue(tx, &to, &message).await?;
            Ok(StoredResponse::text(StatusCode::CREATED, "ordered"))
        }
    });
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
            .body(Full::new(Bytes::from_static(b"{\"sku\":\"tea\"}")))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        replays += usize::from(response.headers().contains_key("idempotent-replayed"));
        response.into_body().collect().await.unwrap();
    }
    assert_eq!(replays, 2);
    assert_eq!(count(&store, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(count(&store, "SELECT count(*) FROM idem_outbox").await, 1);
    let outbox_key: String = store
        .with_connection(|c| c.query_row("SELECT key FROM idem_outbox", [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outbox_key, "checkout-1/order-created");

    // Hop 2: the relay dies after the broker confirmed; the next one sends again.
    let any = AnyStore::Sqlite(store.clone());
    let crashing =
        Relay::new(any.clone(), RelayConfig::default()).with_fail_point(FailPoint::AfterPublish);
    assert!(crashing.run_once().await.is_err());
    clock.advance(RelayConfig::default().lease + std::time::Duration::from_millis(1));
    let relay = Relay::new(any, RelayConfig::default());
    assert_eq!(relay.run_once().await.unwrap().sent, 1);
    let received = rabbit.drain(&queue).await;
    assert_eq!(received.len(), 2);

    // Hop 3: the consumer, which also sees every delivery twice (a redelivery
    // after a lost ack), applies under the message_id.
    let (_consumer_dir, consumer) = sqlite(&clock).await;
    let scope = Scope::new("order-events").unwrap();
    let mut fresh = 0;
    for delivery in received.iter().chain(received.iter()) {
        let message_id = delivery.message_id.clone().expect("message_id");
        let key = IdempotencyKey::new(message_id).unwrap();
        let applied = consumer
            .apply(
                &scope,
                &key,
                Fingerprint::of_bytes(&delivery.payload),
                async |tx| -> idem::rusqlite::Result<Outcome> {
                    tx.execute_batch(
                        "CREATE TABLE IF NOT EXISTS shipments (n INTEGER); INSERT INTO shipments VALUES (1);",
                    )?;
                    Ok(Outcome::success("shipped"))
                },
            )
            .await
            .unwrap();
        fresh += usize::from(!applied.is_replay());
    }
    assert_eq!(fresh, 1);
    assert_eq!(count(&consumer, "SELECT count(*) FROM shipments").await, 1);
    let record = RecordStore::get(
        &consumer,
        &scope,
        &IdempotencyKey::new("checkout-1/order-created").unwrap(),
    )
    .await
    .unwrap();
    assert!(record.is_some(), "the consumer deduped on the same key");
}
