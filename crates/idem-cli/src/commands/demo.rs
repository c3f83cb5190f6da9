//! `idem demo`: `idem-demo`'s payment demo, on the global `--store` (a
//! temporary SQLite file when none is given). Its flags are `idem-demo`'s, as
//! the `idem-demo` binary takes them.

use idem::StoreLocation;
pub(crate) use idem_demo::DemoArgs;

pub(crate) async fn run(location: Option<StoreLocation>, args: &DemoArgs) -> anyhow::Result<()> {
    idem_demo::run(location, args).await
}
