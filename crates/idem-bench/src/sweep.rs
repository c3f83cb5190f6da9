//! `idem bench sweep`: what tombstones cost the sweep, and what they take on
//! disk, in one run and one process.
//!
//! Each round fills the dedupe table with `--records` records whose window
//! has ended, then sweeps them: once with tombstones off (the records are
//! deleted) and once with tombstones on (each record is deleted and a
//! tombstone written in its place), the two modes taking turns. Reported:
//! records swept per second in each mode, the ratio of on to off, and the
//! bytes a record and a tombstone take in the store's tables (indexes
//! included) — the space tombstones hold for their grace period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{
    AnyConnection, AnyStore, AtomicStore, RecordStore, Scope, Settings, StoreLocation, SystemClock,
    Timestamp,
};
use idem_demo::store::given_or_temporary;

use crate::args::BenchSweepArgs;

/// Records seeded per transaction.
const SEED_CHUNK: i64 = 20_000;

/// Runs the benchmark on `store` (a temporary SQLite file when none is given).
pub(crate) async fn run(store: Option<StoreLocation>, args: &BenchSweepArgs) -> anyhow::Result<()> {
    let (_dir, location) = given_or_temporary(store)?;
    let records = i64::try_from(args.records.max(1))?;
    let run = std::process::id();
    let mut swept = [Duration::ZERO, Duration::ZERO];
    let mut sizes = Sizes::default();
    println!(
        "sweeping {records} expired records per mode and round on {location}, batch {}, {} rounds",
        args.batch, args.rounds
    );
    for round in 0..args.rounds.max(1) {
        for (mode, grace) in [(0, None), (1, Some(args.grace))] {
            let store = open(&location, grace).await?;
            let tag = format!("{run:08x}-{round}-{mode}");
            seed_expired(&store, &tag, records).await?;
            if grace.is_some() {
                sizes.records = table_bytes(&store, "idem_records").await?;
            }
            let started = Instant::now();
            let deleted = store.sweep(args.batch).await.context("the sweep failed")?;
            let took = started.elapsed();
            swept[mode] += took;
            anyhow::ensure!(
                deleted >= records.unsigned_abs(),
                "the sweep deleted {deleted} rows, fewer than the {records} expired records"
            );
            if grace.is_some() {
                sizes.tombstones = table_bytes(&store, "idem_tombstones").await?;
                sizes.tombstone_rows += records.unsigned_abs();
            }
            println!(
                "round {}: tombstones {}: {:.0} records/s",
                round + 1,
                if grace.is_some() { "on" } else { "off" },
                records as f64 / took.as_secs_f64()
            );
        }
    }
    let total = records as f64 * args.rounds.max(1) as f64;
    let off = total / swept[0].as_secs_f64();
    let on = total / swept[1].as_secs_f64();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "sweep",
        "records/s",
        "µs per record",
        "÷ off",
    ]);
    for (name, rate) in [("tombstones off", off), ("tombstones on", on)] {
        table.add_row([
            name.to_owned(),
            format!("{rate:.0}"),
            format!("{:.1}", 1e6 / rate),
            format!("{:.2}", rate / off),
        ]);
    }
    println!("{table}");
    println!(
        "space: a record takes {:.0} bytes, a tombstone {:.0} bytes ({:.2}× a record), indexes included",
        sizes.records as f64 / records as f64,
        sizes.tombstones as f64 / sizes.tombstone_rows.max(1) as f64,
        (sizes.tombstones as f64 / sizes.tombstone_rows.max(1) as f64)
            / (sizes.records as f64 / records as f64),
    );
    Ok(())
}

#[derive(Default)]
struct Sizes {
    records: u64,
    tombstones: u64,
    tombstone_rows: u64,
}

async fn open(location: &StoreLocation, grace: Option<Duration>) -> anyhow::Result<AnyStore> {
    let settings = Settings::default().with_tombstones(grace);
    let store = AnyStore::open_with(location, settings, Arc::new(SystemClock))
        .await
        .with_context(|| format!("cannot open the store at {location}"))?;
    store.migrate().await.context("cannot migrate the store")?;
    Ok(store)
}

/// Fills the dedupe table with `count` completed records whose window ended
/// a moment ago.
async fn seed_expired(store: &AnyStore, tag: &str, count: i64) -> anyhow::Result<()> {
    let window = idem::DEFAULT_RETENTION;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let created = i64::try_from(now.as_millis())? - i64::try_from(window.as_millis())? - 1;
    let mut from = 0;
    while from < count {
        let seed = idem::protocol::RecordSeed {
            scope: Scope::new("bench-sweep")?,
            tag: tag.to_owned(),
            from,
            count: SEED_CHUNK.min(count - from),
            now: Timestamp(created),
            window,
        };
        store
            .transaction(async move |tx| -> Result<(), anyhow::Error> {
                match tx.connection() {
                    AnyConnection::Sqlite(c) => Ok(idem::SqliteStore::seed_records(c, &seed)?),
                    AnyConnection::Postgres(c) => Ok(idem::PgStore::seed_records(c, &seed).await?),
                }
            })
            .await
            .map_err(|e| anyhow::anyhow!("cannot seed expired records: {e}"))?;
        from += SEED_CHUNK;
    }
    Ok(())
}

/// The bytes `table` and its indexes take.
async fn table_bytes(store: &AnyStore, table: &'static str) -> anyhow::Result<u64> {
    store
        .transaction(async move |tx| -> Result<u64, anyhow::Error> {
            match tx.connection() {
                AnyConnection::Sqlite(c) => {
                    let bytes: i64 = c.query_row(
                        "SELECT coalesce(sum(pgsize), 0) FROM dbstat \
                         WHERE name = ?1 OR name IN \
                           (SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = ?1)",
                        [table],
                        |row| row.get(0),
                    )?;
                    Ok(bytes.unsigned_abs())
                }
                AnyConnection::Postgres(c) => {
                    let bytes: i64 =
                        idem::sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
                            .bind(table)
                            .fetch_one(c)
                            .await?;
                    Ok(bytes.unsigned_abs())
                }
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("cannot measure {table}: {e}"))
}
