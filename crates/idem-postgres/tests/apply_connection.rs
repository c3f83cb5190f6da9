//! Atomic apply's locked path at the edges: values sent as literals in simple
//! queries, rows read back as text, the statements each session prepares, and
//! a connection that must never go back to the pool inside a transaction
//! (effects that panic, applies that are cancelled).

mod common;

use std::time::Duration;

use common::TestDb;
use idem_core::{
    Applied, ApplyError, AtomicEffect, AtomicStore, Claimed, Clock, Error, ErrorKind, Fingerprint,
    IdempotencyKey, LeaseStore, Outcome, OutcomeKind, RecordState, RecordStore, Scope, Settings,
};
use idem_postgres::PgStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::oneshot;

fn scope() -> Scope {
    Scope::new("payments").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

/// Keys made of what could break a literal: quotes, backslashes, comment and
/// statement separators, dollar quotes.
const AWKWARD_KEYS: [&str; 6] = [
    "o'neil",
    r"back\slash",
    r"\'",
    "';DROP-TABLE-idem_records;--",
    "$$x$$",
    r#"E'\x41'"#,
];

/// Debits `amount` from account 1; the outcome is the new balance.
fn debit(amount: i64) -> impl AtomicEffect<PgConnection, Outcome, sqlx::Error> {
    async move |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        let balance: i64 = sqlx::query_scalar(
            "UPDATE accounts SET balance = balance - $1 WHERE id = 1 RETURNING balance",
        )
        .bind(amount)
        .fetch_one(&mut *conn)
        .await?;
        Ok(Outcome::success(balance.to_string()))
    }
}

/// Debits 1 from account 1; the outcome is `outcome`.
fn pay_with(outcome: Outcome) -> impl AtomicEffect<PgConnection, Outcome, sqlx::Error> {
    async move |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        sqlx::query("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
            .execute(&mut *conn)
            .await?;
        Ok(outcome)
    }
}

/// Debits 10 from account 1, then runs `sql` behind the store's back.
fn sneak_in(sql: &'static str) -> impl AtomicEffect<PgConnection, Outcome, sqlx::Error> {
    async move |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
            .execute(&mut *conn)
            .await?;
        sqlx::query(sql).execute(&mut *conn).await?;
        Ok(Outcome::success("sneaky"))
    }
}

async fn apply_debit(
    store: &PgStore,
    k: &str,
    amount: i64,
) -> Result<Applied, ApplyError<sqlx::Error>> {
    let fp = Fingerprint::of_bytes(format!("debit {amount}").as_bytes());
    store.apply(&scope(), &key(k), fp, debit(amount)).await
}

