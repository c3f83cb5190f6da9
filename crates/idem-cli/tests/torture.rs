//! `idem torture` run as a user runs it: short campaigns over the embedded
//! store, PostgreSQL, the relay, RabbitMQ and NATS, with faults injected and
//! no violation found — one that kills the processes under test, one that
//! cuts or restarts what they depend on, one whose upstream answers 5xx
//! after applying.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Whether a service the campaign uses is up; a test without it skips its
/// scenario, unless `IDEM_REQUIRE_SERVICES` is set.
fn up(service: &str, addr: &str) -> bool {
    let addr: SocketAddr = addr.parse().unwrap();
    let up = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok();
    if !up {
        assert!(
            std::env::var_os("IDEM_REQUIRE_SERVICES").is_none(),
            "{service} is required at {addr}"
        );
        eprintln!("{service} is not reachable at {addr}: its scenario is skipped");
    }
    up
}

/// Whether the PostgreSQL server programs are installed, for the scenario
/// that starts a server of its own.
fn postgres_installed() -> bool {
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|version| version.path().join("bin").join("initdb").is_file());
    if !installed {
        assert!(
            std::env::var_os("IDEM_REQUIRE_SERVICES").is_none(),
            "the postgresql package is required"
        );
        eprintln!(
            "the PostgreSQL server programs are not installed: the restart scenario is skipped"
        );
    }
    installed
}

/// Whether a `nats-server` binary is installed, for the scenario that
/// starts a three-node cluster of its own.
fn nats_server_installed() -> bool {
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("nats-server").is_file())
    });
    let installed = std::env::var_os("IDEM_NATS_SERVER").is_some()
        || on_path
        || Path::new("/usr/sbin/nats-server").is_file();
    if !installed {
        assert!(
            std::env::var_os("IDEM_REQUIRE_SERVICES").is_none(),
            "nats-server is required"
        );
        eprintln!("nats-server is not installed: the NATS cluster scenario is skipped");
    }
    installed
}

/// Whether `redis-server` and `redis-cli` are installed, for the scenario
/// that starts a Redis Cluster of its own.
fn redis_installed() -> bool {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
    };
    let installed = on_path("redis-server") && on_path("redis-cli");
    if !installed {
        assert!(
            std::env::var_os("IDEM_REQUIRE_SERVICES").is_none(),
            "redis-server and redis-cli are required"
        );
        eprintln!("redis-server is not installed: the Redis Cluster scenario is skipped");
    }
    installed
}

/// A campaign's report folder, removed after a passing test and kept (its
/// path printed) after a failing one, with the histories and logs that say
/// why.
struct Report(Option<tempfile::TempDir>);

impl Report {
    fn new() -> Self {
        Self(Some(
            tempfile::Builder::new()
                .prefix("idem-torture-")
                .tempdir()
                .unwrap(),
        ))
    }

    fn path(&self) -> &Path {
        self.0
            .as_ref()
            .expect("the folder is kept until drop")
            .path()
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("the campaign's report is kept in {}", dir.keep().display());
        }
    }
}

/// Runs `idem torture` on `scenarios`, `trials` each, 30 operations a
/// trial, with a report in `report`; asserts it ended well in `limit`.
fn campaign(scenarios: &[&str], trials: usize, report: &Path, limit: Duration) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command.arg("torture");
    for scenario in scenarios {
        command.args(["--scenario", scenario]);
    }
    let started = Instant::now();
    let output = command
        .args([
            "--trials",
            &trials.to_string(),
            "--ops",
            "30",
            "--json",
            "--report",
        ])
        .arg(report)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "idem torture failed:\n{stderr}");
    assert!(started.elapsed() < limit, "{:?}", started.elapsed());
    output
}

/// Each scenario's row: its trials, a fault per trial, no violation; and
/// each trial's history in the report.
fn rows_are_clean(
    output: &Output,
    scenarios: &[&str],
    trials: u64,
    report: &Path,
) -> serde_json::Value {
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    let list = rows.as_array().unwrap();
    assert_eq!(list.len(), scenarios.len());
    for (row, scenario) in list.iter().zip(scenarios) {
        assert_eq!(row["scenario"], *scenario);
        assert_eq!(row["trials"], trials);
        assert_eq!(row["violations"], 0, "{row}");
        assert_eq!(row["double_effects"], 0, "{row}");
        assert_eq!(row["lost_acked"], 0, "{row}");
        assert!(
            row["faults"].as_u64().unwrap() >= trials,
            "a fault per trial: {row}"
        );
        assert!(row["operations"].as_u64().unwrap() >= 30 * trials, "{row}");
        for trial in 1..=trials {
            let history = report.join(scenario).join(format!("trial-{trial}.jsonl"));
            assert!(history.exists(), "{}", history.display());
        }
        for plot in ["latency.svg", "throughput.svg"] {
            let svg = std::fs::read_to_string(report.join(scenario).join(plot)).unwrap();
            assert!(svg.starts_with("<svg"), "{scenario}/{plot}");
        }
    }
    rows
}

