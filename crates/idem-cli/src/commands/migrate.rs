//! `idem migrate`: create or upgrade the schema.

use anyhow::Context;
use idem::{AnyStore, RecordStore, StoreLocation};

pub(crate) async fn run(location: &StoreLocation) -> anyhow::Result<()> {
    let store = AnyStore::open(location)
        .await
        .with_context(|| format!("cannot open the store at {location}"))?;
    store
        .migrate()
        .await
        .with_context(|| format!("cannot migrate the store at {location}"))?;
    println!("schema up to date at {location}");
    Ok(())
}
