"""The installed package (pip install .): the library, the isolation worker and the
`jitml` command come inside it. Runs in scripts/test.sh's PyPI venv
(JITML_TEST_INSTALLED=1); in a checkout run only the checks that apply there."""
import os
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import jitml

INSTALLED = os.environ.get("JITML_TEST_INSTALLED") == "1"
installed_only = pytest.mark.skipif(not INSTALLED, reason="the pip-installed package only "
                                    "(scripts/test.sh's venv run)")
PKG = os.path.dirname(os.path.abspath(jitml.__file__))


@installed_only
def test_package_and_library_are_the_installed_ones():
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert os.path.realpath(PKG).startswith(site), PKG
    lib = os.path.realpath(jitml.library_path())
    assert lib == os.path.realpath(os.path.join(PKG, "lib", "libjitml.so")), lib
    # The version CMakeLists.txt declares, which pyproject.toml reads for the wheel.
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        declared = re.search(r"project\(libjitml VERSION ([0-9.]+)", f.read()).group(1)
    assert jitml.version() == declared


@installed_only
def test_console_command_runs_the_bundled_tool():
    exe = os.path.join(os.path.dirname(sys.executable), "jitml")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "jitml " + jitml.version()
    r = subprocess.run([exe, "no-such-command"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown command `no-such-command`" in r.stderr


@installed_only
def test_isolation_worker_is_found_next_to_the_library(tmp_path):
    # MLIR text compiled with isolation on needs libexec/jitml/jitml-worker; the tool
    # reports an import that went through it the same way as one in-process, so check
    # the file and run the tool on a model with isolation forced.
    worker = os.path.join(PKG, "libexec", "jitml", "jitml-worker")
    assert os.access(worker, os.X_OK), worker
    model = tmp_path / "m.mlir"
    model.write_text(
        "func.func @f(%x: tensor<?x4xf32> {jit.dims = [\"N\", 4]}) -> tensor<?x4xf32> {\n"
        "  %y = arith.addf %x, %x : tensor<?x4xf32>\n"
        "  return %y : tensor<?x4xf32>\n"
        "}\n")
    exe = os.path.join(os.path.dirname(sys.executable), "jitml")
    env = dict(os.environ, JITML_ISOLATION="on", JITML_CACHE_DIR=str(tmp_path / "c"))
    r = subprocess.run([exe, "run", str(model), "--shape", "N=3"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_graph_runs(ctx):
    # Whichever copy is under test, it computes.
    g = jitml.Graph(ctx, "pkg_add")
    x = g.input("x", "float32", ("N",))
    g.output(x + x)
    g.finalize()
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(g(a), 2 * a)


@installed_only
def test_source_distribution_builds_a_wheel(tmp_path):
    # python -m build --sdist, then pip wheel from the tarball: what `pip install
    # jitml-<v>.tar.gz` does. The checkout is the one whose tests these are.
    import tarfile
    import zipfile
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                        "-o", str(tmp_path), root], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (sdist,) = tmp_path.glob("jitml-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    for want in ("pyproject.toml", "CMakeLists.txt", "include/jitml.h",
                 "python/jitml/__init__.py", "scripts/install-deps.sh"):
        assert want in names, want
    assert not [n for n in names if n.startswith("build")], "build trees in the sdist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "w"), str(sdist)],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = (tmp_path / "w").glob("jitml-*-py3-none-*.whl")
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
    for want in ("jitml/lib/libjitml.so", "jitml/bin/jitml", "jitml/_core.py",
                 "jitml/libexec/jitml/jitml-worker", "jitml/include/jitml.h"):
        assert want in files, want
