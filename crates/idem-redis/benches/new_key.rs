//! What a new key costs the Redis store, measured the way the store runs it:
//! N new keys from C concurrent tasks, each a claim and then its completion,
//! on one store (one multiplexed connection). Two phases take turns in each
//! round: "earlier scripts" runs the claim and change scripts of the earlier
//! record writer (`tests/previous/*.lua`, the baseline) on the store's
//! connection, "store" runs [`RedisStore::claim`] and
//! [`RedisStore::complete`].
//!
//! ```text
//! cargo bench -p idem-redis --bench new_key -- [REDIS_URL] [--keys N] [--tasks C] [--rounds R]
//! ```
//!
//! Without REDIS_URL a private `redis-server` is started on a free port
//! (append-only file, fsynced every second, as `bench/gateway.sh` runs it)
//! and stopped at the end; with one, the keys go under a prefix of their own,
//! deleted at the end, and the server's CPU counts whatever else it serves.
//!
//! For each phase it prints new keys per second, the server's CPU per key
//! (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`, before and after) and,
//! from the last round, the commands per key as the server counted them
//! (`INFO commandstats` after `CONFIG RESETSTAT`; the commands a script runs
//! are counted too, under their own names) with their mean µs per call. The
//! ratios are taken within a round (the machine may be shared), then their
//! median printed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use idem_core::{
    Claimed, FencingToken, Fingerprint, IdempotencyKey, LeaseStore, Outcome, RULE_MARK, Scope,
    Settings,
};
use idem_redis::RedisStore;
use idem_redis::redis::{self, Script, aio::MultiplexedConnection};

/// What the command line asked for.
struct Args {
    url: Option<String>,
    keys: usize,
    tasks: usize,
    rounds: usize,
}

fn args() -> Args {
    let mut args = Args {
        url: None,
        keys: 20_000,
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
            url if !url.starts_with('-') => args.url = Some(url.to_owned()),
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// How a phase applies a new key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The earlier scripts, called directly on the store's connection.
    Earlier,
    /// The store's `claim` and `complete`.
    Store,
}

struct Phase {
    name: &'static str,
    mode: Mode,
}

const PHASES: [Phase; 2] = [
    Phase {
        name: "earlier scripts",
        mode: Mode::Earlier,
    },
    Phase {
        name: "store",
        mode: Mode::Store,
    },
];

static EARLIER_CLAIM: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../tests/previous/claim.lua")));
static EARLIER_CHANGE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../tests/previous/change_held.lua")));

/// The Redis key of a record, as the store names it.
fn record_name(prefix: &str, scope: &Scope, key: &IdempotencyKey) -> String {
    let scope = scope.as_str();
    format!("{prefix}rec:{}:{{{scope}:{key}}}", scope.len())
}

fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A claim and its completion through the earlier scripts, with the
/// arguments the earlier store passed.
async fn earlier(store: &RedisStore, scope: &Scope, key: &IdempotencyKey, fp: Fingerprint) {
    let record = record_name(store.prefix(), scope, key);
    let settings: &Settings = store.settings();
    let now = store.clock().now();
    let mut conn = store.connection();
    let reply: Vec<Vec<u8>> = EARLIER_CLAIM
        .key(&record)
        .arg(scope.as_str())
        .arg(key.as_str())
        .arg(fp.as_bytes().as_slice())
        .arg(now.0)
        .arg(FencingToken::first_at(now).get())
        .arg(millis(settings.lease))
        .arg(millis(settings.retention))
        .arg(millis(settings.in_flight_retry_after))
        .arg(RULE_MARK.as_slice())
        .arg(settings.tombstones.map_or(0, millis))
        .invoke_async(&mut conn)
        .await
        .expect("the earlier claim script");
    assert_eq!(reply[0], b"claimed", "a new key is claimed");
    let outcome = Outcome::success("ok");
    let now = store.clock().now();
    let reply: Vec<Vec<u8>> = EARLIER_CHANGE
        .key(&record)
        .arg(std::str::from_utf8(&reply[1]).expect("a token"))
        .arg(now.0)
        .arg("settle")
        .arg(idem_core::RecordState::settled_by(outcome.kind).as_str())
        .arg(outcome.kind.as_str())
        .arg(outcome.body.as_slice())
        .arg(outcome.meta_json())
        .invoke_async(&mut conn)
        .await
        .expect("the earlier change script");
    assert_eq!(reply[0], b"held", "the claim is held");
}

/// Applies `keys` new keys from `tasks` tasks; keys per second.
async fn run(store: &RedisStore, mode: Mode, tag: &str, keys: usize, tasks: usize) -> f64 {
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
                match mode {
                    Mode::Earlier => earlier(&store, &scope, &key, fingerprint).await,
                    Mode::Store => {
                        let Claimed::Fresh(claim) =
                            store.claim(&scope, &key, fingerprint).await.expect("claim")
                        else {
                            panic!("a new key is claimed, not replayed");
                        };
                        store
                            .complete(&claim, &Outcome::success("ok"))
                            .await
                            .expect("complete");
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

/// `INFO section` as `name -> value`.
async fn info(conn: &mut MultiplexedConnection, section: &str) -> BTreeMap<String, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
        .collect()
}

/// The server's CPU time so far, in microseconds.
async fn server_cpu_us(conn: &mut MultiplexedConnection) -> f64 {
    let cpu = info(conn, "cpu").await;
    let seconds = |name: &str| -> f64 {
        cpu.get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("INFO cpu without {name}"))
    };
    (seconds("used_cpu_sys") + seconds("used_cpu_user")) * 1e6
}

/// A command as `INFO commandstats` counted it.
struct Counted {
    command: String,
    calls: u64,
    usec_per_call: f64,
}

/// The commands counted since the last `CONFIG RESETSTAT`, most calls first.
async fn counted(conn: &mut MultiplexedConnection) -> Vec<Counted> {
    let mut all: Vec<Counted> = info(conn, "commandstats")
        .await
        .into_iter()
        .filter_map(|(name, value)| {
            let command = name.strip_prefix("cmdstat_")?.to_owned();
            let field = |f: &str| {
                value
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .map(str::to_owned)
            };
            Some(Counted {
                command,
                calls: field("calls")?.parse().ok()?,
                usec_per_call: field("usec_per_call")?.parse().ok()?,
            })
        })
        .collect();
    all.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.command.cmp(&b.command)));
    all
}

