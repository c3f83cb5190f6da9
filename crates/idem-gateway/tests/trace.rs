//! Spans and trace context over real sockets: the layer's `idempotency` span
//! continues the `traceparent` a client sent, so every retry of a request is
//! one more child in the same trace; the gateway continues it too and passes
//! the trace on to the upstream. The spans name the thread they ran on,
//! which shows a gateway serving one runtime per core use several.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use common::Server;
use common::gateway::{Gateway, Options, Upstream, embedded};
use idem::{IdempotencyKey, ManualClock, SqliteStore};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use idem_testkit::spans::{SpanId, Spans, TraceId, attribute};
use idem_trace::KeyInSpans;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{CALLER}-01")
}

fn trace_id() -> TraceId {
    TraceId::from_hex(TRACE).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_retry_of_a_request_continues_the_callers_trace() {
    let spans = Spans::install();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    let config = IdempotencyConfig::default().key_in_spans(KeyInSpans::Hashed);
    let app = Router::new()
        .route("/pay", post(|| async { (StatusCode::CREATED, "paid") }))
        .layer(IdempotencyLayer::new(store, config));
    let server = Server::start(app).await;
    let client = server.client();
    for _retry in 0..2 {
        let reply = client
            .post("/pay")
            .key("pay-7")
            .header("traceparent", &traceparent())
            .json(&json!({ "amount": 7 }))
            .send()
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }

    let attempts = spans.in_trace("idempotency", trace_id());
    assert_eq!(attempts.len(), 2, "the first attempt and its retry");
    for attempt in &attempts {
        assert_eq!(
            attempt.parent_span_id,
            SpanId::from_hex(CALLER).unwrap(),
            "a child of the caller's span"
        );
        assert!(attempt.parent_span_is_remote);
        let key = IdempotencyKey::new("pay-7").unwrap();
        assert_eq!(
            attribute(attempt, "idempotency_key").unwrap(),
            KeyInSpans::Hashed.show(&key)
        );
        assert!(attribute(attempt, "scope").is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_continues_the_trace_and_passes_it_upstream() {
    let spans = Spans::install();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let options = Options::default();
    let store = embedded(dir.path(), &options.idempotency, Arc::new(clock)).await;
    let upstream = Upstream::default();
    let upstream_server = upstream.start().await;
    let gateway = Gateway::start(upstream_server.addr, store, options).await;
    let reply = gateway
        .client()
        .post("/payments")
        .key("gw-1")
        .header("traceparent", &traceparent())
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);

    let outer = spans.in_trace("gateway", trace_id());
    assert_eq!(outer.len(), 1);
    assert_eq!(outer[0].parent_span_id, SpanId::from_hex(CALLER).unwrap());
    let layer = spans.in_trace("idempotency", trace_id());
    assert_eq!(layer.len(), 1);
    assert_eq!(
        layer[0].parent_span_id,
        outer[0].span_context.span_id(),
        "the layer's span sits under the gateway's"
    );
    assert_eq!(attribute(&layer[0], "idempotency_key").unwrap(), "gw-1");

    let seen = upstream.seen();
    let forwarded = seen[0]["traceparent"].to_str().unwrap();
    let parts: Vec<&str> = forwarded.split('-').collect();
    assert_eq!(parts[1], TRACE, "the upstream joins the caller's trace");
    assert_eq!(
        parts[2],
        layer[0].span_context.span_id().to_string(),
        "as a child of the layer's span"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_requests_are_served_on_several_threads_and_each_drains_on_shutdown() {
    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const CONNECTIONS: usize = 16;
    let spans = Spans::install();
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        runtime: idem_gateway::Runtime::PerCore,
        workers: std::num::NonZeroUsize::new(3),
        ..Options::default()
    };
    let store = embedded(
        dir.path(),
        &options.idempotency,
        Arc::new(ManualClock::starting_now()),
    )
    .await;
    let upstream = Upstream::default();
    let upstream_server = upstream.start().await;
    let mut gateway = Gateway::start(upstream_server.addr, store, options).await;
    // Each request on a connection of its own, held at the upstream: the
    // kernel spreads the connections over the runtimes' sockets.
    let client = gateway.client();
    let in_flight: Vec<_> = (0..CONNECTIONS)
        .map(|n| {
            let call = client
                .post("/slow")
                .key(&format!("slow-{n}"))
                .header("traceparent", &format!("00-{TRACE}-{CALLER}-01"));
            tokio::spawn(call.send())
        })
        .collect();
    while upstream.calls() < CONNECTIONS {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopped = gateway.shut_down();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(gateway.addr).await.is_ok() {
        assert!(tokio::time::Instant::now() < give_up, "still accepting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!stopped.is_finished(), "requests are still in flight");
    upstream.open_gate(CONNECTIONS);
    for answer in in_flight {
        assert_eq!(answer.await.unwrap().status, StatusCode::CREATED);
    }
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the shutdown ends once every runtime drained")
        .unwrap()
        .unwrap();

    let threads: BTreeSet<String> = spans
        .in_trace("gateway", TraceId::from_hex(TRACE).unwrap())
        .iter()
        .map(|span| attribute(span, "thread.name").expect("the span names its thread"))
        .collect();
    assert!(
        threads.len() >= 2 && threads.iter().all(|t| t.starts_with("idem-serve-")),
        "served on {threads:?}"
    );
}
