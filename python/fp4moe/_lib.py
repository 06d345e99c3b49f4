"""Loading libfp4moe with ctypes: struct mirrors, prototypes, statuses.

Why ctypes and not a CPython extension: the library is plain C with a small
set of entry points, and a serving engine calls the layer under a CUDA graph
(where no host code runs at all) or through torch's dispatcher (whose own cost
dwarfs ctypes'); docs/python.md has the measured per-call costs. One shared
library, the same one the C tools link, is the whole implementation.

The library is found, in order: $FP4MOE_LIBRARY (the build tree's
build/python/libfp4moe.so, as the CTest run sets it), then libfp4moe.so next to
this file (the wheel). Every struct below is checked field by field against the
layout table compiled into the library (python/abi.c) before anything is
called: a header change that the mirrors missed refuses to load, naming the
field, instead of reading garbage.
"""

import ctypes as C
import os
import threading

c_int, c_int32, c_int64, c_float, c_double = C.c_int, C.c_int32, C.c_int64, C.c_float, C.c_double
c_size_t, c_void_p, c_char_p = C.c_size_t, C.c_void_p, C.c_char_p
P = C.POINTER


class MoeConfig(C.Structure):
    _fields_ = [("n_experts", c_int), ("top_k", c_int), ("hidden", c_int), ("inter", c_int),
                ("score", c_int), ("n_group", c_int), ("topk_group", c_int), ("renormalize", c_int),
                ("routed_scale", c_float), ("shared_inter", c_int), ("wfmt", c_int), ("act_nvfp4", c_int),
                ("activation", c_int), ("swiglu_limit", c_float), ("act_fp8", c_int)]


class QTensor(C.Structure):
    _fields_ = [("fmt", c_int), ("rows", c_int64), ("cols", c_int64), ("data", c_void_p),
                ("scales", c_void_p), ("global_scale", c_float)]


class MoeWeights(C.Structure):
    _fields_ = [("router_w", c_void_p), ("router_bias", c_void_p), ("w13", P(QTensor)), ("w2", P(QTensor)),
                ("a1_scale", c_void_p), ("a2_scale", c_void_p), ("shared_w13", c_void_p),
                ("shared_w2", c_void_p), ("w13_bias", c_void_p), ("w2_bias", c_void_p),
                ("w13_up_global", c_void_p)]


class RunStats(C.Structure):
    _fields_ = [("ms", c_double)]


class LayerDesc(C.Structure):
    _fields_ = [("backend", c_int), ("device", c_void_p), ("max_tokens", c_int), ("out_dtype", c_int),
                ("first_expert", c_int), ("n_local", c_int), ("caller_workspace", c_int),
                ("decode_work_list", c_int), ("row_quantile", c_float), ("plans", C.c_char_p),
                ("pdl_chain", c_int), ("decode_path", c_int), ("act_fp8_path", c_int)]


class LayerRunArgs(C.Structure):
    _fields_ = [("x", c_void_p), ("T", c_int), ("topk_ids", c_void_p), ("topk_weights", c_void_p),
                ("out", c_void_p), ("workspace", c_void_p), ("stream", c_void_p),
                ("routed_ids", c_void_p), ("routed_weights", c_void_p)]


class LayerDispatchArgs(C.Structure):
    _fields_ = [("layout", c_int), ("x", c_void_p), ("x_fp8", c_void_p), ("x_scales", c_void_p),
                ("counts", c_void_p), ("capacity", c_int), ("offsets", c_void_p), ("weights", c_void_p),
                ("out", c_void_p), ("workspace", c_void_p), ("stream", c_void_p), ("max_rows", c_int)]


class LayerErrorInfo(C.Structure):
    _fields_ = [("bad_ids", C.c_longlong), ("first_bad_slot", C.c_longlong), ("nonfinite_x", c_int),
                ("first_nonfinite", C.c_longlong), ("nonfinite_logits", c_int), ("nonfinite_weights", C.c_longlong),
                ("bad_experts", C.c_longlong), ("first_bad_expert", C.c_longlong)]


ST_MAX_DIMS = 8


class StTensor(C.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_int), ("shape", c_int64 * ST_MAX_DIMS),
                ("data", c_void_p), ("nbytes", C.c_uint64), ("file_offset", C.c_uint64), ("file", c_char_p),
                ("owner_", c_void_p)]


