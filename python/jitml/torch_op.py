"""PyTorch custom ops backed by libjitml graphs.

    import jitml, jitml.torch_op
    jitml.torch_op.register("mlp", graph)         # graph: a finalized jitml.Graph
    y = torch.ops.jitml.mlp(x, w1, b1, w2, b2)    # usable inside an nn.Module

One torch.library.Library("jitml", "DEF") holds the namespace; each graph becomes an
op with .define(schema) and CPU and CUDA kernels that run the graph (tensors go through
DLPack without copies, exactly as Graph.__call__; CUDA tensors on libjitml's CUDA
backend, on PyTorch's current stream, outputs on the same GPU).

Shapes without data, for tracing:
- PyTorch 2.4 and later: a fake kernel (torch.library.register_fake), so the op works
  inside torch.compile(fullgraph=True) and torch.export with dynamic dims. Output dims
  are stated symbolically from jit_graph_output_info: a dim that is an input's symbol
  (the batch N) is that input's SymInt, a static dim is its size, and a derived dim
  (concat's N + M, a convolution's rows) is a new unbacked size when the inputs are
  symbolic. Declared static dims and symbols shared between inputs become
  torch._check()s, so a wrong shape fails in the traced program as in eager mode.
- Older PyTorch (Debian 12's 1.13): a Meta kernel from the shape function.

The op has no autograd formula: call it under torch.no_grad() / torch.inference_mode(),
or on tensors that do not require grad.
"""

import keyword
import re

import torch

from . import _core

_lib = None       # the torch.library.Library("jitml", "DEF"), created once
_ops = {}         # name -> Graph, kept alive as long as the op is registered


def _library():
    global _lib
    if _lib is None:
        _lib = torch.library.Library("jitml", "DEF")
    return _lib


def _has_fake_kernels():
    return hasattr(torch.library, "register_fake")  # PyTorch >= 2.4


def _arg_names(graph):
    names, seen = [], set()
    for i, n in enumerate(graph.input_names):
        ok = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n or "") and not keyword.iskeyword(n)
        n = n if ok and n not in seen and n != "self" else "in%d" % i
        seen.add(n)
        names.append(n)
    return names


def schema(name, graph):
    """The schema registered for `graph`, e.g. "mlp(Tensor x, Tensor w) -> Tensor"."""
    args = ", ".join("Tensor %s" % a for a in _arg_names(graph))
    n_out = graph.num_outputs
    ret = "Tensor" if n_out == 1 else "(%s)" % ", ".join(["Tensor"] * n_out)
    return "%s(%s) -> %s" % (name, args, ret)


def _torch_dtype(name):
    return getattr(torch, name or "float32")


def _static_shapes(graph, args):
    # Shapes only: the library's shape function reads shapes and dtypes, never data.
    specs = [_core.TensorSpec(tuple(a.shape), _core._dtype_name(a.dtype)) for a in args]
    return graph.output_shapes(*specs)


def _meta_kernel(graph):
    def meta(*args):
        shapes = _static_shapes(graph, args)
        outs = [torch.empty(s, dtype=_torch_dtype(d), device="meta")
                for s, d in zip(shapes, graph._output_dtypes)]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return meta


def _fake_kernel(name, graph):
    in_dims = [graph.input_dims(i) for i in range(graph.num_inputs)]
    out_info = [graph.output_info(j) for j in range(graph.num_outputs)]
    arg_names = _arg_names(graph)

    def fake(*args):
        if len(args) != len(in_dims):
            raise RuntimeError("jitml::%s takes %d inputs, got %d"
                               % (name, len(in_dims), len(args)))
        if all(isinstance(s, int) for a in args for s in a.shape):
            shapes = _static_shapes(graph, args)  # with the library's own errors
        else:
            shapes = _symbolic_shapes(name, arg_names, in_dims, out_info, args)
        device = args[0].device if args else torch.device("cpu")
        outs = [torch.empty(s, dtype=_torch_dtype(d), device=device)
                for s, (d, _) in zip(shapes, out_info)]
        return outs[0] if len(outs) == 1 else tuple(outs)
    return fake


def _symbolic_shapes(name, arg_names, in_dims, out_info, args):
    sym = {}
    for i, (a, dims) in enumerate(zip(args, in_dims)):
        if a.dim() != len(dims):
            raise RuntimeError("jitml::%s: input %d `%s` has rank %d, the graph wants %d"
                               % (name, i, arg_names[i], a.dim(), len(dims)))
        for d, want in enumerate(dims):
            got = a.shape[d]
            if isinstance(want, str):
                if want in sym:
                    torch._check(got == sym[want], lambda: "jitml::%s: input `%s` dim %d "
                                 "disagrees with symbol %s" % (name, arg_names[i], d, want))
                else:
                    sym[want] = got
            else:
                torch._check(got == want, lambda: "jitml::%s: input `%s` dim %d must be %d"
                             % (name, arg_names[i], d, want))
    shapes = []
    for _, dims in out_info:
        shape = []
        for d in dims:
            if d is None:
                shape.append(torch.library.get_ctx().new_dynamic_size())
            else:
                shape.append(sym[d] if isinstance(d, str) else d)
        shapes.append(shape)
    return shapes


def register(name, graph):
    """Registers `graph` (finalized) as torch.ops.jitml.<name> and returns that op.
    A name can be registered once per process (torch cannot drop a definition)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError("jitml.torch_op.register: bad op name %r" % name)
    if name in _ops:
        raise ValueError("jitml.torch_op.register: torch.ops.jitml.%s is already "
                         "registered" % name)
    if not graph._finalized:
        graph.finalize()
    lib = _library()
    lib.define(schema(name, graph))

    def cpu_kernel(*args):
        return graph(*args)

    lib.impl(name, cpu_kernel, "CPU")
    # CUDA tensors run on libjitml's CUDA backend, on PyTorch's current stream; where
    # that backend cannot run them the call raises (never a copy to the host).
    lib.impl(name, cpu_kernel, "CUDA")
    if _has_fake_kernels() and graph._output_dtypes and None not in graph._output_dtypes:
        torch.library.register_fake("jitml::" + name, _fake_kernel(name, graph), lib=lib)
    else:
        meta = _meta_kernel(graph)
        lib.impl(name, meta, "Meta")
        # torch 1.13 has no autograd fallthrough for meta tensors (AutogradMeta); the
        # shape-only kernel there too makes meta calls reach it.
        lib.impl(name, meta, "AutogradMeta")
    _ops[name] = graph
    return getattr(torch.ops.jitml, name)
