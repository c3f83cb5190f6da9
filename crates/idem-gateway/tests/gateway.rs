//! The gateway over real sockets: a client, `idem serve`'s service on
//! `127.0.0.1:0`, and an upstream on `127.0.0.1:0` that counts its effects.
//! Each case runs on the embedded store, on Redis, on PostgreSQL through a
//! PgBouncer in transaction pooling mode and on DynamoDB (moto's)
//! (`CASE::sqlite`, `CASE::redis`, `CASE::pgbouncer`, `CASE::dynamodb`): the
//! gateway answers the same on all four. On the embedded store each case
//! runs with the gateway on both runtimes: one runtime per core
//! (`CASE::sqlite`) and the test's own (`CASE::sqlite_shared`); on the
//! others, on the gateway's default. The cases about the listener itself
//! (slow heads and bodies, loops, upstream versions) run on the embedded
//! store on both runtimes (`CASE::per_core`, `CASE::shared`).

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use common::gateway::{
    Gateway, Hangup, Keep, Options, StoreKind, Upstream, on_both_runtimes, serving_on,
};
use common::{Client, Server};
use idem::{ManualClock, SystemClock};
use idem_http::{IdempotencyConfig, Mode};
use serde_json::json;
use tokio::task::JoinSet;

/// Runs a case on each store the gateway is tested on, as tests named after
/// the store.
macro_rules! on_each_store {
    ($case:ident) => {
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::serving_on(
                    idem_gateway::Runtime::PerCore,
                    super::$case(super::StoreKind::Embedded),
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite_shared() {
                super::serving_on(
                    idem_gateway::Runtime::Shared,
                    super::$case(super::StoreKind::Embedded),
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn redis() {
                super::$case(super::StoreKind::Redis).await
            }

            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pgbouncer() {
                super::$case(super::StoreKind::PgBouncer).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn dynamodb() {
                super::$case(super::StoreKind::DynamoDb).await
            }
        }
    };
}

/// An upstream, and a gateway in front of it on a fresh store of `kind`;
/// `None` when that store's server is not reachable (and not required).
struct Fixture {
    upstream: Upstream,
    gateway: Gateway,
    client: Client,
    clock: ManualClock,
    _upstream_server: Server,
    _keep: Keep,
    _dir: tempfile::TempDir,
}

async fn start(kind: StoreKind, options: Options) -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::starting_now();
    let (store, keep) = kind
        .open(dir.path(), &options.idempotency, Arc::new(clock.clone()))
        .await?;
    let upstream = Upstream::default();
    let upstream_server = upstream.start().await;
    let gateway = Gateway::start(upstream_server.addr, store, options).await;
    Some(Fixture {
        upstream,
        client: gateway.client(),
        gateway,
        clock,
        _upstream_server: upstream_server,
        _keep: keep,
        _dir: dir,
    })
}

fn with(idempotency: IdempotencyConfig) -> Options {
    Options {
        idempotency,
        ..Options::default()
    }
}

on_each_store!(sequential_duplicates_reach_the_upstream_once_and_are_replayed_byte_for_byte);
async fn sequential_duplicates_reach_the_upstream_once_and_are_replayed_byte_for_byte(
    kind: StoreKind,
) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    let body = json!({ "amount": 10, "to": "acc-1" });
    let first = f
        .client
        .post("/payments")
        .key("pay-1")
        .json(&body)
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.json()["effect"], 1);
    for _ in 0..3 {
        let again = f
            .client
            .post("/payments")
            .key("pay-1")
            .json(&body)
            .send()
            .await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("location"), Some("/payments/1"));
        assert_eq!(again.header("content-type"), Some("application/json"));
    }
    let second = f
        .client
        .post("/payments")
        .key("pay-2")
        .json(&body)
        .send()
        .await;
    assert_eq!(second.json()["effect"], 2);
    assert_eq!(f.upstream.effects(), 2);
}

on_each_store!(sixty_four_concurrent_requests_with_one_key_make_one_upstream_effect);
async fn sixty_four_concurrent_requests_with_one_key_make_one_upstream_effect(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    common::race_one_key(&f.client, "/payments", 64, json!({ "amount": 5 })).await;
    assert_eq!(f.upstream.effects(), 1);
    assert_eq!(f.upstream.calls(), 1);
}

on_each_store!(concurrent_duplicates_of_a_slow_request_get_409_while_it_runs);
async fn concurrent_duplicates_of_a_slow_request_get_409_while_it_runs(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    let mut calls = JoinSet::new();
    for _ in 0..64 {
        let client = f.client.clone();
        calls.spawn(async move { client.post("/slow").key("held").send().await });
    }
    for _ in 0..63 {
        let reply = tokio::time::timeout(Duration::from_secs(30), calls.join_next())
            .await
            .expect("63 answers while the first is held")
            .unwrap()
            .unwrap();
        reply.problem(StatusCode::CONFLICT);
    }
    f.upstream.open_gate(1);
    let first = calls.join_next().await.unwrap().unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = f.client.post("/slow").key("held").send().await;
    assert!(retry.replayed());
    assert_eq!(f.upstream.effects(), 1);
}

on_each_store!(key_reuse_is_422_in_ietf_mode_and_400_in_stripe_mode);
async fn key_reuse_is_422_in_ietf_mode_and_400_in_stripe_mode(kind: StoreKind) {
    for mode in [Mode::Ietf, Mode::Stripe] {
        let Some(f) = start(kind, with(IdempotencyConfig::default().mode(mode))).await else {
            return;
        };
        let one = json!({ "amount": 1 });
        f.client.post("/payments").key("k").json(&one).send().await;
        let reused = f
            .client
            .post("/payments")
            .key("k")
            .json(&json!({ "amount": 2 }))
            .send()
            .await;
        match mode {
            Mode::Ietf => {
                let detail = reused.problem(StatusCode::UNPROCESSABLE_ENTITY);
                assert!(detail.contains("different payload"), "{detail}");
            }
            Mode::Stripe => {
                reused.stripe_error(StatusCode::BAD_REQUEST, "idempotency_error");
            }
        }
        // The same key on another path is another payload too.
        let elsewhere = f
            .client
            .post("/payments?to=2")
            .key("k")
            .json(&one)
            .send()
            .await;
        assert_ne!(elsewhere.status, StatusCode::CREATED);
        assert_eq!(f.upstream.effects(), 1, "{mode:?}");
    }
}

