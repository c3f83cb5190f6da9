//! How a DynamoDB table is written as one URL, in the same forms as the SQS
//! transport's queues, so a command line names it in one setting:
//!
//! `dynamodb://[KEY:SECRET@][HOST[:PORT]]/TABLE[?region=REGION]`
//!
//! - no host (`dynamodb:///idem`): the SDK's own endpoint
//!   (`AWS_ENDPOINT_URL`, the profile, or the region's DynamoDB endpoint);
//! - a host: that endpoint over HTTPS; `dynamodb+http://` reaches it over
//!   plain HTTP (an emulator on loopback, such as moto's server);
//! - the region: `?region=`, else the standard chain (`AWS_REGION`, the
//!   profile), else the one in a `dynamodb.REGION.amazonaws.com` host; an
//!   endpoint that is not Amazon's and names none gets `us-east-1`, which
//!   emulators accept;
//! - credentials: `KEY:SECRET@` in the URL, else the standard chain
//!   (environment, profile, web identity, container and instance roles).
//!
//! Only [`redact_url`](idem_core::redact_url)'s form of the URL ever reaches
//! a message or a log: the secret and the query are left out.

use idem_core::{Error, ErrorKind, StoreError};
use url::Url;

/// The region an emulator's endpoint gets when nothing names one.
pub(crate) const EMULATOR_REGION: &str = "us-east-1";

/// A table, as a DynamoDB URL names it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TableUrl {
    /// `https://HOST[:PORT]` or `http://HOST[:PORT]`; `None`: the SDK's.
    pub(crate) endpoint: Option<String>,
    /// `?region=`, or the one an Amazon host names.
    pub(crate) region: Option<String>,
    /// Static credentials from the URL's user-info.
    pub(crate) credentials: Option<(String, String)>,
    /// The table's name.
    pub(crate) table: String,
}

impl std::fmt::Debug for TableUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableUrl")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|(key, _)| key),
            )
            .field("table", &self.table)
            .finish()
    }
}

impl TableUrl {
    /// Parses `text`; the error names the URL without its secret.
    pub(crate) fn parse(text: &str) -> Result<Self, Error> {
        Self::read(text).map_err(|why| {
            StoreError::new(
                ErrorKind::Config,
                format!(
                    "store {} is not a DynamoDB URL: {why}",
                    idem_core::redact_url(text)
                ),
            )
            .into()
        })
    }

    fn read(text: &str) -> Result<Self, String> {
        let parsed = Url::parse(text).map_err(|e| e.to_string())?;
        let scheme = match parsed.scheme() {
            "dynamodb" => "https",
            "dynamodb+http" => "http",
            other => {
                return Err(format!(
                    "unknown scheme {other:?}: write dynamodb:///TABLE, dynamodb://HOST/TABLE, or dynamodb+http://HOST:PORT/TABLE for an emulator reached over plain HTTP"
                ));
            }
        };
        let host = parsed.host_str().unwrap_or_default();
        let endpoint = (!host.is_empty()).then(|| match parsed.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        });
        if endpoint.is_none() && scheme == "http" {
            return Err(
                "dynamodb+http:// names the endpoint it reaches: write dynamodb+http://HOST:PORT/TABLE"
                    .into(),
            );
        }
        let credentials = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (key, Some(secret)) if !key.is_empty() => Some((decode(key), decode(secret))),
            _ => {
                return Err(
                    "credentials in the URL are written KEY:SECRET@ (both parts), or left to the AWS chain"
                        .into(),
                );
            }
        };
        let segments: Vec<String> = parsed
            .path_segments()
            .map(|s| s.filter(|s| !s.is_empty()).map(decode).collect())
            .unwrap_or_default();
        let table = match segments.as_slice() {
            [table] => table.clone(),
            [] => {
                return Err(
                    "names no table: write dynamodb:///TABLE or dynamodb://HOST/TABLE".into(),
                );
            }
            _ => return Err("the path is the table's name alone".into()),
        };
        if !valid_table_name(&table) {
            return Err(format!(
                "{table:?} is not a DynamoDB table name: 3 to 255 letters, digits, '_', '-' or '.'"
            ));
        }
        let mut region = amazon_region(host);
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "region" if !value.is_empty() => region = Some(value.into_owned()),
                other => {
                    return Err(format!(
                        "unknown option {other:?}: a DynamoDB URL takes region= alone"
                    ));
                }
            }
        }
        Ok(Self {
            endpoint,
            region,
            credentials,
            table,
        })
    }
}

/// The region of an Amazon endpoint (`dynamodb.eu-west-1.amazonaws.com`).
fn amazon_region(host: &str) -> Option<String> {
    let rest = host.strip_prefix("dynamodb.")?;
    let (region, domain) = rest.split_once('.')?;
    domain.starts_with("amazonaws.").then(|| region.to_owned())
}

/// DynamoDB's rule for table names.
pub(crate) fn valid_table_name(name: &str) -> bool {
    (3..=255).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_endpoint_region_credentials_and_table() {
        let moto = TableUrl::parse("dynamodb+http://test:s3cret@127.0.0.1:5000/idem").unwrap();
        assert_eq!(moto.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(moto.region, None);
        assert_eq!(moto.credentials, Some(("test".into(), "s3cret".into())));
        assert_eq!(moto.table, "idem");

        let elsewhere =
            TableUrl::parse("dynamodb+http://k:s@127.0.0.1:5000/idem?region=eu-west-1").unwrap();
        assert_eq!(elsewhere.region.as_deref(), Some("eu-west-1"));

        let aws =
            TableUrl::parse("dynamodb://dynamodb.eu-central-1.amazonaws.com/idem.records").unwrap();
        assert_eq!(
            aws.endpoint.as_deref(),
            Some("https://dynamodb.eu-central-1.amazonaws.com")
        );
        assert_eq!(aws.region.as_deref(), Some("eu-central-1"));
        assert_eq!(aws.table, "idem.records");

        let chain = TableUrl::parse("dynamodb:///idem").unwrap();
        assert_eq!(
            (chain.endpoint, chain.region, chain.credentials),
            (None, None, None)
        );
    }

    #[test]
    fn refusals_name_the_url_without_its_secret() {
        for bad in [
            "dynamodb+http:///idem",
            "dynamodb://h/",
            "dynamodb://h/a/b",
            "dynamodb://h/no",
            "dynamodb://h/bad%20name",
            "dynamodb://key@h/idem",
            "dynamodb+http://k:hunter2@h:1/idem?prefix=x",
            "dynamo://h/idem",
        ] {
            let error = TableUrl::parse(bad).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{error}");
            assert!(error.contains("not a DynamoDB URL"), "{bad}: {error}");
        }
        let shown = format!(
            "{:?}",
            TableUrl::parse("dynamodb+http://k:hunter2@h:1/idem").unwrap()
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
