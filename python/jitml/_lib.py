"""ctypes bindings of include/jitml.h: the structs, the library lookup, the prototypes.

Everything here mirrors the C header one to one; the Pythonic layer is in _core.py.
"""

import ctypes
import ctypes.util
import os

# --- DLPack v0.6 (Debian's dlpack.h, DLPACK_VERSION 60) -----------------------------

kDLCPU = 1
kDLCUDA = 2
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensorDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLManagedTensorDeleter),
]

# --- jitml.h -------------------------------------------------------------------------

JIT_MAX_RANK = 8
JIT_SLICE_END = 2**63 - 1  # INT64_MAX: jit_slice's stop "to the end"


class jit_value(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32)]


jit_log_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class jit_options(ctypes.Structure):
    # Only the fields this package sets. The struct grows at its end (struct_size), so
    # the offsets of these never change; jit_options_init fills a larger buffer.
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("opt_level", ctypes.c_int),
        ("num_threads", ctypes.c_int),
        ("log_fn", ctypes.c_void_p),
        ("log_user_data", ctypes.c_void_p),
        ("log_level", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
    ]


class jit_stats(ctypes.Structure):
    # jitml.h's jit_stats in order (it grows at its end: struct_size says how much of
    # it the library fills; an older library leaves the rest 0).
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_double if name.endswith("_ms") else ctypes.c_uint64)
        for name in (
            "runs", "memory_hits", "misses", "compiles", "compile_ms", "kernels",
            "disk_hits", "load_ms", "bytes_written", "bytes_read", "evictions",
            "bad_entries", "cuda_cubin_loads", "cuda_ptx_loads", "generic_runs",
            "generic_compiles", "specializations", "specialization_failures",
            "specializations_pending", "kernels_unloaded", "remote_hits",
            "remote_misses", "remote_errors", "remote_skipped", "remote_rejected",
            "remote_puts", "remote_puts_dropped", "remote_bytes_read",
            "remote_bytes_written", "weight_packs")
    ]


# jit_layout
JIT_LAYOUT_NCHW = 0
JIT_LAYOUT_NHWC = 1


class jit_window_params(ctypes.Structure):
    # jitml.h's jit_window_params field for field: 13 ints, 52 bytes (no struct_size:
    # it is passed by pointer and read whole). Fill with jit_window_params_init.
    _fields_ = [
        ("layout", ctypes.c_int),  # jit_layout, an int-sized enum
        ("kernel", ctypes.c_int * 2),
        ("stride", ctypes.c_int * 2),
        ("padding", ctypes.c_int * 4),
        ("dilation", ctypes.c_int * 2),
        ("groups", ctypes.c_int),
        ("count_include_pad", ctypes.c_int),
    ]


JIT_DIM_UNKNOWN = -2**63  # INT64_MIN: an output dim that only a binding gives


class jit_input_info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", DLDataType), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * JIT_MAX_RANK)]


class jit_output_info(ctypes.Structure):
    _fields_ = [("dtype", DLDataType), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * JIT_MAX_RANK)]


class jit_run_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("cuda_stream", ctypes.c_void_p)]


jit_status = ctypes.c_void_p
c_graph_p = ctypes.c_void_p
c_ctx_p = ctypes.c_void_p


def _candidates():
    env = os.environ.get("JITML_LIBRARY")
    if env:
        # An explicit choice: only that file, so a wrong path is an error, not a
        # silent fallback to another copy.
        return [env], True
    out = []
    here = os.path.dirname(os.path.abspath(__file__))
    # The pip-installed package carries its own build (pyproject.toml): jitml/lib/.
    out.append(os.path.join(here, "lib", "libjitml.so"))
    # A source checkout: python/jitml/ next to build/ (scripts/build.sh's BUILD_DIR).
    root = os.path.dirname(os.path.dirname(here))
    build_dir = os.environ.get("BUILD_DIR", "build")
    out.append(os.path.join(root, build_dir, "libjitml.so"))
    if build_dir != "build":
        out.append(os.path.join(root, "build", "libjitml.so"))
    # The system loader: an installed libjitml (ldconfig, LD_LIBRARY_PATH).
    found = ctypes.util.find_library("jitml")
    out.append(found or "libjitml.so.0")
    return out, False


