//! `idem bench apply`: what atomic apply costs next to the business
//! transaction it wraps. In one run, on one database: the bare transaction (a
//! balance update and a ledger row, no dedupe — the baseline), the same
//! transaction through atomic apply (on PostgreSQL also replay-first, as
//! consumers use it for redeliveries), replays of those keys, and batched
//! apply; ops/s and ratios to bare. Ratios, not absolute numbers, are what
//! carry between machines.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{Applied, ApplyError, Error, IdempotencyKey, StoreLocation};
use idem_demo::ledger::Ledger;
use idem_demo::store::given_or_temporary;
use idem_demo::workload::{Bank, Payment};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::args::BenchApplyArgs;

/// The scope prefilled records are written in: apart from the workload's.
const PREFILL_SCOPE: &str = "bench-prefill";

/// A phase's operations and the time they took.
struct Phase {
    name: &'static str,
    ops: usize,
    elapsed: Duration,
}

impl Phase {
    fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `op` over `items` with `concurrency` concurrent clients.
async fn measure<'a, T, F, Fut>(
    concurrency: usize,
    items: &'a [T],
    op: F,
) -> anyhow::Result<Duration>
where
    F: Fn(&'a T) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let clients = (0..concurrency.max(1)).map(|_| async {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return Ok::<_, anyhow::Error>(());
            };
            op(item).await?;
        }
    });
    for result in futures::future::join_all(clients).await {
        result?;
    }
    Ok(start.elapsed())
}

/// The crash points a fresh atomic apply passes: after the claim, after the
/// effect, after the commit.
const CRASH_POINTS_PER_APPLY: usize = 3;

/// What passing one crash point costs while none is armed, timed over many
/// passes in this process.
fn crash_point_cost() -> Duration {
    const PASSES: u32 = 10_000_000;
    let start = Instant::now();
    for _ in 0..PASSES {
        idem::crash::point(std::hint::black_box(idem::crash::AFTER_CLAIM));
    }
    start.elapsed() / PASSES
}

/// Applies once, redelivering while another client holds the key.
async fn apply_until_answered<S: Ledger>(bank: &Bank<S>, p: &Payment) -> anyhow::Result<Applied> {
    loop {
        match bank.debit_once(p).await {
            Ok(applied) => return Ok(applied),
            Err(ApplyError::Protocol(Error::InFlight { .. })) => tokio::task::yield_now().await,
            Err(e) => return Err(anyhow::anyhow!(e)),
        }
    }
}

/// The share of its time the sweeper may spend deleting while the sweeping
/// phase runs.
const SWEEP_BUSY_SHARE: f64 = 0.1;

/// Records per prefill transaction.
const PREFILL_CHUNK: u64 = 200_000;

/// Fills the dedupe table with `count` completed records spread over the
/// retention window, a chunk per transaction, with a progress bar; then
/// reports the table's size per million keys.
async fn prefill<S: Ledger>(
    bank: &Bank<S>,
    count: u64,
    run: u32,
    expired: bool,
) -> anyhow::Result<()> {
    if count == 0 {
        return Ok(());
    }
    let started = Instant::now();
    let bar = indicatif::ProgressBar::new(count).with_style(
        indicatif::ProgressStyle::with_template(
            "prefill {bar:40} {human_pos}/{human_len} records, {per_sec}, {eta} left",
        )
        .expect("a valid template"),
    );
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_millis(),
    )?;
    let window_ms = i64::try_from(idem::DEFAULT_RETENTION.as_millis())?;
    // Expired records were created a whole window earlier: each window ended
    // before now.
    let (now_ms, tag) = if expired {
        (now_ms - window_ms - 1, format!("{run:08x}-expired"))
    } else {
        (now_ms, format!("{run:08x}"))
    };
    let mut from = 0;
    while from < count {
        let chunk = PREFILL_CHUNK.min(count - from);
        bank.prefill(idem::protocol::RecordSeed {
            scope: idem::Scope::new(PREFILL_SCOPE)?,
            tag: tag.clone(),
            from: i64::try_from(from)?,
            count: i64::try_from(chunk)?,
            now: idem::Timestamp(now_ms),
            window: idem::DEFAULT_RETENTION,
        })
        .await?;
        from += chunk;
        bar.set_position(from);
    }
    bar.finish_and_clear();
    let bytes = bank.analyze_records().await?;
    println!(
        "prefilled {count} {} records in {:.1} s; the dedupe table holds {:.0} MiB, {:.0} MiB per million keys (indexes included)",
        if expired { "expired" } else { "completed" },
        started.elapsed().as_secs_f64(),
        bytes as f64 / (1u64 << 20) as f64,
        bytes as f64 / (1u64 << 20) as f64 / (count as f64 / 1e6),
    );
    Ok(())
}

