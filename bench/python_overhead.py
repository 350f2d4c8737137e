#!/usr/bin/env python3
"""What a call from Python costs: libjitml's Python package against its own C call and
against ONNX Runtime's and torch.compile's Python calls, on one thread, in one run.

Graphs (the same as bench/call_c.c, which times the C call; it is run first):
  mlp       softmax(gelu(x W1 + b1) W2 + b2), x [1, 784], W1 [784, 256], W2 [256, 10]:
            examples/mlp's model at batch 1, where the call is most of the time
  fma_relu  relu(a * b + c) over three [16M] float32 vectors: one memory-bound kernel,
            where allocating the 64 MB output on each call is what a Python call adds
Rows (median over rounds of the mean time per call; lower is better):
  C                 jit_run from C (build/bench/jitml_call_c), output buffer reused
  jitml numpy       Graph(x, ...) on NumPy arrays, output allocated by the call
  jitml numpy out=  the same writing a preallocated output (out=)
  jitml torch       Graph(x, ...) on torch tensors; and with out=
  ort               onnxruntime InferenceSession.run, CPU EP, weights as initializers
                    (its usual form), one intra-op thread
  torch.compile     inductor, dynamic=False, under inference_mode, weights as module
                    parameters; torch eager alongside
The `vs C` column is the row's time over the C call's: the Python call's overhead
factor for libjitml rows (issue target: <= 1.5 at N = 1).

Run (PyPI's torch, onnxruntime and onnx in a venv; scripts/python-venv.sh makes one
with torch):
  JITML_LIBRARY=build/libjitml.so PYTHONPATH=python <venv>/bin/python \\
      bench/python_overhead.py [--c build/bench/jitml_call_c] [--quick]
Peers that are not installed print a dash.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("JITML_SHAPE_POLICY", "exact")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import jitml  # noqa: E402

IN, HID, OUT = 784, 256, 10
BIG = 16 * 1024 * 1024


def mlp_weights():
    i = np.arange(IN * HID)
    w1 = (((i * 37) % 101 - 50) / 500.0).astype(np.float32).reshape(IN, HID)
    i = np.arange(HID * OUT)
    w2 = (((i * 13) % 97 - 48) / 500.0).astype(np.float32).reshape(HID, OUT)
    x = ((np.arange(IN) % 17) / 17.0).astype(np.float32).reshape(1, IN)
    return x, w1, np.zeros(HID, np.float32), w2, np.zeros(OUT, np.float32)


def fma_inputs():
    i = np.arange(BIG)
    return ((i % 13) - 6.0).astype(np.float32), ((i % 7) * 0.25).astype(np.float32), \
        ((i % 5) - 2.0).astype(np.float32)


def timed(fn, calls, rounds):
    for _ in range(max(1, calls // 10)):
        fn()
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def jitml_graphs(ctx):
    g = jitml.Graph(ctx, "mlp")
    x = g.input("x", "float32", ("N", IN))
    w1 = g.input("w1", "float32", (IN, HID))
    b1 = g.input("b1", "float32", (HID,))
    w2 = g.input("w2", "float32", (HID, OUT))
    b2 = g.input("b2", "float32", (OUT,))
    g.output(g.softmax(g.gelu(x @ w1 + b1) @ w2 + b2, axis=-1))
    f = jitml.Graph(ctx, "fma_relu")
    a, b, c = (f.input(n, "float32", ("N",)) for n in "abc")
    f.output(f.relu(a * b + c))
    return g.finalize(), f.finalize()


def ort_sessions():
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    x, w1, b1, w2, b2 = mlp_weights()
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["h0"]),
             helper.make_node("Gelu", ["h0"], ["h"], approximate="tanh"),
             helper.make_node("MatMul", ["h", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    mlp = helper.make_model(helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", OUT])], inits),
        opset_imports=[helper.make_opsetid("", 20)])
    fnodes = [helper.make_node("Mul", ["a", "b"], ["m"]),
              helper.make_node("Add", ["m", "c"], ["s"]),
              helper.make_node("Relu", ["s"], ["y"])]
    vec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"]) for n in "abc"]
    fma = helper.make_model(helper.make_graph(
        fnodes, "fma", vec, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])]),
        opset_imports=[helper.make_opsetid("", 20)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    mk = lambda m: ort.InferenceSession(m.SerializeToString(), so,  # noqa: E731
                                        providers=["CPUExecutionProvider"])
    return mk(mlp), mk(fma)


def torch_models():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    x, w1, b1, w2, b2 = (torch.from_numpy(a) for a in mlp_weights())

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.b1 = torch.nn.Parameter(w1), torch.nn.Parameter(b1)
            self.w2, self.b2 = torch.nn.Parameter(w2), torch.nn.Parameter(b2)

        def forward(self, x):
            h = torch.nn.functional.gelu(x @ self.w1 + self.b1, approximate="tanh")
            return torch.softmax(h @ self.w2 + self.b2, dim=-1)

    def fma(a, b, c):
        return torch.relu(a * b + c)

    return torch, MLP().eval(), fma


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--c", default=os.path.join(here, "..", "build", "bench", "jitml_call_c"))
    ap.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = ap.parse_args()
    calls, big_calls, rounds = (500, 3, 3) if args.quick else (4000, 8, 7)

    c_us = {}
    r = subprocess.run([args.c, str(calls * 5)], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        sys.exit("python_overhead: %s failed: %s" % (args.c, r.stderr.strip()))
    for line in r.stdout.strip().splitlines():
        name, us = line.split()
        c_us[name] = float(us)

    ctx = jitml.Context(num_threads=1)
    mlp, fma = jitml_graphs(ctx)
    mlp_in = mlp_weights()
    fma_in = fma_inputs()
    rows = []  # (graph, impl, us)

    def add(graph, impl, fn, n):
        rows.append((graph, impl, timed(fn, n, rounds)))

    want = mlp(*mlp_in)
    add("mlp", "jitml numpy", lambda: mlp(*mlp_in), calls)
    y = np.empty_like(want)
    add("mlp", "jitml numpy out=", lambda: mlp(*mlp_in, out=y), calls)
    fy = np.empty(BIG, np.float32)
    add("fma_relu", "jitml numpy", lambda: fma(*fma_in), big_calls)
    add("fma_relu", "jitml numpy out=", lambda: fma(*fma_in, out=fy), big_calls)

    tm = torch_models()
    if tm:
        torch, model, tfma = tm
        tmlp_in = [torch.from_numpy(a) for a in mlp_in]
        tfma_in = [torch.from_numpy(a) for a in fma_in]
        ty, tfy = torch.empty(1, OUT), torch.empty(BIG)
        add("mlp", "jitml torch", lambda: mlp(*tmlp_in), calls)
        add("mlp", "jitml torch out=", lambda: mlp(*tmlp_in, out=ty), calls)
        add("fma_relu", "jitml torch", lambda: fma(*tfma_in), big_calls)
        add("fma_relu", "jitml torch out=", lambda: fma(*tfma_in, out=tfy), big_calls)
        with torch.inference_mode():
            xt = tmlp_in[0]
            add("mlp", "torch eager", lambda: model(xt), calls)
            add("fma_relu", "torch eager", lambda: tfma(*tfma_in), big_calls)
            cm = torch.compile(model, dynamic=False)
            cf = torch.compile(tfma, dynamic=False)
            np.testing.assert_allclose(cm(xt).numpy(), want, rtol=1e-4, atol=1e-6)
            add("mlp", "torch.compile", lambda: cm(xt), calls)
            add("fma_relu", "torch.compile", lambda: cf(*tfma_in), big_calls)
    else:
        for g in ("mlp", "fma_relu"):
            rows += [(g, "torch eager", None), (g, "torch.compile", None)]

    sess = ort_sessions()
    if sess:
        so_mlp, so_fma = sess
        feed = {"x": mlp_in[0]}
        np.testing.assert_allclose(so_mlp.run(None, feed)[0], want, rtol=1e-4, atol=1e-6)
        add("mlp", "ort", lambda: so_mlp.run(None, feed), calls)
        ffeed = dict(zip("abc", fma_in))
        add("fma_relu", "ort", lambda: so_fma.run(None, ffeed), big_calls)
    else:
        rows += [("mlp", "ort", None), ("fma_relu", "ort", None)]

    print("libjitml %s (%s), 1 thread; us per call, median of %d rounds"
          % (jitml.version(), jitml.library_path(), rounds))
    print("%-10s %-18s %12s %8s" % ("graph", "call", "us", "vs C"))
    for g in ("mlp", "fma_relu"):
        print("%-10s %-18s %12.2f %8s" % (g, "C", c_us[g], "1.00"))
        for gg, impl, us in rows:
            if gg != g:
                continue
            if us is None:
                print("%-10s %-18s %12s %8s" % (g, impl, "-", "-"))
            else:
                print("%-10s %-18s %12.2f %8.2f" % (g, impl, us, us / c_us[g]))


if __name__ == "__main__":
    main()
