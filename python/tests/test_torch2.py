"""PyTorch 2: torch.ops.jitml ops inside torch.compile(fullgraph=True) and torch.export,
with dynamic batch. Needs PyTorch >= 2.4 (fake kernels); scripts/test.sh runs this file
in its PyPI venv (torch 2.x). Under Debian's torch 1.13 these tests do not apply."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "register_fake"):
    pytest.skip("PyTorch %s has no fake kernels (needs >= 2.4); the PyPI venv run of "
                "scripts/test.sh covers this file" % torch.__version__,
                allow_module_level=True)

import torch._dynamo.testing  # noqa: E402

import jitml  # noqa: E402
import jitml.torch_op  # noqa: E402

from test_graph import build_mlp  # noqa: E402
from test_torch import params, torch_mlp  # noqa: E402

_ops = {}


def op(ctx, name, build):
    """Registers build(ctx) once per process as torch.ops.jitml.<name>."""
    if name not in _ops:
        _ops[name] = jitml.torch_op.register(name, build(ctx))
    return _ops[name]


def mlp_op(ctx):
    return op(ctx, "t2_mlp", lambda c: build_mlp(c, name="t2_mlp"))


def concat_op(ctx):
    def build(c):
        g = jitml.Graph(c, "t2_concat")
        a = g.input("a", "float32", ("N", 4))
        b = g.input("b", "float32", ("M", 4))
        g.output(g.relu(g.concat([a, b], axis=0)))
        return g.finalize()
    return op(ctx, "t2_concat", build)


class MLP(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f
        self.p = torch.nn.ParameterList(torch.nn.Parameter(t, requires_grad=False)
                                        for t in params())

    def forward(self, x):
        # torch ops around the jitml op: the compiled graph must keep it whole.
        return self.f(x * 2.0, *self.p) + 1.0


def reference(x):
    return torch_mlp(x * 2.0, *params()) + 1.0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_dynamic_batch_compiles_once(ctx, backend):
    f = mlp_op(ctx)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    model = torch.compile(MLP(f), backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for n in (3, 7, 64, 5):
            x = torch.rand(n, 16) * 2 - 1
            y = model(x)
            assert y.shape == (n, 4)
            torch.testing.assert_close(y, reference(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count == 1, "recompiled: %d frames" % counter.frame_count
    # The op stayed one opaque node of the graph dynamo captured, and its fake kernel
    # gave the output the input's batch symbol, not a number.
    nodes = [n for g in counter.graphs for n in g.graph.nodes
             if "jitml.t2_mlp" in str(n.target)]
    assert len(nodes) == 1, [str(n.target) for g in counter.graphs for n in g.graph.nodes]
    rows = nodes[0].meta["example_value"].shape[0]
    assert isinstance(rows, torch.SymInt), rows
    # Batch 1 is PyTorch's own special case (0/1 specialization): one more frame at
    # most, and none after it.
    with torch.no_grad():
        for n in (1, 1, 2):
            x = torch.rand(n, 16)
            torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count <= 2


def test_compile_default_dynamic_settles_after_one_recompile(ctx):
    # torch.compile's default: the first shape static, the second marks the batch
    # dynamic; further batch sizes compile nothing.
    f = mlp_op(ctx)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model = torch.compile(MLP(f), backend=counter, fullgraph=True)
    with torch.no_grad():
        for n in (2, 3, 9, 33, 17):
            x = torch.rand(n, 16)
            torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    assert counter.frame_count <= 2, "frames: %d" % counter.frame_count


def test_compile_derived_dim_is_an_unbacked_size(ctx):
    # concat's rows N + M are not an input symbol: the fake kernel makes a new size.
    f = concat_op(ctx)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda a, b: f(a, b) * 3.0, backend=counter, fullgraph=True,
                       dynamic=True)
    for n, m in ((2, 3), (5, 4), (7, 7)):
        a, b = torch.randn(n, 4), torch.randn(m, 4)
        torch.testing.assert_close(fn(a, b), torch.relu(torch.cat([a, b])) * 3.0)
    assert counter.frame_count == 1


def test_compile_wrong_static_dim_raises(ctx):
    f = mlp_op(ctx)
    torch._dynamo.reset()
    model = torch.compile(MLP(f), backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad(), pytest.raises(Exception, match="dim 1|SHAPE_MISMATCH|16"):
        model(torch.rand(3, 15))


def test_export_with_dynamic_batch(ctx):
    f = mlp_op(ctx)
    batch = torch.export.Dim("batch", min=1, max=4096)
    x = torch.rand(4, 16)
    ep = torch.export.export(MLP(f), (x,), dynamic_shapes={"x": {0: batch}})
    assert "jitml.t2_mlp" in ep.graph_module.code
    m = ep.module()
    with torch.no_grad():
        for n in (1, 4, 17):
            xn = torch.rand(n, 16)
            torch.testing.assert_close(m(xn), reference(xn), rtol=1e-4, atol=1e-5)


def test_eager_errors_are_jit_errors(ctx):
    f = mlp_op(ctx)
    with pytest.raises(jitml.JitError) as e:
        f(torch.rand(3, 15), *params())
    assert e.value.code == jitml.StatusCode.SHAPE_MISMATCH
    assert "x" in e.value.message


def test_graph_from_mlir_under_compile(ctx):
    # A graph imported from MLIR: its result dims are `?` with no symbol, so the fake
    # kernel gives new sizes; the op still compiles once for every batch.
    text = """
func.func @scale(%x: tensor<?x4xf32> {jit.dims = ["N", 4]}) -> tensor<?x4xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x4xf32>
  %e = tensor.empty(%n) : tensor<?x4xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<?x4xf32>) outs(%e : tensor<?x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = arith.addf %a, %a : f32
    linalg.yield %t : f32
  } -> tensor<?x4xf32>
  return %y : tensor<?x4xf32>
}
"""
    g = jitml.Graph.from_mlir(ctx, text, name="t2_mlir_scale")
    assert g._output_dtypes == ["float32"]
    f = op(ctx, "t2_mlir_scale", lambda c: g)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x: f(x) + 1.0, backend=counter, fullgraph=True, dynamic=True)
    for n in (2, 5, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fn(x), 2 * x + 1.0)
    assert counter.frame_count == 1
