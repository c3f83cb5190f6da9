//! What the outbox, relay and dead-letter tests share: a fresh PostgreSQL
//! database per test (dropped after), a temporary SQLite store, RabbitMQ
//! queues and NATS streams with random names (deleted after), a local
//! webhook that applies each `Idempotency-Key` once, and the first hops of
//! the end-to-end tests ([`checkout`]).
//!
//! A service that cannot be reached skips the test with a message, unless
//! `IDEM_REQUIRE_SERVICES` is set (CI), which fails it.

#![allow(dead_code)]

pub(crate) mod checkout;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_nats::jetstream;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use idem::{ManualClock, PgStore, SqliteStore};
use idem_testkit::services::missing_service;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

/// A random lowercase suffix for queue, stream, subject and database names.
pub(crate) fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{:012x}",
        RandomState::new().hash_one(std::time::SystemTime::now()) & 0xffff_ffff_ffff
    )
}

pub(crate) const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub(crate) const NATS_URL: &str = "nats://127.0.0.1:4222";

// ---- PostgreSQL ----

/// A throwaway database, dropped with the value.
pub(crate) struct PgDb {
    pub url: String,
    _database: idem_testkit::postgres::TestDatabase,
}

impl PgDb {
    pub(crate) async fn new() -> Option<PgDb> {
        let database = idem_testkit::postgres::TestDatabase::create("idem_broker_t").await?;
        Some(PgDb {
            url: database.url().to_owned(),
            _database: database,
        })
    }

    /// A store on this database reading `clock`.
    pub(crate) async fn store(&self, clock: &ManualClock) -> PgStore {
        PgStore::builder(&self.url)
            .clock(Arc::new(clock.clone()))
            .connect()
            .await
            .expect("connect store")
    }
}

// ---- SQLite ----

/// A store in a fresh temporary directory reading `clock`.
pub(crate) async fn sqlite(clock: &ManualClock) -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::builder(dir.path().join("idem.db"))
        .clock(Arc::new(clock.clone()))
        .open()
        .await
        .expect("open store");
    (dir, store)
}

// ---- RabbitMQ ----

/// One received AMQP message.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub message_id: Option<String>,
    pub payload: Vec<u8>,
}

/// A connection to RabbitMQ and the queues a test declared (deleted on drop).
pub(crate) struct Rabbit {
    connection: lapin::Connection,
    channel: lapin::Channel,
    queues: Mutex<Vec<String>>,
}

impl Rabbit {
    pub(crate) async fn new() -> Option<Rabbit> {
        let connection = match lapin::Connection::connect(
            AMQP_URL,
            lapin::ConnectionProperties::default(),
        )
        .await
        {
            Ok(connection) => connection,
            Err(error) => {
                missing_service("RabbitMQ", &error.to_string());
                return None;
            }
        };
        let channel = connection.create_channel().await.expect("channel");
        Some(Rabbit {
            connection,
            channel,
            queues: Mutex::new(Vec::new()),
        })
    }

    /// Declares a queue with a random name; returns the name.
    pub(crate) async fn queue(&self) -> String {
        let name = unique("idem_relay_q");
        self.channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare queue");
        self.queues.lock().unwrap().push(name.clone());
        name
    }

    /// The destination of the default exchange to `queue`.
    pub(crate) fn destination(queue: &str) -> idem_broker::publish::Destination {
        format!("{AMQP_URL}?queue={queue}")
            .parse()
            .expect("destination")
    }

    /// Takes every message waiting in `queue`.
    pub(crate) async fn drain(&self, queue: &str) -> Vec<Received> {
        let mut received = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            received.push(Received {
                message_id: message
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.as_str().to_owned()),
                payload: message.delivery.data.clone(),
            });
        }
        received
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        // The test's runtime is blocked in this drop, and this connection's
        // I/O runs on it: delete over a fresh connection on a runtime of its own.
        let queues = std::mem::take(&mut *self.queues.lock().unwrap());
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let connection =
                    lapin::Connection::connect(AMQP_URL, lapin::ConnectionProperties::default())
                        .await?;
                let channel = connection.create_channel().await?;
                for queue in queues {
                    channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await?;
                }
                connection.close(200, "done".into()).await
            })
        })
        .join();
        if !matches!(deleted, Ok(Ok(()))) {
            eprintln!("could not delete the test queues");
        }
    }
}

// ---- NATS ----

/// One message stored in a stream.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub msg_id: Option<String>,
    pub payload: Vec<u8>,
}

/// A connection to NATS and the streams a test created (deleted on drop).
pub(crate) struct Nats {
    pub jetstream: jetstream::Context,
    streams: Mutex<Vec<String>>,
}

