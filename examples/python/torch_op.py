#!/usr/bin/env python3
"""A small PyTorch model whose MLP block is replaced by a libjitml custom op,
torch.ops.jitml.mlp_block, checked against torch's own result for several batch
sizes, with the time of the first call (compiles) and later calls (reuse).

    JITML_LIBRARY=build/libjitml.so PYTHONPATH=python python3 examples/python/torch_op.py

Exits non-zero on a mismatch.
"""
import math
import sys
import time

import torch

import jitml
import jitml.torch_op

D, HIDDEN = 64, 256


class Block(torch.nn.Module):
    """x + W2 gelu(W1 x + b1) + b2: the MLP block of a transformer layer."""

    def __init__(self, use_jitml=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(D, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, D)
        self.use_jitml = use_jitml

    def forward(self, x):
        if self.use_jitml:
            # nn.Linear stores W as [out, in]; the op takes [in, out]. The transposes
            # are made contiguous once (outside the timed loop in real code they would
            # be cached); a non-contiguous tensor would be copied with a CopyWarning.
            return torch.ops.jitml.mlp_block(x, self.w1t, self.fc1.bias, self.w2t,
                                             self.fc2.bias)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x), approximate="tanh"))

    def prepare_jitml(self):
        self.w1t = self.fc1.weight.detach().t().contiguous()
        self.w2t = self.fc2.weight.detach().t().contiguous()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, D)
        self.block = Block()
        self.head = torch.nn.Linear(D, 10)

    def forward(self, x):
        return torch.softmax(self.head(self.block(torch.tanh(self.embed(x)))), dim=-1)


def build_block_graph(ctx):
    g = jitml.Graph(ctx, "mlp_block")
    x = g.input("x", "float32", ("N", D))
    w1 = g.input("w1", "float32", (D, HIDDEN))
    b1 = g.input("b1", "float32", (HIDDEN,))
    w2 = g.input("w2", "float32", (HIDDEN, D))
    b2 = g.input("b2", "float32", (D,))
    g.output(x + (g.gelu(x @ w1 + b1) @ w2 + b2))
    return g.finalize()


def main():
    torch.manual_seed(0)
    ctx = jitml.Context()
    jitml.torch_op.register("mlp_block", build_block_graph(ctx))

    model = Model().eval()
    model.block.prepare_jitml()
    worst = 0.0
    with torch.inference_mode():
        for n in (1, 8, 128):
            x = torch.randn(n, 16)
            model.block.use_jitml = False
            want = model(x)
            model.block.use_jitml = True
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                got = model(x)
                times.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            model.block.use_jitml = False
            model(x)
            torch_ms = (time.perf_counter() - t0) * 1e3
            err = float((got - want).abs().max())
            worst = max(worst, err)
            print("N = %3d  first call %8.2f ms  later calls %6.3f %6.3f ms  "
                  "(all-torch model %6.3f ms)  max |error| %.2e"
                  % (n, times[0], times[1], times[2], torch_ms, err))
    print("stats:", ctx.stats())
    ok = worst <= 1e-5 and not math.isnan(worst)
    if not ok:
        print("torch_op: mismatch %.3g" % worst, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
