//! The upstream `idem bench http` calls, directly and through the gateway:
//! an axum service in the same process whose POST /orders either commits a
//! row to its own SQLite file (a durable effect, what keys exist for) or
//! answers at once (to show the gateway's own cost). It counts what it
//! applied, so the run can check that replays added nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use idem::SqliteStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::args::UpstreamWork;

/// The in-process upstream and what it applied.
pub(super) struct Upstream {
    /// Where it listens.
    pub(super) addr: SocketAddr,
    effects: Arc<AtomicUsize>,
    store: Option<SqliteStore>,
    stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

#[derive(Clone)]
struct Effects {
    count: Arc<AtomicUsize>,
    store: Option<SqliteStore>,
}

async fn order(
    State(effects): State<Effects>,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let id = match &effects.store {
        None => effects.count.fetch_add(1, Ordering::Relaxed) as i64 + 1,
        Some(store) => {
            let stored = store
                .with_connection(move |c| {
                    c.execute("INSERT INTO orders (body) VALUES (?1)", [body.as_ref()])?;
                    Ok::<_, idem::sqlite::rusqlite::Error>(c.last_insert_rowid())
                })
                .await;
            match stored {
                Ok(Ok(id)) => {
                    effects.count.fetch_add(1, Ordering::Relaxed);
                    id
                }
                _ => {
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        [("content-type", "text/plain")],
                        "not stored".into(),
                    );
                }
            }
        }
    };
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!("{{\"order\":{id}}}"),
    )
}

impl Upstream {
    /// Starts the upstream on a free loopback port.
    pub(super) async fn start(work: UpstreamWork) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("idem-bench-upstream-")
            .tempdir()?;
        let store = match work {
            UpstreamWork::Durable => Some(crate::stores::orders_ledger(dir.path()).await?),
            _ => None,
        };
        let effects = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/orders", post(order))
            .with_state(Effects {
                count: Arc::clone(&effects),
                store: store.clone(),
            });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            tcp.set_nodelay(true).ok();
        });
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    stopped.await.ok();
                })
                .await
        });
        Ok(Self {
            addr,
            effects,
            store,
            stop,
            _dir: dir,
        })
    }

    /// Effects applied so far (rows committed, for the durable upstream).
    pub(super) async fn effects(&self) -> anyhow::Result<usize> {
        match &self.store {
            None => Ok(self.effects.load(Ordering::SeqCst)),
            Some(store) => {
                let rows: i64 = store
                    .with_connection(|c| {
                        c.query_row("SELECT count(*) FROM orders", [], |r| r.get(0))
                    })
                    .await??;
                Ok(rows as usize)
            }
        }
    }

    /// Stops serving.
    pub(super) fn stop(self) {
        self.stop.send(()).ok();
    }
}
