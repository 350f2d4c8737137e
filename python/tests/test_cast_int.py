"""Graph.cast to and from integers: NumPy and torch results against NumPy's own
conversion where it is defined (in range), and the saturating rules past it."""
import numpy as np
import pytest

import jitml

F = np.array([0.0, 1.5, -1.5, 2.5, -2.7, 126.9, 127.5, -128.9, 1e9, -1e9, np.nan,
              np.inf, -np.inf, 3e38], np.float32)


def cast_graph(ctx, frm, to, name):
    g = jitml.Graph(ctx, name)
    x = g.input("x", frm, ("N",))
    g.output(g.cast(x, to))
    return g.finalize()


@pytest.mark.parametrize("to, lo, hi", [("int8", -128, 127), ("int32", -2**31, 2**31 - 1),
                                        ("int64", -2**63, 2**63 - 1)])
def test_float_to_int_saturates(ctx, to, lo, hi):
    g = cast_graph(ctx, "float32", to, "py_f2" + to)
    y = g(F)
    assert y.dtype == np.dtype(to)
    with np.errstate(invalid="ignore"):
        want = [0 if np.isnan(v) else hi if v >= hi else lo if v <= lo else int(np.trunc(v))
                for v in F.astype(np.float64)]
    np.testing.assert_array_equal(y, np.array(want, dtype=to))


def test_int_to_float_and_int(ctx):
    g = jitml.Graph(ctx, "py_i2x")
    x = g.input("x", "int32", ("N",))
    g.output(g.cast(x, "float32"))
    g.output(g.cast(x, "float16"))
    g.output(g.cast(x, "int8"))
    g.finalize()
    a = np.array([1, -2, 300, 2**31 - 1, -2**31, 65519, 70000], np.int32)
    f32, f16, i8 = g(a)
    np.testing.assert_array_equal(f32, a.astype(np.float32))
    np.testing.assert_array_equal(f16, a.astype(np.float32).astype(np.float16))
    wrapped = ((a.astype(np.int64) + 128) % 256 - 128).astype(np.int8)  # as NumPy wraps
    np.testing.assert_array_equal(i8, wrapped)


def test_torch_int_outputs(ctx):
    torch = pytest.importorskip("torch")
    g = cast_graph(ctx, "float32", "int32", "py_torch_f2i")
    x = torch.tensor([3.7, -3.7, 0.2, 1e6])
    y = g(x)
    assert y.dtype == torch.int32
    assert y.tolist() == [3, -3, 0, 1000000]


def test_int_values_feed_only_some_ops(ctx):
    g = jitml.Graph(ctx, "py_int_rules")
    x = g.input("x", "float32", (4,))
    i = g.cast(x, "int32")
    with pytest.raises(jitml.JitError) as e:
        g.output(g.relu(i))
        g.finalize()
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH


def test_integer_graphs_export_and_import(ctx):
    # Integer inputs (gather ids) and integer outputs survive Graph.to_mlir and
    # Graph.from_mlir.
    g = jitml.Graph(ctx, "py_int_export")
    t = g.input("t", "float32", ("V", 2))
    i = g.input("i", "int32", ("N",))
    rows = g.gather(t, i)
    g.output(rows)
    g.output(g.cast(rows, "int8"))
    g.finalize()
    h = jitml.Graph.from_mlir(ctx, g.to_mlir())
    table = np.array([[0.5, -1.5], [300.0, 2.9], [-7.2, 1e9]], np.float32)
    ids = np.array([2, 0, 1, 1], np.int32)
    for graph in (g, h):
        f, q = graph(table, ids)
        np.testing.assert_array_equal(f, table[ids])
        np.testing.assert_array_equal(q, np.array([[-7, 127], [0, -1], [127, 2], [127, 2]],
                                                  np.int8))


def test_quantize_with_round(ctx):
    # torch.quantize_per_tensor's arithmetic: round half to even, then saturate.
    g = jitml.Graph(ctx, "py_quantize")
    x = g.input("x", "float32", ("N",))
    g.output(g.cast(g.round(x * (1.0 / 0.1)), "int8"))
    g.finalize()
    a = np.array([0.05, 0.15, 0.25, -0.05, -0.25, 12.7, 12.75, -12.85, 100.0, 0.049999997],
                 np.float32)
    want = np.clip(np.round((a * np.float32(1.0 / 0.1)).astype(np.float32)), -128, 127)
    np.testing.assert_array_equal(g(a), want.astype(np.int8))
