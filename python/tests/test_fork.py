"""Forked workers (multiprocessing's "fork" start method, as PyTorch's DataLoader uses
on Linux) go on using a graph their parent compiled, while the parent's background
thread may still be compiling its generic kernel at the fork: that compile ends before
the fork (or, still queued, is done by the worker), so the workers' new shapes run on
the generic kernel rather than waiting for a compile that is not in their process."""
import multiprocessing

import numpy as np
import pytest

import jitml

_graph = None  # inherited by the forked workers


def _run(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 5), dtype=np.float32)
    w = rng.standard_normal((5, 3), dtype=np.float32)
    y = _graph(x, w)
    want = np.tanh(x.astype(np.float64) @ w.astype(np.float64))
    return float(np.max(np.abs(y - want)))


def _worker(n):
    before = _graph.ctx.stats()["generic_runs"]
    err = _run(n)
    return err, _graph.ctx.stats()["generic_runs"] - before


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="no fork start method on this platform")
def test_forked_workers_run_new_shapes(tmp_path):
    global _graph
    ctx = jitml.Context(cache_dir=str(tmp_path))
    g = jitml.Graph(ctx, "fork_workers")
    x = g.input("x", "float32", ("N", 5))
    w = g.input("w", "float32", (5, 3))
    g.output(g.tanh(g.matmul(x, w)))
    _graph = g.finalize()
    try:
        assert _run(4) < 1e-5  # compiles; queues the generic kernel's compile
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map_async(_worker, [1, 7, 13, 29]).get(timeout=120)
        assert max(err for err, _ in results) < 1e-5, results
        assert all(generic >= 1 for _, generic in results), results
        assert _run(31) < 1e-5
    finally:
        _graph = None
        ctx.close()
