"""The call fast path of Graph.__call__.

The first call of a graph with inputs of some (type, dtype, shape, strides, device)
goes the whole way (_core._Inputs): dtype and layout checks, DLPack views, the shape
function for the outputs. When it succeeds with dense inputs, what it found is kept
here under that signature: DLTensor arrays with the shapes filled in, the output
shapes and dtypes. A later call with the same signature only writes the data pointers
into those arrays, allocates the outputs (or takes `out=`) and calls jit_run once; the
library still checks the binding itself, so a wrong call fails the same way.

Entries are per thread (the arrays are written on each call) and per graph, at most
_MAX_ENTRIES of them (then the oldest goes). Inputs with no elements are never cached
(their data pointers may be NULL, which the full path deals with).
"""

import ctypes
import sys
import threading

from . import _lib

_MAX_ENTRIES = 64
_NUMPY, _TORCH = 1, 2
_KINDS = {}  # type -> _NUMPY, _TORCH or 0 (anything else: the full path)


def _kind_of(t):
    k = _KINDS.get(t)
    if k is None:
        mod, name = t.__module__, t.__name__
        k = (_NUMPY if mod == "numpy" and name == "ndarray" else
             _TORCH if mod.startswith("torch") and name in ("Tensor", "Parameter") else 0)
        _KINDS[t] = k
    return k


def signature(arrays):
    """A hashable key of everything the checks and the shape function read, or None
    where the fast path does not apply (TensorSpec, lists, other array types)."""
    key = []
    for a in arrays:
        k = _kind_of(type(a))
        if k == _NUMPY:
            key.append((a.dtype, a.shape, a.strides))
        elif k == _TORCH:
            key.append((a.dtype, a.shape, a.stride(), a.device))
        else:
            return None
    return tuple(key)


# A NumPy array's data pointer. a.ctypes.data costs ~1 us (it builds an object), a
# fifth of a small graph's whole call with five inputs; the pointer itself is the
# first field after the object header of NumPy's array struct (PyArrayObject_fields,
# the layout NumPy's C ABI has kept from 1.x through 2.x), read directly. The offset is
# checked against a.ctypes.data on a sample array the first time; where it does not
# hold (another Python implementation, a free-threaded build) a.ctypes.data it is.
_HEADER = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
_at = ctypes.c_void_p.from_address
_numpy_direct = None


def _numpy_ptr_direct(a):
    return _at(id(a) + _HEADER).value


def _numpy_ptr_ctypes(a):
    return a.ctypes.data


def _numpy_ptr(a):
    global _numpy_ptr, _numpy_direct
    if _numpy_direct is None:
        import numpy
        sample = numpy.arange(4.0)[1:]
        _numpy_direct = (hasattr(sys, "getrefcount") and
                         _at(id(sample) + _HEADER).value == sample.ctypes.data)
        _numpy_ptr = _numpy_ptr_direct if _numpy_direct else _numpy_ptr_ctypes
    return _numpy_ptr(a)


def _getter(a):
    """The data-pointer function for arrays of a's kind."""
    if _kind_of(type(a)) == _TORCH:
        return type(a).data_ptr
    _numpy_ptr(a)  # settles which one
    return _numpy_ptr


def _ptr(a):
    return a.data_ptr() if _kind_of(type(a)) == _TORCH else _numpy_ptr(a)


class _Entry:
    __slots__ = ("ins", "in_items", "getters", "outs", "out_items", "makers", "out_keys",
                 "keep")

    def __init__(self, arrays, in_views, out_shapes, out_dtypes, makers, out_keys):
        n, m = len(in_views), len(out_shapes)
        self.keep = []
        self.ins = (_lib.DLTensor * max(1, n))()
        for i, v in enumerate(in_views):
            dims = (ctypes.c_int64 * max(1, v.ndim))(*[v.shape[d] for d in range(v.ndim)])
            self.keep.append(dims)
            self.ins[i] = _lib.DLTensor(None, v.device, v.ndim, v.dtype, dims, None, 0)
        self.in_items = [self.ins[i] for i in range(n)]  # share the array's memory
        self.getters = [_getter(a) for a in arrays]
        self.outs = (_lib.DLTensor * max(1, m))()
        for j, (shape, (code, bits)) in enumerate(zip(out_shapes, out_dtypes)):
            dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            self.keep.append(dims)
            self.outs[j] = _lib.DLTensor(None, _lib.DLDevice(_lib.kDLCPU, 0), len(shape),
                                         _lib.DLDataType(code, bits, 1), dims, None, 0)
        self.out_items = [self.outs[j] for j in range(m)]
        self.makers = makers      # makers[j]() -> a new output j
        self.out_keys = out_keys  # signature() of acceptable out= arrays


def _cache(graph):
    tls = graph._tls
    c = getattr(tls, "entries", None)
    if c is None:
        c = tls.entries = {}
    return c


def new_local():
    return threading.local()


def remember(graph, arrays, in_views, out_shapes, out_dtypes, makers):
    """Keeps what a successful full call found for `arrays` (dense, as passed)."""
    key = signature(arrays)
    if key is None or any(0 in s for s in out_shapes):
        return
    for v in in_views:
        for d in range(v.ndim):
            if v.shape[d] == 0:
                return
    c = _cache(graph)
    if len(c) >= _MAX_ENTRIES:
        c.pop(next(iter(c)))
    out_keys = signature([make() for make in makers])
    c[key] = _Entry(arrays, in_views, out_shapes, out_dtypes, makers, out_keys)
    graph._tls.last = (key, c[key])


def call(graph, arrays, out, run):
    """The outputs of the call, or None when the full path must take it (a signature
    not seen yet on this thread, or an `out=` that does not match the cached one)."""
    key = signature(arrays)
    if key is None:
        return None
    tls = graph._tls
    last = getattr(tls, "last", None)
    # The last signature first: comparing tuples stops at identical objects (NumPy's
    # dtypes are), while a dict lookup hashes every dtype.
    if last is not None and last[0] == key:
        e = last[1]
    else:
        c = getattr(tls, "entries", None)
        e = c.get(key) if c else None
        if e is None:
            return None
        tls.last = (key, e)
    if out is None:
        outs = [make() for make in e.makers]
    else:
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(e.out_items) or signature(outs) != e.out_keys:
            return None  # the full path says what is wrong
    for item, get, a in zip(e.in_items, e.getters, arrays):
        item.data = get(a)
    for item, o in zip(e.out_items, outs):
        item.data = _ptr(o)
    run(e.ins, len(e.in_items), e.outs, len(e.out_items))
    return outs
