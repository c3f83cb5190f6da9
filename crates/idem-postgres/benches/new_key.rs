//! What a new key costs the PostgreSQL store, measured the way the store runs
//! it: N new keys from C concurrent tasks through [`PgStore`], in leased mode
//! (a claim, then its completion) and in atomic mode (`apply` with an effect
//! that writes nothing), on a fresh database. Leased mode runs twice: with
//! every claim and completion under the key's advisory lock ("locked", the
//! baseline) and with the one-statement claim and completion.
//!
//! ```text
//! cargo bench -p idem-postgres --bench new_key -- [SERVER_URL] [--keys N] [--tasks C] [--rounds R]
//! ```
//!
//! SERVER_URL defaults to `IDEM_TEST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/postgres`; a database
//! `idem_bench_new_key_<pid>` is made on it and dropped at the end. Group
//! commit is off: each claim and each completion is a call of its own.
//!
//! Each round runs every phase once, in turn, and the ratios are taken within
//! a round (the machine may be shared), then the medians printed. When the
//! server has `pg_stat_statements` loaded (`shared_preload_libraries`), the
//! statements of each phase's last round are printed per key: calls per key
//! and mean execution time, as the server counted them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use idem_core::{AtomicStore, Fingerprint, IdempotencyKey, LeaseStore, Outcome, Scope};
use idem_postgres::PgStore;
use sqlx::{Connection, PgConnection, Row};

/// What the command line asked for.
struct Args {
    server: String,
    keys: usize,
    tasks: usize,
    rounds: usize,
}

fn args() -> Args {
    let mut args = Args {
        server: std::env::var("IDEM_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned()),
        keys: 4_000,
        tasks: 32,
        rounds: 3,
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
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            url if !url.starts_with('-') => args.server = url.to_owned(),
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// One way of applying a new key.
#[derive(Clone, Copy)]
enum Mode {
    /// `claim`, then `complete`.
    Leased,
    /// `apply` with an effect that writes nothing.
    Atomic,
}

/// A phase: a mode on a store.
struct Phase {
    name: &'static str,
    mode: Mode,
    store: PgStore,
}

impl Phase {
    /// Whether `self` is the baseline `other` is compared with: the same
    /// mode, an earlier phase.
    fn baseline_of(&self, other: &Phase) -> bool {
        matches!(
            (self.mode, other.mode),
            (Mode::Leased, Mode::Leased) | (Mode::Atomic, Mode::Atomic)
        )
    }
}

/// Applies `keys` new keys from `tasks` tasks; keys per second.
async fn run(phase: &Phase, tag: &str, keys: usize, tasks: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut running = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let next = next.clone();
        let store = phase.store.clone();
        let mode = phase.mode;
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
                match mode {
                    Mode::Leased => {
                        let claimed = store.claim(&scope, &key, fingerprint).await.expect("claim");
                        let idem_core::Claimed::Fresh(claim) = claimed else {
                            panic!("a new key is claimed, not replayed");
                        };
                        store
                            .complete(&claim, &Outcome::success("ok"))
                            .await
                            .expect("complete");
                    }
                    Mode::Atomic => {
                        let applied = store
                            .apply(
                                &scope,
                                &key,
                                fingerprint,
                                async |_conn: &mut PgConnection| -> sqlx::Result<Outcome> {
                                    Ok(Outcome::success("ok"))
                                },
                            )
                            .await
                            .expect("apply");
                        assert!(!applied.is_replay(), "a new key is applied");
                    }
                }
            }
        }));
    }
    for task in running {
        task.await.expect("task");
    }
    keys as f64 / started.elapsed().as_secs_f64()
}

/// What the server did, read before and after a phase.
#[derive(Clone, Copy, Default)]
struct Server {
    /// CPU time of the server's processes (the postmaster and its children),
    /// in nanoseconds, when the server runs on this machine.
    cpu_ns: Option<u64>,
    /// The WAL position, in bytes.
    wal: i64,
}

