"""Graph.slice with bounds that follow a symbol ("S", ("S", -1)): cache[:S],
cache[S - 8:], cache[S - 1 : S + 2 : 2] against NumPy, on exact kernels and the generic
kernel, export/import, and the errors."""
import numpy as np
import pytest

import jitml

CASES = [  # (start, stop, step) as Graph.slice takes them, and as NumPy computes them
    (None, "S", 1, lambda s: (None, s)),
    (("S", -8), None, 1, lambda s: (s - 8, None)),
    (("S", -1), ("S", 2), 2, lambda s: (s - 1, s + 2)),
]
BINDINGS = [(1, 1), (1, 7), (3, 10), (7, 7), (5, 13), (11, 4), (2, 17)]


def cache_graph(ctx, start, stop, step, axis):
    g = jitml.Graph(ctx, "cache_slice")
    q = g.input("q", "float32", ("S", 3))
    cache = g.input("cache", "float32", (2, "T", 3) if axis else ("T", 3))
    zero = g.mul(g.reduce_sum(q, 0, keepdims=True), g.scalar(0.0))
    g.output(g.add(g.slice(cache, axis, start, stop, step), zero))
    return g.finalize()


@pytest.mark.parametrize("policy", ["exact", "generic"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_numpy(monkeypatch, policy, axis, case):
    monkeypatch.setenv("JITML_SHAPE_POLICY", policy)
    start, stop, step, np_bounds = CASES[case]
    ctx = jitml.Context()
    try:
        g = cache_graph(ctx, start, stop, step, axis)
        for s, t in BINDINGS:
            cache = np.arange(t * 3 * (2 if axis else 1), dtype=np.float32)
            cache = cache.reshape((2, t, 3) if axis else (t, 3))
            a, b = np_bounds(s)
            want = cache[:, a:b:step] if axis else cache[a:b:step]
            q = np.ones((s, 3), np.float32)
            if want.size == 0:
                with pytest.raises(jitml.JitError) as e:
                    g(q, cache)
                assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
                continue
            np.testing.assert_array_equal(g(q, cache), want)
        back = jitml.Graph.from_mlir(ctx, g.to_mlir())
        cache = np.arange(30, dtype=np.float32).reshape((10, 3))
        if not axis:
            a, b = np_bounds(3)
            np.testing.assert_array_equal(back(np.ones((3, 3), np.float32), cache),
                                          cache[a:b:step])
    finally:
        ctx.close()


def test_bad_bounds(ctx):
    g = jitml.Graph(ctx, "slice_unbound")
    x = g.input("x", "float32", (7, 3))
    with pytest.raises(jitml.JitError) as e:
        g.output(g.slice(x, 0, stop="S"))
        g.finalize()
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "not a dim of any input" in e.value.message
    g = jitml.Graph(ctx, "slice_bad_tuple")
    x = g.input("x", "float32", ("S", 3))
    with pytest.raises(TypeError):
        g.slice(x, 0, ("S",))
