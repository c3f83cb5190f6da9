//! [`RedisStore`] and its builder: the URL, the connection (one node through
//! a connection manager that reconnects by itself, or a Redis Cluster), the
//! settings, the clock, the key prefix and the durability of writes.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, ErrorKind, Settings, SharedClock, StoreError, SystemClock};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::durability::Durability;
use crate::error::map_error;
use crate::names;

/// How long connecting and each reply may take before the call fails as
/// unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A leased-mode store on Redis or Redis Cluster. Cheap to clone; clones share
/// the connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_core::Error> {
/// use idem_core::{Claimed, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Scope};
/// use idem_redis::RedisStore;
/// let store = RedisStore::builder("redis://127.0.0.1:6379/0").connect().await?;
/// let (scope, key) = (Scope::new("emails").unwrap(), IdempotencyKey::new("welcome/7").unwrap());
/// if let Claimed::Fresh(claim) = store.claim(&scope, &key, Fingerprint::of_bytes(b"hi")).await? {
///     // send the e-mail, then record it
///     store.complete(&claim, &Outcome::success("sent")).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    settings: Settings,
    clock: SharedClock,
    prefix: String,
    durability: Durability,
    shown: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("at", &self.inner.shown)
            .field("prefix", &self.inner.prefix)
            .field("durability", &self.inner.durability)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A builder for the store at `url`: `redis://[USER:PASSWORD@]HOST:PORT[/DB]`
    /// for one node, or (with the `cluster` feature)
    /// `redis+cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT,...` for a cluster,
    /// naming any of its nodes.
    ///
    /// The URL's query may set the store's own options, so that a command
    /// line can: `wait=N` (replicas each write waits for, see
    /// [`Durability`]), `wait_timeout_ms=MS` (default 1000) and `prefix=P`
    /// (the key prefix, default `idem:`); the builder's methods override them.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            settings: Settings::default(),
            clock: Arc::new(SystemClock),
            prefix: None,
            durability: None,
        }
    }

    /// Connects to `url` with the default settings.
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        Self::builder(url).connect().await
    }

    /// Lease and retention.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The clock leases and retention are measured with.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Whether writes wait for replicas.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.connection.is_cluster()
    }

    /// A handle on the store's connection, for commands of the caller's own
    /// (it implements redis-rs's `ConnectionLike`).
    pub fn connection(&self) -> Connection {
        self.inner.connection.clone()
    }

    /// Waits for the replicas the durability setting asks for, after a
    /// write to `record` (`what` says which, for the error; it is only
    /// worked out when the store waits).
    pub(crate) async fn wait_for_replicas(
        &self,
        record: &str,
        what: impl FnOnce() -> String,
    ) -> Result<(), Error> {
        let Durability::Replicas { count, timeout } = self.inner.durability else {
            return Ok(());
        };
        let what = what();
        let mut wait = redis::cmd("WAIT");
        wait.arg(count)
            .arg(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        let acknowledged: u32 = self
            .inner
            .connection
            .clone()
            .query_for_key(record, &wait)
            .await
            .map_err(|e| map_error(&format!("waiting for replicas after the {what}"), true, e))?;
        if acknowledged < count {
            return Err(StoreError::new(
                ErrorKind::CommitUnknown,
                format!(
                    "the {what} is on the Redis primary, but only {acknowledged} of the {count} replicas asked for acknowledged it within {} ms, so a failover now could lose it; retrying under the same key is safe. Check the replicas (INFO replication) or lower the replicas the store waits for",
                    timeout.as_millis()
                ),
            )
            .into());
        }
        Ok(())
    }
}

/// Options of a [`RedisStore`]; [`connect`](Self::connect) opens it.
#[derive(Debug)]
pub struct RedisStoreBuilder {
    url: String,
    settings: Settings,
    clock: SharedClock,
    prefix: Option<String>,
    durability: Option<Durability>,
}

impl RedisStoreBuilder {
    /// Lease and retention (the defaults: 60 s and 7 days).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The clock leases and retention are measured with (a manual one in tests).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The prefix of every key the store writes (default `idem:`), so several
    /// stores (or other data) can share one Redis database. It may not hold
    /// `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Whether each write waits for replicas (`WAIT`); by default it does not.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = Some(durability);
        self
    }

    /// Connects, and checks that the server answers.
    pub async fn connect(self) -> Result<RedisStore, Error> {
        let shown = shown(&self.url);
        let options = UrlOptions::of(&self.url, &shown)?;
        let prefix = self
            .prefix
            .or(options.prefix)
            .unwrap_or_else(|| names::DEFAULT_PREFIX.to_owned());
        let durability = self.durability.or(options.durability).unwrap_or_default();
        names::check_prefix(&prefix)
            .map_err(|message| Error::from(StoreError::new(ErrorKind::Config, message)))?;
        let connection = Connection::open(&options.url, &shown).await?;
        let mut probe = connection.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut probe)
            .await
            .map_err(|e| map_error(&format!("connecting to {shown}"), false, e))?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection,
                settings: self.settings,
                clock: self.clock,
                prefix,
                durability,
                shown,
            }),
        })
    }
}

