#!/usr/bin/env bash
# What `idem serve` costs on the wire, next to nginx, on each store, and how
# several gateway nodes on one PostgreSQL database or one Redis Cluster
# behave, in one run, on loopback.
#
#   bench/gateway.sh [--quick] [--rounds R] [--seconds S] [--nodes "1 2 4"]
#                    [--node-stores "pg rcluster"] [--phases LIST]
#                    [--check-keys N] [--perf] [--perf-phase PHASE]
#                    [--flame FILE.svg] [SERVER_URL]
#
# Part 1. One echo upstream (a private nginx answering `return 200` with a
# short fixed body) is called by wrk (32 connections, 2 threads, --latency):
#   - directly;
#   - through nginx as a reverse proxy (one worker, keepalive to the upstream),
#     without a key and with a unique Idempotency-Key per request (nginx just
#     forwards the header, so the client does the same work as against idem);
#   - through `idem serve` on the embedded SQLite store and on PostgreSQL:
#     requests without a key (passed through), replays (a fixed set of 1000
#     keys already answered, sent again) and unique keys (a new key per
#     request);
#   - through `idem serve` on PostgreSQL with `group_commit=off` in its store
#     URL (each claim and completion in a transaction of its own): replays
#     and unique keys, to show what grouping the commits gives;
#   - through `idem serve` on a private Redis (append-only file, fsync every
#     second, one replica): replays and unique keys, and unique keys again
#     with `wait=1` in the store URL (each write waits for the replica);
#   - through `idem serve` on a private Redis Cluster of three primaries
#     (append-only file, fsync every second, no replicas): replays and
#     unique keys;
#   - through `idem serve` on DynamoDB as moto's server emulates it (a
#     private moto_server, installed from PyPI into $IDEM_CACHE/moto once):
#     replays and unique keys. The emulator, a single Python process, is
#     the bound there, not the gateway nor DynamoDB itself: the figures say
#     what a DynamoDB store costs the gateway, not what DynamoDB serves;
#   - through the nearest peer, idempotent-proxy-server (a Rust idempotency
#     gateway, installed from crates.io with `cargo install` into
#     $IDEM_CACHE/idempotent-proxy once), on the private Redis and with its
#     in-memory store: replays and unique keys;
#   - and pgbench's single-row INSERT transactions on the same PostgreSQL (16
#     and 32 clients; the better is the reference for unique keys there).
# The phases take turns in rounds; each rate is the median of the rounds',
# each ratio the median of the rounds' ratios, printed with its target, its
# verdict (met or NOT met), how many rounds meet the target on their own and
# each round's ratio; the peer ratios must meet theirs in every round.
#
# Part 2. 1, 2 and 4 `idem serve` nodes on one PostgreSQL database, then on
# the Redis Cluster, behind a private nginx load balancer (round robin):
# unique keys and replays, and a
# correctness check: each of --check-keys keys is sent 4 times, the copies
# adjacent so that some run concurrently on different nodes, then once more
# until every key has its final answer (409, "in flight", means: retry
# later); the echo upstream logs the key of every request it receives, and
# each key must appear there exactly once. The script exits with status 1
# when one does not.
#
# Options:
#   --quick          one round of 3 s phases, 1 s warm-ups, 1000 check keys
#   --rounds R       rounds of part 1 (default 3)
#   --seconds S      length of each measured phase (default 8)
#   --nodes LIST     node counts of part 2 (default "1 2 4"; "" skips part 2)
#   --node-stores L  the stores of part 2: pg (one PostgreSQL database),
#                    rcluster (the Redis Cluster); default "pg rcluster"
#   --no-peer        leave out idempotent-proxy (no install, no phases)
#   --phases LIST    only these phases of part 1, e.g. "pg-unique
#                    pgalone-unique pgbench-16" (default: all of them)
#   --check-keys N   keys of the correctness check (default 3000)
#   --perf           record a profile (perf record -a -g) during the last
#                    round of one phase (pg-unique unless --perf-phase says
#                    another) and print its top entries
#   --perf-phase P   the phase --perf profiles (implies --perf), e.g.
#                    sqlite-pass
#   --flame FILE     with --perf, also draw the gateway's samples as a flame
#                    graph (SVG) with inferno (cargo install inferno)
#   SERVER_URL       PostgreSQL server (default
#                    postgres://postgres@127.0.0.1:5432/postgres); a database
#                    idem_gwbench_<pid> is made on it and dropped afterwards
#
# The binary is $IDEM_BIN, or else target/release/idem of this repository,
# built first with `cargo build --release -p idem-cli`. nginx, wrk and
# redis-server (with redis-cli) are installed from the distribution's packages
# (apt-get) when missing; pgbench, psql and curl must be present. The Redis
# servers are private too (their own ports and directories), never the
# machine's. Everything listens on 127.0.0.1 on free
# ports; the nginx instances are private (their own configuration, pid file,
# logs and temporary directories under a temporary directory), and every
# process, file and database the script made is removed on exit, Ctrl-C
# included.
set -euo pipefail

seconds=8
warmup=2
rounds=3
check_keys=3000
copies=4
replay_keys=1000
node_counts="1 2 4"
node_stores="pg rcluster"
peer=1
conns=32
threads=2
perf=0
perf_phase=pg-unique
flame=
only_phases=
server=postgres://postgres@127.0.0.1:5432/postgres
while (($#)); do
    case "$1" in
    --quick) seconds=3; warmup=1; rounds=1; check_keys=1000; shift ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --nodes) node_counts=$2; shift 2 ;;
    --no-peer) peer=0; shift ;;
    --node-stores) node_stores=$2; shift 2 ;;
    --phases) only_phases=$2; shift 2 ;;
    --check-keys) check_keys=$2; shift 2 ;;
    --perf) perf=1; shift ;;
    --perf-phase) perf=1; perf_phase=$2; shift 2 ;;
    --flame) flame=$2; shift 2 ;;
    -h | --help) sed -n '2,76p' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
    *) server=$1; shift ;;
    esac
done

say() { printf '%s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# --- tools -------------------------------------------------------------------

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -n ${IDEM_BIN:-} ]]; then
    idem=$IDEM_BIN
else
    say "building idem (cargo build --release -p idem-cli; set IDEM_BIN to use another binary)"
    (cd "$root" && cargo build --release -p idem-cli) || die "the release build failed"
    idem=$root/target/release/idem
fi
[[ -x $idem ]] || die "no executable idem at $idem"

