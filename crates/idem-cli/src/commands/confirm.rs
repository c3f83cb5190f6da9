//! The confirmation an operator gives before a change by hand, and who they
//! are for the audit log.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, bail};

use super::args::ConfirmArgs;

/// Who does the change: `--actor` (or `IDEM_ACTOR`), else the
/// operating-system user.
pub(crate) fn actor(args: &ConfirmArgs) -> anyhow::Result<String> {
    if let Some(actor) = &args.actor {
        let actor = actor.trim();
        if actor.is_empty() {
            bail!("--actor is empty; give the name the audit log should keep");
        }
        return Ok(actor.to_owned());
    }
    whoami::username()
        .context("cannot tell who you are for the audit log; give --actor NAME (or IDEM_ACTOR)")
}

/// Goes on when the operator confirmed: `--yes`, or `y` typed at the
/// question on a terminal. Otherwise fails, saying nothing changed; without
/// a terminal, says to run again with `--yes` to `verb`.
pub(crate) fn confirm(args: &ConfirmArgs, verb: &str) -> anyhow::Result<()> {
    if args.yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("nothing changed: run again with --yes to {verb}");
    }
    print!("{verb}? [y/N] ");
    std::io::stdout()
        .flush()
        .context("cannot write the question")?;
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .context("cannot read the answer")?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => bail!("nothing changed: not confirmed"),
    }
}
