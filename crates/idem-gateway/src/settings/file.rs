//! The config file, and picking each setting: the flag (or its variable)
//! when given, else the file's key, with where the value came from for the
//! error messages.

use std::path::Path;

use super::{GivenSettings, SettingsError};

/// A config file's text, and its path for messages.
#[derive(Debug, Clone, Copy)]
pub struct SettingsFile<'a> {
    path: &'a Path,
    text: &'a str,
}

impl<'a> SettingsFile<'a> {
    /// The file read from `path`.
    pub fn new(path: &'a (impl AsRef<Path> + ?Sized), text: &'a str) -> Self {
        Self {
            path: path.as_ref(),
            text,
        }
    }

    /// The settings the file gives: the same keys as the flags, with
    /// underscores. An unknown key is an error.
    fn given(&self) -> Result<GivenSettings, SettingsError> {
        toml::from_str(self.text).map_err(|error| {
            SettingsError::new(format!(
                "the config file {} is not valid: {}",
                self.path.display(),
                error.to_string().trim_end()
            ))
        })
    }
}

/// One setting's value and where it came from, for error messages.
pub(super) struct Found {
    pub(super) value: String,
    pub(super) origin: String,
}

/// The two places a setting is given: the command line and the file.
pub(super) struct Sources<'a> {
    flags: &'a GivenSettings,
    file: GivenSettings,
    path: Option<&'a Path>,
}

impl<'a> Sources<'a> {
    /// What the command line gave, and the file's settings if there is one.
    pub(super) fn new(
        flags: &'a GivenSettings,
        file: Option<SettingsFile<'a>>,
    ) -> Result<Self, SettingsError> {
        Ok(Self {
            flags,
            file: file
                .as_ref()
                .map(SettingsFile::given)
                .transpose()?
                .unwrap_or_default(),
            path: file.map(|f| f.path),
        })
    }

    /// The setting named `field` (its [`GivenSettings`] field), as `get`
    /// reads it: from the flags, else from the file; `None` when neither
    /// gives it.
    pub(super) fn pick(
        &self,
        field: &str,
        get: impl Fn(&GivenSettings) -> Option<String>,
    ) -> Option<Found> {
        if let Some(value) = get(self.flags) {
            return Some(Found {
                value,
                origin: flag_origin(field),
            });
        }
        let value = get(&self.file)?;
        let path = self
            .path
            .map_or_else(String::new, |p| p.display().to_string());
        Some(Found {
            value,
            origin: format!("`{field}` in {path}"),
        })
    }

    /// The `require_key` switch: the flag's, else the file's.
    pub(super) fn require_key(&self) -> Option<bool> {
        self.flags.require_key.or(self.file.require_key)
    }
}

/// Picks the setting of the [`GivenSettings`] field of that name.
macro_rules! pick {
    ($sources:expr, $field:ident) => {
        $sources.pick(stringify!($field), |given| given.$field.clone())
    };
    ($sources:expr, $field:ident listed) => {
        $sources.pick(stringify!($field), |given| {
            (!given.$field.is_empty()).then(|| given.$field.join(","))
        })
    };
}
pub(super) use pick;

/// How a setting given on the command line is named in messages: its flag
/// and its environment variable, as [`GivenSettings`] declares them.
#[cfg(feature = "cli")]
fn flag_origin(field: &str) -> String {
    use std::collections::HashMap;
    use std::sync::LazyLock;

    static FLAGS: LazyLock<HashMap<String, String>> = LazyLock::new(|| {
        let command = <GivenSettings as clap::Args>::augment_args(clap::Command::new("serve"));
        command
            .get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                let named = match arg.get_env() {
                    Some(env) => format!("--{long} (or {})", env.to_string_lossy()),
                    None => format!("--{long}"),
                };
                Some((arg.get_id().to_string(), named))
            })
            .collect()
    });
    match FLAGS.get(field) {
        Some(named) => named.clone(),
        // The store is the command line's global flag, shared by every
        // command.
        None if field == "store" => "--store (or IDEM_STORE)".to_owned(),
        None => format!("--{}", field.replace('_', "-")),
    }
}

/// How a given setting is named in messages: its flag.
#[cfg(not(feature = "cli"))]
fn flag_origin(field: &str) -> String {
    format!("--{}", field.replace('_', "-"))
}