impl Nats {
    pub(crate) async fn new() -> Option<Nats> {
        match async_nats::connect(NATS_URL).await {
            Ok(client) => Some(Nats {
                jetstream: jetstream::new(client),
                streams: Mutex::new(Vec::new()),
            }),
            Err(error) => {
                missing_service("NATS", &error.to_string());
                None
            }
        }
    }

    /// Creates a stream with a random name over a random subject; returns
    /// (stream, subject).
    pub(crate) async fn stream(&self) -> (String, String) {
        let name = unique("IDEM_RELAY");
        let subject = format!("{}.events", name.to_lowercase());
        self.jetstream
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                max_age: std::time::Duration::from_secs(24 * 3600),
                ..Default::default()
            })
            .await
            .expect("create stream");
        self.streams.lock().unwrap().push(name.clone());
        (name, subject)
    }

    pub(crate) fn destination(subject: &str) -> idem_broker::publish::Destination {
        format!("{NATS_URL}/{subject}")
            .parse()
            .expect("destination")
    }

    /// Every message the stream holds, in order.
    pub(crate) async fn messages(&self, stream: &str) -> Vec<Stored> {
        let mut handle = self.jetstream.get_stream(stream).await.expect("stream");
        let state = handle.info().await.expect("stream info").state.clone();
        let mut stored = Vec::new();
        if state.messages == 0 {
            return stored;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            if let Ok(message) = handle.get_raw_message(sequence).await {
                stored.push(Stored {
                    msg_id: message
                        .headers
                        .get("Nats-Msg-Id")
                        .map(|v| v.as_str().to_owned()),
                    payload: message.payload.to_vec(),
                });
            }
        }
        stored
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        // As for RabbitMQ: a fresh client on a runtime of its own.
        let streams = std::mem::take(&mut *self.streams.lock().unwrap());
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let client = async_nats::connect(NATS_URL)
                    .await
                    .map_err(|e| e.to_string())?;
                let jetstream = jetstream::new(client);
                for stream in streams {
                    jetstream
                        .delete_stream(stream)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
        })
        .join();
        if !matches!(deleted, Ok(Ok(()))) {
            eprintln!("could not delete the test streams");
        }
    }
}

// ---- a webhook that dedupes on Idempotency-Key ----

#[derive(Debug, Default)]
pub(crate) struct HookState {
    /// Status answered to every call (200 unless a test changes it).
    pub answer: Option<StatusCode>,
    /// Calls received, duplicates included.
    pub calls: u32,
    /// Keys seen, and how many times each.
    pub keys: HashMap<String, u32>,
    /// Effects applied: one per new key answered 2xx.
    pub effects: u32,
    applied: HashSet<String>,
}

/// A local webhook on 127.0.0.1:<random port>.
#[derive(Clone)]
pub(crate) struct Hook {
    pub state: Arc<Mutex<HookState>>,
    pub addr: SocketAddr,
}

impl Hook {
    pub(crate) async fn start() -> Hook {
        let state = Arc::new(Mutex::new(HookState::default()));
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Hook { state, addr }
    }

    pub(crate) fn destination(&self) -> idem_broker::publish::Destination {
        format!("http://{}/hook", self.addr)
            .parse()
            .expect("destination")
    }

    pub(crate) fn answer(&self, status: u16) {
        self.state.lock().unwrap().answer = Some(StatusCode::from_u16(status).unwrap());
    }

    pub(crate) fn calls(&self) -> u32 {
        self.state.lock().unwrap().calls
    }

    pub(crate) fn effects(&self) -> u32 {
        self.state.lock().unwrap().effects
    }

    pub(crate) fn keys(&self) -> HashMap<String, u32> {
        self.state.lock().unwrap().keys.clone()
    }
}

/// The header's RFC 8941 string (`"k"`) or bare token, unquoted.
fn key_of(headers: &HeaderMap) -> Option<String> {
    let raw = headers.get("idempotency-key")?.to_str().ok()?;
    let key = match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => raw.to_owned(),
    };
    Some(key)
}

async fn receive(State(state): State<Arc<Mutex<HookState>>>, headers: HeaderMap) -> StatusCode {
    let mut state = state.lock().unwrap();
    state.calls += 1;
    let Some(key) = key_of(&headers) else {
        return StatusCode::BAD_REQUEST;
    };
    *state.keys.entry(key.clone()).or_default() += 1;
    let answer = state.answer.unwrap_or(StatusCode::OK);
    if answer.is_success() && state.applied.insert(key) {
        state.effects += 1;
    }
    answer
}
