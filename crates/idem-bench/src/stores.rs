//! Stores made for a run: the benchmarks must not write into real data by
//! default, so they make a store for the run and remove it after — a fresh
//! PostgreSQL database here, a temporary SQLite file with
//! [`idem_demo::store::given_or_temporary`] — and can put the latency relay
//! between a run and PostgreSQL.

use std::time::Duration;

use anyhow::Context;
use idem::StoreLocation;
use idem::sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::latency::LatencyLink;

/// A PostgreSQL database made for one run and dropped after it.
#[derive(Debug)]
pub struct FreshDatabase {
    url: String,
    server: String,
    name: String,
}

impl FreshDatabase {
    /// Creates `idem_bench_<purpose>_<run>` on `server` (a URL naming any
    /// database there, to connect to); `purpose` is a lowercase word.
    pub async fn create(server: &str, purpose: &str, run: u32) -> anyhow::Result<Self> {
        let name = format!("idem_bench_{purpose}_{run:08x}");
        let mut admin = PgConnection::connect(server)
            .await
            .with_context(|| format!("cannot connect to PostgreSQL at {server}; pass --store"))?;
        idem::sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        admin.close().await.ok();
        let base = server.rsplit_once('/').map_or(server, |(base, _)| base);
        Ok(Self {
            url: format!("{base}/{name}"),
            server: server.to_owned(),
            name,
        })
    }

    /// Where the database is.
    pub fn location(&self) -> StoreLocation {
        StoreLocation::Postgres(self.url.clone())
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let mut admin = PgConnection::connect(&server).await?;
                idem::sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
                admin.close().await?;
                Ok::<_, anyhow::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: could not drop database {}", self.name);
        }
    }
}

/// `location` reached through a [`LatencyLink`] that delays each direction by
/// `one_way`; PostgreSQL only.
pub fn behind_latency(
    location: &StoreLocation,
    one_way: Duration,
) -> anyhow::Result<(StoreLocation, LatencyLink)> {
    let StoreLocation::Postgres(url) = location else {
        anyhow::bail!("--db-latency needs a PostgreSQL store; {location} is not one");
    };
    let mut url = url::Url::parse(url).with_context(|| format!("cannot read {location}"))?;
    let host = url
        .host_str()
        .with_context(|| format!("{location} names no host to delay"))?;
    let upstream = format!("{host}:{}", url.port().unwrap_or(5432));
    let link = LatencyLink::start(&upstream, one_way)
        .with_context(|| format!("cannot start the latency relay to {upstream}"))?;
    let local = link.local_addr();
    let pointed = url.set_host(Some(&local.ip().to_string())).is_ok()
        && url.set_port(Some(local.port())).is_ok();
    anyhow::ensure!(pointed, "cannot point {location} at the latency relay");
    Ok((StoreLocation::Postgres(url.into()), link))
}

/// The SQLite file, in `dir`, where the benchmarks' durable services commit
/// one row per order (an `orders` table, `synchronous=FULL`).
pub(crate) async fn orders_ledger(dir: &std::path::Path) -> anyhow::Result<idem::SqliteStore> {
    let store = idem::SqliteStore::open(dir.join("orders.db")).await?;
    store
        .with_connection(|c| {
            c.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        })
        .await??;
    Ok(store)
}
