//! A keyed request is deduplicated whatever its unsafe method, in the layer
//! and in the gateway: an account service whose PUT and DELETE handlers each
//! write an audit row to a SQLite file, retried with the same key, writes one
//! row per operation. A GET with a key runs every time.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use common::gateway::{Gateway, Options, embedded};
use common::{Client, Server};
use http::Method;
use idem::SystemClock;
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use rusqlite::Connection;
use serde_json::json;

/// The account service's own database: one audit row per handler run.
#[derive(Clone)]
struct Audit(Arc<Mutex<Connection>>);

impl Audit {
    fn open(path: &Path) -> Audit {
        let db = Connection::open(path).expect("open the audit database");
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS audit (
                 id INTEGER PRIMARY KEY,
                 action TEXT NOT NULL,
                 account TEXT NOT NULL
             )",
        )
        .expect("create the audit table");
        Audit(Arc::new(Mutex::new(db)))
    }

    fn write(&self, action: &str, account: &str) -> i64 {
        let db = self.0.lock().unwrap();
        db.execute(
            "INSERT INTO audit (action, account) VALUES (?1, ?2)",
            [action, account],
        )
        .expect("insert an audit row");
        db.last_insert_rowid()
    }

    fn rows(&self, action: &str) -> i64 {
        self.0
            .lock()
            .unwrap()
            .query_row(
                "SELECT count(*) FROM audit WHERE action = ?1",
                [action],
                |row| row.get(0),
            )
            .expect("count audit rows")
    }
}

async fn set_limit(State(audit): State<Audit>, UrlPath(id): UrlPath<String>) -> Response {
    let row = audit.write("put", &id);
    (
        StatusCode::OK,
        axum::Json(json!({ "account": id, "audit": row })),
    )
        .into_response()
}

async fn close(State(audit): State<Audit>, UrlPath(id): UrlPath<String>) -> Response {
    let row = audit.write("delete", &id);
    (
        StatusCode::OK,
        axum::Json(json!({ "closed": id, "audit": row })),
    )
        .into_response()
}

async fn show(State(audit): State<Audit>, UrlPath(id): UrlPath<String>) -> Response {
    let row = audit.write("get", &id);
    (
        StatusCode::OK,
        axum::Json(json!({ "account": id, "audit": row })),
    )
        .into_response()
}

fn accounts() -> Router<Audit> {
    Router::new().route("/accounts/{id}", put(set_limit).delete(close).get(show))
}

/// Sends `method` to `path` three times with one key, and checks the first
/// ran and the others replayed its answer.
async fn three_times(client: &Client, method: Method, path: &str, key: &str) {
    let first = client.call(method.clone(), path).key(key).send().await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert!(!first.replayed());
    for _ in 0..2 {
        let again = client.call(method.clone(), path).key(key).send().await;
        assert_eq!(again.status, StatusCode::OK);
        assert!(again.replayed(), "{method} {path} was not replayed");
        assert_eq!(again.body, first.body);
    }
}

/// PUT and DELETE retried with their keys write one row each; a keyed GET runs
/// each time and says its key was ignored. The default methods (POST, PATCH)
/// only say where a key is required.
async fn check(client: &Client, audit: &Audit) {
    three_times(client, Method::PUT, "/accounts/7", "limit-7").await;
    assert_eq!(audit.rows("put"), 1);
    three_times(client, Method::DELETE, "/accounts/7", "close-7").await;
    assert_eq!(audit.rows("delete"), 1);

    for _ in 0..2 {
        let read = client.get("/accounts/7").key("read-7").send().await;
        assert_eq!(read.status, StatusCode::OK);
        assert!(!read.replayed());
        assert_eq!(read.header("idempotency-key-ignored"), Some("true"));
    }
    assert_eq!(audit.rows("get"), 2);

    // Without a key, PUT is not required to carry one and runs each time.
    for _ in 0..2 {
        let unkeyed = client.call(Method::PUT, "/accounts/8").send().await;
        assert_eq!(unkeyed.status, StatusCode::OK);
        assert!(unkeyed.header("idempotency-key-ignored").is_none());
    }
    assert_eq!(audit.rows("put"), 3);
}

/// The value of `name{scope="http",route="ROUTE"}` in the process's
/// Prometheus text, 0 when there is no such series.
fn per_route(metrics: &str, name: &str, route: &str) -> f64 {
    let series = format!("{name}{{scope=\"http\",route=\"{route}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0.0, |value| value.trim().parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_dedupes_keyed_put_and_delete_and_lets_get_through() {
    let metrics = idem_gateway::admin::metrics_recorder().expect("metrics recorder");
    let before = metrics.render();
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = Audit::open(&dir.path().join("accounts.db"));
    let location = format!("sqlite://{}", dir.path().join("idem.db").display())
        .parse()
        .unwrap();
    let layer = IdempotencyLayer::open(&location, IdempotencyConfig::default())
        .await
        .expect("layer");
    let app = accounts().layer(layer).with_state(audit.clone());
    let server = Server::start(app).await;
    check(&server.client(), &audit).await;

    // Counted per route, by the router's template and the method.
    let after = metrics.render();
    let duplicates = "duplicates_suppressed_total";
    for route in ["PUT /accounts/{id}", "DELETE /accounts/{id}"] {
        let counted = per_route(&after, duplicates, route) - per_route(&before, duplicates, route);
        assert_eq!(counted, 2.0, "{route} in:\n{after}");
    }
    assert!(!after.contains("/accounts/7"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_dedupes_keyed_put_and_delete_and_lets_get_through() {
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = Audit::open(&dir.path().join("accounts.db"));
    let upstream = Server::start(accounts().with_state(audit.clone())).await;
    let options = Options::default();
    let store = embedded(dir.path(), &options.idempotency, Arc::new(SystemClock)).await;
    let gateway = Gateway::start(upstream.addr, store, options).await;
    check(&gateway.client(), &audit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn methods_say_where_a_key_is_required() {
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = Audit::open(&dir.path().join("accounts.db"));
    let location = format!("sqlite://{}", dir.path().join("idem.db").display())
        .parse()
        .unwrap();
    let config = IdempotencyConfig::default()
        .methods([Method::PUT])
        .require_key(idem_http::KeyRequirement::Always);
    let layer = IdempotencyLayer::open(&location, config)
        .await
        .expect("layer");
    let app = accounts().layer(layer).with_state(audit.clone());
    let server = Server::start(app).await;
    let client = server.client();
    let refused = client.call(Method::PUT, "/accounts/9").send().await;
    refused.problem(StatusCode::BAD_REQUEST);
    assert_eq!(audit.rows("put"), 0);
    // DELETE is not listed: no key needed, and a keyed one is still deduplicated.
    let unkeyed = client.call(Method::DELETE, "/accounts/9").send().await;
    assert_eq!(unkeyed.status, StatusCode::OK);
    three_times(&client, Method::DELETE, "/accounts/9", "close-9").await;
    assert_eq!(audit.rows("delete"), 2);
    let read = client.get("/accounts/9").send().await;
    assert_eq!(read.status, StatusCode::OK);
}
