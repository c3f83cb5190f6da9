//! `idem dup-proxy`: `idem-proof`'s duplicate-injection proxy, stopped
//! gracefully by SIGTERM or Ctrl-C.

pub(crate) use idem_proof::DupProxyArgs;

use super::signals::terminated;

pub(crate) async fn run(args: &DupProxyArgs) -> anyhow::Result<()> {
    idem_proof::dup_proxy(args, terminated()).await
}
