"""pytest setup: import jitml from this checkout, and keep the kernel cache private.

JITML_LIBRARY (set by scripts/test.sh) picks the libjitml.so under test; without it
the package finds <checkout>/build/libjitml.so. With JITML_TEST_INSTALLED=1 the suite
tests the installed package instead (pip install ., in scripts/test.sh's PyPI venv).
"""
import os
import sys
import tempfile

import pytest

INSTALLED = os.environ.get("JITML_TEST_INSTALLED") == "1"
CHECKOUT_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if not INSTALLED:
    sys.path.insert(0, CHECKOUT_PYTHON)

# A fresh on-disk kernel cache per test session: an old cache cannot hide a compile.
_cache = tempfile.TemporaryDirectory(prefix="jitml-pytest-")
os.environ["JITML_CACHE_DIR"] = _cache.name

import jitml  # noqa: E402


@pytest.fixture(scope="session")
def ctx():
    c = jitml.Context()
    yield c
    c.close()
