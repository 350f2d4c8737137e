"""PyTorch custom ops backed by libjitml graphs.

    import jitml, jitml.torch_op
    jitml.torch_op.register("mlp", graph)         # graph: a finalized jitml.Graph
    y = torch.ops.jitml.mlp(x, w1, b1, w2, b2)    # usable inside an nn.Module

Uses torch.library as Debian's python3-torch (1.13) has it: one
torch.library.Library("jitml", "DEF") for the namespace, .define(schema) per op and
.impl(name, fn, "CPU"), plus a "Meta" kernel from the shape function (so shapes can
be traced without running anything). The op has no autograd formula: call it under
torch.no_grad() / torch.inference_mode(), or on tensors that do not require grad.
Tensors go through DLPack without copies, exactly as Graph.__call__ (see jitml).
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

    def meta_kernel(*args):
        # Shapes only: the shape function reads shapes and dtypes, never data.
        specs = [_core.TensorSpec(tuple(a.shape), _core._dtype_name(a.dtype)) for a in args]
        shapes = graph.output_shapes(*specs)
        outs = [torch.empty(s, dtype=getattr(torch, d or "float32"), device="meta")
                for s, d in zip(shapes, graph._output_dtypes)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    lib.impl(name, cpu_kernel, "CPU")
    lib.impl(name, meta_kernel, "Meta")
    # torch 1.13 has no autograd fallthrough for meta tensors (AutogradMeta); the
    # shape-only kernel there too makes meta calls reach it.
    lib.impl(name, meta_kernel, "AutogradMeta")
    _ops[name] = graph
    return getattr(torch.ops.jitml, name)
