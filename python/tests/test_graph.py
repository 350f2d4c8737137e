"""The Graph builder and calls with NumPy arrays: every op against a NumPy reference,
several batch sizes, f16, dtype and shape errors, strides, read-only inputs."""
import math
import os
import warnings

import numpy as np
import pytest

import jitml

rng = np.random.default_rng(7)


def rand(*shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def softmax_ref(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


UNARY = {
    "neg": (lambda x: -x, -1, 1),
    "exp": (np.exp, -1, 1),
    "log": (np.log, 0.1, 2),
    "tanh": (np.tanh, -2, 2),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), -3, 3),
    "relu": (lambda x: np.maximum(x, 0), -1, 1),
    "gelu": (gelu_ref, -3, 3),
    "sqrt": (np.sqrt, 0.1, 2),
    "rsqrt": (lambda x: 1 / np.sqrt(x), 0.1, 2),
    "erf": (_erf, -3, 3),
    "gelu_erf": (lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))), -3, 3),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(ctx, op):
    ref, lo, hi = UNARY[op]
    g = jitml.Graph(ctx, "unary_" + op)
    x = g.input("x", "float32", ("N", 5))
    g.output(getattr(g, op)(x))
    g.finalize()
    for n in (1, 3, 17):
        xa = rand(n, 5, lo=lo, hi=hi)
        y = g(xa)
        assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (n, 5)
        np.testing.assert_allclose(y, ref(xa), rtol=1e-5, atol=1e-6)


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum,
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(ctx, op):
    g = jitml.Graph(ctx, "binary_" + op)
    a = g.input("a", "float32", ("N", 1, 4))
    b = g.input("b", "float32", (3, 4))
    g.output(getattr(g, op)(a, b))
    g.finalize()
    for n in (1, 2, 9):
        aa, ba = rand(n, 1, 4), rand(3, 4, lo=0.5, hi=2)
        np.testing.assert_allclose(g(aa, ba), BINARY[op](aa, ba), rtol=1e-6, atol=1e-6)


