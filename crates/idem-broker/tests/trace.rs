//! One trace from the operation that enqueued a message to every delivery of
//! it: the outbox row stores the producer's `traceparent`, each publish by
//! the relay continues it (a relay that died after the broker confirmed
//! publishes again, in the same trace), and the consumer's span continues the
//! message's header, so the first delivery and the duplicate sit side by side.

mod outbox_support;

use std::sync::Arc;
use std::time::Duration;

use idem::{AnyStore, Clock, IdempotencyKey, ManualClock, Outcome, Scope};
use idem_broker::consume::{AmqpTransport, AtomicApply, Consumer, ConsumerConfig, KeyedMessage};
use idem_broker::outbox::{self, Route};
use idem_broker::publish::Message;
use idem_broker::relay::{FailPoint, Relay, RelayConfig};
use idem_testkit::spans::{Spans, attribute};
use idem_trace::KeyInSpans;
use outbox_support::{AMQP_URL, Rabbit, sqlite};
use tracing::Instrument;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_the_relay_and_every_delivery_share_one_trace() {
    let spans = Spans::install();
    let Some(rabbit) = Rabbit::new().await else {
        return;
    };
    let queue = rabbit.queue().await;
    let to = Rabbit::destination(&queue);
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let store = AnyStore::Sqlite(store);
    let key = IdempotencyKey::new(outbox_support::unique("order-7/created")).unwrap();

    // The producer enqueues inside its own span.
    let producer = tracing::info_span!("checkout");
    let message = Message::new(key.clone(), b"{\"order\":7}".to_vec());
    outbox::enqueue_now(&store, Route::To(&to), &message)
        .instrument(producer.clone())
        .await
        .unwrap();
    drop(producer);

    // The relay publishes, dies before marking the row sent, and a second
    // relay publishes it again after the lease: the broker holds two copies.
    let config = RelayConfig {
        key_in_spans: KeyInSpans::Hashed,
        ..RelayConfig::default()
    };
    let crashing =
        Relay::new(store.clone(), config.clone()).with_fail_point(FailPoint::AfterPublish);
    assert!(crashing.run_once().await.is_err());
    clock.advance(config.lease + Duration::from_millis(1));
    assert_eq!(
        Relay::new(store.clone(), config)
            .run_once()
            .await
            .unwrap()
            .sent,
        1
    );

    // The consumer applies the first copy and answers the second from the store.
    let (_consumer_dir, consumer_store) = sqlite(&clock).await;
    let transport = AmqpTransport::connect(AMQP_URL, &queue, 8).await.unwrap();
    let effect = AtomicApply::new(consumer_store, |_message: Arc<KeyedMessage>| {
        async move |_tx| -> idem::rusqlite::Result<Outcome> { Ok(Outcome::success("shipped")) }
    });
    let consumer = Consumer::new(
        transport,
        effect,
        ConsumerConfig::new(Scope::new("shipping").unwrap()),
    );
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(consumer.run(async {
        stopped.await.ok();
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while stats.snapshot().acked() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "both copies consumed: {:?}",
            stats.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).ok();
    let settled = running.await.unwrap().unwrap();
    assert_eq!((settled.applied, settled.replayed), (1, 1));

    let checkout = spans.named("checkout");
    assert_eq!(checkout.len(), 1);
    let trace = checkout[0].span_context.trace_id();
    let checkout_id = checkout[0].span_context.span_id();

    let publishes = spans.in_trace("publish", trace);
    assert_eq!(
        publishes.len(),
        2,
        "both publishes joined the producer's trace"
    );
    for publish in &publishes {
        assert_eq!(publish.parent_span_id, checkout_id);
        assert_eq!(
            attribute(publish, "idempotency_key").unwrap(),
            KeyInSpans::Hashed.show(&key),
            "the relay was told to hash keys"
        );
    }

    let consumes = spans.in_trace("consume", trace);
    assert_eq!(
        consumes.len(),
        2,
        "the delivery and its duplicate, one trace"
    );
    let publish_ids: Vec<_> = publishes.iter().map(|p| p.span_context.span_id()).collect();
    for consume in &consumes {
        assert!(
            publish_ids.contains(&consume.parent_span_id),
            "each delivery is a child of the publish that sent it"
        );
        assert!(consume.parent_span_is_remote);
        assert_eq!(attribute(consume, "idempotency_key").unwrap(), key.as_str());
        assert_eq!(attribute(consume, "scope").unwrap(), "shipping");
    }
}

#[tokio::test]
async fn a_traceparent_the_producer_set_is_kept() {
    let _spans = Spans::install();
    let clock = ManualClock::starting_now();
    let (_dir, store) = sqlite(&clock).await;
    let own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let message = Message::new(IdempotencyKey::new("k-own").unwrap(), b"{}".to_vec())
        .with_header("traceparent", own);
    outbox::enqueue_now(&store, Route::Default, &message)
        .instrument(tracing::info_span!("producer"))
        .await
        .unwrap();
    let claimed = idem_broker::outbox::OutboxStore::claim_outbox(
        &store,
        "t",
        clock.now(),
        Duration::from_secs(30),
        10,
        true,
    )
    .await
    .unwrap();
    assert_eq!(claimed[0].message.headers["traceparent"], own);
    assert!(!claimed[0].message.headers.contains_key("tracestate"));
}
