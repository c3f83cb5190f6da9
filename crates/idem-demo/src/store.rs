//! Where a run's store lives when none is given: the demo and the benchmarks
//! must not write into real data by default, so they make an embedded store
//! for the run, in a temporary directory removed after it.

use anyhow::Context;
use idem::StoreLocation;

/// The given store, or an embedded store in a temporary directory, removed
/// when the returned guard drops.
pub fn given_or_temporary(
    location: Option<StoreLocation>,
) -> anyhow::Result<(Option<tempfile::TempDir>, StoreLocation)> {
    if let Some(location) = location {
        return Ok((None, location));
    }
    let dir = tempfile::Builder::new()
        .prefix("idem-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let location = StoreLocation::Sqlite(dir.path().join("idem.db"));
    Ok((Some(dir), location))
}