/// Runs the benchmark on `location`, or on a temporary SQLite file.
pub(crate) async fn run(
    location: Option<StoreLocation>,
    args: &BenchApplyArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.ops > 0 && args.batch > 0 && args.accounts > 0,
        "--ops, --batch and --accounts must be positive"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.duplicates),
        "--duplicates is a share between 0.0 and 1.0"
    );
    let (_temporary, location) = given_or_temporary(location)?;
    let bank = Bank::open(&location).await?;
    bank.reset(args.accounts, i64::MAX / 2).await?;
    let run: u32 = rand::rng().random();
    let payments = |phase: &str, n: usize| -> Vec<Payment> {
        (0..n)
            .map(|i| Payment {
                id: IdempotencyKey::new(format!("bench-{run:08x}-{phase}-{i}")).expect("valid key"),
                account: i as i64 % args.accounts,
                amount: 1,
            })
            .collect()
    };
    println!(
        "store {location}; {} ops per phase, {} clients, duplicate share {}, batch {}",
        args.ops, args.concurrency, args.duplicates, args.batch
    );
    prefill(&bank, args.prefill, run, false).await?;
    prefill(&bank, args.expired, run, true).await?;

    let warm = payments("warm", 200);
    measure(args.concurrency, &warm, |p| bank.debit_bare(p)).await?;
    measure(args.concurrency, &warm, |p| async {
        apply_until_answered(&bank, p).await.map(drop)
    })
    .await?;

    let bare = payments("bare", args.ops);
    let bare = Phase {
        name: "bare transaction (no dedupe)",
        ops: args.ops,
        elapsed: measure(args.concurrency, &bare, |p| bank.debit_bare(p)).await?,
    };

    let unique = payments("apply", args.ops);
    let mut deliveries = unique.clone();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let extra = (args.ops as f64 * args.duplicates).round() as usize;
    for _ in 0..extra {
        deliveries.push(unique[rng.random_range(0..unique.len())].clone());
    }
    deliveries.shuffle(&mut rng);
    let atomic = Phase {
        name: "atomic apply (first delivery)",
        ops: deliveries.len(),
        elapsed: measure(args.concurrency, &deliveries, |p| async {
            apply_until_answered(&bank, p).await.map(drop)
        })
        .await?,
    };

    let replay_first = if bank.store().replays_first() {
        let fresh = payments("replay-first", args.ops);
        Some(Phase {
            name: "atomic apply, replay first",
            ops: fresh.len(),
            elapsed: measure(args.concurrency, &fresh, |p| async {
                let applied = bank
                    .debit_replay_first(p)
                    .await
                    .context("replay-first apply needs PostgreSQL")?
                    .map_err(|e| anyhow::anyhow!(e))?;
                anyhow::ensure!(!applied.is_replay(), "a new key was answered as a replay");
                Ok(())
            })
            .await?,
        })
    } else {
        None
    };

    let replay = Phase {
        name: "replay of duplicates",
        ops: unique.len(),
        elapsed: measure(args.concurrency, &unique, |p| async {
            let applied = apply_until_answered(&bank, p).await?;
            anyhow::ensure!(applied.is_replay(), "a duplicate was applied again");
            Ok(())
        })
        .await?,
    };

    let batched: Vec<Vec<Payment>> = payments("batch", args.ops)
        .chunks(args.batch)
        .map(<[Payment]>::to_vec)
        .collect();
    let batch = Phase {
        name: "batched apply",
        ops: args.ops,
        elapsed: measure(args.concurrency, &batched, |chunk| async {
            let answers = bank.debit_batch(chunk).await.map_err(|e| match e {
                ApplyError::Protocol(e) => anyhow::anyhow!(e),
                ApplyError::Effect((i, e)) => {
                    anyhow::anyhow!("operation {i} of a batch failed: {e}")
                }
            })?;
            for answer in answers {
                answer.context("a batched operation was refused")?;
            }
            Ok(())
        })
        .await?,
    };

    let sets: Vec<Vec<Payment>> = payments("set", args.ops)
        .chunks(args.batch)
        .map(<[Payment]>::to_vec)
        .collect();
    let set = Phase {
        name: "batched apply, one set statement",
        ops: args.ops,
        elapsed: measure(args.concurrency, &sets, |chunk| async {
            let answers = bank.debit_set(chunk).await.map_err(|e| match e {
                ApplyError::Protocol(e) => anyhow::anyhow!(e),
                ApplyError::Effect(e) => anyhow::anyhow!("a set of debits failed: {e}"),
            })?;
            for answer in answers {
                answer.context("an operation of a set was refused")?;
            }
            Ok(())
        })
        .await?,
    };

    let sweeping = if args.expired > 0 {
        let fresh = payments("unswept", args.ops);
        let unswept = Phase {
            name: "atomic apply, no sweep",
            ops: fresh.len(),
            elapsed: measure(args.concurrency, &fresh, |p| async {
                apply_until_answered(&bank, p).await.map(drop)
            })
            .await?,
        };
        let fresh = payments("swept", args.ops);
        let sweeper = idem::Sweeper::new(bank.store().clone()).busy_share(SWEEP_BUSY_SHARE);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let sweep = async {
            let mut deleted = 0;
            while !stop.load(Ordering::Relaxed) {
                let pass = sweeper.pass().await.context("a sweep pass failed")?;
                deleted += pass.deleted;
                if pass.deleted == 0 {
                    break;
                }
            }
            anyhow::Ok(deleted)
        };
        let load = async {
            let elapsed = measure(args.concurrency, &fresh, |p| async {
                apply_until_answered(&bank, p).await.map(drop)
            })
            .await;
            stop.store(true, Ordering::Relaxed);
            elapsed
        };
        let (deleted, elapsed) = tokio::join!(sweep, load);
        let (deleted, elapsed) = (deleted?, elapsed?);
        let swept = Phase {
            name: "atomic apply, sweeping",
            ops: fresh.len(),
            elapsed,
        };
        Some((unswept, swept, deleted))
    } else {
        None
    };

    let ledger = bank.totals().await?;
    let expected = (warm.len() * 2
        + args.ops
            * (4 + usize::from(replay_first.is_some()) + 2 * usize::from(sweeping.is_some())))
        as i64;
    anyhow::ensure!(
        ledger.entries == expected,
        "{} effects were applied where {expected} were expected",
        ledger.entries
    );

    let base = bare.per_second();
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["phase", "ops", "seconds", "ops/s", "× bare"]);
    for phase in [
        Some(&bare),
        Some(&atomic),
        replay_first.as_ref(),
        Some(&replay),
        Some(&batch),
        Some(&set),
        sweeping.as_ref().map(|(unswept, _, _)| unswept),
        sweeping.as_ref().map(|(_, swept, _)| swept),
    ]
    .into_iter()
    .flatten()
    {
        table.add_row([
            phase.name.to_owned(),
            phase.ops.to_string(),
            format!("{:.2}", phase.elapsed.as_secs_f64()),
            format!("{:.0}", phase.per_second()),
            format!("{:.2}", phase.per_second() / base),
        ]);
    }
    println!("{table}");
    if let Some((unswept, swept, deleted)) = &sweeping {
        println!(
            "sweeping (busy {:.0} % of the time at most): {deleted} of {} expired records deleted during the phase; apply while sweeping ÷ without: {:.2}×   (target: ≥ 0.90×)",
            SWEEP_BUSY_SHARE * 100.0,
            args.expired,
            swept.per_second() / unswept.per_second()
        );
    }
    let point = crash_point_cost();
    println!(
        "crash points, none armed: {CRASH_POINTS_PER_APPLY} per apply × {:.1} ns = {:.4} % of an atomic apply's time   (target: under 1 %)",
        point.as_secs_f64() * 1e9,
        100.0 * CRASH_POINTS_PER_APPLY as f64 * point.as_secs_f64() * atomic.per_second()
    );
    println!(
        "replay ÷ atomic apply: {:.2}×   (targets on PostgreSQL with 8 clients: atomic ≥ 0.8× bare, replay ≥ 3× atomic, batched ≥ 3× bare)",
        replay.per_second() / atomic.per_second()
    );
    Ok(())
}
