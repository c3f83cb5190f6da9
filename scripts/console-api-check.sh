#!/usr/bin/env bash
# The console's JSON API checked against the OpenAPI document it serves, with
# schemathesis: requests generated from the document (valid and invalid) to
# a console over a SQLite and a PostgreSQL store holding a demo's records.
# Fails on any 5xx, on an answer that does not match its documented schema
# or media type, and on an error that is not an application/problem+json
# body (scripts/console_api_checks.py). schemathesis is installed from PyPI
# into a venv in the cache (IDEM_CACHE) once; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION="${SCHEMATHESIS_VERSION:-4.32.5}"
cache="${IDEM_CACHE:-$HOME/.cache/idem}"
venv="$cache/schemathesis-$SCHEMATHESIS_VERSION"
log() { echo "[console-api] $*" >&2; }

if ! [ -x "$venv/bin/st" ]; then
  log "installing schemathesis $SCHEMATHESIS_VERSION from PyPI into $venv"
  python3 -m venv "$venv" >&2 || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 && python3 -m venv "$venv" >&2
  } || { log "ERROR: cannot make a Python venv (install python3-venv)"; exit 1; }
  "$venv/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION" >&2 \
    || { log "ERROR: cannot install schemathesis $SCHEMATHESIS_VERSION from PyPI"; exit 1; }
fi

cargo build -q -p idem-cli
idem="${CARGO_TARGET_DIR:-target}/debug/idem"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

printf 'console-api-check-token\n' >"$work/token"
postgres="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
database="idem_console_api_$$"
psql "$postgres" -qc "DROP DATABASE IF EXISTS $database" >/dev/null
psql "$postgres" -qc "CREATE DATABASE $database" >/dev/null
stores=("sqlite://$work/idem.db" "${postgres%/*}/$database")

port=9391
status=0
for store in "${stores[@]}"; do
  "$idem" --store "$store" migrate >/dev/null
  "$idem" --store "$store" demo --payments 40 >/dev/null
  "$idem" --store "$store" console --listen "127.0.0.1:$port" --token-file "$work/token" \
    >"$work/console.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$port/api/v1/openapi.json" >/dev/null && break
    sleep 0.2
  done
  log "checking the API of a console over ${store%%://*}"
  if ! PYTHONPATH=scripts SCHEMATHESIS_HOOKS=console_api_checks "$venv/bin/st" run \
      "http://127.0.0.1:$port/api/v1/openapi.json" \
      --header "Authorization: Bearer console-api-check-token" \
      --checks not_a_server_error,response_schema_conformance,content_type_conformance,problem_body \
      --max-examples 60 --seed 1 --no-color >"$work/schemathesis.log" 2>&1; then
    cat "$work/schemathesis.log" >&2
    log "ERROR: the console's API over ${store%%://*} failed the checks above"
    status=1
  else
    tail -n 12 "$work/schemathesis.log" >&2
  fi
  port=$((port + 1))
done
psql "$postgres" -qc "DROP DATABASE IF EXISTS $database WITH (FORCE)" >/dev/null || true
exit "$status"
