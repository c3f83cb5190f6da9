//! `idem torture` run as a user runs it: a short campaign over the embedded
//! store, PostgreSQL, the relay and RabbitMQ, with faults injected and no violation found.

use std::net::{SocketAddr, TcpStream};
use std::process::Command;
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

#[test]
fn a_short_campaign_injects_faults_and_finds_no_violation() {
    let report = tempfile::tempdir().unwrap();
    let mut scenarios = vec!["gateway-sqlite-kill", "relay-kill"];
    if up("PostgreSQL", "127.0.0.1:5432") {
        scenarios.push("gateway-postgres-partition");
    }
    if up("RabbitMQ", "127.0.0.1:5672") {
        scenarios.push("relay-rabbitmq-kill");
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command.arg("torture");
    for scenario in &scenarios {
        command.args(["--scenario", scenario]);
    }
    let started = Instant::now();
    let output = command
        .args(["--trials", "2", "--ops", "30", "--json", "--report"])
        .arg(report.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "idem torture failed:\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "{:?}",
        started.elapsed()
    );

    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), scenarios.len());
    for (row, scenario) in rows.iter().zip(&scenarios) {
        assert_eq!(row["scenario"], *scenario);
        assert_eq!(row["trials"], 2);
        assert_eq!(row["violations"], 0, "{row}");
        assert_eq!(row["double_effects"], 0, "{row}");
        assert_eq!(row["lost_acked"], 0, "{row}");
        assert!(
            row["faults"].as_u64().unwrap() >= 2,
            "a fault per trial: {row}"
        );
        assert!(row["operations"].as_u64().unwrap() >= 60, "{row}");
        for trial in 1..=2 {
            let history = report
                .path()
                .join(scenario)
                .join(format!("trial-{trial}.jsonl"));
            assert!(history.exists(), "{}", history.display());
        }
    }
    let page = std::fs::read_to_string(report.path().join("index.html")).unwrap();
    assert!(page.contains("<svg"), "the report has its plots");
}
