#!/usr/bin/env bash
# The whole test suite, as CI runs it: services checked (and started or
# installed when missing), every crate's tests against the real servers, doc
# tests (the README's and the book's examples among them), the book's build,
# the alert rules in ops/ and their unit tests, and the test runner's summary
# line at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh

export IDEM_REQUIRE_SERVICES=1

# A run from a fresh clone gains nothing from incremental compilation, whose
# caches take as much disk again as the test binaries (13 GiB beside 12).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# The build of every test binary takes about 15 GiB: say so at once when the
# disk is short, rather than leave the linker to fail half an hour later.
free_gib=$(( $(df --output=avail -k . | tail -n 1) / 1024 / 1024 ))
if [ "$free_gib" -lt 20 ]; then
  echo "[test] only ${free_gib} GiB free on $(df --output=target . | tail -n 1); the build needs about 15 GiB" >&2
fi
export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "[test] cargo-nextest not found; installing it from crates.io" >&2
  cargo install --locked cargo-nextest >&2
fi

# The alert rules shipped in ops/prometheus: checked, and their unit tests
# run. promtool comes with Debian's prometheus package, installed (as root,
# or with sudo) when missing.
if ! command -v promtool >/dev/null 2>&1; then
  echo "[test] promtool not found; installing Debian's prometheus package" >&2
  as_root=()
  if [ "$(id -u)" != 0 ]; then
    as_root=(sudo)
  fi
  if ! { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
    && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2 \
    && command -v promtool >/dev/null; }; then
    echo "[test] could not install promtool (Debian's prometheus package); install it and run again" >&2
    exit 1
  fi
fi
# The console's browser tests drive headless Chromium through chromedriver:
# Debian's chromium and chromium-driver, installed (as root, or with sudo)
# when missing.
if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
  echo "[test] chromium or chromedriver not found; installing Debian's chromium and chromium-driver" >&2
  as_root=()
  if [ "$(id -u)" != 0 ]; then
    as_root=(sudo)
  fi
  if ! { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
    && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >&2 \
    && command -v chromedriver >/dev/null && command -v chromium >/dev/null; }; then
    echo "[test] could not install chromium and chromium-driver (Debian's packages); install them and run again" >&2
    exit 1
  fi
fi

promtool check rules ops/prometheus/idem-alerts.yml
promtool test rules ops/prometheus/idem-alerts.test.yml

# Feature `lab` of idem-cli builds `idem bench` and `idem torture` (and
# idem-proof's fault campaign): the suite covers them.
cargo test --workspace --doc --features idem-cli/lab

# The book in docs/ (its Rust examples are doc tests of idem-doctests, run
# above). mdbook is installed from crates.io once; later runs reuse it.
# `cargo install` puts it in Cargo's bin directory, which may not be on PATH.
mdbook="$(command -v mdbook || echo "${CARGO_HOME:-$HOME/.cargo}/bin/mdbook")"
if ! "$mdbook" --version >/dev/null 2>&1; then
  echo "[test] mdbook not found; installing it from crates.io" >&2
  cargo install --locked mdbook >&2
fi
"$mdbook" build docs

# The fuzz targets in fuzz/: each replays its seeds and fuzzes for a few seconds.
bash scripts/fuzz-smoke.sh

# Every publishable crate packaged as crates.io would get it (no build: tens of seconds).
bash scripts/package.sh

# The console's API against its own OpenAPI document, with schemathesis
# (from PyPI, into a venv in the cache): no 5xx, every error a problem body.
bash scripts/console-api-check.sh

cargo nextest run --workspace --all-targets --features idem-cli/lab --no-fail-fast
