"""Arrays of other frameworks through the DLPack protocol (__dlpack__ and
__dlpack_device__): JAX's CPU arrays (in the PyPI venv run), and any producer."""
import numpy as np
import pytest

import jitml


def relu2_graph(ctx, dtype="float32", name="dlpack_relu2"):
    g = jitml.Graph(ctx, name)
    x = g.input("x", dtype, ("N", 3))
    g.output(g.relu(g.cast(x, "float32")) * 2.0)
    return g.finalize()


class Producer:
    """A minimal DLPack producer over a NumPy array (what JAX, CuPy and TensorFlow
    arrays look like to a consumer), reporting `device`."""

    def __init__(self, a, device=(1, 0)):
        self.a, self.device, self.exports = a, device, 0

    def __dlpack__(self, stream=None):
        self.exports += 1
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.device


def test_producer_is_read_in_place(ctx):
    g = relu2_graph(ctx)
    a = np.arange(-6, 6, dtype=np.float32).reshape(4, 3)
    p = Producer(a)
    y = g(p)
    assert isinstance(y, np.ndarray) and p.exports == 1
    np.testing.assert_array_equal(y, np.maximum(a, 0) * 2)


def test_producer_on_a_gpu_is_refused(ctx):
    g = relu2_graph(ctx, name="dlpack_gpu")
    with pytest.raises(jitml.JitError) as e:
        g(Producer(np.ones((2, 3), np.float32), device=(2, 0)))
    assert e.value.code == jitml.StatusCode.UNSUPPORTED
    assert "device type 2" in e.value.message and "input 0 `x`" in e.value.message


def test_producer_wrong_dtype_and_strides(ctx):
    g = relu2_graph(ctx, name="dlpack_bad")
    with pytest.raises(jitml.JitError) as e:
        g(Producer(np.ones((2, 3), np.float64)))
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    with pytest.raises(jitml.JitError) as e:
        g(Producer(np.ones((3, 2), np.float32).T))  # column-major: not copied
    assert e.value.code == jitml.StatusCode.UNSUPPORTED
    assert "stride" in e.value.message


def test_jax_arrays(ctx):
    jnp = pytest.importorskip("jax.numpy")
    g = relu2_graph(ctx, name="dlpack_jax")
    for n in (1, 4, 13):
        a = jnp.linspace(-3, 3, n * 3, dtype=jnp.float32).reshape(n, 3)
        y = g(a)
        assert isinstance(y, np.ndarray)
        np.testing.assert_array_equal(y, np.maximum(np.asarray(a), 0) * 2)


def test_jax_bfloat16(ctx):
    jnp = pytest.importorskip("jax.numpy")
    g = relu2_graph(ctx, "bfloat16", name="dlpack_jax_bf16")
    a = jnp.array([[-1.5, 0.25, 3.0], [2.0, -8.0, 0.5]], dtype=jnp.bfloat16)
    np.testing.assert_array_equal(g(a), np.maximum(np.asarray(a, np.float32), 0) * 2)
