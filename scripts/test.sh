#!/usr/bin/env bash
# The whole test suite, as CI runs it: services checked (and started or
# installed when missing), every crate's tests against the real servers, doc
# tests, and the test runner's summary line at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh

export IDEM_REQUIRE_SERVICES=1
export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "[test] cargo-nextest not found; installing it from crates.io" >&2
  cargo install --locked cargo-nextest >&2
fi

cargo test --workspace --doc
cargo nextest run --workspace --all-targets --no-fail-fast
