//! `idem conformance` against real servers: the gateway (`idem serve`'s
//! `gateway::run`) in front of an upstream that applies every request, on
//! SQLite and on PostgreSQL, where every rule passes; the same upstream
//! without the gateway, where the rules it breaks fail with the effect
//! counts as evidence; and the payments example, an atomic axum API, on
//! both stores with its own ledger as the effect count.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use idem::{AnyStore, StoreLocation};
use idem_http::gateway::{self, GatewayConfig};
use idem_http::{IdempotencyConfig, IdempotencyLayer, Mode, StoredStatuses};
use idem_proof::conformance::{
    self, BodyTemplate, ConformanceConfig, EffectSource, Expect, FailTrigger, Outcome, Report,
};
use idem_testkit::postgres::TestDatabase;
use tokio::net::TcpListener;

/// An upstream with no idempotency of its own: `POST /orders` applies every
/// request it gets (one order each) and answers 201 with the order's
/// number, unless the request carries `X-Fail`, which it answers 500
/// without applying anything; `POST /flaky` answers 500 to the first
/// request with a key, without applying it, and is `/orders` for the
/// key's later ones; `GET /effects` answers the orders applied.
#[derive(Clone, Default)]
struct Orders {
    applied: Arc<AtomicU64>,
    failed_keys: Arc<Mutex<HashSet<String>>>,
}

impl Orders {
    async fn start(&self) -> SocketAddr {
        let app = Router::new()
            .route("/orders", post(order))
            .route("/flaky", post(flaky))
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
    (
        StatusCode::CREATED,
        format!(
            "{{\"order\":{order},\"request\":{}}}",
            serde_json::Value::String(String::from_utf8_lossy(&body).into_owned())
        ),
    )
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
    gateway_with(upstream, store, IdempotencyConfig::default().mode(mode)).await
}

async fn gateway_with(
    upstream: SocketAddr,
    store: AnyStore,
    config: IdempotencyConfig,
) -> SocketAddr {
    let layer = IdempotencyLayer::new(store, config);
    let config = GatewayConfig::new(format!("http://{upstream}").parse().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gateway::run(
        listener,
        gateway::Gateway::new(layer, config),
        std::future::pending(),
    ));
    addr
}

/// Every rule run: effects read from the upstream, the fail header, and
/// the gateway's principal header.
fn config(server: SocketAddr, upstream: SocketAddr, expect: Expect) -> ConformanceConfig {
    let mut config = ConformanceConfig::new(format!("http://{server}/orders").parse().unwrap());
    config.body = BodyTemplate::new(r#"{"item": "book", "quantity": {seq}}"#).unwrap();
    config.effects = Some(EffectSource::Url(
        format!("http://{upstream}/effects").parse().unwrap(),
    ));
    config.fail = Some(FailTrigger::Header("X-Fail: 1".parse().unwrap()));
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
        .stored_statuses(StoredStatuses::matching(|_| true))
        .without_principal();
    let server = gateway_with(upstream, store, misconfigured).await;
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