/// The store's own options from a URL's query, and the URL without them for
/// redis-rs.
struct UrlOptions {
    url: String,
    prefix: Option<String>,
    durability: Option<Durability>,
}

impl UrlOptions {
    fn of(url: &str, shown: &str) -> Result<UrlOptions, Error> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok(UrlOptions {
                url: url.to_owned(),
                prefix: None,
                durability: None,
            });
        };
        let (mut prefix, mut wait, mut timeout, mut kept) = (None, None, None, Vec::new());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |what: &str| {
                value.parse::<u32>().map_err(|_| {
                    config_error(format!(
                        "{what}={value:?} in {shown} is not a whole number: write for example ?wait=1&wait_timeout_ms=500"
                    ))
                })
            };
            match name {
                "prefix" => prefix = Some(value.to_owned()),
                "wait" => wait = Some(number("wait")?),
                "wait_timeout_ms" => timeout = Some(number("wait_timeout_ms")?),
                _ => kept.push(pair),
            }
        }
        if timeout.is_some() && wait.is_none() {
            return Err(config_error(format!(
                "{shown} sets wait_timeout_ms but not wait: add wait=N, the replicas each write waits for"
            )));
        }
        let durability = wait.map(|count| {
            Durability::replicas(
                count,
                Duration::from_millis(u64::from(timeout.unwrap_or(1000))),
            )
        });
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(UrlOptions {
            url,
            prefix,
            durability,
        })
    }
}

/// `url` without its password, for messages.
fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let authority = match authority.rsplit_once('@') {
        Some((user, hosts)) => {
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{user}:***@{hosts}")
        }
        None => authority.to_owned(),
    };
    if path.is_empty() {
        format!("{scheme}://{authority}")
    } else {
        format!(
            "{scheme}://{authority}/{}",
            path.split('?').next().unwrap_or("")
        )
    }
}

fn config_error(message: String) -> Error {
    StoreError::new(ErrorKind::Config, message).into()
}

/// The connection of a store: one node through a connection manager, or a
/// cluster. Both multiplex every call over one connection per node.
#[derive(Clone)]
pub struct Connection(Node);

#[derive(Clone)]
enum Node {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_cluster() {
            "Connection(cluster)"
        } else {
            "Connection(single)"
        })
    }
}

impl Connection {
    async fn open(url: &str, shown: &str) -> Result<Connection, Error> {
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(config_error(format!(
                "store {shown:?} is not a Redis URL: write redis://HOST:PORT/DB, or redis+cluster://HOST:PORT,HOST:PORT for a cluster"
            )));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "redis" => Self::single(url, shown).await,
            "redis+cluster" => Self::cluster(url, shown).await,
            "rediss" | "rediss+cluster" => Err(config_error(format!(
                "{shown}: TLS to Redis is not built into this store; reach Redis over a trusted network or a TLS tunnel (stunnel, spiped) with a redis:// URL"
            ))),
            other => Err(config_error(format!(
                "unknown Redis URL scheme {other:?} in {shown}: write redis://HOST:PORT/DB, or redis+cluster://HOST:PORT,HOST:PORT for a cluster"
            ))),
        }
    }

    async fn single(url: &str, shown: &str) -> Result<Connection, Error> {
        let client = redis::Client::open(url).map_err(|e| {
            Error::from(StoreError::with_source(
                ErrorKind::Config,
                format!(
                    "{shown} is not a valid Redis URL: write redis://[USER:PASSWORD@]HOST:PORT/DB"
                ),
                e,
            ))
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(2);
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| map_error(&format!("connecting to {shown}"), false, e))?;
        Ok(Connection(Node::Single(manager)))
    }

    #[cfg(not(feature = "cluster"))]
    async fn cluster(_url: &str, shown: &str) -> Result<Connection, Error> {
        Err(config_error(format!(
            "{shown} names a Redis Cluster, but this build of idem-redis has no cluster support: build it with the `cluster` feature"
        )))
    }

    #[cfg(feature = "cluster")]
    async fn cluster(url: &str, shown: &str) -> Result<Connection, Error> {
        let nodes = cluster_nodes(url).map_err(config_error)?;
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .build()
            .map_err(|e| {
                Error::from(StoreError::with_source(
                    ErrorKind::Config,
                    format!("{shown} is not a valid Redis Cluster URL: write redis+cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT"),
                    e,
                ))
            })?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(|e| map_error(&format!("connecting to the cluster at {shown}"), false, e))?;
        Ok(Connection(Node::Cluster(connection)))
    }

    fn is_cluster(&self) -> bool {
        match &self.0 {
            Node::Single(_) => false,
            #[cfg(feature = "cluster")]
            Node::Cluster(_) => true,
        }
    }

    /// Runs `cmd`, which names no key, on the node that holds `key` (on one
    /// node, simply on it).
    pub(crate) async fn query_for_key<T: redis::FromRedisValue>(
        &mut self,
        key: &str,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
        match &mut self.0 {
            Node::Single(manager) => {
                let _ = key;
                cmd.query_async(manager).await
            }
            #[cfg(feature = "cluster")]
            Node::Cluster(cluster) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::with_key(key, SlotAddr::Master);
                let value = cluster
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                redis::FromRedisValue::from_redis_value(value).map_err(Into::into)
            }
        }
    }

    /// Every key matching `pattern` of type hash, on every primary.
    pub(crate) async fn scan_hashes(&mut self, pattern: &str) -> redis::RedisResult<Vec<String>> {
        match &mut self.0 {
            Node::Single(manager) => {
                scan(manager, pattern, |m, cmd| {
                    Box::pin(async move { cmd.query_async(m).await })
                })
                .await
            }
            #[cfg(feature = "cluster")]
            Node::Cluster(cluster) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let mut keys = Vec::new();
                for (host, port) in primaries(cluster).await? {
                    let mut node = (cluster.clone(), host, port);
                    keys.extend(
                        scan(&mut node, pattern, |(c, host, port), cmd| {
                            let routing =
                                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                    host: host.clone(),
                                    port: *port,
                                });
                            Box::pin(async move {
                                let value = c.route_command(cmd, routing).await?;
                                redis::FromRedisValue::from_redis_value(value).map_err(Into::into)
                            })
                        })
                        .await?,
                    );
                }
                Ok(keys)
            }
        }
    }
}

