#!/usr/bin/env bash
# End-to-end test of the `jitml` tool: prewarm, --expect-warm, run, explain, and the
# cache subcommands, against a fresh cache directory.
#   tests/tool/run.sh <path to jitml> <model.mlir> <export.mlir>
set -euo pipefail
jitml=$1
model=$2
export_model=$3
dir=$(mktemp -d /tmp/jitml-tool-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cache="$dir/cache"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Usage errors exit 2; --help exits 0.
"$jitml" --help | grep -q "prewarm" || fail "--help"
set +e
"$jitml" frobnicate >/dev/null 2>&1; [[ $? == 2 ]] || fail "unknown command should exit 2"
"$jitml" prewarm "$model" >/dev/null 2>&1; [[ $? == 2 ]] || fail "missing --shapes should exit 2"
"$jitml" prewarm "$model" --shapes 'N=0' --cache-dir "$cache" >/dev/null 2>&1
[[ $? == 2 ]] || fail "N=0 should be a usage error"
"$jitml" prewarm "$dir/missing.mlir" --shapes 'N=1' --cache-dir "$cache" >/dev/null 2>&1
[[ $? == 1 ]] || fail "a missing model should exit 1"
# A FIFO as the model is refused at once (it was read with fopen and waited on).
mkfifo "$dir/fifo.mlir"
timeout 20 "$jitml" run "$dir/fifo.mlir" --shape 'N=1' --cache-dir "$cache" >/dev/null 2>&1
[[ $? == 1 ]] || fail "a FIFO model should fail at once (exit 1)"
# SPECs asking for more than they say, or overflowing, are refused, never truncated or
# looped over (the step overflowed a signed counter before spec.c).
for spec in 'N=1-9223372036854775807:9223372036854775807' 'N=1-5000' 'N=1-4096;M=1-4096' \
            'N=99999999999999999999' 'N=3-2' 'N=1-4:0' 'N=' '=1'; do
  "$jitml" prewarm "$model" --shapes "$spec" --cache-dir "$cache" >/dev/null 2>&1
  [[ $? == 2 ]] || fail "SPEC \`$spec\` should be a usage error"
done
set -e

# A cold prewarm compiles every binding; --expect-warm then fails on a new shape and
# passes on the prewarmed ones.
out=$("$jitml" prewarm "$model" --shapes 'N=1-4,8-16:8' --jobs 2 --cache-dir "$cache")
echo "$out" | grep -q "6 bindings" || fail "prewarm count: $out"
echo "$out" | grep -q "6 compiled" || fail "prewarm compiled: $out"
"$jitml" prewarm "$model" --shapes 'N=1-4,8-16:8' --expect-warm --cache-dir "$cache" \
  | grep -q "0 compiled, 6 from disk" || fail "second prewarm was not warm"
set +e
"$jitml" prewarm "$model" --shapes 'N=5' --expect-warm --cache-dir "$cache" >/dev/null 2>&1
[[ $? == 1 ]] || fail "--expect-warm should fail when a kernel had to be compiled"
set -e

# run reports where the kernel came from.
out=$("$jitml" run "$model" --shape N=3 --repeat 2 --cache-dir "$cache")
echo "$out" | grep -q "call 1:.*kernel from disk" || fail "run call 1: $out"
echo "$out" | grep -q "call 2:.*kernel from memory" || fail "run call 2: $out"

# explain names the dim that differs.
out=$("$jitml" explain "$model" --shape N=17 --cache-dir "$cache")
echo "$out" | grep -q "miss" || fail "explain: $out"
echo "$out" | grep -q "dim 0: 17 vs cached 1, 2, 3, 4, 5, 8, 16" || fail "explain: $out"

# cache subcommands.
"$jitml" cache stats --cache-dir "$cache" | grep -q "entries 7" || fail "cache stats"
"$jitml" cache ls --json --cache-dir "$cache" | grep -q '"kind":"cpu-object"' || fail "ls --json"
"$jitml" cache verify --cache-dir "$cache" | grep -q "checked 7 entries, removed 0" || fail "verify"
"$jitml" cache export "$dir/bundle.jitb" --cache-dir "$cache" | grep -q "exported 7" || fail "export"
"$jitml" cache clear --cache-dir "$cache" | grep -q "removed 7" || fail "clear"
"$jitml" cache stats --cache-dir "$cache" | grep -q "entries 0" || fail "clear left entries"
"$jitml" cache import "$dir/bundle.jitb" --cache-dir "$cache" | grep -q "imported 7" || fail "import"
"$jitml" prewarm "$model" --shapes 'N=1-4,8-16:8' --expect-warm --cache-dir "$cache" >/dev/null \
  || fail "imported entries were not used"

# Signed bundles: keygen, export --sign, import --trust (and JITML_TRUSTED_KEYS).
pub=$("$jitml" keygen "$dir/signing.key")
[[ ${#pub} == 64 ]] || fail "keygen printed \`$pub\`"
[[ $(stat -c %a "$dir/signing.key") == 600 ]] || fail "keygen: the secret key is not mode 600"
if "$jitml" keygen "$dir/signing.key" >/dev/null 2>&1; then fail "keygen replaced a key"; fi
"$jitml" cache export "$dir/signed.jitb" --sign "$dir/signing.key" --cache-dir "$cache" \
  | grep -q "exported 7 entries to $dir/signed.jitb (signed)" || fail "export --sign"
"$jitml" cache import "$dir/signed.jitb" --trust "$pub" --cache-dir "$cache" \
  | grep -q "imported 7" || fail "import --trust of a signed bundle"
other=$(printf '%064d' 7)
if "$jitml" cache import "$dir/signed.jitb" --trust "$other" --cache-dir "$cache" \
    2> "$dir/trust.txt"; then fail "a bundle signed by an untrusted key was imported"; fi
grep -q "not a trusted key" "$dir/trust.txt" || fail "untrusted: $(cat "$dir/trust.txt")"
if JITML_TRUSTED_KEYS=$pub "$jitml" cache import "$dir/bundle.jitb" --cache-dir "$cache" \
    2> "$dir/trust.txt"; then fail "an unsigned bundle was imported under JITML_TRUSTED_KEYS"; fi
grep -q "unsigned" "$dir/trust.txt" || fail "unsigned: $(cat "$dir/trust.txt")"
if "$jitml" cache import "$dir/signed.jitb" --trust "nonsense" --cache-dir "$cache" \
    2> "$dir/trust.txt"; then fail "a malformed --trust was accepted"; fi
grep -q "INVALID_ARGUMENT" "$dir/trust.txt" || fail "bad --trust: $(cat "$dir/trust.txt")"

# A corrupted entry is found by verify (exit 1) and removed.
entry=$(find "$cache" -name '*.jitk' | head -n 1)
printf 'garbage' | dd of="$entry" bs=1 seek=200 conv=notrunc status=none
set +e
"$jitml" cache verify --cache-dir "$cache" > "$dir/verify.txt"; rc=$?
set -e
[[ $rc == 1 ]] || fail "verify should exit 1 after removing a bad entry"
grep -q "removed 1 bad" "$dir/verify.txt" || fail "verify: $(cat "$dir/verify.txt")"
# Hot bindings: a run under AUTO (the default) whose N=7 keeps coming back on the
# generic kernel leaves N=7 in the cache's hot list; prewarm --hot then makes it ready
# in a cache that lost its kernels but kept the list.
hot="$dir/hot"
out=$("$jitml" run "$export_model" --shape 'N=1,7' --repeat 6 --cache-dir "$hot")
"$jitml" cache ls --json --cache-dir "$hot" | grep -q '"kind":"hot-list"' || fail "no hot list: $out"
mkdir -p "$dir/keep"
list_key=$("$jitml" cache ls --json --cache-dir "$hot" | tr '{' '\n' | grep '"hot-list"' |
           sed 's/.*"key":"\([0-9a-f]*\)".*/\1/')
cp "$hot/${list_key:0:2}/$list_key.jitk" "$dir/keep/"
"$jitml" cache clear --cache-dir "$hot" >/dev/null
mkdir -p "$hot/${list_key:0:2}" && cp "$dir/keep/$list_key.jitk" "$hot/${list_key:0:2}/"
out=$("$jitml" prewarm "$export_model" --hot --cache-dir "$hot")
echo "$out" | grep -q "1 hot bindings ready" || fail "prewarm --hot: $out"
"$jitml" prewarm "$export_model" --shapes 'N=7' --expect-warm --cache-dir "$hot" >/dev/null \
  || fail "prewarm --hot did not store N=7's kernel"

# --device: prewarm builds the generic kernel for that GPU; a later run there compiles
# nothing (skipped where there is no Vulkan device).
gpu="$dir/gpu"
set +e
out=$("$jitml" prewarm "$export_model" --device vulkan --shapes 'N=3' --cache-dir "$gpu" 2>&1)
rc=$?
set -e
if [[ $rc != 0 ]] && echo "$out" | grep -q "UNAVAILABLE"; then
  echo "skipped: no Vulkan device (--device)"
else
  [[ $rc == 0 ]] || fail "prewarm --device vulkan: $out"
  echo "$out" | grep -q "generic kernel ready" || fail "prewarm --device vulkan: $out"
  out=$("$jitml" run "$export_model" --device vulkan --shape 'N=5,9' --cache-dir "$gpu")
  echo "$out" | grep -q "N=9.*call 1:.*kernel from memory" || fail "run --device vulkan: $out"
fi

echo "tool test: all checks passed"
