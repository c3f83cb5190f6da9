//! What the console's tests share: a store of each kind, a console serving
//! it on a port of its own, an HTTP client, and a webhook consumer that
//! applies each message once under its key.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem::{
    AnyStore, Claimed, DeadLetterStore, Fingerprint, IdempotencyKey, LeaseStore, ManualClock,
    NewDeadLetter, Outcome, Scope, Settings, StoreLocation,
};
use idem_console::{Access, Console};
use idem_testkit::postgres::TestDatabase;

/// A store under test, with what keeps it alive.
pub struct TestStore {
    pub store: AnyStore,
    pub clock: ManualClock,
    /// Where the store is.
    pub location: StoreLocation,
    _dir: Option<tempfile::TempDir>,
    _database: Option<TestDatabase>,
}

/// Which store.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Sqlite,
    Postgres,
    /// The machine's Redis, under a key prefix of the test's own.
    Redis,
    /// A table of the test's own on moto's DynamoDB.
    DynamoDb,
}

impl TestStore {
    /// A fresh store of `kind`, its clock at now; `None` when PostgreSQL,
    /// Redis or DynamoDB is not there and services are not required.
    pub async fn fresh(kind: Kind) -> Option<Self> {
        let clock = ManualClock::starting_now();
        if let Kind::Redis = kind {
            if !idem_testkit::redis::machine_redis_answers() {
                return None;
            }
            let url = idem_testkit::redis::redis_url();
            let store = idem::RedisStore::builder(url.clone())
                .prefix(idem_testkit::redis::test_prefix("idem-console"))
                .clock(Arc::new(clock.clone()))
                .connect()
                .await
                .unwrap();
            return Some(Self {
                store: AnyStore::Redis(store),
                clock,
                location: StoreLocation::Redis(url),
                _dir: None,
                _database: None,
            });
        }
        let (location, dir, database) = match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("idem.db");
                let location: StoreLocation =
                    format!("sqlite://{}", path.display()).parse().unwrap();
                (location, Some(dir), None)
            }
            Kind::Postgres => {
                let database = TestDatabase::create("idem_console").await?;
                let location: StoreLocation = database.url().parse().unwrap();
                (location, None, Some(database))
            }
            Kind::DynamoDb => {
                let url = idem_testkit::dynamodb::fresh_table_url("idem-console")?;
                (StoreLocation::DynamoDb(url), None, None)
            }
            Kind::Redis => unreachable!("opened above"),
        };
        let store = AnyStore::open_with(&location, Settings::default(), Arc::new(clock.clone()))
            .await
            .unwrap();
        Some(Self {
            store,
            clock,
            location,
            _dir: dir,
            _database: database,
        })
    }

    /// Claims `key` in `scope`; completes it with `body` when given.
    pub async fn record(&self, scope: &str, key: &str, body: Option<&str>) {
        let scope = Scope::new(scope).unwrap();
        let key = IdempotencyKey::new(key).unwrap();
        let Claimed::Fresh(claim) = self
            .store
            .claim(&scope, &key, Fingerprint::of_bytes(key.as_str().as_bytes()))
            .await
            .unwrap()
        else {
            panic!("{key} was claimed already");
        };
        if let Some(body) = body {
            self.store
                .complete(&claim, &Outcome::success(body))
                .await
                .unwrap();
        }
    }

    /// Records a dead letter for `destination`; returns its id.
    pub async fn dead_letter(&self, key: &str, destination: &str, error: &str) -> i64 {
        self.store
            .record_dead_letter(&NewDeadLetter {
                origin: "consumer amqp queue payments".into(),
                destination: destination.into(),
                key: IdempotencyKey::new(key).unwrap(),
                payload: format!("{{\"payment\":\"{key}\",\"amount\":1200}}").into_bytes(),
                headers: BTreeMap::from([
                    ("content-type".to_owned(), "application/json".to_owned()),
                    ("authorization".to_owned(), "Bearer s3cret".to_owned()),
                ]),
                attempts: 5,
                last_error: error.into(),
                first_seen_at: self.clock_now(),
            })
            .await
            .unwrap()
    }

    fn clock_now(&self) -> idem::Timestamp {
        use idem::Clock;
        self.clock.now()
    }
}

