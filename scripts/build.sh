#!/usr/bin/env bash
# Installs missing dependencies, then configures and builds libjitml.
#   scripts/build.sh [extra cmake args...]      e.g. scripts/build.sh -DJITML_ASAN=ON
#   BUILD_DIR=build-asan scripts/build.sh ...   builds in another directory
#   BUILD_TYPE=Debug scripts/build.sh           another CMAKE_BUILD_TYPE (default Release)
#   BUILD_TARGET=thread_stress scripts/build.sh only that target (and what it needs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}

"$ROOT/scripts/install-deps.sh"

# A build directory keeps the generator it was first configured with; only pick one
# for a fresh directory, so switching would not make cmake refuse to reconfigure.
generator=()
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  if command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  else
    generator=(-G "Unix Makefiles")
  fi
fi

cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@"
cmake --build "$BUILD_DIR" --parallel "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
