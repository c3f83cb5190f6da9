//! The consumer under test: Idem's consumer runtime (`idem-broker`) taking
//! each message's key, applying its debit once with the record committed in
//! the debit's transaction, and acking after the commit — one message per
//! transaction, or a batch per transaction.
//!
//! The debit is handed to the runtime as an [`Apply`] written once against
//! the store's atomic contract, with the choice the broker's own atomic
//! effects make: a first delivery is most likely new, so its key is claimed
//! before a stored outcome is looked for; a redelivery looks first.

use std::sync::Arc;
use std::time::Duration;

use idem::{Applied, ApplyError, Operation, Scope};
use idem_broker::consume::{
    Apply, ApplyBatch, BatchAnswer, Consumer, ConsumerConfig, ConsumerStore, KeyedMessage,
    Transport,
};

use super::{Mode, payment};
use crate::args::BenchConsumeArgs;
use crate::ledger::{DebitError, Ledger};
use crate::workload::Bank;

/// The workload's debit, applied once per message key.
struct DebitOnce<S> {
    bank: Bank<S>,
}

impl<S: Ledger + ConsumerStore> Apply for DebitOnce<S> {
    type Error = DebitError;
    type Store = S;

    fn store(&self) -> &S {
        self.bank.store()
    }

    async fn apply(&self, message: Arc<KeyedMessage>) -> Result<Applied, ApplyError<DebitError>> {
        let payment =
            payment(message.key.clone(), message.payload()).map_err(ApplyError::Effect)?;
        let first_delivery = message.message.delivery_count == Some(1);
        self.bank
            .debit_once_as(&message.operation(), &payment, first_delivery)
            .await
    }
}

impl<S: Ledger + ConsumerStore> ApplyBatch for DebitOnce<S> {
    async fn apply_batch(&self, messages: Vec<Arc<KeyedMessage>>) -> BatchAnswer<DebitError> {
        let ops: Vec<Operation> = messages.iter().map(|m| m.operation()).collect();
        let payments = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                payment(m.key.clone(), m.payload()).map_err(|e| ApplyError::Effect((i, e)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.bank.debit_batch_as(&ops, payments).await
    }
}

/// Consumes `messages` deliveries through Idem's consumer runtime.
pub(super) async fn consume<T: Transport, S: Ledger + ConsumerStore>(
    transport: T,
    bank: &Bank<S>,
    args: &BenchConsumeArgs,
    mode: Mode,
    messages: usize,
) -> anyhow::Result<()> {
    let config = ConsumerConfig::new(Scope::new("bench-consume")?)
        .concurrency(args.concurrency)
        .batch(args.batch, Duration::from_millis(5));
    let apply = DebitOnce { bank: bank.clone() };
    let consumer = Consumer::new(transport, apply, config);
    let stats = consumer.stats();
    let done = async {
        while (stats.snapshot().acked() as usize) < messages {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let finished = match mode {
        Mode::Single => consumer.run(done).await?,
        Mode::Batch => consumer.run_batched(done).await?,
    };
    anyhow::ensure!(
        finished.applied as usize == messages,
        "the effectively-once consumer applied {} of {messages} messages ({finished:?})",
        finished.applied
    );
    Ok(())
}
