//! The consumer under test: Idem's consumer runtime (`idem-broker`) taking
//! each message's key, applying its debit once through [`AtomicApply`] — the
//! record committed in the debit's transaction, a first delivery's key
//! claimed before a stored outcome is looked for — and acking after the
//! commit; one message per transaction, or a batch per transaction.

use std::sync::Arc;
use std::time::Duration;

use idem::{Outcome, RecordStore, Scope};
use idem_broker::consume::{
    AtomicApply, AtomicSetApply, Consumer, ConsumerConfig, ConsumerStore, KeyedMessage, Stats,
    Transport,
};
use idem_demo::ledger::{DebitError, Ledger};
use idem_demo::workload::Bank;

use super::{Mode, payment};
use crate::args::BenchConsumeArgs;

/// Consumes `messages` deliveries through Idem's consumer runtime. Single
/// messages are debited one by one; a batch's new messages are debited by one
/// set-based statement ([`AtomicSetApply`]).
pub(super) async fn consume<T, S>(
    transport: T,
    bank: &Bank<S>,
    args: &BenchConsumeArgs,
    mode: Mode,
    messages: usize,
) -> anyhow::Result<()>
where
    T: Transport,
    S: Ledger + RecordStore + ConsumerStore,
{
    let config = ConsumerConfig::new(Scope::new("bench-consume")?)
        .concurrency(args.concurrency)
        .batch(args.batch, Duration::from_millis(5));
    let finished = match mode {
        Mode::Single => {
            let debit = AtomicApply::new(bank.store().clone(), |message: Arc<KeyedMessage>| {
                async move |tx: &mut S::Tx| -> Result<Outcome, DebitError> {
                    let p = payment(message.key.clone(), message.payload())?;
                    S::debit(tx, &p).await
                }
            });
            let consumer = Consumer::new(transport, debit, config);
            let stats = consumer.stats();
            consumer.run(acked(&stats, messages)).await?
        }
        Mode::Batch => {
            let debit =
                AtomicSetApply::new(bank.store().clone(), |messages: Vec<Arc<KeyedMessage>>| {
                    async move |tx: &mut S::Tx| -> Result<Vec<Outcome>, DebitError> {
                        let payments = messages
                            .iter()
                            .map(|m| payment(m.key.clone(), m.payload()))
                            .collect::<Result<Vec<_>, _>>()?;
                        S::debit_set(tx, &payments).await
                    }
                });
            let consumer = Consumer::new(transport, debit, config);
            let stats = consumer.stats();
            consumer.run_batched(acked(&stats, messages)).await?
        }
    };
    anyhow::ensure!(
        finished.applied as usize == messages,
        "the effectively-once consumer applied {} of {messages} messages ({finished:?})",
        finished.applied
    );
    Ok(())
}

/// Completes once `messages` deliveries were acked.
async fn acked(stats: &Stats, messages: usize) {
    while (stats.snapshot().acked() as usize) < messages {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