async fn reset_stats(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// Deletes every key under `prefix`.
async fn delete_prefix(conn: &mut MultiplexedConnection, prefix: &str) {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(conn)
                .await
                .expect("UNLINK");
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
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
    // target of the workspace (`--list`, or no flag at all) finds no tests
    // here, and no benchmark starts.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let args = args();
    let private = match args.url {
        Some(_) => None,
        None => Some(
            idem_testkit::redis::RedisServer::start(&[
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
            ])
            .expect("a redis-server binary"),
        ),
    };
    let url = args
        .url
        .clone()
        .unwrap_or_else(|| private.as_ref().expect("the private server").url());
    let prefix = format!("idem-bench-{}:", std::process::id());
    let store = RedisStore::builder(url.as_str())
        .prefix(prefix.clone())
        .connect()
        .await
        .expect("connect the store");
    let mut stats = redis::Client::open(url.as_str())
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect for INFO");
    println!(
        "{} new keys per phase from {} tasks, {} rounds, on {}",
        args.keys,
        args.tasks,
        args.rounds,
        if private.is_some() {
            "a private redis-server (appendonly yes, appendfsync everysec)"
        } else {
            "the given server"
        }
    );

    // A warm-up, not counted: the scripts loaded, the connection busy.
    for phase in &PHASES {
        run(
            &store,
            phase.mode,
            &format!("warm-{}", phase.name.replace(' ', "")),
            1000,
            args.tasks,
        )
        .await;
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
    let mut last: Vec<Vec<Counted>> = (0..PHASES.len()).map(|_| Vec::new()).collect();
    for round in 1..=args.rounds {
        let mut line = format!("round {round}:");
        for (i, phase) in PHASES.iter().enumerate() {
            let tag = format!("{}-{round}", phase.name.replace(' ', ""));
            reset_stats(&mut stats).await;
            let before = server_cpu_us(&mut stats).await;
            let rate = run(&store, phase.mode, &tag, args.keys, args.tasks).await;
            let after = server_cpu_us(&mut stats).await;
            last[i] = counted(&mut stats).await;
            let per_key = (after - before) / args.keys as f64;
            rates[i].push(rate);
            cpu[i].push(per_key);
            line += &format!(" {} {rate:.0}/s {per_key:.1} µs;", phase.name);
        }
        println!("{line}");
    }
    println!();
    println!("| phase | new keys/s | server CPU µs per key |");
    println!("| --- | ---: | ---: |");
    for (i, phase) in PHASES.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.1} |",
            phase.name,
            median(rates[i].clone()),
            median(cpu[i].clone())
        );
    }
    println!();
    println!("ratios within each round, medians:");
    let ratio = |of: &[Vec<f64>]| median(of[1].iter().zip(&of[0]).map(|(n, o)| n / o).collect());
    println!("  keys/s, store ÷ earlier scripts = {:.2}×", ratio(&rates));
    println!(
        "  server CPU per key, store ÷ earlier scripts = {:.2}×",
        ratio(&cpu)
    );
    for (phase, counted) in PHASES.iter().zip(&last) {
        println!();
        println!("{} (last round), per new key:", phase.name);
        println!();
        println!("| command | calls per key | µs per call |");
        println!("| --- | ---: | ---: |");
        for c in counted {
            let per_key = c.calls as f64 / args.keys as f64;
            if per_key < 0.01 {
                continue;
            }
            println!("| {} | {per_key:.2} | {:.2} |", c.command, c.usec_per_call);
        }
    }
    delete_prefix(&mut stats, &prefix).await;
    drop(private);
}
