"""Context, Graph, Value and the DLPack call path (see the package docstring)."""

import ctypes
import enum
import functools
import operator
import warnings
import weakref

from . import _fastcall, _lib

_L = None  # the loaded CDLL, set by _init()
LIBRARY_PATH = None


def _init():
    global _L, LIBRARY_PATH
    if _L is None:
        _L, LIBRARY_PATH = _lib.load()
    return _L


class StatusCode(enum.IntEnum):
    """jit_status_code of jitml.h."""
    OK = 0
    INVALID_ARGUMENT = 1
    SHAPE_MISMATCH = 2
    DTYPE_MISMATCH = 3
    UNSUPPORTED = 4
    PARSE_ERROR = 5
    COMPILE_ERROR = 6
    DEVICE_ERROR = 7
    UNAVAILABLE = 8
    CACHE_ERROR = 9
    RESOURCE_EXHAUSTED = 10
    INTERNAL = 11


class JitError(Exception):
    """A failed libjitml call: .code (a StatusCode) and .message (the C message)."""

    def __init__(self, code, message):
        try:
            code = StatusCode(code)
        except ValueError:
            pass
        self.code = code
        self.message = message
        name = code.name if isinstance(code, StatusCode) else str(code)
        super().__init__("%s: %s" % (name, message))

    @property
    def code_name(self):
        return self.code.name if isinstance(self.code, StatusCode) else str(self.code)


class CopyWarning(UserWarning):
    """An input was not dense row-major (non-contiguous, negative or zero strides) and
    was copied before the call. Make it an error with
    warnings.simplefilter("error", jitml.CopyWarning)."""


def _check(status):
    """Raises JitError for a non-NULL jit_status, freeing it."""
    if status:
        code = _L.jit_status_get_code(status)
        msg = _L.jit_status_message(status).decode("utf-8", "replace")
        _L.jit_status_free(status)
        raise JitError(code, msg)


# --- dtypes ----------------------------------------------------------------------------

float32 = "float32"
float16 = "float16"
# bf16: 8 exponent bits like float32 and 8 significant bits, stored in 16 bits and
# computed in f32 (rounded once per op). NumPy has no bfloat16 dtype, so NumPy
# callers hold bf16 as its bit pattern in uint16 (see to_bfloat16_bits); torch has
# torch.bfloat16, passed as is.
bfloat16 = "bfloat16"
# Integers are graph inputs only: int32/int64 feed Graph.gather's indices, int8
# Graph.matmul_int8's operands, nothing else, never outputs (the library says
# DTYPE_MISMATCH otherwise).
int32 = "int32"
int64 = "int64"
int8 = "int8"
_DL = {float32: (_lib.kDLFloat, 32), float16: (_lib.kDLFloat, 16),
       bfloat16: (_lib.kDLBfloat, 16), int32: (_lib.kDLInt, 32), int64: (_lib.kDLInt, 64),
       int8: (_lib.kDLInt, 8)}
_FROM_DL = {v: k for k, v in _DL.items()}
# The NumPy dtype that holds a graph dtype where NumPy has none of its own.
_NUMPY_STORAGE = {bfloat16: "uint16"}


def _dtype_name(dtype):
    """'float32' / 'float16' / 'bfloat16' / 'int32' / 'int64' for a str, numpy dtype or
    torch dtype; else its str."""
    if isinstance(dtype, str):
        return {"f32": float32, "f16": float16, "half": float16, "float": float32,
                "bf16": bfloat16, "i32": int32, "i64": int64, "i8": int8}.get(dtype, dtype)
    s = str(dtype)
    if s.startswith("torch."):
        s = s[len("torch."):]
        s = {"float": "float32", "half": "float16"}.get(s, s)
    try:
        import numpy
        s2 = numpy.dtype(dtype).name
        return s2
    except Exception:
        return s


def _dl_dtype(dtype):
    name = _dtype_name(dtype)
    if name not in _DL:
        raise JitError(StatusCode.UNSUPPORTED,
                       "dtype %s is not supported; use float32, float16 or bfloat16 "
                       "(int32 or int64 for gather's indices)%s" % (
                           name, "; a bf16 input is declared 'bfloat16', and NumPy "
                           "callers pass its bits as uint16" if name == "uint16" else ""))
    code, bits = _DL[name]
    return _lib.DLDataType(code, bits, 1)


