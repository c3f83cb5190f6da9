//! The service behind the gateway: every request it receives applies its
//! effect — a row of `effects`, committed in its own transaction — and is
//! answered 201. It never dedupes, so every effect beyond the first for a key
//! is one the gateway let through.
//!
//! It also answers the gateway's probe, `GET /pay/by-key/{key}`, from the same
//! table: 200 with the answer `POST /pay` gave (and
//! `Idempotency-Original-Status: 201`) when the key has an effect, else 404.
//!
//! Told to ([`Upstream::fail_after_apply`]), it answers the request that
//! applies a key's first effect with a 5xx instead of its 201, after the
//! commit: the answer of an application that crashed after its commit, or
//! of a load balancer that gave up on it. The effect is there; the answer
//! says nothing about it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::extract::Path as UrlPath;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem::rusqlite::{self, Connection};
use tokio::task::JoinHandle;

/// The effect log's query: one row per effect, in commit order.
pub(super) const EFFECTS_QUERY: &str = "SELECT key FROM effects ORDER BY seq";

/// The probe the gateway is given in the probing scenarios.
pub(super) const PROBE: &str = "GET /pay/by-key/{key}";

/// A running upstream; stops when dropped.
#[derive(Debug)]
pub(super) struct Upstream {
    addr: SocketAddr,
    path: PathBuf,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

/// What the handlers share.
#[derive(Debug)]
struct Shared {
    db: Mutex<Connection>,
    /// The status a key's first effect is answered with; 0 for its 201.
    fail_with: AtomicU16,
    /// First effects answered with a 5xx so far.
    failed: AtomicUsize,
}

impl Upstream {
    /// Creates the effects table in a new SQLite file at `path` and serves
    /// `POST /pay` on a loopback port.
    pub(super) async fn start(path: &Path) -> anyhow::Result<Self> {
        let db = Connection::open(path).context("cannot create the upstream's database")?;
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE effects (seq INTEGER PRIMARY KEY, key TEXT NOT NULL, at_ms INTEGER NOT NULL);",
        )?;
        let shared = Arc::new(Shared {
            db: Mutex::new(db),
            fail_with: AtomicU16::new(0),
            failed: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/pay", post(pay))
            .route("/pay/by-key/{key}", get(by_key))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            path: path.to_owned(),
            shared,
            server,
        })
    }

    /// From now on, answers the request that applies a key's first effect
    /// with `status` (a 5xx) after committing it; `None` goes back to 201.
    pub(super) fn fail_after_apply(&self, status: Option<StatusCode>) {
        let code = status.map_or(0, |status| status.as_u16());
        self.shared.fail_with.store(code, Ordering::SeqCst);
    }

    /// First effects answered with a 5xx so far.
    pub(super) fn failed_after_apply(&self) -> usize {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// Where the gateway forwards.
    pub(super) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The database file holding the effects.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Applies the effect of every request, keyed by the forwarded
/// `Idempotency-Key` (an RFC 8941 String, recorded unquoted), and answers
/// with a body that depends on the key only, so a replay and a second
/// forward answer the same; or, told to, answers a key's first effect with
/// a 5xx once it is committed.
async fn pay(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> (StatusCode, String) {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|key| key.to_str().ok())
        .map(|key| key.trim_matches('"').to_owned())
    else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key".into());
    };
    let answer = answer_for(&key);
    let at_ms = super::now_ms();
    let fail_with = StatusCode::from_u16(shared.fail_with.load(Ordering::SeqCst)).ok();
    let db = Arc::clone(&shared);
    let applied = tokio::task::spawn_blocking(move || -> rusqlite::Result<bool> {
        let mut db = db
            .db
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let tx = db.transaction()?;
        let first = !tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM effects WHERE key = ?1)",
            [&key],
            |row| row.get::<_, bool>(0),
        )?;
        tx.execute(
            "INSERT INTO effects (key, at_ms) VALUES (?1, ?2)",
            rusqlite::params![key, at_ms],
        )?;
        tx.commit()?;
        Ok(first)
    })
    .await;
    match (applied, fail_with) {
        (Ok(Ok(true)), Some(status)) => {
            shared.failed.fetch_add(1, Ordering::SeqCst);
            (status, "applied, then the answer was lost".into())
        }
        (Ok(Ok(_)), _) => (StatusCode::CREATED, answer),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "effect not applied".into(),
        ),
    }
}

/// The answer for `key`: the same for the first forward, a later one, and
/// the probe.
fn answer_for(key: &str) -> String {
    format!("{{\"paid\":\"{key}\"}}")
}

/// The probe: whether `key` has an effect, and if so the answer it got.
async fn by_key(State(shared): State<Arc<Shared>>, UrlPath(key): UrlPath<String>) -> Response {
    let lookup = key.clone();
    let found = tokio::task::spawn_blocking(move || -> rusqlite::Result<bool> {
        let db = shared
            .db
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        db.query_row(
            "SELECT EXISTS (SELECT 1 FROM effects WHERE key = ?1)",
            [lookup],
            |row| row.get(0),
        )
    })
    .await;
    match found {
        Ok(Ok(true)) => (
            StatusCode::OK,
            [("idempotency-original-status", "201")],
            answer_for(&key),
        )
            .into_response(),
        Ok(Ok(false)) => StatusCode::NOT_FOUND.into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "cannot read the effects").into_response(),
    }
}
