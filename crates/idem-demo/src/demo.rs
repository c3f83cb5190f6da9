//! The demo run: the payment workload, each message delivered 1–3 times in
//! shuffled order to several concurrent workers, handled once by a naive
//! handler and once through Idem. The table shows what duplicates cost without
//! dedupe and that Idem applies each payment once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{Applied, ApplyError, Error, IdempotencyKey, StoreLocation};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::ledger::Ledger;
use crate::store::given_or_temporary;
use crate::workload::{Bank, Payment, Totals};

/// The demo's flags: `idem demo` and the `idem-demo` binary take them alike.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Payments in the workload.
    #[arg(long, default_value_t = 2000)]
    pub payments: usize,
    /// Accounts the payments debit.
    #[arg(long, default_value_t = 20)]
    pub accounts: i64,
    /// Concurrent workers consuming the deliveries.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Seed for the workload and the delivery order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

const OPENING_BALANCE: i64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handler {
    Naive,
    Idem,
}

#[derive(Debug, Default)]
struct Tally {
    deliveries: u64,
    replayed: u64,
    redelivered: u64,
}

#[derive(Debug)]
struct Run {
    tally: Tally,
    ledger: Totals,
}

/// Runs the demo on the store at `location` (a temporary SQLite file, removed
/// after the run, when `None`) and prints the table; fails if Idem applied a
/// payment twice or missed one.
pub async fn run(location: Option<StoreLocation>, args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.accounts > 0, "--accounts must be at least 1");
    anyhow::ensure!(args.workers > 0, "--workers must be at least 1");
    let (_temporary, location) = given_or_temporary(location)?;
    let bank = Bank::open(&location).await?;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let run: u32 = rand::rng().random();
    let payments: Vec<Payment> = (0..args.payments)
        .map(|i| Payment {
            id: IdempotencyKey::new(format!("pay-{run:08x}-{i:06}")).expect("valid key"),
            account: rng.random_range(0..args.accounts),
            amount: rng.random_range(1..=500),
        })
        .collect();
    let deliveries = deliver_at_least_once(&payments, 3, &mut rng);
    let expected: i64 = payments.iter().map(|p| p.amount).sum();

    println!(
        "{} payments, {} deliveries (each payment 1-3 times, shuffled), {} workers, store {location}\n",
        payments.len(),
        deliveries.len(),
        args.workers
    );
    let naive = deliver(&bank, &deliveries, args, Handler::Naive).await?;
    let idem = deliver(&bank, &deliveries, args, Handler::Idem).await?;

    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["", "naive handler", "with Idem"]);
    let both = |f: &dyn Fn(&Run) -> String| [f(&naive), f(&idem)];
    let rows: [(&str, [String; 2]); 7] = [
        ("operations", both(&|_| payments.len().to_string())),
        ("deliveries", both(&|r| r.tally.deliveries.to_string())),
        ("effects applied", both(&|r| r.ledger.entries.to_string())),
        (
            "double effects",
            both(&|r| (r.ledger.entries - r.ledger.distinct).to_string()),
        ),
        (
            "duplicates suppressed",
            both(&|r| r.tally.replayed.to_string()),
        ),
        (
            "redelivered (in flight)",
            both(&|r| r.tally.redelivered.to_string()),
        ),
        (
            "amount debited",
            both(&|r| format!("{} (expected {expected})", r.ledger.debited)),
        ),
    ];
    for (name, [a, b]) in rows {
        table.add_row([name.to_owned(), a, b]);
    }
    println!("{table}");
    println!(
        "\nDelivery at-least-once, processing effectively-once by idempotency keys, dedupe window 7 days."
    );
    let doubled = idem.ledger.entries - idem.ledger.distinct;
    anyhow::ensure!(
        doubled == 0
            && idem.ledger.debited == expected
            && idem.ledger.distinct == payments.len() as i64,
        "Idem applied {doubled} double effects and debited {} of {expected}: this is a bug, please report it",
        idem.ledger.debited
    );
    Ok(())
}

/// At-least-once delivery, simulated: each payment copied 1 to `max_copies`
/// times, then the whole list shuffled.
fn deliver_at_least_once(
    payments: &[Payment],
    max_copies: usize,
    rng: &mut StdRng,
) -> Vec<Payment> {
    let mut deliveries = Vec::with_capacity(payments.len() * (max_copies + 1) / 2);
    for payment in payments {
        for _ in 0..rng.random_range(1..=max_copies) {
            deliveries.push(payment.clone());
        }
    }
    deliveries.shuffle(rng);
    deliveries
}

async fn deliver<S: Ledger>(
    bank: &Bank<S>,
    deliveries: &[Payment],
    args: &DemoArgs,
    handler: Handler,
) -> anyhow::Result<Run> {
    bank.reset(args.accounts, OPENING_BALANCE).await?;
    let queue = Arc::new(Mutex::new(
        deliveries.iter().cloned().collect::<VecDeque<_>>(),
    ));
    let workers: Vec<_> = (0..args.workers)
        .map(|_| {
            let (bank, queue) = (bank.clone(), Arc::clone(&queue));
            tokio::spawn(async move { work(&bank, &queue, handler).await })
        })
        .collect();
    let mut tally = Tally::default();
    for worker in workers {
        let t = worker.await??;
        tally.deliveries += t.deliveries;
        tally.replayed += t.replayed;
        tally.redelivered += t.redelivered;
    }
    Ok(Run {
        tally,
        ledger: bank.totals().await?,
    })
}

/// One worker: takes deliveries until none are left. A delivery answered
/// "in flight" goes back to the queue, as a broker would redeliver it.
async fn work<S: Ledger>(
    bank: &Bank<S>,
    queue: &Mutex<VecDeque<Payment>>,
    handler: Handler,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    loop {
        let Some(payment) = queue.lock().expect("queue poisoned").pop_front() else {
            return Ok(tally);
        };
        tally.deliveries += 1;
        match handler {
            Handler::Naive => bank.debit_bare(&payment).await?,
            Handler::Idem => match bank.debit_once(&payment).await {
                Ok(Applied::Fresh(_)) => {}
                Ok(Applied::Replayed(_)) => tally.replayed += 1,
                Err(ApplyError::Protocol(Error::InFlight { .. })) => {
                    tally.redelivered += 1;
                    tally.deliveries -= 1;
                    queue.lock().expect("queue poisoned").push_back(payment);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) => return Err(anyhow::anyhow!(e).context("a payment failed")),
            },
        }
    }
}
