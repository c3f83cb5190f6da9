//! The arguments several commands share: the confirmation and actor of a
//! change by hand (`idem keys rm`, `idem dlq discard`, …), `--json` output
//! (`idem keys`, `idem audit-log`), and the parser of a broker URL that never
//! repeats it (`idem forward --from`, `idem relay --to`). Each command's own
//! arguments live in its module.

use clap::Args;

/// Who changes the store by hand, and whether they confirmed.
#[derive(Debug, Args)]
pub(crate) struct ConfirmArgs {
    /// Do it without asking; without it, idem asks on a terminal and
    /// otherwise only says what would change, and exits with status 1.
    #[arg(long)]
    pub yes: bool,
    /// Who does it, for the audit log [default: the operating-system user].
    #[arg(long, env = "IDEM_ACTOR", value_name = "NAME")]
    pub actor: Option<String>,
}

/// How records are printed.
#[derive(Debug, Args)]
pub(crate) struct OutputArgs {
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Parses a broker URL (`--from`, `--to`) whose error must not repeat it:
/// clap's own message for an invalid value quotes the value, password and
/// all. The type's error already shows the URL redacted.
#[derive(Debug)]
pub(crate) struct SecretUrl<T>(std::marker::PhantomData<fn() -> T>);

impl<T> Clone for SecretUrl<T> {
    fn clone(&self) -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T> SecretUrl<T> {
    pub(crate) fn new() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T> clap::builder::TypedValueParser for SecretUrl<T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Display,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let name = arg.map(ToString::to_string).unwrap_or_default();
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidUtf8,
                format!("the value of {name} is not UTF-8\n"),
            )
            .with_cmd(cmd)
        })?;
        text.parse().map_err(|e: T::Err| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {name}: {e}\n"),
            )
            .with_cmd(cmd)
        })
    }
}
