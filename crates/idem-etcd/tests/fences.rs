//! `EtcdFences` against a real etcd: the machine's on 127.0.0.1:2379 (each
//! test under a prefix of its own), and a private one the restart test starts
//! and kills. The guarded writes go to a SQLite table, as the ordering
//! chapter's examples do, so the invariants are checked on real rows.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem::{ApplyError, AtomicStore, Error, FenceStore, Guard, Lease, Resource, SqliteStore};
use idem_etcd::EtcdFences;

/// The shared etcd's client endpoint.
fn endpoint() -> String {
    std::env::var("IDEM_TEST_ETCD").unwrap_or_else(|_| "127.0.0.1:2379".to_owned())
}

/// Fences under a prefix no other test uses.
async fn fences_at(endpoint: &str) -> EtcdFences {
    let prefix = format!("idem-test-{:016x}", rand::random::<u64>());
    EtcdFences::connect(&[endpoint], &prefix)
        .await
        .unwrap_or_else(|e| {
            panic!("etcd does not answer at {endpoint} ({e}); run `bash scripts/services.sh`")
        })
}

/// A table whose row 1 is written only through a fence guard.
async fn reports(dir: &tempfile::TempDir) -> SqliteStore {
    let store = SqliteStore::open(dir.path().join("reports.db"))
        .await
        .expect("store");
    store
        .transaction(async |tx| -> idem::rusqlite::Result<()> {
            tx.execute_batch(
                "CREATE TABLE reports (id INTEGER PRIMARY KEY, body TEXT, fence INTEGER NOT NULL DEFAULT 0);
                 INSERT INTO reports (id) VALUES (1);",
            )
        })
        .await
        .expect("schema");
    store
}

/// Writes `body` to the report carrying `token`; `Stale` if a greater token
/// wrote first.
async fn write(store: &SqliteStore, token: i64, body: &'static str) -> Result<(), Error> {
    let guard = Guard::fence("reports", "id", "fence").expect("plain identifiers");
    let fences = store.clone();
    store
        .transaction(async move |tx| -> Result<(), Error> {
            fences.advance(tx, &guard, &1, token)?;
            tx.execute("UPDATE reports SET body = ?1 WHERE id = 1", [body])
                .map_err(|e| {
                    Error::Store(idem::StoreError::with_source(
                        idem::ErrorKind::Other,
                        "write the report",
                        e,
                    ))
                })?;
            Ok(())
        })
        .await
        .map_err(|e| match e {
            ApplyError::Effect(e) | ApplyError::Protocol(e) => e,
        })
}

async fn body(store: &SqliteStore) -> Option<String> {
    store
        .transaction(async |tx| -> idem::rusqlite::Result<Option<String>> {
            tx.query_row("SELECT body FROM reports WHERE id = 1", [], |r| r.get(0))
        })
        .await
        .expect("read the report")
}

