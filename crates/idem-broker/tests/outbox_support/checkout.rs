//! The first two hops of the end-to-end outbox tests, the same whatever
//! broker follows: an order service whose handler writes the order and
//! enqueues its event in one transaction, keyed from the request's key, and
//! a client that sends the request three times; then a relay that dies after
//! the broker confirmed the event, before marking its row sent, and the next
//! relay, which sends it again.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::{AnyStore, ManualClock, SqliteStore};
use idem_broker::outbox::{Outbox, derive_key};
use idem_broker::publish::{Destination, Message};
use idem_broker::relay::{FailPoint, Relay, RelayConfig};
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};

use super::sqlite;

/// The key the client sends with its request (RFC 8941 string).
pub(crate) const REQUEST_KEY: &str = "checkout-1";

/// The key the order's event carries on every hop: derived from the
/// request's.
pub(crate) const EVENT_KEY: &str = "checkout-1/order-created";

/// The order service's store (SQLite, in a temporary directory) and the
/// clock it reads.
pub(crate) struct Checkout {
    pub clock: ManualClock,
    pub store: SqliteStore,
    _dir: tempfile::TempDir,
}

impl Checkout {
    /// Hop 1: the order service, serving on a local port, and a client that
    /// posts `body` to it three times under one key. Two of the answers are
    /// replays, and the store holds one order and one outbox row for `to`.
    pub(crate) async fn ordered(to: Destination, body: &'static [u8]) -> Checkout {
        let clock = ManualClock::starting_now();
        let (dir, store) = sqlite(&clock).await;
        let outbox = Outbox::of(&store);
        let route = atomic::route(
            store.clone(),
            IdempotencyConfig::default().require_key(KeyRequirement::Always),
            move |request: AtomicRequest| {
                let to = to.clone();
                async move |tx| -> HandlerResult {
                    tx.execute_batch("CREATE TABLE IF NOT EXISTS orders (body BLOB)")?;
                    tx.execute("INSERT INTO orders VALUES (?1)", [request.body().as_ref()])?;
                    let key = derive_key(request.key().expect("required"), "order-created")?;
                    outbox
                        .enqueue(tx, &to, &Message::new(key, request.body().to_vec()))
                        .await?;
                    Ok(StoredResponse::text(StatusCode::CREATED, "ordered"))
                }
            },
        );
        let app = axum::Router::new().route("/checkout", axum::routing::post_service(route));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut replays = 0;
        for _client_retry in 0..3 {
            let request = Request::post(format!("http://{addr}/checkout"))
                .header("idempotency-key", format!("\"{REQUEST_KEY}\""))
                .body(Full::new(Bytes::from_static(body)))
                .unwrap();
            let response = client.request(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::CREATED);
            replays += usize::from(response.headers().contains_key("idempotent-replayed"));
            response.into_body().collect().await.unwrap();
        }
        assert_eq!(replays, 2);
        assert_eq!(count(&store, "SELECT count(*) FROM orders").await, 1);
        assert_eq!(count(&store, "SELECT count(*) FROM idem_outbox").await, 1);
        Checkout {
            clock,
            store,
            _dir: dir,
        }
    }

    /// Hop 2: a relay dies after the broker confirmed the event, before
    /// marking its row sent; once its lease ran out, the next relay sends the
    /// event again. The broker has it twice.
    pub(crate) async fn relay_dying_after_publish(&self) {
        let any = AnyStore::Sqlite(self.store.clone());
        let crashing = Relay::new(any.clone(), RelayConfig::default())
            .with_fail_point(FailPoint::AfterPublish);
        assert!(crashing.run_once().await.is_err());
        self.clock
            .advance(RelayConfig::default().lease + Duration::from_millis(1));
        let relay = Relay::new(any, RelayConfig::default());
        assert_eq!(relay.run_once().await.unwrap().sent, 1);
    }
}

/// The one number `sql` selects from `store`.
pub(crate) async fn count(store: &SqliteStore, sql: &'static str) -> i64 {
    store
        .with_connection(move |c| c.query_row(sql, [], |r| r.get(0)))
        .await
        .unwrap()
        .unwrap()
}
