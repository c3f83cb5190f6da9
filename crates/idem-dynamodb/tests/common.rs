//! The DynamoDB store under test: on moto's server (127.0.0.1:5000, or the
//! endpoint in `IDEM_DYNAMODB_URL`), each test on a table of its own with a
//! manual clock. When moto does not answer, a test is skipped, or fails when
//! `IDEM_REQUIRE_SERVICES` is set.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{ManualClock, Settings};
use idem_dynamodb::DynamoStore;
use idem_testkit::LeasedHarness;

/// The variable naming another DynamoDB endpoint than moto's on loopback:
/// a URL without the table (`dynamodb+http://KEY:SECRET@HOST:PORT`).
pub(crate) const ENDPOINT_VAR: &str = "IDEM_DYNAMODB_URL";

/// The endpoint the tests use, without a table.
pub(crate) fn endpoint() -> String {
    std::env::var(ENDPOINT_VAR)
        .unwrap_or_else(|_| "dynamodb+http://test:test@127.0.0.1:5000".to_owned())
}

/// The URL of table `table` at the tests' endpoint.
pub(crate) fn url_of(table: &str) -> String {
    format!("{}/{table}", endpoint().trim_end_matches('/'))
}

/// A table name no other test uses.
pub(crate) fn unique_table(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "idem-{name}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether the endpoint accepts connections; reports it missing (skip, or
/// fail under `IDEM_REQUIRE_SERVICES`) when not.
pub(crate) fn moto_answers() -> bool {
    let url = url::Url::parse(&endpoint()).expect("the endpoint is a URL");
    let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = url.port().unwrap_or(443);
    let reached = format!("{host}:{port}")
        .parse::<SocketAddr>()
        .map_err(|e| e.to_string())
        .and_then(|addr| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())
        });
    match reached {
        Ok(_) => true,
        Err(why) => {
            idem_testkit::services::missing_service(
                "DynamoDB (moto's server)",
                &format!(
                    "{host}:{port}: {why}; scripts/services.sh starts it, or set {ENDPOINT_VAR}"
                ),
            );
            false
        }
    }
}

/// A store on a new table, with a manual clock.
pub(crate) struct Dynamo {
    pub(crate) store: DynamoStore,
    pub(crate) clock: ManualClock,
    pub(crate) table: Arc<String>,
}

impl Dynamo {
    /// A store on a new table named after `name`, or `None` when moto does
    /// not answer (and services are not required).
    pub(crate) async fn new(name: &str, settings: Settings) -> Option<Dynamo> {
        if !moto_answers() {
            return None;
        }
        let table = unique_table(name);
        Some(Dynamo::on(&table, settings).await)
    }

    /// A store on `table`, created if missing.
    pub(crate) async fn on(table: &str, settings: Settings) -> Dynamo {
        let clock = ManualClock::starting_now();
        let store = DynamoStore::builder(url_of(table))
            .clock(Arc::new(clock.clone()))
            .settings(settings)
            .open()
            .await
            .expect("open the DynamoDB store on moto");
        Dynamo {
            store,
            clock,
            table: Arc::new(table.to_owned()),
        }
    }
}

impl LeasedHarness for Dynamo {
    type Store = DynamoStore;

    async fn fresh() -> Option<Self> {
        Dynamo::new("conformance", Settings::default()).await
    }

    async fn reopen(&self) -> Self {
        Dynamo {
            store: self.store.clone(),
            clock: self.clock.clone(),
            table: Arc::clone(&self.table),
        }
    }

    fn store(&self) -> &DynamoStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}
