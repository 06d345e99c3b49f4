"""A MoE layer from numpy arrays or a checkpoint, run on a backend.

MoEConfig mirrors fm_moe_config, MoEWeights holds the expert weights as
stacked numpy arrays (the layout fp4moe and the engines use: w13 = gate rows
then up rows), Layer owns one fm_layer. Layer.run takes host arrays on the CPU
backends; the torch ops (fp4moe.torch_ops) run the same object on device
tensors. Every argument is checked here before C sees it, and named in the
exception; what only the library can judge (formats, finite scales, routing
ids) comes back as fp4moe.Error with its status and message.
"""

import contextlib
import ctypes as C
import threading
import warnings
from dataclasses import dataclass, replace

import numpy as np

from . import _lib
from ._args import UINTPTR_MAX, as_choice, as_cstr, as_float, as_int, as_path
from ._lib import ClosedError, check, lib
from .format import BLOCK, FORMAT_NAMES, FORMATS, SCALE_DTYPES, QTensor, _native, format_code, quantize

BACKENDS = {"auto": 0, "cpu-ref": 1, "cpu": 2, "cuda": 3}
OUT_DTYPES = {"f32": 0, "float32": 0, "bf16": 1, "bfloat16": 1}
WORK_LIST = {"off": -1, "auto": 0, "on": 1}  # fm_layer_desc.decode_work_list (FM_WORK_LIST_*)
ACT_FP8_PATH = {"every": 0, "faster": 1}  # fm_layer_desc.act_fp8_path (FM_FP8_PATH_*)
ROW_QUANTILE = {"auto": 0.0, "mean": -1.0}  # fm_layer_desc.row_quantile (FM_ROW_QUANTILE_AUTO / _MEAN)
SCORES = {"softmax": 0, "sigmoid": 1, "softmax-topk": 2}
SCORE_NAMES = {v: k for k, v in SCORES.items()}
ACTIVATIONS = {"swiglu": 0, "swiglu-gptoss": 1}
ACTIVATION_NAMES = {v: k for k, v in ACTIVATIONS.items()}
ACT_FP8 = {"off": 0, "block128": 1, "token": 2}
ACT_FP8_NAMES = {v: k for k, v in ACT_FP8.items()}


@dataclass
class MoEConfig:
    """fm_moe_config: shapes, routing and weight format (include/fp4moe/moe.h)."""

    n_experts: int
    top_k: int
    hidden: int
    inter: int
    score: str = "softmax"        # "softmax" (Qwen, Mixtral), "sigmoid" (DeepSeek-V3, GLM), "softmax-topk" (gpt-oss)
    n_group: int = 0
    topk_group: int = 0
    renormalize: bool = True
    routed_scale: float = 1.0
    shared_inter: int = 0
    wfmt: str = "nvfp4"
    act_nvfp4: bool = False
    activation: str = "swiglu"    # "swiglu", or "swiglu-gptoss" (gpt-oss's clamped form, with swiglu_limit)
    swiglu_limit: float = 0.0     # swiglu-gptoss: the clamp (gpt-oss: 7.0); swiglu: 0
    act_fp8: str = "off"          # FP8 activations (W4A8): "off", "block128" (scales per 128), "token"

    def __post_init__(self):
        self._fields()

    def _fields(self):
        """The fields checked (every int within C int, numbers, known names) and normalised
        in place (wfmt to its lower-case name), as fm_moe_config's values in field order.
        At construction and again before every C call: the fields are mutable."""
        ints = {f: as_int(getattr(self, f), f) for f in ("n_experts", "top_k", "hidden", "inter", "n_group",
                                                         "topk_group", "shared_inter")}
        self.__dict__.update(ints)
        self.wfmt = FORMAT_NAMES[format_code(self.wfmt, "wfmt")]
        return (ints["n_experts"], ints["top_k"], ints["hidden"], ints["inter"],
                SCORES[as_choice(self.score, "score", SCORES)], ints["n_group"], ints["topk_group"],
                int(bool(self.renormalize)), as_float(self.routed_scale, "routed_scale"), ints["shared_inter"],
                FORMATS[self.wfmt], int(bool(self.act_nvfp4)),
                ACTIVATIONS[as_choice(self.activation, "activation", ACTIVATIONS)],
                as_float(self.swiglu_limit, "swiglu_limit"), ACT_FP8[as_choice(self.act_fp8, "act_fp8", ACT_FP8)])

    def _c(self):
        c = _lib.MoeConfig(*self._fields())
        check(lib.fm_moe_config_check(C.byref(c)), "MoEConfig")
        return c

    @classmethod
    def _from_c(cls, c):
        return cls(c.n_experts, c.top_k, c.hidden, c.inter, SCORE_NAMES.get(c.score, "?"), c.n_group,
                   c.topk_group, bool(c.renormalize), c.routed_scale, c.shared_inter, FORMAT_NAMES[c.wfmt],
                   bool(c.act_nvfp4), ACTIVATION_NAMES.get(c.activation, "?"), c.swiglu_limit,
                   ACT_FP8_NAMES.get(c.act_fp8, "?"))