type Scanned<'a> = RedisFuture<'a, (u64, Vec<String>)>;

/// `SCAN` to the end on one node, through `send`.
async fn scan<N>(
    node: &mut N,
    pattern: &str,
    send: impl for<'a> Fn(&'a mut N, Cmd) -> Scanned<'a>,
) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg("hash");
        let (next, batch) = send(node, cmd).await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The host and port of every primary of the cluster, from `CLUSTER SLOTS`.
#[cfg(feature = "cluster")]
async fn primaries(
    cluster: &mut redis::cluster_async::ClusterConnection,
) -> redis::RedisResult<Vec<(String, u16)>> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let value = cluster
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await?;
    let ranges: Vec<Vec<Value>> = redis::FromRedisValue::from_redis_value(value)?;
    let mut found = Vec::new();
    for range in ranges {
        let Some(primary) = range.get(2) else {
            continue;
        };
        let (host, port): (String, u16) = match primary {
            Value::Array(fields) if fields.len() >= 2 => (
                redis::FromRedisValue::from_redis_value_ref(&fields[0])?,
                redis::FromRedisValue::from_redis_value_ref(&fields[1])?,
            ),
            _ => continue,
        };
        if !found.contains(&(host.clone(), port)) {
            found.push((host, port));
        }
    }
    Ok(found)
}

/// The node URLs of a `redis+cluster://` URL: its user and password applied
/// to each `HOST:PORT` of the comma-separated list.
#[cfg(feature = "cluster")]
fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
    let rest = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|host| format!("redis://{user}{host}"))
        .collect();
    if nodes.is_empty() {
        return Err(format!(
            "{} names no cluster node: write redis+cluster://HOST:PORT,HOST:PORT",
            shown(url)
        ));
    }
    Ok(nodes)
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Node::Single(manager) => manager.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Node::Cluster(cluster) => cluster.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Node::Single(manager) => manager.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Node::Cluster(cluster) => cluster.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Node::Single(manager) => manager.get_db(),
            #[cfg(feature = "cluster")]
            Node::Cluster(cluster) => cluster.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            shown("redis://app:hunter2@cache:6379/2?x=1"),
            "redis://app:***@cache:6379/2"
        );
        assert_eq!(shown("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(
            shown("redis+cluster://:hunter2@a:1,b:2"),
            "redis+cluster://:***@a:1,b:2"
        );
    }

    #[test]
    fn the_query_sets_the_stores_own_options() {
        let options = UrlOptions::of(
            "redis://h:1/0?wait=2&wait_timeout_ms=250&prefix=app:&protocol=resp3",
            "",
        )
        .unwrap();
        assert_eq!(options.url, "redis://h:1/0?protocol=resp3");
        assert_eq!(options.prefix.as_deref(), Some("app:"));
        assert_eq!(
            options.durability,
            Some(Durability::replicas(2, Duration::from_millis(250)))
        );
        let plain = UrlOptions::of("redis://h:1/0", "").unwrap();
        assert_eq!((plain.prefix, plain.durability), (None, None));
        let bad = UrlOptions::of("redis://h/0?wait=some", "redis://h/0")
            .err()
            .unwrap();
        assert!(bad.to_string().contains("not a whole number"), "{bad}");
        assert!(UrlOptions::of("redis://h/0?wait_timeout_ms=5", "").is_err());
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn cluster_urls_name_each_node() {
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@a:1,b:2").unwrap(),
            ["redis://u:p@a:1", "redis://u:p@b:2"]
        );
        assert!(cluster_nodes("redis+cluster://").is_err());
    }
}