/// The processes of the server `conn` is connected to: its postmaster (the
/// parent of `conn`'s backend) and every child of it.
async fn server_processes(conn: &mut PgConnection) -> Option<u32> {
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .ok()?;
    let status = std::fs::read_to_string(format!("/proc/{backend}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:"))
        .and_then(|ppid| ppid.trim().parse().ok())
}

/// The run time of `pid` (`/proc/PID/schedstat`'s first field), in nanoseconds.
fn run_time(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The summed run time of `postmaster` and its children.
fn server_cpu(postmaster: u32) -> Option<u64> {
    let mut total = run_time(postmaster)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let parent = status
            .lines()
            .find_map(|line| line.strip_prefix("PPid:"))
            .and_then(|ppid| ppid.trim().parse::<u32>().ok());
        if parent == Some(postmaster) {
            total += run_time(pid).unwrap_or(0);
        }
    }
    Some(total)
}

async fn server(conn: &mut PgConnection, postmaster: Option<u32>) -> Server {
    let wal: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
        .fetch_one(conn)
        .await
        .expect("read the WAL position");
    Server {
        cpu_ns: postmaster.and_then(server_cpu),
        wal,
    }
}

/// A statement as `pg_stat_statements` counted it.
struct Counted {
    query: String,
    toplevel: bool,
    calls: i64,
    mean_ms: f64,
    plan_ms: f64,
}

/// Whether `pg_stat_statements` can be read on `conn`'s server.
async fn statements_kept(conn: &mut PgConnection) -> bool {
    sqlx::raw_sql(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
    )
    .execute(conn)
    .await
    .is_ok()
}

async fn reset_statements(conn: &mut PgConnection) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(conn)
        .await
        .expect("reset pg_stat_statements");
}

/// The statements run on this database since the last reset, most time first.
async fn counted(conn: &mut PgConnection) -> Vec<Counted> {
    sqlx::query(
        "SELECT query, toplevel, calls, mean_exec_time, \
           CASE WHEN calls > 0 THEN total_plan_time / calls ELSE 0 END AS plan_ms FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND query NOT LIKE '%pg_stat_statements%' \
         ORDER BY total_exec_time DESC",
    )
    .fetch_all(conn)
    .await
    .expect("read pg_stat_statements")
    .iter()
    .map(|row| Counted {
        query: row.get("query"),
        toplevel: row.get("toplevel"),
        calls: row.get("calls"),
        mean_ms: row.get("mean_exec_time"),
        plan_ms: row.get("plan_ms"),
    })
    .collect()
}

fn one_line(query: &str, width: usize) -> String {
    let flat = query.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        return flat;
    }
    let cut: String = flat.chars().take(width).collect();
    format!("{cut}…")
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

