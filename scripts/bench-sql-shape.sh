#!/usr/bin/env bash
# What the effectively-once transaction costs PostgreSQL itself, with no Rust
# client, no broker and no pool in the way: pgbench drives the statements of
# `idem bench consume`'s single-message phases against a fresh database made
# by `idem migrate`, and prints each shape's transactions per second and its
# ratio to the plain debit, as medians over rounds taken in turns.
#
#   scripts/bench-sql-shape.sh [--gateway] [--rounds N] [--seconds S] [--clients C] [SERVER_URL]
#
# SERVER_URL defaults to postgres://postgres@127.0.0.1:5432/postgres; a
# database idem_sql_shape_<pid> is made on it and dropped afterwards. Needs
# pgbench and psql (the PostgreSQL client packages) and a release build of
# `idem` (cargo build --release -p idem-cli; IDEM_BIN names another binary).
#
# The shapes, one line per round trip, as the Rust paths send them (the pool's
# pings, which the plain consumer pays and the claim-first checkout skips, are
# left out of both):
#   plain           BEGIN | debit | ledger row | COMMIT
#   lock            BEGIN and try the key's lock | debit | ledger row | COMMIT
#   record          BEGIN | debit | ledger row | insert the record and COMMIT
#   effectively-once  BEGIN | try the key's lock and read its record |
#                   debit | ledger row | insert the record and COMMIT
#
# --gateway measures instead what a new key costs `idem serve` on PostgreSQL
# (a leased claim, then its completion, each a transaction of its own; group
# commit's grouped way is not shown), against the single-row INSERT of
# `bench/gateway.sh`'s pgbench phase (16 clients by default there):
#   insert          the single-row INSERT
#   two-inserts     two single-row INSERTs, each its own transaction: two
#                   durable commits, the least a claim and a completion cost
#   claim-complete  BEGIN, try the key's lock and read its record |
#                   insert the in-flight record, COMMIT | (the closed
#                   transaction's ROLLBACK) BEGIN, wait for the key's lock,
#                   the fenced completion, COMMIT (the locked way)
#   one-statement   the claim as one INSERT ... ON CONFLICT DO UPDATE
#                   trying the key's lock | the fenced completion alone
#                   (the way a new key goes now; see the book's PostgreSQL
#                   chapter, "What a new key costs")
# The store sends the record's statements as prepared ones; here they are
# written out and parsed on every call, so claim-complete is a little slower
# than the store's own SQL, and one-statement much slower: its one long
# upsert is parsed and planned on every call, which the store's prepared
# statement never is (the store's own gain is measured by
# `cargo bench -p idem-postgres --bench new_key`).
set -euo pipefail

rounds=3
seconds=8
clients=8
server=postgres://postgres@127.0.0.1:5432/postgres
gateway=false
while (($#)); do
    case "$1" in
    --gateway) gateway=true; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    -h | --help) sed -n '2,44p' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
    *) server=$1; shift ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
idem=${IDEM_BIN:-$root/target/release/idem}
[[ -x $idem ]] || { echo "no $idem: run cargo build --release -p idem-cli first" >&2; exit 1; }
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | sort -V | tail -1 || true)
[[ -n $pgbench && -x $pgbench ]] || { echo "pgbench not found: install postgresql-client (apt-get install postgresql-client)" >&2; exit 1; }
command -v psql >/dev/null || { echo "psql not found: install postgresql-client" >&2; exit 1; }

