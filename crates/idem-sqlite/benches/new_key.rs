//! What a new key costs the SQLite store, measured the way the gateway uses
//! it: N new keys from C concurrent tasks through [`SqliteStore`] in leased
//! mode (a claim, then its completion), on a fresh file, with
//! `synchronous=FULL`.
//!
//! ```text
//! cargo bench -p idem-sqlite --bench new_key -- [--keys N] [--tasks C] [--rounds R] [--normal]
//! ```
//!
//! Two phases on two stores of the same file, in turn within each round: the
//! claims and completions as generic grouped jobs, each in a savepoint of its
//! own ("grouped jobs", the baseline), and as lease jobs the writer decides
//! and writes in batches ("lease batches"). The ratios are taken within a
//! round (the machine may be shared), then the medians printed. CPU is the
//! whole process's (`/proc/self/stat`): the tasks, the runtime's workers and
//! the writer thread, divided by the keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use idem_core::{Claimed, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Scope};
use idem_sqlite::{SqliteStore, Synchronous};

/// What the command line asked for.
struct Args {
    keys: usize,
    tasks: usize,
    rounds: usize,
    synchronous: Synchronous,
}

fn args() -> Args {
    let mut args = Args {
        keys: 20_000,
        tasks: 64,
        rounds: 3,
        synchronous: Synchronous::Full,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        let mut number = |name: &str| -> usize {
            given
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match arg.as_str() {
            "--keys" => args.keys = number("--keys"),
            "--tasks" => args.tasks = number("--tasks"),
            "--rounds" => args.rounds = number("--rounds"),
            "--normal" => args.synchronous = Synchronous::Normal,
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// A phase: one way of running claims and completions.
struct Phase {
    name: &'static str,
    store: SqliteStore,
}

/// The process's CPU time so far (user and system, every thread), in
/// microseconds.
fn cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // The command name is in parentheses and may hold spaces: count from after it.
    let after = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // USER_HZ is 100 on Linux.
    ticks as f64 * 10_000.0
}

/// Claims and completes `keys` new keys from `tasks` tasks; keys per second.
async fn run(store: &SqliteStore, tag: &str, keys: usize, tasks: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut running = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let next = next.clone();
        let store = store.clone();
        let tag = tag.to_owned();
        running.push(tokio::spawn(async move {
            let scope = Scope::new("bench-new-key").expect("scope");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return;
                }
                let key = IdempotencyKey::new(format!("{tag}-{i}")).expect("key");
                let fingerprint = Fingerprint::of_bytes(key.as_str().as_bytes());
                let claimed = store.claim(&scope, &key, fingerprint).await.expect("claim");
                let Claimed::Fresh(claim) = claimed else {
                    panic!("a new key is claimed, not replayed");
                };
                store
                    .complete(&claim, &Outcome::success("ok"))
                    .await
                    .expect("complete");
            }
        }));
    }
    for task in running {
        task.await.expect("task");
    }
    keys as f64 / started.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`. A test runner that lists or runs every
    // target of the workspace finds no tests here, and no benchmark starts.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let args = args();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idem.db");
    let open = |batched: bool| {
        SqliteStore::builder(&path)
            .synchronous(args.synchronous)
            .lease_batches(batched)
            .open()
    };
    let phases = vec![
        Phase {
            name: "grouped jobs",
            store: open(false).await.expect("open the store"),
        },
        Phase {
            name: "lease batches",
            store: open(true).await.expect("open the store"),
        },
    ];
    println!(
        "{} new keys per phase from {} tasks, {} rounds, synchronous={:?}",
        args.keys, args.tasks, args.rounds, args.synchronous
    );
    // A warm-up, not counted: statements prepared, the file grown.
    for phase in &phases {
        run(
            &phase.store,
            &format!("warm-{}", phase.name.replace(' ', "")),
            1_000,
            args.tasks,
        )
        .await;
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    for round in 1..=args.rounds {
        let mut line = format!("round {round}:");
        for (i, phase) in phases.iter().enumerate() {
            let tag = format!("{}-{round}", phase.name.replace(' ', ""));
            let before = cpu_us();
            let rate = run(&phase.store, &tag, args.keys, args.tasks).await;
            let spent = (cpu_us() - before) / args.keys as f64;
            rates[i].push(rate);
            cpu[i].push(spent);
            line += &format!(" {} {rate:.0}/s {spent:.1} µs", phase.name);
        }
        println!("{line}");
    }
    println!();
    println!("| phase | new keys/s | CPU µs per key |");
    println!("| --- | ---: | ---: |");
    for ((phase, rates), cpu) in phases.iter().zip(&rates).zip(&cpu) {
        println!(
            "| {} | {:.0} | {:.1} |",
            phase.name,
            median(rates.clone()),
            median(cpu.clone())
        );
    }
    let ratio: Vec<f64> = rates[1].iter().zip(&rates[0]).map(|(n, o)| n / o).collect();
    let cpu_ratio: Vec<f64> = cpu[1].iter().zip(&cpu[0]).map(|(n, o)| n / o).collect();
    println!();
    println!(
        "ratios within each round, medians: keys/s {:.2}×, CPU per key {:.2}×",
        median(ratio),
        median(cpu_ratio)
    );
}
