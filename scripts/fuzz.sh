#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang under ASan + UBSan in
# build-fuzz/ and runs each for SECONDS (default 60); fails on the first crash, leak,
# hang or sanitizer report, leaving the input that caused it in build-fuzz/crashes/.
#   scripts/fuzz.sh            60 s per target (what CI runs)
#   scripts/fuzz.sh 3600       an hour per target, on demand
#   TARGETS="fuzz_mlir" scripts/fuzz.sh 600
# Corpora grow in build-fuzz/corpus/<target>/ across runs, seeded from
# tests/fuzz/seeds/<target>/ (and tests/mlir/ for fuzz_mlir).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECONDS_PER_TARGET=${1:-60}
TARGETS=${TARGETS:-"fuzz_artifact fuzz_entry fuzz_remote_value fuzz_bundle fuzz_spec fuzz_mlir"}
BUILD=build-fuzz

for t in $TARGETS; do
  CC=clang CXX=clang++ BUILD_DIR=$BUILD BUILD_TARGET=$t scripts/build.sh -DJITML_FUZZ=ON \
    -DJITML_BUILD_TESTS=OFF -DJITML_BUILD_BENCH=OFF -DJITML_BUILD_EXAMPLES=OFF
done

mkdir -p "$BUILD/crashes"
status=0
for t in $TARGETS; do
  corpus="$BUILD/corpus/$t"
  mkdir -p "$corpus"
  # Seeds: tests/fuzz/seeds/<target>/, and the MLIR fixtures for fuzz_mlir; the binary
  # formats' harnesses write valid headers themselves, so they start from nothing.
  seeds=()
  [[ -d tests/fuzz/seeds/$t ]] && seeds+=("tests/fuzz/seeds/$t")
  [[ $t == fuzz_mlir ]] && seeds+=(tests/mlir)
  echo "fuzz.sh: $t for ${SECONDS_PER_TARGET} s"
  # -timeout: an input running over 25 s is a hang; -rss_limit_mb bounds memory.
  if ! "$BUILD/tests/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=25 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$BUILD/crashes/$t-" \
      "$corpus" "${seeds[@]}" 2>&1 | tail -n 25; then
    echo "fuzz.sh: $t FAILED (inputs in $BUILD/crashes/)"
    status=1
  fi
done
exit $status