db=idem_sql_shape_$$
url=${server%/*}/$db
work=$(mktemp -d)
cleanup() {
    psql -q "$server" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

psql -q "$server" -c "CREATE DATABASE $db" >/dev/null
"$idem" --store "$url" migrate >/dev/null
psql -q "$url" >/dev/null <<'SQL'
CREATE TABLE idem_demo_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
CREATE TABLE idem_demo_ledger (payment_id TEXT NOT NULL, account BIGINT NOT NULL, amount BIGINT NOT NULL);
INSERT INTO idem_demo_accounts SELECT id, 1000000000000 FROM generate_series(0, 999) AS id;
SQL

head='\set account random(0, 999)
\set key random(1, 999999999999)'
debit='UPDATE idem_demo_accounts SET balance = balance - 1 WHERE id = :account RETURNING balance;
INSERT INTO idem_demo_ledger (payment_id, account, amount) VALUES (:key, :account, 1);'
# The record as the runtime writes it for a debit: a 32-byte fingerprint and
# the debit's outcome (the balance as JSON).
record="INSERT INTO idem_records (scope, key, fingerprint, state, token, lease_until, outcome_kind, outcome_body, outcome_meta, created_at, updated_at, expires_at) VALUES ('bench-consume', :key, '\\x$(printf '%064d' 0)'::bytea, 'completed', 1, NULL, 'success', '\\x7b2262616c616e6365223a3939397d'::bytea, '{\"content-type\":\"application/json\"}', 1, 1, 604800001)"
begin='BEGIN ISOLATION LEVEL READ COMMITTED'

printf '%s\nBEGIN;\n%s\nCOMMIT;\n' "$head" "$debit" >"$work/plain.sql"
printf '%s\n%s \\; SELECT pg_try_advisory_xact_lock(:key);\n%s\nCOMMIT;\n' "$head" "$begin" "$debit" >"$work/lock.sql"
printf '%s\n%s;\n%s\n%s \\; COMMIT;\n' "$head" "$begin" "$debit" "$record" >"$work/record.sql"
printf "%s\n%s;\nSELECT pg_try_advisory_xact_lock(:key) \\\\; SELECT state, token, outcome_body FROM idem_records WHERE scope = 'bench-consume' AND key = CAST(:key AS TEXT);\n%s\n%s \\\\; COMMIT;\n" \
    "$head" "$begin" "$debit" "$record" >"$work/effectively-once.sql"

shapes=(plain lock record effectively-once)

if $gateway; then
    # The gateway's shapes. The key is a random number (unique in practice);
    # the lock number stands in for the key's hash.
    psql -q "$url" -c 'CREATE TABLE idem_gateway_insert (id TEXT PRIMARY KEY, body BYTEA NOT NULL, n INT NOT NULL)' >/dev/null
    insert="INSERT INTO idem_gateway_insert VALUES (gen_random_uuid()::text, '\\x7b226f6b223a747275657d0a'::bytea, 1);"
    printf '%s\n' "$insert" >"$work/insert.sql"
    printf '%s\n%s\n' "$insert" "$insert" >"$work/two-inserts.sql"
    zeros=$(printf '%064d' 0)
    gw_key="CAST(:key AS TEXT)"
    cat >"$work/claim-complete.sql" <<SQL
\set key random(1, 999999999999)
BEGIN ISOLATION LEVEL READ COMMITTED \\; SET LOCAL bytea_output = hex \\; SELECT pg_try_advisory_xact_lock(:key) AS granted \\; SELECT scope, key, fingerprint, state, token, lease_until, outcome_kind, outcome_body, outcome_meta, created_at, updated_at, expires_at FROM idem_records WHERE scope = 'gateway' AND key = $gw_key;
INSERT INTO idem_records (scope, key, fingerprint, state, token, lease_until, outcome_kind, outcome_body, outcome_meta, created_at, updated_at, expires_at) VALUES ('gateway', $gw_key, '\\x$zeros'::bytea, 'in_flight', 7, 1030001, NULL, NULL, NULL, 1000001, 1000001, 87400001) \\; COMMIT \\; BEGIN;
ROLLBACK \\; BEGIN ISOLATION LEVEL READ COMMITTED \\; SELECT pg_advisory_xact_lock(:key) \\; WITH current AS (SELECT token FROM idem_records WHERE scope = 'gateway' AND key = $gw_key), changed AS (UPDATE idem_records SET state = 'completed', outcome_kind = 'success', outcome_body = '\\x7b226f6b223a747275657d0a'::bytea, outcome_meta = '{"status":"200","content-type":"application/json"}', lease_until = NULL, updated_at = 1000002 WHERE scope = 'gateway' AND key = $gw_key AND token = 7 AND state = 'in_flight' RETURNING 1) SELECT EXISTS (SELECT 1 FROM changed) AS held, (SELECT token FROM current) AS current \\; COMMIT;
SQL
    cat >"$work/one-statement.sql" <<SQL
\set key random(1, 999999999999)
SET LOCAL lock_timeout = '50ms' \\; INSERT INTO idem_records AS r (scope, key, fingerprint, state, token, lease_until, outcome_kind, outcome_body, outcome_meta, created_at, updated_at, expires_at) SELECT 'gateway', $gw_key, '\\x$zeros'::bytea, 'in_flight', 7, 1030001, NULL::text, NULL::bytea, NULL::text, 1000001, 1000001, 87400001 WHERE pg_try_advisory_xact_lock(:key) ON CONFLICT (scope, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, state = 'in_flight', token = CASE WHEN r.expires_at <= 1000001 THEN GREATEST(r.token + 1, 7) ELSE r.token + 1 END, lease_until = EXCLUDED.lease_until, outcome_kind = NULL, outcome_body = NULL, outcome_meta = NULL, created_at = CASE WHEN r.expires_at <= 1000001 THEN 1000001 ELSE r.created_at END, updated_at = 1000001, expires_at = CASE WHEN r.expires_at <= 1000001 THEN 87400001 ELSE r.expires_at END WHERE r.expires_at <= 1000001 OR (r.state = 'in_flight' AND r.lease_until IS NULL AND r.fingerprint = EXCLUDED.fingerprint) RETURNING token, created_at, expires_at;
WITH current AS (SELECT token FROM idem_records WHERE scope = 'gateway' AND key = $gw_key), changed AS (UPDATE idem_records SET state = 'completed', outcome_kind = 'success', outcome_body = '\\x7b226f6b223a747275657d0a'::bytea, outcome_meta = '{"status":"200","content-type":"application/json"}', lease_until = NULL, updated_at = 1000002 WHERE scope = 'gateway' AND key = $gw_key AND token = 7 AND state = 'in_flight' RETURNING 1) SELECT EXISTS (SELECT 1 FROM changed) AS held, (SELECT token FROM current) AS current;
SQL
    shapes=(insert two-inserts claim-complete one-statement)
fi
tps() {
    "$pgbench" -n -M simple -c "$clients" -j 2 -T "$seconds" -f "$work/$1.sql" "$url" 2>&1 |
        awk '/^tps/ { print $3; found = 1 } END { if (!found) exit 1 }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "pgbench $("$pgbench" --version | awk '{print $3}'), $clients clients, ${seconds}s per shape, $rounds rounds, database $db"
for ((round = 1; round <= rounds; round++)); do
    line="round $round:"
    for shape in "${shapes[@]}"; do
        rate=$(tps "$shape") || { echo "pgbench failed on $shape:" >&2; "$pgbench" -n -M simple -c 1 -T 1 -f "$work/$shape.sql" "$url" >&2; exit 1; }
        echo "$rate" >>"$work/$shape.tps"
        line+=" $shape $(printf '%.0f' "$rate")"
    done
    base=$(sed -n "${round}p" "$work/${shapes[0]}.tps")
    for shape in "${shapes[@]:1}"; do
        awk -v a="$(sed -n "${round}p" "$work/$shape.tps")" -v b="$base" 'BEGIN { printf "%.3f\n", a / b }' >>"$work/$shape.ratio"
    done
    echo "$line"
done

printf '%-18s %10s %12s\n' shape "tx/s" "÷ ${shapes[0]}"
printf '%-18s %10.0f %12s\n' "${shapes[0]}" "$(median <"$work/${shapes[0]}.tps")" 1.00
for shape in "${shapes[@]:1}"; do
    printf '%-18s %10.0f %11.2f×\n' "$shape" "$(median <"$work/$shape.tps")" "$(median <"$work/$shape.ratio")"
done
echo "(medians over the rounds; each ratio is taken within its round)"
