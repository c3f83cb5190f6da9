//! The gRPC service `idem bench grpc` calls: `bench.v1.Orders/Place`, whose
//! every call either commits a row to its own SQLite file (a durable effect)
//! or only counts (the layer's own cost). It counts what it applied, so the
//! run can check that replays added nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{AnyStore, SqliteStore};
use idem_grpc::GrpcIdempotencyLayer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use crate::args::UpstreamWork;

// Generated code: its items are `pub` by construction.
#[allow(unreachable_pub, missing_docs)]
pub(crate) mod proto {
    tonic::include_proto!("bench.v1");
}

use proto::orders_server::{Orders, OrdersServer};
use proto::{PlaceReply, PlaceRequest};

/// The method the benchmark calls.
pub(crate) const PLACE: &str = "/bench.v1.Orders/Place";

#[derive(Clone)]
struct Ledger {
    count: Arc<AtomicUsize>,
    store: Option<SqliteStore>,
}

#[tonic::async_trait]
impl Orders for Ledger {
    async fn place(&self, request: Request<PlaceRequest>) -> Result<Response<PlaceReply>, Status> {
        let id = match &self.store {
            None => self.count.fetch_add(1, Ordering::Relaxed) as i64 + 1,
            Some(store) => {
                let note = request.into_inner().note;
                let id = store
                    .with_connection(move |c| {
                        c.execute("INSERT INTO orders (body) VALUES (?1)", [note])?;
                        Ok::<_, idem::sqlite::rusqlite::Error>(c.last_insert_rowid())
                    })
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?
                    .map_err(|e| Status::internal(e.to_string()))?;
                self.count.fetch_add(1, Ordering::Relaxed);
                id
            }
        };
        Ok(Response::new(PlaceReply { id }))
    }
}

/// A running service and what it applied.
pub(crate) struct Service {
    pub(crate) addr: SocketAddr,
    effects: Arc<AtomicUsize>,
    stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

impl Service {
    /// Starts the service on a free loopback port, behind `layer` if given.
    pub(crate) async fn start(
        work: UpstreamWork,
        layer: Option<GrpcIdempotencyLayer<AnyStore>>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("idem-bench-grpc-")
            .tempdir()?;
        let store = match work {
            UpstreamWork::Durable => Some(crate::stores::orders_ledger(dir.path()).await?),
            _ => None,
        };
        let effects = Arc::new(AtomicUsize::new(0));
        let ledger = Ledger {
            count: Arc::clone(&effects),
            store,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let incoming = TcpListenerStream::new(listener).map(|accepted| {
            accepted.inspect(|stream| {
                stream.set_nodelay(true).ok();
            })
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async {
            stopped.await.ok();
        };
        let mut server = tonic::transport::Server::builder();
        let service = OrdersServer::new(ledger);
        match layer {
            Some(layer) => {
                let router = server.layer(layer).add_service(service);
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown));
            }
            None => {
                let router = server.add_service(service);
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, shutdown));
            }
        }
        Ok(Self {
            addr,
            effects,
            stop,
            _dir: dir,
        })
    }

    /// Effects applied so far.
    pub(crate) fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    /// Stops serving.
    pub(crate) fn stop(self) {
        self.stop.send(()).ok();
    }
}
