//! The checker finds the bugs it is for: each test runs clients with retries
//! against one handler, writes their history, reads the effects back from
//! the SQLite table with a query, and checks the two. Four handlers carry a
//! classic bug each and are caught by name; Idem's own protocol passes.
//!
//! Faults are injected by operation and attempt, the same on every run: a
//! handler may die after its commit (the client sees a reset: `unknown`), or
//! its answer may be lost on the way back (a timeout: `unknown`). The client
//! then retries; its last attempt always gets through, so every operation
//! ends acknowledged.

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::rusqlite::{self, OptionalExtension, params};
use idem::{
    ApplyError, AtomicStore, Error, FenceStore, Fingerprint, Guard, IdempotencyKey, ManualClock,
    Outcome, OutcomeKind, Resource, Scope, SqliteStore,
};
use idem_check::history::{Answer, Event, Writer};
use idem_check::{Report, ViolationKind, check, effects, history};

const OPERATIONS: u64 = 40;
const ATTEMPTS: u32 = 4;
const CLIENTS: u64 = 4;
/// Every fifth operation is sent again on purpose, as a duplicate.
const DUPLICATE_EVERY: u64 = 5;
/// The effect log, in commit order.
const EFFECTS_QUERY: &str = "SELECT scope, key, resource, fence FROM effects ORDER BY seq";

/// A database, its effects table and the history being written.
struct Lab {
    _dir: tempfile::TempDir,
    db: PathBuf,
    store: SqliteStore,
    history_path: PathBuf,
    history: Mutex<Writer<File>>,
}

impl Lab {
    async fn new(clock: Option<ManualClock>) -> Arc<Self> {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let mut builder = SqliteStore::builder(&db);
        if let Some(clock) = clock {
            builder = builder.clock(Arc::new(clock));
        }
        let store = builder.open().await.unwrap();
        store
            .with_connection(|conn| {
                conn.execute_batch(
                    "CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT,
                                           key TEXT NOT NULL, resource TEXT, fence INTEGER);
                     CREATE TABLE marks (key TEXT PRIMARY KEY, body TEXT NOT NULL);
                     CREATE TABLE reports (id INTEGER PRIMARY KEY, body TEXT,
                                           fence INTEGER NOT NULL DEFAULT 0);
                     INSERT INTO reports (id) VALUES (1), (2), (3);",
                )
            })
            .await
            .unwrap()
            .unwrap();
        let history_path = dir.path().join("history.jsonl");
        let history = Mutex::new(Writer::new(File::create(&history_path).unwrap()));
        Arc::new(Self {
            _dir: dir,
            db,
            store,
            history_path,
            history,
        })
    }

    fn record(&self, event: Event) {
        self.history.lock().unwrap().write(&event).unwrap();
    }

    /// Reads the history file and the effects table back and checks them.
    fn check(&self) -> Report {
        let events = history::read(std::io::BufReader::new(
            File::open(&self.history_path).unwrap(),
        ))
        .unwrap();
        history::validate(&events).unwrap();
        let effects = effects::query::sqlite(&self.db, EFFECTS_QUERY).unwrap();
        check(&events, &effects)
    }
}

/// Whether the fault `salt` strikes attempt `attempt` of operation `op`, one
/// time in `one_in`: a fixed mix of the three, so every run is the same.
fn strikes(op: u64, attempt: u32, salt: u64, one_in: u64) -> bool {
    let mut x = op
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(attempt) << 32)
        .wrapping_add(salt);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x.is_multiple_of(one_in)
}

/// The server died before answering.
#[derive(Debug)]
struct Crash;

/// The handlers under test.
#[derive(Debug, Clone, Copy)]
enum Handler {
    /// Applies every delivery: no dedupe at all.
    Naive,
    /// Checks a mark before the effect, but commits the effect and the mark
    /// in two transactions: a crash between them loses the mark.
    MarkApart,
    /// Idem's atomic mode: the effect in the transaction of the record.
    Idem,
}

fn hash(body: &[u8]) -> String {
    Fingerprint::of_bytes(body).to_hex()
}

fn answer(status: u16, body: &[u8], replayed: bool) -> Answer {
    Answer {
        status,
        body_hash: Some(hash(body)),
        replayed,
    }
}

