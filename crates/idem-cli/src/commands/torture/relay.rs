//! The relay scenario's stack: an application that answers each request by
//! enqueueing a message in the same transaction as its idempotency record;
//! `idem relay` as a child process publishing the outbox to a webhook; and a
//! downstream service that applies each message once per key, in the same
//! transaction as its own record. Killing the relay between a publish and
//! marking the row sent makes it publish the row again; the downstream must
//! apply it once.

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post_service;
use idem::{AtomicStore, SqliteStore};
use idem_broker::outbox::{Outbox, OutboxStore, Route};
use idem_broker::publish::Message;
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use super::gateway::Exit;

/// The downstream's effect log.
pub const EFFECTS_QUERY: &str = "SELECT key FROM effects ORDER BY seq";

/// A service on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct Service {
    pub addr: SocketAddr,
    server: JoinHandle<()>,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(app: Router) -> anyhow::Result<Service> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Service { addr, server })
}

fn required_key() -> IdempotencyConfig {
    IdempotencyConfig::default().require_key(KeyRequirement::Always)
}

/// The application: `POST /pay` enqueues a message keyed by the request's
/// key for the relay's default destination.
pub async fn application(store: &SqliteStore) -> anyhow::Result<Service> {
    idem_broker::outbox::migrate(store).await?;
    let outbox = Outbox::of(store);
    let route = atomic::route(
        store.clone(),
        required_key(),
        move |request: AtomicRequest| {
            async move |tx| -> HandlerResult {
                // The route requires a key: a request without one never gets here.
                let Some(key) = request.key().cloned() else {
                    return Ok(StoredResponse::text(StatusCode::BAD_REQUEST, "no key"));
                };
                let message = Message::new(key.clone(), request.body().to_vec());
                outbox.enqueue(tx, Route::Default, &message).await?;
                Ok(StoredResponse::text(
                    StatusCode::CREATED,
                    format!("queued {}", key.as_str()),
                ))
            }
        },
    );
    serve(Router::new().route("/pay", post_service(route))).await
}

/// The downstream: `POST /deliver` writes one row of `effects` per key, in
/// the transaction of its idempotency record; `deliveries` counts every
/// request it received.
pub async fn downstream(
    store: &SqliteStore,
    deliveries: Arc<AtomicUsize>,
) -> anyhow::Result<Service> {
    store
        .transaction(async |tx| -> idem::rusqlite::Result<()> {
            tx.execute_batch("CREATE TABLE effects (seq INTEGER PRIMARY KEY, key TEXT NOT NULL)")
        })
        .await?;
    let route = atomic::route(
        store.clone(),
        required_key(),
        move |request: AtomicRequest| {
            deliveries.fetch_add(1, Ordering::SeqCst);
            async move |tx| -> HandlerResult {
                // The route requires a key: a request without one never gets here.
                let Some(key) = request.key().cloned() else {
                    return Ok(StoredResponse::text(StatusCode::BAD_REQUEST, "no key"));
                };
                tx.execute("INSERT INTO effects (key) VALUES (?1)", [key.as_str()])?;
                Ok(StoredResponse::text(StatusCode::OK, "applied"))
            }
        },
    );
    serve(Router::new().route("/deliver", post_service(route))).await
}

/// `idem relay` on the application's store, publishing to `to`.
#[derive(Debug)]
pub struct Relay {
    store: PathBuf,
    to: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Relay {
    pub fn new(store: &Path, to: String, log: &Path) -> Self {
        Self {
            store: store.to_owned(),
            to,
            log: log.to_owned(),
            child: None,
        }
    }

    /// Starts a relay process, arming `IDEM_CRASH=crash` when given.
    pub fn start(&mut self, crash: Option<&str>) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("cannot find the idem binary")?;
        let log = File::options().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(exe);
        for (name, _) in std::env::vars() {
            if name.starts_with("IDEM_") {
                command.env_remove(name);
            }
        }
        if let Some(crash) = crash {
            command.env(idem::crash::ENV, crash);
        }
        let store = format!("sqlite://{}", self.store.display());
        command
            .args(["--store", &store, "relay", "--to", &self.to])
            .args(["--poll", "100ms", "--lease", "2s", "--max-attempts", "20"])
            .args(["--sweep-every", "off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        self.child = Some(command.spawn().context("cannot start idem relay")?);
        Ok(())
    }

    /// SIGKILL, then waits for the process to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether the process has ended, and how.
    pub fn exited(&mut self) -> Option<Exit> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(if status.signal() == Some(6) {
            Exit::Crashed
        } else {
            Exit::Other
        })
    }
}

/// `idem forward` from a RabbitMQ queue to the downstream, for the whole
/// trial; killed when dropped.
pub fn forward(from: &str, to: &str, store: &Path, log: &Path) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("cannot find the idem binary")?;
    let log = File::options().create(true).append(true).open(log)?;
    let mut command = Command::new(exe);
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    let store = format!("sqlite://{}", store.display());
    command
        .args(["--store", &store, "forward", "--from", from, "--to", to])
        .args(["--key", "message-id", "--sweep-every", "off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true);
    command.spawn().context("cannot start idem forward")
}

/// A RabbitMQ queue of the trial's own, deleted by [`Queue::delete`].
pub struct Queue {
    channel: lapin::Channel,
    connection: lapin::Connection,
    pub name: String,
}

impl Queue {
    /// Declares `name` on the broker at `url` (`amqp://USER:PASS@HOST:PORT/%2f`).
    pub async fn declare(url: &str, name: String) -> anyhow::Result<Self> {
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .with_context(|| format!("cannot reach RabbitMQ at {}", idem::redact_url(url)))?;
        let channel = connection.create_channel().await?;
        channel
            .queue_declare(
                name.as_str().into(),
                lapin::options::QueueDeclareOptions::default(),
                lapin::types::FieldTable::default(),
            )
            .await?;
        Ok(Self {
            channel,
            connection,
            name,
        })
    }

    /// Deletes the queue and closes the connection.
    pub async fn delete(self) {
        let options = lapin::options::QueueDeleteOptions::default();
        let _ = self
            .channel
            .queue_delete(self.name.as_str().into(), options)
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// Rows not yet published.
pub async fn pending(store: &SqliteStore) -> anyhow::Result<u64> {
    Ok(store.outbox_stats().await?.pending)
}
