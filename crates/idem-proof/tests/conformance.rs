//! `idem conformance` against real servers: the gateway (`idem serve`'s
//! `gateway::run`) in front of an upstream that applies every request, on
//! SQLite and on PostgreSQL, where every rule passes; the same upstream
//! without the gateway, where the rules it breaks fail with the effect
//! counts as evidence; a gateway asking the upstream (`--probe`) and one
//! that releases every 5xx, against an upstream that applies and then
//! answers 5xx; and the payments example, an atomic axum API, on both
//! stores with its own ledger as the effect count.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use idem::{AnyStore, StoreLocation};
use idem_gateway::{self as gateway, GatewayConfig, IDEMPOTENCY_ORIGINAL_STATUS};
use idem_http::{IdempotencyConfig, IdempotencyLayer, Mode, StatusPolicy};
use idem_proof::conformance::{
    self, BodyTemplate, ConformanceConfig, EffectSource, Expect, FailTrigger, Outcome, Report,
};
use idem_testkit::postgres::TestDatabase;
use tokio::net::TcpListener;

/// An upstream with no idempotency of its own: `POST /orders` applies every
/// request it gets (one order each) and answers 201 with the order's
/// number, unless the request carries `X-Fail`, which it answers 500
/// without applying anything, or `X-Apply-Then-Fail: STATUS`, which it
/// applies and then answers with STATUS; `POST /flaky` answers 500 to the
/// first request with a key, without applying it, and is `/orders` for the
/// key's later ones; `POST /applies-then-fails` applies the first request
/// with a key and answers it 502, and is `/orders` for the key's later
/// ones; `GET /orders/by-key/{key}` is the probe (200 with the key's last
/// order and `Idempotency-Original-Status: 201`, or 404); `GET /effects`
/// answers the orders applied.
#[derive(Clone, Default)]
struct Orders {
    applied: Arc<AtomicU64>,
    failed_keys: Arc<Mutex<HashSet<String>>>,
    /// The answer of each key's last order, by the key as sent unquoted.
    by_key: Arc<Mutex<HashMap<String, String>>>,
}

impl Orders {
    async fn start(&self) -> SocketAddr {
        let app = Router::new()
            .route("/orders", post(order))
            .route("/flaky", post(flaky))
            .route("/applies-then-fails", post(applies_then_fails))
            .route("/orders/by-key/{key}", get(by_key))
            .route(
                "/effects",
                get(|State(orders): State<Orders>| async move {
                    format!("{{\"count\":{}}}", orders.applied())
                }),
            )
            .with_state(self.clone());
        serve(app).await
    }

    fn applied(&self) -> u64 {
        self.applied.load(Ordering::SeqCst)
    }
}

async fn order(
    State(orders): State<Orders>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    if headers.contains_key("x-fail") {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "{\"error\":\"failing on purpose\"}".into(),
        );
    }
    let order = orders.applied.fetch_add(1, Ordering::SeqCst) + 1;
    let answer = format!(
        "{{\"order\":{order},\"request\":{}}}",
        serde_json::Value::String(String::from_utf8_lossy(&body).into_owned())
    );
    if let Some(key) = key_of(&headers) {
        orders.by_key.lock().unwrap().insert(key, answer.clone());
    }
    let status = headers
        .get("x-apply-then-fail")
        .and_then(|status| StatusCode::from_bytes(status.as_bytes()).ok());
    match status {
        Some(status) => (status, "{\"error\":\"applied, then failed\"}".into()),
        None => (StatusCode::CREATED, answer),
    }
}

/// The key a request carries, unquoted.
fn key_of(headers: &HeaderMap) -> Option<String> {
    headers.get("idempotency-key").map(|k| {
        String::from_utf8_lossy(k.as_bytes())
            .trim_matches('"')
            .to_owned()
    })
}

