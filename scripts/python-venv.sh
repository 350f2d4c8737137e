#!/usr/bin/env bash
# Makes the Python venv of the test suite's second Python run and installs this
# checkout into it the way users do: `pip install .` (pyproject.toml: scikit-build-core
# builds libjitml with the project's CMake and puts it inside the package). The venv
# holds PyPI's numpy 2.x, torch 2.x and pytest (python/requirements-test.txt, pinned).
# Prints the venv's python on stdout; everything else goes to stderr.
#   scripts/python-venv.sh               venv in $JITML_VENV, else ~/.cache/jitml/venv
# Idempotent: the requirements are installed again only when the file changed, and the
# package build reuses build-py/ (CMake rebuilds only what changed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${JITML_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/jitml/venv}
REQ=python/requirements-test.txt
# The base interpreter: Debian's python3 (python3-venv provides ensurepip), or
# $PYTHON.
PY=${PYTHON:-$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)}

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "python-venv: creating $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" >&2
fi
stamp="$VENV/.jitml-requirements"
if ! cmp -s "$REQ" "$stamp"; then
  echo "python-venv: installing $(grep -v '^#' "$REQ" | tr '\n' ' ')(from PyPI)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >&2
  cp "$REQ" "$stamp"
fi
echo "python-venv: pip install . (builds libjitml in build-py/)" >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  --force-reinstall . >&2
echo "$VENV/bin/python"
