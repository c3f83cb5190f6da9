//! A failover under load: a private primary with a synchronous standby,
//! payments applied in atomic mode through a store given both hosts
//! (`postgres://…@P1,P2/db?target_session_attrs=read-write`), the primary
//! crashed mid-load and the standby promoted. The store must find the new
//! primary by itself; afterwards, on the promoted server, no key's effect ran
//! twice, every acknowledged payment is there, and every key, retried until
//! it succeeds, is finally answered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{
    ApplyError, AtomicStore, Error, ErrorKind, Fingerprint, IdempotencyKey, Outcome, Scope,
};
use idem_postgres::PgStore;
use idem_testkit::pg_cluster::PgCluster;
use sqlx::{Connection, PgConnection};

/// Keys paid in the run.
const KEYS: usize = 3000;

/// Concurrent callers.
const WORKERS: usize = 8;

/// The primary is crashed once this many payments were acknowledged.
const CRASH_AFTER: usize = 1000;

/// How long a failed key is retried before the test gives up on it.
const RETRY_FOR: Duration = Duration::from_secs(60);

/// The longest one call may take: a call that hangs fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn scope() -> Scope {
    Scope::new("payments").unwrap()
}

/// What one call of `apply` came to.
enum Answer {
    Paid,
    Failed(String),
}

/// Pays `key` once: one row in `payments`, in the record's transaction.
async fn pay(store: &PgStore, key: &str) -> Answer {
    let owned = key.to_owned();
    let effect = async move |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        sqlx::query("INSERT INTO payments (key) VALUES ($1)")
            .bind(&owned)
            .execute(&mut *conn)
            .await?;
        Ok(Outcome::success("paid"))
    };
    let idem_key = IdempotencyKey::new(key).unwrap();
    let fingerprint = Fingerprint::of_bytes(format!("pay {key}").as_bytes());
    let applied = tokio::time::timeout(
        CALL_TIMEOUT,
        store.apply(&scope(), &idem_key, fingerprint, effect),
    )
    .await
    .unwrap_or_else(|_| panic!("paying {key} did not return within {CALL_TIMEOUT:?}"));
    match applied {
        Ok(_) => Answer::Paid,
        Err(ApplyError::Protocol(Error::Store(e))) => Answer::Failed(format!("{:?}", e.kind())),
        Err(ApplyError::Protocol(other)) => Answer::Failed(format!("protocol: {other}")),
        // As the HTTP layer tells them apart: by the database error behind.
        Err(ApplyError::Effect(e)) => Answer::Failed(match store.effect_error_kind(&e) {
            Some(ErrorKind::Unavailable) => "Unavailable".to_owned(),
            other => format!("effect: {other:?}: {e}"),
        }),
    }
}

