//! The payments service behind the layer with its `Lookup` method asked
//! before a call whose outcome is unknown runs again, and the run of charges
//! answered with each unknown code: shared by the reconcile tests and the
//! test that counts their metrics in a process of its own.

use std::time::Duration;

use idem::{LeaseStore, Settings, SqliteStore};
use idem_grpc::{GrpcIdempotencyLayer, GrpcProbe, ProbeMethod};
use tokio::net::TcpListener;
use tonic::Status;
use tonic::transport::Channel;

use super::payments::payments_client::PaymentsClient;
use super::{CHARGE, LOOKUP, Ledger, Running, Script, charge, config, is_replay, serve_layer_on};

/// The codes a service may answer after its effect that leave the outcome
/// unknown (`INTERNAL` only because the layer has a lookup to ask).
fn unknown_after_effect() -> [Status; 3] {
    [
        Status::internal("crashed after the commit"),
        Status::deadline_exceeded("the deadline passed after the commit"),
        Status::unknown("the handler's error was not mapped"),
    ]
}

pub(crate) async fn sqlite(dir: &tempfile::TempDir, lease: Duration) -> SqliteStore {
    SqliteStore::builder(dir.path().join("idem.db"))
        .settings(Settings::default().with_lease(lease))
        .open()
        .await
        .expect("store")
}

/// The payments service behind the layer over `store`, asking its own
/// `Lookup` method (over a channel to itself) when `probed`.
pub(crate) async fn start<St: LeaseStore + 'static>(
    dir: &tempfile::TempDir,
    store: St,
    lease: Duration,
    probed: bool,
    script: Script,
) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let mut layer = GrpcIdempotencyLayer::new(store, config().lease(lease));
    if probed {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect_lazy();
        layer = layer.with_reconcile(ProbeMethod::new(GrpcProbe::every(LOOKUP), channel));
    }
    let ledger = Ledger::open(dir.path().join("ledger.db"));
    serve_layer_on(listener, layer, ledger, script).await
}

pub(crate) fn reconciled<T>(response: &tonic::Response<T>) -> bool {
    response
        .metadata()
        .get("idempotency-reconciled")
        .is_some_and(|v| v == "true")
}

/// For each unknown code: the charge is made, the client told the code; the
/// retry gets the charge's reply from the lookup, stored and replayed.
pub(crate) async fn applied_calls_are_reconciled(
    server: &Running,
    client: &mut PaymentsClient<Channel>,
) {
    for (n, status) in unknown_after_effect().into_iter().enumerate() {
        let (key, account) = (format!("k-{n}"), format!("acct-{n}"));
        let code = status.code();
        server.script.after_effect.lock().unwrap().push_back(status);
        let failed = client
            .charge(charge(&key, &account, 700))
            .await
            .unwrap_err();
        assert_eq!(failed.code(), code);
        assert_eq!(server.ledger.charges(&account), 1);

        let retry = client.charge(charge(&key, &account, 700)).await.unwrap();
        assert!(
            is_replay(&retry) && reconciled(&retry),
            "{code:?}: {retry:?}"
        );
        assert_eq!(retry.get_ref().account, account);
        assert_eq!(retry.get_ref().amount_cents, 700);
        assert_eq!(retry.metadata().get("x-ledger").unwrap(), "sqlite");
        // The lookup's answer is stored: later duplicates are replayed
        // without asking again.
        let again = client.charge(charge(&key, &account, 700)).await.unwrap();
        assert!(is_replay(&again) && reconciled(&again));
        assert_eq!(again.get_ref(), retry.get_ref());
        assert_eq!(server.ledger.charges(&account), 1, "{code:?}");
    }
    assert_eq!(server.ledger.calls(CHARGE), 3);
    assert_eq!(server.ledger.calls(LOOKUP), 3);
}