def to_bfloat16_bits(x):
    """The bf16 bit patterns (a NumPy uint16 array) of x, rounded to nearest even as
    torch's x.to(torch.bfloat16) and Graph.cast do: x is converted to float32 first,
    a value from halfway past the largest bf16 on becomes inf, and a NaN the quiet NaN
    0x7fc0. This is how NumPy callers make a bf16 input (NumPy has no bfloat16)."""
    import numpy
    u = numpy.asarray(x, dtype=numpy.float32).view(numpy.uint32)
    # Add just under half an ulp of bf16, plus one when the kept part is odd, then
    # drop the low half: no finite float32 overflows uint32 here (+-inf neither).
    r = ((u + numpy.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(numpy.uint16)
    return numpy.where(numpy.isnan(u.view(numpy.float32)), numpy.uint16(0x7FC0), r)


def from_bfloat16_bits(bits):
    """The float32 values (exact: every bf16 is a float32) of bf16 bit patterns in a
    NumPy uint16 array, as returned to NumPy callers by a graph with bf16 outputs."""
    import numpy
    b = numpy.asarray(bits)
    if b.dtype != numpy.uint16:
        raise JitError(StatusCode.DTYPE_MISMATCH, "from_bfloat16_bits takes the bf16 "
                       "bit patterns as a uint16 array, not %s" % b.dtype.name)
    return (b.astype(numpy.uint32) << 16).view(numpy.float32)


def _any_dl_dtype(name):
    """The DLDataType of any NumPy-style dtype name (int8, uint8, bfloat16, float64,
    ...): for jit_cast, whose own checks say which it supports."""
    if name in _DL:
        return _dl_dtype(name)
    import re
    m = re.fullmatch(r"(bfloat|float|uint|int)(8|16|32|64)", name)
    if not m:
        raise JitError(StatusCode.UNSUPPORTED, "dtype %s has no DLPack equivalent" % name)
    code = {"bfloat": _lib.kDLBfloat, "float": _lib.kDLFloat, "uint": _lib.kDLUInt,
            "int": _lib.kDLInt}[m.group(1)]
    return _lib.DLDataType(code, int(m.group(2)), 1)


# --- MLIR text in, MLIR text out -------------------------------------------------------


def mlir_opt(text, pipeline, source_name=None):
    """Runs a pass pipeline on MLIR text as `mlir-opt --pass-pipeline=...` does, with
    libjitml's own passes (jitml-lower-matmul-to-loops) among MLIR's, and returns the
    printed result (jit_mlir_opt). `pipeline` may leave out the outer
    builtin.module(...); `source_name` names the text in messages. Raises JitError:
    PARSE_ERROR (with line:col), INVALID_ARGUMENT (a pipeline element that does not
    parse, named), COMPILE_ERROR (a pass failed)."""
    L = _init()
    if getattr(L, "jit_mlir_opt", None) is None:
        raise JitError(StatusCode.UNAVAILABLE,
                       "this libjitml (%s) has no jit_mlir_opt" % LIBRARY_PATH)
    data = text.encode() if isinstance(text, str) else bytes(text)
    out = ctypes.c_void_p()
    _check(L.jit_mlir_opt(data, len(data), pipeline.encode(),
                          source_name.encode() if source_name else None,
                          ctypes.byref(out)))
    try:
        return ctypes.string_at(out.value).decode()
    finally:
        L.jit_string_free(out)


# --- Context ---------------------------------------------------------------------------


class Context:
    """A libjitml context: compiled kernels, options, statistics.

    Context(opt_level=2, cache_dir=None, num_threads=0). cache_dir None uses
    $JITML_CACHE_DIR / ~/.cache/jitml, "" turns the disk cache off. Thread-safe.
    Graphs keep their context alive; close() closes the context's graphs first.
    """

    def __init__(self, opt_level=2, cache_dir=None, num_threads=0):
        L = _init()
        self._ptr = None
        self._graphs = weakref.WeakSet()
        buf = ctypes.create_string_buffer(1024)  # larger than any jit_options
        L.jit_options_init(buf)
        opts = _lib.jit_options.from_buffer(buf)
        if opts.struct_size > len(buf):
            raise JitError(StatusCode.INTERNAL, "jit_options is larger than expected")
        opts.opt_level = int(opt_level)
        opts.num_threads = int(num_threads)
        self._cache_dir = None
        if cache_dir is not None:
            if opts.struct_size < _lib.jit_options.cache_dir.offset + ctypes.sizeof(
                    ctypes.c_char_p):
                raise JitError(StatusCode.UNSUPPORTED,
                               "this libjitml has no cache_dir option")
            self._cache_dir = ctypes.c_char_p(str(cache_dir).encode())  # kept alive
            opts.cache_dir = self._cache_dir.value
        ptr = ctypes.c_void_p()
        _check(L.jit_context_create(buf, ctypes.byref(ptr)))
        self._ptr = ptr
        self._buf = buf  # the options' strings stay valid for the context's life

    def stats(self):
        """The counters of jit_context_stats as a dict (runs, memory_hits, misses,
        compiles, compile_ms, kernels, disk_hits, ..., the fleet cache's remote_*)."""
        st = _lib.jit_stats()
        st.struct_size = ctypes.sizeof(st)
        _check(_L.jit_context_stats(self._handle(), ctypes.byref(st)))
        return {name: getattr(st, name) for name, _ in st._fields_[1:]}

    def _handle(self):
        if not self._ptr:
            raise JitError(StatusCode.INVALID_ARGUMENT, "the context is closed")
        return self._ptr

    def close(self):
        """Destroys the context after closing every graph of it. Idempotent."""
        for g in list(self._graphs):
            g.close()
        if self._ptr and _L is not None:
            _L.jit_context_destroy(self._ptr)
        self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# --- Graph builder ---------------------------------------------------------------------


class Value:
    """A value of a Graph: an input or an op's result. Supports + - * / @ and unary -
    with other Values or Python numbers (a number becomes a scalar of this dtype)."""

    __slots__ = ("graph", "id", "dtype")

    def __init__(self, graph, vid, dtype):
        self.graph, self.id, self.dtype = graph, vid, dtype

    def _other(self, x):
        return x if isinstance(x, Value) else self.graph.scalar(x, self.dtype)

    def __add__(self, o): return self.graph.add(self, self._other(o))
    def __radd__(self, o): return self.graph.add(self._other(o), self)
    def __sub__(self, o): return self.graph.sub(self, self._other(o))
    def __rsub__(self, o): return self.graph.sub(self._other(o), self)
    def __mul__(self, o): return self.graph.mul(self, self._other(o))
    def __rmul__(self, o): return self.graph.mul(self._other(o), self)
    def __truediv__(self, o): return self.graph.div(self, self._other(o))
    def __rtruediv__(self, o): return self.graph.div(self._other(o), self)
    def __matmul__(self, o): return self.graph.matmul(self, o)
    def __neg__(self): return self.graph.neg(self)

    def __repr__(self):
        return "<jitml.Value %d %s>" % (self.id, self.dtype)


def _binary(cname):
    def op(self, a, b):
        return self._value(getattr(_L, cname)(self._handle(), self._v(a), self._v(b)),
                           a.dtype)
    op.__name__ = cname[4:]
    op.__doc__ = "%s(a, b): see %s in jitml.h." % (cname[4:], cname)
    return op


def _unary(cname):
    def op(self, x):
        return self._value(getattr(_L, cname)(self._handle(), self._v(x)), x.dtype)
    op.__name__ = cname[4:]
    op.__doc__ = "%s(x): see %s in jitml.h." % (cname[4:], cname)
    return op


def _reduce(cname):
    def op(self, x, axis=-1, keepdims=False):
        return self._value(getattr(_L, cname)(self._handle(), self._v(x), int(axis),
                                              1 if keepdims else 0), x.dtype)
    op.__name__ = cname[4:]
    op.__doc__ = "%s(x, axis=-1, keepdims=False): see %s in jitml.h." % (cname[4:], cname)
    return op


_LAYOUTS = {"NCHW": _lib.JIT_LAYOUT_NCHW, "NHWC": _lib.JIT_LAYOUT_NHWC}


class Graph:
    """A libjitml graph. Build with input/ops/output, finalize(), then call it:

        g = jitml.Graph(ctx, "dense")
        x = g.input("x", "float32", ("N", 4))      # str dims are symbols
        w = g.input("w", "float32", (4, 3))
        g.output(g.relu(x @ w))
        g.finalize()
        y = g(x_array, w_array)                    # NumPy in -> NumPy out

    Calls accept NumPy arrays and PyTorch tensors (CPU, float32/float16/bfloat16;
    int32/int64 for gather's indices) and return the same kind as the first input.
    NumPy has no bfloat16: NumPy callers pass and get bf16 as uint16 bit patterns. See
    the package docstring for bf16, copies and errors.
    """

    def __init__(self, ctx, name=None, _ptr=None):
        _init()
        self._ptr = None
        self.ctx = ctx
        self.name = name or "graph"
        if _ptr is None:
            ptr = ctypes.c_void_p()
            _check(_L.jit_graph_create(ctx._handle(), name.encode() if name else None,
                                       ctypes.byref(ptr)))
            _ptr = ptr
        self._ptr = _ptr
        self._input_names = []
        self._input_dtypes = []
        self._output_dtypes = []   # None where unknown (graphs from MLIR)
        self._finalized = False
        self._tls = _fastcall.new_local()  # the call fast path's entries, per thread
        ctx._graphs.add(self)

    # -- lifetime --
    def _handle(self):
        if not self._ptr:
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s` is closed" % self.name)
        return self._ptr

    def close(self):
        """Destroys the graph. Idempotent; the context closes its graphs too."""
        if self._ptr and _L is not None:
            _L.jit_graph_destroy(self._ptr)
        self._ptr = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- building --
    def _v(self, v):
        if not isinstance(v, Value) or v.graph is not self:
            raise JitError(StatusCode.INVALID_ARGUMENT,
                           "graph `%s`: %r is not a value of this graph" % (self.name, v))
        return _lib.jit_value(v.id)

    def _value(self, cv, dtype):
        if cv.id == 0:
            # The builder recorded its first error in the graph; finalize returns it
            # (and freezes nothing when there is an error).
            _check(_L.jit_graph_finalize(self._handle()))
            raise JitError(StatusCode.INTERNAL, "graph `%s`: builder call failed "
                           "without an error" % self.name)
        return Value(self, cv.id, dtype)

    def symbol(self, name):
        """The code of symbolic dim `name` (see jit_symbol); input() takes str dims."""
        code = _L.jit_symbol(self._handle(), name.encode())
        if code == 0:
            _check(_L.jit_graph_finalize(self._handle()))
        return code

    def input(self, name, dtype, shape):
        """A graph input. dtype 'float32'/'float16'/'bfloat16' ('bf16',
        torch.bfloat16; NumPy callers pass a bfloat16 input as uint16 bit patterns),
        or 'int32'/'int64' for the indices of gather (which they alone may feed), or a
        NumPy/torch dtype; shape a sequence of ints and str symbol names, e.g.
        ("N", 784)."""
        return self._declare(_L.jit_input, name, dtype, shape)

    def _declare(self, fn, name, dtype, shape):
        dt = _dl_dtype(dtype)
        dims = [self.symbol(d) if isinstance(d, str) else int(d) for d in shape]
        arr = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        v = self._value(fn(self._handle(), name.encode(), dt, len(dims), arr),
                        _dtype_name(dtype))
        self._input_names.append(name)
        self._input_dtypes.append(v.dtype)
        return v

    def weight(self, name, dtype, shape):
        """An input holding a layer's weights (jit_weight): the array passed for it
        keeps its contents from call to call, so the CPU may keep a re-laid-out copy
        of it (made on the first call; again for another array). After writing new
        values into the same array, call weights_changed()."""
        return self._declare(_L.jit_weight, name, dtype, shape)

    def weights_changed(self):
        """The arrays passed for this graph's weights were written in place: the copies
        made from them are made again on the next call."""
        _L.jit_graph_weights_changed(self._handle())

    def scalar(self, value, dtype=float32):
        """A rank-0 constant that broadcasts against any tensor."""
        return self._value(_L.jit_scalar(self._handle(), float(value), _dl_dtype(dtype)),
                           _dtype_name(dtype))

    def output(self, *values):
        """Marks values as the next outputs, in order."""
        for v in values:
            _L.jit_output(self._handle(), self._v(v))
            self._output_dtypes.append(v.dtype)

    matmul = _binary("jit_matmul")
    add = _binary("jit_add")
    sub = _binary("jit_sub")
    mul = _binary("jit_mul")
    div = _binary("jit_div")
    maximum = _binary("jit_maximum")
    minimum = _binary("jit_minimum")
    pow = _binary("jit_pow")
    # Comparisons: 1 where they hold, else 0, in the operands' dtype.
    less = _binary("jit_less")
    less_equal = _binary("jit_less_equal")
    greater = _binary("jit_greater")
    greater_equal = _binary("jit_greater_equal")
    equal = _binary("jit_equal")
    not_equal = _binary("jit_not_equal")
    neg = _unary("jit_neg")
    exp = _unary("jit_exp")
    log = _unary("jit_log")
    tanh = _unary("jit_tanh")
    sigmoid = _unary("jit_sigmoid")
    relu = _unary("jit_relu")
    gelu = _unary("jit_gelu")
    sqrt = _unary("jit_sqrt")
    rsqrt = _unary("jit_rsqrt")
    erf = _unary("jit_erf")
    round = _unary("jit_round")
    gelu_erf = _unary("jit_gelu_erf")
    reduce_sum = _reduce("jit_reduce_sum")
    reduce_max = _reduce("jit_reduce_max")
    reduce_mean = _reduce("jit_reduce_mean")

    def softmax(self, x, axis=-1):
        return self._value(_L.jit_softmax(self._handle(), self._v(x), int(axis)), x.dtype)

    def gather(self, table, indices, axis=0):
        """numpy.take(table, indices, axis): along axis 0 an embedding lookup,
        result[i..., j...] = table[indices[i...], j...]; in general of shape
        table.shape[:axis] + indices.shape + table.shape[axis + 1:] and table's dtype.
        `indices` is int32/int64 (a graph input or a cast); a call raises
        INVALID_ARGUMENT, naming the index, for an input index outside [0, dim)."""
        if axis == 0:
            f = self._need("jit_gather")
            return self._value(f(self._handle(), self._v(table), self._v(indices)),
                               table.dtype)
        f = self._need("jit_gather_axis")
        return self._value(f(self._handle(), self._v(table), self._v(indices), int(axis)),
                           table.dtype)

    def _opt(self, v):
        return self._v(v) if v is not None else _lib.jit_value(0)

    def layer_norm(self, x, weight=None, bias=None, eps=1e-5):
        """(x - mean) / sqrt(var + eps) * weight + bias over the last axis."""
        return self._value(_L.jit_layer_norm(self._handle(), self._v(x), self._opt(weight),
                                             self._opt(bias), float(eps)), x.dtype)

    def rms_norm(self, x, weight=None, eps=1e-6):
        """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
        return self._value(_L.jit_rms_norm(self._handle(), self._v(x), self._opt(weight),
                                           float(eps)), x.dtype)

    def clamp(self, x, lo=float("-inf"), hi=float("inf")):
        """min(max(x, lo), hi)."""
        return self._value(_L.jit_clamp(self._handle(), self._v(x), float(lo), float(hi)),
                           x.dtype)

    def where(self, cond, a, b):
        """a where cond is nonzero (NaN counts as nonzero), else b, broadcasting all
        three. a or b may be a Python number (a scalar of cond's dtype), e.g.
        where(mask, x, float("-inf"))."""
        a, b = (v if isinstance(v, Value) else self.scalar(v, cond.dtype) for v in (a, b))
        return self._value(_L.jit_where(self._handle(), self._v(cond), self._v(a),
                                        self._v(b)), a.dtype)

    # -- sliding windows (jit_window_params) --
    def _window(self, op, layout, kernel=None, stride=1, padding=0, dilation=1, groups=1,
                count_include_pad=True):
        p = _lib.jit_window_params()
        _L.jit_window_params_init(ctypes.byref(p))
        key = layout.upper() if isinstance(layout, str) else layout
        if key not in _LAYOUTS:
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: %s: layout %r is not "
                           "'NCHW' or 'NHWC'" % (self.name, op, layout))
        p.layout = _LAYOUTS[key]
        if kernel is not None:
            p.kernel[:] = self._ints(op, "kernel", kernel, (2,))
        p.stride[:] = self._ints(op, "stride", stride, (2,))
        pad = self._ints(op, "padding", padding, (2, 4))
        p.padding[:] = pad if len(pad) == 4 else (pad[0], pad[0], pad[1], pad[1])
        p.dilation[:] = self._ints(op, "dilation", dilation, (2,))
        p.groups = self._ints(op, "groups", groups, ())[0]
        p.count_include_pad = 1 if count_include_pad else 0
        return p

    def _ints(self, op, what, v, lengths):
        # An int (repeated to lengths[0] entries) or a sequence of one of `lengths`.
        # Range checks are the library's; here only what would not survive the trip
        # into a C int (a float, 2**32 + 1).
        try:
            vals = [operator.index(v)] * (lengths[0] if lengths else 1)
        except TypeError:
            try:
                vals = [operator.index(i) for i in v]
            except TypeError:
                vals = None
            if vals is None or len(vals) not in lengths:
                raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: %s: %s must be "
                               "an int%s, got %r" % (self.name, op, what, "".join(
                                   " or %d ints" % n for n in lengths), v)) from None
        if any(not -2**31 <= i < 2**31 for i in vals):
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: %s: %s %r does not "
                           "fit a C int" % (self.name, op, what, v))
        return vals

    def conv2d(self, x, w, stride=1, padding=0, dilation=1, groups=1, layout="NCHW"):
        """2-D convolution (cross-correlation, as PyTorch), no bias. NCHW: x [N, C, H, W],
        w [F, C/groups, KH, KW]; NHWC: x [N, H, W, C], w [KH, KW, C/groups, F].
        stride, dilation: int or (h, w); padding (zeros): int, (h, w), or (top,
        bottom, left, right). Channels and w must be static; N, H, W may be symbols."""
        p = self._window("conv2d", layout, None, stride, padding, dilation, groups)
        return self._value(_L.jit_conv2d(self._handle(), self._v(x), self._v(w),
                                         ctypes.byref(p)), x.dtype)

    def max_pool2d(self, x, kernel, stride=None, padding=0, dilation=1, layout="NCHW"):
        """Max over kernel windows (int or (h, w)); stride defaults to kernel, as in
        PyTorch; padding as in conv2d, each side smaller than the kernel, never wins."""
        p = self._window("max_pool2d", layout, kernel, kernel if stride is None else stride,
                         padding, dilation)
        return self._value(_L.jit_max_pool2d(self._handle(), self._v(x), ctypes.byref(p)),
                           x.dtype)

    def avg_pool2d(self, x, kernel, stride=None, padding=0, count_include_pad=True,
                   layout="NCHW"):
        """Mean over kernel windows, like max_pool2d (no dilation). count_include_pad:
        padded positions count in the divisor (PyTorch's default); False: only the
        input positions do."""
        p = self._window("avg_pool2d", layout, kernel, kernel if stride is None else stride,
                         padding, count_include_pad=count_include_pad)
        return self._value(_L.jit_avg_pool2d(self._handle(), self._v(x), ctypes.byref(p)),
                           x.dtype)

    def transpose(self, x, perm):
        p = (ctypes.c_int * max(1, len(perm)))(*[int(i) for i in perm])
        return self._value(_L.jit_transpose(self._handle(), self._v(x), p), x.dtype)

    def reshape(self, x, shape):
        """New shape: ints, str symbols, and at most one -1."""
        dims = [self.symbol(d) if isinstance(d, str) else int(d) for d in shape]
        arr = (ctypes.c_int64 * max(1, len(dims)))(*dims)
        return self._value(_L.jit_reshape(self._handle(), self._v(x), len(dims), arr),
                           x.dtype)

    # -- joining, slicing, padding, casting --
    def _need(self, cname):
        # Prototypes added after jit_gather are optional (an older library still
        # loads); calling one it lacks says so.
        if getattr(_L, cname, None) is None:
            raise JitError(StatusCode.UNAVAILABLE,
                           "this libjitml (%s) has no %s" % (LIBRARY_PATH, cname))
        return getattr(_L, cname)

    def concat(self, values, axis=0):
        """Joins `values` (a sequence of Values of one dtype and rank) along `axis`
        (negative counts from the end); every other dim must be equal (symbols: equal
        at run time). The concat axis itself may be symbolic."""
        f = self._need("jit_concat")
        values = list(values)
        arr = (_lib.jit_value * max(1, len(values)))(*[self._v(v) for v in values])
        axis = self._ints("concat", "axis", axis, ())[0]
        if not values:
            # The library names the error; there is no first value to take a dtype from.
            self._value(f(self._handle(), arr, 0, axis), None)
        return self._value(f(self._handle(), arr, len(values), axis), values[0].dtype)

    def slice(self, x, axis, start=0, stop=None, step=1):
        """x[start:stop:step] along `axis`, as NumPy: negative bounds count from the
        end and are clamped to the dim; stop None (JIT_SLICE_END) runs to the end;
        step >= 1. The dim may be symbolic; a slice that is empty for a binding raises
        SHAPE_MISMATCH when the graph is called. A bound may follow a symbol (an
        input's dim): "S" is S's size in the binding, ("S", -1) that minus 1
        (jit_slice_symbolic), e.g. slice(cache, 0, stop="S") for cache[:S]."""
        axis = self._ints("slice", "axis", axis, ())[0]
        # Python ints are unbounded; NumPy's clamping makes any bound past int64 the
        # same as int64's limit, so clamp rather than let ctypes wrap it around.
        lim = lambda v: min(max(operator.index(v), -2**63), 2**63 - 1)

        def bound(v, default):
            if v is None:
                return 0, default
            if isinstance(v, str):
                return self.symbol(v), 0
            if isinstance(v, tuple):
                if len(v) != 2 or not isinstance(v[0], str):
                    raise TypeError("a symbolic slice bound is (symbol name, offset), got %r"
                                    % (v,))
                return self.symbol(v[0]), lim(v[1])
            return 0, lim(v)

        start_sym, start = bound(start, 0)
        stop_sym, stop = bound(stop, _lib.JIT_SLICE_END)
        if start_sym or stop_sym:
            f = self._need("jit_slice_symbolic")
            v = f(self._handle(), self._v(x), axis, start_sym, start, stop_sym, stop,
                  lim(step))
        else:
            f = self._need("jit_slice")
            v = f(self._handle(), self._v(x), axis, start, stop, lim(step))
        return self._value(v, x.dtype)

    def pad(self, x, low, high, value=0.0, mode="constant"):
        """Padding: low[d] elements before dim d and high[d] after (sequences of ints,
        one per dim of x; each in [0, 2^30]). mode "constant" fills with `value` (an
        infinity too: a max pool's padding); "reflect" mirrors x without repeating its
        edge (each pad below the dim's size); "replicate" repeats the edge element;
        "circular" wraps around (each pad at most the dim's size), as
        torch.nn.functional.pad's modes."""
        kinds = {"constant": 0, "reflect": 1, "replicate": 2, "circular": 3}
        if mode not in kinds:
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: pad: mode %r is not "
                           "one of %s" % (self.name, mode, ", ".join(kinds)))
        if mode == "constant":
            f = self._need("jit_pad")
        else:
            g = self._need("jit_pad_with")
            k = kinds[mode]

            def f(h, xv, lo, hi, val):
                return g(h, xv, lo, hi, k, val)
        sides = []
        for what, v in (("low", low), ("high", high)):
            try:
                vals = [operator.index(i) for i in v]
            except TypeError:
                raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: pad: %s must be "
                               "a sequence of ints, got %r" % (self.name, what, v)) from None
            sides.append(vals)
        if len(sides[0]) != len(sides[1]) or len(sides[0]) > _lib.JIT_MAX_RANK:
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: pad: low has %d "
                           "entries and high %d; both need one per dim of x (at most %d)"
                           % (self.name, len(sides[0]), len(sides[1]), _lib.JIT_MAX_RANK))
        n = len(sides[0])
        # The library reads rank(x) entries and the Python side does not know the rank:
        # fill the arrays to JIT_MAX_RANK with -1, which the library refuses, so a
        # short list is an error rather than a read past the end or a silent 0.
        arrs = [(ctypes.c_int64 * _lib.JIT_MAX_RANK)(
            *[min(max(i, -2**63), 2**63 - 1) for i in vals] +
            [-1] * (_lib.JIT_MAX_RANK - n)) for vals in sides]
        try:
            return self._value(f(self._handle(), self._v(x), arrs[0], arrs[1], float(value)),
                               x.dtype)
        except JitError as e:
            if "dim %d pads -1 before and -1 after" % n not in e.message:
                raise
            raise JitError(e.code, "%s (low and high have %d entries; pad takes one per "
                           "dim of x)" % (e.message, n)) from None

    def attention(self, q, k, v, mask=None, scale=0.0, causal=False):
        """softmax(q k^T * scale + mask) v over the keys: q [..., S, D], k [..., T, D],
        v [..., T, Dv] -> [..., S, Dv]. `mask` (optional) is added to the scores and
        broadcasts to [..., S, T]; `causal` lets query i see keys j <= i + T - S; scale
        0 means 1/sqrt(D). On the CPU's exact kernels the keys are walked in blocks
        with a running max and sum: the S x T scores are never made whole."""
        f = self._need("jit_attention")
        return self._value(f(self._handle(), self._v(q), self._v(k), self._v(v),
                             self._opt(mask), float(scale), 1 if causal else 0), q.dtype)

    def matmul_int8(self, a, b, a_scale, b_scale, a_zero=None, b_zero=None):
        """int8 x int8 products with int32 sums, dequantized to float32:
        ((a - a_zero) @ (b - b_zero)) * a_scale * b_scale, the sums exact. a [..., M, K]
        and b [K, N] are int8 graph inputs; a_scale is one float32 value, b_scale one
        value or one per column ([N]); a Python number becomes a float32 scalar. The
        zero points (asymmetric quantization) are int8 values, a_zero one, b_zero one
        or one per column; a Python int in [-128, 127] becomes an int8 scalar; None
        (both: symmetric) is zero."""
        sa, sb = (v if isinstance(v, Value) else self.scalar(v, float32)
                  for v in (a_scale, b_scale))
        if a_zero is None and b_zero is None:
            f = self._need("jit_matmul_int8")
            return self._value(f(self._handle(), self._v(a), self._v(b), self._v(sa),
                                 self._v(sb)), float32)
        for v in (a_zero, b_zero):
            if v is not None and not isinstance(v, Value) and not -128 <= int(v) <= 127:
                raise ValueError(f"matmul_int8: zero point {v} is not an int8 value")
        za, zb = (v if v is None or isinstance(v, Value)
                  else self.cast(self.scalar(float(v), float32), int8)
                  for v in (a_zero, b_zero))
        f = self._need("jit_matmul_int8_zp")
        return self._value(f(self._handle(), self._v(a), self._v(b), self._v(sa),
                             self._v(sb), self._opt(za), self._opt(zb)), float32)

    def cast(self, x, dtype):
        """x converted to `dtype` among float32, float16, bfloat16, int8, int32 and
        int64 (names as input() takes, or NumPy/torch dtypes): between floats,
        narrowing rounds to nearest even with overflow to inf and widening is exact;
        float to int truncates toward zero, saturates, NaN -> 0; int to float rounds to
        nearest even; int to int wraps. An integer result feeds gather, matmul_int8,
        another cast or an output. Other dtypes are passed to the library, which says
        UNSUPPORTED for them."""
        f = self._need("jit_cast")
        name = _dtype_name(dtype)
        return self._value(f(self._handle(), self._v(x), _any_dl_dtype(name)), name)

    def finalize(self):
        """Checks and freezes the graph; raises the first builder error. Returns self."""
        _check(_L.jit_graph_finalize(self._handle()))
        self._finalized = True
        return self

    @classmethod
    def from_mlir(cls, ctx, text, entry=None, name=None):
        """A finalized graph from MLIR text (jit_graph_from_mlir): the function `entry`
        (None: the only or first public func.func) of a module on ranked tensors."""
        _init()
        if getattr(_L, "jit_graph_from_mlir", None) is None:
            raise JitError(StatusCode.UNAVAILABLE,
                           "this libjitml (%s) has no jit_graph_from_mlir" % LIBRARY_PATH)
        data = text.encode() if isinstance(text, str) else bytes(text)
        ptr = ctypes.c_void_p()
        _check(_L.jit_graph_from_mlir(ctx._handle(), data, len(data),
                                      entry.encode() if entry else None,
                                      ctypes.byref(ptr)))
        g = cls(ctx, name or entry or "mlir", _ptr=ptr)
        n_in = _L.jit_graph_num_inputs(ptr)
        g._input_names = ["arg%d" % i for i in range(n_in)]
        g._input_dtypes = [None] * n_in
        g._output_dtypes = [None] * _L.jit_graph_num_outputs(ptr)
        g._finalized = True
        if getattr(_L, "jit_graph_output_info", None) is not None:
            # The result types say the dtypes: outputs are allocated directly (no copy
            # out of jit_run_alloc), and torch_op can give the graph a fake kernel.
            g._output_dtypes = [g.output_info(j)[0] for j in range(g.num_outputs)]
        return g

    def to_mlir(self):
        """The finalized graph as MLIR text (jit_graph_to_mlir)."""
        if getattr(_L, "jit_graph_to_mlir", None) is None:
            raise JitError(StatusCode.UNAVAILABLE, "this libjitml has no jit_graph_to_mlir")
        out = ctypes.c_void_p()
        _check(_L.jit_graph_to_mlir(self._handle(), ctypes.byref(out)))
        try:
            return ctypes.string_at(out.value).decode()
        finally:
            _L.jit_string_free(out)

    @property
    def num_inputs(self):
        return _L.jit_graph_num_inputs(self._handle())

    @property
    def num_outputs(self):
        return _L.jit_graph_num_outputs(self._handle())

    @property
    def input_names(self):
        return list(self._input_names)

    def _dims(self, rank, dims):
        out = []
        for d in dims[:rank]:
            if d == _lib.JIT_DIM_UNKNOWN:
                out.append(None)
            elif d < 0:
                out.append(_L.jit_symbol_name(self._handle(), d).decode())
            else:
                out.append(d)
        return tuple(out)

    def input_dims(self, i):
        """Input i's declared dims: ints, and symbol names (str) for symbolic dims
        (an MLIR graph's unnamed `?` dims have names made up by the library)."""
        info = _lib.jit_input_info()
        _check(_L.jit_graph_input_info(self._handle(), i, ctypes.byref(info)))
        return self._dims(info.rank, info.dims)

    def output_info(self, j):
        """(dtype name, dims) of output j before any binding (finalized graphs): dims
        are ints, symbol names (str) where the dim is exactly an input's symbol, and
        None where it is derived (concat N + M, a convolution's rows) and only
        output_shapes() gives it."""
        if getattr(_L, "jit_graph_output_info", None) is None:
            raise JitError(StatusCode.UNAVAILABLE,
                           "this libjitml (%s) has no jit_graph_output_info" % LIBRARY_PATH)
        info = _lib.jit_output_info()
        _check(_L.jit_graph_output_info(self._handle(), j, ctypes.byref(info)))
        dtype = _FROM_DL.get((info.dtype.code, info.dtype.bits))
        return dtype, self._dims(info.rank, info.dims)

    # -- running --
    def output_shapes(self, *arrays):
        """The output shapes (tuples) for these inputs (arrays, tensors or
        jitml.TensorSpec(shape, dtype)) by jit_output_shape; compiles nothing."""
        with _Inputs(self, arrays) as ins:
            return [self._shape(ins, j) for j in range(self.num_outputs)]

    def _shape(self, ins, j):
        rank = ctypes.c_int()
        dims = (ctypes.c_int64 * _lib.JIT_MAX_RANK)()
        _check(_L.jit_output_shape(self._handle(), ins.array, ins.n, j,
                                   ctypes.byref(rank), dims))
        return tuple(dims[i] for i in range(rank.value))

    def __call__(self, *arrays, out=None):
        """Runs the graph. Returns one array for one output, else a tuple.

        out: the output array (or a tuple of them, one per output) to write instead of
        allocating: dense, of the output's shape and dtype (a NumPy uint16 array for
        a bfloat16 output), NumPy or torch; the same objects are returned. A loop that
        passes out= allocates nothing per call.

        A call whose inputs have the type, dtype, shape and strides of an earlier
        successful call on this thread skips the Python-side checks and the shape
        function (see jitml._fastcall); the library checks every call."""
        outs = _fastcall.call(self, arrays, out, self._run_views)
        if outs is None:
            outs = self._call_full(arrays, out)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_views(self, ins, n_in, outs, n_out, cuda_stream=None):
        if cuda_stream is None:
            _check(_L.jit_run(self._handle(), ins, n_in, outs, n_out))
            return
        if getattr(_L, "jit_run_ex", None) is None:
            raise JitError(StatusCode.UNAVAILABLE, "this libjitml (%s) cannot run on a "
                           "caller's CUDA stream (no jit_run_ex)" % LIBRARY_PATH)
        o = _lib.jit_run_options(ctypes.sizeof(_lib.jit_run_options), cuda_stream)
        _check(_L.jit_run_ex(self._handle(), ins, n_in, outs, n_out, ctypes.byref(o)))

    def _call_full(self, arrays, out):
        with _Inputs(self, arrays) as ins:
            n_out = self.num_outputs
            if any(d is None for d in self._output_dtypes):
                if out is not None:
                    raise JitError(StatusCode.INVALID_ARGUMENT,
                                   "graph `%s`: out= needs the output dtypes, which a "
                                   "graph from MLIR knows after its first call"
                                   % self.name)
                return self._run_alloc(ins, n_out)
            shapes = [self._shape(ins, j) for j in range(n_out)]
            dtypes = self._output_dtypes
            if out is None:
                outs = [ins.empty(s, d) for s, d in zip(shapes, dtypes)]
            else:
                outs = self._check_out(out, shapes, dtypes, ins.torch_device)
            views = (_lib.DLTensor * max(1, n_out))()
            keep = []
            for j, (o, s) in enumerate(zip(outs, shapes)):
                views[j], k = _view_of_output(o, s, dtypes[j])
                keep.append(k)
            self._run_views(ins.array, ins.n, views, n_out, ins.cuda_stream)
            if not ins.copied and ins.cuda_stream is None:
                _fastcall.remember(self, arrays, list(ins.array)[:ins.n], shapes,
                                   [_DL[d] for d in dtypes],
                                   [_maker(ins.kind, s, d) for s, d in zip(shapes, dtypes)])
        return outs

    def _check_out(self, out, shapes, dtypes, device=None):
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(shapes):
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s` has %d outputs, out= "
                           "has %d" % (self.name, len(shapes), len(outs)))
        for j, (o, s, d) in enumerate(zip(outs, shapes, dtypes)):
            if _is_torch(o):
                ok_dtype = _dtype_name(o.dtype) == d
                dense = o.is_contiguous()
                cpu = o.device == device if device is not None else o.device.type == "cpu"
            elif type(o).__module__ == "numpy" and type(o).__name__ == "ndarray":
                ok_dtype = o.dtype.name == _NUMPY_STORAGE.get(d, d)
                dense, cpu = o.flags.c_contiguous and o.flags.writeable, True
            else:
                raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s`: out[%d] is a %s; "
                               "pass a NumPy array or a torch tensor"
                               % (self.name, j, type(o).__name__))
            if not ok_dtype or tuple(o.shape) != tuple(s):
                raise JitError(StatusCode.SHAPE_MISMATCH if ok_dtype else
                               StatusCode.DTYPE_MISMATCH,
                               "graph `%s`: out[%d] is %s %s; this call writes %s %s"
                               % (self.name, j, tuple(o.shape), o.dtype, s, d))
            if not dense or not cpu:
                raise JitError(StatusCode.UNSUPPORTED, "graph `%s`: out[%d] must be a "
                               "dense, writable array on the inputs' device"
                               % (self.name, j))
        return outs

    def _run_alloc(self, ins, n_out):
        # Output dtypes unknown (a graph from MLIR; the C API has no dtype query): let
        # jit_run_alloc allocate, copy once into arrays of our kind, and remember the
        # dtypes so that later calls allocate directly (no copy).
        ptrs = (ctypes.POINTER(_lib.DLManagedTensor) * max(1, n_out))()
        _check(_L.jit_run_alloc(self._handle(), ins.array, ins.n, ptrs, n_out))
        outs = []
        try:
            for j in range(n_out):
                t = ptrs[j].contents.dl_tensor
                dtype = _FROM_DL[(t.dtype.code, t.dtype.bits)]
                shape = tuple(t.shape[i] for i in range(t.ndim))
                a = ins.empty(shape, dtype)
                if _is_torch(a):
                    dst, nbytes = a.data_ptr(), a.numel() * a.element_size()
                else:
                    dst, nbytes = a.ctypes.data, a.nbytes
                if nbytes:
                    ctypes.memmove(dst, t.data + t.byte_offset, nbytes)
                self._output_dtypes[j] = dtype
                outs.append(a)
        finally:
            for j in range(n_out):
                if ptrs[j]:
                    ptrs[j].contents.deleter(ptrs[j])
        return outs


# --- Tensors in and out ----------------------------------------------------------------


class TensorSpec:
    """A shape and dtype standing in for an input of Graph.output_shapes (no data)."""

    def __init__(self, shape, dtype):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = _dtype_name(dtype)


def _is_torch(x):
    mod = type(x).__module__
    return mod.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


class _Inputs:
    """DLTensor views of the call's inputs, built through DLPack without copying. Keeps
    every capsule (and so every array) alive until the call has returned."""

    def __init__(self, graph, arrays):
        self.g = graph
        self.arrays = arrays

    def __enter__(self):
        g, arrays = self.g, self.arrays
        n = g.num_inputs
        if len(arrays) != n:
            raise JitError(StatusCode.INVALID_ARGUMENT, "graph `%s` takes %d inputs, got %d"
                           % (g.name, n, len(arrays)))
        self.n = n
        self.kind = "torch" if arrays and _is_torch(arrays[0]) else "numpy"
        self.array = (_lib.DLTensor * max(1, n))()
        self.keep = []  # capsules, arrays and shape buffers alive during the call
        self.copied = False  # an input was copied (the fast path must not take it)
        self.cuda_stream = None  # torch CUDA inputs: the current stream of their device
        self.torch_device = None  # where torch outputs go
        for i, a in enumerate(arrays):
            self.array[i] = self._view(i, a)
        return self

    def __exit__(self, *exc):
        self.keep = None
        self.array = None

    def _name(self, i):
        names = self.g._input_names
        return "input %d `%s`" % (i, names[i]) if i < len(names) else "input %d" % i

    def _view(self, i, a):
        if isinstance(a, TensorSpec):
            self._check_dtype(i, a.dtype, lambda want: "TensorSpec(shape, %r)" % want)
            return self._raw_view(None, a.shape, a.dtype, None)
        if _is_torch(a):
            return self._torch_view(i, a)
        import numpy
        if not isinstance(a, numpy.ndarray) and hasattr(a, "__dlpack_device__") and \
                hasattr(a, "__dlpack__"):
            return self._dlpack_view(i, a)
        if not isinstance(a, numpy.ndarray):
            if numpy.isscalar(a) or isinstance(a, (list, tuple)):
                raise JitError(StatusCode.INVALID_ARGUMENT,
                               "graph `%s`: %s is a %s; pass a NumPy array or a torch "
                               "tensor" % (self.g.name, self._name(i), type(a).__name__))
            a = numpy.asarray(a)  # another __array__ provider
        name = a.dtype.name
        if name == "uint16" and self._want(i) == bfloat16:
            name = bfloat16  # bf16 bit patterns: NumPy has no bfloat16 dtype
        self._check_dtype(i, name, _numpy_fix)
        if not a.flags.c_contiguous or any(s < 0 for s in a.strides):
            warnings.warn("jitml: graph `%s`: %s is not dense row-major (strides %s); "
                          "copying it" % (self.g.name, self._name(i), a.strides),
                          CopyWarning, stacklevel=4)
            a = numpy.ascontiguousarray(a)
            self.copied = True
        if not a.dtype.isnative:
            raise JitError(StatusCode.UNSUPPORTED, "graph `%s`: %s has non-native byte "
                           "order" % (self.g.name, self._name(i)))
        if a.flags.writeable:
            v = self._capsule_view(a.__dlpack__(), a)
            if name == a.dtype.name:
                return v
            # A new struct, not v.dtype = ...: v shares the memory of NumPy's own
            # DLManagedTensor, which must go on saying uint16.
            code, bits = _DL[name]
            return _lib.DLTensor(v.data, v.device, v.ndim, _lib.DLDataType(code, bits, 1),
                                 v.shape, v.strides, v.byte_offset)
        # NumPy refuses to export read-only arrays through DLPack 0.6 (it cannot flag
        # them read-only). libjitml never writes inputs, so describe the same memory
        # directly through the array interface: still no copy.
        return self._raw_view(a.ctypes.data, a.shape, name, a)

    def _dlpack_view(self, i, a):
        # Any other DLPack producer (JAX, CuPy, TensorFlow, ...): its capsule, read in
        # place. CPU arrays only for now; outputs are NumPy arrays.
        dev = a.__dlpack_device__()
        if int(dev[0]) != _lib.kDLCPU:
            raise JitError(StatusCode.UNSUPPORTED,
                           "graph `%s`: %s is a %s on DLPack device type %d; libjitml takes "
                           "CPU arrays from DLPack producers (GPU: torch CUDA tensors)"
                           % (self.g.name, self._name(i), type(a).__name__, int(dev[0])))
        v = self._capsule_view(a.__dlpack__(), a)
        name = _FROM_DL.get((v.dtype.code, v.dtype.bits)) if v.dtype.lanes == 1 else None
        self._check_dtype(i, name or "dlpack(code %d, bits %d)" % (v.dtype.code, v.dtype.bits),
                          lambda want: "x.astype(%s)" % want)
        return v

    def _torch_view(self, i, t):
        import torch.utils.dlpack
        if t.device.type not in ("cpu", "cuda"):
            raise JitError(StatusCode.UNSUPPORTED,
                           "graph `%s`: %s is on device %s; libjitml runs CPU and CUDA "
                           "tensors" % (self.g.name, self._name(i), t.device))
        if i == 0:
            self.torch_device = t.device
            if t.device.type == "cuda":
                # The run goes on the stream PyTorch queues this device's work on, so
                # kernels that write the inputs finish first (jit_run_ex).
                import torch.cuda
                self.cuda_stream = torch.cuda.current_stream(t.device).cuda_stream
        elif t.device != (self.torch_device or t.device.__class__("cpu")):
            raise JitError(StatusCode.INVALID_ARGUMENT,
                           "graph `%s`: %s is on %s but input 0 is on %s; all inputs of a "
                           "call must be on one device"
                           % (self.g.name, self._name(i), t.device, self.torch_device))
        self._check_dtype(i, _dtype_name(t.dtype), lambda want: "x.to(torch.%s)" % want)
        t = t.detach()  # no copy; DLPack refuses tensors that require grad
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
            self.copied = True
        if not t.is_contiguous():
            self.copied = True
            warnings.warn("jitml: graph `%s`: %s is not contiguous (strides %s); copying "
                          "it" % (self.g.name, self._name(i), tuple(t.stride())),
                          CopyWarning, stacklevel=5)
            t = t.contiguous()
        v = self._capsule_view(torch.utils.dlpack.to_dlpack(t), t)
        # Dense row-major (checked above), so strides NULL says so. An empty tensor is
        # the reason: torch exports strides that are not the dense ones ((1, 0) for a
        # (0, 4) tensor) and a NULL data pointer, both of which libjitml refuses though
        # nothing is read.
        return _lib.DLTensor(_non_null(v.data, self.keep), v.device, v.ndim, v.dtype,
                             v.shape, None, v.byte_offset)

    def _want(self, i):
        # The dtype the graph declares for input i; None where unknown (from MLIR).
        return self.g._input_dtypes[i] if i < len(self.g._input_dtypes) else None

    def _check_dtype(self, i, name, fix):
        # `fix(dtype)`: how to convert an input to `dtype`, for the message.
        want = self._want(i)
        if name not in _DL:
            raise JitError(StatusCode.DTYPE_MISMATCH,
                           "graph `%s`: %s has dtype %s; libjitml takes float32, float16 "
                           "or bfloat16 (int32 or int64 for gather's indices)%s (convert "
                           "it, e.g. %s)%s"
                           % (self.g.name, self._name(i), name,
                              "" if want is None else ", and this input is %s" % want,
                              fix(want or float32),
                              _UINT16_NOTE if name == "uint16" else ""))
        if want is not None and name != want:
            raise JitError(StatusCode.DTYPE_MISMATCH, "graph `%s`: %s has dtype %s but "
                           "the graph declares %s (convert it, e.g. %s)"
                           % (self.g.name, self._name(i), name, want, fix(want)))

    def _capsule_view(self, capsule, owner):
        # Read the DLManagedTensor* without consuming the capsule: it stays named
        # "dltensor", so its destructor (when `keep` drops it) calls the deleter.
        mt = _lib.capsule_tensor(capsule)
        self.keep.append((capsule, owner))
        return mt.contents.dl_tensor  # a copy of the struct; its pointers stay valid

    def _raw_view(self, data, shape, dtype, owner):
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self.keep.append((dims, owner))
        code, bits = _DL[dtype]
        return _lib.DLTensor(data, _lib.DLDevice(_lib.kDLCPU, 0), len(shape),
                             _lib.DLDataType(code, bits, 1), dims, None, 0)

    def empty(self, shape, dtype):
        """An output of graph dtype `dtype`: a torch tensor of that dtype when the first
        input is a torch tensor, else a NumPy array (bfloat16: uint16 bit patterns)."""
        if self.torch_device is not None and self.torch_device.type != "cpu":
            import torch
            return torch.empty(shape, dtype=getattr(torch, dtype), device=self.torch_device)
        return ins_empty(self.kind, shape, dtype)


def _maker(kind, shape, dtype):
    """A function of no arguments making what ins_empty(kind, shape, dtype) makes."""
    if kind == "torch":
        import torch
        return functools.partial(torch.empty, shape, dtype=getattr(torch, dtype))
    import numpy
    return functools.partial(numpy.empty, shape, dtype=_NUMPY_STORAGE.get(dtype, dtype))


def ins_empty(kind, shape, dtype):
    """_Inputs.empty for a call whose first input is of `kind` ("torch" / "numpy")."""
    return _maker(kind, shape, dtype)()


def _numpy_fix(want):
    if want == bfloat16:
        return ("jitml.to_bfloat16_bits(x): NumPy holds bf16 as uint16 bit patterns; "
                "or pass a torch.bfloat16 tensor, or declare float32 and Graph.cast")
    return "x.astype(numpy.%s)" % want


_UINT16_NOTE = ("; a uint16 array is taken as bf16 bit patterns only for an input the "
                "graph declares bfloat16")


def _non_null(ptr, keep):
    """`ptr`, or for an empty torch tensor (data NULL) a byte that nothing reads or
    writes, kept alive in `keep`: libjitml wants data even with no elements."""
    if ptr:
        return ptr
    byte = ctypes.c_char()
    keep.append(byte)
    return ctypes.addressof(byte)


def _view_of_output(o, shape, dtype):
    """A DLTensor over an output we allocated (dense, writable), and what to keep."""
    dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    keep = [dims]
    device = _lib.DLDevice(_lib.kDLCPU, 0)
    if _is_torch(o) and o.device.type == "cuda":
        device = _lib.DLDevice(_lib.kDLCUDA, o.device.index or 0)
    ptr = _non_null(o.data_ptr() if _is_torch(o) else o.ctypes.data, keep)
    code, bits = _DL[dtype]
    t = _lib.DLTensor(ptr, device, len(shape), _lib.DLDataType(code, bits, 1), dims, None, 0)
    return t, keep
