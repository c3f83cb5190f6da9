//! Amazon SQS: how a queue is written as one URL, for sources and
//! destinations alike, and the message attribute its key travels in; with
//! the `sqs` feature, the SDK client made from the URL (`connect`), the
//! consumer transport (`consume`: the visibility timeout as the lease, the
//! message deleted after its commit) and the publisher (`publish`: FIFO
//! deduplication ids from the key).
//!
//! `sqs://[KEY:SECRET@][HOST[:PORT]]/[ACCOUNT/]QUEUE[?region=REGION]`:
//!
//! - no host (`sqs:///orders`): the SDK's own endpoint (`AWS_ENDPOINT_URL`,
//!   the profile, or the region's SQS endpoint);
//! - a host: that endpoint over HTTPS; `sqs+http://` reaches it over plain
//!   HTTP (a local emulator on loopback);
//! - the region: `?region=`, else the standard chain (`AWS_REGION`, the
//!   profile), else the one in an `sqs.REGION.amazonaws.com` host; an
//!   endpoint that is not Amazon's and names none gets `us-east-1`, which
//!   emulators accept;
//! - credentials: `KEY:SECRET@` in the URL, else the standard chain
//!   (environment, profile, web identity, container and instance roles);
//! - `ACCOUNT`: the queue's owner, when it is not the caller's account.
//!
//! The URL is read in every build, so a destination or a source parses
//! whatever the features; the rest of this folder needs the `sqs` feature.

#[cfg(feature = "sqs")]
mod connect;
#[cfg(feature = "sqs")]
pub(crate) mod consume;
#[cfg(feature = "sqs")]
pub(crate) mod publish;

use url::Url;

/// The message attribute the key travels in: the publisher writes it, the
/// consumer reads it as the message id.
pub const KEY_ATTRIBUTE: &str = "idempotency-key";

/// A queue, as an SQS URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "sqs"), allow(dead_code))]
pub(crate) struct SqsUrl {
    /// `https://HOST[:PORT]` or `http://HOST[:PORT]`; `None`: the SDK's.
    pub(crate) endpoint: Option<String>,
    /// `?region=`, or the one an Amazon host names.
    pub(crate) region: Option<String>,
    /// Static credentials from the URL's user-info.
    pub(crate) credentials: Option<(String, String)>,
    /// The queue owner's account id.
    pub(crate) account: Option<String>,
    /// The queue's name (`orders`, `orders.fifo`).
    pub(crate) queue: String,
    /// The other query pairs, for the transport or the publisher to read.
    pub(crate) query: Vec<(String, String)>,
}

impl SqsUrl {
    /// Parses `text`; the reason is meant for a person.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let parsed = Url::parse(text).map_err(|e| e.to_string())?;
        let scheme = match parsed.scheme() {
            "sqs" => "https",
            "sqs+http" => "http",
            other => {
                return Err(format!(
                    "unknown scheme {other:?}: write sqs:// (or sqs+http:// for an emulator reached over plain HTTP)"
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
                "sqs+http:// names the endpoint it reaches: write sqs+http://HOST:PORT/QUEUE"
                    .into(),
            );
        }
        let credentials = match (parsed.username(), parsed.password()) {
            ("", None) => None,
            (key, Some(secret)) if !key.is_empty() => Some((decode(key), decode(secret))),
            _ => {
                return Err(
                    "credentials in the URL are written KEY:SECRET@ (both parts), or left to the AWS chain".into(),
                );
            }
        };
        let segments: Vec<String> = parsed
            .path_segments()
            .map(|s| s.filter(|s| !s.is_empty()).map(decode).collect())
            .unwrap_or_default();
        let (account, queue) = match segments.as_slice() {
            [queue] => (None, queue.clone()),
            [account, queue] => (Some(account.clone()), queue.clone()),
            [] => return Err("names no queue: write sqs://HOST/QUEUE or sqs:///QUEUE".into()),
            _ => return Err("the path is [ACCOUNT/]QUEUE".into()),
        };
        if !valid_queue_name(&queue) {
            return Err(format!(
                "{queue:?} is not a queue name: up to 80 letters, digits, '-' or '_', with '.fifo' at the end of a FIFO queue"
            ));
        }
        let mut region = amazon_region(host);
        let mut query = Vec::new();
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "region" => region = Some(value.into_owned()),
                _ => query.push((name.into_owned(), value.into_owned())),
            }
        }
        Ok(Self {
            endpoint,
            region,
            credentials,
            account,
            queue,
            query,
        })
    }

    /// Whether the queue is a FIFO queue (its name says so).
    #[cfg_attr(not(feature = "sqs"), allow(dead_code))]
    pub(crate) fn fifo(&self) -> bool {
        self.queue.ends_with(".fifo")
    }
}

/// The region of an Amazon endpoint (`sqs.eu-west-1.amazonaws.com`).
fn amazon_region(host: &str) -> Option<String> {
    let rest = host.strip_prefix("sqs.")?;
    let (region, domain) = rest.split_once('.')?;
    domain.starts_with("amazonaws.").then(|| region.to_owned())
}

fn valid_queue_name(name: &str) -> bool {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    !base.is_empty()
        && name.len() <= 80
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
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
    fn reads_the_endpoint_region_credentials_and_queue() {
        let moto = SqsUrl::parse(
            "sqs+http://test:s3cret@127.0.0.1:5000/orders.fifo?region=eu-west-1&group=g",
        )
        .unwrap();
        assert_eq!(moto.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(moto.region.as_deref(), Some("eu-west-1"));
        assert_eq!(moto.credentials, Some(("test".into(), "s3cret".into())));
        assert_eq!(moto.queue, "orders.fifo");
        assert!(moto.fifo());
        assert_eq!(moto.query, [("group".to_owned(), "g".to_owned())]);

        let aws =
            SqsUrl::parse("sqs://sqs.eu-central-1.amazonaws.com/123456789012/orders").unwrap();
        assert_eq!(
            aws.endpoint.as_deref(),
            Some("https://sqs.eu-central-1.amazonaws.com")
        );
        assert_eq!(aws.region.as_deref(), Some("eu-central-1"));
        assert_eq!(aws.account.as_deref(), Some("123456789012"));
        assert!(!aws.fifo());

        let chain = SqsUrl::parse("sqs:///orders").unwrap();
        assert_eq!(
            (chain.endpoint, chain.region, chain.credentials),
            (None, None, None)
        );

        assert!(SqsUrl::parse("sqs+http:///orders").is_err());
        assert!(SqsUrl::parse("sqs://h/").is_err());
        assert!(SqsUrl::parse("sqs://h/bad name").is_err());
        assert!(SqsUrl::parse("sqs://key@h/q").is_err());
    }
}
