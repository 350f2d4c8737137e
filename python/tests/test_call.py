"""Graph.__call__'s out= and its fast path (jitml._fastcall): a call with the
signature of an earlier one reuses its checks; results must not change."""
import threading
import warnings
import weakref

import numpy as np
import pytest

import jitml
from jitml import _fastcall


def two_out_graph(ctx, name="call_two_out"):
    g = jitml.Graph(ctx, name)
    x = g.input("x", "float32", ("N", 3))
    y = g.input("y", "float32", ("N", 3))
    g.output(g.relu(x - y))
    g.output(x * y + 1.0)
    return g.finalize()


def ref(x, y):
    return np.maximum(x - y, 0), x * y + 1.0


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_repeated_calls_see_new_data(ctx, n):
    g = two_out_graph(ctx, "call_new_data_%d" % n)
    rng = np.random.default_rng(n)
    for _ in range(4):  # the first call fills the cache, the others take the fast path
        x, y = rng.standard_normal((2, n, 3), dtype=np.float32)
        a, b = g(x, y)
        wa, wb = ref(x, y)
        np.testing.assert_array_equal(a, wa)
        np.testing.assert_allclose(b, wb, rtol=1e-6)
    assert len(g._tls.entries) == 1


def test_shapes_alternate(ctx):
    g = two_out_graph(ctx, "call_alternate")
    rng = np.random.default_rng(1)
    for n in (5, 1, 5, 11, 1, 11):
        x, y = rng.standard_normal((2, n, 3), dtype=np.float32)
        a, b = g(x, y)
        assert a.shape == (n, 3) and b.shape == (n, 3)
        np.testing.assert_array_equal(a, ref(x, y)[0])


def test_out_numpy_is_written_and_returned(ctx):
    g = two_out_graph(ctx, "call_out")
    rng = np.random.default_rng(2)
    oa, ob = np.empty((4, 3), np.float32), np.empty((4, 3), np.float32)
    for _ in range(3):
        x, y = rng.standard_normal((2, 4, 3), dtype=np.float32)
        a, b = g(x, y, out=(oa, ob))
        assert a is oa and b is ob
        np.testing.assert_array_equal(oa, ref(x, y)[0])
        np.testing.assert_allclose(ob, ref(x, y)[1], rtol=1e-6)


def test_out_torch(ctx):
    torch = pytest.importorskip("torch")
    g = two_out_graph(ctx, "call_out_torch")
    x, y = torch.randn(6, 3), torch.randn(6, 3)
    oa, ob = torch.empty(6, 3), torch.empty(6, 3)
    for _ in range(2):
        a, b = g(x, y, out=[oa, ob])
        assert a is oa and b is ob
        torch.testing.assert_close(oa, torch.relu(x - y))


@pytest.mark.parametrize("bad, code", [
    (lambda: (np.empty((4, 3), np.float32),), "INVALID_ARGUMENT"),        # one of two
    (lambda: (np.empty((5, 3), np.float32),) * 2, "SHAPE_MISMATCH"),
    (lambda: (np.empty((4, 3), np.float64),) * 2, "DTYPE_MISMATCH"),
    (lambda: (np.empty((3, 4), np.float32).T,) * 2, "UNSUPPORTED"),       # not dense
    (lambda: (np.empty((4, 3), np.float32),) * 2, "INVALID_ARGUMENT"),    # aliased
    (lambda: (np.empty((4, 6), np.float32)[:, ::2],) * 2, "UNSUPPORTED"),
    (lambda: ([[0.0] * 3] * 4,) * 2, "INVALID_ARGUMENT"),
])
def test_bad_out_is_refused(ctx, bad, code):
    g = two_out_graph(ctx, "call_bad_out")
    x = np.ones((4, 3), np.float32)
    g(x, x)  # a cached signature: the fast path must refuse as the full path does
    with pytest.raises(jitml.JitError) as e:
        g(x, x, out=bad())
    assert e.value.code == jitml.StatusCode[code], e.value


def test_read_only_out_is_refused(ctx):
    g = two_out_graph(ctx, "call_ro_out")
    x = np.ones((2, 3), np.float32)
    o = np.empty((2, 3), np.float32)
    o.flags.writeable = False
    with pytest.raises(jitml.JitError) as e:
        g(x, x, out=(o, o.copy()))
    assert e.value.code == jitml.StatusCode.UNSUPPORTED


def test_non_contiguous_after_contiguous_still_copies(ctx):
    g = two_out_graph(ctx, "call_strides")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    g(x, x)
    xt = np.ascontiguousarray(np.arange(12, dtype=np.float32).reshape(3, 4).T)
    xs = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # same shape, strided
    with pytest.warns(jitml.CopyWarning):
        a, b = g(xs, xt)
    np.testing.assert_array_equal(a, ref(np.ascontiguousarray(xs), xt)[0])


def test_read_only_and_bf16_inputs_on_the_fast_path(ctx):
    g = jitml.Graph(ctx, "call_bf16")
    x = g.input("x", "bfloat16", ("N",))
    g.output(g.cast(x, "float32") * 2.0)
    g.finalize()
    for v in (1.5, -3.0, 0.25):
        bits = jitml.to_bfloat16_bits(np.full(5, v, np.float32))
        bits.flags.writeable = False
        np.testing.assert_array_equal(g(bits), np.full(5, 2 * v, np.float32))


def test_binding_errors_still_come_from_the_library(ctx):
    g = two_out_graph(ctx, "call_bind_err")
    g(np.ones((3, 3), np.float32), np.ones((3, 3), np.float32))
    with pytest.raises(jitml.JitError) as e:
        g(np.ones((3, 3), np.float32), np.ones((5, 3), np.float32))
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH


def test_inputs_are_not_kept_alive(ctx):
    g = two_out_graph(ctx, "call_no_refs")
    x = np.ones((2, 3), np.float32)
    g(x, x)
    g(x, x)
    r = weakref.ref(x)
    del x
    assert r() is None


def test_numpy_pointer_matches_ctypes():
    base = np.arange(40, dtype=np.float32).reshape(4, 10)
    for a in (base, base[1:], base[2:, 3:], np.empty(0, np.float32)[:0]):
        assert _fastcall._numpy_ptr(a) == a.ctypes.data


def test_threads_share_a_graph(ctx):
    g = two_out_graph(ctx, "call_threads")
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for i in range(200):
                n = 1 + (i + seed) % 5
                x, y = rng.standard_normal((2, n, 3), dtype=np.float32)
                a, b = g(x, y)
                np.testing.assert_array_equal(a, ref(x, y)[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_empty_batches_take_the_full_path(ctx):
    g = two_out_graph(ctx, "call_empty")
    e = np.empty((0, 3), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            a, b = g(e, e)
            assert a.shape == (0, 3)
    assert not getattr(g._tls, "entries", None)