def test_operators_and_scalars(ctx):
    g = jitml.Graph(ctx, "operators")
    x = g.input("x", "float32", ("N",))
    y = g.input("y", "float32", ("N",))
    g.output((x * 2 + 1 - y) / 4, 1 - x, 2 / (y + 3), -x)
    g.finalize()
    xa, ya = rand(6), rand(6)
    r = g(xa, ya)
    assert isinstance(r, tuple) and len(r) == 4
    np.testing.assert_allclose(r[0], (xa * 2 + 1 - ya) / 4, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(r[1], 1 - xa, rtol=1e-6)
    np.testing.assert_allclose(r[2], 2 / (ya + 3), rtol=1e-6)
    np.testing.assert_allclose(r[3], -xa)


@pytest.mark.parametrize("n", [1, 4, 33])
def test_matmul_batched(ctx, n):
    g = jitml.Graph(ctx, "bmm")
    a = g.input("a", "float32", ("B", "M", 8))
    b = g.input("b", "float32", (8, 5))
    g.output(a @ b)
    g.finalize()
    aa, ba = rand(n, 3, 8), rand(8, 5)
    np.testing.assert_allclose(g(aa, ba), aa @ ba, rtol=1e-5, atol=1e-5)


def test_weights_follow_their_arrays(ctx):
    # Graph.weight (jit_weight): results follow a new array and, after
    # weights_changed(), new values written into the same one; packed copies (where
    # the kernel takes them) are counted in stats()["weight_packs"].
    g = jitml.Graph(ctx, "dense_w")
    x = g.input("x", "float32", ("M", 96))
    w = g.weight("w", "float32", (96, 128))
    g.output(x @ w)
    g.finalize()
    xa, wa, wb = rand(64, 96), rand(96, 128), rand(96, 128)
    for _ in range(2):
        np.testing.assert_allclose(g(xa, wa), xa @ wa, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g(xa, wb), xa @ wb, rtol=1e-4, atol=1e-4)
    wa[...] = wb * 2
    g.weights_changed()
    np.testing.assert_allclose(g(xa, wa), xa @ wa, rtol=1e-4, atol=1e-4)
    assert "weight_packs" in ctx.stats()


@pytest.mark.parametrize("op,ref", [("reduce_sum", np.sum), ("reduce_max", np.max),
                                    ("reduce_mean", np.mean)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(ctx, op, ref, keepdims):
    g = jitml.Graph(ctx, op)
    x = g.input("x", "float32", ("N", 6))
    g.output(getattr(g, op)(x, axis=-1, keepdims=keepdims))
    g.finalize()
    for n in (1, 5):
        xa = rand(n, 6)
        np.testing.assert_allclose(g(xa), ref(xa, axis=-1, keepdims=keepdims),
                                   rtol=1e-5, atol=1e-6)


def test_softmax_transpose_reshape(ctx):
    g = jitml.Graph(ctx, "shape_ops")
    x = g.input("x", "float32", ("N", 3, 4))
    s = g.softmax(x, axis=1)
    t = g.transpose(s, (0, 2, 1))
    g.output(g.reshape(t, ("N", -1)))
    g.finalize()
    for n in (1, 7):
        xa = rand(n, 3, 4, lo=-5, hi=5)
        want = softmax_ref(xa, axis=1).transpose(0, 2, 1).reshape(n, -1)
        np.testing.assert_allclose(g(xa), want, rtol=1e-5, atol=1e-6)


def build_mlp(ctx, dtype="float32", name="mlp"):
    g = jitml.Graph(ctx, name)
    x = g.input("x", dtype, ("N", 16))
    w1 = g.input("w1", dtype, (16, 32))
    b1 = g.input("b1", dtype, (32,))
    w2 = g.input("w2", dtype, (32, 4))
    b2 = g.input("b2", dtype, (4,))
    g.output(g.softmax(g.gelu(x @ w1 + b1) @ w2 + b2, axis=-1))
    return g.finalize()


def mlp_ref(x, w1, b1, w2, b2):
    x, w1, b1, w2, b2 = (a.astype(np.float32) for a in (x, w1, b1, w2, b2))
    return softmax_ref(gelu_ref(x @ w1 + b1) @ w2 + b2)


def mlp_params(dtype=np.float32):
    return (rand(16, 32, dtype=dtype), rand(32, dtype=dtype), rand(32, 4, dtype=dtype),
            rand(4, dtype=dtype))


def test_mlp_batch_sizes_and_stats():
    ctx = jitml.Context()
    g = build_mlp(ctx)
    params = mlp_params()
    for n in (1, 7, 64):
        x = rand(n, 16)
        np.testing.assert_allclose(g(x, *params), mlp_ref(x, *params), rtol=1e-4,
                                   atol=1e-6)
        g(x, *params)
    st = ctx.stats()
    assert st["runs"] == 6
    assert st["compiles"] + st.get("disk_hits", 0) <= 3
    assert st["memory_hits"] >= 3
    ctx.close()


def test_f16(ctx):
    g = build_mlp(ctx, "float16", "mlp_f16")
    params = mlp_params(np.float16)
    for n in (2, 5):
        x = rand(n, 16, dtype=np.float16)
        y = g(x, *params)
        assert y.dtype == np.float16 and y.shape == (n, 4)
        np.testing.assert_allclose(y.astype(np.float32), mlp_ref(x, *params),
                                   rtol=2e-2, atol=2e-3)


def test_output_shapes_compiles_nothing():
    ctx = jitml.Context()
    g = build_mlp(ctx)
    shapes = g.output_shapes(jitml.TensorSpec((13, 16), "float32"), *mlp_params())
    assert shapes == [(13, 4)]
    assert ctx.stats()["compiles"] == 0
    ctx.close()


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.uint8])
def test_unsupported_dtype_names_the_input(ctx, dtype):
    g = build_mlp(ctx)
    params = mlp_params()
    with pytest.raises(jitml.JitError) as e:
        g(np.zeros((3, 16), dtype), *params)
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    assert "input 0 `x`" in e.value.message and np.dtype(dtype).name in e.value.message


def test_f16_into_f32_graph(ctx):
    g = build_mlp(ctx)
    with pytest.raises(jitml.JitError) as e:
        g(*(rand(3, 16, dtype=np.float16),) + mlp_params())
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH and "`x`" in str(e.value)


def test_shape_mismatch_and_counts(ctx):
    g = build_mlp(ctx)
    params = mlp_params()
    with pytest.raises(jitml.JitError) as e:
        g(rand(3, 15), *params)
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    with pytest.raises(jitml.JitError) as e:
        g(rand(3, 16))
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    with pytest.raises(jitml.JitError):
        g([1.0, 2.0], *params)


def test_builder_error_is_raised_at_once(ctx):
    g = jitml.Graph(ctx, "bad")
    a = g.input("a", "float32", (2, 3))
    b = g.input("b", "float32", (4, 5))
    with pytest.raises(jitml.JitError) as e:
        g.matmul(a, b)
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    with pytest.raises(jitml.JitError) as e:
        jitml.Graph(ctx, "f64").input("x", "float64", (2,))
    assert e.value.code == jitml.StatusCode.UNSUPPORTED


def test_non_contiguous_inputs_are_copied_with_a_warning(ctx):
    g = build_mlp(ctx)
    w1, b1, w2, b2 = mlp_params()
    x = rand(16, 5).T                      # a transpose: strides (4, 20)
    want = mlp_ref(x, w1, b1, w2, b2)
    with pytest.warns(jitml.CopyWarning, match="`x`"):
        y = g(x, w1, b1, w2, b2)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6)
    xr = rand(5, 16)[::-1]                 # negative stride
    with pytest.warns(jitml.CopyWarning):
        y = g(xr, w1, b1, w2, b2)
    np.testing.assert_allclose(y, mlp_ref(xr, w1, b1, w2, b2), rtol=1e-4, atol=1e-6)
    b1z = np.broadcast_to(np.float32(0.5), (32,))   # zero stride
    with pytest.warns(jitml.CopyWarning, match="`b1`"):
        y = g(xr, w1, b1z, w2, b2)
    np.testing.assert_allclose(y, mlp_ref(xr, w1, np.full(32, 0.5, np.float32), w2, b2),
                               rtol=1e-4, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jitml.CopyWarning)
        with pytest.raises(jitml.CopyWarning):
            g(x, w1, b1, w2, b2)