if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null || ! command -v redis-server >/dev/null ||
    ! command -v redis-cli >/dev/null; then
    [[ $(id -u) == 0 ]] || die "nginx, wrk or redis-server is missing; install them (apt-get install nginx wrk redis-server) or run as root"
    command -v apt-get >/dev/null || die "nginx, wrk or redis-server is missing and there is no apt-get to install them"
    say "installing nginx, wrk and redis-server from the distribution's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx wrk redis-server >/dev/null
fi
nginx=$(command -v nginx)
pgbench=$(command -v pgbench || find /usr/lib/postgresql -path '*/bin/pgbench' 2>/dev/null | sort -V | tail -1 || true)
[[ -n $pgbench && -x $pgbench ]] || die "pgbench not found: install the PostgreSQL client (apt-get install postgresql-client)"
for tool in psql curl wrk awk; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
if ((perf)); then
    command -v perf >/dev/null || die "--perf needs perf (apt-get install linux-perf)"
    if [[ -n $flame ]]; then
        command -v inferno-collapse-perf >/dev/null && command -v inferno-flamegraph >/dev/null ||
            die "--flame needs inferno (cargo install inferno)"
    fi
fi
psql -qAt "$server" -c 'SELECT 1' >/dev/null 2>&1 || die "PostgreSQL does not answer at $server"