on_each_store!(a_missing_key_is_400_where_required_and_other_methods_pass);
async fn a_missing_key_is_400_where_required_and_other_methods_pass(kind: StoreKind) {
    let Some(f) = start(
        kind,
        with(IdempotencyConfig::default().require_key(idem_http::KeyRequirement::Always)),
    )
    .await
    else {
        return;
    };
    let missing = f.client.post("/payments").json(&json!({})).send().await;
    let detail = missing.problem(StatusCode::BAD_REQUEST);
    assert!(detail.contains("Idempotency-Key"), "{detail}");
    // PUT is not among the methods that require a key: without one it is
    // forwarded untouched.
    let put = f
        .client
        .call(http::Method::PUT, "/echo")
        .bytes("as is")
        .send()
        .await;
    assert_eq!(put.status, StatusCode::OK);
    assert_eq!(put.body, "as is");
    assert_eq!(f.upstream.effects(), 0);

    let Some(f) = start(
        kind,
        with(
            IdempotencyConfig::default()
                .mode(Mode::Stripe)
                .require_key(idem_http::KeyRequirement::Always),
        ),
    )
    .await
    else {
        return;
    };
    let missing = f.client.post("/payments").send().await;
    missing.stripe_error(StatusCode::BAD_REQUEST, "idempotency_error");
    assert_eq!(f.upstream.calls(), 0);
}

on_each_store!(the_longest_key_is_forwarded_once_and_replayed);
async fn the_longest_key_is_forwarded_once_and_replayed(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    // 255 visible ASCII characters, quotes and backslashes among them: the
    // longest key there is.
    let key = format!("{}\\\"{}", "k".repeat(200), "x".repeat(53));
    let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(key.len(), 255);
    let body = json!({ "amount": 7 });
    let first = f
        .client
        .post("/payments")
        .raw_key(quoted.as_bytes())
        .json(&body)
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    for _ in 0..2 {
        let again = f
            .client
            .post("/payments")
            .raw_key(quoted.as_bytes())
            .json(&body)
            .send()
            .await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
    }
    assert_eq!(f.upstream.calls(), 1);
}

on_each_store!(malformed_keys_are_400_and_never_forwarded);
async fn malformed_keys_are_400_and_never_forwarded(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    let long = "k".repeat(256);
    let malformed: [&[u8]; 4] = [b"\"\"", long.as_bytes(), b"\"a\tb\"", b"\"caf\xc3\xa9\""];
    for key in malformed {
        let reply = f
            .client
            .post("/payments")
            .raw_key(key)
            .json(&json!({}))
            .send()
            .await;
        reply.problem(StatusCode::BAD_REQUEST);
    }
    let twice = f
        .client
        .post("/payments")
        .key("one")
        .key("two")
        .json(&json!({}))
        .send()
        .await;
    let detail = twice.problem(StatusCode::BAD_REQUEST);
    assert!(detail.contains("one"), "{detail}");
    assert_eq!(f.upstream.calls(), 0);
}

on_each_store!(bodies_over_the_limit_are_413_and_never_forwarded);
async fn bodies_over_the_limit_are_413_and_never_forwarded(kind: StoreKind) {
    let Some(f) = start(kind, with(IdempotencyConfig::default().body_limit(1024))).await else {
        return;
    };
    let declared = f
        .client
        .post("/payments")
        .key("big")
        .bytes(vec![b'x'; 1025])
        .send()
        .await;
    declared.problem(StatusCode::PAYLOAD_TOO_LARGE);
    let chunks = (0..8).map(|_| Bytes::from(vec![b'y'; 200])).collect();
    let streamed = f
        .client
        .post("/payments")
        .key("big-2")
        .chunked(chunks)
        .send()
        .await;
    streamed.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(f.upstream.calls(), 0);
    // At the limit it goes through.
    let fits = f
        .client
        .post("/payments")
        .key("fits")
        .bytes(vec![b'z'; 1024])
        .send()
        .await;
    assert_eq!(fits.status, StatusCode::CREATED);
}

on_each_store!(two_principals_with_one_key_get_two_effects_and_no_cross_replay);
async fn two_principals_with_one_key_get_two_effects_and_no_cross_replay(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    let body = json!({ "amount": 3 });
    let alice = f
        .client
        .post("/payments")
        .key("shared")
        .header("authorization", "Bearer alice")
        .json(&body)
        .send()
        .await;
    let bob = f
        .client
        .post("/payments")
        .key("shared")
        .header("authorization", "Bearer bob")
        .json(&body)
        .send()
        .await;
    assert!(!alice.replayed() && !bob.replayed());
    assert_eq!(alice.json()["who"], "Bearer alice");
    assert_eq!(bob.json()["who"], "Bearer bob");
    let alice_again = f
        .client
        .post("/payments")
        .key("shared")
        .header("authorization", "Bearer alice")
        .json(&body)
        .send()
        .await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(f.upstream.effects(), 2);
}

on_each_store!(an_upstream_5xx_releases_the_key_and_the_retry_is_forwarded);
async fn an_upstream_5xx_releases_the_key_and_the_retry_is_forwarded(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    let first = f.client.post("/flaky").key("f-1").send().await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!first.replayed());
    let retry = f.client.post("/flaky").key("f-1").send().await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    let again = f.client.post("/flaky").key("f-1").send().await;
    assert!(again.replayed());
    assert_eq!(f.upstream.calls(), 2);
    assert_eq!(f.upstream.effects(), 1);
}

