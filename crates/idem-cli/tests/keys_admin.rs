//! `idem keys rm`, `idem keys release`, `idem dlq discard` / `archive` and
//! `idem audit-log`, run as a user would, on every store; the store is
//! filled and used through the library, as an application would.

mod common;

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};

use idem::{
    AnyStore, Applied, Claimed, DeadLetterStore, Error, Fingerprint, IdempotencyKey, LeaseStore,
    NewDeadLetter, Outcome, RecordState, RecordStore, Scope, Timestamp,
};
use serde_json::Value;

use common::store::TestStore;

/// The tests' use of their store: `idem` run on it.
impl TestStore {
    /// Runs `idem --store URL ARGS…` with no terminal on its input.
    async fn idem(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        command
            .arg("--store")
            .arg(&self.url)
            .args(args)
            .env_remove("IDEM_STORE")
            .env_remove("IDEM_ACTOR")
            .stdin(std::process::Stdio::null());
        command.output().await.expect("run idem")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "idem failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn refused(out: &Output) -> (String, String) {
    assert!(
        !out.status.success(),
        "idem should have refused:\n{}",
        text(&out.stdout)
    );
    (text(&out.stdout), text(&out.stderr))
}

async fn audit_log(backend: &TestStore) -> Vec<Value> {
    let out = backend.idem(&["audit-log", "--json"]).await;
    let log: Value = serde_json::from_str(&ok(&out)).unwrap();
    log.as_array().unwrap().clone()
}

/// Applies `key` under the leased protocol, counting the effect's runs.
async fn apply(store: &AnyStore, scope: &Scope, key: &IdempotencyKey, runs: &AtomicU32) -> Applied {
    store
        .apply_leased(scope, key, Fingerprint::of_bytes(b"debit 10"), |_| async {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, std::convert::Infallible>(Outcome::success(format!("applied {n}")))
        })
        .await
        .unwrap()
}

/// An evicted key applies again: a new effect. Without --yes and without a
/// terminal nothing is removed; the audit log keeps the record as it was.
async fn eviction(backend: &TestStore) {
    let store = backend.open().await;
    // A scope as the HTTP layer writes it, a principal's hash in it.
    let scope = Scope::new("http:3f9a1c27b0e4d5a6:POST:/payments").unwrap();
    let key = IdempotencyKey::new("pay-42").unwrap();
    let runs = AtomicU32::new(0);
    assert!(!apply(&store, &scope, &key, &runs).await.is_replay());
    assert!(apply(&store, &scope, &key, &runs).await.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let before = store.get(&scope, &key).await.unwrap().unwrap();

    let out = backend
        .idem(&["keys", "rm", scope.as_str(), "pay-42"])
        .await;
    let (stdout, stderr) = refused(&out);
    assert!(
        stdout.contains("would remove the record of key pay-42"),
        "{stdout}"
    );
    assert!(
        stdout.contains("applied 1"),
        "the record is shown: {stdout}"
    );
    assert!(stderr.contains("run again with --yes"), "{stderr}");
    assert_eq!(
        store.get(&scope, &key).await.unwrap().as_ref(),
        Some(&before)
    );
    assert!(audit_log(backend).await.is_empty());

    let out = backend
        .idem(&[
            "keys",
            "rm",
            scope.as_str(),
            "pay-42",
            "--yes",
            "--actor",
            "alice",
        ])
        .await;
    let stdout = ok(&out);
    assert!(stdout.contains("removed key pay-42"), "{stdout}");
    assert_eq!(store.get(&scope, &key).await.unwrap(), None);

    // The next use of the key is a new key: the effect runs again.
    assert!(!apply(&store, &scope, &key, &runs).await.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let log = audit_log(backend).await;
    assert_eq!(log.len(), 1, "{log:?}");
    let entry = &log[0];
    assert_eq!(entry["action"], "evict");
    assert_eq!(entry["actor"], "alice");
    assert_eq!(entry["scope"], scope.as_str());
    assert_eq!(entry["key"], "pay-42");
    assert_eq!(entry["before"]["state"], "completed");
    assert_eq!(entry["before"]["token"], before.token.get());
    assert_eq!(entry["before"]["outcome"]["body"], "applied 1");
    let table = ok(&backend.idem(&["audit-log"]).await);
    assert!(
        table.contains("alice") && table.contains("evict"),
        "{table}"
    );

    // A key with no record is said so.
    let out = backend
        .idem(&["keys", "rm", scope.as_str(), "no-such", "--yes"])
        .await;
    let (_, stderr) = refused(&out);
    assert!(stderr.contains("no record for key no-such"), "{stderr}");
}

/// An ended claim: its holder's completion is refused, the next claim runs
/// at once with a greater token. A settled record has no claim to end.
async fn release(backend: &TestStore) {
    let store = backend.open().await;
    let scope = Scope::new("emails").unwrap();
    let key = IdempotencyKey::new("welcome/7").unwrap();
    let fp = Fingerprint::of_bytes(b"welcome");
    let Claimed::Fresh(stuck) = store.claim(&scope, &key, fp).await.unwrap() else {
        panic!("a new key is claimed");
    };
    // While the lease runs, a retry is answered in flight.
    assert!(matches!(
        store.claim(&scope, &key, fp).await,
        Err(Error::InFlight { .. })
    ));

    let out = backend
        .idem(&["keys", "release", "emails", "welcome/7"])
        .await;
    let (stdout, stderr) = refused(&out);
    assert!(stdout.contains("would end the claim"), "{stdout}");
    assert!(stderr.contains("run again with --yes"), "{stderr}");
    let still = store.get(&scope, &key).await.unwrap().unwrap();
    assert_eq!(still.token, stuck.token);
    assert!(still.lease_until.is_some(), "nothing changed: {still:?}");

    let out = backend
        .idem(&[
            "keys",
            "release",
            "emails",
            "welcome/7",
            "--yes",
            "--actor",
            "bob",
        ])
        .await;
    let stdout = ok(&out);
    assert!(stdout.contains("released key welcome/7"), "{stdout}");

    // The old holder finishes late: refused.
    let late = store
        .complete(&stuck, &Outcome::success("sent twice"))
        .await;
    assert!(matches!(late, Err(Error::Fenced { .. })), "{late:?}");
    // The retry runs at once, with a token greater than the released one
    // and than the one the release fenced it with.
    let Claimed::Fresh(next) = store.claim(&scope, &key, fp).await.unwrap() else {
        panic!("the released key is claimed again");
    };
    assert!(next.token > stuck.token.next(), "{next:?} after {stuck:?}");
    assert!(!next.took_over, "a released claim is free, not taken over");
    store
        .complete(&next, &Outcome::success("sent"))
        .await
        .unwrap();
    let settled = store.get(&scope, &key).await.unwrap().unwrap();
    assert_eq!(settled.state, RecordState::Completed);
    assert_eq!(settled.outcome.unwrap().body, b"sent");

    let log = audit_log(backend).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["action"], "release");
    assert_eq!(log[0]["actor"], "bob");
    assert_eq!(log[0]["before"]["state"], "in_flight");
    assert_eq!(log[0]["before"]["token"], stuck.token.get());

    // A completed record is not in flight: refused, nothing logged.
    let out = backend
        .idem(&["keys", "release", "emails", "welcome/7", "--yes"])
        .await;
    let (_, stderr) = refused(&out);
    assert!(stderr.contains("is completed, not in flight"), "{stderr}");
    assert_eq!(audit_log(backend).await.len(), 1);
}

async fn letter(store: &AnyStore, key: &str, error: &str) -> i64 {
    store
        .record_dead_letter(&NewDeadLetter {
            origin: "consumer amqp queue orders".into(),
            destination: "amqp://guest:secret@127.0.0.1:5672/%2f?queue=orders".into(),
            key: IdempotencyKey::new(key).unwrap(),
            payload: br#"{"order":1}"#.to_vec(),
            headers: BTreeMap::new(),
            attempts: 5,
            last_error: error.into(),
            first_seen_at: Timestamp(1_750_000_000_000),
        })
        .await
        .unwrap()
}

async fn waiting_ids(backend: &TestStore, all: bool) -> Vec<i64> {
    let mut args = vec!["dlq", "ls", "--json"];
    if all {
        args.push("--all");
    }
    let listed: Value = serde_json::from_str(&ok(&backend.idem(&args).await)).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_i64().unwrap())
        .collect()
}

/// Archive sets a letter aside (kept, not waiting); discard deletes; both
/// by id or by cause, only once confirmed, each logged.
async fn dead_letters(backend: &TestStore) {
    let store = backend.open().await;
    let a = letter(&store, "order-1", "handler failed: 500\nat line 2").await;
    let b = letter(&store, "order-2", "handler failed: 500").await;
    let c = letter(&store, "order-3", "no such customer").await;
    assert_eq!(waiting_ids(backend, false).await, vec![a, b, c]);

    let id = a.to_string();
    let (stdout, stderr) = refused(&backend.idem(&["dlq", "archive", &id]).await);
    assert!(stdout.contains("would archive 1 dead letter"), "{stdout}");
    assert!(stderr.contains("run again with --yes"), "{stderr}");
    assert_eq!(waiting_ids(backend, false).await, vec![a, b, c]);

    ok(&backend
        .idem(&["dlq", "archive", &id, "--yes", "--actor", "carol"])
        .await);
    assert_eq!(waiting_ids(backend, false).await, vec![b, c]);
    assert_eq!(waiting_ids(backend, true).await, vec![a, b, c]);
    let stats = store.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.redriven, stats.archived), (2, 0, 1));
    let table = ok(&backend.idem(&["dlq", "ls"]).await);
    assert!(
        table.contains("2 waiting, 0 redriven, 1 archived"),
        "{table}"
    );
    let groups: Value =
        serde_json::from_str(&ok(&backend.idem(&["dlq", "groups", "--json"]).await)).unwrap();
    assert_eq!(groups.as_array().unwrap().len(), 2, "{groups}");
    assert_eq!(
        groups[0]["waiting"], 1,
        "the archived letter waits no more: {groups}"
    );
    let (_, stderr) = refused(&backend.idem(&["dlq", "archive", &id, "--yes"]).await);
    assert!(stderr.contains("archived already"), "{stderr}");

    // The group of the 500s now holds one waiting letter: b.
    let (stdout, _) = refused(
        &backend
            .idem(&["dlq", "discard", "--group", "handler failed: 500"])
            .await,
    );
    assert!(stdout.contains("would discard 1 dead letter"), "{stdout}");
    assert!(store.get_dead_letter(b).await.unwrap().is_some());
    let stdout = ok(&backend
        .idem(&[
            "dlq",
            "discard",
            "--group",
            "handler failed",
            "--yes",
            "--actor",
            "carol",
        ])
        .await);
    assert!(stdout.contains("1 discarded"), "{stdout}");
    assert_eq!(store.get_dead_letter(b).await.unwrap(), None);
    assert!(
        store.get_dead_letter(a).await.unwrap().is_some(),
        "archived, kept"
    );
    assert_eq!(waiting_ids(backend, false).await, vec![c]);
    assert_eq!(waiting_ids(backend, true).await, vec![a, c]);
    let stats = store.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.archived), (1, 1));

    let log = audit_log(backend).await;
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0]["action"], "discard");
    assert_eq!(log[0]["dead_letter_id"], b);
    assert_eq!(log[0]["key"], "order-2");
    assert_eq!(log[0]["before"]["payload"], r#"{"order":1}"#);
    assert!(
        !log[0]["before"]["destination"]
            .as_str()
            .unwrap()
            .contains("secret"),
        "passwords in URLs are never shown: {}",
        log[0]["before"]
    );
    assert_eq!(log[1]["action"], "archive");
    assert_eq!(log[1]["dead_letter_id"], a);
    assert_eq!(log[1]["before"]["archived_at_ms"], Value::Null);

    let (_, stderr) = refused(&backend.idem(&["dlq", "discard", "999", "--yes"]).await);
    assert!(stderr.contains("no dead letter with id 999"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rm_evicts_on_sqlite() {
    eviction(&TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rm_evicts_on_postgres() {
    if let Some(backend) = TestStore::postgres("idem_t_keys_admin").await {
        eviction(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rm_evicts_on_redis() {
    if let Some(backend) = TestStore::redis("keys-admin") {
        eviction(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rm_evicts_on_redis_cluster() {
    if let Some(backend) = TestStore::redis_cluster("keys-admin") {
        eviction(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rm_evicts_on_dynamodb() {
    if let Some(backend) = TestStore::dynamodb("keys-admin") {
        eviction(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_release_fences_the_holder_on_sqlite() {
    release(&TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_release_fences_the_holder_on_postgres() {
    if let Some(backend) = TestStore::postgres("idem_t_keys_admin").await {
        release(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_release_fences_the_holder_on_redis() {
    if let Some(backend) = TestStore::redis("keys-admin") {
        release(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_release_fences_the_holder_on_redis_cluster() {
    if let Some(backend) = TestStore::redis_cluster("keys-admin") {
        release(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_release_fences_the_holder_on_dynamodb() {
    if let Some(backend) = TestStore::dynamodb("keys-admin") {
        release(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_archive_and_discard_on_sqlite() {
    dead_letters(&TestStore::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_archive_and_discard_on_postgres() {
    if let Some(backend) = TestStore::postgres("idem_t_keys_admin").await {
        dead_letters(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_archive_and_discard_on_redis() {
    if let Some(backend) = TestStore::redis("keys-admin") {
        dead_letters(&backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_archive_and_discard_on_dynamodb() {
    if let Some(backend) = TestStore::dynamodb("keys-admin") {
        dead_letters(&backend).await;
    }
}

/// `idem ARGS…` on a pseudo-terminal (util-linux `script`), typing `answer`
/// at its question.
fn on_a_terminal(backend: &TestStore, args: &[&str], answer: &str) -> Output {
    use std::io::Write;
    let mut line = format!("'{}' --store '{}'", env!("CARGO_BIN_EXE_idem"), backend.url);
    for arg in args {
        line.push_str(&format!(" '{arg}'"));
    }
    let mut child = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env_remove("IDEM_STORE")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run script (util-linux) to give idem a terminal");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{answer}\n").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// On a terminal, idem asks: anything but `y` changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rm_asks_on_a_terminal() {
    let backend = TestStore::sqlite();
    let store = backend.open().await;
    let (scope, key) = (Scope::new("s").unwrap(), IdempotencyKey::new("k").unwrap());
    let runs = AtomicU32::new(0);
    apply(&store, &scope, &key, &runs).await;

    let out = on_a_terminal(&backend, &["keys", "rm", "s", "k"], "n");
    let shown = text(&out.stdout);
    assert!(!out.status.success(), "{shown}");
    assert!(shown.contains("remove it? [y/N]"), "{shown}");
    assert!(shown.contains("not confirmed"), "{shown}");
    assert!(store.get(&scope, &key).await.unwrap().is_some());

    let out = on_a_terminal(&backend, &["keys", "rm", "s", "k", "--actor", "dave"], "y");
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("removed key k in scope s"), "{shown}");
    assert_eq!(store.get(&scope, &key).await.unwrap(), None);
    assert_eq!(audit_log(&backend).await[0]["actor"], "dave");
}