class CkptNames(C.Structure):
    _fields_ = [("layout", c_int), ("expert", c_char_p), ("proj_gate", c_char_p), ("proj_up", c_char_p),
                ("proj_down", c_char_p), ("router", c_char_p), ("router_bias", c_char_p), ("shared", c_char_p)]


class CkptScan(C.Structure):
    _fields_ = [("layout", c_int), ("wfmt", c_int), ("n_layers", c_int), ("layers", P(c_int)),
                ("experts", P(c_int)), ("found", P(c_int)), ("expert_bytes", C.c_uint64)]


class CkptLoadOpts(C.Structure):
    _fields_ = [("names", c_void_p), ("routing", P(MoeConfig)), ("routing_fields", C.c_uint),
                ("first_expert", c_int), ("n_experts", c_int), ("swizzle_scales", c_int), ("global_router", c_int),
                ("validate_only", c_int)]


class TensorView(C.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_int), ("shape", c_int64 * ST_MAX_DIMS),
                ("data", c_void_p)]


class RouteOrigin(C.Structure):
    _fields_ = [("from_", c_int), ("key", c_char_p)]


class CkptLayer(C.Structure):
    _fields_ = [("cfg", MoeConfig), ("w", MoeWeights), ("w13", P(QTensor)), ("w2", P(QTensor)),
                ("router_w", P(c_float)), ("router_bias", P(c_float)), ("a1_scale", P(c_float)),
                ("a2_scale", P(c_float)), ("shared_w13", P(C.c_uint16)), ("shared_w2", P(C.c_uint16)),
                ("w13_bias", P(c_float)), ("w2_bias", P(c_float)), ("w13_up_global", P(c_float)),
                ("w13_sf_swizzled", c_void_p),
                ("w2_sf_swizzled", c_void_p), ("layer", c_int), ("first_expert", c_int), ("n_local", c_int),
                ("has_router_bias", c_int), ("has_input_scales", c_int),
                ("has_expert_bias", c_int),
                ("layout", c_int), ("model_type", C.c_char * 64), ("route_from", RouteOrigin * 5),
                ("w13_split_globals", c_int), ("ignored_bias", c_int),
                ("ignored_router_bias", c_int), ("owned_", c_void_p)]


class Tile(C.Structure):
    _fields_ = [("warps", c_int), ("mt", c_int), ("nt", c_int), ("kc", c_int), ("stages", c_int), ("persist", c_int),
                ("family", c_int)]


class LayerPlanInfo(C.Structure):
    _fields_ = [("bucket_tokens", c_int), ("expected_rows", c_int), ("active_experts", c_int), ("work_list", c_int),
                ("tile", Tile * 2), ("k_splits", c_int * 2), ("x_packed", c_int * 2), ("feature_blocks", c_int * 2),
                ("decode", c_int), ("decode_k_splits", c_int * 2), ("decode_ctas", c_int),
                ("decode_note", C.c_char * 96), ("act_fp8", c_int), ("decode_counter", c_int)]


class LayerTuneInfo(C.Structure):
    _fields_ = [("plans_tried", c_int), ("plans_refused", c_int), ("before_us", C.c_double), ("after_us", C.c_double),
                ("changed", c_int)]


class _AbiField(C.Structure):
    _fields_ = [("type", c_char_p), ("field", c_char_p), ("offset", c_size_t), ("size", c_size_t)]


# C name -> mirror, for the layout check.
_MIRRORS = {
    "fm_moe_config": MoeConfig, "fm_qtensor": QTensor, "fm_moe_weights": MoeWeights, "fm_run_stats": RunStats,
    "fm_layer_desc": LayerDesc, "fm_layer_run_args": LayerRunArgs, "fm_layer_dispatch_args": LayerDispatchArgs,
    "fm_layer_error_info": LayerErrorInfo,
    "fm_st_tensor": StTensor, "fm_ckpt_names": CkptNames, "fm_ckpt_scan": CkptScan, "fm_ckpt_load_opts": CkptLoadOpts,
    "fm_tensor_view": TensorView,
    "fm_ckpt_layer": CkptLayer, "fm_tile": Tile, "fm_layer_plan_info": LayerPlanInfo,
    "fm_layer_tune_info": LayerTuneInfo,
}

