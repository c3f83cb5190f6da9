//! An answer is never handed out without being kept: PostgreSQL is cut off
//! (through a TCP proxy the test controls) after the service applied its
//! effect and before the layer stores the answer. The client still gets its
//! answer; the answer is stored once the database is back — by the same
//! process, or, after it died, by the next one from its spool — and a retry
//! past the lease is replayed, not run again.

#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use idem::{IdempotencyKey, ManualClock, PgStore, RecordState, RecordStore, Settings};
use idem_http::{IdempotencyConfig, IdempotencyLayer, Spool};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use common::pg::PgDatabase;
use common::{Client, Server};

const LEASE: Duration = Duration::from_secs(30);

/// A TCP proxy to PostgreSQL that the test can cut: every connection through
/// it is dropped, and new ones are closed at once, until it is restored.
struct Cut {
    addr: std::net::SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Cut {
    async fn start(target: std::net::SocketAddr) -> Cut {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, watching) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut watching = watching.clone();
                tokio::spawn(async move {
                    if *watching.borrow() {
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watching.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Cut { addr, cut, task }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The database's URL with its host and port replaced by the proxy's.
fn through(url: &str, proxy: std::net::SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"));
    format!("{scheme}://{}{proxy}/{path}", user.unwrap_or_default())
}

fn target_of(url: &str) -> std::net::SocketAddr {
    let rest = url.split_once("://").unwrap().1;
    let authority = rest.split_once('/').unwrap().0;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    let host = host.replace("localhost", "127.0.0.1");
    host.parse().expect("a loopback address")
}

/// A payments service behind the layer: one effect per call. A call with
/// `x-cut: 1` has the test cut the database after the effect, before the
/// answer leaves the handler.
#[derive(Clone)]
struct Payments {
    effects: Arc<AtomicUsize>,
    cut_now: Arc<Notify>,
    cut_done: Arc<Notify>,
    cutting: Arc<AtomicBool>,
}

impl Payments {
    fn new() -> Self {
        Self {
            effects: Arc::default(),
            cut_now: Arc::new(Notify::new()),
            cut_done: Arc::new(Notify::new()),
            cutting: Arc::default(),
        }
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    fn app(&self, layer: IdempotencyLayer<PgStore>) -> Router {
        let payments = self.clone();
        Router::new()
            .route(
                "/pay",
                post(move |headers: http::HeaderMap| {
                    let payments = payments.clone();
                    async move {
                        let effect = payments.effects.fetch_add(1, Ordering::SeqCst) + 1;
                        if headers.contains_key("x-cut") {
                            payments.cutting.store(true, Ordering::SeqCst);
                            payments.cut_now.notify_one();
                            payments.cut_done.notified().await;
                        }
                        (StatusCode::CREATED, format!("payment {effect}"))
                    }
                }),
            )
            .layer(layer)
    }
}

async fn store(url: &str, clock: &ManualClock) -> PgStore {
    PgStore::builder(url)
        .settings(Settings::default().with_lease(LEASE))
        .clock(Arc::new(clock.clone()))
        .acquire_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("store")
}

/// Waits (bounded) until the record of `key` is completed.
async fn completed(store: &PgStore, key: &str) -> bool {
    let key = IdempotencyKey::new(key).unwrap();
    for _ in 0..500 {
        let records = store.list(&Default::default()).await.unwrap_or_default();
        if records
            .iter()
            .any(|r| r.key == key && r.state == RecordState::Completed)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_the_store_could_not_take_is_stored_when_it_returns() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let cut = Cut::start(target_of(&db.url)).await;
    let clock = ManualClock::starting_now();
    let proxied = store(&through(&db.url, cut.addr), &clock).await;
    let direct = store(&db.url, &clock).await;
    let config = IdempotencyConfig::default().lease(LEASE);
    let payments = Payments::new();
    let server = Server::start(payments.app(IdempotencyLayer::new(proxied, config))).await;

    let sent = tokio::spawn(
        server
            .client()
            .post("/pay")
            .key("k-1")
            .header("x-cut", "1")
            .send(),
    );
    payments.cut_now.notified().await;
    cut.cut();
    payments.cut_done.notify_one();
    let answer = sent.await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "the client gets its answer"
    );
    assert_eq!(answer.body, "payment 1");

    cut.restore();
    assert!(
        completed(&direct, "k-1").await,
        "stored once the database is back"
    );
    clock.advance(LEASE * 2);
    let retried = server.client().post("/pay").key("k-1").send().await;
    assert!(retried.replayed(), "{:?}", retried.body);
    assert_eq!(retried.body, "payment 1");
    assert_eq!(payments.effects(), 1, "paid once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spooled_answer_is_stored_by_the_next_process_before_it_serves() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spool_path = dir.path().join("answers.spool");
    let cut = Cut::start(target_of(&db.url)).await;
    let clock = ManualClock::starting_now();
    let config = IdempotencyConfig::default().lease(LEASE);
    let payments = Payments::new();

    // The first process: a runtime of its own, so that stopping it drops
    // every task it had (the completion still being retried among them).
    let (ready, started) = tokio::sync::oneshot::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let process = {
        let url = through(&db.url, cut.addr);
        let (clock, config, payments) = (clock.clone(), config.clone(), payments.clone());
        let spool_path = spool_path.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let server = runtime.block_on(async move {
                let layer = IdempotencyLayer::new(store(&url, &clock).await, config)
                    .with_spool(Spool::open(&spool_path).unwrap());
                Server::start(payments.app(layer)).await
            });
            ready.send(server.addr).unwrap();
            stopped.recv().ok();
            drop(server);
            runtime.shutdown_background();
        })
    };
    let client = Client::to(started.await.unwrap());
    let sent = tokio::spawn(client.post("/pay").key("k-2").header("x-cut", "1").send());
    payments.cut_now.notified().await;
    cut.cut();
    payments.cut_done.notify_one();
    let answer = sent.await.unwrap();
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.body, "payment 1");
    // The process dies before the database is back.
    stop.send(()).unwrap();
    tokio::task::spawn_blocking(move || process.join().unwrap())
        .await
        .unwrap();

    cut.restore();
    let direct = store(&db.url, &clock).await;
    clock.advance(LEASE * 2);
    let spool = Spool::open(&spool_path).expect("the first process let the spool go");
    assert_eq!(spool.pending(), 1, "the answer was kept");
    let layer = IdempotencyLayer::new(direct.clone(), config).with_spool(spool);
    assert_eq!(layer.flush_spool().await.unwrap(), 1);
    assert_eq!(layer.spool().unwrap().pending(), 0);
    assert!(completed(&direct, "k-2").await);

    let server = Server::start(payments.app(layer)).await;
    let retried = server.client().post("/pay").key("k-2").send().await;
    assert!(retried.replayed(), "{:?}", retried.body);
    assert_eq!(retried.body, "payment 1");
    assert_eq!(payments.effects(), 1, "paid once, across the restart");
}