/// An outcome that uses every byte and the characters JSON and SQL escape.
fn awkward_outcome() -> Outcome {
    Outcome {
        kind: OutcomeKind::Success,
        body: (0..=255).collect(),
        meta: [
            ("quote".to_owned(), r#"it's "quoted" \ back"#.to_owned()),
            ("lines".to_owned(), "a\nb\t\u{1}".to_owned()),
            ("unicode".to_owned(), "née € 🦀".to_owned()),
        ]
        .into_iter()
        .collect(),
    }
}

/// Sessions of the test database that hold an advisory lock, or sit inside
/// a transaction doing nothing; asked from a connection of its own.
async fn leftovers(db: &TestDb) -> (i64, i64) {
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let locks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid <> pg_backend_pid() \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let idle_in_tx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.ok();
    (locks, idle_in_tx)
}

/// Waits (at most 5 s) until no session holds a lock or an idle transaction.
/// What is left to roll back when an apply ends (an apply given up mid-way,
/// the empty transaction after a commit) goes with the pool's check of the
/// returned connection, which a task of the pool makes just after.
async fn until_no_leftovers(db: &TestDb) {
    for _ in 0..500 {
        if leftovers(db).await == (0, 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("still held after 5 s: {:?}", leftovers(db).await);
}

#[tokio::test]
async fn awkward_keys_apply_once_and_replay() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let scope = Scope::new(r"pay'\ments").unwrap();
    for (i, k) in AWKWARD_KEYS.into_iter().enumerate() {
        let fp = Fingerprint::of_bytes(k.as_bytes());
        let first = store
            .apply(&scope, &key(k), fp, pay_with(awkward_outcome()))
            .await
            .unwrap();
        assert_eq!(first, Applied::Fresh(awkward_outcome()), "{k}");
        let again = store
            .apply(&scope, &key(k), fp, pay_with(Outcome::success("again")))
            .await
            .unwrap();
        assert_eq!(again, Applied::Replayed(awkward_outcome()), "{k}");
        assert_eq!(db.balance(&store, 1).await, 100 - i as i64 - 1, "{k}");

        let record = store.get(&scope, &key(k)).await.unwrap().unwrap();
        assert_eq!(record.key.as_str(), k);
        assert_eq!(record.scope, scope);
        assert_eq!(record.fingerprint, fp);
        assert_eq!(record.outcome, Some(awkward_outcome()));
    }
    assert_eq!(store.list(&Default::default()).await.unwrap().len(), 6);
}

/// An expired record and an abandoned claim are read under the lock, as text,
/// and what the new record keeps of them (token, creation, window) shows they
/// were read whole.
#[tokio::test]
async fn the_locked_read_decodes_whole_records() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = common::clock();
    let store = db.store_at(&clock).await;
    let (expired, abandoned) = (AWKWARD_KEYS[0], AWKWARD_KEYS[1]);
    let fp = Fingerprint::of_bytes(b"payload");

    let stored = store
        .apply(&scope(), &key(expired), fp, async |_| {
            Ok::<_, sqlx::Error>(awkward_outcome())
        })
        .await
        .unwrap();
    assert!(!stored.is_replay());
    let Claimed::Fresh(claim) = store.claim(&scope(), &key(abandoned), fp).await.unwrap() else {
        panic!("expected a fresh claim");
    };
    let claimed = store.get(&scope(), &key(abandoned)).await.unwrap().unwrap();

    // Past the lease: the claim is taken over, keeping its window.
    clock.advance(Duration::from_secs(61));
    let took_over = store
        .apply(&scope(), &key(abandoned), fp, debit(10))
        .await
        .unwrap();
    assert_eq!(took_over, Applied::Fresh(Outcome::success("90")));
    let record = store.get(&scope(), &key(abandoned)).await.unwrap().unwrap();
    assert_eq!(record.token.get(), claim.token.get() + 1);
    assert_eq!(record.created_at, claimed.created_at);
    assert_eq!(record.expires_at, claimed.expires_at);
    assert_eq!(record.state, RecordState::Completed);

    // Past retention: the key starts over with a greater token, even with
    // another payload.
    clock.advance(Duration::from_secs(3600));
    let fresh = apply_debit(&store, expired, 5).await.unwrap();
    assert_eq!(fresh, Applied::Fresh(Outcome::success("85")));
    let record = store.get(&scope(), &key(expired)).await.unwrap().unwrap();
    assert_eq!(record.token, idem_core::FencingToken::first_at(clock.now()));
    assert_eq!(record.created_at, clock.now());
}

/// A nested `begin()` in the effect is a savepoint of the apply's
/// transaction: rolling it back undoes only its own writes, and nothing
/// commits before the record does.
#[tokio::test]
async fn nested_transactions_in_the_effect_are_savepoints() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let applied = store
        .apply(
            &scope(),
            &key("nested"),
            Fingerprint::of_bytes(b"n"),
            async |conn| {
                assert!(conn.is_in_transaction());
                let mut undone = conn.begin().await?;
                sqlx::query("UPDATE accounts SET balance = balance - 50 WHERE id = 1")
                    .execute(&mut *undone)
                    .await?;
                undone.rollback().await?;
                let mut kept = conn.begin().await?;
                sqlx::query("UPDATE accounts SET balance = balance - 5 WHERE id = 1")
                    .execute(&mut *kept)
                    .await?;
                kept.commit().await?;
                assert!(conn.is_in_transaction());
                Ok::<_, sqlx::Error>(Outcome::success("nested"))
            },
        )
        .await
        .unwrap();
    assert_eq!(applied, Applied::Fresh(Outcome::success("nested")));
    assert_eq!(db.balance(&store, 1).await, 95);
    until_no_leftovers(&db).await;
}

#[tokio::test]
async fn a_panicking_effect_frees_the_key_at_once() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    // One connection: the next apply gets the very connection that panicked.
    let store = PgStore::builder(&db.url)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let panicked = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .apply(
                    &scope(),
                    &key("k"),
                    Fingerprint::of_bytes(b"debit 10"),
                    async |conn| {
                        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
                            .execute(&mut *conn)
                            .await?;
                        panic!("the effect panics");
                        #[allow(unreachable_code)]
                        Ok::<_, sqlx::Error>(Outcome::empty())
                    },
                )
                .await
        }
    })
    .await
    .unwrap_err();
    assert!(panicked.is_panic());
    assert_eq!(leftovers(&db).await, (0, 0));

    let applied = apply_debit(&store, "k", 10).await.unwrap();
    assert!(!applied.is_replay());
    assert_eq!(db.balance(&store, 1).await, 90);
    until_no_leftovers(&db).await;
}

