"""The comparisons, where, pow, conv2d, the pools, gather, concat, slice, pad and cast
of the Graph API against PyTorch (Debian's python3-torch; references in float64 unless
an op is exact), a ResNet basic block, a GPT-2 input stage and GPT-2's fused QKV
attention built from them, jitml.mlir_opt, and bfloat16 (torch.bfloat16 tensors, NumPy
uint16 bit patterns) through the ops, the casts and the dtype errors."""
import ctypes

import numpy as np
import pytest

import jitml
from jitml import _lib

torch = pytest.importorskip("torch")
F = torch.nn.functional

inf, nan = float("inf"), float("nan")
NP = {"float32": np.float32, "float16": np.float16}


def rand(rng, *shape, dtype="float32", lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(NP[dtype])


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def build(ctx, name, dtype, shapes, fn):
    """A graph of inputs `shapes` (a dict, in order) whose outputs are fn(g, *inputs)."""
    g = jitml.Graph(ctx, name)
    ins = [g.input(n, dtype, s) for n, s in shapes.items()]
    out = fn(g, *ins)
    g.output(*(out if isinstance(out, tuple) else (out,)))
    return g.finalize()


# --- the struct ------------------------------------------------------------------------


def test_window_params_mirrors_the_header():
    P = _lib.jit_window_params
    assert ctypes.sizeof(P) == 52
    offsets = {name: getattr(P, name).offset for name, _ in P._fields_}
    assert offsets == {"layout": 0, "kernel": 4, "stride": 12, "padding": 20,
                       "dilation": 36, "groups": 44, "count_include_pad": 48}
    # jit_window_params_init writes exactly 52 bytes, with the defaults the header names.
    buf = ctypes.create_string_buffer(b"\xab" * 64, 64)
    jitml._core._init().jit_window_params_init(ctypes.cast(buf, ctypes.POINTER(P)))
    assert buf.raw[52:] == b"\xab" * 12
    p = P.from_buffer(buf)
    assert (p.layout, list(p.kernel), list(p.stride), list(p.padding), list(p.dilation),
            p.groups, p.count_include_pad) == (_lib.JIT_LAYOUT_NCHW, [0, 0], [1, 1],
                                               [0, 0, 0, 0], [1, 1], 1, 1)


# --- comparisons and where -------------------------------------------------------------

CMP = {"less": torch.lt, "less_equal": torch.le, "greater": torch.gt,
       "greater_equal": torch.ge, "equal": torch.eq, "not_equal": torch.ne}
SPECIAL = np.array([-2.0, -1.0, -0.0, 0.0, 1.0, 2.0, inf, -inf, nan])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", sorted(CMP))
def test_comparisons_nan_inf_and_broadcasting(ctx, op, dtype):
    g = build(ctx, "cmp_" + op, dtype, {"a": ("N", 1, 5), "b": (4, 1)},
              lambda g, a, b: getattr(g, op)(a, b))
    rng = np.random.default_rng(1)
    for n in (1, 3):
        # Few distinct values, so that ties, NaNs and infinities meet each other.
        a = rng.choice(SPECIAL, size=(n, 1, 5)).astype(NP[dtype])
        b = rng.choice(SPECIAL, size=(4, 1)).astype(NP[dtype])
        y = g(a, b)
        assert y.dtype == NP[dtype] and y.shape == (n, 4, 5)
        want = CMP[op](torch.from_numpy(a), torch.from_numpy(b)).numpy()
        np.testing.assert_array_equal(y, want.astype(NP[dtype]))


def test_where_masks_with_minus_inf_before_softmax(ctx):
    # A causal mask from a comparison of index ramps; where() picks -inf without reading
    # the scores it drops (a NaN there must not leak, as it would through m*x+(1-m)*-inf).
    def fn(g, s, rows, cols):
        masked = g.where(g.greater_equal(rows, cols), s, -inf)
        return masked, g.softmax(masked, axis=-1)

    g = build(ctx, "causal", "float32", {"s": ("B", "S", "S"), "rows": ("S", 1),
                                         "cols": ("S",)}, fn)
    rng = np.random.default_rng(2)
    for b, s in ((1, 1), (2, 6)):
        x = rand(rng, b, s, s, lo=-3, hi=3)
        x[..., np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]] = nan
        ramp = np.arange(s, dtype=np.float32)
        masked, p = g(x, ramp[:, None], ramp)
        keep = torch.from_numpy(ramp[:, None] >= ramp)
        want = torch.where(keep, t64(x), torch.tensor(-inf, dtype=torch.float64))
        np.testing.assert_array_equal(masked, want.numpy().astype(np.float32))
        assert not np.isnan(p).any()
        np.testing.assert_allclose(p, torch.softmax(want, -1).numpy(), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_where_three_way_broadcast_and_nan_condition(ctx, dtype):
    g = build(ctx, "where3_" + dtype, dtype, {"c": (3, 1, 1), "a": (1, "N", 1),
                                              "b": (1, 1, 5)},
              lambda g, c, a, b: (g.where(c, a, b), g.where(c, 7.5, b)))
    rng = np.random.default_rng(3)
    c = np.array([0.0, nan, -0.0], NP[dtype]).reshape(3, 1, 1)  # NaN is nonzero; -0 is 0
    for n in (1, 4):
        a, b = rand(rng, 1, n, 1, dtype=dtype), rand(rng, 1, 1, 5, dtype=dtype)
        y, y_num = g(c, a, b)
        cond = torch.from_numpy(c) != 0
        want = torch.where(cond, torch.from_numpy(a), torch.from_numpy(b))
        assert y.shape == (3, n, 5) and y.dtype == NP[dtype]
        np.testing.assert_array_equal(y, want.numpy())
        want_num = torch.where(cond, torch.tensor(7.5, dtype=want.dtype),
                               torch.from_numpy(b)).expand(3, 1, 5)
        np.testing.assert_array_equal(y_num, want_num.numpy())


def test_scalar_takes_infinities_but_not_nan(ctx):
    g = build(ctx, "infs", "float32", {"x": (3,)},
              lambda g, x: (g.maximum(x, g.scalar(-inf)), g.minimum(x, g.scalar(inf))))
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    lo, hi = g(x)
    np.testing.assert_array_equal(lo, x)
    np.testing.assert_array_equal(hi, x)
    with pytest.raises(jitml.JitError) as e:
        jitml.Graph(ctx, "nan").scalar(nan)
    assert e.value.code == jitml.StatusCode.UNSUPPORTED


# --- pow -------------------------------------------------------------------------------

# (a, b) pairs where libjitml and torch.pow agree exactly in their special values.
POW_EDGES = [
    (-2, 3), (-2, 2), (-2, -3), (-1.5, -1), (-3, 1), (-7, -1), (-1, -33), (-1, 1024),
    (-2, 0.5), (-8, 1 / 3), (-3, -0.5),                 # negative ** fraction: NaN
    (0, 0), (0, -1), (0, -2), (0, 2), (-0.0, -2), (nan, 0), (5, 0), (-inf, 0),
    (1, nan), (1, inf), (1, -inf), (1, -5), (-1, nan), (nan, 2), (2, nan),
    (inf, -1), (inf, 0.5), (-inf, 3), (-inf, 2), (-inf, -1), (0.5, inf), (2, -inf),
    (-2, inf), (-0.5, inf), (-2, -inf), (-0.5, -inf), (0, inf), (-1.001, 4096),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pow_edges(ctx, dtype):
    g = build(ctx, "pow_edges_" + dtype, dtype, {"a": ("N",), "b": ("N",)},
              lambda g, a, b: g.pow(a, b))
    a = np.array([p[0] for p in POW_EDGES], NP[dtype])
    b = np.array([p[1] for p in POW_EDGES], NP[dtype])
    want = torch.pow(t64(a), t64(b)).numpy().astype(NP[dtype])
    np.testing.assert_allclose(g(a, b), want, rtol=1e-5 if dtype == "float32" else 2e-3,
                               atol=0)


def test_pow_ieee_corners(ctx):
    g = build(ctx, "pow_ieee", "float32", {"a": (4,), "b": (4,)},
              lambda g, a, b: g.pow(a, b))
    a = np.array([-1, -1, -0.0, -inf], np.float32)
    b = np.array([inf, -inf, -1, 0.5], np.float32)
    got = g(a, b)
    want = torch.pow(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0 and -inf too


def test_pow_broadcast_random(ctx):
    # The header promises 2e-6 (relative) where |b log|a|| < 16; these stay below 12.
    g = build(ctx, "pow_rand", "float32", {"a": ("N", 6), "b": (6,), "k": (1, 6)},
              lambda g, a, b, k: (g.pow(a, b), g.pow(a, k)))
    rng = np.random.default_rng(4)
    for n in (1, 5):
        a = rand(rng, n, 6, lo=0.05, hi=6)
        a[:, ::2] *= -1
        b = rand(rng, 6, lo=-4, hi=4)
        k = np.array([[-3, -2, -1, 1, 2, 5]], np.float32)  # integers: sign of odd powers
        y, yk = g(a, b, k)
        want = torch.pow(t64(a), t64(b)).numpy()
        assert np.array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_allclose(y, want, rtol=3e-6, atol=0)
        np.testing.assert_allclose(yk, torch.pow(t64(a), t64(k)).numpy(), rtol=3e-6,
                                   atol=0)


# --- conv2d ----------------------------------------------------------------------------


def pad4(padding):
    if isinstance(padding, int):
        return (padding,) * 4
    return padding if len(padding) == 4 else (padding[0], padding[0], padding[1],
                                              padding[1])


def conv_ref(x, w, stride, padding, dilation, groups):
    """NCHW/OIHW in float64, asymmetric padding by F.pad."""
    t, b, l, r = pad4(padding)
    return F.conv2d(F.pad(t64(x), (l, r, t, b)), t64(w), stride=stride, dilation=dilation,
                    groups=groups).numpy()


# (x shape NCHW, filters, kernel, stride, padding, dilation, groups)
CONVS = {
    "plain": ((2, 3, 8, 9), 4, (3, 3), 1, 0, 1, 1),
    "stride_asym_pad": ((1, 4, 9, 7), 6, (3, 2), (2, 3), (1, 0, 2, 1), 1, 1),
    "dilation": ((2, 4, 11, 10), 4, (3, 3), 1, (2, 3), (2, 3), 1),
    "groups": ((1, 6, 7, 7), 4, (3, 3), 1, 1, 1, 2),
    "depthwise": ((2, 5, 6, 8), 5, (3, 3), 2, 1, 1, 5),
    "depthwise_x2": ((1, 5, 6, 6), 10, (3, 3), 1, (0, 2, 1, 0), 1, 5),
    "pointwise_stride": ((2, 7, 5, 6), 3, (1, 1), 2, 0, 1, 1),
    "whole_input": ((1, 2, 4, 5), 3, (4, 5), 1, 0, 1, 1),
}


def conv_graph(ctx, name, layout, dtype, c, f, k, stride, padding, dilation, groups):
    kh, kw = k
    if layout == "NCHW":
        xs, ws = ("N", c, "H", "W"), (f, c // groups, kh, kw)
    else:
        xs, ws = ("N", "H", "W", c), (kh, kw, c // groups, f)
    return build(ctx, name, dtype, {"x": xs, "w": ws},
                 lambda g, x, w: g.conv2d(x, w, stride=stride, padding=padding,
                                          dilation=dilation, groups=groups, layout=layout))


def run_conv(g, layout, x, w):
    """Runs g on NCHW x / OIHW w, converting to NHWC / HWIO and back as needed."""
    if layout == "NCHW":
        return g(x, w)
    y = g(np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
          np.ascontiguousarray(w.transpose(2, 3, 1, 0)))
    return y.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv2d(ctx, case, layout):
    shape, f, k, stride, padding, dilation, groups = CONVS[case]
    g = conv_graph(ctx, "conv_%s_%s" % (case, layout), layout, "float32", shape[1], f, k,
                   stride, padding, dilation, groups)
    rng = np.random.default_rng(5)
    x = rand(rng, *shape)
    w = rand(rng, f, shape[1] // groups, *k)
    want = conv_ref(x, w, stride, padding, dilation, groups)
    y = run_conv(g, layout, x, w)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_symbolic_batch_height_width(ctx, layout):
    # One graph, N, H and W symbols: every shape binds anew, including windows that
    # fit exactly once and strides that drop the last row/column.
    args = dict(stride=(2, 1), padding=(1, 0, 0, 2), dilation=(1, 2), groups=2)
    g = conv_graph(ctx, "conv_sym_" + layout, layout, "float32", 4, 6, (3, 3),
                   args["stride"], args["padding"], args["dilation"], args["groups"])
    rng = np.random.default_rng(6)
    w = rand(rng, 6, 2, 3, 3)
    for n, h, wd in ((1, 2, 3), (3, 9, 7), (2, 16, 4)):
        x = rand(rng, n, 4, h, wd)
        want = conv_ref(x, w, **args)
        y = run_conv(g, layout, x, w)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_conv2d_torch_tensors_in_and_out(ctx):
    g = conv_graph(ctx, "conv_torch", "NCHW", "float32", 3, 2, (3, 3), 1, 1, 1, 1)
    x, w = torch.rand(2, 3, 5, 5), torch.rand(2, 3, 3, 3)
    y = g(x, w)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_f16(ctx, layout):
    args = dict(stride=1, padding=(1, 2), dilation=1, groups=4)
    g = conv_graph(ctx, "conv_f16_" + layout, layout, "float16", 8, 8, (3, 3), **args)
    rng = np.random.default_rng(7)
    w = rand(rng, 8, 2, 3, 3, dtype="float16")
    for n, h, wd in ((1, 5, 5), (2, 7, 6)):
        x = rand(rng, n, 8, h, wd, dtype="float16")
        y = run_conv(g, layout, x, w)
        assert y.dtype == np.float16
        # f16 in and out (accumulating in f32): the output rounding dominates.
        np.testing.assert_allclose(y.astype(np.float64), conv_ref(x, w, **args),
                                   rtol=1e-2, atol=1e-2)


# --- pools -----------------------------------------------------------------------------


def pool_ref(kind, x, kernel, stride, padding, dilation=1, count_include_pad=True):
    """NCHW in float64. Symmetric padding goes to torch as is; asymmetric padding by
    F.pad (-inf for max; for avg, a padded sum divided by a padded count)."""
    t, b, l, r = pad4(padding)
    x = t64(x)
    if kind == "max":
        if t == b and l == r:
            return F.max_pool2d(x, kernel, stride, (t, l), dilation).numpy()
        return F.max_pool2d(F.pad(x, (l, r, t, b), value=-inf), kernel, stride, 0,
                            dilation).numpy()
    if t == b and l == r:
        return F.avg_pool2d(x, kernel, stride, (t, l),
                            count_include_pad=count_include_pad).numpy()
    total = F.avg_pool2d(F.pad(x, (l, r, t, b)), kernel, stride)
    if count_include_pad:
        return total.numpy()
    count = F.avg_pool2d(F.pad(torch.ones_like(x), (l, r, t, b)), kernel, stride)
    return (total / count).numpy()


# (kind, kernel, stride, padding, dilation, count_include_pad)
POOLS = {
    "max_2": ("max", 2, None, 0, 1, True),
    "max_3s2p1": ("max", 3, 2, 1, 1, True),
    "max_rect": ("max", (3, 2), (1, 2), (1, 0), 1, True),
    "max_dilated": ("max", 3, 1, 1, (2, 1), True),
    "max_asym_pad": ("max", (3, 3), 2, (0, 2, 1, 0), 1, True),
    "avg_2": ("avg", 2, None, 0, 1, True),
    "avg_3s2p1_incl": ("avg", 3, 2, 1, 1, True),
    "avg_3s2p1_excl": ("avg", 3, 2, 1, 1, False),
    "avg_rect_excl": ("avg", (2, 3), (2, 1), (1, 1), 1, False),
    "avg_asym_incl": ("avg", 3, 1, (2, 0, 1, 2), 1, True),
    "avg_asym_excl": ("avg", 3, 1, (2, 0, 1, 2), 1, False),
}


def pool_graph(ctx, name, layout, dtype, c, kind, kernel, stride, padding, dilation,
               count_include_pad):
    xs = ("N", c, "H", "W") if layout == "NCHW" else ("N", "H", "W", c)

    def fn(g, x):
        if kind == "max":
            return g.max_pool2d(x, kernel, stride, padding, dilation, layout=layout)
        return g.avg_pool2d(x, kernel, stride, padding, count_include_pad, layout=layout)
    return build(ctx, name, dtype, {"x": xs}, fn)


def run_pool(g, layout, x):
    if layout == "NCHW":
        return g(x)
    return g(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", sorted(POOLS))
def test_pool2d(ctx, case, layout):
    kind, kernel, stride, padding, dilation, cip = POOLS[case]
    g = pool_graph(ctx, "pool_%s_%s" % (case, layout), layout, "float32", 3, kind, kernel,
                   stride, padding, dilation, cip)
    rng = np.random.default_rng(8)
    for n, h, w in ((1, 6, 6), (2, 9, 7)):
        # All negative: a padded zero would win a max, or show in a sum, if it leaked.
        x = rand(rng, n, 3, h, w, lo=-5, hi=-1)
        want = pool_ref(kind, x, kernel, kernel if stride is None else stride, padding,
                        dilation, cip)
        y = run_pool(g, layout, x)
        assert y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_max_pool2d_nan_and_inf(ctx):
    g = pool_graph(ctx, "pool_nan", "NCHW", "float32", 1, "max", 2, 1, 1, 1, True)
    x = np.full((1, 1, 4, 4), -inf, np.float32)
    x[0, 0, 1, 1], x[0, 0, 3, 3] = nan, -5
    want = F.max_pool2d(torch.from_numpy(x), 2, 1, 1).numpy()
    np.testing.assert_array_equal(g(x), want)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pools_f16(ctx, layout):
    rng = np.random.default_rng(9)
    x = rand(rng, 2, 4, 7, 6, dtype="float16", lo=-3, hi=3)
    for kind, cip in (("max", True), ("avg", True), ("avg", False)):
        g = pool_graph(ctx, "pool16_%s_%d_%s" % (kind, cip, layout), layout, "float16", 4,
                       kind, 3, 2, 1, 1, cip)
        y = run_pool(g, layout, x)
        assert y.dtype == np.float16
        np.testing.assert_allclose(y.astype(np.float64), pool_ref(kind, x, 3, 2, 1, 1, cip),
                                   rtol=2e-3, atol=2e-3)


# --- errors ----------------------------------------------------------------------------


def conv_inputs(ctx, xs=(1, 4, 6, 6), ws=(4, 4, 3, 3)):
    g = jitml.Graph(ctx, "bad")
    return g, g.input("x", "float32", xs), g.input("w", "float32", ws)


@pytest.mark.parametrize("kwargs, code", [
    (dict(layout="NWHC"), "INVALID_ARGUMENT"),        # checked here
    (dict(padding=(1, 2, 3)), "INVALID_ARGUMENT"),
    (dict(stride=1.5), "INVALID_ARGUMENT"),
    (dict(stride=2**32 + 1), "INVALID_ARGUMENT"),     # would wrap to 1 in a C int
    (dict(stride=0), "INVALID_ARGUMENT"),             # checked by libjitml
    (dict(dilation=(1, -1)), "INVALID_ARGUMENT"),
    (dict(padding=-1), "INVALID_ARGUMENT"),
    (dict(groups=0), "INVALID_ARGUMENT"),
    (dict(groups=3), "SHAPE_MISMATCH"),               # 4 channels, 4 filters
    (dict(dilation=4), "SHAPE_MISMATCH"),             # a 9x9 window in a 6x6 input
])
def test_conv2d_bad_arguments(ctx, kwargs, code):
    g, x, w = conv_inputs(ctx)
    with pytest.raises(jitml.JitError) as e:
        g.conv2d(x, w, **kwargs)
    assert e.value.code_name == code


def test_window_shape_errors(ctx):
    g, x, w = conv_inputs(ctx, ws=(4, 4, 3))
    with pytest.raises(jitml.JitError) as e:
        g.conv2d(x, w)
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    g, x, w = conv_inputs(ctx, xs=(1, "C", 6, 6))
    with pytest.raises(jitml.JitError) as e:
        g.conv2d(x, w)
    assert e.value.code == jitml.StatusCode.UNSUPPORTED and "static" in e.value.message
    g, x, _ = conv_inputs(ctx)
    with pytest.raises(jitml.JitError) as e:
        g.max_pool2d(x, 2, padding=2)  # a window of padding only
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    g, x, _ = conv_inputs(ctx)
    with pytest.raises(jitml.JitError) as e:
        g.avg_pool2d(x, (2, 2, 2))
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    g = build(ctx, "pool_late", "float32", {"x": (1, 4, "H", "W")},
              lambda g, x: g.max_pool2d(x, 3))
    with pytest.raises(jitml.JitError) as e:
        g(np.zeros((1, 4, 2, 8), np.float32))  # H = 2 < kernel 3, found at run time
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH


# --- a ResNet basic block --------------------------------------------------------------

C = 16
EPS = 1e-5


def resnet_weights():
    rng = np.random.default_rng(12)
    w = {}
    for i in (1, 2):
        w["conv%d" % i] = rng.normal(0, np.sqrt(2 / (9 * C)), size=(C, C, 3, 3))
        w["gamma%d" % i] = rng.uniform(0.5, 1.5, size=C)
        w["beta%d" % i] = rng.uniform(-0.2, 0.2, size=C)
        w["mean%d" % i] = rng.uniform(-0.2, 0.2, size=C)
        w["var%d" % i] = rng.uniform(0.5, 2.0, size=C)
    return w


def folded(w, i, layout):
    """Batch norm i folded into conv i: (weight OIHW or HWIO, per-channel bias), f32."""
    scale = w["gamma%d" % i] / np.sqrt(w["var%d" % i] + EPS)
    wf = w["conv%d" % i] * scale[:, None, None, None]
    bias = w["beta%d" % i] - w["mean%d" % i] * scale
    if layout == "NCHW":
        return wf.astype(np.float32), bias.reshape(C, 1, 1).astype(np.float32)
    return np.ascontiguousarray(wf.transpose(2, 3, 1, 0)).astype(np.float32), \
        bias.astype(np.float32)


def jitml_basic_block(ctx, layout):
    g = jitml.Graph(ctx, "resnet_basic_block_" + layout)
    xs = ("N", C, "H", "W") if layout == "NCHW" else ("N", "H", "W", C)
    ws = (C, C, 3, 3) if layout == "NCHW" else (3, 3, C, C)
    bs = (C, 1, 1) if layout == "NCHW" else (C,)
    x = g.input("x", "float32", xs)
    w1, b1 = g.input("w1", "float32", ws), g.input("b1", "float32", bs)
    w2, b2 = g.input("w2", "float32", ws), g.input("b2", "float32", bs)
    h = g.relu(g.conv2d(x, w1, padding=1, layout=layout) + b1)
    g.output(g.relu(g.conv2d(h, w2, padding=1, layout=layout) + b2 + x))
    return g.finalize()


def torch_basic_block(x, w):
    t = {k: t64(v) for k, v in w.items()}
    h = t64(x)
    for i in (1, 2):
        h = F.conv2d(h, t["conv%d" % i], padding=1)
        h = F.batch_norm(h, t["mean%d" % i], t["var%d" % i], t["gamma%d" % i],
                         t["beta%d" % i], training=False, eps=EPS)
        if i == 1:
            h = F.relu(h)
    return F.relu(h + t64(x)).numpy()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_resnet_basic_block_matches_pytorch(ctx, layout):
    w = resnet_weights()
    g = jitml_basic_block(ctx, layout)
    params = folded(w, 1, layout) + folded(w, 2, layout)
    rng = np.random.default_rng(13)
    for n, h, wd in ((1, 8, 8), (2, 7, 9), (3, 5, 5)):
        x = rng.normal(size=(n, C, h, wd)).astype(np.float32)
        want = torch_basic_block(x, w)
        if layout == "NCHW":
            y = g(x, *params)
        else:
            y = g(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), *params).transpose(0, 3, 1, 2)
        assert y.shape == (n, C, h, wd)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


# --- gather: embedding lookups ---------------------------------------------------------
# A gather copies rows, so results are compared exactly. Indices are int32/int64 graph
# inputs that feed gather only; the library checks host indices against the table's
# rows for the binding before anything runs.

IDX = {"int32": np.int32, "int64": np.int64}


def gather_graph(ctx, name, table_dtype, table_shape, idx_dtype, idx_shape):
    g = jitml.Graph(ctx, name)
    t = g.input("table", table_dtype, table_shape)
    ids = g.input("ids", idx_dtype, idx_shape)
    g.output(g.gather(t, ids))
    return g.finalize()


def ids_of(rng, rows, shape, dtype):
    return rng.integers(0, rows, size=shape).astype(dtype)


@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_embedding_matches_torch(ctx, idx_dtype, dtype):
    # Rows, batch and sequence all symbolic: one graph for every binding below.
    g = gather_graph(ctx, "embedding_%s_%s" % (dtype, idx_dtype), dtype, ("V", 16),
                     idx_dtype, ("B", "S"))
    rng = np.random.default_rng(30)
    for v, b, s in ((37, 2, 5), (50257 // 64, 3, 7), (1, 1, 1), (37, 0, 4)):
        table = rand(rng, v, 16, dtype=dtype)
        ids = ids_of(rng, v, (b, s), IDX[idx_dtype])
        want = F.embedding(torch.from_numpy(ids).long(), torch.from_numpy(table)).numpy()
        y = g(table, ids)
        assert y.dtype == NP[dtype] and y.shape == (b, s, 16)
        np.testing.assert_array_equal(y, want)
        # torch tensors in, torch out (torch's int32/int64 ids as they are).
        yt = g(torch.from_numpy(table), torch.from_numpy(ids))
        assert isinstance(yt, torch.Tensor) and yt.dtype == getattr(torch, dtype)
        np.testing.assert_array_equal(yt.numpy(), want)


@pytest.mark.parametrize("idx_dtype", ["int32", np.int32, torch.int64, "i64"])
def test_gather_input_dtype_spellings(ctx, idx_dtype):
    g = gather_graph(ctx, "gather_spelling", "float32", (5, 2), idx_dtype, (3,))
    name = jitml._core._dtype_name(idx_dtype)
    assert g._input_dtypes == ["float32", name] and name in ("int32", "int64")
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    ids = np.array([4, 0, 4], dtype=IDX[name])
    np.testing.assert_array_equal(g(table, ids), table[ids])


@pytest.mark.parametrize("table_shape", [("V",), ("V", 6), ("V", 3, 4)])
@pytest.mark.parametrize("idx_shape", [(), ("S",), ("B", "S")])
def test_gather_ranks_match_numpy_take(ctx, table_shape, idx_shape):
    g = gather_graph(ctx, "gather_r%d_r%d" % (len(table_shape), len(idx_shape)),
                     "float32", table_shape, "int64", idx_shape)
    rng = np.random.default_rng(31)
    for v, b, s in ((9, 2, 3), (4, 1, 6)):
        sizes = {"V": v, "B": b, "S": s}
        table = rand(rng, *[sizes.get(d, d) for d in table_shape])
        ids = ids_of(rng, v, tuple(sizes[d] for d in idx_shape), np.int64)
        want = np.take(table, ids, axis=0)
        assert g.output_shapes(table, ids) == [want.shape]
        y = g(table, ids)
        assert y.shape == ids.shape + table.shape[1:]
        np.testing.assert_array_equal(y, want)


def test_gather_of_computed_tables(ctx):
    # The table's rows come from a symbol of another input (a matmul) or are known only
    # once the whole graph is bound (a reshape's -1); out-of-range is checked for both.
    g = jitml.Graph(ctx, "gather_computed")
    a = g.input("a", "float32", ("V", 3))
    w = g.input("w", "float32", (3, 4))
    flat = g.input("flat", "float32", ("K",))
    ids = g.input("ids", "int32", ("S",))
    g.output(g.gather(a @ w, ids), g.gather(g.reshape(flat, (-1, 2)), ids))
    g.finalize()
    rng = np.random.default_rng(32)
    A, W, Fl = rand(rng, 6, 3), rand(rng, 3, 4), rand(rng, 12)
    ids_ok = np.array([5, 0, 3, 5], np.int32)
    y1, y2 = g(A, W, Fl, ids_ok)
    np.testing.assert_allclose(y1, (A @ W)[ids_ok], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y2, Fl.reshape(-1, 2)[ids_ok])
    with pytest.raises(jitml.JitError) as e:
        g(A, W, Fl[:8], ids_ok)  # the reshaped table has 4 rows
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "index 5 (element 0 of input 3 `ids`)" in e.value.message
    assert "[0, 4)" in e.value.message


def test_gather_non_contiguous_and_read_only_ids(ctx):
    g = gather_graph(ctx, "gather_strided", "float32", ("V", 2), "int64", ("B", "S"))
    table = np.arange(18, dtype=np.float32).reshape(9, 2)
    ids = (np.arange(12, dtype=np.int64) % 9).reshape(3, 4)
    with pytest.warns(jitml.CopyWarning, match="`ids`"):
        np.testing.assert_array_equal(g(table, ids.T), table[ids.T])
    with pytest.warns(jitml.CopyWarning, match="`ids`"):
        y = g(torch.from_numpy(table), torch.from_numpy(ids).t())
    np.testing.assert_array_equal(y.numpy(), table[ids.T])
    ro = ids.copy()
    ro.setflags(write=False)  # described through the array interface, not DLPack
    np.testing.assert_array_equal(g(table, ro), table[ro])
    ro = ids.copy()
    ro[2, 1] = 9
    ro.setflags(write=False)
    with pytest.raises(jitml.JitError) as e:
        g(table, ro)
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "index 9 (element 9 of input 1 `ids`)" in e.value.message


@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.parametrize("bad", [-1, 37, 40, -2**31])
def test_gather_out_of_range_ids(ctx, idx_dtype, bad):
    g = gather_graph(ctx, "g", "float32", ("V", 8), idx_dtype, ("B", "S"))
    table = np.ones((37, 8), np.float32)
    ids = np.array([[0, 1, 2], [36, 5, 6]], IDX[idx_dtype])
    g(table, ids)
    ids[1, 0] = bad
    runs = ctx.stats()["runs"]
    for args in ((table, ids), (torch.from_numpy(table), torch.from_numpy(ids))):
        with pytest.raises(jitml.JitError) as e:
            g(*args)
        assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
        assert ("graph `g`: node 2 (gather): index %d (element 3 of input 1 `ids`) is "
                "outside the table's rows [0, 37)" % bad) in e.value.message
    assert ctx.stats()["runs"] == runs  # nothing ran


def test_gather_range_follows_the_binding(ctx):
    # Symbolic rows: the same index is out of range for a small table only.
    g = gather_graph(ctx, "gather_rows", "float32", ("V", 4), "int64", ("S",))
    ids = np.array([0, 7], np.int64)
    with pytest.raises(jitml.JitError) as e:
        g(np.zeros((7, 4), np.float32), ids)
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "index 7 (element 1" in e.value.message and "[0, 7)" in e.value.message
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    np.testing.assert_array_equal(g(table, ids), table[ids])
    big = np.array([2**40], np.int64)  # not truncated to 32 bits on the way
    with pytest.raises(jitml.JitError) as e:
        g(table, big)
    assert "index %d " % 2**40 in e.value.message


RANK0_GENERIC = """
import sys
import numpy as np
import jitml
g = jitml.Graph(jitml.Context(cache_dir=""), "g")
t = g.input("t", "float32", ("V",))
i = g.input("i", "int32", ())
g.output(g.gather(t, i))
g.finalize()
for v in (9, 4):
    print(float(g(np.arange(v, dtype=np.float32) * 2, np.array(v - 1, np.int32))))
"""


def test_gather_rank0_result_generic_kernel():
    # A rank-1 table and rank-0 indices, in a child process: the failure was a crash
    # (MLIR's vector.gather lowering, when the generic kernel vectorized the read).
    # JITML_SHAPE_POLICY=generic compiles the generic kernel for the first call; under
    # "auto" a background thread compiles it after the first call.
    import os
    import subprocess
    import sys
    env = dict(os.environ, JITML_SHAPE_POLICY="generic",
               PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    r = subprocess.run([sys.executable, "-c", RANK0_GENERIC], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["16.0", "6.0"]


def test_gather_empty_table_is_an_index_error(ctx):
    g = gather_graph(ctx, "gather_empty", "float32", ("V", 4), "int32", ("S",))
    with pytest.raises(jitml.JitError) as e:
        g(np.zeros((0, 4), np.float32), np.array([0], np.int32))
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT


def test_gather_dtype_rules(ctx):
    def fresh():
        g = jitml.Graph(ctx, "gather_dtypes")
        return (g, g.input("x", "float32", (4, 3)), g.input("ids", "int32", (4,)),
                g.input("f", "float32", (4,)))

    def raises(code, fn, *words):
        with pytest.raises(jitml.JitError) as e:
            fn()
        assert e.value.code == code, e.value
        for w in words:
            assert w in e.value.message, e.value.message

    DT = jitml.StatusCode.DTYPE_MISMATCH
    g, x, ids, f = fresh()
    raises(DT, lambda: g.add(f, ids), "(add)", "i32")        # an int into another op
    g, x, ids, f = fresh()
    raises(DT, lambda: g.relu(ids), "(relu)")
    g, x, ids, f = fresh()
    raises(DT, lambda: g.reshape(ids, (2, 2)), "(reshape)")  # even a reshape
    g, x, ids, f = fresh()
    raises(DT, lambda: g.gather(x, f), "(gather)", "indices are int32 or int64")
    g, x, ids, f = fresh()
    raises(DT, lambda: g.gather(ids, ids), "(gather)")       # an int table
    g, x, ids, f = fresh()
    raises(DT, lambda: g.gather(x, g.gather(x, ids)), "indices")  # computed: a float
    g, x, ids, f = fresh()
    g.output(ids)                                            # recorded, raised here
    raises(DT, g.finalize, "jit_output", "i32")
    g, x, ids, f = fresh()
    raises(jitml.StatusCode.UNSUPPORTED, lambda: ids + 1)    # no integer scalars
    raises(jitml.StatusCode.UNSUPPORTED,
           lambda: jitml.Graph(ctx, "u8").input("ids", np.uint8, (4,)), "int64")
    g = jitml.Graph(ctx, "rank0_table")
    x, ids = g.input("x", "float32", ()), g.input("ids", "int32", (2,))
    raises(jitml.StatusCode.SHAPE_MISMATCH, lambda: g.gather(x, ids), "rank >= 1")


def test_gather_call_dtype_mismatch(ctx):
    g = gather_graph(ctx, "gather_call_dtypes", "float32", ("V", 2), "int64", ("S",))
    table = np.zeros((5, 2), np.float32)
    ids = np.array([1, 2], np.int64)
    cases = [
        ((table, ids.astype(np.int32)), "input 1 `ids` has dtype int32 but the graph "
                                        "declares int64"),
        ((table, ids.astype(np.float32)), "input 1 `ids` has dtype float32"),
        ((table, ids.astype(np.uint8)), "x.astype(numpy.int64)"),
        ((table.astype(np.int64), ids), "input 0 `table` has dtype int64 but the graph "
                                        "declares float32"),
        ((torch.from_numpy(table), torch.from_numpy(ids).int()), "has dtype int32"),
        ((torch.from_numpy(table), torch.from_numpy(ids).to(torch.int16)),
         "x.to(torch.int64)"),
    ]
    for args, words in cases:
        with pytest.raises(jitml.JitError) as e:
            g(*args)
        assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
        assert words in e.value.message, e.value.message


def test_gather_torch_op_and_shapes_of_specs(ctx):
    from jitml import torch_op
    g = gather_graph(ctx, "gather_op", "float32", ("V", 3), "int64", ("B", "S"))
    assert g.output_shapes(jitml.TensorSpec((10, 3), "float32"),
                           jitml.TensorSpec((2, 5), "int64")) == [(2, 5, 3)]
    op = jitml.torch_op.register("test_embedding", g)
    table = torch.rand(10, 3)
    ids = torch.randint(0, 10, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(op(table, ids), F.embedding(ids, table), rtol=0, atol=0)
    meta = op(table.to("meta"), ids.to("meta"))  # the shape function, no data read
    assert meta.shape == (2, 5, 3) and meta.device.type == "meta"


# --- a GPT-2 input stage ---------------------------------------------------------------


def test_gpt2_input_stage_matches_pytorch(ctx):
    """wte[ids] + wpe[positions], then layer_norm: batch, sequence and vocabulary
    symbolic; positions an int input like the token ids."""
    d, n_pos = 32, 64
    g = jitml.Graph(ctx, "gpt2_input_stage")
    wte = g.input("wte", "float32", ("V", d))
    wpe = g.input("wpe", "float32", (n_pos, d))
    ids = g.input("ids", "int64", ("B", "S"))
    pos = g.input("pos", "int32", ("S",))
    ln_g = g.input("ln_g", "float32", (d,))
    ln_b = g.input("ln_b", "float32", (d,))
    h = g.gather(wte, ids) + g.gather(wpe, pos)
    g.output(g.layer_norm(h, ln_g, ln_b, eps=1e-5))
    g.finalize()
    rng = np.random.default_rng(33)
    WPE = rng.normal(0, 0.01, size=(n_pos, d)).astype(np.float32)
    G = rng.uniform(0.5, 1.5, size=d).astype(np.float32)
    Bi = rng.uniform(-0.1, 0.1, size=d).astype(np.float32)
    for v, b, s, start in ((100, 2, 7, 0), (257, 1, 16, 5), (50, 3, 1, 63)):
        WTE = rng.normal(0, 0.02, size=(v, d)).astype(np.float32)
        tok = ids_of(rng, v, (b, s), np.int64)
        positions = np.arange(start, start + s, dtype=np.int32)  # a KV-cache offset
        e = F.embedding(torch.from_numpy(tok), t64(WTE)) + \
            F.embedding(torch.from_numpy(positions).long(), t64(WPE))
        want = F.layer_norm(e, (d,), t64(G), t64(Bi), 1e-5).numpy()
        y = g(WTE, WPE, tok, positions, G, Bi)
        assert y.shape == (b, s, d)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(jitml.JitError) as e:  # a position past the table
        g(WTE, WPE, np.zeros((1, 2), np.int64), np.array([63, 64], np.int32), G, Bi)
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "index 64 (element 1 of input 3 `pos`)" in e.value.message
    assert "[0, 64)" in e.value.message


# --- concat, slice, pad, cast ----------------------------------------------------------
# Data movement is compared exactly (NumPy/torch as the reference); cast against NumPy's
# astype, which rounds f32 -> f16 to nearest even as IEEE says.


def sized(shape, sizes):
    return tuple(sizes.get(d, d) for d in shape)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shapes, axis", [
    (((2, 3), (4, 3)), 0),
    (((2, 3), (2, 5)), 1),
    (((2, 3), (2, 5)), -1),
    (((2, 1, 4), (2, 3, 4), (2, 2, 4)), -2),           # three values
    (((2, 3, 1), (2, 3, 2), (2, 3, 1)), 2),
    (((5,), (1,), (3,)), -1),                           # rank 1
    ((("N", 3), ("M", 3)), 0),                          # the concat axis symbolic
    ((("B", "S", 4), ("B", "S", 2), ("B", "S", 1)), -1),  # the others symbolic
    ((("B", "S", 4), ("B", "T", 4)), 1),
])
def test_concat_matches_torch_cat(ctx, shapes, axis, dtype):
    g = build(ctx, "concat", dtype, {"x%d" % i: s for i, s in enumerate(shapes)},
              lambda g, *xs: g.concat(xs, axis=axis))
    rng = np.random.default_rng(40)
    for sizes in ({"N": 3, "M": 2, "B": 2, "S": 3, "T": 5},
                  {"N": 1, "M": 7, "B": 1, "S": 1, "T": 1}):
        xs = [rand(rng, *sized(s, sizes), dtype=dtype) for s in shapes]
        want = torch.cat([torch.from_numpy(x) for x in xs], dim=axis).numpy()
        assert g.output_shapes(*xs) == [want.shape]
        y = g(*xs)
        assert y.dtype == NP[dtype]
        np.testing.assert_array_equal(y, want)


def test_concat_of_computed_values_and_torch_tensors(ctx):
    # concat inside a graph: its operands are results of other ops, and its result
    # feeds more; torch in, torch out.
    g = jitml.Graph(ctx, "concat_computed")
    x = g.input("x", "float32", ("N", 4))
    w = g.input("w", "float32", (4, 3))
    h = g.concat([g.relu(x @ w), x, -x], axis=1)
    g.output(g.reduce_sum(h * 2.0, axis=0))
    g.finalize()
    xt, wt = torch.randn(5, 4), torch.randn(4, 3)
    want = (torch.cat([torch.relu(xt.double() @ wt.double()), xt.double(), -xt.double()],
                      1) * 2).sum(0)
    y = g(xt, wt)
    assert isinstance(y, torch.Tensor) and y.shape == (11,)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)


def test_concat_errors(ctx):
    def err(shapes, fn, dtypes=None):
        g = jitml.Graph(ctx, "concat_err")
        xs = [g.input("x%d" % i, (dtypes or ["float32"] * len(shapes))[i], s)
              for i, s in enumerate(shapes)]
        with pytest.raises(jitml.JitError) as e:
            fn(g, xs)
            g.finalize()
        return e.value

    e = err([(2, 3), (2, 4)], lambda g, xs: g.concat(xs, 0))
    assert e.code == jitml.StatusCode.SHAPE_MISMATCH, e
    e = err([(2, 3), (2, 3, 1)], lambda g, xs: g.concat(xs, 0))
    assert e.code == jitml.StatusCode.SHAPE_MISMATCH, e
    e = err([(2, 3), (2, 3)], lambda g, xs: g.concat(xs, 2))
    assert e.code == jitml.StatusCode.INVALID_ARGUMENT and "axis 2" in e.message, e
    e = err([(2, 3), (2, 3)], lambda g, xs: g.concat(xs, -3))
    assert e.code == jitml.StatusCode.INVALID_ARGUMENT, e
    e = err([(2, 3), (2, 3)], lambda g, xs: g.concat([], 0))
    assert e.code == jitml.StatusCode.INVALID_ARGUMENT and "no values" in e.message, e
    e = err([(2, 3), (2, 3)], lambda g, xs: g.concat(xs, 0), ["float32", "float16"])
    assert e.code == jitml.StatusCode.DTYPE_MISMATCH, e
    # Symbols that must agree at run time.
    g = build(ctx, "concat_sym", "float32", {"a": ("N", "K"), "b": ("N", "L")},
              lambda g, a, b: g.concat([a, b], 0))
    np.testing.assert_array_equal(g(np.ones((2, 3), np.float32), np.zeros((2, 3),
                                                                          np.float32)),
                                  np.r_[np.ones((2, 3)), np.zeros((2, 3))])
    with pytest.raises(jitml.JitError) as e:
        g(np.ones((2, 3), np.float32), np.ones((2, 4), np.float32))
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH


def test_concat_single_value_is_the_value(ctx):
    g = build(ctx, "concat_one", "float32", {"x": ("N", 2)},
              lambda g, x: g.concat([x], axis=-1))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(g(x), x)


SLICES = [  # (start, stop, step) as Python's x[start:stop:step], stop None: to the end
    (0, None, 1), (1, None, 1), (0, 3, 1), (2, 5, 1), (-3, None, 1), (-5, -1, 1),
    (0, None, 2), (1, None, 3), (-7, 6, 2), (3, -2, 4), (0, 1, 1), (-1, None, 1),
    (-100, 100, 1), (-100, None, 5), (2, 10**6, 3), (0, None, 1000), (4, -3, 1),
    (0, _lib.JIT_SLICE_END, 2), (-2**63, 2**63 - 1, 1), (-2**70, 2**70, 2),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_slice_static_matches_numpy(ctx, axis, dtype):
    shape = (7, 9, 6)
    rng = np.random.default_rng(41)
    x = rand(rng, *shape, dtype=dtype)

    def ref(s):
        idx = [slice(None)] * 3
        idx[axis] = slice(*s)
        return x[tuple(idx)]

    # Slices empty for this static shape are refused when built (test_slice_errors).
    cases = [s for s in SLICES if ref(s).size]
    assert len(cases) >= len(SLICES) - 2
    g = jitml.Graph(ctx, "slice_static")
    xi = g.input("x", dtype, shape)
    g.output(*[g.slice(xi, axis, *s) for s in cases])
    g.finalize()
    ys = g(x)
    for s, y in zip(cases, ys):
        want = ref(s)
        assert y.shape == want.shape and y.dtype == x.dtype, s
        np.testing.assert_array_equal(y, want, err_msg=str(s))


@pytest.mark.parametrize("s", SLICES)
def test_slice_symbolic_dim_matches_numpy(ctx, s):
    # The sliced dim symbolic: the bounds resolve against each binding.
    g = build(ctx, "slice_sym", "float32", {"x": ("B", "S", 4)},
              lambda g, x: g.slice(x, 1, *s))
    rng = np.random.default_rng(42)
    for b, n in ((2, 9), (1, 20), (3, 6)):
        x = rand(rng, b, n, 4)
        want = x[:, slice(*s)]
        if want.size == 0:
            for call in (g, g.output_shapes):
                with pytest.raises(jitml.JitError) as e:
                    call(x)
                assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH, (s, n, e.value)
                assert "empty" in e.value.message, e.value
            continue
        assert g.output_shapes(x) == [want.shape], (s, n)
        np.testing.assert_array_equal(g(x), want, err_msg="%s n=%d" % (s, n))


def test_slice_none_and_end_are_the_same(ctx):
    g = jitml.Graph(ctx, "slice_end")
    x = g.input("x", "float32", ("N",))
    g.output(g.slice(x, 0, 2), g.slice(x, 0, 2, None), g.slice(x, 0, 2, _lib.JIT_SLICE_END),
             g.slice(x, 0, start=None, stop=None, step=2))
    g.finalize()
    a = np.arange(11, dtype=np.float32)
    y0, y1, y2, y3 = g(a)
    for y in (y0, y1, y2):
        np.testing.assert_array_equal(y, a[2:])
    np.testing.assert_array_equal(y3, a[::2])


def test_slice_chains_and_computed_inputs(ctx):
    # Slices of slices, of a matmul's result, feeding elementwise ops and a reduction.
    g = jitml.Graph(ctx, "slice_chain")
    x = g.input("x", "float32", ("N", 8))
    w = g.input("w", "float32", (8, 10))
    h = x @ w
    a = g.slice(g.slice(h, 1, 1, None, 2), 1, 1, -1)     # h[:, 1::2][:, 1:-1]
    b = g.slice(h, 0, -2)                                # the last two rows
    g.output(g.tanh(a) + 1.0, g.reduce_max(b, axis=-1))
    g.finalize()
    rng = np.random.default_rng(43)
    X, W = rand(rng, 5, 8), rand(rng, 8, 10)
    H = t64(X) @ t64(W)
    y1, y2 = g(X, W)
    np.testing.assert_allclose(y1, (torch.tanh(H[:, 1::2][:, 1:-1]) + 1).numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, H[-2:].max(-1).values.numpy(), rtol=1e-5, atol=1e-6)


def test_slice_errors(ctx):
    def err(fn, shape=(4, 5)):
        g = jitml.Graph(ctx, "slice_err")
        x = g.input("x", "float32", shape)
        with pytest.raises(jitml.JitError) as e:
            g.output(fn(g, x))
            g.finalize()
        return e.value

    for step in (0, -1, -2**63):
        e = err(lambda g, x: g.slice(x, 0, 0, None, step))
        assert e.code == jitml.StatusCode.INVALID_ARGUMENT and "step" in e.message, e
    e = err(lambda g, x: g.slice(x, 2, 0))
    assert e.code == jitml.StatusCode.INVALID_ARGUMENT and "axis 2" in e.message, e
    e = err(lambda g, x: g.slice(x, -3, 0))
    assert e.code == jitml.StatusCode.INVALID_ARGUMENT, e
    e = err(lambda g, x: g.slice(x, 0, 0), shape=())
    assert e.code == jitml.StatusCode.INVALID_ARGUMENT, e  # no axis of a rank-0 value
    # Empty for a static dim: known when building or at the latest when called.
    for s in ((3, 3), (4, None), (-1, -2), (10, 20), (2, 1)):
        g = jitml.Graph(ctx, "slice_empty")
        x = g.input("x", "float32", (4, 5))
        with pytest.raises(jitml.JitError) as e:
            g.output(g.slice(x, 0, *s))
            g.finalize()
            g(np.zeros((4, 5), np.float32))
        assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH, (s, e.value)
    with pytest.raises(TypeError):
        jitml.Graph(ctx, "slice_float").slice(None, 0, 1.5)


PADS = [  # (shape, low, high)
    ((), (), ()),
    ((5,), (2,), (3,)),
    ((5,), (0,), (0,)),
    ((1,), (0,), (4,)),
    ((2, 3, 4), (1, 0, 2), (0, 3, 1)),
    ((2, 3, 4), (1, 1, 1), (1, 1, 1)),
    ((2, 3, 4), (0, 0, 0), (0, 0, 5)),
    ((2, 3, 4), (4, 0, 0), (0, 0, 0)),
    ((1, 2, 3, 2), (0, 1, 2, 0), (1, 0, 0, 2)),
]


@pytest.mark.parametrize("value", [0.0, -1.5, inf, -inf])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape, low, high", PADS)
def test_pad_matches_numpy(ctx, shape, low, high, dtype, value):
    g = build(ctx, "pad", dtype, {"x": shape}, lambda g, x: g.pad(x, low, high, value))
    x = rand(np.random.default_rng(44), *shape, dtype=dtype)
    # NumPy's pad refuses a rank-0 array's empty pad widths; padding nothing is x.
    want = np.pad(x, list(zip(low, high)), constant_values=value) if shape else x
    y = g(x)
    assert y.dtype == NP[dtype] and y.shape == want.shape
    np.testing.assert_array_equal(y, want)


def test_pad_symbolic_dims_match_torch(ctx):
    g = build(ctx, "pad_sym", "float32", {"x": ("N", "C", "H", "W")},
              lambda g, x: g.pad(x, [0, 1, 2, 3], [1, 0, 3, 2], value=-inf))
    rng = np.random.default_rng(45)
    for shape in ((1, 2, 3, 4), (2, 1, 5, 1), (3, 4, 1, 7)):
        x = rand(rng, *shape)
        want = F.pad(torch.from_numpy(x), (3, 2, 2, 3, 1, 0, 0, 1), value=-inf).numpy()
        assert g.output_shapes(x) == [want.shape]
        np.testing.assert_array_equal(g(x), want)


@pytest.mark.parametrize("value", [0.1, 1e6, 65519.0, 65520.0, 1 + 2.0**-11 + 2.0**-30,
                                   2.0**-25, -1e300])
def test_pad_value_rounds_once_to_f16(ctx, value):
    # A double rounded straight to f16 (as NumPy does), not through f32 first: the
    # fourth value is just above an f16 midpoint that its f32 rounding lands on.
    g = build(ctx, "pad_value", "float16", {"x": (2,)}, lambda g, x: g.pad(x, [1], [1], value))
    with np.errstate(over="ignore"):
        want = np.pad(np.ones(2, np.float16), 1, constant_values=value)
    np.testing.assert_array_equal(g(np.ones(2, np.float16)).view(np.uint16),
                                  want.view(np.uint16))


def test_pad_then_pool_is_max_pool_with_padding(ctx):
    # -inf padding then an unpadded max pool is a padded max pool (what a front end
    # lowering tensor.pad + linalg.pooling writes); and zero padding feeds a conv.
    g = jitml.Graph(ctx, "pad_pool")
    x = g.input("x", "float32", ("N", 3, "H", "W"))
    w = g.input("w", "float32", (4, 3, 3, 3))
    g.output(g.max_pool2d(g.pad(x, [0, 0, 1, 1], [0, 0, 1, 1], -inf), 3, 2),
             g.conv2d(g.pad(x, [0, 0, 2, 1], [0, 0, 0, 1]), w))
    g.finalize()
    rng = np.random.default_rng(46)
    X, W = rand(rng, 2, 3, 7, 6), rand(rng, 4, 3, 3, 3)
    y1, y2 = g(X, W)
    np.testing.assert_array_equal(y1, F.max_pool2d(torch.from_numpy(X), 3, 2, 1).numpy())
    want = F.conv2d(F.pad(t64(X), (1, 1, 2, 0)), t64(W)).numpy()
    np.testing.assert_allclose(y2, want, rtol=1e-5, atol=1e-5)


def test_pad_errors(ctx):
    def err(low, high, shape=(2, 3), value=0.0):
        g = jitml.Graph(ctx, "pad_err")
        x = g.input("x", "float32", shape)
        with pytest.raises(jitml.JitError) as e:
            g.output(g.pad(x, low, high, value))
            g.finalize()
        return e.value

    IA = jitml.StatusCode.INVALID_ARGUMENT
    e = err([1], [1])  # too few: an error, not a read past the list
    assert e.code == IA and "low and high have 1 entries" in e.message, e
    e = err([], [])
    assert e.code == IA and "dim 0" in e.message, e
    e = err([1, 1], [1])
    assert e.code == IA and "low has 2 entries and high 1" in e.message, e
    e = err([0] * 9, [0] * 9)
    assert e.code == IA, e
    e = err([-1, 0], [0, 0])
    assert e.code == IA and "dim 0 pads -1 before" in e.message, e
    e = err([0, 0], [0, 2**30 + 1])
    assert e.code == IA and "dim 1" in e.message, e
    e = err([0, 2**64], [0, 0])  # not wrapped around on the way to int64
    assert e.code == IA, e
    e = err(1, [0, 0])
    assert e.code == IA and "sequence of ints" in e.message, e
    # NaN is a value like any other here (jit_scalar refuses it; jit_pad does not).
    g = build(ctx, "pad_nan", "float32", {"x": (2,)}, lambda g, x: g.pad(x, [1], [0], nan))
    y = g(np.ones(2, np.float32))
    assert np.isnan(y[0]) and (y[1:] == 1).all()


F16_TIES = np.array([
    1.0 + 2.0**-11,            # halfway between 1 and the next f16: to even (1)
    1.0 + 3 * 2.0**-11,        # halfway, rounds up to even
    -(1.0 + 2.0**-11),
    2048.0 + 1.0,              # f16 spacing 2 here: a tie, to even (2048)
    2048.0 + 3.0,              # to 2052
    65504.0,                   # the largest f16
    65519.996,                 # below the midpoint to 65536: 65504
    65520.0,                   # the midpoint: overflow to inf
    -65520.0, 1e6, -1e30, 3.4e38,
    2.0**-24,                  # the smallest subnormal f16
    2.0**-25,                  # half of it: a tie, to even (0)
    3 * 2.0**-26,              # 0.75 of it: up to 2^-24
    2.0**-14 - 2.0**-25,       # just below the smallest normal
    1e-10, -1e-10, 0.0, -0.0, inf, -inf, 0.1, 1 / 3, np.pi,
], dtype=np.float32)


def test_cast_f32_to_f16_rounds_to_nearest_even(ctx):
    g = build(ctx, "cast_f16", "float32", {"x": ("N",)}, lambda g, x: g.cast(x, "float16"))
    rng = np.random.default_rng(47)
    rnd = np.concatenate([rng.normal(0, 1, 5000), rng.normal(0, 3e4, 1000),
                          rng.uniform(-1e-4, 1e-4, 1000)]).astype(np.float32)
    for x in (F16_TIES, rnd):
        with np.errstate(over="ignore"):  # NumPy warns of the overflow to inf
            want = x.astype(np.float16)
        y = g(x)
        assert y.dtype == np.float16
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))  # -0 too
        np.testing.assert_array_equal(torch.from_numpy(x).half().numpy(), want)
    y = g(np.array([nan, -nan], np.float32))
    assert np.isnan(y).all()


def test_cast_f16_to_f32_is_exact_for_every_f16(ctx):
    g = build(ctx, "cast_f32", "float16", {"x": ("N",)}, lambda g, x: g.cast(x, "float32"))
    x = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    y = g(x)
    want = x.astype(np.float32)
    assert y.dtype == np.float32
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(y[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.isnan(y[~finite]).all()


@pytest.mark.parametrize("dtype", ["float32", "float16", np.float16, torch.float32, "half"])
def test_cast_same_dtype_and_round_trips(ctx, dtype):
    name = jitml._core._dtype_name(dtype)
    other = "float16" if name == "float32" else "float32"
    g = jitml.Graph(ctx, "cast_same")
    x = g.input("x", name, (3, "N"))
    same = g.cast(x, dtype)
    assert same.dtype == name
    back = g.cast(g.cast(x, other), name)
    g.output(same, back, g.cast(x, other))
    g.finalize()
    a = rand(np.random.default_rng(48), 3, 5, dtype=name)
    y_same, y_back, y_other = g(a)
    np.testing.assert_array_equal(y_same, a)
    np.testing.assert_array_equal(y_back, a.astype(other).astype(name))
    assert y_other.dtype == NP[other]
    np.testing.assert_array_equal(y_other, a.astype(other))


def test_cast_mixed_precision_graph_matches_torch(ctx):
    # f16 weights and activations, an f32 softmax in the middle (what autocast does).
    g = jitml.Graph(ctx, "cast_mixed")
    x = g.input("x", "float16", ("N", 8))
    w = g.input("w", "float16", (8, 6))
    s = g.softmax(g.cast(x @ w, "float32"), axis=-1)
    g.output(g.cast(s, "float16"), s)
    g.finalize()
    rng = np.random.default_rng(49)
    X, W = rand(rng, 4, 8, dtype="float16"), rand(rng, 8, 6, dtype="float16")
    y16, y32 = g(X, W)
    want = torch.softmax((t64(X) @ t64(W)), -1)
    assert y16.dtype == np.float16 and y32.dtype == np.float32
    np.testing.assert_allclose(y32, want.numpy(), rtol=2e-3, atol=1e-4)
    np.testing.assert_array_equal(y16, y32.astype(np.float16))


@pytest.mark.parametrize("dtype", ["uint8", np.float64, np.uint16])
def test_cast_to_other_dtypes_is_unsupported(ctx, dtype):
    # Integer casts (int8, int32, int64) are test_cast_int.py's; these have none.
    g = jitml.Graph(ctx, "cast_unsupported")
    x = g.input("x", "float32", (4,))
    with pytest.raises(jitml.JitError) as e:
        g.output(g.cast(x, dtype))
        g.finalize()
    assert e.value.code == jitml.StatusCode.UNSUPPORTED, e.value
    assert "(cast)" in e.value.message  # the library's word, not the binding's


def test_cast_of_an_integer_input(ctx):
    g = jitml.Graph(ctx, "cast_int")
    ids = g.input("ids", "int32", (4,))
    g.output(g.cast(ids, "float32"))
    g.finalize()
    np.testing.assert_array_equal(g(np.array([3, -1, 0, 7], np.int32)),
                                  np.array([3, -1, 0, 7], np.float32))


MOVES_GENERIC = """
import sys
import numpy as np
import jitml
dt = sys.argv[1]
g = jitml.Graph(jitml.Context(cache_dir=""), "g")
x = g.input("x", dt, ("B", "S", 6))
y = g.input("y", dt, ("B", "T", 6))
c = g.concat([x, y, x], axis=1)
other = "float16" if dt == "float32" else "float32"
g.output(c, g.slice(c, 1, 1, None, 2), g.slice(x, -1, -4, -1), g.pad(x, [1, 0, 2], [0, 3, 1],
         float("-inf")), g.cast(x, other), g.concat([g.slice(x, 2, 0, 3), g.slice(x, 2, 3)], -1))
g.finalize()
rng = np.random.default_rng(0)
for b, s, t in ((2, 3, 4), (1, 5, 1), (3, 1, 2), (1, 1, 1)):
    X, Y = rng.standard_normal((b, s, 6)).astype(dt), rng.standard_normal((b, t, 6)).astype(dt)
    C = np.concatenate([X, Y, X], 1)
    want = [C, C[:, 1::2], X[..., -4:-1],
            np.pad(X, [(1, 0), (0, 3), (2, 1)], constant_values=-np.inf), X.astype(other), X]
    for i, (a, w) in enumerate(zip(g(X, Y), want)):
        assert a.dtype == w.dtype and a.shape == w.shape and np.array_equal(a, w), (b, s, t, i)
print("ok")
"""


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_concat_slice_pad_cast_generic_kernels(dtype):
    # The symbolic-shape (generic) kernels of the new ops, in a child process with
    # JITML_SHAPE_POLICY=generic as test_gather_rank0_result_generic_kernel does.
    import os
    import subprocess
    import sys
    env = dict(os.environ, JITML_SHAPE_POLICY="generic",
               PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    r = subprocess.run([sys.executable, "-c", MOVES_GENERIC, dtype], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["ok"]


# --- a GPT-2 attention block's fused QKV ------------------------------------------------


def test_gpt2_fused_qkv_split_matches_pytorch(ctx):
    """x @ W_qkv + b_qkv (GPT-2's c_attn, one [d, 3d] matmul), split into q, k, v by
    three slices of the last axis, then causal attention per head and the merge of the
    heads: batch and sequence symbolic."""
    d, nh = 32, 4
    hd = d // nh
    g = jitml.Graph(ctx, "gpt2_qkv")
    x = g.input("x", "float32", ("B", "S", d))
    w = g.input("w_qkv", "float32", (d, 3 * d))
    b = g.input("b_qkv", "float32", (3 * d,))
    mask = g.input("mask", "float32", ("S", "S"))  # 1 where a query may see a key
    qkv = x @ w + b
    q, k, v = (g.slice(qkv, -1, i * d, (i + 1) * d) for i in range(3))

    def heads(t):  # [B, S, d] -> [B, nh, S, hd]
        return g.transpose(g.reshape(t, ("B", "S", nh, hd)), (0, 2, 1, 3))

    att = heads(q) @ g.transpose(heads(k), (0, 1, 3, 2)) * (1.0 / np.sqrt(hd))
    att = g.softmax(g.where(mask, att, -inf), axis=-1)
    y = g.reshape(g.transpose(att @ heads(v), (0, 2, 1, 3)), ("B", "S", d))
    g.output(q, k, v, y)
    g.finalize()
    rng = np.random.default_rng(50)
    W = rng.normal(0, 0.2, size=(d, 3 * d)).astype(np.float32)
    Bq = rng.normal(0, 0.1, size=3 * d).astype(np.float32)
    for bsz, s in ((2, 5), (1, 1), (3, 9)):
        X = rand(rng, bsz, s, d)
        M = np.tril(np.ones((s, s), np.float32))
        qkv_t = t64(X) @ t64(W) + t64(Bq)
        qt, kt, vt = qkv_t.split(d, dim=-1)
        sh = lambda t: t.view(bsz, s, nh, hd).transpose(1, 2)
        # torch 1.13 has no F.scaled_dot_product_attention: GPT-2's own arithmetic.
        att_t = sh(qt) @ sh(kt).transpose(-1, -2) / np.sqrt(hd)
        att_t = att_t.masked_fill(torch.from_numpy(M) == 0, -inf).softmax(-1)
        want = (att_t @ sh(vt)).transpose(1, 2).reshape(bsz, s, d)
        yq, yk, yv, yy = g(X, W, Bq, M)
        for got, ref in ((yq, qt), (yk, kt), (yv, vt), (yy, want)):
            assert got.shape == (bsz, s, d)
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


# --- mlir_opt: libjitml's passes on MLIR text -----------------------------------------

MM = """func.func @mm(%a: memref<2x3x{t}>, %b: memref<3x4x{t}>, %c: memref<2x4x{acc}>) {{
  linalg.matmul ins(%a, %b : memref<2x3x{t}>, memref<3x4x{t}>) outs(%c : memref<2x4x{acc}>)
  return
}}
"""


@pytest.mark.parametrize("pipeline", [
    "func.func(jitml-lower-matmul-to-loops)",
    "builtin.module(func.func(canonicalize,jitml-lower-matmul-to-loops))",
    "jitml-lower-matmul-to-loops",
])
def test_mlir_opt_lowers_matmul_to_loops(pipeline):
    out = jitml.mlir_opt(MM.format(t="f32", acc="f32"), pipeline)
    assert isinstance(out, str)
    assert out.count("scf.for") == 3, out
    assert "linalg.matmul" not in out, out
    assert "arith.mulf" in out and "arith.addf" in out, out


def test_mlir_opt_f16_and_bytes_and_other_passes():
    out = jitml.mlir_opt(MM.format(t="f16", acc="f32").encode(),
                         "func.func(jitml-lower-matmul-to-loops)", "mm16.mlir")
    assert "scf.for" in out and "linalg.matmul" not in out
    assert "arith.extf" in out, out  # f16 operands extended to the f32 accumulator
    # MLIR's own passes alone leave the matmul.
    out = jitml.mlir_opt(MM.format(t="f32", acc="f32"), "canonicalize,cse")
    assert "linalg.matmul" in out and "scf.for" not in out


def test_mlir_opt_errors():
    mm = MM.format(t="f32", acc="f32")
    with pytest.raises(jitml.JitError) as e:
        jitml.mlir_opt(mm, "func.func(cse,bogus-pass)", "mm.mlir")
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "bogus-pass" in e.value.message
    with pytest.raises(jitml.JitError) as e:
        jitml.mlir_opt(mm, "no-such-pass")
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    with pytest.raises(jitml.JitError) as e:
        jitml.mlir_opt(mm[:20], "canonicalize", "mm.mlir")
    assert e.value.code == jitml.StatusCode.PARSE_ERROR
    assert "mm.mlir:1:" in e.value.message
    with pytest.raises(jitml.JitError) as e:
        jitml.mlir_opt("func.func @f() { %0 = \"foo.bar\"() : () -> i32\n return }",
                       "canonicalize")
    assert e.value.code in (jitml.StatusCode.PARSE_ERROR, jitml.StatusCode.INVALID_ARGUMENT)


@pytest.mark.parametrize("cname", ["jit_concat", "jit_slice", "jit_pad", "jit_cast",
                                   "jit_mlir_opt"])
def test_new_prototypes_are_optional(ctx, monkeypatch, cname):
    # A library without them still loads (_lib marks them required=False); calling
    # one says UNAVAILABLE instead of an AttributeError.
    monkeypatch.setattr(jitml._core._L, cname, None)
    g = jitml.Graph(ctx, "old_library")
    x = g.input("x", "float32", (2, 3))
    call = {"jit_concat": lambda: g.concat([x, x]), "jit_slice": lambda: g.slice(x, 0, 1),
            "jit_pad": lambda: g.pad(x, [0, 0], [1, 1]),
            "jit_cast": lambda: g.cast(x, "float16"),
            "jit_mlir_opt": lambda: jitml.mlir_opt(MM.format(t="f32", acc="f32"),
                                                   "canonicalize")}[cname]
    with pytest.raises(jitml.JitError) as e:
        call()
    assert e.value.code == jitml.StatusCode.UNAVAILABLE and cname in e.value.message


# --- attention ---------------------------------------------------------------------------


def attention_ref(q, k, v, mask, scale, causal):
    s = torch.matmul(t64(q), t64(k).transpose(-1, -2)) * scale
    if mask is not None:
        s = s + t64(mask)
    if causal:
        S, T = s.shape[-2], s.shape[-1]
        i = torch.arange(S).unsqueeze(1)
        j = torch.arange(T).unsqueeze(0)
        s = s.masked_fill(j > i + (T - S), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), t64(v)).numpy()


@pytest.mark.parametrize("policy", ["exact", "generic"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_matches_torch(monkeypatch, policy, causal, with_mask):
    # The CPU's exact kernels walk keys in blocks of 64 (T = 1, 64, 150 cover one
    # block, a whole one and a partial third); generic kernels use the composed form.
    monkeypatch.setenv("JITML_SHAPE_POLICY", policy)
    ctx = jitml.Context(cache_dir="")
    g = jitml.Graph(ctx, "attn")
    q = g.input("q", "float32", (2, 3, "S", 16))
    k = g.input("k", "float32", (2, 3, "T", 16))
    v = g.input("v", "float32", (2, 3, "T", 8))
    m = g.input("m", "float32", ("S", "T")) if with_mask else None
    g.output(g.attention(q, k, v, m, causal=causal))
    g.finalize()
    rng = np.random.default_rng(11)
    for S, T in ((1, 1), (7, 64), (150, 150), (5, 150)):
        qa, ka, va = rand(rng, 2, 3, S, 16), rand(rng, 2, 3, T, 16), rand(rng, 2, 3, T, 8)
        ma = np.where(rng.uniform(size=(S, T)) < 0.2, -np.inf, 0.3).astype(np.float32)
        ma[np.arange(S), np.arange(S) + T - S] = 0.0  # every row keeps a key
        args = (qa, ka, va, ma) if with_mask else (qa, ka, va)
        want = attention_ref(qa, ka, va, ma if with_mask else None, 0.25, causal)
        np.testing.assert_allclose(g(*args), want, rtol=2e-5, atol=2e-6)


def test_attention_long_sequence_and_a_decode_step(monkeypatch):
    # 2 heads x 1024 x 32, causal, on an exact kernel (blocks: the 1024 x 1024 scores
    # never exist whole); then one query against the same 1024 keys (T - S = 1023:
    # it sees all of them), the decode step of a cache.
    monkeypatch.setenv("JITML_SHAPE_POLICY", "exact")
    ctx = jitml.Context(cache_dir="")
    rng = np.random.default_rng(12)
    k, v = rand(rng, 2, 1024, 32), rand(rng, 2, 1024, 32)
    for S in (1024, 1):
        g = build(ctx, "attn_long", "float32", {"q": (2, S, 32), "k": (2, 1024, 32),
                                                 "v": (2, 1024, 32)},
                  lambda g, q, k, v: g.attention(q, k, v, causal=True))
        q = rand(rng, 2, S, 32)
        want = attention_ref(q, k, v, None, 32 ** -0.5, True)
        np.testing.assert_allclose(g(q, k, v), want, rtol=2e-5, atol=2e-6)


def test_attention_f16_and_errors(ctx):
    g = build(ctx, "attn_h", "float16", {"q": (4, 8), "k": (6, 8), "v": (6, 3)},
              lambda g, q, k, v: g.attention(q, k, v, scale=0.5))
    rng = np.random.default_rng(13)
    q, k, v = (rand(rng, *s, dtype="float16") for s in ((4, 8), (6, 8), (6, 3)))
    want = attention_ref(q, k, v, None, 0.5, False)
    np.testing.assert_allclose(g(q, k, v).astype(np.float64), want, rtol=1e-2, atol=2e-3)
    h = jitml.Graph(ctx, "attn_bad")
    q = h.input("q", "float32", (4, 8))
    k = h.input("k", "float32", (6, 7))
    with pytest.raises(jitml.JitError) as e:
        h.output(h.attention(q, k, k))
        h.finalize()
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH


# --- bfloat16 ----------------------------------------------------------------------------
# torch.bfloat16 tensors go in and come out as they are; NumPy callers hold bf16 as its
# bit pattern in uint16 (the package docstring). References: torch in float64 from the
# same bf16 values, then rounded to bf16; a graph rounds once per op, so tolerances are
# a few bf16 ulps (one ulp is 2^-7 = 0.78% relative at worst).

BF = torch.bfloat16


def rand_bf16(rng, *shape, lo=-1.0, hi=1.0):
    return torch.from_numpy(rng.uniform(lo, hi, size=shape)).to(BF)


def bits(t):
    """A bf16 tensor's bit patterns as NumPy uint16 (the NumPy convention)."""
    return t.view(torch.int16).numpy().view(np.uint16)


def from_bits(u):
    """NumPy uint16 bit patterns as a torch.bfloat16 tensor (no copy)."""
    return torch.from_numpy(np.ascontiguousarray(u).view(np.int16)).view(BF)


def assert_bf16_close(got, want64, rtol=1.6e-2, atol=1e-3):
    """got: a bf16 tensor; want64: the float64 reference. got is compared with the
    reference rounded to bf16, within rtol (about two ulps) and atol (for values that
    cancel to near 0, where the inputs' scale, not the result's, sets the error)."""
    assert got.dtype == BF, got.dtype
    want = want64.to(BF).double()
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["bfloat16", "bf16", torch.bfloat16])
def test_bf16_dtype_spellings(ctx, name):
    g = jitml.Graph(ctx, "bf16_names")
    x = g.input("x", name, (2,))
    assert x.dtype == "bfloat16" == jitml.bfloat16
    s = g.scalar(0.5, name)
    assert s.dtype == "bfloat16" and (x * 2).dtype == "bfloat16"
    c = g.cast(g.cast(x, "float32"), name)
    assert c.dtype == "bfloat16"
    g.output(x + s, c)
    g.finalize()
    a, b = g(torch.tensor([1.0, -3.0], dtype=BF))
    assert a.dtype == b.dtype == BF
    torch.testing.assert_close(a, torch.tensor([1.5, -2.5], dtype=BF))
    torch.testing.assert_close(b, torch.tensor([1.0, -3.0], dtype=BF))
    assert g.output_shapes(jitml.TensorSpec((2,), name)) == [(2,), (2,)]


@pytest.mark.parametrize("policy", ["exact", "generic"])
def test_bf16_elementwise_chain_matches_torch(monkeypatch, policy):
    monkeypatch.setenv("JITML_SHAPE_POLICY", policy)
    ctx = jitml.Context(cache_dir="")

    def fn(g, x, y):
        t = g.tanh(x * y + 0.25) - g.sigmoid(x) / (y * y + 1.0)
        u = g.where(g.greater(x, y), g.exp(x), g.sqrt(g.relu(y) + 0.1))
        return t, g.maximum(u, t * 3.0), g.gelu_erf(x - y)

    g = build(ctx, "bf16_chain", "bfloat16", {"x": ("N", 33), "y": (33,)}, fn)
    rng = np.random.default_rng(60)
    for n in (1, 7, 64):
        X, Y = rand_bf16(rng, n, 33, lo=-2, hi=2), rand_bf16(rng, 33, lo=-2, hi=2)
        x, y = X.double(), Y.double()
        t = torch.tanh(x * y + 0.25) - torch.sigmoid(x) / (y * y + 1.0)
        u = torch.where(x > y, torch.exp(x), torch.sqrt(torch.relu(y) + 0.1))
        want = (t, torch.maximum(u, t * 3.0), F.gelu(x - y))
        got = g(X, Y)
        for a, w in zip(got, want):
            assert a.shape == (n, 33)
            # Four to six roundings on the way: a few ulps, 2^-6 absolute near 0.
            assert_bf16_close(a, w, rtol=3e-2, atol=2e-2)


def test_bf16_matmul_softmax_match_torch(ctx):
    # f32 accumulation and one rounding: the matmul is within one ulp of the exact
    # product rounded to bf16.
    g = build(ctx, "bf16_mm", "bfloat16", {"a": ("B", "M", 64), "b": (64, 24)},
              lambda g, a, b: (a @ b, g.softmax(a @ b * 0.25, axis=-1)))
    rng = np.random.default_rng(61)
    for bsz, m in ((1, 1), (2, 17), (3, 40)):
        A, B = rand_bf16(rng, bsz, m, 64), rand_bf16(rng, 64, 24)
        mm, sm = g(A, B)
        want = A.double() @ B.double()
        assert mm.shape == (bsz, m, 24)
        assert_bf16_close(mm, want, rtol=8e-3, atol=1e-5)
        assert_bf16_close(sm, torch.softmax(want * 0.25, -1), rtol=1.6e-2, atol=1e-3)


def test_bf16_layer_norm_matches_torch(ctx):
    g = build(ctx, "bf16_ln", "bfloat16", {"x": ("N", 96), "w": (96,), "b": (96,)},
              lambda g, x, w, b: (g.layer_norm(x, w, b, 1e-5), g.rms_norm(x, w)))
    rng = np.random.default_rng(62)
    X, W, Bb = rand_bf16(rng, 9, 96, lo=-3, hi=3), rand_bf16(rng, 96), rand_bf16(rng, 96)
    ln, rms = g(X, W, Bb)
    # The library keeps layer_norm's intermediates (mean, x - mean, variance) in bf16
    # (tests/test_bf16.c says so): a few ulps of the inputs' scale (about 3) where
    # x * w + b cancels to near 0, hence atol 1e-2.
    x, w, b = X.double(), W.double(), Bb.double()
    assert_bf16_close(ln, F.layer_norm(x, (96,), w, b, 1e-5), atol=1e-2)
    want_rms = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    assert_bf16_close(rms, want_rms, atol=1e-2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bf16_conv2d_and_pools_match_torch(ctx, layout):
    rng = np.random.default_rng(63)
    X, Wt = rand_bf16(rng, 2, 5, 9, 11), rand_bf16(rng, 4, 5, 3, 3)
    x, w = X, Wt
    if layout == "NHWC":
        x, w = X.permute(0, 2, 3, 1).contiguous(), Wt.permute(2, 3, 1, 0).contiguous()
    g = build(ctx, "bf16_conv", "bfloat16", {"x": tuple(x.shape), "w": tuple(w.shape)},
              lambda g, x, w: (g.conv2d(x, w, stride=(1, 2), padding=1, layout=layout),
                               g.max_pool2d(x, 2, layout=layout),
                               g.avg_pool2d(x, 3, 2, 1, layout=layout)))
    y, mp, ap = g(x, w)
    want = (F.conv2d(X.double(), Wt.double(), stride=(1, 2), padding=1),
            F.max_pool2d(X.double(), 2), F.avg_pool2d(X.double(), 3, 2, 1))
    if layout == "NHWC":
        want = tuple(t.permute(0, 2, 3, 1) for t in want)
    assert_bf16_close(y, want[0], rtol=8e-3, atol=1e-5)   # 45 products: one rounding
    assert torch.equal(mp, want[1].to(BF))                # a max is exact
    assert_bf16_close(ap, want[2], rtol=8e-3, atol=1e-5)


@pytest.mark.parametrize("policy", ["exact", "generic"])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_attention_matches_torch(monkeypatch, policy, causal):
    monkeypatch.setenv("JITML_SHAPE_POLICY", policy)
    ctx = jitml.Context(cache_dir="")
    g = jitml.Graph(ctx, "bf16_attn")
    q = g.input("q", "bfloat16", (2, "S", 16))
    k = g.input("k", "bfloat16", (2, "T", 16))
    v = g.input("v", "bfloat16", (2, "T", 8))
    m = g.input("m", "bfloat16", ("S", "T"))
    g.output(g.attention(q, k, v, m, causal=causal))
    g.finalize()
    rng = np.random.default_rng(64)
    for S, T in ((1, 1), (7, 64), (70, 150)):
        Q, K, V = rand_bf16(rng, 2, S, 16), rand_bf16(rng, 2, T, 16), rand_bf16(rng, 2, T, 8)
        M = torch.where(torch.from_numpy(rng.uniform(size=(S, T)) < 0.2), -inf, 0.3).to(BF)
        M[torch.arange(S), torch.arange(S) + T - S] = 0.0  # every row keeps a key
        want = torch.from_numpy(attention_ref(Q.double(), K.double(), V.double(),
                                              M.double(), 0.25, causal))
        y = g(Q, K, V, M)
        assert y.shape == (2, S, 8)
        assert_bf16_close(y, want, rtol=1.6e-2, atol=2e-3)


def test_bf16_data_movement_is_exact(ctx):
    # gather, concat, slice, pad, transpose and reshape move bf16 values unchanged.
    g = jitml.Graph(ctx, "bf16_moves")
    t = g.input("t", "bfloat16", ("V", 6))
    ids = g.input("ids", "int64", ("S",))
    e = g.gather(t, ids)
    g.output(g.concat([e, g.slice(t, 0, 1, None, 2)], axis=0),
             g.pad(e, [1, 0], [0, 2], -inf), g.reshape(g.transpose(e, (1, 0)), (-1,)))
    g.finalize()
    rng = np.random.default_rng(65)
    T = torch.from_numpy(rng.standard_normal((9, 6))).to(BF)
    I = torch.tensor([3, 0, 8, 3])
    c, p, r = g(T, I)
    E = T[I]
    assert torch.equal(c, torch.cat([E, T[1::2]], 0))
    assert torch.equal(p, torch.nn.functional.pad(E.float(), (0, 2, 1, 0), value=-inf).to(BF))
    assert torch.equal(r, E.t().reshape(-1))


BF16_TIES = np.array([
    1.0 + 2.0**-8,             # halfway between 1 and the next bf16: to even (1)
    1.0 + 3 * 2.0**-8,         # halfway, up to even (1 + 2^-6)
    -(1.0 + 2.0**-8),
    1.0 + 2.0**-8 + 2.0**-23,  # just above halfway: up
    256.0 + 1.0,               # bf16 spacing 2 here: a tie, to even (256)
    256.0 + 3.0,               # to 260
    2.0**127 * (2 - 2.0**-7),  # the largest bf16 (0x7f7f)
    np.float32(2.0**127 * (2 - 2.0**-8)) - np.float32(2.0**104),  # below the midpoint
    2.0**127 * (2 - 2.0**-8),  # the midpoint to 2^128: a tie, to even = inf
    -(2.0**127 * (2 - 2.0**-8)), 3.4028235e38, -3.4028235e38, 1e30,
    2.0**-126,                 # the smallest normal (bf16 keeps float32's exponents)
    2.0**-133,                 # the smallest bf16 subnormal
    2.0**-134,                 # half of it: a tie, to even (0)
    3 * 2.0**-135,             # 0.75 of it: up to 2^-133
    2.0**-149,                 # the smallest float32 subnormal: to 0
    2.0**-126 - 2.0**-149,     # just below the smallest normal: up to it
    0.0, -0.0, inf, -inf, 0.1, 1 / 3, np.pi, 65504.0, 1e-10, -1e-10,
], dtype=np.float32)


def test_cast_f32_to_bf16_is_torchs_rounding(ctx):
    g = build(ctx, "cast_bf16", "float32", {"x": ("N",)}, lambda g, x: g.cast(x, BF))
    rng = np.random.default_rng(66)
    # Random bit patterns cover every exponent, subnormals and NaNs included.
    rbits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    rnd = np.concatenate([BF16_TIES, rbits.view(np.float32),
                          rng.normal(0, 1, 5000).astype(np.float32)])
    for x in (BF16_TIES, rnd):
        want = bits(torch.from_numpy(x).to(BF))
        nan = np.isnan(x)
        y = g(torch.from_numpy(x))                  # torch in: torch.bfloat16 out
        assert y.dtype == BF
        np.testing.assert_array_equal(bits(y)[~nan], want[~nan])  # -0 and inf too
        assert torch.isnan(y[torch.from_numpy(nan)]).all()
        yn = g(x)                                   # NumPy in: uint16 bits out
        assert yn.dtype == np.uint16
        np.testing.assert_array_equal(yn, bits(y))
        # The NumPy helper rounds as torch does. NaNs: the helper gives 0x7fc0, torch
        # 0x7fc0 or 0xffff (its scalar and vector paths differ), the graph some NaN.
        h = jitml.to_bfloat16_bits(x)
        np.testing.assert_array_equal(h[~nan], want[~nan])
        assert (h[nan] == 0x7FC0).all()
    # Overflow: from the midpoint between the largest bf16 and 2^128 on, inf.
    got = jitml.from_bfloat16_bits(g(BF16_TIES))
    big = np.abs(BF16_TIES) >= np.float32(2.0**127 * (2 - 2.0**-8))
    np.testing.assert_array_equal(np.isinf(got), big)
    assert big.sum() == 6  # +-the midpoint, +-float32's largest, +-inf


def test_cast_bf16_to_f32_and_f16_for_every_bf16(ctx):
    g = build(ctx, "cast_from_bf16", "bfloat16", {"x": ("N",)},
              lambda g, x: (g.cast(x, "float32"), g.cast(x, "float16")))
    u = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    X = from_bits(u)
    y32, y16 = g(X)
    assert y32.dtype == torch.float32 and y16.dtype == torch.float16
    want32 = X.float()
    nan = torch.isnan(want32)
    assert torch.equal(y32[~nan].view(torch.int32), want32[~nan].view(torch.int32))  # exact
    assert torch.equal(y32[~nan], torch.from_numpy(jitml.from_bfloat16_bits(u))[~nan])
    want16 = X.to(torch.float16)                    # rounds: overflow and subnormals
    assert torch.equal(y16[~nan].view(torch.int16), want16[~nan].view(torch.int16))
    assert torch.isnan(y32[nan]).all() and torch.isnan(y16[nan]).all()


def test_cast_f16_to_bf16_for_every_f16(ctx):
    g = build(ctx, "cast_f16_bf16", "float16", {"x": ("N",)},
              lambda g, x: g.cast(x, "bf16"))
    x = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    want = bits(torch.from_numpy(x).to(BF))
    y = g(x)
    assert y.dtype == np.uint16
    nan = np.isnan(x)
    np.testing.assert_array_equal(y[~nan], want[~nan])
    assert np.isnan(jitml.from_bfloat16_bits(y[nan])).all()


def test_bf16_numpy_convention(ctx):
    # A bfloat16 input takes a uint16 array of bit patterns, without a copy; a call
    # whose first input is NumPy returns bf16 outputs as uint16 bit patterns, the same
    # bits a torch call returns.
    g = build(ctx, "bf16_numpy", "bfloat16", {"x": ("N", 8), "w": (8, 3)},
              lambda g, x, w: (g.relu(x @ w), g.cast(x @ w, "float32")))
    rng = np.random.default_rng(67)
    X, W = rand_bf16(rng, 5, 8), rand_bf16(rng, 8, 3)
    yt, ft = g(X, W)
    yn, fn = g(bits(X), bits(W))
    assert yn.dtype == np.uint16 and fn.dtype == np.float32
    np.testing.assert_array_equal(yn, bits(yt))
    np.testing.assert_array_equal(fn, ft.numpy())
    np.testing.assert_array_equal(jitml.from_bfloat16_bits(yn), yt.float().numpy())
    # The helpers make a NumPy-only round trip.
    xf = rng.uniform(-1, 1, (5, 8)).astype(np.float32)
    yh, _ = g(jitml.to_bfloat16_bits(xf), bits(W))
    np.testing.assert_array_equal(yh, bits(g(torch.from_numpy(xf).to(BF), W)[0]))
    # Read-only arrays (described without DLPack) and a mix of kinds: the first
    # input's kind decides the outputs.
    ro = bits(X).copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(g(ro, bits(W))[0], yn)
    mixed = g(bits(X), W)[0]
    assert isinstance(mixed, np.ndarray) and np.array_equal(mixed, yn)
    assert torch.equal(g(X, bits(W))[0], yt)
    with pytest.warns(jitml.CopyWarning, match="`x`"):
        np.testing.assert_array_equal(g(bits(X).T.copy().T, bits(W))[0], yn)
    # The NumPy side never sees bf16 data it cannot tell from uint16: nothing else
    # counts as bf16, and uint16 counts as nothing else.
    with pytest.raises(jitml.JitError) as e:
        g(X.float().numpy(), bits(W))
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    m = e.value.message
    assert "input 0 `x`" in m and "float32" in m and "bfloat16" in m
    assert "to_bfloat16_bits" in m and "torch.bfloat16" in m, m
    f = build(ctx, "f32_numpy", "float32", {"x": (2,)}, lambda g, x: x * 2)
    with pytest.raises(jitml.JitError) as e:
        f(np.zeros(2, np.uint16))
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    assert "uint16" in e.value.message and "declares bfloat16" in e.value.message
    with pytest.raises(jitml.JitError) as e:
        jitml.from_bfloat16_bits(np.zeros(2, np.float32))
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH


def bf16_softmax_graph(ctx):
    return build(ctx, "bf16_mlir", "bfloat16", {"x": ("N", 4)},
                 lambda g, x: (g.softmax(x), g.cast(x, "float32")))


def test_bf16_graph_from_mlir_and_torch_op(ctx):
    g = bf16_softmax_graph(ctx)
    X = rand_bf16(np.random.default_rng(68), 3, 4)
    want = g(X)
    # Without a disk cache: see the xfail below for why.
    h = jitml.Graph.from_mlir(jitml.Context(cache_dir=""), g.to_mlir())
    for _ in range(2):  # output dtypes learnt by the first call, allocated by the next
        got = h(X)
        assert [t.dtype for t in got] == [BF, torch.float32]
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # Its input dtypes are not known here: uint16 cannot be taken for bf16 bits.
    with pytest.raises(jitml.JitError) as e:
        h(bits(X))
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH and "uint16" in e.value.message
    from jitml import torch_op
    op = torch_op.register("test_bf16_softmax", g)
    with torch.no_grad():
        a, b = op(X)
    assert a.dtype == BF and torch.equal(a, want[0]) and torch.equal(b, want[1])
    meta = op(torch.empty(5, 4, dtype=BF, device="meta"))
    assert meta[0].dtype == BF and meta[0].shape == (5, 4)


def test_bf16_graph_from_mlir_with_a_disk_cache(tmp_path):
    ctx = jitml.Context(cache_dir=str(tmp_path))
    g = bf16_softmax_graph(ctx)
    X = rand_bf16(np.random.default_rng(69), 3, 4)
    want = g(X)
    got = jitml.Graph.from_mlir(ctx, g.to_mlir())(X)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # MLIR text that is not an export compiles in the isolation worker (a disk cache
    # on), which must be told the input is bf16, not f16.
    text = ("func.func @f(%x: tensor<?x4xbf16>) -> tensor<?x4xf32> {\n"
            "  %c0 = arith.constant 0 : index\n"
            "  %n = tensor.dim %x, %c0 : tensor<?x4xbf16>\n"
            "  %e = tensor.empty(%n) : tensor<?x4xf32>\n"
            "  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
            "affine_map<(i, j) -> (i, j)>], iterator_types = [\"parallel\", \"parallel\"]} "
            "ins(%x : tensor<?x4xbf16>) outs(%e : tensor<?x4xf32>) {\n"
            "  ^bb0(%a: bf16, %o: f32):\n"
            "    %f = arith.extf %a : bf16 to f32\n"
            "    linalg.yield %f : f32\n"
            "  } -> tensor<?x4xf32>\n"
            "  return %y : tensor<?x4xf32>\n}\n")
    h = jitml.Graph.from_mlir(ctx, text)
    out = h(X)
    assert torch.equal(out if isinstance(out, torch.Tensor) else out[0], X.float())


def test_bf16_dtype_errors(ctx):
    g = jitml.Graph(ctx, "bf16_errors")
    for bad in ("bfloat8", np.uint16, "uint16"):
        with pytest.raises(jitml.JitError) as e:
            g.input("x", bad, (2,))
        assert e.value.code == jitml.StatusCode.UNSUPPORTED
        assert "bfloat16" in e.value.message
    x = g.input("x", "bfloat16", (4,))
    y = g.input("y", "float32", (4,))
    with pytest.raises(jitml.JitError) as e:
        x + y  # no implicit promotion: cast one
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    h = build(ctx, "bf16_call_errors", "bfloat16", {"x": (4,)}, lambda g, x: x + 1.0)
    for t in (torch.zeros(4), torch.zeros(4, dtype=torch.float16),
              torch.zeros(4, dtype=torch.float64)):
        with pytest.raises(jitml.JitError) as e:
            h(t)
        assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
        assert "input 0 `x`" in e.value.message and "x.to(torch.bfloat16)" in e.value.message
    with pytest.raises(jitml.JitError) as e:
        h(np.zeros(4, np.int16))  # bits, but not in uint16
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    assert "to_bfloat16_bits" in e.value.message


@pytest.mark.parametrize("dtype", ["bfloat32", "bfloat8"])
def test_cast_to_other_bfloat_widths_is_unsupported(ctx, dtype):
    g = jitml.Graph(ctx, "cast_bfloat_other")
    x = g.input("x", "float32", (4,))
    with pytest.raises(jitml.JitError) as e:
        g.output(g.cast(x, dtype))
        g.finalize()
    assert e.value.code == jitml.StatusCode.UNSUPPORTED, e.value
    assert "(cast)" in e.value.message


# --- int8 matmul ------------------------------------------------------------------------


@pytest.mark.parametrize("per_col", [False, True])
def test_matmul_int8_matches_int32_sums(ctx, per_col):
    g = jitml.Graph(ctx, "q8")
    a = g.input("a", "int8", ("B", "M", 37))
    b = g.input("b", jitml.int8, (37, 11))
    sb = g.input("sb", "float32", (11,)) if per_col else 0.25
    g.output(g.matmul_int8(a, b, 0.125, sb))
    g.finalize()
    rng = np.random.default_rng(90)
    for B, M in ((1, 1), (2, 13)):
        av = rng.integers(-128, 128, size=(B, M, 37), dtype=np.int8)
        bv = rng.integers(-128, 128, size=(37, 11), dtype=np.int8)
        sbv = rng.uniform(0.01, 0.1, size=11).astype(np.float32)
        acc = av.astype(np.int64) @ bv.astype(np.int64)
        want = acc * 0.125 * (sbv.astype(np.float64) if per_col else 0.25)
        got = g(av, bv, sbv) if per_col else g(av, bv)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    with pytest.raises(jitml.JitError) as e:
        h = jitml.Graph(ctx, "q8_bad")
        f = h.input("f", "float32", (2, 3))
        h.output(h.matmul_int8(f, f, 1.0, 1.0))
        h.finalize()
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH


@pytest.mark.parametrize("zp", ["a", "b", "b_col", "both"])
def test_matmul_int8_zero_points_match_numpy(ctx, zp):
    # (a - za) @ (b - zb) in int64 NumPy, then the scales: zero points as int8 graph
    # inputs, or as Python ints (int8 scalars).
    g = jitml.Graph(ctx, "q8zp")
    a = g.input("a", "int8", ("M", 29))
    b = g.input("b", "int8", (29, 7))
    za = -100 if zp in ("a", "both") else None
    zb = None
    if zp in ("b", "both"):
        zb = 55
    elif zp == "b_col":
        zb = g.input("zb", "int8", (7,))
    g.output(g.matmul_int8(a, b, 0.5, 0.125, a_zero=za, b_zero=zb))
    g.finalize()
    rng = np.random.default_rng(91)
    zbv = rng.integers(-128, 128, size=7, dtype=np.int8)
    for M in (1, 13):
        av = rng.integers(-128, 128, size=(M, 29), dtype=np.int8)
        bv = rng.integers(-128, 128, size=(29, 7), dtype=np.int8)
        za_n = np.int64(za or 0)
        zb_n = zbv.astype(np.int64) if zp == "b_col" else np.int64(zb or 0)
        acc = (av.astype(np.int64) - za_n) @ (bv.astype(np.int64) - zb_n)
        want = acc * 0.5 * 0.125
        got = g(av, bv, zbv) if zp == "b_col" else g(av, bv)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    h = jitml.Graph(ctx, "q8zp_bad")
    x = h.input("x", "int8", (2, 3))
    with pytest.raises(ValueError):
        h.matmul_int8(x, x, 1.0, 1.0, a_zero=200)