async fn applies_then_fails(
    State(orders): State<Orders>,
    mut headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let first = key_of(&headers).is_some_and(|key| orders.failed_keys.lock().unwrap().insert(key));
    if first {
        headers.insert("x-apply-then-fail", HeaderValue::from_static("502"));
    }
    order(State(orders), headers, body).await
}

async fn by_key(State(orders): State<Orders>, Path(key): Path<String>) -> Response {
    match orders.by_key.lock().unwrap().get(&key) {
        Some(answer) => (
            StatusCode::OK,
            [(IDEMPOTENCY_ORIGINAL_STATUS, "201")],
            answer.clone(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn flaky(
    State(orders): State<Orders>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned());
    if let Some(key) = key
        && orders.failed_keys.lock().unwrap().insert(key)
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"error\":\"try again\"}".into(),
        );
    }
    order(State(orders), HeaderMap::new(), body).await
}

async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The gateway in front of `upstream`, keeping its records in `store`.
async fn gateway(upstream: SocketAddr, store: AnyStore, mode: Mode) -> SocketAddr {
    gateway_with(
        upstream,
        store,
        IdempotencyConfig::default().mode(mode),
        None,
    )
    .await
}

/// The gateway with `config`, asking the upstream `probe` when given.
async fn gateway_with(
    upstream: SocketAddr,
    store: AnyStore,
    config: IdempotencyConfig,
    probe: Option<&str>,
) -> SocketAddr {
    let layer = IdempotencyLayer::new(store, config);
    let mut config = GatewayConfig::new(format!("http://{upstream}").parse().unwrap());
    if let Some(probe) = probe {
        config = config.probe(probe.parse().unwrap());
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gateway::run(
        listener,
        gateway::Gateway::new(layer, config),
        std::future::pending(),
    ));
    addr
}

/// Every rule run: effects read from the upstream, the fail header, the
/// header that applies and then answers 502, and the gateway's principal
/// header.
fn config(server: SocketAddr, upstream: SocketAddr, expect: Expect) -> ConformanceConfig {
    let mut config = ConformanceConfig::new(format!("http://{server}/orders").parse().unwrap());
    config.body = BodyTemplate::new(r#"{"item": "book", "quantity": {seq}}"#).unwrap();
    config.effects = Some(EffectSource::Url(
        format!("http://{upstream}/effects").parse().unwrap(),
    ));
    config.fail = Some(FailTrigger::Header("X-Fail: 1".parse().unwrap()));
    config.apply_then_fail = Some(FailTrigger::Header(
        "X-Apply-Then-Fail: 502".parse().unwrap(),
    ));
    config.principals = Some((
        HeaderName::from_static("authorization"),
        [
            HeaderValue::from_static("Bearer alice"),
            HeaderValue::from_static("Bearer bob"),
        ],
    ));
    config.expect = expect;
    config
}

fn outcome(report: &Report, rule: &str) -> Outcome {
    report
        .rule(rule)
        .unwrap_or_else(|| panic!("no rule {rule} in {report:#?}"))
        .outcome
}

fn effects(report: &Report, rule: &str) -> Option<u64> {
    report.rule(rule).unwrap().effects
}

/// What every rule finds on the gateway, whatever its store.
async fn every_rule_passes_behind_the_gateway(store: AnyStore) {
    let orders = Orders::default();
    let upstream = orders.start().await;
    let server = gateway(upstream, store, Mode::Ietf).await;
    let report = conformance::run(&config(server, upstream, Expect::Ietf))
        .await
        .unwrap();
    println!("{report}");
    assert!(report.failed().is_empty(), "{report}");
    for rule in [
        "retry-replayed",
        "replay-marker",
        "key-reuse-refused",
        "concurrent-applied-once",
        "failure-not-stored",
        "ambiguous-5xx-applied-once",
        "malformed-keys-refused",
        "principals-kept-apart",
    ] {
        assert_eq!(outcome(&report, rule), Outcome::Pass, "{rule}: {report}");
    }
    assert_eq!(outcome(&report, "missing-key"), Outcome::Info);
    // The counts, from the upstream's own ledger.
    assert_eq!(effects(&report, "retry-replayed"), Some(1));
    assert_eq!(effects(&report, "key-reuse-refused"), Some(1));
    assert_eq!(effects(&report, "concurrent-applied-once"), Some(1));
    assert_eq!(
        effects(&report, "missing-key"),
        Some(1),
        "processed: keys are optional"
    );
    assert_eq!(
        effects(&report, "failure-not-stored"),
        Some(1),
        "the retry ran"
    );
    assert_eq!(effects(&report, "malformed-keys-refused"), Some(0));
    assert_eq!(effects(&report, "principals-kept-apart"), Some(2));
    // Without a probe a 502 after the effect holds the key: the retry is
    // told to come back, not forwarded.
    let ambiguous = report.rule("ambiguous-5xx-applied-once").unwrap();
    assert_eq!(ambiguous.effects, Some(1));
    assert_eq!(
        (ambiguous.exchanges[0].status, ambiguous.exchanges[1].status),
        (Some(502), Some(409))
    );
    assert!(ambiguous.exchanges[1].retry_after.is_some());
    assert!(ambiguous.detail.contains("held"), "{}", ambiguous.detail);
    let total: u64 = report.rules.iter().filter_map(|r| r.effects).sum();
    assert_eq!(total, orders.applied(), "every effect charged to a rule");
    // What was sent is in the report: the concurrency rule's copies and
    // their one retry, the reuse rule's two bodies.
    let concurrent = report.rule("concurrent-applied-once").unwrap();
    assert_eq!(concurrent.exchanges.len(), 9);
    assert!(
        concurrent
            .exchanges
            .iter()
            .all(|e| e.key == concurrent.exchanges[0].key)
    );
    let reuse = report.rule("key-reuse-refused").unwrap();
    assert_eq!(reuse.exchanges[1].status, Some(422));
    assert_ne!(reuse.exchanges[0].body, reuse.exchanges[1].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rule_passes_behind_the_gateway_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    every_rule_passes_behind_the_gateway(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rule_passes_behind_the_gateway_on_postgres() {
    let Some(db) = TestDatabase::create("idem_conformance_t").await else {
        return;
    };
    let store = AnyStore::open(&db.url().parse().unwrap()).await.unwrap();
    every_rule_passes_behind_the_gateway(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_gateway_fails_the_ietf_reuse_rule_and_passes_stripe() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    let orders = Orders::default();
    let upstream = orders.start().await;
    let server = gateway(upstream, store, Mode::Stripe).await;

    let ietf = conformance::run(&config(server, upstream, Expect::Ietf))
        .await
        .unwrap();
    let failed: Vec<_> = ietf.failed().iter().map(|r| r.rule).collect();
    assert_eq!(failed, ["key-reuse-refused"], "{ietf}");
    let reuse = ietf.rule("key-reuse-refused").unwrap();
    assert_eq!(reuse.exchanges[1].status, Some(400));
    assert!(reuse.detail.contains("wants 422"), "{}", reuse.detail);
    assert_eq!(reuse.effects, Some(1), "refused: nothing applied");

    let stripe = conformance::run(&config(server, upstream, Expect::Stripe))
        .await
        .unwrap();
    assert!(stripe.failed().is_empty(), "{stripe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_that_stores_5xx_and_shares_keys_fails_those_two_rules() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    let orders = Orders::default();
    let upstream = orders.start().await;
    let misconfigured = IdempotencyConfig::default()
        .on_status(
            "1xx=store,2xx=store,3xx=store,4xx=store,5xx=store"
                .parse::<StatusPolicy>()
                .unwrap(),
        )
        .without_principal();
    let server = gateway_with(upstream, store, misconfigured, None).await;
    let report = conformance::run(&config(server, upstream, Expect::Ietf))
        .await
        .unwrap();
    let failed: Vec<_> = report.failed().iter().map(|r| r.rule).collect();
    assert_eq!(
        failed,
        ["failure-not-stored", "principals-kept-apart"],
        "{report}"
    );
    let failure = report.rule("failure-not-stored").unwrap();
    assert_eq!(failure.exchanges[1].status, Some(500), "the 500 replayed");
    assert!(failure.exchanges[1].replayed);
    assert_eq!(failure.effects, Some(0), "the retry never ran");
    let principals = report.rule("principals-kept-apart").unwrap();
    assert_eq!(principals.effects, Some(1), "bob got alice's order");
    assert!(principals.exchanges[1].replayed);
    // The 502 after the effect was stored too: applied once, but the
    // client never learns the outcome.
    assert_eq!(
        outcome(&report, "ambiguous-5xx-applied-once"),
        Outcome::Unproven
    );
}

/// The gateway with `--probe`, and the upstream's probe route.
async fn probing_gateway(upstream: SocketAddr) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    let config = IdempotencyConfig::default().mode(Mode::Ietf);
    let server = gateway_with(upstream, store, config, Some("GET /orders/by-key/{key}")).await;
    (server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probing_gateway_passes_the_ambiguous_rule_with_a_reconciled_replay() {
    let orders = Orders::default();
    let upstream = orders.start().await;
    let (server, _dir) = probing_gateway(upstream).await;
    // 500 is unknown too when there is a probe.
    for status in ["502", "504", "500"] {
        let mut config = config(server, upstream, Expect::Ietf);
        config.apply_then_fail = Some(FailTrigger::Header(
            format!("X-Apply-Then-Fail: {status}").parse().unwrap(),
        ));
        let report = conformance::run(&config).await.unwrap();
        println!("{report}");
        assert!(report.failed().is_empty(), "{status}: {report}");
        let rule = report.rule("ambiguous-5xx-applied-once").unwrap();
        assert_eq!(rule.outcome, Outcome::Pass, "{status}: {report}");
        assert_eq!(rule.effects, Some(1), "{status}");
        let (failed, retry) = (&rule.exchanges[0], &rule.exchanges[1]);
        assert_eq!(
            failed.status.map(|s| s.to_string()).as_deref(),
            Some(status)
        );
        assert_eq!(failed.extra, [format!("x-apply-then-fail: {status}")]);
        assert!(retry.extra.is_empty(), "the retry goes to the plain URL");
        assert_eq!(retry.status, Some(201), "{status}");
        assert!(retry.replayed && retry.reconciled, "{status}: {retry:?}");
        assert!(rule.detail.contains("reconciled"), "{}", rule.detail);
    }

    // The path form: the same path again, as a client retries.
    let mut config = config(server, upstream, Expect::Ietf);
    config.apply_then_fail = Some(FailTrigger::Path("/applies-then-fails".to_owned()));
    let report = conformance::run(&config).await.unwrap();
    let rule = report.rule("ambiguous-5xx-applied-once").unwrap();
    assert_eq!(rule.outcome, Outcome::Pass, "{report}");
    assert_eq!(rule.effects, Some(1));
    assert!(
        rule.exchanges
            .iter()
            .all(|e| e.request == "POST /applies-then-fails")
    );
    assert_eq!(
        (rule.exchanges[0].status, rule.exchanges[1].status),
        (Some(502), Some(201))
    );
    assert!(rule.exchanges[1].reconciled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateway_that_releases_every_5xx_fails_the_ambiguous_rule() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    let orders = Orders::default();
    let upstream = orders.start().await;
    let releasing = IdempotencyConfig::default()
        .mode(Mode::Ietf)
        .on_status("5xx=release".parse().unwrap());
    let server = gateway_with(upstream, store, releasing, None).await;
    for trigger in [
        FailTrigger::Header("X-Apply-Then-Fail: 502".parse().unwrap()),
        FailTrigger::Path("/applies-then-fails".to_owned()),
    ] {
        let mut config = config(server, upstream, Expect::Ietf);
        config.apply_then_fail = Some(trigger);
        let report = conformance::run(&config).await.unwrap();
        let failed: Vec<_> = report.failed().iter().map(|r| r.rule).collect();
        assert_eq!(failed, ["ambiguous-5xx-applied-once"], "{report}");
        let rule = report.rule("ambiguous-5xx-applied-once").unwrap();
        assert_eq!(rule.effects, Some(2), "the retry was forwarded and applied");
        assert_eq!(
            (rule.exchanges[0].status, rule.exchanges[1].status),
            (Some(502), Some(201))
        );
        assert!(!rule.exchanges[1].replayed);
        assert!(rule.detail.contains("applied again"), "{}", rule.detail);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_path_that_fails_once_drives_the_5xx_rule() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    let orders = Orders::default();
    let upstream = orders.start().await;
    let server = gateway(upstream, store, Mode::Ietf).await;
    let mut config = config(server, upstream, Expect::Ietf);
    config.fail = Some(FailTrigger::Path("/flaky".to_owned()));
    let report = conformance::run(&config).await.unwrap();
    assert!(report.failed().is_empty(), "{report}");
    let failure = report.rule("failure-not-stored").unwrap();
    assert_eq!(failure.outcome, Outcome::Pass);
    assert_eq!(failure.exchanges[0].request, "POST /flaky");
    assert_eq!(
        (failure.exchanges[0].status, failure.exchanges[1].status),
        (Some(503), Some(201))
    );
    assert_eq!(failure.effects, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_naive_upstream_fails_the_rules_it_breaks_with_effects_as_evidence() {
    let orders = Orders::default();
    let upstream = orders.start().await;
    let report = conformance::run(&config(upstream, upstream, Expect::Any))
        .await
        .unwrap();
    println!("{report}");
    let failed: Vec<_> = report.failed().iter().map(|r| r.rule).collect();
    assert_eq!(
        failed,
        [
            "retry-replayed",
            "key-reuse-refused",
            "concurrent-applied-once",
            "ambiguous-5xx-applied-once",
            "malformed-keys-refused",
            "principals-kept-apart",
        ],
        "{report}"
    );
    // Every request was applied: the counts say so.
    assert_eq!(effects(&report, "retry-replayed"), Some(2));
    assert_eq!(effects(&report, "key-reuse-refused"), Some(2));
    assert_eq!(effects(&report, "concurrent-applied-once"), Some(9));
    assert_eq!(effects(&report, "malformed-keys-refused"), Some(4));
    assert_eq!(effects(&report, "principals-kept-apart"), Some(4));
    assert_eq!(effects(&report, "ambiguous-5xx-applied-once"), Some(2));
    // No replay marker, and a 5xx is not stored (nothing is).
    assert_eq!(outcome(&report, "replay-marker"), Outcome::Info);
    assert_eq!(outcome(&report, "failure-not-stored"), Outcome::Pass);
    let total: u64 = report.rules.iter().filter_map(|r| r.effects).sum();
    assert_eq!(total, orders.applied());
    let retry = report.rule("retry-replayed").unwrap();
    assert!(retry.detail.contains("another body"), "{}", retry.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_effect_count_answers_still_convict_the_naive_upstream() {
    let orders = Orders::default();
    let upstream = orders.start().await;
    let mut config = config(upstream, upstream, Expect::Any);
    config.effects = None;
    let report = conformance::run(&config).await.unwrap();
    for rule in [
        "retry-replayed",
        "key-reuse-refused",
        "concurrent-applied-once",
    ] {
        assert_eq!(outcome(&report, rule), Outcome::Fail, "{rule}: {report}");
        assert_eq!(effects(&report, rule), None);
    }
    // Only the count can tell a second application from a replay.
    let ambiguous = report.rule("ambiguous-5xx-applied-once").unwrap();
    assert_eq!(ambiguous.outcome, Outcome::Skipped);
    assert!(
        ambiguous.detail.contains("--effects-url"),
        "{}",
        ambiguous.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rules_needing_an_option_are_skipped_and_a_dead_endpoint_is_an_error() {
    let orders = Orders::default();
    let upstream = orders.start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&StoreLocation::Sqlite(dir.path().join("idem.db")))
        .await
        .unwrap();
    let server = gateway(upstream, store, Mode::Ietf).await;
    let bare = ConformanceConfig::new(format!("http://{server}/orders").parse().unwrap());
    let report = conformance::run(&bare).await.unwrap();
    assert!(report.failed().is_empty(), "{report}");
    assert_eq!(outcome(&report, "failure-not-stored"), Outcome::Skipped);
    assert_eq!(outcome(&report, "principals-kept-apart"), Outcome::Skipped);
    let ambiguous = report.rule("ambiguous-5xx-applied-once").unwrap();
    assert_eq!(ambiguous.outcome, Outcome::Skipped);
    assert!(ambiguous.detail.contains("--apply-then-fail-header"));
    assert!(ambiguous.exchanges.is_empty(), "nothing sent");
    // Without effects, the gateway's replay marker is the evidence.
    assert_eq!(outcome(&report, "retry-replayed"), Outcome::Pass);

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let error = conformance::run(&ConformanceConfig::new(
        format!("http://{dead}/orders").parse().unwrap(),
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("does not answer"), "{error}");

    let mut wrong_effects = bare.clone();
    wrong_effects.effects = Some(EffectSource::Url(
        format!("http://{upstream}/orders").parse().unwrap(),
    ));
    let error = conformance::run(&wrong_effects)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("cannot read the effect count"), "{error}");
}

/// The payments example: an atomic handler on its own database, whose
/// `payments` table is the effect log.
async fn the_payments_example_passes(location: StoreLocation, effects_store: String) {
    let app = payments_axum::app(&location).await.unwrap();
    let server = serve(app).await;
    let mut config = ConformanceConfig::new(format!("http://{server}/payments").parse().unwrap());
    config.body = BodyTemplate::new(r#"{"account": "acc-1", "amount": {seq}}"#).unwrap();
    config.expect = Expect::Ietf;
    config.effects = Some(EffectSource::Query {
        sql: "SELECT id AS key FROM payments ORDER BY id".to_owned(),
        store: effects_store,
    });
    config.principals = Some((
        HeaderName::from_static("authorization"),
        [
            HeaderValue::from_static("Bearer alice"),
            HeaderValue::from_static("Bearer bob"),
        ],
    ));
    let report = conformance::run(&config).await.unwrap();
    println!("{report}");
    assert!(report.failed().is_empty(), "{report}");
    assert_eq!(effects(&report, "retry-replayed"), Some(1));
    assert_eq!(effects(&report, "key-reuse-refused"), Some(1));
    assert_eq!(effects(&report, "concurrent-applied-once"), Some(1));
    assert_eq!(effects(&report, "malformed-keys-refused"), Some(0));
    assert_eq!(effects(&report, "principals-kept-apart"), Some(2));
    let missing = report.rule("missing-key").unwrap();
    assert_eq!(
        missing.exchanges[0].status,
        Some(400),
        "the example requires keys"
    );
    assert_eq!(missing.effects, Some(0));
    assert_eq!(outcome(&report, "failure-not-stored"), Outcome::Skipped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_payments_example_passes_with_its_ledger_as_the_effect_count_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("payments.db");
    let store = format!("sqlite://{}", path.display());
    the_payments_example_passes(StoreLocation::Sqlite(path), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_payments_example_passes_with_its_ledger_as_the_effect_count_on_postgres() {
    let Some(db) = TestDatabase::create("idem_conformance_pay_t").await else {
        return;
    };
    the_payments_example_passes(db.url().parse().unwrap(), db.url().to_owned()).await;
}