# --- processes, ports and clean-up -------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-gwbench.XXXXXX")
db=idem_gwbench_$$
pg_url=${server%/*}/$db
made_db=0
pids=()
failed=0

stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local pid
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do
        stop_pid "$pid"
    done
    if ((made_db)); then
        psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 ||
            say "warning: could not drop database $db"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'exit 143' TERM

taken=" "
# Listening ports are taken below the kernel's ephemeral range, where no
# outgoing connection (of wrk, curl, nginx or the gateways) can hold them.
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
((ephemeral_low > 12000)) || die "the ephemeral port range starts at $ephemeral_low: no room for listening ports below it"
# free_port: sets $port to a TCP port on 127.0.0.1 that nothing listens on
# and that this run has not handed out yet.
free_port() {
    local p
    while :; do
        p=$((10000 + RANDOM % (ephemeral_low - 10000)))
        [[ $taken == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            taken+="$p "
            port=$p
            return
        fi
    done
}

# wait_http URL WHAT PID: until URL answers, or fail with WHAT's log.
wait_http() {
    local url=$1 what=$2 pid=$3 i
    for ((i = 0; i < 100; i++)); do
        curl -s -o /dev/null "$url" && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$work/$what.log" >&2 || true; die "$what exited at start"; }
        sleep 0.1
    done
    cat "$work/$what.log" >&2 || true
    die "$what does not answer at $url"
}

# nginx_start NAME CONF_BODY: a private nginx (prefix, pid, logs and temp
# directories under $work/NAME), in the foreground of a background job.
nginx_start() {
    local name=$1 body=$2 dir=$work/$1
    mkdir -p "$dir/tmp"
    cat >"$dir/nginx.conf" <<EOF
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
$body
EOF
    sed -i "s|@TMP@|client_body_temp_path $dir/tmp/body; proxy_temp_path $dir/tmp/proxy; fastcgi_temp_path $dir/tmp/fastcgi; uwsgi_temp_path $dir/tmp/uwsgi; scgi_temp_path $dir/tmp/scgi;|" "$dir/nginx.conf"
    "$nginx" -q -t -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" 2>"$work/$name.log" ||
        { cat "$work/$name.log" >&2; die "nginx refused the configuration of $name"; }
    "$nginx" -e "$dir/error.log" -p "$dir" -c "$dir/nginx.conf" >"$work/$name.log" 2>&1 &
    pids+=("$!")
    last_pid=$!
}

# redis_start NAME PORT [ARGS...]: a private redis-server (its directory
# $work/NAME) with the append-only file on, fsynced every second (Redis's
# own default for it), in the foreground of a background job.
redis_start() {
    local name=$1 port=$2 dir=$work/$1 i
    shift 2
    mkdir -p "$dir"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' \
        --appendonly yes --appendfsync everysec --logfile "$work/$name.log" "$@" >/dev/null 2>&1 &
    pids+=("$!")
    last_pid=$!
    for ((i = 0; i < 100; i++)); do
        [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && return 0
        kill -0 "$last_pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$work/$name.log" >&2 || true
    die "$name (redis-server on port $port) does not answer PING"
}

# free_cluster_port: a free port whose cluster bus port (port + 10000) is
# free and below the ephemeral range too.
free_cluster_port() {
    while :; do
        free_port
        ((port + 10000 < ephemeral_low)) || continue
        [[ $taken == *" $((port + 10000)) "* ]] && continue
        (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null && continue
        taken+="$((port + 10000)) "
        return
    done
}

# gateway_start NAME STORE PORT ADMIN_PORT: one `idem serve` in front of the
# echo upstream, with an answer spool of its own.
gateway_start() {
    local name=$1 store=$2 port=$3 admin=$4
    IDEM_LOG=warn "$idem" --store "$store" serve --upstream "http://127.0.0.1:$echo_port" \
        --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" --spool "$work/$name.spool" >"$work/$name.log" 2>&1 &
    pids+=("$!")
    last_pid=$!
    wait_http "http://127.0.0.1:$admin/healthz" "$name" "$last_pid"
}

stop_proc() {
    local pid=$1 kept=() p
    stop_pid "$pid"
    for p in "${pids[@]}"; do
        [[ $p == "$pid" ]] || kept+=("$p")
    done
    pids=("${kept[@]}")
}

# --- wrk scripts -------------------------------------------------------------

body='{"amount":1000,"currency":"eur"}'
cat >"$work/plain.lua" <<EOF
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
EOF
# unique.lua PREFIX: a new key per request ("PREFIX-THREAD-N", an RFC 8941
# String, quoted).
cat >"$work/unique.lua" <<EOF
local counter = 1
function setup(thread)
   thread:set("tid", counter)
   counter = counter + 1
end
local prefix, n = "", 0
function init(args)
   prefix = '"' .. args[1] .. "-" .. tostring(tid) .. "-"
end
function request()
   n = n + 1
   return wrk.format("POST", nil, {["Content-Type"] = "application/json",
      ["Idempotency-Key"] = prefix .. n .. '"'}, '$body')
end
EOF
# replay.lua PREFIX COUNT: the keys PREFIX-0 .. PREFIX-(COUNT-1), over and over.
cat >"$work/replay.lua" <<EOF
local prefix, count, n = "", 1, 0
function init(args)
   prefix = '"' .. args[1] .. "-"
   count = tonumber(args[2])
end
function request()
   n = (n + 1) % count
   return wrk.format("POST", nil, {["Content-Type"] = "application/json",
      ["Idempotency-Key"] = prefix .. n .. '"'}, '$body')
end
EOF

# post_keys KEYS_FILE URL OUT: one POST to URL per line of KEYS_FILE, with
# that line as its Idempotency-Key, $conns at a time (curl --parallel); OUT
# gets "STATUS REPLAYED KEY" per request (REPLAYED: true- or -).
post_keys() {
    local keys=$1 url=$2 out=$3
    awk -v url="$url" -v body="$body" 'NR > 1 { print "next" } {
        printf "url = \"%s\"\nrequest = \"POST\"\ndata = %s\n", url, body
        printf "header = \"Content-Type: application/json\"\nheader = \"Idempotency-Key: \\\"%s\\\"\"\n", $1
        printf "output = \"/dev/null\"\nsilent\nwrite-out = \"%%{urlnum} %%{http_code} %%header{idempotent-replayed}-\\n\"\n"
    }' "$keys" >"$out.curl"
    curl --silent --parallel --parallel-immediate --parallel-max "$conns" -K "$out.curl" >"$out.raw" 2>"$out.err" || true
    # urlnum counts from 0, in the order of KEYS_FILE
    awk 'NR == FNR { key[NR - 1] = $1; next } { print $2, $3, key[$1] }' "$keys" "$out.raw" >"$out"
}

# prime PREFIX URL: answers the replay keys PREFIX-0 .. once through URL.
prime() {
    local prefix=$1 url=$2
    awk -v n="$replay_keys" -v p="$prefix-" 'BEGIN { for (k = 0; k < n; k++) print p k }' >"$work/$prefix.keys"
    post_keys "$work/$prefix.keys" "$url" "$work/$prefix.primed"
    awk '$1 != 200 { bad++ } END { exit bad > 0 }' "$work/$prefix.primed" ||
        say "warning: some replay keys were not answered 200 when primed: $(cut -d' ' -f1 "$work/$prefix.primed" | sort | uniq -c | tr '\n' ' ')"
}

# --- measuring ---------------------------------------------------------------

declare -A rps p50 p99 bad count commits_per cpu_of fsyncs_per
can_count_fsyncs=0
if command -v perf >/dev/null && perf stat -a -e syscalls:sys_enter_fsync -- true >/dev/null 2>&1; then
    can_count_fsyncs=1
fi
run_id=$$-$RANDOM

# to_ms VALUE: wrk's 312.00us / 1.20ms / 1.05s in milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        if (v ~ /us$/) x = substr(v, 1, length(v) - 2) / 1000
        else if (v ~ /ms$/) x = substr(v, 1, length(v) - 2)
        else if (v ~ /s$/) x = substr(v, 1, length(v) - 1) * 1000
        else x = v
        printf "%.2f", x }'
}

# wrk_phase NAME URL SCRIPT [ARGS...]: a warm-up, then the measured run.
wrk_phase() {
    local name=$1 url=$2 script=$3 out=$work/wrk-$1.txt
    shift 3
    local args=() warm=()
    if (($#)); then
        args=(-- "$@")
        warm=(-- "$@")
        # unique keys warm up on keys of their own
        [[ $script == unique.lua ]] && warm[1]=$1-warm
    fi
    wrk -t "$threads" -c "$conns" -d "${warmup}s" -s "$work/$script" "$url" "${warm[@]}" >/dev/null 2>&1 || true
    say "  $name (${seconds}s)"
    local before after fsyncs
    before=$(commits)
    cpu_sample >"$work/cpu-before"
    fsync_count_start "$work/fsyncs-$name"
    wrk -t "$threads" -c "$conns" -d "${seconds}s" --latency -s "$work/$script" "$url" "${args[@]}" >"$out" 2>&1 ||
        { cat "$out" >&2; die "wrk failed in phase $name"; }
    fsync_count_stop "$work/fsyncs-$name"
    cpu_sample >"$work/cpu-after"
    after=$(commits)
    rps[$name]=$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' "$out")
    count[$name]=$(awk '/requests in/ { print $1 }' "$out")
    p50[$name]=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
    p99[$name]=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
    bad[$name]=$(awk '/Non-2xx/ { n += $NF } /Socket errors/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 } END { print n + 0 }' "$out")
    [[ -n ${rps[$name]} ]] || { cat "$out" >&2; die "no result from wrk in phase $name"; }
    # transactions committed in the benchmark database, per request
    commits_per[$name]=$(awk -v a="$before" -v b="$after" -v n="${count[$name]}" 'BEGIN { printf "%.2f", (b - a) / n }')
    cpu_of[$name]=$(cpu_per_request "$work/cpu-before" "$work/cpu-after" "${count[$name]}")
    fsyncs_per[$name]=$(awk -v f="$fsyncs" -v n="${count[$name]}" 'BEGIN { if (f == "") print "n/a"; else printf "%.2f", f / n }')
}

# cpu_sample: the CPU time each command has used so far, in clock ticks
# (user + system, all threads of a process; "COMMAND<TAB>TICKS" lines), then
# the machine's busy and idle ticks over all cores ("@busy", "@idle").
cpu_sample() {
    # (a process that ends while it is read makes cat fail; what it read counts)
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk '{
        q = 0
        for (i = length($0); i > 0; i--) if (substr($0, i, 1) == ")") { q = i; break }
        p = index($0, "(")
        n = split(substr($0, q + 2), f, " ")
        t[substr($0, p + 1, q - p - 1)] += f[12] + f[13]
    } END { for (c in t) printf "%s\t%d\n", c, t[c] }'
    awk '/^cpu / { printf "@busy\t%d\n@idle\t%d\n", $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat
}

# cpu_per_request BEFORE AFTER REQUESTS: microseconds of CPU per request
# between two cpu_samples, by who spent them: "gateway database nginx wrk
# other idle" (the gateway is idem or the peer; the database PostgreSQL or
# Redis; nginx the upstream and the proxies; idle counts every core).
cpu_per_request() {
    # (the kernel names a process by its binary's first 15 characters: an
    # IDEM_BIN of another name is the gateway too)
    awk -F'\t' -v n="$3" -v hz="$(getconf CLK_TCK)" -v gw="$(basename "$idem" | cut -c1-15)" '
        FNR == NR { before[$1] = $2; next }
        {
            d = $2 - before[$1]
            if ($1 == "@idle") idle += d
            else if ($1 == "@busy") busy += d
            else if ($1 == "idem" || $1 == gw || $1 ~ /^idempotent-pro/) g += d
            else if ($1 == "postgres" || $1 == "redis-server" || $1 == "moto_server") db += d
            else if ($1 == "nginx") ng += d
            else if ($1 == "wrk") w += d
        }
        END {
            other = busy - g - db - ng - w
            if (other < 0) other = 0
            us = 1e6 / hz / (n > 0 ? n : 1)
            printf "%d %d %d %d %d %d", g * us, db * us, ng * us, w * us, other * us, idle * us
        }' "$1" "$2"
}

# fsync_count_start FILE: counts the fsync and fdatasync calls of the whole
# machine into FILE for the next $seconds (the measured run beside it), when
# perf can count them.
fsync_count_start() {
    fsync_job=
    ((can_count_fsyncs)) || return 0
    perf stat -a -x, -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync -o "$1" -- sleep "$seconds" >/dev/null 2>&1 &
    fsync_job=$!
}
# fsync_count_stop FILE: waits for the count and sets $fsyncs to the calls
# counted ("" when nothing was counted).
fsync_count_stop() {
    fsyncs=
    [[ -n $fsync_job ]] || return 0
    wait "$fsync_job" 2>/dev/null || true
    [[ -s $1 ]] || return 0
    fsyncs=$(awk -F, '$3 ~ /sys_enter_f(data)?sync/ { n += $1 } END { print n + 0 }' "$1")
}

# commits: transactions committed in the benchmark database so far.
commits() {
    psql -qAt "$server" -c "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'"
}

# outcomes ADMIN_PORT: the gateway's gateway_requests_total by outcome (summed
# over routes), one line.
outcomes() {
    curl -s "http://127.0.0.1:$1/metrics" |
        awk -F'[{}"]' '/^gateway_requests_total\{/ { n = split($0, f, " "); count[$3] += f[n] }
            END { for (o in count) if (count[o] > 0) printf "%s=%d ", o, count[o] }'
}

# group_stats ADMIN_PORT: how the gateway's PostgreSQL store committed its
# leased calls (the store_group_* metrics), one line.
group_stats() {
    curl -s "http://127.0.0.1:$1/metrics" | awk '
        /^store_group_calls_total\{/ { k = $0; sub(/.*kind="/, "", k); sub(/".*/, "", k)
            w = $0; sub(/.*way="/, "", w); sub(/".*/, "", w); calls[k " " w] += $NF }
        /^store_group_size_count\{/ { k = $0; sub(/.*kind="/, "", k); sub(/".*/, "", k); groups[k] += $NF }
        /^store_group_queue_wait_seconds_sum\{/ { k = $0; sub(/.*kind="/, "", k); sub(/".*/, "", k); wait[k] += $NF }
        END { for (k in groups) {
                g = calls[k " grouped"]; a = calls[k " alone"]
                printf "%s: %d grouped, %d alone, %.1f per group, %.2f ms mean wait for a runner; ", k, g, a,
                    (groups[k] > 0 ? g / groups[k] : 0), (g > 0 ? 1000 * wait[k] / g : 0) } }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
meets() { awk -v r="$1" -v t="$2" 'BEGIN { print (r + 0 >= t) ? "met" : "NOT met" }'; }


# --- the echo upstream and the PostgreSQL database -----------------------------

say "work directory $work; idem: $idem ($("$idem" --version))"
free_port
echo_port=$port
# The echo upstream runs one worker per core (auto): it must never be the
# narrowest point of any path, and `return 200` from several workers keeps it
# well ahead of every proxy measured here. It logs the key of each request of
# the correctness check (keys "check-..."), one line per request received.
nginx_start echo "worker_processes auto;
events { worker_connections 4096; }
http {
    @TMP@
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    map \$http_idempotency_key \$check_key {
        '~^\"?(check-[^\"]+)\"?\$' \$1;
        default '';
    }
    log_format keyonly '\$check_key';
    server {
        listen 127.0.0.1:$echo_port;
        access_log $work/echo/keys.log keyonly if=\$check_key;
        location / {
            default_type application/json;
            return 200 '{\"ok\":true}\n';
        }
    }
}"
wait_http "http://127.0.0.1:$echo_port/" echo "$last_pid"

free_port
proxy_port=$port
# nginx as the reverse proxy under comparison: one worker, a keepalive pool to
# the upstream, no access log.
nginx_start proxy "worker_processes 1;
events { worker_connections 4096; }
http {
    @TMP@
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    upstream echo {
        server 127.0.0.1:$echo_port;
        keepalive 64;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$proxy_port;
        location / {
            proxy_pass http://echo;
            proxy_http_version 1.1;
            proxy_set_header Connection '';
        }
    }
}"
wait_http "http://127.0.0.1:$proxy_port/" proxy "$last_pid"

psql -q "$server" -c "CREATE DATABASE $db" >/dev/null
made_db=1
"$idem" --store "$pg_url" migrate >/dev/null
psql -q "$pg_url" -c "CREATE TABLE gwbench_insert (k TEXT PRIMARY KEY, body BYTEA NOT NULL, created_at BIGINT NOT NULL)" >/dev/null

phases=(direct nginx nginx-keyed sqlite-pass sqlite-replay sqlite-unique pg-pass pg-replay pg-unique
    pgalone-replay pgalone-unique redis-replay redis-unique rwait-unique rcluster-replay rcluster-unique
    dynamo-replay dynamo-unique ipxmem-replay ipxmem-unique ipxredis-replay ipxredis-unique pgbench-16 pgbench-32)
[[ -z $only_phases ]] || read -ra phases <<<"$only_phases"
if ((!peer)); then
    kept=()
    for ph in "${phases[@]}"; do
        [[ $ph == ipx* ]] || kept+=("$ph")
    done
    phases=("${kept[@]}")
fi
# the gateways part 1 needs: one per store named by a phase
stores=()
for ph in "${phases[@]}"; do
    case $ph in
    direct | nginx | nginx-keyed | pgbench-*) ;;
    *) [[ " ${stores[*]} " == *" ${ph%-*} "* ]] || stores+=("${ph%-*}") ;;
    esac