on_each_store!(an_upstream_timeout_is_504_outcome_unknown_then_forwarded_again_after_the_lease);
async fn an_upstream_timeout_is_504_outcome_unknown_then_forwarded_again_after_the_lease(
    kind: StoreKind,
) {
    let lease = Duration::from_secs(60);
    let Some(f) = start(
        kind,
        Options {
            idempotency: IdempotencyConfig::default().lease(lease),
            upstream_timeout: Duration::from_secs(1),
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    let timed_out = f.client.post("/hang").key("t-1").send().await;
    let detail = timed_out.problem(StatusCode::GATEWAY_TIMEOUT);
    assert!(detail.contains("unknown"), "{detail}");
    assert!(detail.contains("60 s"), "{detail}");
    assert_eq!(timed_out.retry_after(), 60);
    assert_eq!(
        timed_out.json()["type"],
        "urn:idem:problem:upstream-timeout-outcome-unknown"
    );

    // The claim is kept: a retry within the lease is not forwarded.
    let early = f.client.post("/hang").key("t-1").send().await;
    early.problem(StatusCode::CONFLICT);
    assert_eq!(f.upstream.calls(), 1);

    // After the lease the retry is forwarded again, with the same key.
    f.clock.advance(lease + Duration::from_secs(1));
    let retried = f.client.post("/hang").key("t-1").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert_eq!(f.upstream.calls(), 2);
    let keys: Vec<_> = f
        .upstream
        .seen()
        .iter()
        .map(|h| h["idempotency-key"].clone())
        .collect();
    assert_eq!(keys, ["\"t-1\"", "\"t-1\""]);
    let replay = f.client.post("/hang").key("t-1").send().await;
    assert!(replay.replayed());
    assert_eq!(replay.body, retried.body);
    f.upstream.open_gate(1);
}

on_each_store!(a_short_real_lease_ends_and_the_retry_is_forwarded_again);
async fn a_short_real_lease_ends_and_the_retry_is_forwarded_again(kind: StoreKind) {
    // The same boundary on the wall clock, with a 1.5 s lease (the forward
    // after it has a second to be answered, on a busy machine too).
    let dir = tempfile::tempdir().unwrap();
    let idempotency = IdempotencyConfig::default().lease(Duration::from_millis(1500));
    let Some((store, _keep)) = kind
        .open(dir.path(), &idempotency, Arc::new(SystemClock))
        .await
    else {
        return;
    };
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let options = Options {
        idempotency,
        upstream_timeout: Duration::from_secs(1),
        ..Options::default()
    };
    let gateway = Gateway::start(server.addr, store, options).await;
    let client = gateway.client();
    let timed_out = client.post("/hang").key("w-1").send().await;
    timed_out.problem(StatusCode::GATEWAY_TIMEOUT);
    let mut answer = client.post("/hang").key("w-1").send().await;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while answer.status == StatusCode::CONFLICT && tokio::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = client.post("/hang").key("w-1").send().await;
    }
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(upstream.calls(), 2);
    upstream.open_gate(1);
}

on_each_store!(a_connection_reset_after_sending_is_502_and_keeps_the_claim);
async fn a_connection_reset_after_sending_is_502_and_keeps_the_claim(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let idempotency = IdempotencyConfig::default();
    let Some((store, _keep)) = kind
        .open(dir.path(), &idempotency, Arc::new(clock.clone()))
        .await
    else {
        return;
    };
    let hangup = Hangup::start().await;
    let gateway = Gateway::start(hangup.addr, store, with(idempotency)).await;
    let client = gateway.client();
    let broke = client.post("/payments").key("r-1").send().await;
    let detail = broke.problem(StatusCode::BAD_GATEWAY);
    assert!(detail.contains("unknown"), "{detail}");
    assert_eq!(broke.retry_after(), 60);
    let early = client.post("/payments").key("r-1").send().await;
    early.problem(StatusCode::CONFLICT);
    clock.advance(Duration::from_secs(61));
    client
        .post("/payments")
        .key("r-1")
        .send()
        .await
        .problem(StatusCode::BAD_GATEWAY);
    assert_eq!(hangup.requests.load(Ordering::SeqCst), 2);

    // Without a key: the same 502, and a warning that a retry may apply twice.
    let unkeyed = client.post("/payments").send().await;
    let detail = unkeyed.problem(StatusCode::BAD_GATEWAY);
    assert!(detail.contains("no Idempotency-Key"), "{detail}");
    assert!(unkeyed.header("retry-after").is_none());
}

on_each_store!(an_unreachable_upstream_is_502_and_releases_the_key);
async fn an_unreachable_upstream_is_502_and_releases_the_key(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let idempotency = IdempotencyConfig::default();
    let Some((store, _keep)) = kind
        .open(dir.path(), &idempotency, Arc::new(SystemClock))
        .await
    else {
        return;
    };
    // A port nobody listens on: bind one, then let it go.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let gateway = Gateway::start(closed, store, with(idempotency)).await;
    let client = gateway.client();
    for _ in 0..2 {
        // Released, not reserved: the retry is a 502 again, never a 409.
        let reply = client.post("/payments").key("u-1").send().await;
        let detail = reply.problem(StatusCode::BAD_GATEWAY);
        assert!(detail.contains("not sent"), "{detail}");
    }
}

on_each_store!(hop_by_hop_headers_are_stripped_both_ways_and_the_key_is_forwarded);
async fn hop_by_hop_headers_are_stripped_both_ways_and_the_key_is_forwarded(kind: StoreKind) {
    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    let reply = f
        .client
        .post("/payments")
        .key("h-1")
        .header("connection", "x-client-hop")
        .header("x-client-hop", "for the gateway only")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header("te", "trailers")
        .header("x-end-to-end", "kept")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(
        reply.header("x-upstream-hop").is_none(),
        "{:?}",
        reply.headers
    );
    assert_eq!(reply.header("x-effect"), Some("1"));
    let seen = &f.upstream.seen()[0];
    for hop in ["x-client-hop", "keep-alive", "proxy-authorization", "te"] {
        assert!(
            !seen.contains_key(hop),
            "{hop} crossed the gateway: {seen:?}"
        );
    }
    assert_eq!(seen["idempotency-key"], "\"h-1\"");
    assert_eq!(seen["x-end-to-end"], "kept");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], f.gateway.addr.to_string());
    assert_eq!(seen["host"], f._upstream_server.addr.to_string());
    // The stored answer has no hop-by-hop headers either.
    let replay = f
        .client
        .post("/payments")
        .key("h-1")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    assert!(replay.replayed());
    assert!(replay.header("x-upstream-hop").is_none());
    // The upstream does send it: the gateway removed it.
    let direct = f._upstream_server.client().post("/payments").send().await;
    assert_eq!(
        direct.header("x-upstream-hop"),
        Some("only for the gateway")
    );
}

