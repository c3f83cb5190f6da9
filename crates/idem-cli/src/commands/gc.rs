//! `idem gc`: delete records past retention in bounded batches, with progress.

use anyhow::Context;
use idem::{AnyStore, RecordStore};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::GcArgs;

pub(super) async fn run(store: &AnyStore, args: &GcArgs) -> anyhow::Result<()> {
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
