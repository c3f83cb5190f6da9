//! The signals that stop a long-running command gracefully.

use std::future::Future;

/// Completes on SIGTERM or Ctrl-C (SIGINT). SIGTERM is caught from the call
/// on, not from the first poll: call it before announcing the listener, so a
/// SIGTERM sent as soon as the announcement is read stops the process
/// gracefully instead of killing it.
pub(crate) fn terminated() -> impl Future<Output = ()> + Send + 'static {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let mut term = match term {
            Ok(term) => term,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the process gracefully");
                tokio::signal::ctrl_c().await.ok();
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}
