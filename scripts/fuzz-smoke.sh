#!/usr/bin/env bash
# The fuzz targets in fuzz/, as CI runs them: every target replays its seed
# corpus, then fuzzes for a short, bounded time (IDEM_FUZZ_SECONDS, 5 by
# default). A crash or a broken property fails the script, with the input
# that did it kept under fuzz/artifacts/TARGET/.
#
# cargo-fuzz is installed from crates.io when missing. The nightly toolchain
# is used when it is installed; without a sanitizer (the workspace forbids
# unsafe code) the stable one builds the targets too.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${IDEM_FUZZ_SECONDS:-5}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "[fuzz] cargo-fuzz not found; installing it from crates.io" >&2
  cargo install --locked cargo-fuzz >&2
fi
toolchain=stable
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=nightly
fi
fuzz=(cargo "+$toolchain" fuzz)
# Optimised at level 1 in 16 codegen units: a cold build in about half the
# time of cargo-fuzz's default (level 3, one unit) on two cores, for fuzzing
# a little slower, which a smoke run does not notice. Long runs keep the
# default.
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
build=(-s none --codegen-units 16)

started=$SECONDS
"${fuzz[@]}" build "${build[@]}" >&2
echo "[fuzz] built the targets with $toolchain in $((SECONDS - started)) s" >&2

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in $("${fuzz[@]}" list); do
  seeds="fuzz/corpus/$target"
  if ! compgen -G "$seeds/seed-*" >/dev/null; then
    echo "[fuzz] $target has no seeds in $seeds" >&2
    exit 1
  fi
  # Replay: every seed runs once (-runs=0 runs the given inputs only).
  if ! "${fuzz[@]}" run "${build[@]}" "$target" "$seeds" -- -runs=0 >"$scratch/$target.log" 2>&1; then
    cat "$scratch/$target.log" >&2
    echo "[fuzz] $target FAILED on a seed of $seeds" >&2
    exit 1
  fi
  # Fuzz: new inputs go to a scratch corpus, the seeds are read only.
  mkdir -p "$scratch/$target"
  if ! "${fuzz[@]}" run "${build[@]}" "$target" "$scratch/$target" "$seeds" -- \
    -max_total_time="$seconds" >"$scratch/$target.log" 2>&1; then
    tail -n 60 "$scratch/$target.log" >&2
    echo "[fuzz] $target FAILED: the crashing input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  echo "[fuzz] $target: $(grep -a -o 'Done [0-9]* runs in [0-9]* second(s)' "$scratch/$target.log" | tail -n 1)" >&2
done
echo "[fuzz] every target replayed its seeds and fuzzed for ${seconds} s in $((SECONDS - started)) s" >&2
