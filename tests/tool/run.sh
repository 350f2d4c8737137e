#!/usr/bin/env bash
# End-to-end test of the `jitml` tool: prewarm, --expect-warm, run, explain, opt, and
# the cache subcommands, against a fresh cache directory.
#   tests/tool/run.sh <path to jitml> <model.mlir> <export.mlir>
set -euo pipefail
jitml=$1
model=$2
export_model=$3
dir=$(mktemp -d /tmp/jitml-tool-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cache="$dir/cache"
fail() { echo "FAIL: $*" >&2; exit 1; }
# grep that reads all of its input: `grep -q` stops at the first match, and under
# pipefail the writer's SIGPIPE then failed a check that had matched.
has() { grep "$@" >/dev/null; }

# Usage errors exit 2; --help exits 0.
"$jitml" --help | has "prewarm" || fail "--help"
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
echo "$out" | has "6 bindings" || fail "prewarm count: $out"
echo "$out" | has "6 compiled" || fail "prewarm compiled: $out"
"$jitml" prewarm "$model" --shapes 'N=1-4,8-16:8' --expect-warm --cache-dir "$cache" \
  | has "0 compiled, 6 from disk" || fail "second prewarm was not warm"
set +e
"$jitml" prewarm "$model" --shapes 'N=5' --expect-warm --cache-dir "$cache" >/dev/null 2>&1
[[ $? == 1 ]] || fail "--expect-warm should fail when a kernel had to be compiled"
set -e

# run reports where the kernel came from.
out=$("$jitml" run "$model" --shape N=3 --repeat 2 --cache-dir "$cache")
echo "$out" | has "call 1:.*kernel from disk" || fail "run call 1: $out"
echo "$out" | has "call 2:.*kernel from memory" || fail "run call 2: $out"

# explain names the dim that differs.
out=$("$jitml" explain "$model" --shape N=17 --cache-dir "$cache")
echo "$out" | has "miss" || fail "explain: $out"
echo "$out" | has "dim 0: 17 vs cached 1, 2, 3, 4, 5, 8, 16" || fail "explain: $out"

# cache subcommands.
"$jitml" cache stats --cache-dir "$cache" | has "entries 7" || fail "cache stats"
"$jitml" cache ls --json --cache-dir "$cache" | has '"kind":"cpu-object"' || fail "ls --json"
"$jitml" cache verify --cache-dir "$cache" | has "checked 7 entries, removed 0" || fail "verify"
"$jitml" cache export "$dir/bundle.jitb" --cache-dir "$cache" | has "exported 7" || fail "export"
"$jitml" cache clear --cache-dir "$cache" | has "removed 7" || fail "clear"
"$jitml" cache stats --cache-dir "$cache" | has "entries 0" || fail "clear left entries"
"$jitml" cache import "$dir/bundle.jitb" --cache-dir "$cache" | has "imported 7" || fail "import"
"$jitml" prewarm "$model" --shapes 'N=1-4,8-16:8' --expect-warm --cache-dir "$cache" >/dev/null \
  || fail "imported entries were not used"

# Signed bundles: keygen, export --sign, import --trust (and JITML_TRUSTED_KEYS).
pub=$("$jitml" keygen "$dir/signing.key")
[[ ${#pub} == 64 ]] || fail "keygen printed \`$pub\`"
[[ $(stat -c %a "$dir/signing.key") == 600 ]] || fail "keygen: the secret key is not mode 600"
if "$jitml" keygen "$dir/signing.key" >/dev/null 2>&1; then fail "keygen replaced a key"; fi
"$jitml" cache export "$dir/signed.jitb" --sign "$dir/signing.key" --cache-dir "$cache" \
  | has "exported 7 entries to $dir/signed.jitb (signed)" || fail "export --sign"
"$jitml" cache import "$dir/signed.jitb" --trust "$pub" --cache-dir "$cache" \
  | has "imported 7" || fail "import --trust of a signed bundle"
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
"$jitml" cache ls --json --cache-dir "$hot" | has '"kind":"hot-list"' || fail "no hot list: $out"
mkdir -p "$dir/keep"
list_key=$("$jitml" cache ls --json --cache-dir "$hot" | tr '{' '\n' | grep '"hot-list"' |
           sed 's/.*"key":"\([0-9a-f]*\)".*/\1/')
cp "$hot/${list_key:0:2}/$list_key.jitk" "$dir/keep/"
"$jitml" cache clear --cache-dir "$hot" >/dev/null
mkdir -p "$hot/${list_key:0:2}" && cp "$dir/keep/$list_key.jitk" "$hot/${list_key:0:2}/"
out=$("$jitml" prewarm "$export_model" --hot --cache-dir "$hot")
echo "$out" | has "1 hot bindings ready" || fail "prewarm --hot: $out"
"$jitml" prewarm "$export_model" --shapes 'N=7' --expect-warm --cache-dir "$hot" >/dev/null \
  || fail "prewarm --hot did not store N=7's kernel"

# --device: prewarm builds the generic kernel for that GPU; a later run there compiles
# nothing (skipped where there is no Vulkan device).
gpu="$dir/gpu"
set +e
out=$("$jitml" prewarm "$export_model" --device vulkan --shapes 'N=3' --cache-dir "$gpu" 2>&1)
rc=$?
set -e
if [[ $rc != 0 ]] && echo "$out" | has "UNAVAILABLE"; then
  echo "skipped: no Vulkan device (--device)"
else
  [[ $rc == 0 ]] || fail "prewarm --device vulkan: $out"
  echo "$out" | has "generic kernel ready" || fail "prewarm --device vulkan: $out"
  out=$("$jitml" run "$export_model" --device vulkan --shape 'N=5,9' --cache-dir "$gpu")
  echo "$out" | has "N=9.*call 1:.*kernel from memory" || fail "run --device vulkan: $out"
fi

# opt: one pass at a time, the printed IR checked. jitml-lower-matmul-to-loops turns
# a linalg.matmul on memrefs (f16 inputs, f32 accumulator) into three scf.for with the
# inputs extended, a multiply and an add in f32; MLIR's passes run beside it.
cat > "$dir/mm.mlir" <<'MLIR'
func.func @mm(%a: memref<4x3xf16>, %b: memref<3x5xf16>, %c: memref<4x5xf32>) {
  linalg.matmul ins(%a, %b : memref<4x3xf16>, memref<3x5xf16>) outs(%c : memref<4x5xf32>)
  return
}
MLIR
out=$("$jitml" opt "$dir/mm.mlir" 'func.func(jitml-lower-matmul-to-loops),canonicalize,cse')
[[ $(grep -c 'scf.for' <<< "$out") == 3 ]] || fail "opt: three scf.for: $out"
grep -q 'arith.extf %[0-9]* : f16 to f32' <<< "$out" || fail "opt: f16 inputs extended: $out"
grep -q 'arith.mulf .* : f32' <<< "$out" && grep -q 'arith.addf .* : f32' <<< "$out" \
  || fail "opt: f32 multiply-add: $out"
grep -q 'linalg.matmul' <<< "$out" && fail "opt: the matmul is still there: $out"
grep -q 'arith.constant 4 : index' <<< "$out" || fail "opt: M bound: $out"
# The pass named bare at the top level, inside builtin.module(...), and from stdin.
[[ $("$jitml" opt - 'builtin.module(jitml-lower-matmul-to-loops)' < "$dir/mm.mlir" \
     | grep -c 'scf.for') == 3 ]] || fail "opt: bare pass in builtin.module from stdin"
# MLIR's passes alone: canonicalize folds a constant add.
printf '%s\n' 'func.func @f() -> i32 {' '  %a = arith.constant 2 : i32' \
  '  %b = arith.addi %a, %a : i32' '  return %b : i32' '}' > "$dir/fold.mlir"
"$jitml" opt "$dir/fold.mlir" canonicalize | has 'arith.constant 4 : i32' \
  || fail "opt: canonicalize did not fold"
set +e
"$jitml" opt "$dir/mm.mlir" 'func.func(no-such-pass)' >/dev/null 2>"$dir/opt.txt"; rc=$?
[[ $rc == 1 ]] && grep -q 'INVALID_ARGUMENT.*no-such-pass' "$dir/opt.txt" \
  || fail "opt: an unknown pass: $(cat "$dir/opt.txt")"
printf 'func.func @f( {\n' > "$dir/bad.mlir"
"$jitml" opt "$dir/bad.mlir" canonicalize >/dev/null 2>"$dir/opt.txt"; rc=$?
[[ $rc == 1 ]] && grep -q "PARSE_ERROR.*bad.mlir:1:" "$dir/opt.txt" \
  || fail "opt: malformed text: $(cat "$dir/opt.txt")"
"$jitml" opt "$dir/mm.mlir" >/dev/null 2>&1; [[ $? == 2 ]] || fail "opt without a pipeline"
set -e

# The fleet cache, on a real redis-server listening on a unix socket in $dir:
# prewarm --remote fills it, a new machine's cache pulls it and is then warm, push
# finds everything there, and cache stats shows the tier, up and then down.
command -v redis-server >/dev/null || fail "redis-server is missing (scripts/install-deps.sh)"
redis-server --port 0 --unixsocket "$dir/redis.sock" --save '' --appendonly no \
  --dir "$dir" --daemonize no >/dev/null 2>&1 &
redis_pid=$!
trap 'kill -9 $redis_pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [[ -S "$dir/redis.sock" ]] && break; sleep 0.05; done
url="unix://$dir/redis.sock"
out=$("$jitml" prewarm "$model" --shapes 'N=1-3' --cache-dir "$dir/m1" --remote "$url" 2>&1)
echo "$out" | has "3 compiled" || fail "prewarm --remote: $out"
echo "$out" | has -E "push: [0-9]+ entries pushed, [0-9]+ already there" || fail "prewarm --remote: $out"
total=$("$jitml" cache stats --cache-dir "$dir/m1" | sed -n 's/^entries //p')
"$jitml" cache stats --cache-dir "$dir/m2" --remote "$url" | has "remote_state connected" \
  || fail "cache stats --remote: $("$jitml" cache stats --cache-dir "$dir/m2" --remote "$url")"
out=$("$jitml" cache pull --cache-dir "$dir/m2" --remote "$url" 2>&1)
echo "$out" | has "pull: $total entries pulled, 0 refused" || fail "cache pull ($total): $out"
"$jitml" prewarm "$model" --shapes 'N=1-3' --expect-warm --cache-dir "$dir/m2" >/dev/null \
  || fail "pulled entries were not used"
out=$("$jitml" cache push --cache-dir "$dir/m2" --remote "$url" 2>&1)
echo "$out" | has "push: 0 entries pushed, $total already there" || fail "cache push: $out"
# A new machine that only asks the fleet cache compiles nothing.
out=$("$jitml" prewarm "$model" --shapes 'N=1-3' --expect-warm --cache-dir "$dir/m3" \
      --remote "$url" 2>&1) || fail "prewarm on a new machine compiled: $out"
kill -9 $redis_pid; wait $redis_pid 2>/dev/null || true
"$jitml" cache stats --cache-dir "$dir/m2" --remote "$url" | has -E "remote_state (failing|paused)" \
  || fail "cache stats with the server down: $("$jitml" cache stats --cache-dir "$dir/m2" --remote "$url")"
set +e
"$jitml" cache pull --cache-dir "$dir/m2" --remote "$url" >/dev/null 2>"$dir/pull.txt"; rc=$?
set -e
[[ $rc == 1 ]] && grep -q "UNAVAILABLE" "$dir/pull.txt" || fail "pull with the server down: $(cat "$dir/pull.txt")"
"$jitml" prewarm "$model" --shapes 'N=1-3,5' --cache-dir "$dir/m2" --remote "$url" >/dev/null 2>&1 \
  && fail "prewarm --remote with the server down should report the failed push (exit 1)"

echo "tool test: all checks passed"
