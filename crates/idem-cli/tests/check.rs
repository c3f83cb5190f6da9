//! `idem check`, run as a user would: its exit codes, its report and its JSON.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use idem::rusqlite;

use common::store::sqlite_url;

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .output()
        .expect("run idem")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Two operations on `order-1`: the original, and a retry answered with a replay.
const HISTORY: &str = r#"{"type":"invoke","op":1,"process":"c1","at_ms":1,"scope":"payments","key":"order-1","fingerprint":"f1"}
{"type":"unknown","op":1,"process":"c1","at_ms":2,"error":"timed out"}
{"type":"invoke","op":1,"process":"c1","at_ms":3,"scope":"payments","key":"order-1","fingerprint":"f1"}
{"type":"ok","op":1,"process":"c1","at_ms":4,"answer":{"status":201,"body_hash":"b1","replayed":true}}
{"type":"invoke","op":2,"process":"c2","at_ms":5,"scope":"payments","key":"order-2","fingerprint":"f2"}
{"type":"ok","op":2,"process":"c2","at_ms":6,"answer":{"status":201,"body_hash":"b2"}}
"#;

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.display().to_string()
}

fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains("panicked"));
}

#[test]
fn a_clean_history_exits_0_and_a_double_effect_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let history = write(dir.path(), "history.jsonl", HISTORY);
    let once = write(
        dir.path(),
        "once.jsonl",
        "{\"key\":\"order-1\",\"scope\":\"payments\"}\n{\"key\":\"order-2\"}\n",
    );
    let out = idem(&["check", &history, "--effects", &once]);
    assert_exit(&out, 0);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("2 operations on 2 keys: 2 ok"), "{stdout}");
    assert!(stdout.contains("1 retry"), "{stdout}");
    assert!(stdout.contains("no violations"), "{stdout}");

    let twice = write(
        dir.path(),
        "twice.jsonl",
        "{\"key\":\"order-1\"}\n{\"key\":\"order-1\"}\n{\"key\":\"order-2\"}\n",
    );
    let out = idem(&["check", &history, "--effects", &twice]);
    assert_exit(&out, 1);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("double effect"), "{stdout}");
    assert!(
        stdout.contains("\"order-1\" (scope \"payments\"): applied 2 times (ops 1)"),
        "{stdout}"
    );
    assert!(text(&out.stderr).contains("1 violation found"));
}

#[test]
fn json_names_the_kind_the_keys_and_the_ops() {
    let dir = tempfile::tempdir().unwrap();
    let history = write(dir.path(), "history.jsonl", HISTORY);
    let effects = write(dir.path(), "effects.jsonl", "{\"key\":\"order-1\"}\n");
    let out = idem(&["check", &history, "--effects", &effects, "--json"]);
    assert_exit(&out, 1);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["counts"]["operations"], 2);
    assert_eq!(report["counts"]["replays_seen"], 1);
    assert_eq!(report["counts"]["effects"], 1);
    let violations = report["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0]["kind"], "acked_not_applied");
    assert_eq!(violations[0]["scope"], "payments");
    assert_eq!(violations[0]["keys"], serde_json::json!(["order-2"]));
    assert_eq!(violations[0]["ops"], serde_json::json!([2]));
}

#[test]
fn the_effects_query_runs_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let history = write(dir.path(), "history.jsonl", HISTORY);
    let db = dir.path().join("app.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "CREATE TABLE ledger (id INTEGER PRIMARY KEY, order_key TEXT, account TEXT, version INTEGER);
         INSERT INTO ledger (order_key, account, version) VALUES
           ('order-1', 'acc-7', 2), ('order-2', 'acc-7', 1);",
    )
    .unwrap();
    let store = sqlite_url(&db);
    let keys_only = "SELECT order_key AS key FROM ledger ORDER BY id";
    let out = idem(&[
        "--store",
        &store,
        "check",
        &history,
        "--effects-query",
        keys_only,
    ]);
    assert_exit(&out, 0);

    // order-2 wrote version 1 of acc-7 after order-1 had written version 2.
    let fenced =
        "SELECT order_key AS key, account AS resource, version AS fence FROM ledger ORDER BY id";
    let out = idem(&[
        "--store",
        &store,
        "check",
        &history,
        "--effects-query",
        fenced,
    ]);
    assert_exit(&out, 1);
    assert!(
        text(&out.stdout).contains("stale write"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn the_history_can_come_from_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let effects = write(
        dir.path(),
        "effects.jsonl",
        "{\"key\":\"order-1\"}\n{\"key\":\"order-2\"}\n",
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["check", "-", "--effects", &effects])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(HISTORY.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 0);
}

#[test]
fn input_that_cannot_be_read_exits_2_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let history = write(dir.path(), "history.jsonl", HISTORY);
    let effects = write(dir.path(), "effects.jsonl", "{\"key\":\"order-1\"}\n");
    let broken = write(
        dir.path(),
        "broken.jsonl",
        &format!(
            "{}{{\"type\":\"maybe\"}}\n",
            HISTORY.lines().next().unwrap().to_owned() + "\n"
        ),
    );
    let missing = dir.path().join("missing.jsonl").display().to_string();
    let store = sqlite_url(&dir.path().join("absent.db"));
    let app = dir.path().join("app.db");
    rusqlite::Connection::open(&app)
        .unwrap()
        .execute_batch("CREATE TABLE t (id INTEGER);")
        .unwrap();
    let app = sqlite_url(&app);
    let cases: [(&[&str], &str); 7] = [
        (
            &["check", &broken, "--effects", &effects],
            "line 2 of the history",
        ),
        (
            &["check", &history, "--effects", &broken],
            "line 2 of the effect log",
        ),
        (
            &["check", &missing, "--effects", &effects],
            "cannot open the history",
        ),
        (
            &["check", &history, "--effects-query", "SELECT 1"],
            "needs --store",
        ),
        (
            &[
                "--store",
                &store,
                "check",
                &history,
                "--effects-query",
                "SELECT 1 AS key",
            ],
            "cannot reach the store",
        ),
        (
            &[
                "--store",
                &app,
                "check",
                &history,
                "--effects-query",
                "SELECT nope FROM t",
            ],
            "the effects query failed",
        ),
        (
            &[
                "--store",
                &app,
                "check",
                &history,
                "--effects-query",
                "SELECT id FROM t",
            ],
            "no column \"key\"",
        ),
    ];
    for (args, expected) in cases {
        let out = idem(args);
        assert_exit(&out, 2);
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
    }
    let unreachable = idem(&[
        "--store",
        "postgres://postgres@127.0.0.1:1/idem",
        "check",
        &history,
        "--effects-query",
        "SELECT key FROM effects",
    ]);
    assert_exit(&unreachable, 2);
    assert!(
        text(&unreachable.stderr)
            .contains("cannot reach the store at postgres://postgres@127.0.0.1:1/idem")
    );
}