/// A console serving on 127.0.0.1, on a port of its own.
pub struct Served {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Served {
    pub async fn start(store: &AnyStore, access: Access) -> Self {
        Self::console(Console::new(store.clone(), access)).await
    }

    /// Serves `console`.
    pub async fn console(console: Console) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Samples often enough for the charts to show a line in a test.
        let charts = console.start_charts(None, Duration::from_millis(250));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(idem_console::serve(listener, console, async move {
            let _ = stopped.await;
            charts.abort();
        }));
        Self {
            addr,
            stop: Some(stop),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// Asserts the answer is a problem document with `status`; returns its detail.
    pub fn problem(&self, status: StatusCode) -> String {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(
            self.headers.get(header::CONTENT_TYPE).unwrap(),
            "application/problem+json",
            "{}",
            self.body
        );
        let json = self.json();
        assert_eq!(json["status"], status.as_u16());
        json["detail"].as_str().unwrap().to_owned()
    }

    /// The value a `Set-Cookie` of the answer gives cookie `name`.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|v| v.split(';').next()?.split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_owned())
    }
}

/// A plain HTTP client.
#[derive(Clone)]
pub struct Client(HyperClient<HttpConnector, Full<Bytes>>);

impl Client {
    pub fn new() -> Self {
        Self(HyperClient::builder(TokioExecutor::new()).build_http())
    }

    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .0
            .request(
                request
                    .body(Full::new(Bytes::from(body.to_owned())))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Answer {
        self.send(Method::GET, url, headers, "").await
    }

    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Answer {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send(Method::POST, url, &all, &body.to_string()).await
    }

    pub async fn post_form(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        form: &[(&str, &str)],
    ) -> Answer {
        let mut all = vec![("content-type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        let body = serde_urlencoded::to_string(form).unwrap();
        self.send(Method::POST, url, &all, &body).await
    }
}

/// A webhook consumer: applies each message once under its
/// `Idempotency-Key`, in a store of its own, and counts deliveries and
/// effects.
pub struct Consumer {
    pub addr: SocketAddr,
    pub deliveries: Arc<AtomicU64>,
    pub effects: Arc<AtomicU64>,
    _store: TestStore,
}

impl Consumer {
    pub async fn start() -> Self {
        let own = TestStore::fresh(Kind::Sqlite).await.unwrap();
        let store = own.store.clone();
        let deliveries = Arc::new(AtomicU64::new(0));
        let effects = Arc::new(AtomicU64::new(0));
        let (d, e) = (Arc::clone(&deliveries), Arc::clone(&effects));
        let app = axum::Router::new().route(
            "/payments",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (store, d, e) = (store.clone(), Arc::clone(&d), Arc::clone(&e));
                async move {
                    d.fetch_add(1, Ordering::SeqCst);
                    let Some(key) = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .map(|v| v.trim_matches('"').to_owned())
                    else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let scope = Scope::new("payments").unwrap();
                    let key = IdempotencyKey::new(key).unwrap();
                    match store
                        .claim(&scope, &key, Fingerprint::of_bytes(&body))
                        .await
                        .unwrap()
                    {
                        Claimed::Fresh(claim) => {
                            e.fetch_add(1, Ordering::SeqCst);
                            store
                                .complete(&claim, &Outcome::success("applied"))
                                .await
                                .unwrap();
                        }
                        Claimed::Replayed(_) => {}
                    }
                    StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            deliveries,
            effects,
            _store: own,
        }
    }

    pub fn destination(&self) -> String {
        format!("http://{}/payments", self.addr)
    }

    pub fn counts(&self) -> (u64, u64) {
        (
            self.deliveries.load(Ordering::SeqCst),
            self.effects.load(Ordering::SeqCst),
        )
    }
}

/// A token file's token.
pub fn token(text: &str) -> idem_gateway::admin::AdminToken {
    idem_gateway::admin::AdminToken::new(text).unwrap()
}

/// Waits a little for a server task to start answering.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// Runs each named case (an `async fn(TestStore)` of the calling file) on a
/// fresh SQLite store and on a fresh PostgreSQL database.
#[allow(unused_macros)]
macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some(store) = super::TestStore::fresh(super::common::Kind::Sqlite).await {
                    super::$case(store).await;
                }
            }
        )* }
        mod postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let Some(store) = super::TestStore::fresh(super::common::Kind::Postgres).await {
                    super::$case(store).await;
                }
            }
        )* }
    };
}
