#!/usr/bin/env bash
# Memory under steady load: the resident set (VmRSS) of `idem serve` and of
# `idem forward`, sampled every second for the length of a steady load, with
# the figures (RSS at one minute, at the end, the peak, and the growth per
# minute fitted over the last 80 % of the run) and a plot of each.
#
#   bench/rss.sh [--minutes N | --quick] [--only serve|forward] [--out DIR]
#                [--serve-rate R] [--forward-rate R] [--replay-share S]
#                [--dup-share S] [--connections C] [--amqp amqp://USER:PASS@HOST:PORT]
#
#   serve    idem serve on the embedded SQLite store in front of an nginx that
#            answers 200; wrk sends POSTs over C connections (default 16),
#            each pausing C*1000/R ms between requests, which caps the load at
#            R requests/s (default 2000; 0 = no pause); each request has a
#            fresh Idempotency-Key except a share S (default 0.2) that repeats
#            a key answered a moment before.
#   forward  idem forward consuming a RabbitMQ queue made for the run, POSTing
#            each message to an idem serve in front of the same nginx; a
#            publisher sends R messages/s (default 500), each with its own
#            message id, and a share S (default 0.1) a second time.
#
# --minutes N (default 10) is the length of each load; --quick is one minute,
# a check that everything runs: a minute is all warm-up, and says nothing.
# The run is called flat when the fitted growth is under 0.5 MiB/min. Results
# (CSV of the samples, SVG plots, logs, summary.md) go to --out, by default
# target/bench-rss in this repository. Loopback only. The binary is $IDEM_BIN,
# or target/release/idem after `cargo build --release -p idem-cli`. Needs wrk
# and nginx (installed with apt-get when missing and run as root), RabbitMQ
# for the forward run, and python3; pika and matplotlib are installed in a
# virtualenv under ~/.cache/idem/bench-venv ($IDEM_BENCH_VENV).
set -euo pipefail

minutes=10
only=""
serve_rate=2000
forward_rate=500
replay_share=0.2
dup_share=0.1
connections=16
amqp=amqp://guest:guest@127.0.0.1:5672
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-rss
while (($#)); do
    case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --quick) minutes=1; shift ;;
    --only) only=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --serve-rate) serve_rate=$2; shift 2 ;;
    --forward-rate) forward_rate=$2; shift 2 ;;
    --replay-share) replay_share=$2; shift 2 ;;
    --dup-share) dup_share=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --amqp) amqp=$2; shift 2 ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done
[[ $minutes =~ ^[1-9][0-9]*$ ]] || { echo "--minutes takes a whole number of minutes" >&2; exit 2; }
case "$only" in "" | serve | forward) ;; *) echo "--only takes serve or forward" >&2; exit 2 ;; esac
[[ $amqp == amqp://*@127.0.0.1:* || $amqp == amqp://*@localhost:* ]] || { echo "--amqp must be a loopback broker" >&2; exit 2; }
seconds=$((minutes * 60))

say() { printf '[rss %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The binary.
if [[ -n ${IDEM_BIN:-} ]]; then
    idem=$IDEM_BIN
else
    say "building idem (cargo build --release -p idem-cli)"
    (cd "$root" && cargo build --release -p idem-cli)
    idem=$root/target/release/idem
fi
[[ -x $idem ]] || { echo "no idem binary at $idem" >&2; exit 1; }

# The load tools.
for tool in wrk nginx; do
    if ! command -v "$tool" >/dev/null; then
        package=$tool
        [[ $tool == nginx ]] && package=nginx-light
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            say "installing $package"
            apt-get install -y -qq "$package" >/dev/null
        else
            echo "$tool not found: install it (apt-get install $package)" >&2
            exit 1
        fi
    fi
done
venv=${IDEM_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/idem/bench-venv}
if ! "$venv/bin/python" -c 'import pika, matplotlib' 2>/dev/null; then
    say "installing pika and matplotlib into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q pika matplotlib
fi
py() { "$venv/bin/python" "$root/bench/rss.py" "$@"; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-rss.XXXXXX")
pids=()
queue=""
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n $queue ]]; then
        py queue delete "$amqp/%2F" "$queue" 2>/dev/null || say "could not delete queue $queue"
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts a command in the background, its output to a log; the pid is in $started.
start() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    started=$!
    pids+=("$started")
}

# Sends a signal and waits (up to 20 s, then SIGKILL) for the process to end.
stop() {
    local pid=$1 signal=$2 tries=0
    kill "-$signal" "$pid" 2>/dev/null || return 0
    while kill -0 "$pid" 2>/dev/null && ((tries < 200)); do
        sleep 0.1
        tries=$((tries + 1))
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# Waits (up to 30 s) until URL answers.
ready() {
    local url=$1 pid=$2 tries=0
    until curl -fsS -o /dev/null "$url" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { echo "process $pid ended before $url answered" >&2; return 1; }
        ((tries < 300)) || { echo "$url did not answer within 30 s" >&2; return 1; }
        sleep 0.1
        tries=$((tries + 1))
    done
}

# The sum of the samples whose line starts with PREFIX, from an admin listener.
counter() {
    local url=$1 prefix=$2
    curl -fsS "$url/metrics" | awk -v prefix="$prefix" 'index($0, prefix) == 1 { sum += $NF } END { printf "%d\n", sum }'
}

read -r nginx_port serve_port serve_admin endpoint_port endpoint_admin forward_admin < <(py ports 6)

# The upstream: a private nginx that answers every request 200.
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 100000000;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            default_type application/json;
            return 200 '{"ok":true}\n';
        }
    }
}
EOF
start "$work/nginx/stdout.log" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log"
nginx_pid=$started
ready "http://127.0.0.1:$nginx_port/" "$nginx_pid"