done
wanted() {
    local part2=
    [[ -z ${node_counts// /} ]] || part2=$node_stores
    [[ " ${stores[*]} $part2 " == *" $1 "* ]]
}

# A private Redis with one replica, and a private Redis Cluster of three
# primaries, each started only when a phase uses it.
if wanted redis || wanted rwait || wanted ipxredis; then
    free_port
    redis_port=$port
    redis_start redis "$redis_port"
    free_port
    redis_start redis-replica "$port" --replicaof 127.0.0.1 "$redis_port"
    for ((i = 0; i < 100; i++)); do
        redis-cli -p "$port" info replication 2>/dev/null | grep -q 'master_link_status:up' && break
        sleep 0.1
    done
    ((i < 100)) || die "the Redis replica on port $port did not catch up with its primary"
fi
if wanted rcluster; then
    cluster_nodes=()
    for i in 1 2 3; do
        free_cluster_port
        redis_start "rcluster-$i" "$port" --cluster-enabled yes --cluster-config-file "$work/rcluster-$i/nodes.conf" \
            --cluster-node-timeout 2000
        cluster_nodes+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${cluster_nodes[@]}" --cluster-replicas 0 --cluster-yes >"$work/rcluster.log" 2>&1 ||
        { cat "$work/rcluster.log" >&2; die "redis-cli could not make the Redis Cluster"; }
    for node in "${cluster_nodes[@]}"; do
        for ((i = 0; i < 100; i++)); do
            redis-cli -h "${node%:*}" -p "${node#*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' && break
            sleep 0.1
        done
        ((i < 100)) || die "the Redis Cluster node $node is not in cluster_state:ok"
    done
    cluster_url="redis+cluster://$(IFS=,; echo "${cluster_nodes[*]}")"
fi

# DynamoDB as moto's server emulates it: a private moto_server of the same
# version the test suite uses, installed once into the cache folder.
if wanted dynamo; then
    moto_root=${IDEM_CACHE:-$HOME/.cache/idem}/moto
    moto_version=$(awk -F= '/^MOTO_VERSION=/ { print $2 }' "$(dirname "$0")/../scripts/services.sh")
    if [[ ! -x $moto_root/bin/moto_server ]]; then
        say "installing moto[server,dynamodb] $moto_version from PyPI into $moto_root (once)"
        python3 -m venv "$moto_root" >&2 && "$moto_root/bin/pip" install --quiet "moto[server,dynamodb]==$moto_version" >&2 ||
            die "could not install moto's server (leave the dynamo phases out with --phases)"
    fi
    free_port
    moto_port=$port
    mkdir -p "$work/moto"
    (cd "$work/moto" && exec "$moto_root/bin/moto_server" -H 127.0.0.1 -p "$moto_port") >"$work/moto.log" 2>&1 &
    pids+=("$!")
    last_pid=$!
    wait_http "http://127.0.0.1:$moto_port/moto-api/" moto "$last_pid"
fi

# The peer, idempotent-proxy-server, installed once into the cache folder.
# Its answers are kept for REQUEST_TIMEOUT milliseconds (10 s unless set):
# set to 7 days, Idem's default window, so that a replay is a replay.
if wanted ipxmem || wanted ipxredis; then
    ipx_root=${IDEM_CACHE:-$HOME/.cache/idem}/idempotent-proxy
    ipx=$ipx_root/bin/idempotent-proxy-server
    if [[ ! -x $ipx ]]; then
        say "installing idempotent-proxy-server 1.2.2 from crates.io into $ipx_root (once)"
        cargo install --locked idempotent-proxy-server --version 1.2.2 --root "$ipx_root" >&2 ||
            die "could not install idempotent-proxy-server (run with --no-peer to leave it out)"
    fi
fi

# peer_start NAME PORT [REDIS_URL]: idempotent-proxy-server serving the echo
# upstream under /URL_ECHO, its answers in Redis or (without REDIS_URL) in
# its own memory. It reads its settings from a .env file in its directory.
peer_start() {
    local name=$1 port=$2 redis=${3:-} dir=$work/$1
    mkdir -p "$dir"
    {
        echo "SERVER_ADDR=127.0.0.1:$port"
        echo "URL_ECHO=http://127.0.0.1:$echo_port/"
        echo "REQUEST_TIMEOUT=604800000"
        echo "LOG_LEVEL=warn"
        [[ -z $redis ]] || echo "REDIS_URL=$redis"
    } >"$dir/.env"
    (cd "$dir" && exec "$ipx") >"$work/$name.log" 2>&1 &
    pids+=("$!")
    last_pid=$!
    wait_http "http://127.0.0.1:$port/URL_ECHO" "$name" "$last_pid"
}

# store_url STORE: the store URL of a gateway on STORE.
store_url() {
    case $1 in
    sqlite) echo "sqlite://$work/gateway.db" ;;
    pg) echo "$pg_url" ;;
    pgalone) echo "$pg_url?group_commit=off" ;;
    redis) echo "redis://127.0.0.1:$redis_port/0" ;;
    rwait) echo "redis://127.0.0.1:$redis_port/0?wait=1&wait_timeout_ms=1000&prefix=idem-wait:" ;;
    rcluster) echo "$cluster_url" ;;
    dynamo) echo "dynamodb+http://bench:bench@127.0.0.1:$moto_port/idem-gwbench-$run_id" ;;
    *) die "no store named $1 (phases name sqlite, pg, pgalone, redis, rwait, rcluster or dynamo)" ;;
    esac
}

