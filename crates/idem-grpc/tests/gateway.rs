//! `idem serve`'s gateway in front of a gRPC service: tonic and Python
//! clients speak HTTP/2 to the gateway, which forwards over h2c to a tonic
//! upstream that counts its effects in a SQLite ledger. The upstream has no
//! idempotency of its own: every duplicate it does not see is the gateway's
//! doing.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::payments::ListChargesRequest;
use common::{
    CHARGE, LIST_CHARGES, LOOKUP, Ledger, Running, Script, charge, client, config, is_replay, serve,
};
use idem::SqliteStore;
use idem_gateway::{self as gateway, Gateway, GatewayConfig};
use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer, GrpcProbe};
use idem_http::{IdempotencyConfig, IdempotencyLayer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tonic::Code;

/// A gateway on a loopback port, stopped when dropped.
struct Front {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

/// Starts a gateway to `upstream` (an `h2c://` URL) whose gRPC guard
/// protects the payments service's `Charge`.
async fn front(dir: &tempfile::TempDir, upstream: &str, timeout: Duration) -> Front {
    front_with(dir, upstream, timeout, None).await
}

/// [`front`], asking the upstream's `probe` before a takeover when given.
async fn front_with(
    dir: &tempfile::TempDir,
    upstream: &str,
    timeout: Duration,
    probe: Option<GrpcProbe>,
) -> Front {
    let store = SqliteStore::open(dir.path().join("gateway.db"))
        .await
        .expect("store");
    let layer = IdempotencyLayer::new(store.clone(), IdempotencyConfig::default());
    let grpc = GrpcIdempotencyLayer::new(store, config());
    let config = GatewayConfig::new(upstream.parse().expect("upstream")).upstream_timeout(timeout);
    let gateway = Gateway::new(layer, config);
    let gateway = match probe {
        Some(probe) => gateway.with_grpc_probing(grpc, probe, timeout),
        None => gateway.with_grpc(grpc),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(gateway::run(listener, gateway, async {
        stopped.await.ok();
    }));
    Front { addr, _stop: stop }
}

/// The payments service with no idempotency of its own (no method
/// protected), on a fresh ledger.
async fn bare_upstream(dir: &tempfile::TempDir, script: Script) -> Running {
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    let unused = SqliteStore::open(dir.path().join("upstream.db"))
        .await
        .expect("store");
    serve(unused, GrpcIdempotencyConfig::default(), ledger, script).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_through_the_gateway_are_replayed_with_their_trailers() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = bare_upstream(&dir, Script::default()).await;
    let front = front(
        &dir,
        &format!("h2c://{}", upstream.addr),
        Duration::from_secs(10),
    )
    .await;
    let mut client = client(front.addr).await;

    let first = client.charge(charge("g-1", "alice", 1250)).await.unwrap();
    assert!(!is_replay(&first));
    assert_eq!(first.metadata().get("x-receipt").unwrap(), "r-1");
    for _ in 0..3 {
        let again = client.charge(charge("g-1", "alice", 1250)).await.unwrap();
        assert!(is_replay(&again));
        assert_eq!(again.metadata().get("x-ledger").unwrap(), "sqlite");
        assert_eq!(again.metadata().get("x-receipt").unwrap(), "r-1");
        assert_eq!(again.get_ref(), first.get_ref());
    }
    assert_eq!(upstream.ledger.charges("alice"), 1);
    assert_eq!(upstream.ledger.calls(CHARGE), 1);

    // A stored failure is replayed with its status and metadata.
    let refused = client
        .charge(charge("g-neg", "alice", -1))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let replayed = client
        .charge(charge("g-neg", "alice", -1))
        .await
        .unwrap_err();
    assert_eq!(replayed.code(), Code::InvalidArgument);
    assert_eq!(replayed.metadata().get("x-field").unwrap(), "amount_cents");
    assert_eq!(
        replayed.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(upstream.ledger.calls(CHARGE), 2);

    // Keyless calls and streaming calls pass through, each time.
    let mut keyless = tonic::Request::new(common::payments::ChargeRequest {
        account: "alice".into(),
        amount_cents: 5,
    });
    keyless
        .metadata_mut()
        .insert("x-note", "no key".parse().unwrap());
    client.charge(keyless).await.unwrap();
    assert_eq!(upstream.ledger.charges("alice"), 2);
    for _ in 0..2 {
        let mut stream = client
            .list_charges(ListChargesRequest {
                account: "alice".into(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut listed = 0;
        while stream.message().await.unwrap().is_some() {
            listed += 1;
        }
        assert_eq!(listed, 2);
    }
    assert_eq!(upstream.ledger.calls(LIST_CHARGES), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_applied_then_failed_upstream_is_reconciled_through_the_lookup_method() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = bare_upstream(&dir, Script::default()).await;
    let front = front_with(
        &dir,
        &format!("h2c://{}", upstream.addr),
        Duration::from_secs(10),
        Some(GrpcProbe::every(LOOKUP)),
    )
    .await;
    let mut client = client(front.addr).await;

    for (key, status) in [
        ("g-int", tonic::Status::internal("crashed after the commit")),
        (
            "g-dl",
            tonic::Status::deadline_exceeded("gave up after the commit"),
        ),
    ] {
        let code = status.code();
        upstream
            .script
            .after_effect
            .lock()
            .unwrap()
            .push_back(status);
        let failed = client.charge(charge(key, key, 90)).await.unwrap_err();
        assert_eq!(failed.code(), code);
        for _ in 0..2 {
            let retry = client.charge(charge(key, key, 90)).await.unwrap();
            assert!(is_replay(&retry), "{code:?}: {retry:?}");
            assert_eq!(
                retry.metadata().get("idempotency-reconciled").unwrap(),
                "true"
            );
            assert_eq!(retry.get_ref().account, key);
        }
        assert_eq!(upstream.ledger.charges(key), 1, "{code:?}");
    }
    assert_eq!(upstream.ledger.calls(CHARGE), 2);
    assert_eq!(upstream.ledger.calls(LOOKUP), 2);

    // A charge that was not made is run by the retry once the lookup says so.
    upstream
        .script
        .failures
        .lock()
        .unwrap()
        .push_back(tonic::Status::unknown("failed before the charge"));
    let failed = client.charge(charge("g-un", "g-un", 5)).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unknown);
    let ran = client.charge(charge("g-un", "g-un", 5)).await.unwrap();
    assert!(!is_replay(&ran));
    assert_eq!(upstream.ledger.charges("g-un"), 1);
    assert_eq!(upstream.ledger.calls(LOOKUP), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_are_aborted_and_reused_keys_fail_their_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let script = Script {
        gate: Some(Arc::clone(&gate)),
        ..Script::default()
    };
    let upstream = bare_upstream(&dir, script).await;
    let front = front(
        &dir,
        &format!("h2c://{}", upstream.addr),
        Duration::from_secs(10),
    )
    .await;
    let client = client(front.addr).await;

    let mut first_client = client.clone();
    let first = tokio::spawn(async move { first_client.charge(charge("g-c", "carol", 7)).await });
    while upstream.ledger.calls(CHARGE) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = client
        .clone()
        .charge(charge("g-c", "carol", 7))
        .await
        .unwrap_err();
    assert_eq!(duplicate.code(), Code::Aborted);
    assert!(
        duplicate
            .metadata()
            .get(idem_grpc::RETRY_PUSHBACK)
            .is_some()
    );
    gate.add_permits(1);
    assert!(!is_replay(&first.await.unwrap().unwrap()));

    let reused = client
        .clone()
        .charge(charge("g-c", "carol", 8))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(upstream.ledger.charges("carol"), 1);
    assert_eq!(upstream.ledger.calls(CHARGE), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_releases_the_key_and_one_that_times_out_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens here: nothing was sent, so the key is free again.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = closed.local_addr().unwrap();
    drop(closed);
    let down = front(&dir, &format!("h2c://{nowhere}"), Duration::from_secs(5)).await;
    let mut client_down = client(down.addr).await;
    for _ in 0..2 {
        let refused = client_down
            .charge(charge("g-d", "dan", 3))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    }

    // An upstream that never answers: the call was sent, so whether it took
    // effect is unknown and the key stays reserved until its lease ends.
    let hung_dir = tempfile::tempdir().unwrap();
    let hung = bare_upstream(
        &hung_dir,
        Script {
            hang: true,
            ..Script::default()
        },
    )
    .await;
    let slow = front(
        &hung_dir,
        &format!("h2c://{}", hung.addr),
        Duration::from_millis(300),
    )
    .await;
    let mut client_slow = client(slow.addr).await;
    let timed_out = client_slow
        .charge(charge("g-t", "erin", 3))
        .await
        .unwrap_err();
    assert_eq!(timed_out.code(), Code::DeadlineExceeded, "{timed_out:?}");
    let retry = client_slow
        .charge(charge("g-t", "erin", 3))
        .await
        .unwrap_err();
    assert_eq!(retry.code(), Code::Aborted, "{retry:?}");
    assert_eq!(hung.ledger.calls(CHARGE), 1);
}

/// Python's grpcio in the cache the test command installs it into.
fn grpcio_python() -> std::path::PathBuf {
    let cache = std::env::var_os("IDEM_CACHE").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/idem")
        },
        std::path::PathBuf::from,
    );
    let python = cache.join("grpcio/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash scripts/services.sh`, which installs grpcio from PyPI",
        python.display()
    );
    python
}

/// One unary call from Python's grpcio client, the request and the reply as
/// raw protobuf bytes: its reply, initial metadata and trailing metadata.
const PYTHON_CALL: &str = r#"
import json, sys, grpc
addr, method, key, request = sys.argv[1:5]
with grpc.insecure_channel(addr) as channel:
    call = channel.unary_unary(method)
    reply, outcome = call.with_call(bytes.fromhex(request), metadata=[("idempotency-key", key)], timeout=20)
    print(json.dumps({
        "reply": reply.hex(),
        "initial": dict(outcome.initial_metadata()),
        "trailing": dict(outcome.trailing_metadata()),
    }))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_grpcio_client_gets_one_effect_and_replays_through_the_gateway() {
    use prost::Message;

    let python = grpcio_python();
    let dir = tempfile::tempdir().unwrap();
    let upstream = bare_upstream(&dir, Script::default()).await;
    let front = front(
        &dir,
        &format!("h2c://{}", upstream.addr),
        Duration::from_secs(10),
    )
    .await;
    let request = common::payments::ChargeRequest {
        account: "py".into(),
        amount_cents: 990,
    }
    .encode_to_vec();
    let request: String = request.iter().map(|b| format!("{b:02x}")).collect();
    let call = |python: std::path::PathBuf, addr: String, request: String| async move {
        tokio::task::spawn_blocking(move || {
            let output = Command::new(python)
                .args(["-c", PYTHON_CALL, &addr, CHARGE, "py-1", &request])
                .output()
                .expect("run python");
            assert!(
                output.status.success(),
                "python failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("json")
        })
        .await
        .unwrap()
    };
    let addr = front.addr.to_string();
    let first = call(python.clone(), addr.clone(), request.clone()).await;
    let second = call(python, addr, request).await;
    assert_eq!(first["reply"], second["reply"]);
    assert!(first["initial"].get("idempotent-replayed").is_none());
    assert_eq!(second["initial"]["idempotent-replayed"], "true");
    assert_eq!(second["initial"]["x-ledger"], "sqlite");
    assert_eq!(second["trailing"]["x-receipt"], "r-1");
    let reply = hex_bytes(second["reply"].as_str().unwrap());
    let reply = common::payments::ChargeReply::decode(reply.as_slice()).unwrap();
    assert_eq!((reply.account.as_str(), reply.amount_cents), ("py", 990));
    assert_eq!(upstream.ledger.charges("py"), 1);
    assert_eq!(upstream.ledger.calls(CHARGE), 1);
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}
