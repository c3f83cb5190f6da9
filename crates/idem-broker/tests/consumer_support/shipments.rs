//! The last hop of the end-to-end outbox tests, whatever the broker: an
//! effectively-once consumer whose effect records each message's key in a
//! `shipments` table, in the transaction that records the key.

use std::sync::Arc;
use std::time::Duration;

use idem::{Outcome, SqliteStore};
use idem_broker::consume::{AtomicApply, Consumer, KeyedMessage, StatsSnapshot};

use super::{Broker, Running, config};

/// Consumes `broker` into `shipments` until `copies` deliveries were applied
/// or answered from the store, waits `linger` for anything more the broker
/// would hand out, and stops. Returns the consumer's final counters and the
/// keys of its effects.
pub(crate) async fn ship<B: Broker>(
    broker: &B,
    shipments: &SqliteStore,
    copies: u64,
    linger: Duration,
) -> (StatsSnapshot, Vec<String>) {
    shipments
        .with_connection(|c| c.execute_batch("CREATE TABLE shipments (key TEXT)"))
        .await
        .unwrap()
        .unwrap();
    let apply = AtomicApply::new(shipments.clone(), |message: Arc<KeyedMessage>| {
        async move |tx: &mut idem::rusqlite::Connection| -> idem::rusqlite::Result<Outcome> {
            tx.execute("INSERT INTO shipments VALUES (?1)", [message.key.as_str()])?;
            Ok(Outcome::success("shipped"))
        }
    });
    let consumer = Consumer::new(broker.transport().await, apply, config(broker.key_rule()));
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until(&format!("{copies} copies settled"), |s| {
            s.applied + s.replayed >= copies
        })
        .await;
    tokio::time::sleep(linger).await;
    let stats = running.stop().await;
    let keys = shipments
        .with_connection(|c| {
            let mut statement = c.prepare("SELECT key FROM shipments")?;
            let rows = statement.query_map([], |r| r.get(0))?;
            rows.collect::<Result<Vec<String>, _>>()
        })
        .await
        .unwrap()
        .unwrap();
    (stats, keys)
}
