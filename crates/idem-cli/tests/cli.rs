//! The `idem` binary, run as a user would.

mod common;

use std::process::{Command, Output};

use common::store::TestStore;

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

/// The two numbers of a table row, by its label.
fn row(stdout: &str, label: &str) -> (i64, i64) {
    let line = stdout
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{stdout}"));
    let cells: Vec<i64> = line
        .split('┆')
        .skip(1)
        .map(|c| c.trim_matches(|ch: char| ch == '│' || ch.is_whitespace()))
        .map(|c| c.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    (cells[0], cells[1])
}

#[test]
fn demo_shows_double_effects_for_the_naive_handler_and_none_with_idem() {
    let out = idem(&["demo", "--payments", "300", "--workers", "6"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let (naive, with_idem) = row(&stdout, "double effects");
    assert!(
        naive > 0,
        "duplicates must hurt the naive handler:\n{stdout}"
    );
    assert_eq!(with_idem, 0, "{stdout}");
    let (_, applied) = row(&stdout, "effects applied");
    assert_eq!(applied, 300);
    let (naive_suppressed, suppressed) = row(&stdout, "duplicates suppressed");
    assert_eq!(naive_suppressed, 0);
    assert_eq!(
        suppressed, naive,
        "every duplicate the naive handler applied, Idem suppressed"
    );
}

#[test]
fn keys_migrate_and_gc_work_on_a_store_left_by_the_demo() {
    let store = TestStore::sqlite();
    let out = idem(&["--store", &store.url, "migrate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("schema up to date"));

    let out = idem(&["--store", &store.url, "demo", "--payments", "20"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = idem(&[
        "--store",
        &store.url,
        "keys",
        "ls",
        "--json",
        "--state",
        "completed",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let records: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 20);
    let key = records[0]["key"].as_str().unwrap().to_owned();
    assert_eq!(records[0]["state"], "completed");

    let out = idem(&["--store", &store.url, "keys", "ls", "--limit", "5"]);
    let table = text(&out.stdout);
    assert!(
        table.contains("payments") && table.contains("--limit"),
        "{table}"
    );

    let out = idem(&["--store", &store.url, "keys", "show", "payments", &key]);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        shown.contains("completed") && shown.contains("balance"),
        "{shown}"
    );

    let out = idem(&[
        "--store",
        &store.url,
        "keys",
        "show",
        "payments",
        "no-such-key",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no record for key no-such-key"));

    let out = idem(&["--store", &store.url, "gc"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("deleted 0 expired records; 20 records remain"));
}

/// On a DynamoDB table (moto's, its own): `idem migrate` creates it, `idem
/// keys ls` lists what an application stored there, and `idem gc` deletes
/// the records past their window and keeps the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_keys_and_gc_on_dynamodb() {
    use std::sync::Arc;
    use std::time::Duration;

    use idem::{
        AnyStore, Clock, Fingerprint, IdempotencyKey, LeaseStore, ManualClock, Outcome, Scope,
    };

    let Some(store) = TestStore::dynamodb("cli") else {
        return;
    };
    let out = idem(&["--store", &store.url, "migrate"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("schema up to date at dynamodb+http://"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("test:test"),
        "the secret is never shown: {stdout}"
    );

    // Three records written eight days ago (past the 7-day window), two now.
    let scope = Scope::new("payments").unwrap();
    let clock = ManualClock::starting_now();
    clock.set(clock.now().minus(Duration::from_secs(8 * 24 * 3600)));
    let earlier = AnyStore::open_with(
        &store.location(),
        idem::Settings::default(),
        Arc::new(clock),
    )
    .await
    .unwrap();
    let now = store.open().await;
    for (opened, key) in [
        (&earlier, "old-1"),
        (&earlier, "old-2"),
        (&earlier, "old-3"),
        (&now, "new-1"),
        (&now, "new-2"),
    ] {
        let key = IdempotencyKey::new(key).unwrap();
        let applied = opened
            .apply_leased(&scope, &key, Fingerprint::of_bytes(b"10 EUR"), |_| async {
                Ok::<_, std::convert::Infallible>(Outcome::success("paid"))
            })
            .await
            .unwrap();
        assert!(!applied.is_replay());
    }

    let listed = |out: Output| -> Vec<String> {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let records: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut keys: Vec<String> = records
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect();
        keys.sort();
        keys
    };
    // Past its window a record is gone for every read, before gc too.
    assert_eq!(
        listed(idem(&["--store", &store.url, "keys", "ls", "--json"])),
        ["new-1", "new-2"]
    );
    let out = idem(&["--store", &store.url, "keys", "show", "payments", "new-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("completed"));

    let out = idem(&["--store", &store.url, "gc", "--batch", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("deleted 3 expired records; 2 records remain"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        listed(idem(&["--store", &store.url, "keys", "ls", "--json"])),
        ["new-1", "new-2"]
    );
}

fn fails_clearly(args: &[&str], expected: &str) {
    let out = idem(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_gets_a_clear_error_and_no_panic() {
    fails_clearly(
        &["--store", "mysql://root:secret@localhost/db", "keys", "ls"],
        "unknown store URL scheme \"mysql\"",
    );
    fails_clearly(
        &["--store", "idem.db", "keys", "ls"],
        "write sqlite://idem.db",
    );
    fails_clearly(
        &[
            "--store",
            "postgres://postgres@127.0.0.1:1/idem",
            "keys",
            "ls",
        ],
        "database unavailable",
    );
    let store = TestStore::sqlite();
    fails_clearly(
        &["--store", &store.url, "keys", "show", "payments", ""],
        "idempotency key is empty",
    );
    let long = "k".repeat(256);
    fails_clearly(
        &["--store", &store.url, "keys", "show", "payments", &long],
        "256 characters long",
    );
    fails_clearly(
        &["--store", &store.url, "keys", "show", "payments", "a\u{1}b"],
        "not visible ASCII",
    );
    fails_clearly(
        &[
            "--store",
            "sqlite:///nonexistent-dir/sub/idem.db",
            "keys",
            "ls",
        ],
        "check that the directory exists",
    );
}

/// The commands that need atomic mode refuse a Redis store or a DynamoDB
/// table before they connect to anything, saying why and what to use; an
/// unreachable Redis is said to be unreachable.
#[test]
fn commands_that_need_atomic_mode_refuse_redis_and_dynamodb_stores() {
    // Port 1: nothing listens, so a refusal here came before connecting.
    let redis = "redis://:hunter2@127.0.0.1:1/0";
    let mut commands = vec![&["demo"][..], &["relay"]];
    if cfg!(feature = "lab") {
        commands.push(&["bench", "apply"]);
    }
    for command in commands {
        let mut args = vec!["--store", redis];
        args.extend_from_slice(command);
        let out = idem(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {stderr}");
        assert!(
            stderr.contains("needs atomic mode"),
            "{command:?}: {stderr}"
        );
        assert!(
            stderr.contains("use a sqlite:// or postgres:// store"),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    fails_clearly(
        &["--store", "redis://127.0.0.1:1/0", "keys", "ls"],
        "Redis refused the connection",
    );
    fails_clearly(
        &[
            "--store",
            "dynamodb+http://key:secret@127.0.0.1:1/idem",
            "keys",
            "ls",
        ],
        "DynamoDB could not be reached",
    );
    // A DynamoDB table is refused the same way, saying what it keeps.
    let dynamodb = "dynamodb+http://key:hunter2@127.0.0.1:1/idem";
    for command in [&["demo"][..], &["relay"]] {
        let mut args = vec!["--store", dynamodb];
        args.extend_from_slice(command);
        let out = idem(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {stderr}");
        assert!(
            stderr.contains("needs atomic mode") && stderr.contains("is a DynamoDB table"),
            "{command:?}: {stderr}"
        );
        assert!(
            stderr.contains("use a sqlite:// or postgres:// store"),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    fails_clearly(
        &["--store", "rediss://127.0.0.1:1/0", "keys", "ls"],
        "asks for TLS to Redis",
    );
}

#[test]
fn help_does_not_print_the_passwords_in_the_environment() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["keys", "ls", "--help"],
        &["forward", "--help"],
        &["relay", "--help"],
        &["console", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .env("IDEM_STORE", "postgres://u:SECRETPW@h/db")
            .env("IDEM_UPSTREAM", "http://gateway:SECRETPW@10.0.0.1:9000")
            .env("IDEM_ADMIN_TOKEN_FILE", "/run/secrets/SECRETPW")
            .output()
            .expect("run idem");
        let help = text(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(help.contains("IDEM_STORE"), "{args:?}: {help}");
        assert!(!help.contains("SECRETPW"), "{args:?}: {help}");
    }
}