def _arr(a, arg, dtype, shape, allow_none=False):
    """A C-contiguous native-endian array of exactly dtype and shape, or a TypeError/ValueError
    naming arg."""
    if a is None:
        if allow_none:
            return None
        raise ValueError(f"{arg}: required")
    a = np.asarray(a)
    names = (dtype,) if isinstance(dtype, str) else dtype
    if a.dtype.name not in names:
        raise TypeError(f"{arg}: expected dtype {' or '.join(names)}, got {a.dtype}")
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{arg}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
    return np.ascontiguousarray(_native(a))


def _globals13(g, up, E):
    """(gate globals, up globals or None) of MoEWeights.w13_global ([E], or [E][2] gate / up) and
    w13_up_global ([E] or None): one of the two forms, each checked as float32."""
    a = np.asarray(g) if g is not None else None
    if a is not None and a.ndim == 2:
        if up is not None:
            raise ValueError("w13_up_global: given, and w13_global is [E][2] (gate, up): give the up globals once")
        a = _arr(a, "w13_global", "float32", (E, 2))
        return np.ascontiguousarray(a[:, 0]), np.ascontiguousarray(a[:, 1])
    return g, _arr(up, "w13_up_global", "float32", (E,), True)


@dataclass
class MoEWeights:
    """The layer's weights as stacked host arrays (E = experts held: all, or the shard's).

    router_w    float32 [n_experts (global)][hidden]
    router_bias float32 [n_experts] ranking bias, or None
    w13_data    FP4: uint8 [E][2*inter][hidden/2]; BF16: uint16 [E][2*inter][hidden]; gate rows then up rows
    w13_scales  uint8 (or float8 codes) [E][2*inter][hidden/block], None for BF16
    w13_global  float32 [E] (NVFP4 weight_scale_2; ones otherwise), or [E][2]: the gate rows' and
                the up rows' own globals (a checkpoint's gate and up weight_scale_2), taken as they
                are (no block scale re-encoded: fm_moe_weights.w13_up_global)
    w2_*        the same for [E][hidden][inter] (w2_global [E])
    a1_scale, a2_scale  float32 [E] static NVFP4 input scales (act_nvfp4), or None
    shared_w13  uint16 (BF16 bits) [2*shared_inter][hidden], shared_w2 [hidden][shared_inter], or None
    w13_bias    float32 [E][2*inter] expert bias of FC1 (gate then up, gpt-oss), or None
    w2_bias     float32 [E][hidden] expert bias of FC2, or None
    w13_up_global  float32 [E]: the up rows' globals (w13_global then the gate rows'), or None;
                the same as a [E][2] w13_global (give one or the other)
    """

    router_w: np.ndarray
    w13_data: np.ndarray
    w13_scales: object
    w13_global: np.ndarray
    w2_data: np.ndarray
    w2_scales: object
    w2_global: np.ndarray
    router_bias: object = None
    a1_scale: object = None
    a2_scale: object = None
    shared_w13: object = None
    shared_w2: object = None
    w13_bias: object = None
    w2_bias: object = None
    w13_up_global: object = None

    @classmethod
    def quantize(cls, cfg, router_w, w13, w2, router_bias=None, shared_w13=None, shared_w2=None):
        """Quantize float weights w13 [E][2*inter][hidden], w2 [E][hidden][inter] with
        the library's quantizer to cfg.wfmt (one global scale per expert matrix)."""
        q13 = [quantize(np.asarray(w, np.float32), cfg.wfmt) for w in w13]
        q2 = [quantize(np.asarray(w, np.float32), cfg.wfmt) for w in w2]
        return cls.from_qtensors(router_w, q13, q2, router_bias, shared_w13=shared_w13, shared_w2=shared_w2)

    @classmethod
    def from_qtensors(cls, router_w, w13, w2, router_bias=None, a1_scale=None, a2_scale=None, shared_w13=None,
                      shared_w2=None, w13_up_global=None):
        """Stack per-expert QTensors; w13_up_global: float32 [E] up-row globals (NVFP4), or None."""
        def stack(qs, what):
            if not qs or not all(isinstance(q, QTensor) for q in qs):
                raise TypeError(f"{what}: expected a non-empty list of fp4moe.QTensor")
            arrs = [q._arrays(f"{what}[{e}]") for e, q in enumerate(qs)]
            fmt, d0, s0, _ = arrs[0]
            for e, (f, d, s, _) in enumerate(arrs):
                if f != fmt or d.shape != d0.shape:
                    raise ValueError(f"{what}[{e}]: {f} {d.shape} differs from {what}[0]'s {fmt} {d0.shape} "
                                     "(the experts are stacked: one format and shape)")
            sc = None if s0 is None else np.stack([a[2] for a in arrs])
            return np.stack([a[1] for a in arrs]), sc, np.array([a[3] for a in arrs], np.float32)

        d13, s13, g13 = stack(w13, "w13")
        d2, s2, g2 = stack(w2, "w2")
        return cls(np.asarray(router_w, np.float32), d13, s13, g13, d2, s2, g2, router_bias, a1_scale, a2_scale,
                   shared_w13, shared_w2, w13_up_global=w13_up_global)

    def _c(self, cfg, n_local):
        """(fm_moe_weights, keep-alive list) after checking every array against cfg."""
        fmt = cfg.wfmt
        E, H, I = n_local, cfg.hidden, cfg.inter
        fp4 = fmt != "bf16"
        ddt = "uint8" if fp4 else ("uint16", "bfloat16")
        blk = BLOCK[fmt]
        keep = []
        rw = _arr(self.router_w, "router_w", "float32", (cfg.n_experts, H))
        rb = _arr(self.router_bias, "router_bias", "float32", (cfg.n_experts,), True)
        mats = []
        for name, rows, cols in (("w13", 2 * I, H), ("w2", H, I)):
            d = _arr(getattr(self, name + "_data"), name + "_data", ddt, (E, rows, cols // 2 if fp4 else cols))
            s = _arr(getattr(self, name + "_scales"), name + "_scales", SCALE_DTYPES, (E, rows, cols // blk)) \
                if fp4 else None
            g = getattr(self, name + "_global")
            if name == "w13":
                g, up = _globals13(g, self.w13_up_global, E)
                keep.append(up)
            g = _arr(g, name + "_global", "float32", (E,))
            arr = (_lib.QTensor * E)()
            for e in range(E):
                arr[e] = _lib.QTensor(FORMATS[fmt], rows, cols, d[e].ctypes.data,
                                      None if s is None else s[e].ctypes.data, float(g[e]))
            keep += [d, s, g, arr]
            mats.append(arr)
        a1 = _arr(self.a1_scale, "a1_scale", "float32", (E,), True)
        a2 = _arr(self.a2_scale, "a2_scale", "float32", (E,), True)
        S = cfg.shared_inter
        sw13 = _arr(self.shared_w13, "shared_w13", ("uint16", "bfloat16"), (2 * S, H), S == 0)
        sw2 = _arr(self.shared_w2, "shared_w2", ("uint16", "bfloat16"), (H, S), S == 0)
        b13 = _arr(self.w13_bias, "w13_bias", "float32", (E, 2 * I), True)
        b2 = _arr(self.w2_bias, "w2_bias", "float32", (E, H), True)
        keep += [rw, rb, a1, a2, sw13, sw2, b13, b2]
        ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
        w = _lib.MoeWeights(ptr(rw), ptr(rb), mats[0], mats[1], ptr(a1), ptr(a2), ptr(sw13), ptr(sw2), ptr(b13),
                            ptr(b2), ptr(keep[0]))
        return w, keep


def to_bf16_bits(x, arg="x"):
    """uint16 BF16 bits of x: uint16 and bfloat16 arrays as they are; float arrays
    rounded to nearest even by ml_dtypes (the codec oracle the C tests use)."""
    a = np.asarray(x)
    if a.dtype.name == "uint16":
        return np.ascontiguousarray(_native(a))
    if a.dtype.name == "bfloat16":
        return np.ascontiguousarray(a).view(np.uint16)
    if np.issubdtype(a.dtype, np.floating):
        import ml_dtypes
        return np.ascontiguousarray(a.astype(ml_dtypes.bfloat16)).view(np.uint16)
    raise TypeError(f"{arg}: expected BF16 (uint16 bits or bfloat16) or a float array, got dtype {a.dtype}")


def _row_quantile(q):
    """fm_layer_desc.row_quantile from "auto" (0), "mean" (-1) or a number (the library checks
    the range: [0.5, 1), or the two special values)."""
    if isinstance(q, str):
        if q not in ROW_QUANTILE:
            raise ValueError(f"row_quantile: expected 'auto', 'mean' or a quantile in [0.5, 1), got {q!r}")
        return ROW_QUANTILE[q]
    return as_float(q, "row_quantile")


def _same_shapes(c, lc):
    """A cfg given with a loaded layer (or its own, changed since) must say the shapes it was
    loaded with: the library reads the loaded arrays by the cfg's (more experts or larger
    matrices: past their ends)."""
    for f in ("n_experts", "hidden", "inter", "shared_inter", "wfmt"):
        have, want = getattr(c, f), getattr(lc, f)
        if have != want:
            if f == "wfmt":
                have, want = FORMAT_NAMES[have], FORMAT_NAMES[want]
            raise ValueError(f"cfg.{f}: {have!r}, but the loaded layer's is {want!r} (a cfg given with a loaded "
                             "layer may change its routing, not its shapes)")


class Layer:
    """One fm_layer. backend: "cpu" (fast), "cpu-ref" (the oracle), "cuda", "auto".

    cfg.n_experts is the global expert count; with first_expert/n_local the layer
    holds experts [first_expert, first_expert + n_local) (weights of those only,
    router global) and its output is that shard's partial sum. out_dtype "f32" or
    "bf16". device: CUDA ordinal for the cuda backend (default 0). work_list
    ("auto", "on", "off") and row_quantile ("auto", "mean", or a quantile in [0.5, 1)): the cuda
    backend's decode_work_list and row_quantile (include/fp4moe/layer.h); the CPU
    backends check and ignore them. act_fp8_path ("every", "faster"): with cfg.act_fp8 set, W4A8
    in every bucket (required) or where the plan expects it faster (allowed; fm_layer_desc.act_fp8_path);
    the CPU backends check and ignore it.

    Threads: calls from several threads take turns on the layer's lock; close() waits
    for the call in flight, and calls after it raise fp4moe.ClosedError."""

    def __init__(self, cfg, weights, *, backend="cpu", max_tokens=256, out_dtype="f32", first_expert=0,
                 n_local=0, device=None, work_list="auto", row_quantile="auto", plans=None, act_fp8_path="every"):
        from .checkpoint import LoadedLayer

        as_choice(backend, "backend", BACKENDS)
        as_choice(out_dtype, "out_dtype", OUT_DTYPES)
        max_tokens = as_int(max_tokens, "max_tokens", 1)
        first_expert = as_int(first_expert, "first_expert", 0)
        n_local = as_int(n_local, "n_local", 0)
        device = None if device is None else as_int(device, "device", 0)
        as_choice(work_list, "work_list", WORK_LIST)
        as_choice(act_fp8_path, "act_fp8_path", ACT_FP8_PATH)
        row_quantile = _row_quantile(row_quantile)
        plans_c = None if plans is None else as_path(plans, "plans")[1]
        if isinstance(weights, LoadedLayer):
            if cfg is None:
                cfg = weights.cfg
            elif not isinstance(cfg, MoEConfig):
                raise TypeError(f"cfg: expected fp4moe.MoEConfig or None, got {type(cfg).__name__}")
            if weights.n_local != weights.cfg.n_experts:  # a shard loaded with the global router
                if (first_expert, n_local) == (0, 0):
                    first_expert, n_local = weights.first_expert, weights.n_local
                elif (first_expert, n_local) != (weights.first_expert, weights.n_local):
                    raise ValueError(f"first_expert, n_local: ({first_expert}, {n_local}) is not the loaded shard "
                                     f"({weights.first_expert}, {weights.n_local})")
            elif (first_expert, n_local) not in ((0, 0), (0, weights.n_local)):
                # the library would take the first n_local of the loaded experts as the shard's
                raise ValueError(f"first_expert, n_local: ({first_expert}, {n_local}): the loaded layer holds all "
                                 f"its {weights.n_local} experts, not a shard: load the shard's (Checkpoint.load_layer "
                                 "with first_expert, n_experts and global_router=True)")
            ccfg = cfg._c()
            source = weights._hd  # create reads its fm_ckpt_layer: held against a close in another thread
        elif isinstance(weights, MoEWeights):
            if not isinstance(cfg, MoEConfig):
                raise TypeError(f"cfg: expected fp4moe.MoEConfig, got {type(cfg).__name__}")
            ccfg = cfg._c()
            nl = n_local or cfg.n_experts
            cw, keep = weights._c(cfg, nl)  # keep: the arrays cw points into, alive until create returns
            source = contextlib.nullcontext()
        else:
            raise TypeError(f"weights: expected fp4moe.MoEWeights or a loaded checkpoint layer, "
                            f"got {type(weights).__name__}")
        # a copy, as the caller's cfg may change later (its fields are mutable)
        self.cfg, self.max_tokens = replace(cfg), max_tokens
        self.out_dtype = "bf16" if OUT_DTYPES[out_dtype] else "f32"
        self.first_expert, self.n_local = first_expert, n_local or cfg.n_experts
        # the C layer's shapes and out dtype, which run / run_dispatched check the arrays against:
        # never the public attributes, whose change would let C read and write past the arrays
        self._shapes = (cfg.hidden, cfg.top_k, self.n_local, self.out_dtype)
        self.device = None
        self._dev = None
        h = C.c_void_p()
        if backend == "cuda":
            self.device = 0 if device is None else device
            self._dev = _open_device(self.device)
        desc = _lib.LayerDesc(BACKENDS[backend], self._dev, max_tokens, OUT_DTYPES[out_dtype],
                              first_expert, n_local, 0, WORK_LIST[work_list], row_quantile, plans_c)
        desc.act_fp8_path = ACT_FP8_PATH[act_fp8_path]
        with source as loaded:
            if loaded is not None:
                _same_shapes(ccfg, loaded.contents.cfg)
                cw = loaded.contents.w
            check(lib.fm_layer_create_desc(C.byref(desc), C.byref(ccfg), C.byref(cw), C.byref(h)), "Layer")
        self.backend = lib.fm_backend_name(lib.fm_layer_backend(h)).decode()
        if self.backend == "cuda" and self.device is None:
            self.device = 0
        self._args = _lib.LayerRunArgs()  # shared by the calls: filled and used under the handle's lock
        self._hd = _lib.Handle("Layer", h)
        # what create did with `plans` (fm_layer_plans_note): "" when none was given
        note = lib.fm_layer_plans_note(h)
        self.plans_note = note.decode() if note else ""
        if self.plans_note and not self.plans_note.startswith("loaded"):
            warnings.warn(f"fp4moe.Layer: {self.plans_note}", PlansWarning, stacklevel=2)

    def close(self):
        """Destroy the layer, after the call in flight in another thread if there is one;
        calls after it raise fp4moe.ClosedError. Twice is harmless."""
        hd = getattr(self, "_hd", None)
        if hd is not None:
            hd.close(lib.fm_layer_destroy)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def _handle(self):
        """The fm_layer pointer without the lock: for a benchmark's raw baseline
        (bench/py_overhead.py), never for a call that may race a close."""
        if not self._hd.ptr:
            raise ClosedError(f"{self._hd.what} is closed")
        return self._hd.ptr

    def run(self, x, topk_ids=None, topk_weights=None, out=None, return_routing=False):
        """out [T][hidden] = layer(x [T][hidden]) on a CPU backend, host arrays.

        x: BF16 (uint16 bits / bfloat16) or float (rounded to BF16).
        topk_ids int32 [T][top_k] and topk_weights float32 [T][top_k]: the
        engine's routing (global ids, -1 = none, weights used as given); both
        None: the layer routes (router GEMM + its routing function).
        out: optional preallocated float32 (out_dtype f32) or uint16/bfloat16
        (bf16) [T][hidden], written in place and returned.
        return_routing (internal routing only): return (out, ids, weights), the
        int32 / float32 [T][top_k] routing the layer chose (fm_layer_run_args
        routed_ids / routed_weights): passed back as topk_ids / topk_weights they
        give the same output bit for bit."""
        if self.backend == "cuda":
            raise ValueError("run: a cuda layer takes device tensors: use fp4moe.torch_ops (torch.ops.fp4moe.moe)")
        H, k, _, odt_name = self._shapes
        f32 = odt_name == "f32"
        xb = to_bf16_bits(x)
        if xb.ndim != 2 or xb.shape[1] != H:
            raise ValueError(f"x: expected shape [T][{H}], got {xb.shape}")
        T = xb.shape[0]
        if not 1 <= T <= self.max_tokens:
            raise ValueError(f"x: T={T} outside [1, max_tokens={self.max_tokens}]")
        if (topk_ids is None) != (topk_weights is None):
            raise ValueError("topk_ids, topk_weights: give both (external routing) or neither (internal)")
        if return_routing and topk_ids is not None:
            raise ValueError("return_routing: only with internal routing (topk_ids given: the routing is yours)")
        ids = _arr(topk_ids, "topk_ids", "int32", (T, k), True)
        tw = _arr(topk_weights, "topk_weights", "float32", (T, k), True)
        odt = ("float32",) if f32 else ("uint16", "bfloat16")
        if out is None:
            res = np.empty((T, H), np.float32 if f32 else np.uint16)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out: expected a numpy array, got {type(out).__name__}")
            if out.dtype.name not in odt or out.shape != (T, H) or not out.flags.c_contiguous:
                raise ValueError(f"out: expected a C-contiguous {' or '.join(odt)} array of shape {(T, H)}, "
                                 f"got {out.dtype} {out.shape}{'' if out.flags.c_contiguous else ' (strided)'}")
            if not out.flags.writeable:
                raise ValueError("out: read-only array")
            if not out.dtype.isnative:  # written in place by C, in this host's byte order
                raise ValueError(f"out: expected this host's byte order, got {out.dtype.str}")
            res = out
        rid = np.empty((T, k), np.int32) if return_routing else None
        rwt = np.empty((T, k), np.float32) if return_routing else None
        with self._hd as h:
            a = self._args
            a.x, a.T, a.out = xb.ctypes.data, T, res.ctypes.data
            a.topk_ids = None if ids is None else ids.ctypes.data
            a.topk_weights = None if tw is None else tw.ctypes.data
            a.workspace, a.stream = None, None
            a.routed_ids = None if rid is None else rid.ctypes.data
            a.routed_weights = None if rwt is None else rwt.ctypes.data
            check(lib.fm_layer_run(h, C.byref(a)), "Layer.run")
        return (res, rid, rwt) if return_routing else res

    def run_dispatched(self, x, counts=None, offsets=None, weights=None, x_scales=None, out=None):
        """Expert parallelism on a CPU backend (host arrays; a cuda layer takes device rows
        through fp4moe.torch_ops' MoE.dispatched): the layer's experts on rows a dispatch left
        in place (fm_layer_run_dispatched), answered in the same layout for the combine.

        Give counts (int32 [n_local]) for the expert-major layout, x [n_local][capacity][hidden]
        (rows past counts[e] are not read, their out rows not written), or offsets (int32
        [n_local + 1]) for rows contiguous by expert, x [rows][hidden]. x is BF16 (uint16 bits /
        bfloat16 / float, rounded to BF16) or, with x_scales (float32 [..][ceil(hidden / 128)]),
        E4M3 (uint8 codes or ml_dtypes float8_e4m3fn) for a W4A8 layer with act_fp8 "block128".
        weights (float32, one per row, x's layout without hidden): out rows multiplied by it;
        None: the combine applies the routing weights. out: optional preallocated array of x's
        layout and the layer's out dtype; by default zeros, so unwritten slots read 0."""
        if self.backend == "cuda":  # fm_layer_run_dispatched reads device rows; this takes host arrays
            raise ValueError("run_dispatched: host arrays; the cuda backend takes dispatched rows on the device: "
                             "use fp4moe.torch_ops (MoE.dispatched, torch.ops.fp4moe.moe_dispatched) with CUDA tensors")
        if (counts is None) == (offsets is None):
            raise ValueError("counts, offsets: give counts (expert-major layout) or offsets (expert rows), one of them")
        H, _, nl, odt_name = self._shapes
        fp8 = x_scales is not None
        if fp8:
            xa = np.asarray(x)
            if xa.dtype.name == "float8_e4m3fn":
                xa = xa.view(np.uint8)
            if xa.dtype != np.uint8:
                raise TypeError(f"x: with x_scales, expected uint8 E4M3 codes or float8_e4m3fn, got {xa.dtype}")
            xa = np.ascontiguousarray(xa)
        else:
            xa = to_bf16_bits(x)
        if counts is not None:
            if xa.ndim != 3 or xa.shape[0] != nl or xa.shape[2] != H or xa.shape[1] < 1:
                raise ValueError(f"x: expected shape [{nl}][capacity][{H}] with counts, got {xa.shape}")
            cnt = _arr(counts, "counts", "int32", (nl,))
            lead = xa.shape[:2]
        else:
            if xa.ndim != 2 or xa.shape[1] != H:
                raise ValueError(f"x: expected shape [rows][{H}] with offsets, got {xa.shape}")
            off = _arr(offsets, "offsets", "int32", (nl + 1,))
            lead = xa.shape[:1]
        nb = (H + 127) // 128
        sc = _arr(x_scales, "x_scales", "float32", (*lead, nb)) if fp8 else None
        wt = _arr(weights, "weights", "float32", lead, True)
        odt = np.float32 if odt_name == "f32" else np.uint16
        if out is None:
            res = np.zeros((*lead, H), odt)
        else:
            if not isinstance(out, np.ndarray) or out.dtype != odt or out.shape != (*lead, H) \
                    or not out.flags.c_contiguous or not out.flags.writeable:
                raise ValueError(f"out: expected a writable C-contiguous {np.dtype(odt).name} array of shape "
                                 f"{(*lead, H)}")
            res = out
        a = _lib.LayerDispatchArgs()
        a.layout = 1 if counts is not None else 2
        a.x, a.x_fp8 = (None, xa.ctypes.data) if fp8 else (xa.ctypes.data, None)
        a.x_scales = sc.ctypes.data if fp8 else None
        if counts is not None:
            a.counts, a.capacity = cnt.ctypes.data, xa.shape[1]
        else:  # offsets past the rows x holds are refused, never read
            a.offsets, a.max_rows = off.ctypes.data, xa.shape[0]
        a.weights = None if wt is None else wt.ctypes.data
        a.out = res.ctypes.data
        with self._hd as h:
            check(lib.fm_layer_run_dispatched(h, C.byref(a)), "Layer.run_dispatched")
        return res


    def plan(self, T):
        """What a run of T tokens launches (cuda layers; fm_layer_plan): a dict with
        bucket_tokens, expected_rows, active_experts, work_list and, for "fc1" / "fc2",
        the tile's name, k_splits, x_packed and feature_blocks; decode (the one-launch decode
        kernel runs the bucket), decode_k_splits, decode_ctas, decode_note, decode_counter (its CTAs
        take their units from a counter, else by strides); act_fp8 (the bucket runs
        the W4A8 chain). The CPU backends have no
        tile plan: fp4moe.Error FM_ERR_UNSUPPORTED."""
        T = as_int(T, "T")
        info = _lib.LayerPlanInfo()
        with self._hd as h:
            check(lib.fm_layer_plan(h, T, C.byref(info)), "Layer.plan")
        res = {"bucket_tokens": info.bucket_tokens, "expected_rows": info.expected_rows,
               "active_experts": info.active_experts, "work_list": bool(info.work_list)}
        for g, name in enumerate(("fc1", "fc2")):
            buf = C.create_string_buffer(48)
            lib.fm_tile_name(C.byref(info.tile[g]), buf, len(buf))
            res[name] = {"tile": buf.value.decode(), "k_splits": info.k_splits[g], "x_packed": bool(info.x_packed[g]),
                         "feature_blocks": info.feature_blocks[g]}
        # the one-launch decode kernel (fm_layer_plan_info.decode): chosen or not, its K splits
        # and grid, and why not where it cannot run the bucket
        res["decode"] = bool(info.decode)
        res["decode_k_splits"] = [info.decode_k_splits[0], info.decode_k_splits[1]]
        res["decode_ctas"] = info.decode_ctas
        res["decode_note"] = info.decode_note.decode()
        res["decode_counter"] = bool(info.decode_counter)
        res["act_fp8"] = bool(info.act_fp8)  # the bucket runs the W4A8 chain
        return res

    def set_plan(self, T, plan):
        """Replace the plan of T's bucket (fm_layer_set_plan): plan as Layer.plan returns it
        (an engine's tuned configuration, e.g. kept as JSON). Checked as each GEMM's launch
        would check it, so a plan the device cannot run is refused here (fp4moe.Error:
        FM_ERR_UNSUPPORTED, FM_ERR_INVALID_ARG, ...), never at a run; call it between runs
        and re-capture graphs of the layer made before it. With "decode" true the one-launch
        decode kernel runs the bucket and "fc1" / "fc2" are only kept for the chain: set it
        false to run those tiles. CPU backends: FM_ERR_UNSUPPORTED."""
        T = as_int(T, "T")
        if not isinstance(plan, dict):
            raise TypeError(f"plan: expected a dict as Layer.plan returns, got {type(plan).__name__}")
        info = _lib.LayerPlanInfo()
        try:
            info.expected_rows = as_int(plan.get("expected_rows", 0), "plan['expected_rows']")
            info.active_experts = as_int(plan["active_experts"], "plan['active_experts']")
            info.work_list = 1 if plan["work_list"] else 0
            for g, name in enumerate(("fc1", "fc2")):
                q = plan[name]
                tile = q["tile"]
                if lib.fm_tile_parse(as_cstr(tile, f"plan[{name!r}]['tile']"), C.byref(info.tile[g])) != 0:
                    raise ValueError(f"plan[{name!r}]['tile']: {tile!r} is not a tile name (e.g. 'mma_w4m2n1k256s3')")
                info.k_splits[g] = as_int(q["k_splits"], f"plan[{name!r}]['k_splits']")
                info.x_packed[g] = 1 if q["x_packed"] else 0
                info.feature_blocks[g] = as_int(q["feature_blocks"], f"plan[{name!r}]['feature_blocks']")
            info.decode = 1 if plan.get("decode", False) else 0  # optional: the chain without it
            ks = plan.get("decode_k_splits", [0, 0])
            for g in range(2):
                info.decode_k_splits[g] = as_int(ks[g], f"plan['decode_k_splits'][{g}]")
            info.act_fp8 = 1 if plan.get("act_fp8", False) else 0  # optional: W4A16 without it
        except KeyError as e:
            raise ValueError(f"plan: missing {e.args[0]!r} (the keys Layer.plan returns)") from None
        with self._hd as h:
            check(lib.fm_layer_set_plan(h, T, C.byref(info)), "Layer.set_plan")

    def save_plans(self, path):
        """Write every bucket's plan into the plan file at path (fm_layer_save_plans): the
        section of this device and build, other sections and shapes kept; create a layer
        with plans=path to take them. cuda only (CPU backends: FM_ERR_UNSUPPORTED)."""
        _, cpath = as_path(path, "path")
        with self._hd as h:
            check(lib.fm_layer_save_plans(h, cpath), "Layer.save_plans")

    def tune(self, T, stream=None):
        """Tune T's bucket on the device (fm_layer_tune): other plans timed as graph replays of
        T tokens with synthetic routing, the fastest kept if at least 3 % faster than the
        current one. stream: a cudaStream_t as an int (torch.cuda.Stream.cuda_stream), None for
        the legacy default stream. Synchronous, seconds per bucket; re-capture graphs of the
        layer made before it. Returns {"plans_tried", "plans_refused", "before_us", "after_us",
        "changed"}; Layer.plan(T) then says what was kept. CPU backends: FM_ERR_UNSUPPORTED."""
        T = as_int(T, "T")
        if stream is not None:
            stream = as_int(stream, "stream (a cudaStream_t as an int, or None)", 0, UINTPTR_MAX)
        info = _lib.LayerTuneInfo()
        with self._hd as h:
            check(lib.fm_layer_tune(h, T, stream, C.byref(info)), "Layer.tune")
        return {"plans_tried": info.plans_tried, "plans_refused": info.plans_refused, "before_us": info.before_us,
                "after_us": info.after_us, "changed": bool(info.changed)}


class PlansWarning(UserWarning):
    """A plan file given to a layer was not used (another GPU, driver, library version or
    layer shape): the planner's plans run instead. Layer.plans_note says why."""


_devices = {}
_devices_lock = threading.Lock()


def _open_device(ordinal):
    """One fm_cuda_device per ordinal for the process (layers on it share it; never closed)."""
    with _devices_lock:
        if ordinal not in _devices:
            d = C.c_void_p()
            check(lib.fm_cuda_device_open(ordinal, C.byref(d)), f"device {ordinal}")
            _devices[ordinal] = d
        return _devices[ordinal]


def route(cfg, logits, router_bias=None):
    """The library's routing (fm_moe_route) of logits [T][n_experts] float32:
    (ids int32 [T][top_k], weights float32 [T][top_k])."""
    if not isinstance(cfg, MoEConfig):
        raise TypeError(f"cfg: expected fp4moe.MoEConfig, got {type(cfg).__name__}")
    c = cfg._c()
    lg = np.asarray(logits)
    if lg.ndim != 2:
        raise ValueError(f"logits: expected shape [T][{cfg.n_experts}], got {lg.shape}")
    lg = _arr(lg, "logits", "float32", (lg.shape[0], cfg.n_experts))
    rb = _arr(router_bias, "router_bias", "float32", (cfg.n_experts,), True)
    T = as_int(lg.shape[0], "logits: T (rows)")
    ids = np.empty((T, cfg.top_k), np.int32)
    w = np.empty((T, cfg.top_k), np.float32)
    check(lib.fm_moe_route(C.byref(c), None if rb is None else rb.ctypes.data, lg.ctypes.data, T, ids.ctypes.data,
                           w.ctypes.data), "route")
    return ids, w


__all__ = ["MoEConfig", "MoEWeights", "Layer", "route", "to_bf16_bits"]
