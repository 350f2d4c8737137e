#!/usr/bin/env python3
"""A two-layer MLP, softmax(gelu(x W1 + b1) W2 + b2), built with the jitml Graph
builder and run on NumPy arrays for several batch sizes; checked against NumPy.

    JITML_LIBRARY=build/libjitml.so PYTHONPATH=python python3 examples/python/mlp_numpy.py

Exits non-zero on a mismatch. The first call for each batch size compiles a kernel;
the second reuses it.
"""
import sys
import time

import numpy as np

import jitml

IN, HIDDEN, OUT = 784, 256, 10


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main():
    ctx = jitml.Context()
    g = jitml.Graph(ctx, "mlp")
    x = g.input("x", "float32", ("N", IN))          # N: a symbolic batch size
    w1 = g.input("w1", "float32", (IN, HIDDEN))
    b1 = g.input("b1", "float32", (HIDDEN,))
    w2 = g.input("w2", "float32", (HIDDEN, OUT))
    b2 = g.input("b2", "float32", (OUT,))
    g.output(g.softmax(g.gelu(x @ w1 + b1) @ w2 + b2, axis=-1))
    g.finalize()

    rng = np.random.default_rng(0)
    params = [rng.uniform(-0.05, 0.05, s).astype(np.float32)
              for s in ((IN, HIDDEN), (HIDDEN,), (HIDDEN, OUT), (OUT,))]
    worst = 0.0
    for n in (1, 7, 64):
        xa = rng.uniform(-1, 1, (n, IN)).astype(np.float32)
        t0 = time.perf_counter()
        y = g(xa, *params)
        t1 = time.perf_counter()
        y = g(xa, *params)
        t2 = time.perf_counter()
        ref = softmax(gelu(xa @ params[0] + params[1]) @ params[2] + params[3])
        err = float(np.abs(y - ref).max())
        worst = max(worst, err)
        print("N = %3d  first call %8.2f ms  second call %7.3f ms  max |error| %.2e"
              % (n, (t1 - t0) * 1e3, (t2 - t1) * 1e3, err))
    print("stats:", ctx.stats())
    ctx.close()
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
