//! The Redis store under test: on the machine's Redis with a key prefix of
//! its own (deleted when the last handle goes), or on a server the test
//! started, with a manual clock.

use std::sync::Arc;

use idem_core::ManualClock;
use idem_redis::RedisStore;
use idem_redis::redis::AsyncCommands as _;
use idem_testkit::LeasedHarness;

/// Deletes every key under the prefix when dropped, on every node the URL
/// names (a cluster's keys are each on the node that owns their slot).
pub(crate) struct Prefix {
    pub(crate) url: String,
    pub(crate) prefix: String,
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let db = if self.url.starts_with("redis+cluster") {
            String::new()
        } else {
            self.url
                .rsplit_once('/')
                .map(|(_, db)| db)
                .unwrap_or("")
                .to_owned()
        };
        for (host, port) in idem_testkit::redis::nodes_of(&self.url) {
            let url = format!("redis://{host}:{port}/{db}");
            let Ok(client) = idem_redis::redis::Client::open(url.as_str()) else {
                continue;
            };
            let Ok(mut conn) = client.get_connection() else {
                continue;
            };
            let keys: Vec<String> = idem_redis::redis::cmd("KEYS")
                .arg(format!("{}*", self.prefix))
                .query(&mut conn)
                .unwrap_or_default();
            for key in keys {
                let _: Result<(), _> = idem_redis::redis::cmd("DEL").arg(key).query(&mut conn);
            }
        }
    }
}

pub(crate) struct Redis {
    pub(crate) store: RedisStore,
    pub(crate) clock: ManualClock,
    pub(crate) prefix: Arc<Prefix>,
}

impl Redis {
    /// A store at `url` under a prefix of its own.
    pub(crate) async fn at(url: &str, name: &str) -> Redis {
        let clock = ManualClock::starting_now();
        let prefix = idem_testkit::redis::test_prefix(name);
        let store = RedisStore::builder(url)
            .clock(Arc::new(clock.clone()))
            .prefix(prefix.clone())
            .connect()
            .await
            .expect("connect the Redis store");
        Redis {
            store,
            clock,
            prefix: Arc::new(Prefix {
                url: url.to_owned(),
                prefix,
            }),
        }
    }

    /// How many keys the store's prefix holds on one Redis node, counted by
    /// Redis itself.
    #[allow(dead_code)]
    pub(crate) async fn keys(&self) -> usize {
        let mut conn = self.store.connection();
        let keys: Vec<String> = conn
            .keys(format!("{}*", self.prefix.prefix))
            .await
            .expect("KEYS");
        keys.len()
    }
}

impl LeasedHarness for Redis {
    type Store = RedisStore;

    async fn fresh() -> Option<Self> {
        if !idem_testkit::redis::machine_redis_answers() {
            return None;
        }
        Some(Redis::at(&idem_testkit::redis::redis_url(), "conformance").await)
    }

    async fn reopen(&self) -> Self {
        Redis {
            store: self.store.clone(),
            clock: self.clock.clone(),
            prefix: Arc::clone(&self.prefix),
        }
    }

    fn store(&self) -> &RedisStore {
        &self.store
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}