def load():
    paths, explicit = _candidates()
    errors = []
    for p in paths:
        if os.sep in p and not os.path.exists(p):
            errors.append("%s: no such file" % p)
            continue
        try:
            return _prototypes(ctypes.CDLL(p)), p
        except OSError as e:
            errors.append("%s: %s" % (p, e))
    hint = ("JITML_LIBRARY=%s" % paths[0]) if explicit else (
        "build it (scripts/build.sh) or set JITML_LIBRARY=/path/to/libjitml.so")
    raise ImportError("jitml: cannot load libjitml (%s); tried: %s"
                      % (hint, "; ".join(errors)))


def _fn(lib, name, restype, argtypes, required=True):
    try:
        f = getattr(lib, name)
    except AttributeError:
        if required:
            raise
        return None
    f.restype = restype
    f.argtypes = argtypes
    return f


def _prototypes(lib):
    P = ctypes.POINTER
    i64p = P(ctypes.c_int64)
    _fn(lib, "jit_status_get_code", ctypes.c_int, [jit_status])
    _fn(lib, "jit_status_message", ctypes.c_char_p, [jit_status])
    _fn(lib, "jit_status_code_name", ctypes.c_char_p, [ctypes.c_int])
    _fn(lib, "jit_status_free", None, [jit_status])
    _fn(lib, "jit_version", ctypes.c_char_p, [])
    _fn(lib, "jit_options_init", None, [ctypes.c_void_p])
    _fn(lib, "jit_context_create", jit_status, [ctypes.c_void_p, P(c_ctx_p)])
    _fn(lib, "jit_context_destroy", None, [c_ctx_p])
    _fn(lib, "jit_context_stats", jit_status, [c_ctx_p, P(jit_stats)])
    _fn(lib, "jit_graph_create", jit_status, [c_ctx_p, ctypes.c_char_p, P(c_graph_p)])
    _fn(lib, "jit_graph_destroy", None, [c_graph_p])
    _fn(lib, "jit_symbol", ctypes.c_int64, [c_graph_p, ctypes.c_char_p])
    _fn(lib, "jit_input", jit_value,
        [c_graph_p, ctypes.c_char_p, DLDataType, ctypes.c_int, i64p])
    _fn(lib, "jit_weight", jit_value,
        [c_graph_p, ctypes.c_char_p, DLDataType, ctypes.c_int, i64p])
    _fn(lib, "jit_graph_weights_changed", None, [c_graph_p])
    _fn(lib, "jit_output", None, [c_graph_p, jit_value])
    _fn(lib, "jit_scalar", jit_value, [c_graph_p, ctypes.c_double, DLDataType])
    for name in ("matmul", "add", "sub", "mul", "div", "maximum", "minimum", "pow",
                 "less", "less_equal", "greater", "greater_equal", "equal", "not_equal"):
        _fn(lib, "jit_" + name, jit_value, [c_graph_p, jit_value, jit_value])
    _fn(lib, "jit_where", jit_value, [c_graph_p, jit_value, jit_value, jit_value])
    for name in ("neg", "exp", "log", "tanh", "sigmoid", "relu", "gelu", "sqrt", "rsqrt",
                 "erf", "gelu_erf", "round"):
        _fn(lib, "jit_" + name, jit_value, [c_graph_p, jit_value])
    for name in ("reduce_sum", "reduce_max", "reduce_mean"):
        _fn(lib, "jit_" + name, jit_value, [c_graph_p, jit_value, ctypes.c_int, ctypes.c_int])
    _fn(lib, "jit_softmax", jit_value, [c_graph_p, jit_value, ctypes.c_int])
    _fn(lib, "jit_layer_norm", jit_value,
        [c_graph_p, jit_value, jit_value, jit_value, ctypes.c_double])
    _fn(lib, "jit_rms_norm", jit_value, [c_graph_p, jit_value, jit_value, ctypes.c_double])
    _fn(lib, "jit_clamp", jit_value, [c_graph_p, jit_value, ctypes.c_double, ctypes.c_double])
    _fn(lib, "jit_window_params_init", None, [P(jit_window_params)])
    _fn(lib, "jit_conv2d", jit_value, [c_graph_p, jit_value, jit_value, P(jit_window_params)])
    for name in ("max_pool2d", "avg_pool2d"):
        _fn(lib, "jit_" + name, jit_value, [c_graph_p, jit_value, P(jit_window_params)])
    _fn(lib, "jit_transpose", jit_value, [c_graph_p, jit_value, P(ctypes.c_int)])
    _fn(lib, "jit_reshape", jit_value, [c_graph_p, jit_value, ctypes.c_int, i64p])
    _fn(lib, "jit_graph_finalize", jit_status, [c_graph_p])
    _fn(lib, "jit_graph_num_inputs", ctypes.c_int, [c_graph_p])
    _fn(lib, "jit_graph_num_outputs", ctypes.c_int, [c_graph_p])
    _fn(lib, "jit_graph_input_info", jit_status, [c_graph_p, ctypes.c_int, P(jit_input_info)])
    _fn(lib, "jit_symbol_name", ctypes.c_char_p, [c_graph_p, ctypes.c_int64])
    _fn(lib, "jit_graph_output_info", jit_status,
        [c_graph_p, ctypes.c_int, P(jit_output_info)], required=False)
    _fn(lib, "jit_output_shape", jit_status,
        [c_graph_p, P(DLTensor), ctypes.c_int, ctypes.c_int, P(ctypes.c_int), i64p])
    _fn(lib, "jit_run", jit_status,
        [c_graph_p, P(DLTensor), ctypes.c_int, P(DLTensor), ctypes.c_int])
    _fn(lib, "jit_run_ex", jit_status,
        [c_graph_p, P(DLTensor), ctypes.c_int, P(DLTensor), ctypes.c_int,
         P(jit_run_options)], required=False)
    _fn(lib, "jit_run_alloc", jit_status,
        [c_graph_p, P(DLTensor), ctypes.c_int, P(P(DLManagedTensor)), ctypes.c_int])
    # Declared in jitml.h but possibly not in an older or in-progress library.
    _fn(lib, "jit_graph_from_mlir", jit_status,
        [c_ctx_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, P(c_graph_p)],
        required=False)
    _fn(lib, "jit_graph_to_mlir", jit_status, [c_graph_p, P(ctypes.c_void_p)],
        required=False)
    _fn(lib, "jit_string_free", None, [ctypes.c_void_p], required=False)
    _fn(lib, "jit_gather", jit_value, [c_graph_p, jit_value, jit_value], required=False)
    _fn(lib, "jit_gather_axis", jit_value, [c_graph_p, jit_value, jit_value, ctypes.c_int],
        required=False)
    _fn(lib, "jit_matmul_int8", jit_value,
        [c_graph_p, jit_value, jit_value, jit_value, jit_value], required=False)
    _fn(lib, "jit_matmul_int8_zp", jit_value,
        [c_graph_p, jit_value, jit_value, jit_value, jit_value, jit_value, jit_value],
        required=False)
    _fn(lib, "jit_attention", jit_value,
        [c_graph_p, jit_value, jit_value, jit_value, jit_value, ctypes.c_double, ctypes.c_int],
        required=False)
    _fn(lib, "jit_concat", jit_value, [c_graph_p, P(jit_value), ctypes.c_int, ctypes.c_int],
        required=False)
    _fn(lib, "jit_slice", jit_value, [c_graph_p, jit_value, ctypes.c_int, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64], required=False)
    _fn(lib, "jit_slice_symbolic", jit_value,
        [c_graph_p, jit_value, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
         ctypes.c_int64, ctypes.c_int64], required=False)
    _fn(lib, "jit_pad", jit_value, [c_graph_p, jit_value, i64p, i64p, ctypes.c_double],
        required=False)
    _fn(lib, "jit_pad_with", jit_value, [c_graph_p, jit_value, i64p, i64p, ctypes.c_int,
                                         ctypes.c_double], required=False)
    _fn(lib, "jit_cast", jit_value, [c_graph_p, jit_value, DLDataType], required=False)
    _fn(lib, "jit_mlir_opt", jit_status,
        [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p,
         P(ctypes.c_void_p)], required=False)
    return lib


# PyCapsule access, for DLPack capsules ("dltensor").
_pyapi = ctypes.pythonapi
_pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pyapi.PyCapsule_IsValid.restype = ctypes.c_int
_pyapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_tensor(capsule):
    """The DLManagedTensor* inside an unconsumed DLPack capsule (not consumed: the
    capsule keeps ownership, and its destructor calls the deleter)."""
    if not _pyapi.PyCapsule_IsValid(capsule, b"dltensor"):
        raise ValueError("not an unconsumed DLPack capsule (name 'dltensor')")
    ptr = _pyapi.PyCapsule_GetPointer(capsule, b"dltensor")
    return ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor))
