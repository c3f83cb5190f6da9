//! `idem gc`: delete records past retention in bounded batches, with progress.

use anyhow::Context;
use clap::Args;
use idem::{AnyStore, RecordStore, StoreLocation};
use indicatif::{ProgressBar, ProgressStyle};

/// `idem gc`
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Records deleted per transaction.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Leave a tombstone of each swept key for this long, such as 30d, so a
    /// late retry is refused instead of running again; give the gateway's
    /// `--tombstones` here too [default: off].
    #[arg(long, env = "IDEM_TOMBSTONES", value_name = "DURATION|off", value_parser = parse_grace)]
    pub tombstones: Option<Grace>,
}

/// A tombstone grace period as given: a duration, or `off`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grace(pub Option<std::time::Duration>);

fn parse_grace(text: &str) -> Result<Grace, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(Grace(None));
    }
    humantime::parse_duration(text.trim())
        .map(|d| Grace(Some(d)))
        .map_err(|e| format!("{e}; give a duration such as 30d or 12h, or off"))
}

/// Opens the store at `location` with the `--tombstones` grace, then sweeps.
pub(crate) async fn run(location: &StoreLocation, args: &GcArgs) -> anyhow::Result<()> {
    let grace = args.tombstones.and_then(|grace| grace.0);
    let store = AnyStore::open_with(
        location,
        idem::Settings::default().with_tombstones(grace),
        std::sync::Arc::new(idem::SystemClock),
    )
    .await
    .with_context(|| format!("cannot open the store at {location}"))?;
    sweep(&store, args).await
}

async fn sweep(store: &AnyStore, args: &GcArgs) -> anyhow::Result<()> {
    let batch = args.batch.max(1);
    let expired = store.count().await.context("cannot count records")?.expired;
    let bar = ProgressBar::new(expired).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} expired records deleted ({per_sec})")
            .expect("valid template"),
    );
    if expired < 10 * batch as u64 {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut deleted = 0;
    loop {
        let n = store
            .sweep_batch(batch)
            .await
            .context("sweep stopped; records deleted so far stay deleted, run it again")?;
        deleted += n;
        bar.inc(n);
        if n < batch as u64 {
            break;
        }
    }
    bar.finish_and_clear();
    let left = store.count().await.context("cannot count records")?;
    println!(
        "deleted {deleted} expired records; {} records remain",
        left.total
    );
    Ok(())
}
