//! `idem relay`, started while its PostgreSQL store does not answer (the
//! connection cut through a fault proxy of the test's own), waits for the
//! store instead of exiting, and relays the outbox once it answers.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use idem::{AnyStore, IdempotencyKey, PgStore};
use idem_broker::outbox::{self, Route};
use idem_broker::publish::{Destination, Message};
use idem_testkit::faultproxy::{FaultProxy, Mode};

use common::store::{TestStore, sqlite_in};

/// Calls per key.
type Calls = Arc<Mutex<HashMap<String, u32>>>;

async fn receive(State(calls): State<Calls>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    *calls.lock().unwrap().entry(key).or_default() += 1;
    StatusCode::OK
}

async fn endpoint() -> (Calls, SocketAddr) {
    let calls = Calls::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(Arc::clone(&calls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    (calls, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_while_the_store_is_cut_waits_for_it_and_relays() {
    let Some(db) = TestStore::postgres("relay_waits").await else {
        return;
    };
    let (calls, addr) = endpoint().await;
    let to: Destination = format!("http://{addr}/hook").parse().unwrap();
    let direct = AnyStore::Postgres(PgStore::connect(&db.url).await.unwrap());
    outbox::migrate(&direct).await.unwrap();
    for key in ["order-7/receipt", "order-8/receipt"] {
        let message = Message::new(IdempotencyKey::new(key).unwrap(), b"{}".to_vec());
        outbox::enqueue_now(&direct, Route::To(&to), &message)
            .await
            .unwrap();
    }

    let proxy = FaultProxy::start("127.0.0.1:5432".parse().unwrap())
        .await
        .unwrap();
    proxy.set(Mode::Drop);
    let mut url = url::Url::parse(&db.url).unwrap();
    url.set_port(Some(proxy.addr().port())).unwrap();
    let mut relay = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", url.as_str(), "relay", "--poll", "100ms"])
        .args(["--reconnect-min", "50ms", "--reconnect-max", "300ms"])
        .env_remove("IDEM_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start idem relay");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let exited = relay.try_wait().unwrap();
    assert!(
        exited.is_none(),
        "the relay ended while its store was cut: {exited:?}"
    );
    assert!(calls.lock().unwrap().is_empty(), "nothing relayed yet");

    proxy.set(Mode::Pass);
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls.lock().unwrap().len() < 2 {
        if Instant::now() > deadline {
            let _ = relay.kill();
            panic!(
                "not relayed after the store answered: {:?}",
                calls.lock().unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.kill().unwrap();
    relay.wait().unwrap();
    let calls = calls.lock().unwrap();
    assert_eq!(calls.get("order-7/receipt"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("order-8/receipt"), Some(&1), "{calls:?}");
}

#[test]
fn a_store_that_waiting_cannot_fix_ends_the_relay_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let store = sqlite_in(&file);
    let mut relay = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", &store, "relay", "--once"])
        .env_remove("IDEM_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run idem relay");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = relay.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            relay.kill().unwrap();
            panic!("the relay waited for a store path that can never open");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut relay.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("cannot open the store"), "{stderr}");
}