cores=$(nproc 2>/dev/null || echo '?')
proxy="http://127.0.0.1:$proxy_port/"
declare -A gw_url gw_admin_port gw_pid_of all_rps all_p50 all_p99 all_bad
for store in "${stores[@]}"; do
    free_port
    gw_port=$port
    case $store in
    ipxmem | ipxredis)
        redis_url=
        [[ $store == ipxmem ]] || redis_url="redis://127.0.0.1:$redis_port/1"
        peer_start "peer-$store" "$gw_port" "$redis_url"
        gw_url[$store]="http://127.0.0.1:$gw_port/URL_ECHO"
        ;;
    *)
        free_port
        gw_admin_port[$store]=$port
        gateway_start "gateway-$store" "$(store_url "$store")" "$gw_port" "$port"
        gw_url[$store]="http://127.0.0.1:$gw_port/"
        ;;
    esac
    gw_pid_of[$store]=$last_pid
    prime "r-$store-$run_id" "${gw_url[$store]}"
done
printf 'INSERT INTO gwbench_insert VALUES (gen_random_uuid()::text, %s::bytea, 1);\n' \
    "'\\x7b226f6b223a747275657d0a'" >"$work/insert.sql"

# pgbench_phase CLIENTS: single-row INSERTs, one per transaction.
pgbench_phase() {
    local clients=$1 name=pgbench-$1 out=$work/pgbench-$1.txt
    say "  $name (${seconds}s)"
    "$pgbench" -n -c "$clients" -j "$threads" -T "$warmup" -f "$work/insert.sql" "$pg_url" >/dev/null 2>&1 || true
    "$pgbench" -n -c "$clients" -j "$threads" -T "$seconds" -f "$work/insert.sql" "$pg_url" >"$out" 2>&1 ||
        { cat "$out" >&2; die "pgbench failed"; }
    rps[$name]=$(awk '/^tps = / { printf "%.0f", $3 }' "$out")
    p50[$name]=$(awk '/^latency average/ { printf "%.2f", $4 }' "$out")
    p99[$name]=0
    bad[$name]=$(awk '/failed transactions/ { print $5 }' "$out")
    bad[$name]=${bad[$name]:-0}
}