# name: (restype, argtypes). Every one is required: a library without one of them is
# not the library this package was written for (LibraryMismatchError).
_PROTOS = {
    "fm_status_name": (c_char_p, [c_int]),
    "fm_status_str": (c_char_p, [c_int]),
    "fm_last_error": (c_char_p, []),
    "fm_version": (c_char_p, []),
    "fm_format_parse": (c_int, [c_char_p, P(c_int)]),
    "fm_qtensor_bytes": (c_int, [c_int, c_int64, c_int64, P(c_size_t), P(c_size_t)]),
    "fm_quantize": (c_int, [c_void_p, P(c_float), P(QTensor)]),
    "fm_dequantize": (c_int, [P(QTensor), c_void_p]),
    "fm_sf_swizzled_bytes": (c_size_t, [c_int64, c_int64]),
    "fm_sf_swizzle": (c_int, [c_void_p, c_int64, c_int64, c_void_p]),
    "fm_sf_unswizzle": (c_int, [c_void_p, c_int64, c_int64, c_void_p]),
    "fm_moe_config_default": (None, [P(MoeConfig)]),
    "fm_moe_config_check": (c_int, [P(MoeConfig)]),
    "fm_moe_route": (c_int, [P(MoeConfig), c_void_p, c_void_p, c_int, c_void_p, c_void_p]),
    "fm_moe_forward_ref": (c_int, [P(MoeConfig), P(MoeWeights), c_void_p, c_int, c_void_p]),
    "fm_backend_name": (c_char_p, [c_int]),
    "fm_backend_parse": (c_int, [c_char_p, P(c_int)]),
    "fm_backend_available": (c_int, [c_int]),
    "fm_layer_create": (c_int, [c_int, P(MoeConfig), P(MoeWeights), c_int, P(c_void_p)]),
    "fm_layer_backend": (c_int, [c_void_p]),
    "fm_layer_destroy": (None, [c_void_p]),
    "fm_checkpoint_open": (c_int, [c_char_p, P(c_void_p)]),
    "fm_checkpoint_close": (None, [c_void_p]),
    "fm_checkpoint_open_tensors": (c_int, [P(TensorView), c_size_t, c_char_p, P(c_void_p)]),
    "fm_checkpoint_tensor_count": (c_size_t, [c_void_p]),
    "fm_checkpoint_tensor_at": (P(StTensor), [c_void_p, c_size_t]),
    "fm_checkpoint_find": (c_int, [c_void_p, c_char_p, P(P(StTensor))]),
    "fm_st_read": (c_int, [P(StTensor), C.c_uint64, c_size_t, c_void_p]),
    "fm_checkpoint_scan": (c_int, [c_void_p, c_void_p, P(CkptScan)]),
    "fm_ckpt_scan_free": (None, [P(CkptScan)]),
    "fm_ckpt_layout_name": (c_char_p, [c_int]),
    "fm_ckpt_names_default": (c_int, [c_int, P(CkptNames)]),
    "fm_checkpoint_load_layer": (c_int, [c_void_p, c_int, P(CkptLoadOpts), P(P(CkptLayer))]),
    "fm_ckpt_layer_free": (None, [P(CkptLayer)]),
    "fm_dtype_name": (c_char_p, [c_int]),
    "fm_py_abi_count": (c_int, []),
    "fm_py_abi_at": (P(_AbiField), [c_int]),
    # the layer API (include/fp4moe/layer.h)
    "fm_cuda_device_open": (c_int, [c_int, P(c_void_p)]),
    "fm_cuda_device_close": (None, [c_void_p]),
    "fm_layer_create_desc": (c_int, [P(LayerDesc), P(MoeConfig), P(MoeWeights), P(c_void_p)]),
    "fm_layer_workspace_size": (c_int, [c_void_p, P(c_size_t)]),
    "fm_layer_supports": (c_int, [P(LayerDesc), P(MoeConfig), C.c_uint, C.c_char_p, c_size_t]),
    "fm_layer_run": (c_int, [c_void_p, P(LayerRunArgs)]),
    "fm_layer_run_dispatched": (c_int, [c_void_p, P(LayerDispatchArgs)]),
    "fm_layer_errors": (c_int, [c_void_p, c_void_p, P(LayerErrorInfo)]),
    "fm_layer_plan": (c_int, [c_void_p, c_int, P(LayerPlanInfo)]),
    "fm_layer_set_plan": (c_int, [c_void_p, c_int, P(LayerPlanInfo)]),
    "fm_layer_tune": (c_int, [c_void_p, c_int, c_void_p, P(LayerTuneInfo)]),
    "fm_layer_save_plans": (c_int, [c_void_p, C.c_char_p]),
    "fm_layer_plans_note": (C.c_char_p, [c_void_p]),
    "fm_tile_name": (c_char_p, [P(Tile), C.c_char_p, c_size_t]),
    "fm_tile_parse": (c_int, [C.c_char_p, P(Tile)]),
}


