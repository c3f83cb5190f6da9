//! The brokers of the relay scenarios: a RabbitMQ queue or a JetStream
//! stream of each trial's own, created before the load and deleted after it,
//! and the URLs the relay and `idem forward` reach them by — directly, or
//! through the fault proxy.

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::Context;
use async_nats::jetstream;

/// A RabbitMQ queue of the trial's own, deleted by [`Queue::delete`].
pub(super) struct Queue {
    channel: lapin::Channel,
    connection: lapin::Connection,
    pub name: String,
}

impl Queue {
    /// Declares `name` on the broker at `url` (`amqp://USER:PASS@HOST:PORT/%2f`).
    pub(super) async fn declare(url: &str, name: String) -> anyhow::Result<Self> {
        Self::declare_with(url, name, None).await
    }

    /// The same, a durable quorum queue with `members` members when given
    /// (`url` one node of the cluster: the queue's first leader).
    pub(super) async fn declare_with(
        url: &str,
        name: String,
        members: Option<usize>,
    ) -> anyhow::Result<Self> {
        use lapin::types::{AMQPValue, FieldTable};

        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .with_context(|| format!("cannot reach RabbitMQ at {}", idem::redact_url(url)))?;
        let channel = connection.create_channel().await?;
        let mut arguments = FieldTable::default();
        let mut options = lapin::options::QueueDeclareOptions::default();
        if let Some(members) = members {
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            arguments.insert(
                "x-quorum-initial-group-size".into(),
                AMQPValue::LongInt(i32::try_from(members)?),
            );
            options.durable = true;
        }
        channel
            .queue_declare(name.as_str().into(), options, arguments)
            .await?;
        Ok(Self {
            channel,
            connection,
            name,
        })
    }

    /// Messages ready in the queue, and its consumers.
    pub(super) async fn depth(&self) -> anyhow::Result<(u32, u32)> {
        let options = lapin::options::QueueDeclareOptions {
            passive: true,
            ..lapin::options::QueueDeclareOptions::default()
        };
        let queue = self
            .channel
            .queue_declare(
                self.name.as_str().into(),
                options,
                lapin::types::FieldTable::default(),
            )
            .await?;
        Ok((queue.message_count(), queue.consumer_count()))
    }

    /// Deletes the queue and closes the connection.
    pub(super) async fn delete(self) {
        let options = lapin::options::QueueDeleteOptions::default();
        let _ = self
            .channel
            .queue_delete(self.name.as_str().into(), options)
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// A JetStream stream of the trial's own, capturing one subject; deleted
/// by [`Stream::delete`].
pub(super) struct Stream {
    jetstream: jetstream::Context,
    pub name: String,
    pub subject: String,
}

impl Stream {
    /// Creates stream `name` on the server at `url` (`nats://HOST:PORT`),
    /// capturing `name` as its subject. It keeps messages an hour: past the
    /// trial, within the consumer's dedupe window.
    pub(super) async fn create(url: &str, name: String) -> anyhow::Result<Self> {
        let client = async_nats::connect(url)
            .await
            .with_context(|| format!("cannot reach NATS at {}", idem::redact_url(url)))?;
        Self::create_with(client, name, 1).await
    }

    /// The same through `client`, the stream replicated on `replicas`
    /// servers of its cluster.
    pub(super) async fn create_with(
        client: async_nats::Client,
        name: String,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        let jetstream = jetstream::new(client);
        let subject = name.clone();
        jetstream
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                max_age: std::time::Duration::from_secs(3600),
                num_replicas: replicas,
                ..jetstream::stream::Config::default()
            })
            .await
            .with_context(|| {
                format!("cannot create the JetStream stream {name}; does the server run with -js?")
            })?;
        Ok(Self {
            jetstream,
            name,
            subject,
        })
    }

    /// Deletes the stream, and its consumers with it.
    pub(super) async fn delete(self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
    }
}

/// The host and port a broker URL names, resolved (`localhost` included).
pub(super) fn address(url: &str) -> anyhow::Result<SocketAddr> {
    let (_, authority) = split(url);
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let with_port = if host_port.ends_with(']') || !host_port.contains(':') {
        let port = if url.starts_with("nats") { 4222 } else { 5672 };
        format!("{host_port}:{port}")
    } else {
        host_port.to_owned()
    };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", idem::redact_url(url)))?
        .next()
        .with_context(|| format!("{} resolves to nothing", idem::redact_url(url)))
}

/// `url` with its host and port replaced by `addr`, credentials and path
/// kept: how a client is pointed at the fault proxy instead.
pub(super) fn through(url: &str, addr: SocketAddr) -> String {
    let (scheme, authority) = split(url);
    let rest = &url[scheme.len() + 3 + authority.len()..];
    let credentials = authority
        .rsplit_once('@')
        .map(|(credentials, _)| format!("{credentials}@"))
        .unwrap_or_default();
    format!("{scheme}://{credentials}{addr}{rest}")
}

/// The scheme, and the authority between `://` and the path.
fn split(url: &str) -> (&str, &str) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    (scheme, authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_pointed_through_the_proxy() {
        let proxy: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        assert_eq!(
            through("amqp://guest:guest@127.0.0.1:5672/%2f", proxy),
            "amqp://guest:guest@127.0.0.1:40000/%2f"
        );
        assert_eq!(
            through("nats://127.0.0.1:4222", proxy),
            "nats://127.0.0.1:40000"
        );
        assert_eq!(
            through("amqp://localhost/%2f?queue=q", proxy),
            "amqp://127.0.0.1:40000/%2f?queue=q"
        );
    }

    #[test]
    fn a_broker_url_names_its_address() {
        assert_eq!(
            address("amqp://guest:guest@127.0.0.1:5673/%2f").unwrap(),
            "127.0.0.1:5673".parse().unwrap()
        );
        assert_eq!(
            address("nats://127.0.0.1").unwrap(),
            "127.0.0.1:4222".parse().unwrap()
        );
        assert_eq!(address("amqp://localhost/%2f").unwrap().port(), 5672);
    }
}