# run_phase NAME ROUND: one measured phase of part 1, its figures kept per round.
run_phase() {
    local ph=$1 r=$2 store=${1%-*} perf_job=
    if ((perf && r == rounds)) && [[ $ph == "$perf_phase" ]]; then
        # system-wide (the share of each process), after the warm-up
        (sleep "$((warmup + 1))" && exec perf record -a -g -o "$work/perf.data" -- sleep "$((seconds > 6 ? 5 : seconds - 1))") >"$work/perf.log" 2>&1 &
        perf_job=$!
    fi
    case $ph in
    direct) wrk_phase direct "http://127.0.0.1:$echo_port/" plain.lua ;;
    nginx) wrk_phase nginx "$proxy" plain.lua ;;
    nginx-keyed) wrk_phase nginx-keyed "$proxy" unique.lua "n-$run_id-$r" ;;
    *-pass) wrk_phase "$ph" "${gw_url[$store]}" plain.lua ;;
    *-replay) wrk_phase "$ph" "${gw_url[$store]}" replay.lua "r-$store-$run_id" "$replay_keys" ;;
    *-unique) wrk_phase "$ph" "${gw_url[$store]}" unique.lua "u-$store-$run_id-$r" ;;
    pgbench-*) pgbench_phase "${ph#pgbench-}" ;;
    esac
    if [[ -n $perf_job ]]; then
        wait "$perf_job" || say "warning: perf record failed: $(tail -3 "$work/perf.log")"
    fi
    all_rps[$ph]+="${rps[$ph]} "
    all_p50[$ph]+="${p50[$ph]} "
    all_p99[$ph]+="${p99[$ph]} "
    all_bad[$ph]=$((${all_bad[$ph]:-0} + bad[$ph]))
}

# median LIST: the median of the numbers in a space-separated list.
median() {
    tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 }
        END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# spread LIST: "min-max" of a list of rates.
spread() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%d-%d", lo, hi }'; }
# ratios A_LIST B_LIST: the median of the rounds' ratios, and their range.
ratios() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, " "); split(b, y, " ")
        for (i = 1; i <= n; i++) r[i] = y[i] > 0 ? x[i] / y[i] : 0
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
        m = n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
        printf "%.2f %.2f-%.2f\n", m, r[1], r[n] }'
}

say ""
say "part 1: one echo upstream; wrk $threads threads, $conns connections; $rounds rounds of ${seconds}s phases (after ${warmup}s warm-ups) taking turns; $cores cores"
for ((round = 1; round <= rounds; round++)); do
    say " round $round of $rounds"
    for ph in "${phases[@]}"; do
        run_phase "$ph" "$round"
    done
    # the PostgreSQL reference of the round: the better of the two client counts
    all_rps[pgref]+="$(printf '%s\n' "${rps[pgbench-16]:-0}" "${rps[pgbench-32]:-0}" | sort -g | tail -1) "
done
declare -A label=(
    [direct]="echo upstream, direct"
    [nginx]="nginx proxy, no key"
    [nginx-keyed]="nginx proxy, unique keys (forwarded as is)"
    [sqlite-pass]="idem serve, SQLite: no key (pass-through)"
    [sqlite-replay]="idem serve, SQLite: replays"
    [sqlite-unique]="idem serve, SQLite: unique keys"
    [pg-pass]="idem serve, PostgreSQL: no key"
    [pg-replay]="idem serve, PostgreSQL: replays"
    [pg-unique]="idem serve, PostgreSQL: unique keys"
    [pgalone-replay]="idem serve, PostgreSQL ungrouped: replays"
    [pgalone-unique]="idem serve, PostgreSQL ungrouped: unique keys"
    [redis-replay]="idem serve, Redis: replays"
    [redis-unique]="idem serve, Redis: unique keys"
    [rwait-unique]="idem serve, Redis WAIT 1: unique keys"
    [rcluster-replay]="idem serve, Redis Cluster: replays"
    [rcluster-unique]="idem serve, Redis Cluster: unique keys"
    [dynamo-replay]="idem serve, DynamoDB (moto): replays"
    [dynamo-unique]="idem serve, DynamoDB (moto): unique keys"
    [ipxmem-replay]="idempotent-proxy, in memory: replays"
    [ipxmem-unique]="idempotent-proxy, in memory: unique keys"
    [ipxredis-replay]="idempotent-proxy, Redis: replays"
    [ipxredis-unique]="idempotent-proxy, Redis: unique keys"
    [pgbench-16]="pgbench single-row INSERT, 16 clients"
    [pgbench-32]="pgbench single-row INSERT, 32 clients"
)

echo
echo "Part 1: the gateway's own cost ($cores cores, loopback; wrk -t$threads -c$conns; $rounds rounds of ${seconds}s; medians)"
echo
printf '%-44s %8s %13s %7s %7s %7s\n' "path" "req/s" "rounds" "p50 ms" "p99 ms" "errors"
for ph in "${phases[@]}"; do
    printf '%-44s %8s %13s %7s %7s %7s\n' "${label[$ph]}" "$(median "${all_rps[$ph]}")" "$(spread "${all_rps[$ph]}")" \
        "$(median "${all_p50[$ph]}")" "$(median "${all_p99[$ph]}")" "${all_bad[$ph]}"
done
echo "(errors: non-2xx answers and socket errors; for pgbench, failed transactions, and p50 is its average latency)"
for store in "${stores[@]}"; do
    [[ -z ${gw_admin_port[$store]:-} ]] || echo "gateway outcomes, $store: $(outcomes "${gw_admin_port[$store]}")"
    [[ $store != pg ]] || echo "group commit, pg (whole run): $(group_stats "${gw_admin_port[$store]}")"
    stop_proc "${gw_pid_of[$store]}"
done
[[ -z ${commits_per[pg-unique]:-}${commits_per[pgalone-unique]:-} ]] ||
    echo "PostgreSQL transactions per request (xact_commit, last round): unique keys ${commits_per[pg-unique]:-}, replays ${commits_per[pg-replay]:-}; ungrouped: unique keys ${commits_per[pgalone-unique]:-}, replays ${commits_per[pgalone-replay]:-}"
