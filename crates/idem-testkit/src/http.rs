//! Real sockets for HTTP tests (feature `http`): a server on `127.0.0.1:0`
//! running an axum router, a hyper client that speaks to it, one call's
//! builder and its reply, a race of many copies of one keyed request, and a
//! throwaway PostgreSQL database per test. The layer's tests and the
//! gateway's share them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::postgres::TestDatabase;

/// The header a keyed call carries.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A database of its own for one HTTP test.
#[derive(Debug)]
pub struct PgDatabase {
    /// Its URL.
    pub url: String,
    _database: TestDatabase,
}

impl PgDatabase {
    /// Creates `idem_http_t_<random>`; `None` (after saying so) when the server
    /// cannot be reached and services are not required.
    pub async fn create() -> Option<PgDatabase> {
        let database = TestDatabase::create("idem_http_t").await?;
        Some(PgDatabase {
            url: database.url().to_owned(),
            _database: database,
        })
    }
}

/// A running server; stopped when dropped.
#[derive(Debug)]
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Serves `app` on a free loopback port until dropped.
    pub async fn start(app: Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("server runs");
        });
        Server { addr, task }
    }

    /// A client for this server.
    pub fn client(&self) -> Client {
        Client::to(self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// A client for one server.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: HyperClient<HttpConnector, Body>,
}

impl Client {
    /// A client for the server at `addr`.
    pub fn to(addr: SocketAddr) -> Client {
        Client {
            base: format!("http://{}", addr),
            http: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// A POST to `path`.
    pub fn post(&self, path: &str) -> Call {
        self.call(Method::POST, path)
    }

    /// A GET of `path`.
    pub fn get(&self, path: &str) -> Call {
        self.call(Method::GET, path)
    }

    /// A call with `method` to `path`.
    pub fn call(&self, method: Method, path: &str) -> Call {
        Call {
            client: self.clone(),
            method,
            path: path.to_owned(),
            headers: HeaderMap::new(),
            body: Full::new(Bytes::new()).boxed(),
        }
    }
}

/// One request being built.
#[derive(Debug)]
pub struct Call {
    client: Client,
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Body,
}

impl Call {
    /// Adds `Idempotency-Key: "key"` (the RFC 8941 String form).
    pub fn key(self, key: &str) -> Call {
        self.raw_key(format!("\"{key}\"").as_bytes())
    }

    /// Adds an `Idempotency-Key` header with exactly these bytes.
    pub fn raw_key(mut self, value: &[u8]) -> Call {
        self.headers.append(
            IDEMPOTENCY_KEY,
            HeaderValue::from_bytes(value).expect("header value"),
        );
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.append(
            HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            HeaderValue::from_str(value).expect("header value"),
        );
        self
    }

    /// Sends `value` as the JSON body.
    pub fn json(mut self, value: &Value) -> Call {
        self.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        self.body = Full::new(Bytes::from(value.to_string())).boxed();
        self
    }

    /// Sends these bytes as the body.
    pub fn bytes(mut self, body: impl Into<Bytes>) -> Call {
        self.body = Full::new(body.into()).boxed();
        self
    }

    /// A body sent in chunks with no `Content-Length`.
    pub fn chunked(mut self, chunks: Vec<Bytes>) -> Call {
        let frames = futures::stream::iter(chunks).map(|c| Ok::<_, Infallible>(Frame::data(c)));
        self.body = BodyExt::boxed(StreamBody::new(frames));
        self
    }

    /// Sends the call and reads the whole reply.
    pub async fn send(self) -> Reply {
        let mut request = Request::builder()
            .method(self.method)
            .uri(format!("{}{}", self.client.base, self.path))
            .body(self.body)
            .expect("request");
        *request.headers_mut() = self.headers;
        let response =
            tokio::time::timeout(Duration::from_secs(30), self.client.http.request(request))
                .await
                .expect("response within 30 s")
                .expect("response");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("response body")
            .to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its whole body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    /// Whether the answer says it was replayed (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Checks the reply is an IETF problem with `status`, and returns its detail.
    pub fn problem(&self, status: StatusCode) -> String {
        assert_eq!(self.status, status, "{:?}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let body = self.json();
        assert_eq!(body["status"], status.as_u16());
        assert!(body["type"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()));
        body["detail"].as_str().expect("detail").to_owned()
    }

    /// Checks the reply is a Stripe-style error with `status` and `type`, and
    /// returns its message.
    pub fn stripe_error(&self, status: StatusCode, kind: &str) -> String {
        assert_eq!(self.status, status, "{:?}", self.body);
        let body = self.json();
        assert_eq!(body["error"]["type"], kind, "{body}");
        body["error"]["message"]
            .as_str()
            .expect("message")
            .to_owned()
    }

    /// The `Retry-After` header as whole seconds.
    pub fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .expect("Retry-After header")
            .parse()
            .expect("Retry-After is whole seconds")
    }
}

/// Sends `n` concurrent POSTs to `path` with one key and one body, and checks
/// the answers are consistent: exactly one was produced fresh (201), every other
/// one is a replay of the same body or a 409 with `Retry-After`.
pub async fn race_one_key(client: &Client, path: &'static str, n: usize, body: Value) {
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (client, body) = (client.clone(), body.clone());
        calls.spawn(async move { client.post(path).key("race").json(&body).send().await });
    }
    let replies = calls.join_all().await;
    let fresh: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one request ran");
    for reply in &replies {
        match reply.status {
            StatusCode::CREATED => assert_eq!(reply.body, fresh[0].body),
            StatusCode::CONFLICT => assert!(reply.retry_after() >= 1),
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
}
