//! Crash tests on moto's DynamoDB: the test binary runs itself again as a
//! child that applies an operation and aborts at one of Idem's crash points
//! (`IDEM_CRASH`), as a `kill -9` would; the parent then retries the
//! operation, once the child's lease has ended, and counts the effect in
//! DynamoDB.

mod common;
mod effects;

use std::process::Command;
use std::time::Duration;

use common::Dynamo;
use effects::{add_in, counter, create_id_table};
use idem_core::{
    Applied, ApplyError, AtomicStore, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Scope,
    Settings, crash,
};
use idem_dynamodb::{DynamoStore, Transaction};

/// Where the child finds the table, and which path it takes.
const TABLE: &str = "IDEM_DYNAMODB_CHILD_TABLE";
const CASE: &str = "IDEM_DYNAMODB_CHILD_CASE";
const AMOUNT: i64 = 10;

fn scope_key() -> (Scope, IdempotencyKey) {
    (
        Scope::new("payments").unwrap(),
        IdempotencyKey::new("crash-1").unwrap(),
    )
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes(b"debit 10")
}

/// The operation, atomic: its effect adds to the counter in the commit.
async fn apply_atomic(store: &DynamoStore, effects: &str) -> Result<Applied, ApplyError<String>> {
    let (scope, key) = scope_key();
    let effects = effects.to_owned();
    store
        .apply(
            &scope,
            &key,
            fingerprint(),
            async move |tx: &mut Transaction| {
                add_in(tx, &effects, "crash", AMOUNT);
                Ok::<_, String>(Outcome::success("debited"))
            },
        )
        .await
}

/// The operation, leased: its effect adds to the counter by a write of its
/// own, outside the record's.
async fn apply_leased(store: &DynamoStore, effects: &str) -> Result<Applied, ApplyError<String>> {
    let (scope, key) = scope_key();
    let client = store.client().clone();
    let update = effects::add(effects, "crash", AMOUNT);
    store
        .apply_leased(&scope, &key, fingerprint(), async move |_claim| {
            client
                .update_item()
                .table_name(update.table_name())
                .set_key(Some(update.key().clone()))
                .update_expression(update.update_expression())
                .set_expression_attribute_values(update.expression_attribute_values().cloned())
                .send()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(Outcome::success("debited"))
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the crash tests, which start it themselves"]
async fn crash_child() {
    let table = std::env::var(TABLE).expect("the parent names the table");
    let effects = format!("{table}-effects");
    let store = DynamoStore::open(&common::url_of(&table))
        .await
        .expect("open the store");
    let applied = match std::env::var(CASE).as_deref() {
        Ok("atomic") => apply_atomic(&store, &effects).await,
        Ok("leased") => apply_leased(&store, &effects).await,
        other => panic!("unknown case {other:?}"),
    };
    panic!("the child was to abort at its crash point, but the apply returned {applied:?}");
}

/// Runs the child until it aborts at `point` on path `case`, then retries
/// once the child's lease has ended; returns the retry's answer and the
/// counter's value.
async fn crash_and_retry(case: &str, point: &str) -> Option<(Applied, i64)> {
    let h = Dynamo::new("crash", Settings::default()).await?;
    let effects = format!("{}-effects", h.table);
    create_id_table(&h.store, &effects).await;
    let mut child = Command::new(std::env::current_exe().expect("the test binary"));
    child
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(TABLE, h.table.as_str())
        .env(CASE, case);
    idem_testkit::crash::run_until_crash(child, point);
    // The child's lease ran on the system clock from a moment after this
    // clock started; well past it, the key may be taken over.
    h.clock
        .advance(Settings::default().lease + Duration::from_secs(120));
    let retried = match case {
        "atomic" => apply_atomic(&h.store, &effects).await,
        _ => apply_leased(&h.store, &effects).await,
    }
    .expect("the retry is answered");
    Some((retried, counter(&h.store, &effects, "crash").await))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_crash_after_claim_applies_once_on_retry() {
    let Some((retried, count)) = crash_and_retry("atomic", crash::AFTER_CLAIM).await else {
        return;
    };
    assert!(matches!(retried, Applied::Fresh(_)), "{retried:?}");
    assert_eq!(count, AMOUNT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_crash_inside_effect_commits_nothing_and_applies_once_on_retry() {
    let Some((retried, count)) = crash_and_retry("atomic", crash::INSIDE_EFFECT).await else {
        return;
    };
    assert!(matches!(retried, Applied::Fresh(_)), "{retried:?}");
    assert_eq!(count, AMOUNT, "the child's writes were never sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_crash_after_commit_replays_on_retry() {
    let Some((retried, count)) = crash_and_retry("atomic", crash::AFTER_COMMIT).await else {
        return;
    };
    assert_eq!(retried, Applied::Replayed(Outcome::success("debited")));
    assert_eq!(count, AMOUNT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_crash_after_claim_runs_the_effect_once_on_retry() {
    let Some((retried, count)) = crash_and_retry("leased", crash::AFTER_CLAIM).await else {
        return;
    };
    assert!(matches!(retried, Applied::Fresh(_)), "{retried:?}");
    assert_eq!(count, AMOUNT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_crash_between_effect_and_record_repeats_the_effect() {
    let Some((retried, count)) = crash_and_retry("leased", crash::INSIDE_EFFECT).await else {
        return;
    };
    // Leased mode records after the effect: at least once, as documented.
    assert!(matches!(retried, Applied::Fresh(_)), "{retried:?}");
    assert_eq!(count, 2 * AMOUNT);
}