echo
echo "Where the time goes, per request (last round): CPU microseconds by process, the cores' idle time, and fsync calls"
echo
printf '%-44s %8s %8s %8s %8s %8s %8s\n' "path" "gateway" "database" "nginx" "other" "idle" "fsyncs"
for ph in "${phases[@]}"; do
    [[ -n ${cpu_of[$ph]:-} ]] || continue
    read -r c_gw c_db c_ng _ c_other c_idle <<<"${cpu_of[$ph]}"
    printf '%-44s %8s %8s %8s %8s %8s %8s\n' "${label[$ph]}" "$c_gw" "$c_db" "$c_ng" "$c_other" "$c_idle" "${fsyncs_per[$ph]}"
done
echo "(gateway: idem serve or idempotent-proxy; database: PostgreSQL's or Redis's processes; nginx: the echo upstream and the proxies;"
echo " other: wrk, the kernel's work for them all, and anything else running; idle: the cores' idle and I/O-wait time;"
echo " fsyncs: fsync and fdatasync calls on the machine, counted by perf)"
echo

# round_ratios A_LIST B_LIST: each round's ratio, in round order.
round_ratios() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, " "); split(b, y, " ")
        for (i = 1; i <= n; i++) printf "%s%.2f", (i > 1 ? " " : ""), (y[i] > 0 ? x[i] / y[i] : 0)
        print "" }'
}
# rounds_meeting RATIOS TARGET: how many of the rounds' ratios reach TARGET.
rounds_meeting() {
    awk -v t="$2" '{ for (i = 1; i <= NF; i++) if ($i + 0 >= t) k++ } END { printf "%d/%d", k, NF }' <<<"$1"
}
verdicts=0 verdicts_met=0
# target_row WHAT A B TARGET [every]: the median of the rounds' ratios of A
# to B against TARGET, each round's ratio and how many rounds meet it. With
# "every", the target is the lowest round's, not the median's.
target_row() {
    local what=$1 m range per met lowest verdict
    [[ -n ${all_rps[$2]:-} && -n ${all_rps[$3]:-} ]] || return 0
    read -r m range < <(ratios "${all_rps[$2]}" "${all_rps[$3]}")
    per=$(round_ratios "${all_rps[$2]}" "${all_rps[$3]}")
    met=$(rounds_meeting "$per" "$4")
    if [[ ${5:-} == every ]]; then
        lowest=${range%-*}
        verdict="$(meets "$lowest" "$4") (every round)"
    else
        verdict="$(meets "$m" "$4") (median)"
    fi
    verdicts=$((verdicts + 1))
    [[ $verdict != NOT* ]] && verdicts_met=$((verdicts_met + 1))
    printf '%-50s %7s  >= %-4s %-22s %-18s %s\n' "$what" "${m}x" "$4" "$verdict" "$met rounds" "$per"
}
info_row() {
    local m range
    [[ -n ${all_rps[$2]:-} && -n ${all_rps[$3]:-} ]] || return 0
    read -r m range < <(ratios "${all_rps[$2]}" "${all_rps[$3]}")
    printf '%-50s %7s %11s\n' "$1" "${m}x" "$range"
}
echo "Targets: each ratio's median over the rounds (or its lowest round, where marked) against its target;"
echo "then how many rounds meet the target on their own, and each round's ratio in order."
echo
printf '%-50s %7s  %-7s %-22s %-18s %s\n' "ratio" "median" "target" "verdict" "rounds meeting it" "each round"
target_row "pass-through (SQLite) / nginx, no key" sqlite-pass nginx 1.0
target_row "pass-through (PostgreSQL) / nginx, no key" pg-pass nginx 1.0
target_row "replays (SQLite) / nginx, keyed" sqlite-replay nginx-keyed 1.2
target_row "replays (PostgreSQL) / nginx, keyed" pg-replay nginx-keyed 0.5
target_row "unique keys (SQLite) / nginx, keyed" sqlite-unique nginx-keyed 0.5
target_row "unique keys (PostgreSQL) / pgbench INSERT" pg-unique pgref 0.35
target_row "unique keys: Redis / SQLite" redis-unique sqlite-unique 1.0
target_row "unique keys: idem SQLite / idempotent-proxy Redis" sqlite-unique ipxredis-unique 1.1 every
target_row "replays: idem SQLite / idempotent-proxy memory" sqlite-replay ipxmem-replay 1.1 every
((verdicts == 0)) || echo "targets met: $verdicts_met of $verdicts"
echo
printf '%-50s %7s %11s\n' "other ratios" "median" "rounds"
info_row "unique keys (PostgreSQL): grouped / ungrouped" pg-unique pgalone-unique
info_row "replays (PostgreSQL): grouped / ungrouped" pg-replay pgalone-replay
info_row "unique keys: Redis / PostgreSQL" redis-unique pg-unique
info_row "unique keys: Redis WAIT 1 / Redis" rwait-unique redis-unique
info_row "unique keys: Redis Cluster / Redis" rcluster-unique redis-unique
info_row "replays: Redis / nginx, keyed" redis-replay nginx-keyed
info_row "replays: Redis Cluster / nginx, keyed" rcluster-replay nginx-keyed
info_row "unique keys: DynamoDB (moto) / SQLite" dynamo-unique sqlite-unique
info_row "replays: DynamoDB (moto) / nginx, keyed" dynamo-replay nginx-keyed
info_row "unique keys: idem Redis / idempotent-proxy Redis" redis-unique ipxredis-unique
info_row "replays: idem PostgreSQL / idempotent-proxy memory" pg-replay ipxmem-replay
info_row "replays: idem Redis / idempotent-proxy Redis" redis-replay ipxredis-replay
info_row "nginx, no key / direct" nginx direct
info_row "nginx, keyed / nginx, no key" nginx-keyed nginx

if ((perf)) && [[ -s $work/perf.data ]]; then
    echo
    echo "perf, ${label[$perf_phase]:-$perf_phase} (last round): CPU samples by command (perf record -a -g)"
    { perf report -i "$work/perf.data" --stdio --no-children --sort comm -g none 2>/dev/null || true; } |
        awk '/^ *[0-9.]+%/ && n++ < 12'
    echo
    echo "perf, the same: top symbols of idem serve (self time, share of its own samples)"
    profiled=${gw_pid_of[${perf_phase%-*}]:-}
    if [[ -n $profiled ]]; then
        { perf report -i "$work/perf.data" --stdio --no-children --pid "$profiled" --percentage relative \
            --sort dso,sym -g none 2>/dev/null || true; } | awk '/^ *[0-9.]+%/ && n++ < 25'
        if [[ -n $flame ]]; then
            perf script -i "$work/perf.data" --pid "$profiled" 2>/dev/null | inferno-collapse-perf |
                inferno-flamegraph --title "${label[$perf_phase]:-$perf_phase}" >"$flame" &&
                echo "flame graph of the gateway's samples: $flame"
        fi
    fi
