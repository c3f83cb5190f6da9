//! `idem console`: the operator console over the store, until SIGTERM or
//! Ctrl-C. Refuses to start on an address other hosts can reach without a
//! token file.

use std::io::Write;

use anyhow::Context;
use idem::AnyStore;
use idem_console::{Access, Console};
use idem_http::admin::AdminToken;
use tokio::net::TcpListener;

use super::signals::terminated;
use crate::cli::ConsoleArgs;

pub(super) async fn run(store: AnyStore, args: &ConsoleArgs) -> anyhow::Result<()> {
    let token = |path: &Option<std::path::PathBuf>, flag: &str| {
        path.as_deref()
            .map(AdminToken::read)
            .transpose()
            .with_context(|| flag.to_owned())
    };
    let access = Access::with_tokens(
        token(&args.token_file, "--token-file")?,
        token(&args.read_only_token_file, "--read-only-token-file")?,
    );
    access.check_listen(args.listen)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", args.listen))?;
    let console = Console::new(store, access.clone());
    let charts = console.start_charts(None, args.sample_every);
    let terminate = terminated();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "idem console: on http://{}/ ({}); the API is described at /api/v1/openapi.json",
        listener.local_addr()?,
        if access.needs_token() {
            "a token is required"
        } else {
            "open to this host only, no token"
        }
    )?;
    out.flush()?;
    drop(out);
    let served = idem_console::serve(listener, console, terminate).await;
    charts.abort();
    served.context("the console stopped")?;
    eprintln!("idem console: stopped");
    Ok(())
}
