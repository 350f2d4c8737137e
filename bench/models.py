#!/usr/bin/env python3
"""Two model blocks through libjitml and its peers, each cell timed in its own process.

Blocks (weights from a seeded NumPy generator, the same arrays for everyone; no downloads):
  gpt2    GPT-2 small's decoder block: D 768, 12 heads, MLP 3072, pre-norm layer_norm,
          causal attention through an additive [S, S] mask input, erf GELU, residuals;
          x [B, S, 768] for B in {1, 8}, S in {128, 512}.
  resnet  ResNet's basic block, NCHW, C 64: conv3x3-bn-relu-conv3x3-bn + x, relu, each
          batch norm folded into its conv (weight and per-channel bias); x [N, 64, 56, 56]
          for N in {1, 8}.
Implementations:
  jitml     the Graph API (python/jitml), as examples/gpt2_block.c and
            examples/resnet_block.c build them; one kernel per shape (JITML_SHAPE_POLICY
            defaults to exact here: under auto a new shape first runs on the slow generic
            kernel), disk cache off, so the first call is a full compile.
  ort       ONNX Runtime, CPU EP, all graph optimizations, on the block exported once by
            torch.onnx.export (dynamo exporter) with batch (and sequence) dims dynamic.
  eager     PyTorch eager under inference_mode (attention by scaled_dot_product_attention).
  compiled  torch.compile (inductor, CPU, dynamic=False, freezing on as PyTorch's CPU
            inference guide advises), recompiled for each shape and thread count, with a
            fresh inductor cache dir, so its first call is a cold compile (the
            process's one-time inductor start-up is timed apart, before the cells).
Each (block, shape, threads) cell: a fresh session/context/compile per implementation;
its first call (compile included; ort: session creation + first run) is reported
apart; after one more warm call the median of n timed calls is the time, n = --reps or
fewer so that a cell takes about --budget seconds (at least 3). Threads: libjitml
Context(num_threads=t), ORT intra_op_num_threads=t, torch.set_num_threads(t). Every
output is checked against eager float32: max |err| / max |eager| above 1e-3 is a FAIL
(exit 1). ratio = best peer's time / jitml's time: above 1, libjitml is faster. Each
cell runs in its own Python process (this script with --cell), one after the other:
in one process, what earlier cells left behind (torch's and ORT's thread pools, a
second OpenMP runtime) slowed libjitml's 2-thread GPT-2 cell by ~20 % (9.6 against
7.95 ms run alone). --one-process runs them all here instead, with a pause between
implementations so that one's spinning OpenMP / thread-pool workers sleep first.
--rounds R runs every cell R times, each (shape, threads) group's implementations in
turn and every other round in reverse order, and reports the median of the rounds'
medians: on a VM whose speed drifts by 10-15 % over minutes, one run's ratios move by
as much (ResNet N=8 at 1 thread: 0.77x, 0.68x, 0.77x in three runs).

Run (peers from PyPI in a venv outside the checkout; libjitml built in build/):
  python3 -m venv /work/venv-peers
  /work/venv-peers/bin/pip install torch onnxruntime onnx onnxscript numpy
(PyPI's torch pulls ~4 GB of CUDA packages, unused here; where download.pytorch.org is
reachable, `pip install torch --index-url https://download.pytorch.org/whl/cpu` first.)
  JITML_LIBRARY=/work/main/build/libjitml.so PYTHONPATH=/work/main/python \\
      /work/venv-peers/bin/python bench/models.py [--quick] [--block gpt2|resnet]
      [--threads 1,2] [--reps 20] [--budget 5] [--one-process]
--quick runs GPT-2 at B=1 S=128 and ResNet at N=1 only. ONNX Runtime is skipped (a
dash) when onnxruntime/onnx/onnxscript are missing; PyTorch is required.
"""
import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