impl Handler {
    /// Handles one delivery; `crash` makes the server die at the worst moment
    /// this handler has (after its commit, or between its two commits).
    async fn handle(
        self,
        store: &SqliteStore,
        key: &str,
        payload: &str,
        crash: bool,
    ) -> Result<Answer, Crash> {
        let key = key.to_owned();
        match self {
            Self::Naive => {
                let id = store
                    .with_connection(move |conn| insert_effect(conn, &key))
                    .await
                    .unwrap();
                if crash {
                    return Err(Crash);
                }
                Ok(answer(201, format!("payment {id}").as_bytes(), false))
            }
            Self::MarkApart => store
                .with_connection(move |conn| {
                    let marked: Option<String> = conn
                        .query_row("SELECT body FROM marks WHERE key = ?1", [&key], |row| {
                            row.get(0)
                        })
                        .optional()
                        .unwrap();
                    if let Some(body) = marked {
                        return Ok(answer(201, body.as_bytes(), true));
                    }
                    let body = format!("payment {}", insert_effect(conn, &key));
                    if crash {
                        return Err(Crash);
                    }
                    conn.execute(
                        "INSERT INTO marks (key, body) VALUES (?1, ?2)",
                        params![key, body],
                    )
                    .unwrap();
                    Ok(answer(201, body.as_bytes(), false))
                })
                .await
                .unwrap(),
            Self::Idem => {
                let scope = Scope::new("payments").unwrap();
                let applied = store
                    .apply(
                        &scope,
                        &IdempotencyKey::new(key.clone()).unwrap(),
                        Fingerprint::of_bytes(payload.as_bytes()),
                        async move |tx| -> Result<Outcome, Crash> {
                            let id = insert_effect(tx, &key);
                            if crash {
                                // dies inside the transaction: nothing commits
                                return Err(Crash);
                            }
                            Ok(Outcome::success(format!("payment {id}")))
                        },
                    )
                    .await;
                match applied {
                    Ok(applied) => Ok(answer(201, &applied.outcome().body, applied.is_replay())),
                    Err(ApplyError::Effect(Crash)) => Err(Crash),
                    Err(other) => panic!("the store failed: {other:?}"),
                }
            }
        }
    }
}

fn insert_effect(conn: &rusqlite::Connection, key: &str) -> i64 {
    conn.execute(
        "INSERT INTO effects (scope, key) VALUES ('payments', ?1)",
        [key],
    )
    .unwrap();
    conn.last_insert_rowid()
}

/// How a client names the attempts of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// One key per operation, kept across retries: right.
    PerOperation,
    /// A new key for every attempt: the bug.
    PerAttempt,
}

/// One operation, sent until it is answered or out of attempts.
async fn send(lab: &Lab, handler: Handler, keys: Keys, op: u64, duplicate_of: Option<u64>) {
    let original = duplicate_of.unwrap_or(op);
    let payload = format!("pay 10 EUR for order {original}");
    let process = format!("client-{}", op % CLIENTS);
    for attempt in 0..ATTEMPTS {
        let key = match keys {
            Keys::PerOperation => format!("order-{original}"),
            Keys::PerAttempt => format!("order-{original}-attempt-{attempt}"),
        };
        lab.record(Event::Invoke {
            op,
            process: process.clone(),
            at_ms: 0,
            scope: Some("payments".into()),
            key: Some(key.clone()),
            fingerprint: Some(hash(payload.as_bytes())),
            request: None,
            duplicate_of,
        });
        let last = attempt + 1 == ATTEMPTS;
        let crash = !last && strikes(op, attempt, 1, 3);
        let unknown = |error: &str| Event::Unknown {
            op,
            process: process.clone(),
            at_ms: 0,
            error: error.into(),
        };
        match handler.handle(&lab.store, &key, &payload, crash).await {
            Err(Crash) => lab.record(unknown("connection reset")),
            Ok(_) if !last && strikes(op, attempt, 2, 4) => {
                lab.record(unknown("timed out: the answer was lost after the commit"));
            }
            Ok(answer) => {
                lab.record(Event::Ok {
                    op,
                    process: process.clone(),
                    at_ms: 0,
                    answer,
                });
                return;
            }
        }
    }
}

