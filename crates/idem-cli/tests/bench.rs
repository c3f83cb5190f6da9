//! `idem bench` run as a user runs it (feature `lab`): the HTTP and gRPC
//! benchmarks measure Idem and the bare service in one run and print the
//! ratios.

use std::process::Command;

fn idem() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    command
}

#[test]
fn bench_http_measures_direct_and_gateway_in_one_run() {
    let out = idem()
        .args(["bench", "http", "--requests", "60", "--concurrency", "4"])
        .output()
        .expect("run idem");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "direct",
        "gateway, unique keys",
        "gateway, replays",
        "gateway, no key",
        "upstream durable",
        "upstream echo",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
    assert!(stdout.contains("gateway ÷ direct"), "{stdout}");
}

#[test]
fn bench_grpc_measures_the_layer_and_the_gateway_against_the_bare_service() {
    let out = idem()
        .args(["bench", "grpc", "--calls", "60", "--concurrency", "4"])
        .output()
        .expect("run idem");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "direct",
        "layer, new keys",
        "layer, replays",
        "idem serve, new keys",
        "idem serve, replays",
        "idem serve, no key",
        "service durable",
        "service echo",
        "layer ÷ bare",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
}