on_each_store!(requests_without_a_key_stream_through_untouched);
async fn requests_without_a_key_stream_through_untouched(kind: StoreKind) {
    let Some(f) = start(kind, with(IdempotencyConfig::default().body_limit(1024))).await else {
        return;
    };
    // Far over the keyed body limit, sent in chunks with no Content-Length.
    let chunks: Vec<Bytes> = (0..64u8)
        .map(|i| Bytes::from(vec![b'a' + i % 26; 16 * 1024]))
        .collect();
    let expected: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let echoed = f.client.post("/echo").chunked(chunks).send().await;
    assert_eq!(echoed.status, StatusCode::OK);
    assert_eq!(echoed.body.len(), expected.len());
    assert!(echoed.body == expected);
    // Twice without a key is twice forwarded.
    f.client.post("/payments").send().await;
    f.client.post("/payments").send().await;
    assert_eq!(f.upstream.effects(), 2);
}

on_each_store!(the_admin_listener_serves_metrics_and_health);
async fn the_admin_listener_serves_metrics_and_health(kind: StoreKind) {
    let Some(f) = start(
        kind,
        Options {
            admin: true,
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    let body = json!({ "amount": 1 });
    f.client
        .post("/payments")
        .key("m-1")
        .json(&body)
        .send()
        .await;
    f.client
        .post("/payments")
        .key("m-1")
        .json(&body)
        .send()
        .await;
    f.client
        .post("/payments")
        .key("m-1")
        .json(&json!({ "amount": 2 }))
        .send()
        .await;
    f.client.post("/payments").send().await;

    let admin = f.gateway.admin_client();
    let health = admin.get("/healthz").send().await;
    assert_eq!(health.status, StatusCode::OK);
    let scraped = admin.get("/metrics").send().await;
    assert_eq!(scraped.status, StatusCode::OK);
    let text = String::from_utf8(scraped.body.to_vec()).unwrap();
    for (name, labels) in [
        (
            "gateway_requests_total",
            "outcome=\"forwarded_stored\",route=\"POST /payments\"",
        ),
        (
            "gateway_requests_total",
            "outcome=\"replayed\",route=\"POST /payments\"",
        ),
        (
            "gateway_requests_total",
            "outcome=\"idempotency-key-reused\",route=\"POST /payments\"",
        ),
        (
            "gateway_requests_total",
            "outcome=\"passed_through\",route=\"POST /payments\"",
        ),
        (
            "duplicates_suppressed_total",
            "scope=\"http\",route=\"POST /payments\"",
        ),
        (
            "idempotency_key_reuse_total",
            "scope=\"http\",route=\"POST /payments\"",
        ),
    ] {
        assert_eq!(
            counter(&text, name, labels),
            Some(1.0),
            "{name}{{{labels}}} in:\n{text}"
        );
    }
    for line in ["dedupe_records ", "dedupe_oldest_record_age_seconds "] {
        assert!(text.contains(line), "no {line} in:\n{text}");
    }
    let records: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("dedupe_records "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(records >= 1.0, "{text}");
}

on_each_store!(a_graceful_shutdown_lets_requests_in_flight_finish_and_store_their_answers);
async fn a_graceful_shutdown_lets_requests_in_flight_finish_and_store_their_answers(
    kind: StoreKind,
) {
    let Some(mut f) = start(kind, Options::default()).await else {
        return;
    };
    let client = f.client.clone();
    let in_flight = tokio::spawn(async move { client.post("/slow").key("s-1").send().await });
    while f.upstream.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopped = f.gateway.shut_down();
    // Stopped accepting: a new connection is refused.
    let addr = f.gateway.addr;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(tokio::time::Instant::now() < give_up, "still accepting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!stopped.is_finished(), "a request is still in flight");
    f.upstream.open_gate(1);
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, StatusCode::CREATED);
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("shutdown finishes once the request is answered")
        .unwrap()
        .unwrap();
    // The answer was stored before the gateway stopped.
    use idem::RecordStore;
    let records = f.gateway.layer.store().count().await.unwrap();
    assert_eq!(records.total, 1);
    let settled = f
        .gateway
        .layer
        .store()
        .list(&idem::RecordFilter::default())
        .await
        .unwrap();
    assert_eq!(settled[0].state, idem::RecordState::Completed);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_sharing_postgres_apply_concurrent_duplicates_once() {
    let Some(db) = common::pg::PgDatabase::create().await else {
        return;
    };
    two_gateways_sharing_one_store_apply_concurrent_duplicates_once(db.url.parse().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_sharing_redis_apply_concurrent_duplicates_once() {
    if !idem_testkit::redis::machine_redis_answers() {
        return;
    }
    // Keys unique to this run: the store's prefix is the default one.
    let location = idem::StoreLocation::Redis(idem_testkit::redis::redis_url());
    two_gateways_sharing_one_store_apply_concurrent_duplicates_once(location).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gateways_sharing_a_redis_cluster_apply_concurrent_duplicates_once() {
    if !idem_testkit::redis::machine_cluster_answers() {
        return;
    }
    let location = idem::StoreLocation::Redis(idem_testkit::redis::redis_cluster_url());
    two_gateways_sharing_one_store_apply_concurrent_duplicates_once(location).await;
}

/// Two gateways on one shared store: of 32 concurrent requests with one key,
/// split between them, one reaches the upstream; both replay its answer.
async fn two_gateways_sharing_one_store_apply_concurrent_duplicates_once(
    location: idem::StoreLocation,
) {
    let run = idem_testkit::redis::test_prefix("two-gateways");
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let idempotency = IdempotencyConfig::default();
    let mut gateways = Vec::new();
    for _ in 0..2 {
        let store = idem::AnyStore::open_with(
            &location,
            idempotency.store_settings(),
            Arc::new(SystemClock),
        )
        .await
        .expect("open the shared store");
        gateways.push(Gateway::start(server.addr, store, with(idempotency.clone())).await);
    }
    let body = json!({ "amount": 7 });
    for round in 0..4 {
        let key = format!("{run}{round}");
        let mut calls = JoinSet::new();
        for i in 0..32 {
            let client = gateways[i % 2].client();
            let (key, body) = (key.clone(), body.clone());
            calls.spawn(async move { client.post("/payments").key(&key).json(&body).send().await });
        }
        let replies = calls.join_all().await;
        let fresh = replies
            .iter()
            .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
            .count();
        assert_eq!(fresh, 1, "round {round}");
        for reply in &replies {
            assert!(
                matches!(reply.status, StatusCode::CREATED | StatusCode::CONFLICT),
                "{}: {:?}",
                reply.status,
                reply.body
            );
        }
        // Settled: both gateways replay the same answer.
        let a = gateways[0]
            .client()
            .post("/payments")
            .key(&key)
            .json(&body)
            .send()
            .await;
        let b = gateways[1]
            .client()
            .post("/payments")
            .key(&key)
            .json(&body)
            .send()
            .await;
        assert!(a.replayed() && b.replayed());
        assert_eq!(a.body, b.body);
    }
    assert_eq!(upstream.effects(), 4);
    drop(gateways);
}

/// The value of the series `name{labels}` in a Prometheus text exposition
/// (`labels` as `a="x",b="y"`, in any order in the text).
fn counter(text: &str, name: &str, labels: &str) -> Option<f64> {
    let mut wanted: Vec<&str> = labels.split("\",").collect();
    wanted.sort_unstable();
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (found, value) = rest.split_once("} ")?;
        let mut found: Vec<&str> = found.split("\",").collect();
        found.sort_unstable();
        (found == wanted).then(|| value.trim().parse().ok())?
    })
}

on_each_store!(duplicates_and_conflicts_are_counted_per_route);
async fn duplicates_and_conflicts_are_counted_per_route(kind: StoreKind) {
    let Some(f) = start(
        kind,
        Options {
            admin: true,
            routes: vec!["/orders/{id}".to_owned(), "/slow".to_owned()],
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    // Two requests held by the upstream; their concurrent duplicates conflict.
    let mut held = JoinSet::new();
    for key in ["held-1", "held-2"] {
        let client = f.client.clone();
        held.spawn(async move { client.post("/slow").key(key).send().await });
    }
    while f.upstream.calls() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..3 {
        f.client
            .post("/slow")
            .key("held-1")
            .send()
            .await
            .problem(StatusCode::CONFLICT);
    }
    f.client
        .post("/slow")
        .key("held-2")
        .send()
        .await
        .problem(StatusCode::CONFLICT);
    // The upstream answers 404 to /orders/..., which is stored and replayed:
    // one label for every order id.
    for id in 1..=3 {
        for _ in 0..2 {
            f.client
                .post(&format!("/orders/{id}"))
                .key(&format!("order-{id}"))
                .send()
                .await;
        }
    }
    f.upstream.open_gate(2);
    for reply in held.join_all().await {
        assert_eq!(reply.status, StatusCode::CREATED);
    }

    let text = String::from_utf8(
        f.gateway
            .admin_client()
            .get("/metrics")
            .send()
            .await
            .body
            .to_vec(),
    )
    .unwrap();
    let conflicts = "idempotency_key_conflicts_total";
    assert_eq!(
        counter(&text, conflicts, "scope=\"http\",route=\"POST /slow\""),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        counter(
            &text,
            conflicts,
            "scope=\"http\",route=\"POST /orders/{id}\""
        ),
        None,
        "{text}"
    );
    let duplicates = "duplicates_suppressed_total";
    assert_eq!(
        counter(
            &text,
            duplicates,
            "scope=\"http\",route=\"POST /orders/{id}\""
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        counter(
            &text,
            "gateway_requests_total",
            "outcome=\"forwarded_stored\",route=\"POST /orders/{id}\""
        ),
        Some(3.0),
        "{text}"
    );
    assert!(!text.contains("/orders/1"), "{text}");
}

on_each_store!(past_the_limit_in_flight_requests_are_shed_at_once_with_retry_after);
async fn past_the_limit_in_flight_requests_are_shed_at_once_with_retry_after(kind: StoreKind) {
    let Some(f) = start(
        kind,
        Options {
            admin: true,
            max_in_flight: Some(2),
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    // Two requests admitted and held by the upstream...
    let mut admitted = JoinSet::new();
    for i in 0..2 {
        let client = f.client.clone();
        admitted.spawn(async move {
            client
                .post("/slow")
                .key(&format!("admitted-{i}"))
                .send()
                .await
        });
    }
    while f.upstream.calls() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // ...so five more, keyed or not, are answered 503 while those two are
    // still held: none waits for a place.
    let mut shed = JoinSet::new();
    for i in 0..5 {
        let client = f.client.clone();
        shed.spawn(async move {
            let call = client.post("/payments");
            if i % 2 == 0 {
                call.key(&format!("shed-{i}")).send().await
            } else {
                call.send().await
            }
        });
    }
    for reply in shed.join_all().await {
        let detail = reply.problem(StatusCode::SERVICE_UNAVAILABLE);
        assert!(detail.contains("took no effect"), "{detail}");
        assert_eq!(reply.retry_after(), 1);
    }
    assert!(
        admitted.len() == 2 && f.upstream.calls() == 2,
        "the admitted requests are still held"
    );
    assert_eq!(f.upstream.effects(), 2, "nothing shed reached the upstream");

    f.upstream.open_gate(2);
    for reply in admitted.join_all().await {
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    // A place is free again, and a shed key was never claimed: its retry runs.
    let retried = f.client.post("/payments").key("shed-0").send().await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());

    let text = String::from_utf8(
        f.gateway
            .admin_client()
            .get("/metrics")
            .send()
            .await
            .body
            .to_vec(),
    )
    .unwrap();
    let shed_total: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("http_requests_shed_total "))
        .expect("http_requests_shed_total")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(shed_total, 5.0);
    assert_eq!(
        counter(
            &text,
            "gateway_requests_total",
            "outcome=\"overloaded\",route=\"POST /payments\""
        ),
        Some(5.0),
        "{text}"
    );
}

/// The retrying client's timer in the test below: every sleep is written down
/// and lasts until the test lets it end.
#[derive(Debug, Clone)]
struct HeldTimer {
    slept: Arc<std::sync::Mutex<Vec<Duration>>>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Default for HeldTimer {
    fn default() -> Self {
        Self {
            slept: Arc::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl idem_retry::Timer for HeldTimer {
    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }

    fn sleep(&self, duration: Duration) -> idem_retry::Sleep {
        self.slept.lock().unwrap().push(duration);
        let release = Arc::clone(&self.release);
        Box::pin(async move {
            release.acquire().await.expect("open").forget();
        })
    }
}

on_each_store!(a_retrying_client_waits_out_a_shed_answer_and_its_retry_runs_once);
async fn a_retrying_client_waits_out_a_shed_answer_and_its_retry_runs_once(kind: StoreKind) {
    use http_body_util::Full;
    use hyper_util::client::legacy::Client as HyperClient;
    use hyper_util::rt::TokioExecutor;
    use idem_retry::{HttpRetryLayer, HttpRetryPolicy, RetryBudget, RetryConfig};
    use tower::{Layer, Service, ServiceExt};

    let Some(f) = start(
        kind,
        Options {
            max_in_flight: Some(1),
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    let client = f.client.clone();
    let held = tokio::spawn(async move { client.post("/slow").key("held").send().await });
    while f.upstream.calls() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let timer = HeldTimer::default();
    let policy = HttpRetryPolicy::new(RetryConfig::default(), Arc::new(RetryBudget::default()))
        .with_timer(timer.clone());
    let http = HyperClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut retrying = HttpRetryLayer::new(policy).layer(http);
    let request = idem_retry::with_idempotency_key(
        http::Request::post(format!("http://{}/payments", f.gateway.addr))
            .body(Full::new(Bytes::from_static(b"{\"amount\":5}")))
            .unwrap(),
        idem::IdempotencyKey::new("shed-then-run").unwrap(),
    );
    let call =
        tokio::spawn(async move { retrying.ready().await.unwrap().call(request).await.unwrap() });

    // The first attempt was shed: the client sleeps for the Retry-After.
    while timer.slept.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(*timer.slept.lock().unwrap(), [Duration::from_secs(1)]);
    assert_eq!(f.upstream.effects(), 1, "the shed attempt reached nothing");

    // The held request finishes; the retry finds a free place and runs.
    f.upstream.open_gate(1);
    assert_eq!(held.await.unwrap().status, StatusCode::CREATED);
    timer.release.add_permits(1);
    let answer = call.await.unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert_eq!(f.upstream.effects(), 2);
    assert_eq!(timer.slept.lock().unwrap().len(), 1, "one retry");
}

on_each_store!(one_port_serves_http2_and_http1_clients_alike);
async fn one_port_serves_http2_and_http1_clients_alike(kind: StoreKind) {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client as HyperClient;
    use hyper_util::rt::TokioExecutor;

    let Some(f) = start(kind, Options::default()).await else {
        return;
    };
    // Prior-knowledge HTTP/2 without TLS (h2c), as gRPC clients speak it.
    let h2 = HyperClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let post = |key: &str| {
        http::Request::post(format!("http://{}/payments", f.gateway.addr))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(br#"{"amount":3}"#)))
            .unwrap()
    };
    let first = h2.request(post("h2-1")).await.expect("an HTTP/2 answer");
    assert_eq!(first.version(), http::Version::HTTP_2);
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.into_body().collect().await.unwrap().to_bytes();
    let again = h2.request(post("h2-1")).await.expect("an HTTP/2 answer");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(
        again.into_body().collect().await.unwrap().to_bytes(),
        first_body
    );
    // The same key over HTTP/1.1 on the same port: the same record.
    let http1 = f
        .client
        .post("/payments")
        .key("h2-1")
        .json(&json!({ "amount": 3 }))
        .send()
        .await;
    assert!(http1.replayed());
    assert_eq!(http1.body, first_body);
    assert_eq!(f.upstream.effects(), 1);
}

/// Sends `head` (and then `body`, a byte every `every`) on a raw
/// connection to `addr`, and returns what came back within `within`, read
/// until the connection closed or a whole answer arrived.
async fn raw_exchange(
    addr: std::net::SocketAddr,
    head: String,
    body: Vec<u8>,
    every: Duration,
    within: Duration,
) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = std::time::Instant::now();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    write.write_all(head.as_bytes()).await.unwrap();
    let dribble = tokio::spawn(async move {
        for byte in body {
            tokio::time::sleep(every).await;
            if write.write_all(&[byte]).await.is_err() {
                return;
            }
        }
        // Keep the write side open: the answer must not wait for the end.
        std::future::pending::<()>().await;
    });
    let mut received = Vec::new();
    let _ = tokio::time::timeout(within, async {
        let mut chunk = [0u8; 4096];
        loop {
            match read.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
            let text = String::from_utf8_lossy(&received);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if !head.starts_with("HTTP/1.1 100") && body.len() >= length {
                    return;
                }
            }
        }
    })
    .await;
    let elapsed = started.elapsed();
    dribble.abort();
    (String::from_utf8_lossy(&received).into_owned(), elapsed)
}

on_both_runtimes!(a_keyed_body_dribbled_past_the_body_timeout_is_408_and_the_key_stays_free);
async fn a_keyed_body_dribbled_past_the_body_timeout_is_408_and_the_key_stays_free() {
    let Some(f) = start(
        StoreKind::Embedded,
        Options {
            body_timeout: Some(Duration::from_secs(1)),
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    let body = br#"{"amount":7,"to":"acc-1"}"#.to_vec();
    let head = format!(
        "POST /payments HTTP/1.1\r\nhost: gateway\r\nidempotency-key: \"dribble-1\"\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    // One byte every 300 ms: the whole body would take 7.5 s.
    let (answer, took) = raw_exchange(
        f.gateway.addr,
        head,
        body,
        Duration::from_millis(300),
        Duration::from_secs(10),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(
        answer.contains("urn:idem:problem:request-timeout") && answer.contains("key is free"),
        "{answer}"
    );
    assert!(
        took < Duration::from_secs(5),
        "answered after {took:?}, with a 1 s body timeout"
    );
    assert_eq!(f.upstream.calls(), 0);

    // Nothing was claimed: the retry with the same key runs at once.
    let retry = f
        .client
        .post("/payments")
        .key("dribble-1")
        .json(&json!({ "amount": 7, "to": "acc-1" }))
        .send()
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(!retry.replayed());
    assert_eq!(f.upstream.effects(), 1);
}

on_both_runtimes!(a_request_head_dribbled_past_the_timeout_closes_the_connection);
async fn a_request_head_dribbled_past_the_timeout_closes_the_connection() {
    let Some(f) = start(
        StoreKind::Embedded,
        Options {
            body_timeout: Some(Duration::from_secs(1)),
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    let (answer, took) = raw_exchange(
        f.gateway.addr,
        "POST /payments HTTP/1.1\r\nhost: gateway\r\n".to_owned(),
        b"x-slow: 1234567890123456789".to_vec(),
        Duration::from_millis(300),
        Duration::from_secs(10),
    )
    .await;
    assert!(
        took < Duration::from_secs(5),
        "closed after {took:?}, with a 1 s timeout: {answer:?}"
    );
    assert!(!answer.contains("201"), "{answer}");
    assert_eq!(f.upstream.calls(), 0);
}

on_both_runtimes!(a_body_over_the_limit_expecting_100_continue_gets_413_without_100);
async fn a_body_over_the_limit_expecting_100_continue_gets_413_without_100() {
    let Some(f) = start(
        StoreKind::Embedded,
        with(IdempotencyConfig::default().body_limit(1024)),
    )
    .await
    else {
        return;
    };
    // Just over the limit: a body the gateway would otherwise read and drop.
    let head = "POST /payments HTTP/1.1\r\nhost: gateway\r\nidempotency-key: \"big-1\"\r\ncontent-type: application/json\r\ncontent-length: 2000\r\nexpect: 100-continue\r\n\r\n";
    let (answer, took) = raw_exchange(
        f.gateway.addr,
        head.to_owned(),
        Vec::new(),
        Duration::ZERO,
        Duration::from_secs(10),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert!(!answer.contains("100 Continue"), "{answer:?}");
    assert!(took < Duration::from_millis(900), "answered after {took:?}");
    assert_eq!(f.upstream.calls(), 0);
}

on_both_runtimes!(connection_naming_the_key_does_not_strip_it_from_the_forwarded_request);
async fn connection_naming_the_key_does_not_strip_it_from_the_forwarded_request() {
    let Some(f) = start(StoreKind::Embedded, Options::default()).await else {
        return;
    };
    let body = json!({ "amount": 4 });
    let first = f
        .client
        .post("/payments")
        .key("named-1")
        .header("connection", "Idempotency-Key, x-client-hop")
        .header("x-client-hop", "1")
        .json(&body)
        .send()
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json()["key"], "\"named-1\"");
    let seen = f.upstream.seen();
    assert_eq!(seen[0]["idempotency-key"], "\"named-1\"");
    assert!(!seen[0].contains_key("x-client-hop"));
    let again = f
        .client
        .post("/payments")
        .key("named-1")
        .header("connection", "idempotency-key")
        .json(&body)
        .send()
        .await;
    assert!(again.replayed());
    assert_eq!(f.upstream.effects(), 1);
}

on_both_runtimes!(the_upstream_urls_credentials_are_sent_as_basic_auth_and_never_shown);
async fn the_upstream_urls_credentials_are_sent_as_basic_auth_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig::default();
    let store = common::gateway::embedded(dir.path(), &config, Arc::new(SystemClock)).await;
    let upstream = Upstream::default();
    let server = upstream.start().await;
    let url = format!("http://gateway:s3cr%3At@{}", server.addr);
    let gateway = Gateway::start(
        server.addr,
        store,
        Options {
            upstream_url: Some(url),
            ..with(config)
        },
    )
    .await;
    let client = gateway.client();
    // No Authorization of its own: the gateway's credentials ("gateway:s3cr:t").
    let anonymous = client
        .post("/payments")
        .key("basic-1")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    assert_eq!(anonymous.status, StatusCode::CREATED);
    assert_eq!(anonymous.json()["who"], "Basic Z2F0ZXdheTpzM2NyOnQ=");
    // The client's own credentials go through.
    let alice = client
        .post("/payments")
        .key("basic-2")
        .header("authorization", "Bearer alice")
        .json(&json!({ "amount": 1 }))
        .send()
        .await;
    assert_eq!(alice.json()["who"], "Bearer alice");
    let upstream: idem_gateway::Upstream = format!("http://gateway:s3cr%3At@{}", server.addr)
        .parse()
        .unwrap();
    let config = idem_gateway::GatewayConfig::new(upstream.clone());
    for text in [
        upstream.to_string(),
        format!("{upstream:?}"),
        format!("{config:?}"),
    ] {
        assert!(
            !text.contains("s3cr") && text.contains("gateway:***@"),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upstream_that_is_the_gateway_itself_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig::default();
    let store = common::gateway::embedded(dir.path(), &config, Arc::new(SystemClock)).await;
    let layer = idem_http::IdempotencyLayer::new(store, config);
    for (listen, upstream) in [
        ("127.0.0.1:0", "http://127.0.0.1:{port}"),
        ("127.0.0.1:0", "http://localhost:{port}/api"),
        ("0.0.0.0:0", "http://127.0.0.1:{port}"),
        ("127.0.0.1:0", "http://0.0.0.0:{port}"),
    ] {
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = upstream.replace("{port}", &port.to_string());
        let gateway = idem_gateway::Gateway::new(
            layer.clone(),
            idem_gateway::GatewayConfig::new(upstream.parse().unwrap()),
        );
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            idem_gateway::run(listener, gateway, std::future::pending()),
        )
        .await
        .expect("refused at once, not served")
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("the gateway's own listener") && refused.contains(&upstream),
            "{listen} -> {upstream}: {refused}"
        );
    }
}

on_both_runtimes!(a_request_that_comes_back_to_the_gateway_is_answered_508);
/// A loop the start-up check cannot see: the upstream is a proxy on another
/// port that sends every request back to the gateway.
async fn a_request_that_comes_back_to_the_gateway_is_answered_508() {
    use axum::extract::State;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;

    #[derive(Clone)]
    struct Back {
        to: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
        calls: Arc<AtomicUsize>,
    }
    async fn send_back(
        State(back): State<Back>,
        request: axum::extract::Request,
    ) -> axum::response::Response {
        back.calls.fetch_add(1, Ordering::SeqCst);
        let (mut parts, body) = request.into_parts();
        let to = back.to.get().expect("the gateway's address");
        parts.uri = format!("http://{to}{}", parts.uri.path()).parse().unwrap();
        parts.headers.remove("host");
        let body = body.collect().await.unwrap().to_bytes();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<Bytes>>();
        let answer = client
            .request(http::Request::from_parts(
                parts,
                http_body_util::Full::new(body),
            ))
            .await
            .unwrap();
        let (parts, body) = answer.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        axum::response::Response::from_parts(parts, axum::body::Body::from(body))
    }

    let back = Back {
        to: Arc::default(),
        calls: Arc::default(),
    };
    let app = axum::Router::new()
        .fallback(send_back)
        .with_state(back.clone());
    let proxy = Server::start(app).await;
    let dir = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig::default();
    let store = common::gateway::embedded(dir.path(), &config, Arc::new(SystemClock)).await;
    let gateway = Gateway::start(proxy.addr, store, with(config)).await;
    back.to.set(gateway.addr).unwrap();
    let client = gateway.client();

    for key in [None, Some("loop-1"), Some("loop-2")] {
        let mut call = client.post("/payments").json(&json!({ "amount": 2 }));
        if let Some(key) = key {
            call = call.key(key);
        }
        let looped = call.send().await;
        let detail = looped.problem(StatusCode::LOOP_DETECTED);
        assert!(detail.contains("Via header names idem-"), "{detail}");
        assert_eq!(looped.json()["type"], "urn:idem:problem:loop-detected");
    }
    // Each went round once: the gateway, the proxy, the gateway (refused).
    assert_eq!(back.calls.load(Ordering::SeqCst), 3);
}

on_both_runtimes!(an_http_1_0_upstream_is_answered_in_the_clients_version);
/// An upstream that answers in HTTP/1.0 (Python's `http.server`, old
/// appliances): the client still gets its answer in the version it spoke,
/// the first time and on the replay, not the upstream's.
async fn an_http_1_0_upstream_is_answered_in_the_clients_version() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                let mut received = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head and its 2-byte body, then the answer and close.
                while !received.windows(4).any(|w| w == b"\r\n\r\n") || !received.ends_with(b"{}") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => received.extend_from_slice(&chunk[..read]),
                    }
                }
                let body = format!("{{\"effect\":{n}}}");
                let answer = format!(
                    "HTTP/1.0 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig::default();
    let store = common::gateway::embedded(dir.path(), &config, Arc::new(SystemClock)).await;
    let gateway = Gateway::start(upstream, store, Options::default()).await;
    let head = "POST /orders HTTP/1.1\r\nhost: gateway\r\nidempotency-key: \"v-1\"\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n";
    for replayed in [false, true] {
        let (answer, _) = raw_exchange(
            gateway.addr,
            head.to_owned(),
            b"{}".to_vec(),
            Duration::ZERO,
            Duration::from_secs(10),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer:?}");
        assert!(answer.ends_with("{\"effect\":1}"), "{answer:?}");
        assert_eq!(
            answer
                .to_ascii_lowercase()
                .contains("idempotent-replayed: true"),
            replayed,
            "{answer:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// One runtime per core on Redis, when Redis closes the gateway's
/// connection while it serves: the client reopens it from a serving
/// runtime's request, every runtime goes on using it, each key is applied
/// once, and the store still answers after `run` has returned and that
/// runtime is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_connection_reopened_on_a_serving_runtime_serves_and_outlives_it() {
    use idem::{AnyStore, RecordStore, StoreLocation};

    let Some(redis) = idem_testkit::redis::RedisServer::start(&[]) else {
        return;
    };
    let idempotency = IdempotencyConfig::default();
    let store = AnyStore::open_with(
        &StoreLocation::Redis(redis.url()),
        idempotency.store_settings(),
        Arc::new(SystemClock),
    )
    .await
    .expect("open the private Redis");
    let upstream = Upstream::default();
    let upstream_server = upstream.start().await;
    let mut gateway = Gateway::start(
        upstream_server.addr,
        store.clone(),
        Options {
            idempotency,
            runtime: idem_gateway::Runtime::PerCore,
            workers: std::num::NonZeroUsize::new(2),
            ..Options::default()
        },
    )
    .await;
    let client = gateway.client();
    let pay = |key: String| {
        let client = client.clone();
        async move {
            // An answer the store could not give (503) is retried as a
            // client would; the key decides whether it runs again.
            for _ in 0..50 {
                let answer = client
                    .post("/payments")
                    .key(&key)
                    .json(&json!({ "amount": 1 }))
                    .send()
                    .await;
                if answer.status == StatusCode::CREATED {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("{key} was never answered 201");
        }
    };
    for n in 0..4 {
        pay(format!("before-{n}")).await;
    }
    // Redis closes every client's connection but this command's own.
    idem_testkit::redis::command(
        "127.0.0.1",
        redis.port(),
        &["CLIENT", "KILL", "TYPE", "normal"],
    )
    .expect("CLIENT KILL");
    let mut paying = JoinSet::new();
    for n in 0..32 {
        paying.spawn(pay(format!("after-{n}")));
    }
    while let Some(done) = paying.join_next().await {
        done.expect("every key answered");
    }
    assert_eq!(upstream.effects(), 36, "each key applied once");

    gateway.shut_down().await.unwrap().unwrap();
    let mut counted = None;
    for _ in 0..20 {
        if let Ok(Ok(count)) = tokio::time::timeout(Duration::from_secs(2), store.count()).await {
            counted = Some(count);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counted = counted.expect("the store answers after the gateway stopped");
    assert_eq!(counted.total, 36);
}
