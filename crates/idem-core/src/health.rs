//! Readiness of the process's long-lived connections: a broker connection of a
//! consumer, the relay's database and broker connections.
//!
//! Why a registry in the core: the code that holds a connection (a consumer's
//! transport, the relay) and the code that answers `/healthz` (the admin
//! listener) live in crates that do not know each other. Each connection
//! registers a [`Connection`] and says whether it is up; the admin listener
//! reads [`unready`] and answers not-ready, with the reason, while any
//! registered connection is down. Dropping the handle unregisters it.
//!
//! ```
//! use idem_core::health;
//!
//! let link = health::Connection::register("amqp://127.0.0.1:5672/%2f/orders");
//! assert!(health::unready().is_empty());
//! link.down("connection reset by peer");
//! let down = health::unready();
//! assert_eq!(down[0].name, "amqp://127.0.0.1:5672/%2f/orders");
//! assert_eq!(down[0].last_error, "connection reset by peer");
//! link.up();
//! assert!(health::unready().is_empty());
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU64 = AtomicU64::new(1);
static REGISTRY: Mutex<BTreeMap<u64, Entry>> = Mutex::new(BTreeMap::new());

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    down_since: Option<Instant>,
    last_error: String,
}

fn registry() -> std::sync::MutexGuard<'static, BTreeMap<u64, Entry>> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One registered connection; unregistered when dropped.
#[derive(Debug)]
pub struct Connection {
    id: u64,
}

impl Connection {
    /// Registers a connection named `name` (a redacted URL, say), up.
    pub fn register(name: impl Into<String>) -> Self {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        registry().insert(
            id,
            Entry {
                name: name.into(),
                down_since: None,
                last_error: String::new(),
            },
        );
        Self { id }
    }

    /// The connection works.
    pub fn up(&self) {
        if let Some(entry) = registry().get_mut(&self.id) {
            entry.down_since = None;
        }
    }

    /// The connection is lost and being made again; `error` says why it was
    /// lost, or why the last attempt failed.
    pub fn down(&self, error: impl fmt::Display) {
        if let Some(entry) = registry().get_mut(&self.id) {
            entry.down_since.get_or_insert_with(Instant::now);
            entry.last_error = error.to_string();
        }
    }

    /// Whether it is up.
    pub fn is_up(&self) -> bool {
        registry()
            .get(&self.id)
            .is_none_or(|entry| entry.down_since.is_none())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        registry().remove(&self.id);
    }
}

/// A connection that is down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    /// Its name.
    pub name: String,
    /// How long it has been down.
    pub down_for: Duration,
    /// Why it was lost, or why the last attempt to make it again failed.
    pub last_error: String,
}

impl fmt::Display for Down {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: reconnecting for {:.1}s; last error: {}",
            self.name,
            self.down_for.as_secs_f64(),
            self.last_error
        )
    }
}

/// The registered connections that are down, in the order they registered.
pub fn unready() -> Vec<Down> {
    registry()
        .values()
        .filter_map(|entry| {
            entry.down_since.map(|since| Down {
                name: entry.name.clone(),
                down_for: since.elapsed(),
                last_error: entry.last_error.clone(),
            })
        })
        .collect()
}
