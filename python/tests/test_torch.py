"""PyTorch tensors in and out through DLPack, and torch.ops.jitml custom ops."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jitml  # noqa: E402
import jitml.torch_op  # noqa: E402

from test_graph import build_mlp  # noqa: E402


def torch_mlp(x, w1, b1, w2, b2):
    h = x @ w1 + b1
    h = 0.5 * h * (1 + torch.tanh((2 / np.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    return torch.softmax(h @ w2 + b2, dim=-1)


def params(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple((torch.rand(s, generator=gen) * 2 - 1).to(dtype)
                 for s in ((16, 32), (32,), (32, 4), (4,)))


@pytest.mark.parametrize("n", [1, 3, 50])
def test_torch_in_torch_out(ctx, n):
    g = build_mlp(ctx)
    p = params()
    x = torch.rand(n, 16) * 2 - 1
    y = g(x, *p)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert y.shape == (n, 4) and y.is_contiguous()
    torch.testing.assert_close(y, torch_mlp(x, *p), rtol=1e-4, atol=1e-6)


def test_torch_inputs_are_not_copied_or_written(ctx):
    g = build_mlp(ctx)
    p = params()
    x = torch.rand(4, 16)
    ptrs = [t.data_ptr() for t in (x,) + p]
    before = [t.clone() for t in (x,) + p]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CopyWarning for contiguous tensors
        g(x, *p)
    assert [t.data_ptr() for t in (x,) + p] == ptrs
    for a, b in zip((x,) + p, before):
        assert torch.equal(a, b)


def test_torch_f16(ctx):
    g = build_mlp(ctx, "float16", "mlp_f16_torch")
    p = params(torch.float16)
    x = (torch.rand(5, 16) * 2 - 1).half()
    y = g(x, *p)
    assert y.dtype == torch.float16
    want = torch_mlp(x.float(), *(t.float() for t in p))
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-3)


def test_torch_requires_grad_and_parameters(ctx):
    g = build_mlp(ctx)
    p = tuple(torch.nn.Parameter(t) for t in params())
    x = torch.rand(2, 16, requires_grad=True)
    y = g(x, *p)
    torch.testing.assert_close(y, torch_mlp(x, *p).detach(), rtol=1e-4, atol=1e-6)


def test_torch_non_contiguous_copied_with_warning(ctx):
    g = build_mlp(ctx)
    w1, b1, w2, b2 = params()
    w1t = w1.T.contiguous().T          # same values, column-major strides
    assert not w1t.is_contiguous()
    x = torch.rand(3, 16)
    with pytest.warns(jitml.CopyWarning, match="`w1`"):
        y = g(x, w1t, b1, w2, b2)
    torch.testing.assert_close(y, torch_mlp(x, w1, b1, w2, b2), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bfloat16])
def test_torch_bad_dtype(ctx, dtype):
    g = build_mlp(ctx)
    with pytest.raises(jitml.JitError) as e:
        g(torch.zeros(3, 16, dtype=dtype), *params())
    assert e.value.code == jitml.StatusCode.DTYPE_MISMATCH
    assert "input 0 `x`" in e.value.message


def test_torch_op_in_a_module(ctx):
    g = build_mlp(ctx, name="torch_mlp_op")
    op = jitml.torch_op.register("test_mlp", g)
    assert op is torch.ops.jitml.test_mlp
    assert jitml.torch_op.schema("test_mlp", g) == (
        "test_mlp(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2) -> Tensor")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(8, 16)
            self.w1, self.b1, self.w2, self.b2 = (torch.nn.Parameter(t) for t in params())

        def forward(self, x, use_jit=True):
            h = torch.relu(self.inp(x))
            if use_jit:
                return torch.ops.jitml.test_mlp(h, self.w1, self.b1, self.w2, self.b2)
            return torch_mlp(h, self.w1, self.b1, self.w2, self.b2)

    net = Net()
    with torch.no_grad():
        for n in (1, 9, 32):
            x = torch.rand(n, 8)
            torch.testing.assert_close(net(x), net(x, use_jit=False), rtol=1e-4,
                                       atol=1e-6)
    # The Meta kernel: shapes from the shape function, nothing runs.
    m = torch.ops.jitml.test_mlp(torch.empty(11, 16, device="meta"),
                                 *(torch.empty(t.shape, device="meta") for t in params()))
    assert m.is_meta and m.shape == (11, 4) and m.dtype == torch.float32
    with pytest.raises(ValueError):
        jitml.torch_op.register("test_mlp", g)
    with pytest.raises(jitml.JitError) as e:
        torch.ops.jitml.test_mlp(torch.rand(2, 15), *params())
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH


def test_torch_op_two_outputs(ctx):
    g = jitml.Graph(ctx, "two_out")
    x = g.input("x", "float32", ("N", 3))
    g.output(g.relu(x), g.reduce_sum(x, axis=1))
    g.finalize()
    jitml.torch_op.register("test_two_out", g)
    t = torch.randn(4, 3)
    a, b = torch.ops.jitml.test_two_out(t)
    torch.testing.assert_close(a, torch.relu(t))
    torch.testing.assert_close(b, t.sum(1))


# --- CUDA tensors (a machine with a GPU and libjitml's CUDA backend) ------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA GPU (scripts/gpu-check.sh runs these)")


@cuda
@pytest.mark.parametrize("n", [1, 7, 300])
def test_cuda_tensors_in_cuda_tensors_out(ctx, n):
    g = build_mlp(ctx, name="mlp_cuda")
    p = tuple(t.cuda() for t in params())
    x = (torch.rand(n, 16) * 2 - 1).cuda()
    y = g(x, *p)
    assert y.device == x.device and y.dtype == torch.float32 and y.shape == (n, 4)
    torch.testing.assert_close(y.cpu(), torch_mlp(x.cpu(), *(t.cpu() for t in p)),
                               rtol=1e-4, atol=1e-5)
    out = torch.empty(n, 4, device=x.device)
    assert g(x, *p, out=out) is out
    torch.testing.assert_close(out, y)


@cuda
def test_cuda_run_follows_the_current_stream(ctx):
    # The input is written by work queued on a side stream just before the call; the
    # call runs on that (current) stream, so it reads the finished input.
    g = build_mlp(ctx, name="mlp_cuda_stream")
    p = tuple(t.cuda() for t in params())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.rand(2048, 2048, device="cuda")
        for _ in range(20):
            big = big @ big / 2048.0  # keeps the stream busy
        x = (big[:64, :16] * 0 + 0.5).contiguous()
        y = g(x, *p)
    side.synchronize()
    want = torch_mlp(torch.full((64, 16), 0.5), *params())
    torch.testing.assert_close(y.cpu(), want, rtol=1e-4, atol=1e-5)


@cuda
def test_cuda_op_under_torch_compile(ctx):
    op = jitml.torch_op.register("test_mlp_cuda", build_mlp(ctx, name="test_mlp_cuda"))
    p = tuple(t.cuda() for t in params())
    f = torch.compile(lambda x: op(x, *p) * 2.0, fullgraph=True, dynamic=True)
    for n in (3, 9):
        x = torch.rand(n, 16, device="cuda")
        y = f(x)
        assert y.is_cuda
        torch.testing.assert_close(y.cpu(), 2.0 * torch_mlp(x.cpu(), *params()),
                                   rtol=1e-4, atol=1e-5)


@cuda
def test_cuda_and_cpu_inputs_mixed_is_an_error(ctx):
    g = build_mlp(ctx, name="mlp_cuda_mixed")
    p = params()
    with pytest.raises(jitml.JitError) as e:
        g(torch.rand(2, 16, device="cuda"), *p)
    assert e.value.code == jitml.StatusCode.INVALID_ARGUMENT
    assert "one device" in e.value.message