#[tokio::test]
async fn a_cancelled_apply_leaves_no_transaction_behind() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = PgStore::builder(&db.url)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let (entered_tx, entered) = oneshot::channel::<()>();
    let stuck = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .apply(
                    &scope(),
                    &key("k"),
                    Fingerprint::of_bytes(b"debit 10"),
                    async move |conn| {
                        sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
                            .execute(&mut *conn)
                            .await?;
                        entered_tx.send(()).unwrap();
                        futures::future::pending::<()>().await;
                        Ok::<_, sqlx::Error>(Outcome::empty())
                    },
                )
                .await
        }
    });
    entered.await.unwrap();
    assert_eq!(leftovers(&db).await.0, 1, "the running apply holds its key");
    stuck.abort();
    assert!(stuck.await.unwrap_err().is_cancelled());

    until_no_leftovers(&db).await;
    let applied = apply_debit(&store, "k", 10).await.unwrap();
    assert!(!applied.is_replay());
    assert_eq!(db.balance(&store, 1).await, 90);
}

/// Something that writes `idem_records` without the key's lock (here the
/// effect itself) makes the decision stale: the apply fails as a serialization
/// failure, and neither the effect nor that write is committed.
#[tokio::test]
async fn a_record_changed_behind_the_lock_commits_nothing() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let clock = common::clock();
    let store = db.store_at(&clock).await;
    let is_serialization_failure = |err: &ApplyError<sqlx::Error>| matches!(err, ApplyError::Protocol(Error::Store(e)) if e.kind() == ErrorKind::SerializationFailure);
    let fp = Fingerprint::of_bytes(b"debit 10");

    // No record when read: the new record's insert finds one.
    let err = store
        .apply(
            &scope(),
            &key("new"),
            fp,
            sneak_in(
                "INSERT INTO idem_records (scope, key, fingerprint, state, token, created_at, \
                 updated_at, expires_at) VALUES ('payments', 'new', decode(repeat('00', 32), 'hex'), \
                 'in_flight', 7, 0, 0, 9000000000000)",
            ),
        )
        .await
        .unwrap_err();
    assert!(is_serialization_failure(&err), "{err:?}");
    assert_eq!(db.balance(&store, 1).await, 100);
    assert!(store.get(&scope(), &key("new")).await.unwrap().is_none());

    // A record read under the lock, whose token then moves past the new one.
    apply_debit(&store, "old", 10).await.unwrap();
    clock.advance(Duration::from_secs(7200));
    let err = store
        .apply(
            &scope(),
            &key("old"),
            fp,
            sneak_in("UPDATE idem_records SET token = 9000000000000000000 WHERE key = 'old'"),
        )
        .await
        .unwrap_err();
    assert!(is_serialization_failure(&err), "{err:?}");
    assert_eq!(db.balance(&store, 1).await, 90);
    let old = store.get(&scope(), &key("old")).await.unwrap().unwrap();
    assert_eq!(old.token, idem_core::FencingToken::first_at(old.created_at));
    until_no_leftovers(&db).await;
}

/// A migrated database, and a store over a pool of one connection of the
/// application's own (no hook prepares the store's statements).
async fn store_over_a_pool_of_one(db: &TestDb) -> (PgStore, sqlx::PgPool) {
    db.store().await; // migrates
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let store = PgStore::from_pool(
        pool.clone(),
        Settings::default(),
        std::sync::Arc::new(idem_core::SystemClock),
    );
    (store, pool)
}

/// A store over the application's own pool has no hook on new connections:
/// each prepares apply's statements the first time it needs them, and again
/// if they were dropped.
#[tokio::test]
async fn a_store_over_an_existing_pool_prepares_on_first_use() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let (store, pool) = store_over_a_pool_of_one(&db).await;
    assert!(!apply_debit(&store, "a", 10).await.unwrap().is_replay());
    assert!(apply_debit(&store, "a", 10).await.unwrap().is_replay());

    sqlx::raw_sql("DEALLOCATE idem_fetch_v1; DEALLOCATE idem_insert_v1")
        .execute(&pool)
        .await
        .unwrap();
    assert!(!apply_debit(&store, "b", 10).await.unwrap().is_replay());
    assert_eq!(db.balance(&store, 1).await, 80);

    // Replay first on a session that lost them all: the read under the
    // lock prepares them and applies.
    sqlx::raw_sql(
        "DEALLOCATE idem_fetch_v1; DEALLOCATE idem_insert_v1; DEALLOCATE idem_replace_v1",
    )
    .execute(&pool)
    .await
    .unwrap();
    let fp = Fingerprint::of_bytes(b"debit 10");
    let fresh = store
        .apply_replay_first(&scope(), &key("c"), fp, debit(10))
        .await
        .unwrap();
    assert!(!fresh.is_replay());
    let replay = store
        .apply_replay_first(&scope(), &key("c"), fp, debit(10))
        .await
        .unwrap();
    assert_eq!(replay, Applied::Replayed(fresh.outcome().clone()));
    assert_eq!(db.balance(&store, 1).await, 70);
    until_no_leftovers(&db).await;
}