def test_contiguous_inputs_do_not_warn_and_are_not_written(ctx):
    g = build_mlp(ctx)
    params = mlp_params()
    x = rand(4, 16)
    before = [a.copy() for a in (x,) + params]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g(x, *params)
    for a, b in zip((x,) + params, before):
        np.testing.assert_array_equal(a, b)


def test_read_only_inputs(ctx):
    g = build_mlp(ctx)
    params = mlp_params()
    x = rand(3, 16)
    x.flags.writeable = False
    for p in params:
        p.flags.writeable = False
    y = g(x, *params)
    assert y.flags.writeable
    np.testing.assert_allclose(y, mlp_ref(x, *params), rtol=1e-4, atol=1e-6)


def test_closed_context_and_graph(ctx):
    c = jitml.Context()
    g = build_mlp(c)
    c.close()
    with pytest.raises(jitml.JitError) as e:
        g(rand(1, 16), *mlp_params())
    assert "closed" in str(e.value)
    c.close()  # idempotent


# The MLIR import's own fixture: y = tanh(x W + b) in linalg, N and H dynamic.
MLIR_FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                            "tests", "mlir", "linalg_mlp.mlir")


def test_from_mlir(ctx):
    if not os.path.exists(MLIR_FIXTURE):
        pytest.skip("no MLIR fixture %s" % MLIR_FIXTURE)
    with open(MLIR_FIXTURE) as f:
        text = f.read()
    try:
        g = jitml.Graph.from_mlir(ctx, text, entry="forward")
    except jitml.JitError as e:
        if e.code == jitml.StatusCode.UNAVAILABLE or "not implemented" in e.message:
            pytest.skip("jit_graph_from_mlir is not available in this libjitml yet: %s"
                        % e)
        raise
    assert g.num_inputs == 3 and g.num_outputs == 1
    for n, h in ((1, 8), (5, 8), (5, 3)):
        x, w, b = rand(n, 16), rand(16, h), rand(h)
        y = g(x, w, b)   # the first call learns the output dtype (one copy)
        np.testing.assert_allclose(y, np.tanh(x @ w + b), rtol=1e-5, atol=1e-6)
        y = g(x, w, b)   # later calls allocate the output directly
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, np.tanh(x @ w + b), rtol=1e-5, atol=1e-6)
    with pytest.raises(jitml.JitError) as e:
        g(rand(2, 16), rand(16, 4), rand(5))          # H bound to 4 and to 5
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    with pytest.raises(jitml.JitError) as e:
        jitml.Graph.from_mlir(ctx, "func.func @broken(")
    assert e.value.code == jitml.StatusCode.PARSE_ERROR


def test_version():
    assert jitml.version().count(".") == 2
    assert jitml.library_path()


def test_norms_and_clamp(ctx):
    g = jitml.Graph(ctx, "norms")
    x = g.input("x", "float32", ("N", 13))
    w = g.input("w", "float32", (13,))
    b = g.input("b", "float32", (13,))
    g.output(g.layer_norm(x, w, b, eps=1e-5), g.rms_norm(x, w), g.clamp(x, -0.5, 0.25))
    g.finalize()
    for n in (1, 7):
        xa, wa, ba = rand(n, 13, lo=-2, hi=3), rand(13, lo=0.5, hi=1.5), rand(13)
        ln, rms, cl = g(xa, wa, ba)
        x64 = xa.astype(np.float64)
        d = x64 - x64.mean(-1, keepdims=True)
        want_ln = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * wa + ba
        want_rms = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * wa
        np.testing.assert_allclose(ln, want_ln, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(rms, want_rms, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(cl, np.clip(xa, -0.5, 0.25))


def test_stats_has_every_counter(ctx):
    st = ctx.stats()
    for name in ("runs", "compiles", "disk_hits", "generic_runs", "kernels_unloaded",
                 "remote_hits", "remote_errors", "remote_bytes_written"):
        assert name in st and st[name] >= 0
    assert st["remote_hits"] == 0  # no fleet cache configured