{
    echo "idem: $("$idem" --version)"
    echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -sr)"
    echo "load: $minutes min each"
} >"$out/machine.txt"
cat "$out/machine.txt" >&2

summary=$out/summary.md
{
    echo "| process | load | served | rate | RSS at 1 min | RSS at end | max | growth (last 80 %) | per request/message | store at end | verdict |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$summary"

# Prints and records the figures of one run: figures PROCESS LOAD SERVED UNIT.
figures() {
    py report "$out/$1.csv" "$out/$1-rss.svg" "idem $1" "$3" "$4" >"$out/$1.figures"
    # The report's key=value lines (served, unit, rate_per_s, rss_1min_mib, ...).
    # shellcheck disable=SC1090,SC2154
    (
        . "$out/$1.figures"
        say "$1: $served $unit in $minutes min (${rate_per_s}/s); RSS at 1 min ${rss_1min_mib} MiB, at the end ${rss_end_mib} MiB, max ${rss_max_mib} MiB"
        say "$1: growth over the last 80 %: ${growth_mib_per_min} MiB/min (${growth_pct_per_min} % of RSS per minute; first half ${growth_first_half}, second half ${growth_second_half}), ${bytes_per_unit} bytes per ${unit%s} -> $verdict"
        # shellcheck disable=SC2016
        printf '| `idem %s` | %s | %s %s | %s/s | %s MiB | %s MiB | %s MiB | %s MiB/min (%s %%/min) | %s B | %s MiB | %s |\n' \
            "$1" "$2" "$served" "$unit" "$rate_per_s" "$rss_1min_mib" "$rss_end_mib" "$rss_max_mib" \
            "$growth_mib_per_min" "$growth_pct_per_min" "$bytes_per_unit" "$store_end_mib" "$verdict" >>"$summary"
        if [[ $verdict != flat ]]; then
            say "$1: look at $out/$1-rss.svg: steps of about 2 MiB that stop are SQLite page caches filling (docs/src/bench-memory.md); a steady slope is a leak"
        fi
    )
}

run_serve() {
    local pause=0
    ((serve_rate > 0)) && pause=$((connections * 1000 / serve_rate))
    say "serve: idem serve on SQLite, wrk with $connections connections (pause ${pause} ms each), ${replay_share} repeats, $minutes min"
    start "$out/serve.log" "$idem" --store "sqlite://$work/serve.db" serve \
        --upstream "http://127.0.0.1:$nginx_port" --listen "127.0.0.1:$serve_port" \
        --admin-listen "127.0.0.1:$serve_admin" --principal-header none
    local pid=$started
    ready "http://127.0.0.1:$serve_admin/healthz" "$pid"
    start "$work/serve-sample.log" py sample "$pid" "$out/serve.csv" "$seconds" "$work/serve.db" "$work/serve.db-wal"
    local sampler=$started
    # In the background and waited for, so that a signal to this script is
    # handled at once.
    start "$out/serve-wrk.txt" wrk -t 2 -c "$connections" -d "${seconds}s" --timeout 10s \
        -s "$root/bench/rss-serve.lua" "http://127.0.0.1:$serve_port/orders" -- "$replay_share" "$pause" "rss"
    wait "$started"
    wait "$sampler" || { cat "$work/serve-sample.log" >&2; return 1; }
    local served stored replayed
    served=$(counter "http://127.0.0.1:$serve_admin" 'gateway_requests_total')
    stored=$(counter "http://127.0.0.1:$serve_admin" 'gateway_requests_total{outcome="forwarded_stored"')
    replayed=$(counter "http://127.0.0.1:$serve_admin" 'gateway_requests_total{outcome="replayed"')
    stop "$pid" TERM
    say "serve: $(grep -E 'requests in|keys:' "$out/serve-wrk.txt" | tr -s ' ' | paste -sd';')"
    say "serve: the gateway counted $served requests: $stored forwarded and stored, $replayed replayed"
    figures serve "wrk, $connections connections, $(awk -v s="$replay_share" 'BEGIN { printf "%d", s * 100 }') % repeated keys" "$served" requests
}

run_forward() {
    queue=idem-rss-$$
    local from="$amqp/$queue"
    say "forward: queue $queue, $forward_rate msg/s, ${dup_share} sent twice, $minutes min"
    py queue declare "$amqp/%2F" "$queue"
    start "$out/forward-endpoint.log" "$idem" --store "sqlite://$work/endpoint.db" serve \
        --upstream "http://127.0.0.1:$nginx_port" --listen "127.0.0.1:$endpoint_port" \
        --admin-listen "127.0.0.1:$endpoint_admin" --principal-header none
    local endpoint=$started
    ready "http://127.0.0.1:$endpoint_admin/healthz" "$endpoint"
    # Started with SIGINT restored (a script's background jobs ignore it), so
    # that Ctrl-C's signal stops it in order and it prints what it did.
    start "$out/forward.log" env --default-signal=INT "$idem" --store "sqlite://$work/forward.db" forward \
        --from "$from" --to "http://127.0.0.1:$endpoint_port/orders" --key message-id \
        --admin-listen "127.0.0.1:$forward_admin"
    local pid=$started
    ready "http://127.0.0.1:$forward_admin/healthz" "$pid"
    start "$work/forward-sample.log" py sample "$pid" "$out/forward.csv" "$seconds" "$work/forward.db" "$work/forward.db-wal"
    local sampler=$started
    start "$out/forward-publisher.txt" py publish "$amqp/%2F" "$queue" "$forward_rate" "$seconds" "$dup_share" "rss-$$"
    wait "$started"
    wait "$sampler" || { cat "$work/forward-sample.log" >&2; return 1; }
    # What was forwarded while the load ran (each message is one request to
    # the endpoint), and what the publisher was ahead by at its end.
    local served backlog depth tries=0
    served=$(counter "http://127.0.0.1:$endpoint_admin" 'gateway_requests_total')
    backlog=$(py queue depth "$amqp/%2F" "$queue")
    depth=$backlog
    while ((depth > 0 && tries < 60)); do
        sleep 1
        depth=$(py queue depth "$amqp/%2F" "$queue")
        tries=$((tries + 1))
    done
    sleep 2
    stop "$pid" INT
    stop "$endpoint" TERM
    py queue delete "$amqp/%2F" "$queue"
    queue=""
    local line applied replayed
    line=$(grep '^stopped:' "$out/forward.log" || true)
    applied=$(sed -n 's/^stopped: \([0-9]*\) applied.*/\1/p' <<<"$line")
    replayed=$(sed -n 's/.* applied, \([0-9]*\) duplicates.*/\1/p' <<<"$line")
    say "forward: $(cat "$out/forward-publisher.txt"); $served forwarded while it ran, $backlog waiting in the queue at its end, $depth after the drain"
    say "forward: $line (${applied:-?} + ${replayed:-?} in all, with the drain)"
    figures forward "RabbitMQ, $forward_rate msg/s, $(awk -v s="$dup_share" 'BEGIN { printf "%d", s * 100 }') % published twice" \
        "$served" messages
}

[[ $only == forward ]] || run_serve
[[ $only == serve ]] || run_forward
say "results in $out"
cat "$summary"
