#!/usr/bin/env bash
# The install test (CTest `install`): installs a built libjitml into a temporary
# prefix and builds the examples against the installed files only, twice:
#   1. CMake:      find_package(jitml CONFIG) -> jitml::jitml   (tests/install/consumer)
#   2. pkg-config: cc mlp.c $(pkg-config --cflags --libs jitml)
# then runs them (mlp checks itself against a plain-C reference).
#   tests/install/run.sh <build-dir> <source-dir> [cmake]
set -euo pipefail

BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
CMAKE=${3:-cmake}
CC=${CC:-cc}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/jitml-install-test-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix
export JITML_CACHE_DIR=$TMP/cache

# A sanitizer build of the library needs the sanitizer runtime in its consumers too.
san=()
[[ "${JITML_ASAN:-0}" == 1 ]] && san+=(-fsanitize=address)
[[ "${JITML_UBSAN:-0}" == 1 ]] && san+=(-fsanitize=undefined)
sanflags="${san[*]:-}"

echo "== cmake --install $BUILD --prefix $PREFIX"
"$CMAKE" --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log"

libdir=$(dirname "$(find "$PREFIX" -name 'libjitml.so' -print -quit)")
for f in "$PREFIX/include/jitml.h" "$PREFIX/include/jitml_op.h" "$libdir/libjitml.so" \
         "$libdir/cmake/jitml/jitmlConfig.cmake" "$libdir/pkgconfig/jitml.pc"; do
  [[ -e "$f" ]] || { echo "install: missing $f" >&2; cat "$TMP/install.log"; exit 1; }
done
# The SONAME, so programs keep working across compatible upgrades.
soname=$(objdump -p "$libdir/libjitml.so" | awk '/SONAME/ {print $2}')
[[ "$soname" == libjitml.so.* ]] || { echo "install: bad SONAME '$soname'" >&2; exit 1; }
echo "   installed: lib ($soname), headers, CMake package, pkg-config file"
if [[ -x "$PREFIX/bin/jitml" ]]; then echo "   installed: bin/jitml"; fi
worker=$(find "$PREFIX" -name jitml-worker -type f -print -quit)
[[ -x "$worker" && "$worker" == */libexec/jitml/jitml-worker ]] \
  || { echo "install: no libexec/jitml/jitml-worker (got '$worker')" >&2; exit 1; }
echo "   installed: $worker"

# The prefix is not on the loader's path; a real install (/usr/local) would be.
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

echo "== CMake consumer: find_package(jitml CONFIG)"
"$CMAKE" -S "$SRC/tests/install/consumer" -B "$TMP/consumer" \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DJITML_EXAMPLES="$SRC/examples" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="$sanflags" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanflags" >"$TMP/consumer.log" ||
  { cat "$TMP/consumer.log"; exit 1; }
"$CMAKE" --build "$TMP/consumer" >>"$TMP/consumer.log" 2>&1 ||
  { cat "$TMP/consumer.log"; exit 1; }
"$TMP/consumer/mlp"
"$TMP/consumer/custom_op_host"

echo "== pkg-config consumer: cc \$(pkg-config --cflags --libs jitml)"
export PKG_CONFIG_PATH=$libdir/pkgconfig
echo "   cflags: $(pkg-config --cflags jitml)  libs: $(pkg-config --libs jitml)"
# shellcheck disable=SC2046,SC2086
"$CC" -std=c11 $sanflags -o "$TMP/mlp_pc" "$SRC/examples/mlp.c" \
  $(pkg-config --cflags --libs jitml) -lm
"$TMP/mlp_pc"
echo "install test: OK"