/// `apply` takes an idle connection without the pool's ping. One the server
/// closed meanwhile fails the `BEGIN`, which is then sent again on a checked
/// connection: the caller sees a normal apply, applied once.
#[tokio::test]
async fn apply_on_a_connection_the_server_closed_applies_once() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = PgStore::builder(&db.url)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let fp = Fingerprint::of_bytes(b"debit 10");
    let first = store
        .apply(&scope(), &key("a"), fp, debit(10))
        .await
        .unwrap();
    assert!(!first.is_replay());

    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let mut admin = PgConnection::connect(&db.url).await.unwrap();
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(terminated);

    let second = store
        .apply(&scope(), &key("b"), fp, debit(10))
        .await
        .unwrap();
    assert!(!second.is_replay());
    let again = store
        .apply(&scope(), &key("b"), fp, debit(10))
        .await
        .unwrap();
    assert!(again.is_replay());
    assert_eq!(db.balance(&store, 1).await, 80);
    let new_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_ne!(new_pid, pid);
}

/// An apply given up while its read under the lock is still running (here
/// held up by a table lock) leaves no transaction behind: the key's lock is
/// not kept, and the next user's statements do not run inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_given_up_mid_claim_leaves_nothing_behind() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = PgStore::builder(&db.url)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let fp = Fingerprint::of_bytes(b"debit 10");
    store
        .apply(&scope(), &key("warm"), fp, debit(10))
        .await
        .unwrap();

    let mut blocker = PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let stuck = tokio::spawn({
        let store = store.clone();
        async move { store.apply(&scope(), &key("k"), fp, debit(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    stuck.abort();
    assert!(stuck.await.unwrap_err().is_cancelled());
    sqlx::raw_sql("COMMIT").execute(&mut blocker).await.unwrap();

    until_no_leftovers(&db).await;
    let applied = store
        .apply(&scope(), &key("k"), fp, debit(10))
        .await
        .unwrap();
    assert!(!applied.is_replay());
    assert_eq!(db.balance(&store, 1).await, 80);
}

/// Lease renewals given up right after their `BEGIN` was sent (a pool
/// without the ping hands out the connection at once, so the first poll sends
/// it) leave no transaction behind on the pooled connection.
#[tokio::test]
async fn renewals_given_up_mid_begin_leave_no_transaction_behind() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    db.store().await; // migrates
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&db.url)
        .await
        .unwrap();
    let store = PgStore::from_pool(
        pool,
        Settings::default(),
        std::sync::Arc::new(idem_core::SystemClock),
    );
    let fp = Fingerprint::of_bytes(b"job");
    let Claimed::Fresh(claim) = store.claim(&scope(), &key("job"), fp).await.unwrap() else {
        panic!("a new key is claimed")
    };
    for _ in 0..10 {
        let mut renew = Box::pin(store.renew(&claim));
        // One poll takes the idle connection and sends BEGIN; then give up.
        assert!(futures::poll!(&mut renew).is_pending());
        drop(renew);
        until_no_leftovers(&db).await;
    }
    store
        .complete(&claim, &Outcome::success("done"))
        .await
        .unwrap();
    let record = store.get(&scope(), &key("job")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
}

/// The server's log, where this machine keeps it: the file the logging
/// collector writes, or the Debian cluster's log. `None` when neither can be
/// read (then the check below says so and is not made).
async fn server_log(conn: &mut PgConnection) -> Option<(std::path::PathBuf, u64)> {
    let collected: Option<String> = sqlx::query_scalar("SELECT pg_current_logfile()")
        .fetch_one(&mut *conn)
        .await
        .ok()
        .flatten();
    let data: String = sqlx::query_scalar("SHOW data_directory")
        .fetch_one(&mut *conn)
        .await
        .ok()?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut *conn)
        .await
        .ok()?;
    let major = version.split('.').next().unwrap_or_default().to_owned();
    let candidates = collected
        .map(|file| std::path::Path::new(&data).join(file))
        .into_iter()
        .chain([std::path::PathBuf::from(format!(
            "/var/log/postgresql/postgresql-{major}-main.log"
        ))]);
    for path in candidates {
        if let Ok(meta) = std::fs::metadata(&path)
            && std::fs::File::open(&path).is_ok()
        {
            return Some((path, meta.len()));
        }
    }
    None
}

/// The `ERROR` lines the server logged for `database` after byte `from`.
fn errors_logged(path: &std::path::Path, from: u64, database: &str) -> Vec<String> {
    let text = std::fs::read(path).unwrap();
    let start = usize::try_from(from).unwrap().min(text.len());
    String::from_utf8_lossy(&text[start..])
        .lines()
        .filter(|line| line.contains(&format!("@{database} ")) && line.contains("ERROR:"))
        .map(str::to_owned)
        .collect()
}

/// Duplicates are answers, not faults: a key held by a running apply, a
/// recorded key replayed, a key reused with another payload — none of them
/// raises an error on the server, so none writes an `ERROR` line into its
/// log. (One deliberate error first shows the log is being read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_write_no_error_into_the_server_log() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let store = db.store().await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let Some((log, from)) = server_log(&mut conn).await else {
        println!("the server's log cannot be read here; its ERROR lines are not checked");
        return;
    };
    assert!(
        sqlx::raw_sql("SELECT 1 / 0")
            .execute(&mut conn)
            .await
            .is_err(),
        "the deliberate error"
    );

    assert!(!apply_debit(&store, "a", 10).await.unwrap().is_replay());
    for _ in 0..3 {
        assert!(apply_debit(&store, "a", 10).await.unwrap().is_replay());
        let replayed = store
            .apply_replay_first(
                &scope(),
                &key("a"),
                Fingerprint::of_bytes(b"debit 10"),
                debit(10),
            )
            .await
            .unwrap();
        assert!(replayed.is_replay());
    }
    assert!(matches!(
        apply_debit(&store, "a", 99).await,
        Err(ApplyError::Protocol(Error::KeyReuse { .. }))
    ));

    let (entered, inside) = oneshot::channel();
    let (release, released) = oneshot::channel::<()>();
    let holder = tokio::spawn({
        let store = store.clone();
        async move {
            let fp = Fingerprint::of_bytes(b"debit 10");
            store
                .apply(
                    &scope(),
                    &key("held"),
                    fp,
                    async move |conn: &mut PgConnection| {
                        entered.send(()).unwrap();
                        released.await.unwrap();
                        let balance: i64 = sqlx::query_scalar(
                        "UPDATE accounts SET balance = balance - 10 WHERE id = 1 RETURNING balance",
                    )
                    .fetch_one(&mut *conn)
                    .await?;
                        Ok::<_, sqlx::Error>(Outcome::success(balance.to_string()))
                    },
                )
                .await
        }
    });
    inside.await.unwrap();
    for _ in 0..3 {
        assert!(matches!(
            apply_debit(&store, "held", 10).await,
            Err(ApplyError::Protocol(Error::InFlight { .. }))
        ));
    }
    release.send(()).unwrap();
    assert!(!holder.await.unwrap().unwrap().is_replay());
    assert!(apply_debit(&store, "held", 10).await.unwrap().is_replay());
    assert_eq!(db.balance(&store, 1).await, 80);

    let errors = errors_logged(&log, from, &database);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("division by zero"), "{errors:#?}");
}

/// A leased completion on a session without the prepared settlement (a
/// store over the application's pool, or one that dropped it) prepares it
/// and settles the claim.
#[tokio::test]
async fn a_completion_on_a_session_without_its_statement_prepares_it() {
    let Some(db) = TestDb::new().await else {
        return;
    };
    let (store, pool) = store_over_a_pool_of_one(&db).await;
    let store = store.with_group_commit(false);
    let fp = Fingerprint::of_bytes(b"report");
    for (name, drop_it) in [("first", false), ("second", true)] {
        let Claimed::Fresh(claim) = store.claim(&scope(), &key(name), fp).await.unwrap() else {
            panic!("a new key is claimed");
        };
        if drop_it {
            sqlx::raw_sql("DEALLOCATE idem_settle_v1")
                .execute(&pool)
                .await
                .unwrap();
        }
        let done = Outcome::success(format!("report {name}"));
        store.complete(&claim, &done).await.unwrap();
        // The pool's one connection went back outside any transaction, or
        // the claim below would fail.
        assert_eq!(
            store
                .claim(&scope(), &key(name), fp)
                .await
                .unwrap()
                .replayed()
                .cloned(),
            Some(done)
        );
    }
}