class Error(RuntimeError):
    """A status other than FM_OK from the library; .status is its symbolic name
    ("FM_ERR_BAD_SHAPE"), .detail the library's message for the call."""

    def __init__(self, status_name, detail, code=None):
        super().__init__(f"{status_name}: {detail}" if detail else status_name)
        self.status, self.detail, self.code = status_name, detail, code


class LibraryMismatchError(ImportError):
    """The library found (.library, its path) is not the one this package was written
    for: an entry point is missing, or a struct's layout in its table (python/abi.c)
    differs from the package's mirror. .reason says which."""

    def __init__(self, library, reason):
        super().__init__(f"fp4moe: {library}: {reason}")
        self.library, self.reason = library, reason


class ClosedError(ValueError):
    """An fp4moe object (Layer, torch_ops.MoE, Checkpoint, LoadedLayer) used after its
    close(); the message names it: "Layer is closed"."""


class Handle:
    """A library object that several threads may use: every C call that uses it holds
    .lock (`with handle as ptr:`), and close() takes the lock too. So a close waits for
    the call in flight, and a call after it raises ClosedError instead of handing the
    library a freed object. Reentrant, so that a method holding it may call another
    (Checkpoint.load_shard -> load_layer) and a __del__ run by the garbage collector in
    a thread that holds it cannot deadlock."""

    __slots__ = ("what", "lock", "ptr")

    def __init__(self, what, ptr):
        self.what, self.lock, self.ptr = what, threading.RLock(), ptr

    def __enter__(self):
        self.lock.acquire()
        if not self.ptr:
            self.lock.release()
            raise ClosedError(f"{self.what} is closed")
        return self.ptr

    def __exit__(self, *exc):
        self.lock.release()

    def close(self, free):
        """free(ptr) once, after any call in flight; later calls raise ClosedError."""
        with self.lock:
            p = self.ptr
            if p:
                self.ptr = type(p)()  # NULL: what every call checks under the lock
                free(p)


def _library_path():
    env = os.environ.get("FP4MOE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"FP4MOE_LIBRARY={env!r} is not a file")
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libfp4moe.so")
    if os.path.isfile(here):
        return here
    raise ImportError("fp4moe: libfp4moe.so not found next to the package and FP4MOE_LIBRARY is not set "
                      "(install with `pip install .`, or point FP4MOE_LIBRARY at build/python/libfp4moe.so)")


def _check_abi(lib, path):
    def bad(reason):
        return LibraryMismatchError(path, reason)

    want = {}
    for i in range(lib.fm_py_abi_count()):
        f = lib.fm_py_abi_at(i).contents
        want[(f.type.decode(), f.field.decode())] = (f.offset, f.size)
    for cname, mirror in _MIRRORS.items():
        if (cname, "") not in want:
            raise bad(f"the library's layout table has no {cname}")
        size = want[(cname, "")][1]
        if C.sizeof(mirror) != size:
            raise bad(f"{cname} is {size} bytes in the library, {C.sizeof(mirror)} in the binding")
        fields = {name for (t, name) in want if t == cname and name}
        mine = {f[0] for f in mirror._fields_}
        if fields != mine:
            raise bad(f"{cname} fields differ: library only {sorted(fields - mine)}, "
                              f"binding only {sorted(mine - fields)}")
        for name in fields:
            d = getattr(mirror, name)
            if (d.offset, d.size) != want[(cname, name)]:
                raise bad(f"{cname}.{name} at offset {d.offset} size {d.size} in the binding, "
                                  f"{want[(cname, name)]} in the library")


def _bind(lib, path):
    """Set every prototype; a missing entry point is a LibraryMismatchError naming it."""
    for name, (res, args) in _PROTOS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryMismatchError(path, f"no {name} (a library older than this package?)") from None
        fn.restype, fn.argtypes = res, args


def _load():
    path = _library_path()
    lib = C.CDLL(path)
    _bind(lib, path)
    _check_abi(lib, path)
    return lib, path


lib, library_path = _load()


def status_name(code):
    return lib.fm_status_name(code).decode()


def check(code, what=""):
    """Raise Error for a status other than FM_OK (0), with the library's detail."""
    if code != 0:
        detail = lib.fm_last_error().decode(errors="replace")
        if what and what not in detail:
            detail = f"{what}: {detail}" if detail else what
        raise Error(status_name(code), detail, code)
