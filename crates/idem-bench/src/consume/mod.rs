//! `idem bench consume`: messages per second through an effectively-once
//! consumer (apply, commit, ack) against a plain at-least-once consumer doing
//! the same effect with no dedupe (run the debit, commit, ack), on the same
//! broker and the same database, in one run; one message per transaction and
//! batches. It exists to answer what the dedupe costs a consumer, which only
//! a baseline measured alongside can tell.
//!
//! This module runs the phases: each gets a fresh queue (or stream) filled
//! beforehand, so only consuming is timed, and the phases take turns in
//! rounds, so drift during the run (a checkpoint, a vacuum, a noisy
//! neighbour) falls on all of them. The consumers are in
//! [`effectively_once`] and [`plain`], the queues in [`broker`], and
//! [`report`] prints the medians of each round's ratios. Ratios, not absolute
//! numbers, carry between machines.

mod broker;
mod effectively_once;
mod plain;
mod report;

use std::time::{Duration, Instant};

use anyhow::Context;
use idem::{IdempotencyKey, RecordStore, StoreLocation};
use idem_broker::consume::{ConsumerStore, SourceOptions};
use idem_demo::ledger::{DebitError, Ledger};
use idem_demo::workload::{Bank, Payment};

use crate::args::BenchConsumeArgs;
use crate::stores::{FreshDatabase, behind_latency};
use broker::BenchBroker;
use report::Report;

/// Batches applied at once in the batch phases (the runtime's default).
const BATCHES_AT_ONCE: usize = idem_broker::consume::DEFAULT_BATCHES_AT_ONCE;

/// Which consumer a phase runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consumer {
    /// At-least-once, no dedupe: the baseline.
    Plain,
    /// Through Idem's consumer runtime.
    EffectivelyOnce,
}

/// How a phase's consumer takes its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One message per transaction, several at once.
    Single,
    /// `--batch` messages per transaction.
    Batch,
}

/// The phases of a round, in the order they run; the report's ratios are
/// taken between them.
const PHASES: [(Consumer, Mode); 4] = [
    (Consumer::Plain, Mode::Single),
    (Consumer::EffectivelyOnce, Mode::Single),
    (Consumer::Plain, Mode::Batch),
    (Consumer::EffectivelyOnce, Mode::Batch),
];

/// Runs the benchmark on `store`, or on a fresh PostgreSQL database made on
/// `--postgres-server` for the run.
pub(crate) async fn run(
    store: Option<StoreLocation>,
    args: &BenchConsumeArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.messages > 0 && args.batch > 0 && args.concurrency > 0 && args.accounts > 0,
        "--messages, --batch, --concurrency and --accounts must be positive"
    );
    let run_id: u32 = rand::random();
    let (_fresh, location) = match store {
        Some(location) => (None, location),
        None => {
            let db = FreshDatabase::create(&args.postgres_server, "consume", run_id).await?;
            let location = db.location();
            (Some(db), location)
        }
    };
    let (location, link) = match args.db_latency {
        Some(one_way) => {
            let (location, link) = behind_latency(&location, one_way)?;
            (location, Some(link))
        }
        None => (location, None),
    };
    let bank = Bank::open(&location).await?;
    bank.reset(args.accounts, i64::MAX / 2).await?;
    let broker = BenchBroker::new(args, run_id);
    println!(
        "broker {}; store {location}; {} messages per phase, {} at once in single mode, batches of {}",
        broker.name(),
        args.messages,
        args.concurrency,
        args.batch
    );
    if let Some(one_way) = args.db_latency {
        println!(
            "every byte to and from PostgreSQL is delayed by {} each way",
            humantime::format_duration(one_way)
        );
    }

    // A short warm-up of both consumers, not timed.
    let warm = args.messages.min(500);
    for consumer in [Consumer::Plain, Consumer::EffectivelyOnce] {
        phase(&broker, &bank, args, warm, (consumer, Mode::Single), "warm").await?;
    }
    let rounds = args.rounds.clamp(1, args.messages);
    let mut report = Report::new(PHASES.map(|phase| label(phase, args.batch)), rounds);
    for round in 0..rounds {
        let share = args.messages / rounds + usize::from(round < args.messages % rounds);
        let tag = format!("r{round}");
        let mut elapsed = [Duration::ZERO; PHASES.len()];
        for (i, &kind) in PHASES.iter().enumerate() {
            elapsed[i] = phase(&broker, &bank, args, share, kind, &tag).await?;
            report.progress(round, i, share, elapsed[i]);
        }
        report.round(share, elapsed);
    }

    if let (Some(configured), Some(measured)) =
        (args.db_latency, link.as_ref().and_then(|l| l.mean_delay()))
    {
        report::delay(configured, measured);
    }
    let ledger = bank.totals().await?;
    let expected = (warm * 2 + args.messages * 4) as i64;
    anyhow::ensure!(
        ledger.entries == expected,
        "{} effects were applied where {expected} were expected",
        ledger.entries
    );
    report.print(args.batch);
    Ok(())
}

