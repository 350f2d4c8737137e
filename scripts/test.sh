#!/usr/bin/env bash
# The one test command: builds (scripts/build.sh, which also installs missing
# dependencies) and runs the whole test suite. Exits non-zero on any failure.
#   scripts/test.sh [extra cmake args...]
#   BUILD_DIR=build-asan scripts/test.sh -DJITML_ASAN=ON -DJITML_UBSAN=ON
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR

"$ROOT/scripts/build.sh" "$@"

# --no-tests=error: a build that registered no tests is a broken build, not a pass.
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error --parallel "$(nproc)"

# The example doubles as an end-to-end check: it compares against a plain-C
# reference and exits non-zero on a mismatch.
if [[ -x "$BUILD_DIR/examples/mlp" ]]; then
  "$BUILD_DIR/examples/mlp"
fi

# Python tests (pytest) will run here once python/ exists.
