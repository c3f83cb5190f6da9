//! The example end to end over a real socket, on SQLite and on PostgreSQL (a
//! database of its own): a payment sent three times with one key debits the
//! account once.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::StoreLocation;
use idem_testkit::postgres::TestDatabase;
use serde_json::Value;

async fn send(
    base: &str,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, bool, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder()
        .method(method)
        .uri(format!("{base}{path}"));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client.request(request).await.expect("response");
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        replayed,
        serde_json::from_slice(&body).expect("JSON body"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_sent_three_times_debits_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let location = format!("sqlite://{}", dir.path().join("payments.db").display())
        .parse()
        .unwrap();
    a_payment_sent_three_times_debits_once(&location).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_sent_three_times_debits_once_on_postgres() {
    let Some(db) = TestDatabase::create("payments_axum_t").await else {
        return;
    };
    a_payment_sent_three_times_debits_once(&db.url().parse().unwrap()).await;
}

async fn a_payment_sent_three_times_debits_once(location: &StoreLocation) {
    let app = payments_axum::app(location).await.expect("app");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(payments_axum::run(listener, app, async {
        stopped.await.ok();
    }));

    let payment = r#"{"account": "acc-1", "amount": 250}"#;
    let (status, replayed, first) =
        send(&base, Method::POST, "/payments", Some("pay-1"), payment).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert_eq!(first["balance"], 9_750);
    for _ in 0..2 {
        let (status, replayed, again) =
            send(&base, Method::POST, "/payments", Some("pay-1"), payment).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        assert_eq!(again, first);
    }
    let (status, _, balance) = send(&base, Method::GET, "/balance", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(balance["balance"], 9_750);

    let (status, _, _) = send(&base, Method::POST, "/payments", None, payment).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a payment without a key is refused"
    );
    let (status, _, _) = send(
        &base,
        Method::POST,
        "/payments",
        Some("pay-2"),
        r#"{"account": "acc-1", "amount": 1000000}"#,
    )
    .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let (_, _, balance) = send(&base, Method::GET, "/balance?account=acc-1", None, "").await;
    assert_eq!(balance["balance"], 9_750);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