/// What a phase is called in the report.
fn label((consumer, mode): (Consumer, Mode), batch: usize) -> String {
    let consumer = match consumer {
        Consumer::Plain => "plain at-least-once",
        Consumer::EffectivelyOnce => "effectively-once",
    };
    match mode {
        Mode::Single => format!("{consumer}, 1 per tx"),
        Mode::Batch => format!("{consumer}, batch {batch}"),
    }
}

/// One phase of a round (`round` names it in the queue's name): a fresh
/// queue or stream, filled, then consumed to the end; only consuming is
/// timed.
async fn phase<S: Ledger + RecordStore + ConsumerStore>(
    broker: &BenchBroker,
    bank: &Bank<S>,
    args: &BenchConsumeArgs,
    messages: usize,
    (consumer, mode): (Consumer, Mode),
    round: &str,
) -> anyhow::Result<Duration> {
    let tag = format!(
        "{round}-{}{}",
        match consumer {
            Consumer::Plain => "plain",
            Consumer::EffectivelyOnce => "idem",
        },
        match mode {
            Mode::Single => "1",
            Mode::Batch => "b",
        }
    );
    let queue = broker.declare(&tag).await?;
    let result = async {
        broker
            .fill(&queue, &tag, messages, |i| body(i, args.accounts))
            .await?;
        let prefetch = match mode {
            Mode::Single => (args.concurrency * 8).max(64),
            Mode::Batch => args.batch * (BATCHES_AT_ONCE + 1),
        };
        let options = SourceOptions {
            prefetch: u16::try_from(prefetch).unwrap_or(u16::MAX),
            ack_wait: Duration::from_secs(30),
            per_partition: match mode {
                Mode::Single => 1,
                Mode::Batch => args.batch,
            },
        };
        let transport = queue
            .source
            .connect(options)
            .await
            .with_context(|| format!("cannot consume {}", queue.source))?;
        let started = Instant::now();
        match consumer {
            Consumer::Plain => plain::consume(transport, bank, args, mode, messages).await?,
            Consumer::EffectivelyOnce => {
                effectively_once::consume(transport, bank, args, mode, messages).await?
            }
        }
        Ok::<_, anyhow::Error>(started.elapsed())
    }
    .await;
    broker.delete(&queue).await;
    result
}

/// The body of the `i`-th message of a phase: a debit of 1 from one of
/// `accounts` accounts.
fn body(i: usize, accounts: i64) -> Vec<u8> {
    serde_json::json!({ "account": i as i64 % accounts, "amount": 1 })
        .to_string()
        .into_bytes()
}

/// The debit a message asks for.
fn payment(key: IdempotencyKey, payload: &[u8]) -> Result<Payment, DebitError> {
    #[derive(serde::Deserialize)]
    struct Body {
        account: i64,
        amount: i64,
    }
    let body: Body = serde_json::from_slice(payload)?;
    Ok(Payment {
        id: key,
        account: body.account,
        amount: body.amount,
    })
}