#[test]
fn a_short_campaign_kills_the_processes_and_finds_no_violation() {
    let report = Report::new();
    let mut scenarios = vec![
        "gateway-sqlite-kill",
        "gateway-dup-proxy-kill",
        "relay-kill",
    ];
    if up("PostgreSQL", "127.0.0.1:5432") {
        scenarios.push("gateway-postgres-partition");
    }
    if up("RabbitMQ", "127.0.0.1:5672") {
        scenarios.push("relay-rabbitmq-kill");
    }
    if up("NATS", "127.0.0.1:4222") {
        scenarios.push("relay-nats-kill");
    }
    let output = campaign(&scenarios, 2, report.path(), Duration::from_secs(150));
    let rows = rows_are_clean(&output, &scenarios, 2, report.path());
    let dup = &rows[1];
    assert!(
        dup["proxy_copies"].as_u64().unwrap() > 0,
        "idem dup-proxy sent copies to the gateway: {dup}"
    );
    let page = std::fs::read_to_string(report.path().join("index.html")).unwrap();
    assert!(page.contains("<svg"), "the report has its plots");
}

#[test]
fn a_short_campaign_with_a_probing_upstream_repeats_nothing_after_an_unknown_outcome() {
    let report = Report::new();
    let mut scenarios = vec!["gateway-sqlite-kill-probe"];
    if up("PostgreSQL", "127.0.0.1:5432") {
        scenarios.push("gateway-postgres-kill-probe");
    }
    let output = campaign(&scenarios, 2, report.path(), Duration::from_secs(120));
    let rows = rows_are_clean(&output, &scenarios, 2, report.path());
    for row in rows.as_array().unwrap() {
        assert_eq!(row["repeats_after_unknown"], 0, "{row}");
        assert_eq!(row["repeats_after_unstored_answer"], 0, "{row}");
    }
}

#[test]
fn a_short_campaign_with_an_upstream_answering_5xx_after_applying_repeats_nothing() {
    let report = Report::new();
    let scenarios = ["gateway-5xx-after-apply"];
    // Three trials: 504, 500 and 502, one each.
    let output = campaign(&scenarios, 3, report.path(), Duration::from_secs(120));
    let rows = rows_are_clean(&output, &scenarios, 3, report.path());
    let row = &rows[0];
    assert_eq!(row["repeats_after_unknown"], 0, "{row}");
    assert!(
        row["unknown_attempts"].as_u64().unwrap() > 0,
        "the clients saw the 5xx answers: {row}"
    );
    let kinds: Vec<&String> = row["fault_kinds"].as_object().unwrap().keys().collect();
    assert_eq!(
        kinds,
        ["500 after apply", "502 after apply", "504 after apply"],
        "{row}"
    );
}

#[test]
fn a_short_campaign_cuts_and_restarts_the_dependencies_and_finds_no_violation() {
    let report = Report::new();
    let mut scenarios = Vec::new();
    if postgres_installed() {
        scenarios.push("gateway-postgres-restart");
    }
    if up("RabbitMQ", "127.0.0.1:5672") {
        scenarios.push("relay-rabbitmq-partition");
    }
    if up("NATS", "127.0.0.1:4222") {
        scenarios.push("relay-nats-partition");
    }
    if nats_server_installed() {
        scenarios.push("relay-nats-cluster-node-kill");
    }
    if redis_installed() {
        scenarios.push("gateway-redis-cluster-failover");
    }
    if scenarios.is_empty() {
        return;
    }
    let output = campaign(&scenarios, 2, report.path(), Duration::from_secs(330));
    let rows = rows_are_clean(&output, &scenarios, 2, report.path());
    // Two trials of the cluster: a follower killed, then the stream's leader.
    if let Some(row) = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["scenario"] == "relay-nats-cluster-node-kill")
    {
        let kinds: Vec<&String> = row["fault_kinds"].as_object().unwrap().keys().collect();
        assert_eq!(
            kinds,
            ["sigkill a follower", "sigkill the stream's leader"],
            "{row}"
        );
    }
    // A primary failed over in each trial, its replica promoted.
    if let Some(row) = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["scenario"] == "gateway-redis-cluster-failover")
    {
        assert_eq!(row["faults"], 2, "{row}");
        let kinds = row["fault_kinds"].as_object().unwrap();
        assert!(
            kinds
                .keys()
                .all(|kind| kind.starts_with("sigkill a primary")),
            "{row}"
        );
    }
    // Two trials: both restart modes, both kinds of cut.
    let page = std::fs::read_to_string(report.path().join("index.html")).unwrap();
    for scenario in &scenarios {
        assert!(page.contains(&format!("<h2>{scenario}</h2>")));
    }
    if scenarios.contains(&"gateway-postgres-restart") {
        assert!(page.contains("restart -m fast") && page.contains("restart -m immediate"));
    }
}

#[test]
fn a_short_campaign_over_the_whole_chain_on_postgres_finds_no_violation() {
    if !up("PostgreSQL", "127.0.0.1:5432") || !up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let report = Report::new();
    let scenarios = ["chain-postgres"];
    let output = campaign(&scenarios, 2, report.path(), Duration::from_secs(240));
    let rows = rows_are_clean(&output, &scenarios, 2, report.path());
    let row = &rows[0];
    // A fault at each of the five hops, in each trial.
    assert!(row["faults"].as_u64().unwrap() >= 10, "{row}");
    assert!(
        row["proxy_copies"].as_u64().unwrap() > 0,
        "idem dup-proxy sent copies: {row}"
    );
    let kinds: Vec<&String> = row["fault_kinds"].as_object().unwrap().keys().collect();
    for hop in ["gateway ", "database ", "relay ", "broker ", "forward "] {
        assert!(
            kinds.iter().any(|kind| kind.starts_with(hop)),
            "a fault at the {hop}hop: {kinds:?}"
        );
    }
}
