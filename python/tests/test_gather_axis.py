"""Graph.gather(table, indices, axis): numpy.take along every axis, static and symbolic
dims, index checks naming the axis's size, negative axes, and export/import."""
import numpy as np
import pytest

import jitml


def take_graph(ctx, name, table_shape, idx_shape, axis, dtype="float32"):
    g = jitml.Graph(ctx, name)
    t = g.input("table", dtype, table_shape)
    i = g.input("ids", "int64", idx_shape)
    g.output(g.gather(t, i, axis=axis))
    return g.finalize()


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("idx_shape", [(), ("S",), (2, "S")])
def test_take_matches_numpy(ctx, axis, idx_shape):
    name = "take_%d_%d" % (axis % 3, len(idx_shape))
    g = take_graph(ctx, name, ("A", 7, "C"), idx_shape, axis)
    rng = np.random.default_rng(len(idx_shape) * 10 + axis % 3)
    for a, c, s in ((3, 5, 4), (1, 1, 1), (2, 13, 6)):
        table = rng.standard_normal((a, 7, c)).astype(np.float32)
        dim = table.shape[axis]
        shape = tuple(s if d == "S" else d for d in idx_shape)
        ids = rng.integers(0, dim, size=shape).astype(np.int64)
        want = np.take(table, ids, axis=axis)
        got = g(table, ids)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_take_f16_middle_axis(ctx):
    g = take_graph(ctx, "take_f16", (4, 9, 3), ("S",), 1, "float16")
    table = np.arange(108, dtype=np.float16).reshape(4, 9, 3)
    ids = np.array([8, 0, 4, 4], np.int64)
    np.testing.assert_array_equal(g(table, ids), np.take(table, ids, axis=1))


def test_index_out_of_the_axis_is_refused(ctx):
    g = take_graph(ctx, "take_oob", (3, 5), ("S",), 1)
    table = np.zeros((3, 5), np.float32)
    with pytest.raises(jitml.JitError) as e:
        g(table, np.array([0, 5], np.int64))  # 5 is a valid row, not a valid column
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "[0, 5)" in e.value.message


def test_bad_axis_is_refused(ctx):
    g = jitml.Graph(ctx, "take_bad_axis")
    t = g.input("table", "float32", (3, 5))
    i = g.input("ids", "int64", (2,))
    with pytest.raises(jitml.JitError) as e:
        g.output(g.gather(t, i, axis=2))
        g.finalize()
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT


def test_take_exports_and_imports(ctx):
    g = take_graph(ctx, "take_export", (3, 5, 2), ("S",), 1)
    h = jitml.Graph.from_mlir(ctx, g.to_mlir())
    table = np.arange(30, dtype=np.float32).reshape(3, 5, 2)
    ids = np.array([4, 1, 1], np.int64)
    np.testing.assert_array_equal(h(table, ids), np.take(table, ids, axis=1))