fi

# --- part 2: several nodes on one store ---------------------------------------

# check_once RUN LB_URL: every check key sent $copies times (adjacent copies run
# concurrently and go to different nodes), then once more until each has its
# final answer; each key must have reached the upstream exactly once.
check_once() {
    local n=$1 lb=$2
    local prefix="check-$n-$run_id-" pending round=0 start_lines applied once more missing
    start_lines=$(wc -l <"$work/echo/keys.log")
    awk -v keys="$check_keys" -v copies="$copies" -v p="$prefix" \
        'BEGIN { for (k = 0; k < keys; k++) for (c = 0; c < copies; c++) print p k }' >"$work/check-$n.keys"
    post_keys "$work/check-$n.keys" "$lb" "$work/check-$n.burst"
    check_codes[$n]=$(awk '{ c[$1 ($2 == "true" ? " replayed" : "")]++ }
        END { for (k in c) printf "%s: %d, ", k, c[k] }' "$work/check-$n.burst")
    check_codes[$n]=${check_codes[$n]%, }
    # the final state: each key once more, again for those answered 409
    sort -u "$work/check-$n.keys" >"$work/check-$n.pending"
    pending=$(wc -l <"$work/check-$n.pending")
    while ((pending > 0 && round < 20)); do
        round=$((round + 1))
        ((round == 1)) || sleep 1
        post_keys "$work/check-$n.pending" "$lb" "$work/check-$n.final"
        awk '$1 != 200 { print $3 }' "$work/check-$n.final" >"$work/check-$n.pending"
        pending=$(wc -l <"$work/check-$n.pending")
    done
    sleep 0.5
    tail -n +"$((start_lines + 1))" "$work/echo/keys.log" | { grep "^$prefix" || true; } | sort | uniq -c >"$work/check-$n.counts"
    applied=$(wc -l <"$work/check-$n.counts")
    once=$(awk '$1 == 1' "$work/check-$n.counts" | wc -l)
    more=$(awk '$1 > 1' "$work/check-$n.counts" | wc -l)
    missing=$((check_keys - applied))
    check_sent[$n]=$((check_keys * copies))
    if ((once == check_keys && more == 0 && pending == 0)); then
        check_ok[$n]=yes
    else
        check_ok[$n]=no
        failed=1
        say "  check on $n nodes (store-count): $once keys reached the upstream once, $more more than once, $missing never; $pending without a final answer"
    fi
}

declare -A check_ok check_codes check_sent node_share node_label=([pg]="one PostgreSQL database" [rcluster]="one Redis Cluster (three primaries)")
[[ -z ${node_counts// /} ]] || for store in $node_stores; do
say ""
say "part 2: several idem serve nodes on ${node_label[$store]:-$store} behind nginx (round robin)"
for count in $node_counts; do
    n=$store-$count
    node_pids=()
    node_admins=()
    servers=""
    for ((i = 1; i <= count; i++)); do
        free_port
        np=$port
        free_port
        na=$port
        gateway_start "node-$n-$i" "$(store_url "$store")" "$np" "$na"
        node_pids+=("$last_pid")
        node_admins+=("$na")
        servers+="server 127.0.0.1:$np; "
    done
    free_port
    lb_port=$port
    nginx_start "lb-$n" "worker_processes 1;
events { worker_connections 4096; }
http {
    @TMP@
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    upstream nodes {
        $servers
        keepalive 64;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$lb_port;
        location / {
            proxy_pass http://nodes;
            proxy_http_version 1.1;
            proxy_set_header Connection '';
            proxy_next_upstream off;
        }
    }
}"
    lb_pid=$last_pid
    wait_http "http://127.0.0.1:$lb_port/" "lb-$n" "$lb_pid"
    lb="http://127.0.0.1:$lb_port/"
    wrk_phase "nodes$n-unique" "$lb" unique.lua "u-nodes$n-$run_id"
    prime "r-nodes$n-$run_id" "$lb"
    wrk_phase "nodes$n-replay" "$lb" replay.lua "r-nodes$n-$run_id" "$replay_keys"
    say "  correctness check: $check_keys keys x $copies copies"
    check_once "$n" "$lb"
    share=""
    for na in "${node_admins[@]}"; do
        share+="$(curl -s "http://127.0.0.1:$na/metrics" | awk '/^gateway_requests_total\{/ { s += $NF } END { printf "%d", s }') "
    done
    node_share[$n]=${share% }
    stop_proc "$lb_pid"
    for pid in "${node_pids[@]}"; do
        stop_proc "$pid"
    done
done
done

[[ -z ${node_counts// /} ]] || for store in $node_stores; do
echo
echo "Part 2: idem serve nodes on ${node_label[$store]:-$store} behind nginx round robin ($cores cores)"
echo
first=$store-${node_counts%% *}
printf '%-6s %13s %7s %9s %9s %13s %7s %9s %9s\n' nodes "unique req/s" "x${first#*-}" "p50 ms" "p99 ms" "replays req/s" "x${first#*-}" "p50 ms" "p99 ms"
for count in $node_counts; do
    n=$store-$count
    printf '%-6s %13s %7s %9s %9s %13s %7s %9s %9s\n' "$count" \
        "${rps[nodes$n-unique]}" "$(ratio "${rps[nodes$n-unique]}" "${rps[nodes$first-unique]}")x" "${p50[nodes$n-unique]}" "${p99[nodes$n-unique]}" \
        "${rps[nodes$n-replay]}" "$(ratio "${rps[nodes$n-replay]}" "${rps[nodes$first-replay]}")x" "${p50[nodes$n-replay]}" "${p99[nodes$n-replay]}"
done
echo "(errors: $(for count in $node_counts; do printf '%s nodes %s/%s; ' "$count" "${bad[nodes$store-$count-unique]}" "${bad[nodes$store-$count-replay]}"; done)unique/replays)"
echo
for count in $node_counts; do
    n=$store-$count
    echo "$count nodes: requests per node ${node_share[$n]}; check answers: ${check_codes[$n]}"
    echo "duplicates across nodes: $check_keys keys (${check_sent[$n]} requests), each applied once: ${check_ok[$n]}"
done
done

if ((failed)); then
    say "FAILED: some key reached the upstream more than once, or never"
    exit 1
fi
