//! The consumer under test: Idem's consumer runtime (`idem-broker`) taking
//! each message's key, applying its debit once through [`AtomicApply`] — the
//! record committed in the debit's transaction, a first delivery's key
//! claimed before a stored outcome is looked for — and acking after the
//! commit; one message per transaction, or a batch per transaction.

use std::sync::Arc;
use std::time::Duration;

use idem::{Outcome, RecordStore, Scope};
use idem_broker::consume::{
    AtomicApply, Consumer, ConsumerConfig, ConsumerStore, KeyedMessage, Transport,
};

use super::{Mode, payment};
use crate::args::BenchConsumeArgs;
use crate::ledger::{DebitError, Ledger};
use crate::workload::Bank;

/// Consumes `messages` deliveries through Idem's consumer runtime.
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
    let debit = AtomicApply::new(bank.store().clone(), |message: Arc<KeyedMessage>| {
        async move |tx: &mut S::Tx| -> Result<Outcome, DebitError> {
            let p = payment(message.key.clone(), message.payload())?;
            S::debit(tx, &p).await
        }
    });
    let consumer = Consumer::new(transport, debit, config);
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