/// What the run saw, shared by the workers.
#[derive(Default)]
struct Tally {
    acknowledged: BTreeSet<String>,
    failed: Vec<String>,
    errors: BTreeMap<String, usize>,
    first_paid_after_crash: Option<Instant>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_follows_a_failover_with_no_double_and_no_lost_payment() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let url = cluster.url("target_session_attrs=read-write");
    let store = PgStore::builder(&url)
        .max_connections(WORKERS as u32)
        .acquire_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log_text()));
    // No unique constraint: a second run of one key's effect shows as a
    // second row.
    sqlx::raw_sql("CREATE TABLE payments (key text NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();

    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let crashed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (store, next, tally, crashed_at) = (
                store.clone(),
                next.clone(),
                tally.clone(),
                crashed_at.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= KEYS {
                        break;
                    }
                    let key = format!("pay-{n:05}");
                    let started = Instant::now();
                    let answer = pay(&store, &key).await;
                    // A call that started after the crash, so that it
                    // cannot have been served by the old primary.
                    let after_crash = crashed_at.lock().unwrap().is_some_and(|at| at <= started);
                    let mut tally = tally.lock().unwrap();
                    match answer {
                        Answer::Paid => {
                            if after_crash && tally.first_paid_after_crash.is_none() {
                                tally.first_paid_after_crash = Some(Instant::now());
                            }
                            tally.acknowledged.insert(key);
                        }
                        Answer::Failed(why) => {
                            *tally.errors.entry(why).or_default() += 1;
                            tally.failed.push(key);
                        }
                    }
                }
            })
        })
        .collect();

    // Crash the primary mid-load, then promote the standby.
    while tally.lock().unwrap().acknowledged.len() < CRASH_AFTER {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let failing = cluster.clone();
    tokio::task::spawn_blocking(move || failing.crash_primary())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    // From here no call can be served by the old primary.
    let crash = Instant::now();
    *crashed_at.lock().unwrap() = Some(crash);
    let promoting = cluster.clone();
    tokio::task::spawn_blocking(move || promoting.promote_standby())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let promoted = crash.elapsed();

    for worker in workers {
        worker.await.unwrap();
    }

    // Every key that failed is retried with the same key until it is
    // answered: replayed if its transaction committed, run if not.
    let failed = std::mem::take(&mut tally.lock().unwrap().failed);
    let mut retries = 0;
    let deadline = Instant::now() + RETRY_FOR;
    for key in &failed {
        loop {
            match pay(&store, key).await {
                Answer::Paid => {
                    tally.lock().unwrap().acknowledged.insert(key.clone());
                    break;
                }
                Answer::Failed(why) => {
                    retries += 1;
                    assert!(
                        Instant::now() < deadline,
                        "{key} still fails ({why}) {} s after the failover\n{}",
                        RETRY_FOR.as_secs(),
                        cluster.log_text()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    // The truth is on the promoted server, read directly.
    let mut promoted_server = PgConnection::connect(&PgCluster::single_url(cluster.standby_port()))
        .await
        .unwrap();
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, count(*) FROM payments GROUP BY key")
            .fetch_all(&mut promoted_server)
            .await
            .unwrap();
    let counts: BTreeMap<String, i64> = rows.into_iter().collect();
    let doubles: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let lost: Vec<_> = tally
        .acknowledged
        .iter()
        .filter(|key| !counts.contains_key(*key))
        .collect();
    let switch = tally.first_paid_after_crash.map(|at| at - crash);
    eprintln!(
        "failover: {KEYS} keys, {} errors during the switch ({:?}), {} failed keys retried ({retries} extra failures), {} double, {} lost; promoted {} ms after the crash, first payment after it at {:?}",
        tally.errors.values().sum::<usize>(),
        tally.errors,
        failed.len(),
        doubles.len(),
        lost.len(),
        promoted.as_millis(),
        switch.map(|d| d.as_millis()),
    );
    assert!(doubles.is_empty(), "effects that ran twice: {doubles:?}");
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    assert_eq!(
        tally.acknowledged.len(),
        KEYS,
        "every key is finally answered"
    );
    assert_eq!(counts.len(), KEYS, "every key's payment is on the server");
    assert!(
        switch.is_some(),
        "no payment succeeded after the crash during the load"
    );

    // The store now uses the promoted server: a new key is paid there.
    assert!(matches!(pay(&store, "after-failover").await, Answer::Paid));
    let there: i64 =
        sqlx::query_scalar("SELECT count(*) FROM payments WHERE key = 'after-failover'")
            .fetch_one(&mut promoted_server)
            .await
            .unwrap();
    assert_eq!(there, 1);
}

#[tokio::test]
async fn a_standby_alone_refuses_writes_as_retryable_and_a_primary_is_found_first() {
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let standby = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        cluster.standby_port()
    );
    let primary = format!("127.0.0.1:{}", cluster.primary_port());

    // With the standby first in the list, read-write still picks the primary.
    let url = format!(
        "postgres://postgres@127.0.0.1:{},{primary}/postgres?target_session_attrs=read-write",
        cluster.standby_port()
    );
    let store = PgStore::connect(&url).await.unwrap();
    assert!(matches!(pay_table(&store).await, Ok(())));

    // Asking for a standby where none is: refused, saying why.
    let only_primary =
        format!("postgres://postgres@{primary}/postgres?target_session_attrs=standby");
    let err = PgStore::connect(&only_primary).await.unwrap_err();
    assert_eq!(store_kind(&err), ErrorKind::Unavailable);
    assert!(
        err.to_string().contains("a primary (not in recovery)"),
        "{err}"
    );

    // A write sent to a standby (no attributes asked): 25006, retryable.
    let store = PgStore::builder(&standby)
        .migrate(false)
        .connect()
        .await
        .unwrap();
    let err = sqlx::raw_sql("CREATE TABLE nope (x int)")
        .execute(store.pool())
        .await
        .map_err(|e| idem_postgres::map_error(e, store.pool()))
        .unwrap_err();
    assert_eq!(store_kind(&err), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_read_only_sends_the_store_to_the_new_one_and_its_connections_are_dropped()
{
    let Some(cluster) = PgCluster::start() else {
        return;
    };
    let store = PgStore::builder(cluster.url("target_session_attrs=read-write"))
        .max_connections(4)
        .connect()
        .await
        .unwrap();
    pay_table(&store).await.unwrap();
    // Every pooled connection on the first primary.
    let warm: Vec<_> = (0..4)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(
                async move { matches!(pay(&store, &format!("warm-{n}")).await, Answer::Paid) },
            )
        })
        .collect();
    for paid in warm {
        assert!(paid.await.unwrap());
    }

    // A switchover: the standby is promoted, the old primary turned
    // read-only (as a fencing step would), with the store's connections
    // still open on it.
    let promoting = Arc::new(cluster);
    let cluster = promoting.clone();
    tokio::task::spawn_blocking(move || promoting.promote_standby())
        .await
        .unwrap()
        .unwrap();
    let mut old = PgConnection::connect(&PgCluster::single_url(cluster.primary_port()))
        .await
        .unwrap();
    sqlx::raw_sql("ALTER SYSTEM SET default_transaction_read_only = on")
        .execute(&mut old)
        .await
        .unwrap();
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut old)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The first write meets the read-only server: retryable, not a failure.
    let first = pay(&store, "after-switch").await;
    let mut answers = vec![match first {
        Answer::Paid => "paid".to_owned(),
        Answer::Failed(why) => why,
    }];
    let deadline = Instant::now() + Duration::from_secs(10);
    while answers.last().is_some_and(|a| a != "paid") {
        assert!(Instant::now() < deadline, "never paid: {answers:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        answers.push(match pay(&store, "after-switch").await {
            Answer::Paid => "paid".to_owned(),
            Answer::Failed(why) => why,
        });
    }
    eprintln!("switchover: the first key after it was answered {answers:?}");
    assert!(
        answers.iter().all(|a| a == "paid" || a == "Unavailable"),
        "a read-only refusal is retryable: {answers:?}"
    );
    // The connections left on the read-only server are not used again:
    // every later call is paid at once.
    for n in 0..12 {
        let key = format!("later-{n}");
        assert!(
            matches!(pay(&store, &key).await, Answer::Paid),
            "{key} after {answers:?}"
        );
    }
    let mut new = PgConnection::connect(&PgCluster::single_url(cluster.standby_port()))
        .await
        .unwrap();
    let on_new: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payments WHERE key = 'after-switch' OR key LIKE 'later-%'",
    )
    .fetch_one(&mut new)
    .await
    .unwrap();
    assert_eq!(on_new, 13);
}

async fn pay_table(store: &PgStore) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS payments (key text NOT NULL)")
        .execute(store.pool())
        .await
        .map(|_| ())
}

fn store_kind(error: &Error) -> ErrorKind {
    match error {
        Error::Store(store) => store.kind(),
        other => panic!("not a store error: {other:?}"),
    }
}
