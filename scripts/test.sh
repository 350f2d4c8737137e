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

# Python tests (pytest): the jitml package (python/) against this build's library.
# Debian's python3 (/usr/bin/python3) is the one with python3-numpy/-torch/-pytest;
# PYTHON overrides it. Sanitizer builds skip them: an ASan libjitml.so cannot be
# loaded into an uninstrumented python3 (the ASan runtime must come first), and the C
# suite above already runs every library path under the sanitizers.
PYTHON=${PYTHON:-$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)}
if grep -Eq '^JITML_(ASAN|UBSAN):BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  echo "test.sh: sanitizer build: skipping the Python tests (pytest)"
else
  # pytest exits 5 when it collected no tests: that is a failure here, as with ctest.
  JITML_LIBRARY="$(cd "$BUILD_DIR" && pwd)/libjitml.so" \
    "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/python/tests"
  # The same suite as a user with PyPI's packages has it: a venv with numpy 2.x and
  # torch 2.x (torch.compile and torch.export tests run here) where `pip install .`
  # installed the package with its own libjitml (scripts/python-venv.sh). Run from
  # outside the checkout so that `import jitml` is the installed package.
  # JITML_TEST_SKIP_VENV=1 skips it (a host without PyPI access).
  if [[ ${JITML_TEST_SKIP_VENV:-0} == 1 ]]; then
    echo "test.sh: JITML_TEST_SKIP_VENV=1: skipping the PyPI venv run of the Python tests"
  else
    VENV_PY=$("$ROOT/scripts/python-venv.sh")
    (cd "${TMPDIR:-/tmp}" && env -u JITML_LIBRARY -u BUILD_DIR JITML_TEST_INSTALLED=1 \
      "$VENV_PY" -m pytest -q -p no:cacheprovider "$ROOT/python/tests")
  fi
fi

# The install test (cmake --install into a temporary prefix, then consumers built
# with find_package and pkg-config) is the CTest test `install`, run by ctest above.
