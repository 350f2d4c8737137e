"""jitml: Python bindings of libjitml, a JIT compiler for tensor graphs with dynamic
shapes, with NumPy and PyTorch tensors passed through DLPack without copies.

    import numpy as np, jitml
    ctx = jitml.Context()
    g = jitml.Graph(ctx, "dense_relu")
    x = g.input("x", "float32", ("N", 4))       # a str dim is a symbol
    w = g.input("w", "float32", (4, 3))
    b = g.input("b", "float32", (3,))
    g.output(g.relu(x @ w + b))
    g.finalize()
    y = g(np.ones((2, 4), np.float32), np.eye(4, 3, dtype=np.float32),
          np.zeros(3, np.float32))              # compiles for N = 2, returns NumPy

Why ctypes: it is in the standard library, so the package is pure Python and needs
nothing built or installed besides libjitml.so itself (no compiler, no Python headers,
no per-Python-version wheel). cffi would have to parse jitml.h (and dlpack.h) or carry
a copy of its declarations, and is one more package; the API is small and plain C
(handles, small structs by value, status pointers), which ctypes covers directly.

Installing: `pip install .` in a checkout (pyproject.toml; scikit-build-core runs the
project's CMake against the system's LLVM/MLIR) installs this package with libjitml.so,
the compile isolation worker and the `jitml` command inside it (jitml/lib, jitml/libexec,
jitml/bin; the `jitml` console script runs jitml/bin/jitml).

Finding the library: $JITML_LIBRARY if set (exactly that file); else jitml/lib/
libjitml.so of a pip-installed package; else <checkout>/build/libjitml.so when this
package sits in a source checkout ($BUILD_DIR honoured); else the system loader (an
installed libjitml.so.0).

Tensors: a call takes NumPy arrays or PyTorch tensors (CPU, float32, float16 or
bfloat16; int32 or int64 for the indices of Graph.gather, an embedding lookup) and
returns the kind of its first input, outputs freshly allocated (np.empty /
torch.empty) with the shapes from jit_output_shape, or written into out= (one array or
a tuple, dense, of each output's shape and dtype). A call with the signature (type,
dtype, shape, strides, device of each input) of an earlier call on the same thread
skips the Python-side checks and the shape function (jitml._fastcall). Inputs are passed through their
DLPack capsules (__dlpack__ / torch.utils.dlpack.to_dlpack) without copies and
without consuming the capsule: it stays alive, and keeps the array alive, until the
call returns, and its own destructor frees it. Read-only NumPy arrays, which NumPy
1.24 will not export through DLPack 0.6, are described through the array interface
instead, still without a copy (libjitml never writes inputs).

bfloat16 (jitml.bfloat16, "bf16", torch.bfloat16): stored in 16 bits, computed in f32
and rounded once per op; CPU only (Vulkan refuses it). torch.bfloat16 tensors go in
and come out as they are. NumPy has no bfloat16 dtype, so NumPy holds bf16 as its bit
pattern in uint16, one rule both ways: an input the graph declares bfloat16 takes a
uint16 array of bit patterns (no copy; a uint16 array anywhere else is
DTYPE_MISMATCH), and a bfloat16 output of a call whose first input is a NumPy array
is a uint16 array of bit patterns, never an upcast float32 copy that would hide the
rounding. jitml.to_bfloat16_bits(x) rounds float32 to those bits (nearest even, as
torch and Graph.cast do) and jitml.from_bfloat16_bits(b) widens them to float32
exactly; torch converts with torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)
and t.view(torch.int16).numpy().view(np.uint16). Within a graph,
Graph.cast(x, "bfloat16") and back is the other way to get there from float32 data.

Other DLPack producers (objects with __dlpack__ and __dlpack_device__: JAX, CuPy,
TensorFlow): CPU arrays are read in place through their capsule, outputs are NumPy
arrays; GPU arrays of frameworks other than torch raise UNSUPPORTED for now.

Strides: libjitml runs dense row-major tensors only. A non-contiguous input
(a transpose, a slice with a step, negative strides, a broadcast view) is COPIED to a
contiguous array with a jitml.CopyWarning, so results are right and the copy is
visible; warnings.simplefilter("error", jitml.CopyWarning) turns it into an error.

Errors: every failure raises jitml.JitError with .code (a jitml.StatusCode, e.g.
SHAPE_MISMATCH) and .message. A dtype other than float32/float16/bfloat16 (float64,
uint8, ...), or other than the graph declares for that input, raises
DTYPE_MISMATCH naming the input; integer values feed only gather's indices and are
never outputs (DTYPE_MISMATCH from the builder); an index outside the table's rows
raises INVALID_ARGUMENT naming it. torch CUDA tensors run on libjitml's CUDA backend
on PyTorch's current stream (outputs on the same GPU); where that backend cannot run
them the call raises, nothing is copied to the host.

Data movement and casts: Graph.concat, Graph.slice (NumPy's x[start:stop:step] on one
axis), Graph.pad (constant) and Graph.cast (among float32, float16 and bfloat16).
MLIR tooling: jitml.mlir_opt(text, pipeline) runs a pass pipeline, libjitml's own
passes included.

PyTorch custom ops: jitml.torch_op.register(name, graph) makes
torch.ops.jitml.<name>(...) callable (torch.library), e.g. inside an nn.Module; with
PyTorch >= 2.4 also inside torch.compile(fullgraph=True, dynamic=True) and torch.export
(fake kernels with symbolic output dims, from Graph.output_info).
"""

from ._core import (Context, CopyWarning, Graph, JitError, StatusCode, TensorSpec, Value,
                    bfloat16, float16, float32, from_bfloat16_bits, int8, int32, int64,
                    mlir_opt, to_bfloat16_bits)

__all__ = ["Context", "Graph", "Value", "JitError", "StatusCode", "CopyWarning",
           "TensorSpec", "float32", "float16", "bfloat16", "int8", "int32", "int64",
           "to_bfloat16_bits", "from_bfloat16_bits", "mlir_opt", "version",
           "library_path"]


def version():
    """The version of the libjitml loaded, e.g. "0.1.0"."""
    from . import _core
    return _core._init().jit_version().decode()


def library_path():
    """The path of the libjitml loaded."""
    from . import _core
    _core._init()
    return _core.LIBRARY_PATH