# Before jitml and torch load: exact kernels per shape, and cold inductor compiles.
os.environ.setdefault("JITML_SHAPE_POLICY", "exact")
_inductor_cache = tempfile.TemporaryDirectory(prefix="models-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_cache.name
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")

import numpy as np  # noqa: E402

try:
    import jitml
except ImportError:  # run from the checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "python"))
    import jitml
try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    sys.exit("models.py: PyTorch is needed (the reference and two peers): %s; see the "
             "header for the venv" % e)
try:
    import onnxruntime as ort
    import onnx  # noqa: F401  (the exporter needs onnx and onnxscript)
    import onnxscript  # noqa: F401
except ImportError as e:
    ort, ORT_MISSING = None, str(e)

TOLERANCE = 1e-3  # max |err| / max |eager|
PAUSE_S = 0.3     # > libomp's 200 ms KMP_BLOCKTIME: workers asleep before the next one

# --- GPT-2 small decoder block ---------------------------------------------------------

D, HEADS, FF = 768, 12, 3072
ATTENTION = "fused"  # --attention
GPT_NAMES = ("ln1_g", "ln1_b", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
             "ln2_g", "ln2_b", "w1", "c1", "w2", "c2")


def gpt2_weights():
    # Matrices ~ N(0, 1/fan_in) so that attention and the MLP change x as much as x
    # itself, and the error check sees them (GPT-2's own 0.02 would hide them).
    rng = np.random.default_rng(2019)
    shapes = {"w1": (D, FF), "c1": (FF,), "w2": (FF, D)}
    w = {}
    for n in GPT_NAMES:
        shape = shapes.get(n, (D, D) if n.startswith("w") else (D,))
        if n.startswith("w"):
            a = rng.normal(0, 1 / np.sqrt(shape[0]), size=shape)
        else:
            a = rng.uniform(-0.1, 0.1, size=shape) + (1 if n.endswith("_g") else 0)
        w[n] = a.astype(np.float32)
    return w


def gpt2_inputs(b, s):
    rng = np.random.default_rng(b * 1000 + s)
    x = rng.standard_normal((b, s, D)).astype(np.float32)
    mask = np.triu(np.full((s, s), -np.inf, dtype=np.float32), k=1)
    return x, mask


def gpt2_jitml(ctx, w):
    g = jitml.Graph(ctx, "gpt2_block")
    x = g.input("x", "float32", ("B", "S", D))
    mask = g.input("mask", "float32", ("S", "S"))
    v = {n: g.weight(n, "float32", w[n].shape) for n in GPT_NAMES}

    def heads(t, keys):  # [B, S, D] -> [B, H, S, D/H], or [B, H, D/H, S] for keys
        t = g.reshape(t, ("B", "S", HEADS, D // HEADS))
        return g.transpose(t, (0, 2, 3, 1) if keys else (0, 2, 1, 3))

    h = g.layer_norm(x, v["ln1_g"], v["ln1_b"], eps=1e-5)
    fused = ATTENTION == "fused" and hasattr(g, "attention")
    q = heads(h @ v["wq"] + v["bq"], False)
    k = heads(h @ v["wk"] + v["bk"], not fused)
    vv = heads(h @ v["wv"] + v["bv"], False)
    if fused:  # jit_attention: blocks of keys with a running max and sum on the CPU
        o = g.attention(q, k, vv, mask)
    else:
        o = g.softmax((q @ k) * (1.0 / np.sqrt(D // HEADS)) + mask, axis=-1) @ vv
    a = g.reshape(g.transpose(o, (0, 2, 1, 3)), ("B", "S", D))
    x1 = x + (a @ v["wo"] + v["bo"])
    h2 = g.layer_norm(x1, v["ln2_g"], v["ln2_b"], eps=1e-5)
    g.output(x1 + (g.gelu_erf(h2 @ v["w1"] + v["c1"]) @ v["w2"] + v["c2"]))
    g.finalize()
    return lambda x, mask: g(x, mask, *(w[n] for n in GPT_NAMES))


def gpt2_dims():
    """The dynamic dims for torch.onnx.export: x's S and the mask's are one dim."""
    b, s = torch.export.Dim("B"), torch.export.Dim("S")
    return {"x": {0: b, 1: s}, "mask": {0: s, 1: s}}


class GPT2Block(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        for n in GPT_NAMES:
            self.register_buffer(n, torch.from_numpy(w[n].copy()))

    def forward(self, x, mask):
        b, s, d = x.shape

        def heads(t):
            return t.view(b, s, HEADS, d // HEADS).transpose(1, 2)

        h = F.layer_norm(x, (d,), self.ln1_g, self.ln1_b, 1e-5)
        q, k, v = (heads(h @ w + c) for w, c in ((self.wq, self.bq), (self.wk, self.bk),
                                                  (self.wv, self.bv)))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x1 = x + a.transpose(1, 2).reshape(b, s, d) @ self.wo + self.bo
        h2 = F.layer_norm(x1, (d,), self.ln2_g, self.ln2_b, 1e-5)
        return x1 + F.gelu(h2 @ self.w1 + self.c1) @ self.w2 + self.c2


# --- ResNet basic block ----------------------------------------------------------------

C, HW, BN_EPS = 64, 56, 1e-5


def resnet_weights():
    """(w1 [C, C, 3, 3], b1 [C], w2, b2): each batch norm folded into its conv."""
    rng = np.random.default_rng(2015)
    out = []
    for _ in (1, 2):
        conv = rng.normal(0, np.sqrt(2 / (9 * C)), size=(C, C, 3, 3))
        gamma, beta = rng.uniform(0.5, 1.5, C), rng.uniform(-0.2, 0.2, C)
        mean, var = rng.uniform(-0.2, 0.2, C), rng.uniform(0.5, 2.0, C)
        scale = gamma / np.sqrt(var + BN_EPS)
        out += [(conv * scale[:, None, None, None]).astype(np.float32),
                (beta - mean * scale).astype(np.float32)]
    return out


def resnet_inputs(n):
    return (np.random.default_rng(n).standard_normal((n, C, HW, HW)).astype(np.float32),)


def resnet_jitml(ctx, w):
    g = jitml.Graph(ctx, "resnet_basic_block")
    x = g.input("x", "float32", ("N", C, "H", "W"))
    w1, b1 = g.weight("w1", "float32", (C, C, 3, 3)), g.weight("b1", "float32", (C, 1, 1))
    w2, b2 = g.weight("w2", "float32", (C, C, 3, 3)), g.weight("b2", "float32", (C, 1, 1))
    h = g.relu(g.conv2d(x, w1, padding=1) + b1)
    g.output(g.relu(g.conv2d(h, w2, padding=1) + b2 + x))
    g.finalize()
    params = (w[0], w[1].reshape(C, 1, 1), w[2], w[3].reshape(C, 1, 1))
    return lambda x: g(x, *params)


class BasicBlock(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        for n, a in zip(("w1", "b1", "w2", "b2"), w):
            self.register_buffer(n, torch.from_numpy(a.copy()))

    def forward(self, x):
        h = F.relu(F.conv2d(x, self.w1, self.b1, padding=1))
        return F.relu(F.conv2d(h, self.w2, self.b2, padding=1) + x)


# --- the blocks as the runner sees them ------------------------------------------------

BLOCKS = {
    "gpt2": dict(title="GPT-2 small decoder block (D 768, 12 heads, MLP 3072, causal)",
                 weights=gpt2_weights, module=GPT2Block, jitml=gpt2_jitml,
                 inputs=gpt2_inputs, names=("x", "mask"),
                 shapes=[(1, 128), (1, 512), (8, 128), (8, 512)], quick=[(1, 128)],
                 label=lambda s: "B=%d S=%d" % s, example=(2, 16),
                 dynamic=gpt2_dims),
    "resnet": dict(title="ResNet basic block (NCHW, C 64, 56x56, bn folded)",
                   weights=resnet_weights, module=BasicBlock, jitml=resnet_jitml,
                   inputs=resnet_inputs, names=("x",),
                   shapes=[(1,), (8,)], quick=[(1,)], label=lambda s: "N=%d" % s,
                   example=(2,), dynamic=lambda: {"x": {0: torch.export.Dim("N")}}),
}
IMPLS = ("jitml", "ort", "eager", "compiled")


def export_onnx(blk, model, path):
    """The block as ONNX at `path`; returns the seconds the export took."""
    t0 = time.perf_counter()
    example = tuple(torch.from_numpy(a) for a in blk["inputs"](*blk["example"]))
    # "The axis name: S will not be used": x's S and the mask's are one dim, as meant.
    warnings.filterwarnings("ignore", message="# The axis name")
    torch.onnx.export(model, example, path, dynamo=True, input_names=list(blk["names"]),
                      output_names=["y"], dynamic_shapes=blk["dynamic"](),
                      external_data=False, verbose=False)
    return time.perf_counter() - t0


def make_impl(impl, blk, w, model, onnx_path, threads):
    """(call, close) for one implementation at `threads`; call() returns a NumPy array.
    Whatever is slow to set up (sessions, compiles) happens in the first call."""
    torch.set_num_threads(threads)
    if impl == "jitml":
        ctx = jitml.Context(num_threads=threads, cache_dir="")  # no disk hits
        state = {}

        def call(*arrays):
            if "fn" not in state:
                state["fn"] = blk["jitml"](ctx, w)
            return state["fn"](*arrays)
        return call, ctx.close
    if impl == "ort":
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        state = {}

        def call(*arrays):
            if "s" not in state:
                state["s"] = ort.InferenceSession(onnx_path, so,
                                                  providers=["CPUExecutionProvider"])
            return state["s"].run(None, dict(zip(blk["names"], arrays)))[0]
        return call, state.clear
    if impl == "eager":
        def call(*arrays):
            with torch.inference_mode():
                return model(*map(torch.from_numpy, arrays)).numpy()
        return call, lambda: None
    torch._dynamo.reset()  # compiled: inductor bakes the thread count into its code
    compiled = torch.compile(model, dynamic=False)

    def call(*arrays):
        with torch.no_grad():  # freezing wants no_grad (not inference_mode)
            return compiled(*map(torch.from_numpy, arrays)).numpy()
    return call, torch._dynamo.reset


def inductor_startup():
    """Seconds of the first torch.compile of a process (imports, the C++ toolchain
    check) on a tiny function, paid here so that no cell's compile time carries it."""
    t0 = time.perf_counter()
    torch.compile(lambda x: x * 2 + 1, dynamic=False)(torch.ones(4))
    torch._dynamo.reset()
    return time.perf_counter() - t0


def timed(f, *args):
    t0 = time.perf_counter()
    y = f(*args)
    return (time.perf_counter() - t0) * 1e3, y


def run_cell(call, arrays, reps, budget):
    """(first-call ms, median ms, n, output)."""
    first, y = timed(call, *arrays)
    warm, _ = timed(call, *arrays)
    n = max(3, min(reps, int(budget * 1e3 / max(warm, 1e-3))))
    return first, statistics.median(timed(call, *arrays)[0] for _ in range(n)), n, y


def max_err(y, ref, what, failures):
    """max |y - ref|; a FAIL added to `failures` above TOLERANCE * max |ref| (or NaN)."""
    scale = float(np.max(np.abs(ref)))
    err = float(np.max(np.abs(y - ref))) if y.shape == ref.shape else float("inf")
    if not err <= TOLERANCE * scale:
        failures.append("%s: max |err| %.3g > %.0e * max |eager| %.3g (shape %s, eager "
                        "%s)" % (what, err, TOLERANCE, scale, y.shape, ref.shape))
    return err


def cell_argv(args, name, shape, threads, impl, onnx_path, out_path):
    """The command line that runs one cell in a fresh process (main's --cell)."""
    argv = [sys.executable, os.path.abspath(__file__), "--cell", name, impl,
            ",".join(map(str, shape)), str(threads), "--onnx", onnx_path, "--out", out_path,
            "--reps", str(args.reps), "--budget", str(args.budget),
            "--attention", args.attention]
    return argv


def run_cell_process(args, name, shape, threads, impl, onnx_path, tmp):
    """(first-call ms, median ms, n, output) of one cell, run in its own process."""
    out_path = os.path.join(tmp, "%s-%s-%s-%d.npy" % (name, impl, "x".join(map(str, shape)),
                                                       threads))
    proc = subprocess.run(cell_argv(args, name, shape, threads, impl, onnx_path, out_path),
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit("models.py: the %s cell %s %s threads=%d failed (exit %d)" % (
            impl, name, shape, threads, proc.returncode))
    first, median, n = json.loads(proc.stdout.strip().splitlines()[-1])
    return first, median, n, np.load(out_path)


def cell_main(args):
    """--cell: one (block, implementation, shape, threads) cell; prints [first, median,
    n] as JSON and saves the output to --out."""
    name, impl, shape, threads = args.cell
    blk = BLOCKS[name]
    shape, threads = tuple(int(v) for v in shape.split(",")), int(threads)
    torch.set_num_interop_threads(1)
    torch._inductor.config.freezing = True
    if impl == "compiled":
        inductor_startup()
    w = blk["weights"]()
    model = blk["module"](w).eval()
    call, close = make_impl(impl, blk, w, model, args.onnx, threads)
    first, median, n, y = run_cell(call, blk["inputs"](*shape), args.reps, args.budget)
    close()
    np.save(args.out, y)
    print(json.dumps([first, median, n]))
    return 0


def bench_block(name, args, failures):
    blk = BLOCKS[name]
    w = blk["weights"]()
    model = blk["module"](w).eval()
    impls = [i for i in IMPLS if i != "ort" or ort is not None]
    tmp = tempfile.TemporaryDirectory(prefix="models-onnx-")
    onnx_path = os.path.join(tmp.name, name + ".onnx")
    notes = []
    if ort is None:
        notes.append("ort skipped: %s" % ORT_MISSING)
    else:
        notes.append("onnx export (once, dynamic dims): %.1f s" % export_onnx(
            blk, model, onnx_path))
    rows = []
    for shape in (blk["quick"] if args.quick else blk["shapes"]):
        arrays = blk["inputs"](*shape) if args.one_process else None
        for threads in args.threads:
            rounds = {impl: [] for impl in impls}
            for r in range(args.rounds):
                # Every other round in reverse, so that a drift of the machine's speed
                # within a round falls on every implementation alike.
                for impl in impls if r % 2 == 0 else impls[::-1]:
                    if args.one_process:
                        time.sleep(PAUSE_S)
                        call, close = make_impl(impl, blk, w, model, onnx_path, threads)
                        cell = run_cell(call, arrays, args.reps, args.budget)
                        close()
                    else:
                        cell = run_cell_process(args, name, shape, threads, impl,
                                                onnx_path, tmp.name)
                    rounds[impl].append(cell)
                    print("  %s %s threads=%d %-8s round %d first %9.1f ms  median %9.2f ms "
                          "(n=%d)" % (name, blk["label"](shape), threads, impl, r + 1,
                                      *cell[:3]), file=sys.stderr, flush=True)
            res = {impl: combine_rounds(cells) for impl, cells in rounds.items()}
            errs = {impl: max_err(r[3], res["eager"][3], "%s %s threads=%d %s" % (
                name, blk["label"](shape), threads, impl), failures)
                for impl, r in res.items()}
            rows.append((blk["label"](shape), threads, res, errs))
    print_table(blk["title"], rows, notes)


def combine_rounds(cells):
    """One cell's rounds as one: the first round's first call, the median of the
    rounds' medians, the calls of all rounds, the first round's output."""
    return (cells[0][0], statistics.median(c[1] for c in cells), sum(c[2] for c in cells),
            cells[0][3])


def fmt(res, impl, field):
    return "%.2f" % res[impl][field] if impl in res else "-"


def print_table(title, rows, notes):
    print("\n%s\nms per call (median of n calls; with --rounds, the median of the rounds' "
          "medians); ratio = best peer / jitml (> 1: libjitml faster); first call = compile "
          "+ run (ms, first round); err = max |y - eager|, eager in f32" % title)
    head = ("shape", "thr", "n", "jitml", "ort", "eager", "compiled", "ratio", "best",
            "1st jitml", "1st ort", "1st eager", "1st comp", "err jitml", "err ort",
            "err comp")
    lines = [head]
    for label, threads, res, errs in rows:
        peers = {i: res[i][1] for i in ("ort", "eager", "compiled") if i in res}
        best = min(peers, key=peers.get)
        lines.append((label, str(threads), str(res["jitml"][2]),
                      *(fmt(res, i, 1) for i in IMPLS),
                      "%.2fx" % (peers[best] / res["jitml"][1]), best,
                      *(fmt(res, i, 0) for i in IMPLS),
                      *("%.1e" % errs[i] if i in errs else "-"
                        for i in ("jitml", "ort", "compiled"))))
    widths = [max(len(r[c]) for r in lines) for c in range(len(head))]
    for r in lines:
        print("  ".join(c.rjust(wd) if i else c.ljust(wd)
                        for i, (c, wd) in enumerate(zip(r, widths))))
    for note in notes:
        print("  " + note)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="GPT-2 B=1 S=128 and ResNet N=1 only")
    ap.add_argument("--block", choices=sorted(BLOCKS), action="append",
                    help="run this block (repeatable; default: both)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per cell, at most")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each cell, alternating the implementations' order; the "
                         "median of their medians is reported (this VM drifts: use 3)")
    ap.add_argument("--budget", type=float, default=5.0,
                    help="seconds of timed calls per cell, about (n >= 3)")
    ap.add_argument("--attention", choices=("fused", "composed"), default="fused",
                    help="libjitml's GPT-2 attention: jit_attention (fused: key blocks "
                    "with a running max and sum) or matmul + softmax + matmul")
    ap.add_argument("--one-process", action="store_true",
                    help="run every cell in this process (default: each in its own)")
    ap.add_argument("--cell", nargs=4, metavar=("BLOCK", "IMPL", "SHAPE", "THREADS"),
                    help=argparse.SUPPRESS)  # one cell, for the runner
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global ATTENTION
    ATTENTION = args.attention
    for log in ("torch.onnx", "torch.utils.cpp_extension"):  # "torchvision not installed"
        logging.getLogger(log).setLevel(logging.ERROR)
    if args.cell:
        return cell_main(args)
    args.threads = [int(t) for t in args.threads.split(",")]
    torch._inductor.config.freezing = True
    torch.set_num_interop_threads(1)
    print("libjitml %s (%s), torch %s, onnxruntime %s, numpy %s; %d cores; "
          "JITML_SHAPE_POLICY=%s" % (
              jitml.version(), jitml.library_path(), torch.__version__,
              ort.__version__ if ort else "-", np.__version__, os.cpu_count(),
              os.environ["JITML_SHAPE_POLICY"]))
    if args.one_process:
        print("torch.compile start-up (once per process, not in the cells): %.1f s"
              % inductor_startup())
    else:
        print("torch.compile start-up: each cell's process pays its own, untimed")
    failures = []
    for name in args.block or ["gpt2", "resnet"]:
        bench_block(name, args, failures)
    if failures:
        print("\nFAIL: results differ from PyTorch eager:\n  " + "\n  ".join(failures))
        return 1
    print("\nall results agree with PyTorch eager (max |err| <= %.0e * max |eager|)"
          % TOLERANCE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