fn phases(store: &PgStore) -> Vec<Phase> {
    vec![
        Phase {
            name: "leased, locked",
            mode: Mode::Leased,
            store: store.with_locked_claims(),
        },
        Phase {
            name: "leased, one statement",
            mode: Mode::Leased,
            store: store.clone(),
        },
        Phase {
            name: "atomic",
            mode: Mode::Atomic,
            store: store.clone(),
        },
    ]
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`. A test runner that lists or runs every
    // target of the workspace (`--list`, or no flag at all) finds no tests
    // here, and no benchmark starts.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let args = args();
    let database = format!("idem_bench_new_key_{}", std::process::id());
    let (base, _) = args.server.rsplit_once('/').expect("a URL with a database");
    let url = format!("{base}/{database}");
    let mut admin = PgConnection::connect(&args.server)
        .await
        .expect("connect to the server");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&mut admin)
        .await
        .expect("create the database");

    let store = PgStore::builder(&url)
        .group_commit(false)
        .max_connections(16)
        .connect()
        .await
        .expect("connect the store");
    let mut stats = PgConnection::connect(&url).await.expect("connect");
    let kept = statements_kept(&mut stats).await;
    let postmaster = server_processes(&mut stats).await;
    let phases = phases(&store);
    println!(
        "{} new keys per phase from {} tasks, {} rounds, database {database}{}",
        args.keys,
        args.tasks,
        args.rounds,
        if kept { "" } else { " (no pg_stat_statements)" }
    );

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    let mut last: Vec<Vec<Counted>> = (0..phases.len()).map(|_| Vec::new()).collect();
    let mut spent: Vec<Vec<(Option<u64>, i64)>> = vec![Vec::new(); phases.len()];
    // A warm-up, not counted: every connection opened and its statements prepared.
    for phase in &phases {
        let tag = format!("warm-{}", phase.name.replace([',', ' '], ""));
        run(phase, &tag, 500, args.tasks).await;
    }
    for round in 1..=args.rounds {
        let mut line = format!("round {round}:");
        for (i, phase) in phases.iter().enumerate() {
            if kept {
                reset_statements(&mut stats).await;
            }
            let tag = format!("{}-{round}", phase.name.replace([',', ' '], ""));
            let before = server(&mut stats, postmaster).await;
            let rate = run(phase, &tag, args.keys, args.tasks).await;
            let after = server(&mut stats, postmaster).await;
            let cpu = before
                .cpu_ns
                .zip(after.cpu_ns)
                .map(|(b, a)| a.saturating_sub(b) / args.keys as u64);
            spent[i].push((cpu, (after.wal - before.wal) / args.keys as i64));
            if kept {
                last[i] = counted(&mut stats).await;
            }
            rates[i].push(rate);
            line += &format!(" {} {rate:.0}/s", phase.name);
        }
        println!("{line}");
    }
    println!();
    println!("| phase | new keys/s | server CPU µs per key | WAL bytes per key |");
    println!("| --- | ---: | ---: | ---: |");
    for ((phase, rates), spent) in phases.iter().zip(&rates).zip(&spent) {
        let cpu: Vec<f64> = spent
            .iter()
            .filter_map(|(c, _)| c.map(|ns| ns as f64 / 1e3))
            .collect();
        let wal: Vec<f64> = spent.iter().map(|(_, w)| *w as f64).collect();
        println!(
            "| {} | {:.0} | {} | {:.0} |",
            phase.name,
            median(rates.clone()),
            if cpu.is_empty() {
                "–".to_owned()
            } else {
                format!("{:.0}", median(cpu))
            },
            median(wal)
        );
    }
    if rates.len() > 1 {
        println!();
        println!("ratios within each round, medians:");
        for (i, phase) in phases.iter().enumerate().skip(1) {
            let base = phases[..i].iter().rposition(|p| p.baseline_of(phase));
            if let Some(b) = base {
                let ratio: Vec<f64> = rates[i].iter().zip(&rates[b]).map(|(n, o)| n / o).collect();
                println!(
                    "  {} ÷ {} = {:.2}×",
                    phase.name,
                    phases[b].name,
                    median(ratio)
                );
            }
        }
    }
    if kept {
        for (phase, counted) in phases.iter().zip(&last) {
            println!();
            println!("{} (last round), per new key:", phase.name);
            println!();
            println!("| statement | calls per key | mean ms | plan ms |");
            println!("| --- | ---: | ---: | ---: |");
            for c in counted {
                let per_key = c.calls as f64 / args.keys as f64;
                if per_key < 0.01 {
                    continue;
                }
                println!(
                    "| `{}`{} | {:.2} | {:.3} | {:.3} |",
                    one_line(&c.query, 110),
                    if c.toplevel { "" } else { " (nested)" },
                    per_key,
                    c.mean_ms,
                    c.plan_ms
                );
            }
        }
    }

    drop(phases);
    store.pool().close().await;
    stats.close().await.ok();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {database} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .expect("drop the database");
}