/// Runs every operation from a few concurrent clients, then the duplicates.
async fn run_clients(handler: Handler, keys: Keys) -> Report {
    let lab = Lab::new(None).await;
    let clients = (0..CLIENTS).map(|client| {
        let lab = lab.clone();
        tokio::spawn(async move {
            for op in (1..=OPERATIONS).filter(|op| op % CLIENTS == client) {
                send(&lab, handler, keys, op, None).await;
            }
        })
    });
    for client in clients.collect::<Vec<_>>() {
        client.await.unwrap();
    }
    if keys == Keys::PerOperation {
        for original in (1..=OPERATIONS).filter(|op| op % DUPLICATE_EVERY == 0) {
            send(&lab, handler, keys, OPERATIONS + original, Some(original)).await;
        }
    }
    let report = lab.check();
    assert!(
        report.counts.retries > 0,
        "the faults must strike: {report}"
    );
    report
}

fn kinds(report: &Report) -> Vec<ViolationKind> {
    let mut kinds: Vec<ViolationKind> = report.violations.iter().map(|v| v.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_dedupe_applies_every_delivery() {
    let report = run_clients(Handler::Naive, Keys::PerOperation).await;
    // Every retry and every duplicate applied again; the duplicates were
    // answered with a new payment, not the first one.
    assert_eq!(
        kinds(&report),
        [ViolationKind::DoubleEffect, ViolationKind::ReplayDiffers],
        "{report}"
    );
    assert!(report.counts.effects > report.counts.keys, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_committed_apart_from_its_effect_applies_again_after_a_crash() {
    let report = run_clients(Handler::MarkApart, Keys::PerOperation).await;
    assert_eq!(kinds(&report), [ViolationKind::DoubleEffect], "{report}");
    // Exactly the keys whose server died between the commits of the first
    // attempt were applied twice; once the mark is in, a lost answer is
    // replayed from it.
    let crashed = (1..=OPERATIONS).filter(|&op| strikes(op, 0, 1, 3)).count();
    assert!(crashed > 0);
    assert_eq!(report.violations.len(), crashed, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_per_retry_applies_each_attempt() {
    let report = run_clients(Handler::Idem, Keys::PerAttempt).await;
    assert_eq!(kinds(&report), [ViolationKind::NewKeyOnRetry], "{report}");
    let violation = &report.violations[0];
    assert_eq!(violation.ops.len(), 1);
    assert!(violation.keys.len() > 1, "{violation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idems_atomic_apply_passes() {
    let report = run_clients(Handler::Idem, Keys::PerOperation).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.counts.effects, OPERATIONS as usize);
    assert_eq!(report.counts.ok, report.counts.operations);
    assert!(report.counts.replays_seen > 0, "{report}");
    assert_eq!(
        report.counts.duplicates_sent,
        (OPERATIONS / DUPLICATE_EVERY) as usize
    );
}

/// Workers write reports under leases with fencing tokens. In every round
/// worker A takes the lease and pauses past its end; B takes over with a
/// greater token and writes; then A wakes up and writes with its old token.
async fn paused_workers(fenced: bool) -> Report {
    let clock = ManualClock::starting_now();
    let lab = Lab::new(Some(clock.clone())).await;
    let ttl = Duration::from_secs(30);
    let mut op = 0;
    for round in 1..=2 {
        for report in 1..=3_i64 {
            let resource = Resource::new(format!("report-{report}")).unwrap();
            let a = lab.store.acquire(&resource, ttl).await.unwrap();
            clock.advance(ttl + Duration::from_secs(1));
            let b = lab.store.acquire(&resource, ttl).await.unwrap();
            for (worker, lease) in [("worker-b", &b), ("worker-a", &a)] {
                op += 1;
                let key = format!("report-{report}/round-{round}/{worker}");
                write_report(
                    &lab,
                    fenced,
                    op,
                    worker,
                    &key,
                    &resource,
                    report,
                    lease.token.get(),
                )
                .await;
            }
            lab.store.release(&b).await.unwrap();
        }
    }
    lab.check()
}

/// One guarded (or unguarded) write, deduplicated by its key, recorded as
/// an operation.
#[allow(clippy::too_many_arguments)]
async fn write_report(
    lab: &Lab,
    fenced: bool,
    op: u64,
    worker: &str,
    key: &str,
    resource: &Resource,
    report: i64,
    token: i64,
) {
    let body = format!("{key} with token {token}");
    lab.record(Event::Invoke {
        op,
        process: worker.into(),
        at_ms: 0,
        scope: Some("reports".into()),
        key: Some(key.into()),
        fingerprint: Some(hash(body.as_bytes())),
        request: None,
        duplicate_of: None,
    });
    let guard = Guard::fence("reports", "id", "fence").unwrap();
    let (effect_key, name) = (key.to_owned(), resource.as_str().to_owned());
    let fences = lab.store.clone();
    let applied = lab
        .store
        .apply(
            &Scope::new("reports").unwrap(),
            &IdempotencyKey::new(key).unwrap(),
            Fingerprint::of_bytes(body.as_bytes()),
            async move |tx| -> Result<Outcome, Error> {
                if fenced {
                    match fences.advance(tx, &guard, &report, token) {
                        Ok(()) => {}
                        Err(Error::Stale { .. }) => return Ok(Outcome::terminal_failure("stale token")),
                        Err(other) => return Err(other),
                    }
                }
                tx.execute("UPDATE reports SET body = ?1 WHERE id = ?2", params![body, report])
                    .unwrap();
                tx.execute(
                    "INSERT INTO effects (scope, key, resource, fence) VALUES ('reports', ?1, ?2, ?3)",
                    params![effect_key, name, token],
                )
                .unwrap();
                Ok(Outcome::success(body))
            },
        )
        .await
        .unwrap();
    let outcome = applied.outcome();
    let event = match outcome.kind {
        OutcomeKind::Success => Event::Ok {
            op,
            process: worker.into(),
            at_ms: 0,
            answer: answer(200, &outcome.body, applied.is_replay()),
        },
        _ => Event::Fail {
            op,
            process: worker.into(),
            at_ms: 0,
            answer: Some(answer(409, &outcome.body, applied.is_replay())),
            error: "refused: stale token".into(),
        },
    };
    lab.record(event);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fencing_lets_a_paused_worker_overwrite_its_successor() {
    let report = paused_workers(false).await;
    assert_eq!(kinds(&report), [ViolationKind::StaleWrite], "{report}");
    assert_eq!(
        report.violations.len(),
        6,
        "one per round and report: {report}"
    );
    let violation = &report.violations[0];
    assert_eq!(violation.resource.as_deref(), Some("report-1"));
    assert_eq!(
        violation.keys,
        ["report-1/round-1/worker-b", "report-1/round-1/worker-a"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_refuse_the_paused_worker() {
    let report = paused_workers(true).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        report.counts.fail, 6,
        "worker A refused every time: {report}"
    );
    assert_eq!(report.counts.effects, 6);
}

#[test]
fn the_effects_query_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let missing = effects::query::sqlite(&dir.path().join("nope.db"), EFFECTS_QUERY).unwrap_err();
    assert!(
        missing.to_string().starts_with("cannot reach the store"),
        "{missing}"
    );
    let db = dir.path().join("app.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TABLE t (id INTEGER, k TEXT, f TEXT); INSERT INTO t VALUES (1, 'a', 'x');",
    )
    .unwrap();
    let no_key = effects::query::sqlite(&db, "SELECT id, k FROM t").unwrap_err();
    assert!(
        no_key
            .to_string()
            .contains("no column \"key\" (it returns: id, k)"),
        "{no_key}"
    );
    let bad_fence = effects::query::sqlite(&db, "SELECT k AS key, f AS fence FROM t").unwrap_err();
    assert!(
        bad_fence
            .to_string()
            .starts_with("row 1 of the effects query: column \"fence\""),
        "{bad_fence}"
    );
    let read = effects::query::sqlite(&db, "SELECT id AS key, NULL AS scope FROM t").unwrap();
    assert_eq!(read[0].key, "1");
    assert_eq!(read[0].scope, None);
}
