//! The baseline of `idem bench consume`: a plain at-least-once consumer that
//! does the same debit with no keys and no records — the debit in its own
//! transaction (or one per batch), then the ack — with as many messages (or
//! batches) at once as the effectively-once consumer. What the dedupe costs is
//! the difference between the two.

use anyhow::Context;
use idem::IdempotencyKey;
use idem_broker::consume::{Delivery, Settle, Transport};
use idem_demo::ledger::Ledger;
use idem_demo::workload::{Bank, Payment};
use tokio::task::JoinSet;

use super::{BATCHES_AT_ONCE, Mode, payment};
use crate::args::BenchConsumeArgs;

/// Consumes `messages` deliveries with no dedupe.
pub(super) async fn consume<T: Transport, S: Ledger>(
    mut transport: T,
    bank: &Bank<S>,
    args: &BenchConsumeArgs,
    mode: Mode,
    messages: usize,
) -> anyhow::Result<()> {
    match mode {
        Mode::Single => {
            one_per_transaction(&mut transport, bank, args.concurrency, messages).await?
        }
        Mode::Batch => batched(&mut transport, bank, args.batch, messages).await?,
    }
    transport.close().await;
    Ok(())
}

/// The debit a delivery asks for; the key is not looked at.
fn debit_of(payload: &[u8]) -> anyhow::Result<Payment> {
    let key = IdempotencyKey::new("plain").expect("valid key");
    payment(key, payload).map_err(|e| anyhow::anyhow!(e))
}

/// `concurrency` messages at once, each debited in its own transaction and
/// acked after its commit.
async fn one_per_transaction<T: Transport, S: Ledger>(
    transport: &mut T,
    bank: &Bank<S>,
    concurrency: usize,
    messages: usize,
) -> anyhow::Result<()> {
    let mut done = 0;
    let mut working = JoinSet::new();
    while done < messages {
        while working.len() < concurrency && done + working.len() < messages {
            let delivery = transport.receive().await?.context("the queue ended")?;
            let bank = bank.clone();
            working.spawn(async move {
                bank.debit_bare(&debit_of(&delivery.message.payload)?)
                    .await?;
                delivery.settle.ack().await?;
                Ok::<_, anyhow::Error>(())
            });
        }
        if let Some(joined) = working.join_next().await {
            joined??;
            done += 1;
        }
    }
    Ok(())
}

/// Batches of up to `batch` messages, as many at once as the
/// effectively-once consumer runs (telling the transport where each batch
/// ends, as the runtime does); each batch is debited in one transaction, by
/// one set statement as the effectively-once batches are, and acks its own
/// deliveries one by one after its commit.
async fn batched<T: Transport, S: Ledger>(
    transport: &mut T,
    bank: &Bank<S>,
    batch: usize,
    messages: usize,
) -> anyhow::Result<()> {
    let mut done = 0;
    let mut working = JoinSet::new();
    let mut received = 0;
    while done < messages {
        while working.len() < BATCHES_AT_ONCE && received < messages {
            let want = batch.min(messages - received);
            let mut deliveries: Vec<Delivery<T::Settle>> = Vec::with_capacity(want);
            deliveries.push(transport.receive().await?.context("the queue ended")?);
            while deliveries.len() < want {
                match tokio::time::timeout(std::time::Duration::from_millis(5), transport.receive())
                    .await
                {
                    Ok(next) => deliveries.push(next?.context("the queue ended")?),
                    Err(_quiet) => break,
                }
            }
            transport.end_batch();
            received += deliveries.len();
            let bank = bank.clone();
            working.spawn(async move {
                let payments = deliveries
                    .iter()
                    .map(|d| debit_of(&d.message.payload))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                bank.debit_bare_set(&payments).await?;
                for delivery in &deliveries {
                    delivery.settle.ack().await?;
                }
                Ok::<_, anyhow::Error>(deliveries.len())
            });
        }
        if let Some(joined) = working.join_next().await {
            done += joined??;
        }
    }
    Ok(())
}