/// Waits until etcd itself has ended `lease` (its time to live ran out).
async fn until_lapsed(fences: &EtcdFences, lease: &Lease) {
    for _ in 0..150 {
        match fences.check(lease).await {
            Err(Error::Stale { .. }) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(other) => panic!("checking the lease failed: {other}"),
        }
    }
    panic!("etcd kept the lease past 15 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_held_until_released_and_the_next_holder_gets_a_greater_token() {
    let fences = fences_at(&endpoint()).await;
    let report = Resource::new("nightly-report").unwrap();
    let a = fences
        .acquire(&report, Duration::from_secs(10))
        .await
        .unwrap();
    match fences.acquire(&report, Duration::from_secs(10)).await {
        Err(Error::LeaseHeld { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_secs(10), "{retry_after:?}");
        }
        other => panic!("a second holder while the first is alive: {other:?}"),
    }
    assert!(fences.check(&a).await.is_ok());
    fences.release(&a).await.unwrap();
    let b = fences
        .acquire(&report, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(b.token > a.token, "{:?} after {:?}", b.token, a.token);
    // The first holder is replaced: each of its calls says so.
    assert!(matches!(fences.release(&a).await, Err(Error::Stale { .. })));
    assert!(matches!(
        fences.renew(&a, Duration::from_secs(10)).await,
        Err(Error::Stale { .. })
    ));
    assert!(matches!(fences.check(&a).await, Err(Error::Stale { .. })));
    // Another resource is independent, and its token is greater still.
    let other = fences
        .acquire(
            &Resource::new("ledger/acc-7").unwrap(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(other.token > b.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_keeps_its_token_past_its_first_time_to_live() {
    let fences = fences_at(&endpoint()).await;
    let job = Resource::new("report-job").unwrap();
    let first = fences.acquire(&job, Duration::from_secs(2)).await.unwrap();
    let mut lease = first.clone();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lease = fences.renew(&lease, Duration::from_secs(3)).await.unwrap();
        assert_eq!(lease.token, first.token);
    }
    assert!(lease.until > first.until);
    assert!(fences.check(&lease).await.unwrap() >= Duration::from_secs(1));
    assert!(matches!(
        fences.acquire(&job, Duration::from_secs(2)).await,
        Err(Error::LeaseHeld { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_learns_its_lease_lapsed_and_its_late_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = reports(&dir).await;
    let fences = fences_at(&endpoint()).await;
    let report = Resource::new("nightly-report").unwrap();

    // A takes the report, then stalls (a GC pause) past its lease.
    let a = fences
        .acquire(&report, Duration::from_secs(2))
        .await
        .unwrap();
    until_lapsed(&fences, &a).await;
    // B takes over with a greater token and writes x = 2.
    let b = fences
        .acquire(&report, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(b.token > a.token);
    write(&store, b.token.get(), "x = 2").await.unwrap();
    // A wakes up: asked before its write, etcd says the lease is gone ...
    assert!(matches!(fences.check(&a).await, Err(Error::Stale { .. })));
    // ... and a write with its old token is refused anyway: x stays 2.
    assert!(matches!(
        write(&store, a.token.get(), "x = 1").await,
        Err(Error::Stale { .. })
    ));
    assert_eq!(body(&store).await.as_deref(), Some("x = 2"));
    // B keeps writing with its token.
    write(&store, b.token.get(), "x = 3").await.unwrap();
    assert_eq!(body(&store).await.as_deref(), Some("x = 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_delivered_out_of_order_end_at_the_newest_holders() {
    let dir = tempfile::tempdir().unwrap();
    let store = reports(&dir).await;
    let fences = fences_at(&endpoint()).await;
    let report = Resource::new("nightly-report").unwrap();
    let first = fences
        .acquire(&report, Duration::from_secs(10))
        .await
        .unwrap();
    fences.release(&first).await.unwrap();
    let second = fences
        .acquire(&report, Duration::from_secs(10))
        .await
        .unwrap();
    // Delivered as second, second, first, first.
    write(&store, second.token.get(), "x = 2").await.unwrap();
    write(&store, second.token.get(), "x = 2").await.unwrap();
    for _ in 0..2 {
        assert!(matches!(
            write(&store, first.token.get(), "x = 1").await,
            Err(Error::Stale { .. })
        ));
    }
    assert_eq!(body(&store).await.as_deref(), Some("x = 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_that_does_not_answer_is_a_retryable_error_that_names_it() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = closed.local_addr().unwrap().to_string();
    drop(closed);
    let failed = match EtcdFences::connect(&[nowhere.as_str()], "idem").await {
        Err(error) => error,
        Ok(fences) => fences
            .acquire(&Resource::new("r").unwrap(), Duration::from_secs(5))
            .await
            .unwrap_err(),
    };
    assert!(failed.is_retryable(), "{failed}");
    assert!(failed.to_string().contains("etcd"), "{failed}");
}

/// A private etcd on free loopback ports, its data in `dir`.
struct PrivateEtcd {
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl PrivateEtcd {
    fn start(dir: &Path) -> Self {
        let mut etcd = Self {
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        etcd.run(dir);
        etcd
    }

    fn run(&mut self, dir: &Path) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .args(["--name", "private", "--data-dir"])
            .arg(dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("private={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd is not installed (Debian's etcd-server): run `bash scripts/services.sh`");
        self.child = Some(child);
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Retries `call` while etcd comes back.
async fn once_up<T, F, Fut>(mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut last = None;
    for _ in 0..100 {
        match call().await {
            Err(error) if error.is_retryable() && !matches!(error, Error::LeaseHeld { .. }) => {
                last = Some(error);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            answered => return answered,
        }
    }
    Err(last.expect("at least one attempt"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_go_back_and_a_held_lease_survives_an_etcd_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("etcd");
    let mut etcd = PrivateEtcd::start(&data);
    let report = Resource::new("nightly-report").unwrap();
    let fences = once_up(|| async {
        let fences = fences_at_quietly(&etcd.endpoint()).await?;
        fences
            .acquire(&Resource::new("warm-up").unwrap(), Duration::from_secs(5))
            .await?;
        Ok(fences)
    })
    .await
    .expect("the private etcd answers");
    let held = fences
        .acquire(&report, Duration::from_secs(60))
        .await
        .unwrap();

    // Killed mid-run: a renewal fails, as unavailable, not as stale.
    etcd.kill();
    let cut = fences
        .renew(&held, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(cut.is_retryable(), "{cut}");

    // Restarted on the same data: the lease is still held and its own ...
    etcd.run(&data);
    let left = once_up(|| fences.check(&held)).await.unwrap();
    assert!(left >= Duration::from_secs(1), "{left:?}");
    assert!(matches!(
        once_up(|| fences.acquire(&report, Duration::from_secs(5))).await,
        Err(Error::LeaseHeld { .. })
    ));
    // ... and every token issued after the restart is greater.
    let ledger = Resource::new("ledger/acc-7").unwrap();
    let after = once_up(|| fences.acquire(&ledger, Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(after.token > held.token);
    fences.release(&held).await.unwrap();
    let next = fences
        .acquire(&report, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(next.token > after.token);
}

async fn fences_at_quietly(endpoint: &str) -> Result<EtcdFences, Error> {
    EtcdFences::connect(&[endpoint], "idem-restart").await
}
