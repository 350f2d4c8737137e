#!/usr/bin/env bash
# Installs the Debian 12 packages libjitml needs to build and test, only those that
# are missing. Idempotent: when everything is present it does nothing and exits 0.
# LLVM/MLIR 22 are Debian 12's own packages (bookworm-security); they install under
# /usr/lib/llvm-22.
set -euo pipefail

PACKAGES=(
  cmake
  ninja-build
  pkg-config
  build-essential
  llvm-22-dev
  libmlir-22-dev
  mlir-22-tools
  libcriterion-dev
  libdlpack-dev
  libxxhash-dev
  # Bundle signatures (ed25519).
  libsodium-dev
  # The fleet cache's Redis tier (hiredis) and the real redis-server its tests start.
  libhiredis-dev
  redis-server
  # The Python package (python/) and its tests: ctypes is in the standard library;
  # NumPy, PyTorch (1.13 in Debian 12) and pytest come from Debian.
  python3
  python3-numpy
  python3-pytest
  python3-torch
  # scripts/python-venv.sh: the test suite's second Python run, in a venv with PyPI's
  # numpy 2.x and torch 2.x and this package installed by `pip install .`.
  python3-venv
  spirv-tools
  # The Vulkan backend: headers at build time (libvulkan is dlopen'ed at run time);
  # Mesa's lavapipe is the CPU Vulkan device the tests run on.
  libvulkan-dev
  mesa-vulkan-drivers
  # Multi-threaded CPU kernels are OpenMP code: LLVM's libomp, loaded at run time.
  libomp-22-dev
  # bench/: the peers it compares against (OpenBLAS is dlopen'ed, oneDNN linked when
  # present) and gnuplot for the chart in docs/.
  libopenblas-dev
  libdnnl-dev
  gnuplot-nox
  # scripts/fuzz.sh: the libFuzzer targets are built with clang (Debian 12's 14, whose
  # libFuzzer and sanitizer runtimes are in libclang-rt-14-dev).
  clang
  libclang-rt-14-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  # dpkg-query fails for packages it has never heard of; treat that as missing too.
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: missing: ${missing[*]}"

install_cmd="apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${missing[*]}"

if [[ $(id -u) -eq 0 ]]; then
  runner=(bash -c)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  # -n: never prompt; a CI job or a script must not hang on a password.
  runner=(sudo -n bash -c)
else
  echo "install-deps: need root to install packages; run:" >&2
  echo "  sudo bash -c '$install_cmd'" >&2
  exit 1
fi

# Keep the log short: apt's progress goes away, errors still reach stderr.
if ! "${runner[@]}" "$install_cmd" >/dev/null; then
  echo "install-deps: failed: $install_cmd" >&2
  exit 1
fi
echo "install-deps: installed ${missing[*]}"
