"""torch ops: torch.ops.fp4moe.moe and torch.ops.fp4moe.moe_out.

    moe(int layer, Tensor x, Tensor? topk_ids=None, Tensor? topk_weights=None) -> Tensor
    moe_out(int layer, Tensor x, Tensor? topk_ids, Tensor? topk_weights, Tensor(a!) out) -> ()
    moe_routed(int layer, Tensor x) -> (Tensor out, Tensor topk_ids, Tensor topk_weights)

`layer` is the id of an fp4moe.torch_ops.MoE (an int, so the op's schema stays
plain and torch.compile bakes it in as a constant). x is BF16 [T][hidden] on the
layer's device; topk_ids int32 / topk_weights float32 [T][top_k] are the
engine's routing (global expert ids, -1 = none, weights used as given), or both
None for the layer's own routing. The output is the layer's out dtype
(BF16 by default) [T][hidden]; moe_out writes a preallocated one. moe_routed
runs the layer's own routing and also returns the int32 ids / float32 weights
[T][top_k] it chose (global ids; what an expert-parallel dispatch or a test
needs: passed back as topk_ids / topk_weights they give the same output, bit
for bit).

Registered with the low-level torch.library.Library API (not
@torch.library.custom_op, whose wrapper costs ~3x more per eager call), with
fake implementations so torch.compile(fullgraph=True) traces through them.
On CUDA the op only enqueues on torch.cuda.current_stream() of x's device
(fm_layer_run: no allocation, host planning or synchronisation), so it is
captured into CUDA graphs and replayed. What only the device can see (ids out
of range, NaN/Inf) is read with MoE.errors(), which synchronises.

Per-call host cost (issue 18; bench/py_overhead.py): the op's body is one
closure made per layer (MoE._fast) with everything it reads bound as locals:
one conjunction of cheap checks (dtype identity, shape tuple, device, contiguity,
alignment), the run arguments written into the prebuilt fm_layer_run_args with
one struct.pack_into, one ctypes call. Only when a check fails does the slow
path (MoE._check) run, to raise the exception naming the argument. Calling the
MoE object itself (moe(x, ...)) in plain eager mode skips the dispatcher too
(~2 us per call on a CPU tensor, more on CUDA): it takes the op's path whenever
torch.compile is tracing, a dispatch or function mode is active (FakeTensor,
functionalization, ...), the profiler is on (so traces still show fp4moe::moe),
or x is not a plain torch.Tensor.
"""

import ctypes as C
import itertools
import struct
import threading

import numpy as np
import torch

from . import _lib
from ._lib import ClosedError, check, lib
from .layer import Layer, MoEConfig, MoEWeights

_LIB = torch.library.Library("fp4moe", "DEF")
_LIB.define("moe(int layer, Tensor x, Tensor? topk_ids=None, Tensor? topk_weights=None) -> Tensor")
_LIB.define("moe_out(int layer, Tensor x, Tensor? topk_ids, Tensor? topk_weights, Tensor(a!) out) -> ()")
_LIB.define("moe_routed(int layer, Tensor x) -> (Tensor, Tensor, Tensor)")
_LIB.define("moe_dispatched(int layer, Tensor x, Tensor? counts, Tensor? offsets, Tensor? weights=None, "
            "Tensor? x_scales=None) -> Tensor")

_registry = {}
_ids = itertools.count(1)
_reg_lock = threading.Lock()
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_Tensor, _BF16, _I32, _F32 = torch.Tensor, torch.bfloat16, torch.int32, torch.float32
_empty = torch.empty
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_function_modes = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: True)
_profiling = getattr(torch._C._autograd, "_profiler_enabled", lambda: True)


def _args_packer():
    """struct.Struct writing (x, T, topk_ids, topk_weights, out, workspace, stream,
    routed_ids, routed_weights)
    into an fm_layer_run_args in one call, at the offsets ctypes (checked
    against the library at import, _lib._check_abi) says; NULL = 0."""
    S, pos, fmt = _lib.LayerRunArgs, 0, "="
    for name, ctype in S._fields_:
        d = getattr(S, name)
        code = "i" if ctype is C.c_int else {8: "Q", 4: "I"}[d.size]
        fmt += "x" * (d.offset - pos) + code
        pos = d.offset + d.size
    fmt += "x" * (C.sizeof(S) - pos)
    packer = struct.Struct(fmt)
    assert packer.size == C.sizeof(S), (fmt, C.sizeof(S))
    return packer.pack_into


_pack_args = _args_packer()


def _get(layer):
    try:
        return _registry[layer]
    except (KeyError, TypeError):
        raise ValueError(f"layer: {layer!r} is not the id of a live fp4moe.torch_ops.MoE") from None


class MoE:
    """An fp4moe layer for torch tensors. Build it from MoEWeights / a loaded
    checkpoint layer, or with from_modelopt / from_modelopt_experts /
    from_gpt_oss / from_checkpoint; call it like the op:

        y = moe(x)                               # internal routing
        y = moe(x, topk_ids, topk_weights)       # the engine's routing
        moe(x, topk_ids, topk_weights, out=buf)  # into a preallocated buffer
        y, ids, w = moe(x, return_routing=True)  # internal routing, and what it chose

    device: "cuda", "cuda:N" or "cpu" (the CPU backends; backend="cpu-ref" for
    the reference). out_dtype torch.bfloat16 or torch.float32. first_expert /
    n_local: an expert shard (weights of the local experts only, global ids,
    the output is the shard's partial sum). Calls from several threads take turns on
    the layer's lock; close() waits for the call in flight, and calls after it raise
    fp4moe.ClosedError."""

    def __init__(self, cfg, weights, *, device="cuda", max_tokens=256, out_dtype=torch.bfloat16, first_expert=0,
                 n_local=0, backend=None, work_list="auto", row_quantile="auto", plans=None):
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cuda", "cpu"):
            raise ValueError(f"device: expected a cuda or cpu device, got {dev}")
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype: expected torch.bfloat16 or torch.float32, got {out_dtype}")
        if backend is None:
            backend = "cuda" if dev.type == "cuda" else "cpu"
        if (backend == "cuda") != (dev.type == "cuda"):
            raise ValueError(f"backend: {backend!r} does not run on device {dev}")
        self.layer = Layer(cfg, weights, backend=backend, max_tokens=max_tokens,
                           out_dtype="bf16" if out_dtype == torch.bfloat16 else "f32",
                           first_expert=first_expert, n_local=n_local,
                           device=dev.index if dev.type == "cuda" else None, work_list=work_list,
                           row_quantile=row_quantile, plans=plans)
        self.cfg, self.device, self.out_dtype, self.max_tokens = self.layer.cfg, dev, out_dtype, max_tokens
        self.hidden, self.top_k = self.cfg.hidden, self.cfg.top_k
        self._cuda = dev.type == "cuda"
        self._dev_index = dev.index if self._cuda else -1
        self._hd = self.layer._hd  # the layer's handle and lock: every call below runs under it
        self._hd.what = "MoE"  # closed: "MoE is closed", from the op and from moe.layer alike
        self._h = self.layer._handle()  # unlocked, for bench/py_overhead.py's raw ctypes baseline only
        self._args = _lib.LayerRunArgs()
        self._aref = C.byref(self._args)  # made once: a byref per call costs more than the fields
        self._run = lib.fm_layer_run
        self._fast = self._make_fast()
        with _reg_lock:
            self.id = next(_ids)
            _registry[self.id] = self

    def close(self):
        """Unregister the id and destroy the layer, after the call in flight in another
        thread if there is one (a CUDA call has only enqueued: synchronise the streams
        that use the layer before closing it); calls after it raise fp4moe.ClosedError
        ("MoE is closed"), and the op with this id says it is not live."""
        _registry.pop(getattr(self, "id", None), None)
        if getattr(self, "layer", None) is not None:
            self.layer.close()

    def __call__(self, x, topk_ids=None, topk_weights=None, out=None, return_routing=False):
        if return_routing:  # (out, ids, weights): torch.ops.fp4moe.moe_routed
            if topk_ids is not None or topk_weights is not None:
                raise ValueError("fp4moe.moe: return_routing: only with internal routing "
                                 "(topk_ids given: the routing is yours)")
            if out is not None:
                raise ValueError("fp4moe.moe: return_routing: out= is not taken (the op returns new tensors)")
            if not _is_compiling() and type(x) is _Tensor and not _dispatch_modes() and not _function_modes() \
                    and not _profiling():
                return self._routed(x)
            return torch.ops.fp4moe.moe_routed.default(self.id, x)
        # plain eager call: the op's body without the dispatcher (module docstring)
        if not _is_compiling() and type(x) is _Tensor and not _dispatch_modes() and not _function_modes() \
                and not _profiling():
            y = self._fast(x, topk_ids, topk_weights, out)
            if y is not None:
                return y
        if out is None:
            return torch.ops.fp4moe.moe.default(self.id, x, topk_ids, topk_weights)
        torch.ops.fp4moe.moe_out.default(self.id, x, topk_ids, topk_weights, out)
        return out

    def _make_fast(self):
        """The op's body for this layer: check cheaply, launch, return out (a new
        tensor when out is None), or None when a check failed (nothing launched:
        the caller then runs _check, which raises naming the argument)."""
        H, k, max_t, odt, dev = self.hidden, self.top_k, self.max_tokens, self.out_dtype, self.device
        args, run, hd, ref, pack, empty = self._args, self._run, self._hd, self._aref, _pack_args, _empty
        lock = hd.lock
        BF16, I32, F32 = _BF16, _I32, _F32
        cuda, di = self._cuda, self._dev_index
        raw = _raw_stream if _raw_stream is not None else \
            (lambda i: torch.cuda.current_stream(i).cuda_stream)  # noqa: E731

        def fast(x, ids, w, out):
            try:
                T, hx = x.shape
                if x.dtype is not BF16 or hx != H or not 0 < T <= max_t or x.device != dev or \
                        not x.is_contiguous():
                    return None
                if ids is None:
                    if w is not None:
                        return None
                    ip = wp = 0
                else:
                    if ids.dtype is not I32 or w.dtype is not F32 or ids.shape != (T, k) or w.shape != (T, k) or \
                            ids.device != dev or w.device != dev or not ids.is_contiguous() or \
                            not w.is_contiguous():
                        return None
                    ip, wp = ids.data_ptr(), w.data_ptr()
                if out is None:
                    out = empty((T, H), dtype=odt, device=dev)
                elif out.dtype is not odt or out.shape != (T, H) or out.device != dev or not out.is_contiguous():
                    return None
                xp, op = x.data_ptr(), out.data_ptr()
                if (xp | op) & 15:
                    return None
            except (AttributeError, TypeError, ValueError):  # not a tensor, not 2-D, ...
                return None
            with lock:  # against a close in another thread, and args is shared by the calls
                h = hd.ptr
                if not h:
                    raise ClosedError("MoE is closed")
                pack(args, 0, xp, T, ip, wp, op, 0, raw(di) if cuda else 0, 0, 0)
                rc = run(h, ref)
            if rc:
                check(rc, "fp4moe.moe")
            return out

        return fast

    def _routed(self, x):
        """moe_routed's body: internal routing into new (out, ids, weights)."""
        T = self._check(x, None, None, None)
        dev, k = self.device, self.top_k
        out = torch.empty((T, self.hidden), dtype=self.out_dtype, device=dev)
        ids = torch.empty((T, k), dtype=torch.int32, device=dev)
        w = torch.empty((T, k), dtype=torch.float32, device=dev)
        stream = (_raw_stream(self._dev_index) if _raw_stream else torch.cuda.current_stream(dev).cuda_stream) \
            if self._cuda else 0
        with self._hd as h:
            _pack_args(self._args, 0, x.data_ptr(), T, 0, 0, out.data_ptr(), 0, stream, ids.data_ptr(), w.data_ptr())
            rc = self._run(h, self._aref)
        if rc:
            check(rc, "fp4moe.moe_routed")
        return out, ids, w

    # ---- checks: every argument named, with what was expected -------------
    def _bad(self, arg, t, what):
        got = (f"{t.dtype} {list(t.shape)} on {t.device}" + ("" if t.is_contiguous() else " (non-contiguous)")
               if isinstance(t, torch.Tensor) else type(t).__name__)
        raise ValueError(f"fp4moe.moe: {arg}: expected {what}, got {got}")

    def _check_x(self, x):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2 or \
                x.shape[1] != self.hidden or x.device != self.device or not x.is_contiguous():
            self._bad("x", x, f"a contiguous torch.bfloat16 tensor [T][{self.hidden}] on {self.device}")
        T = x.shape[0]
        if not 1 <= T <= self.max_tokens:
            raise ValueError(f"fp4moe.moe: x: T={T} outside [1, max_tokens={self.max_tokens}]")
        return T

    def _check(self, x, ids, w, out):
        T = self._check_x(x)
        if (ids is None) != (w is None):
            raise ValueError("fp4moe.moe: topk_ids, topk_weights: give both (external routing) or neither")
        if ids is not None:
            k = self.top_k
            for arg, t, dt in (("topk_ids", ids, torch.int32), ("topk_weights", w, torch.float32)):
                if not isinstance(t, torch.Tensor) or t.dtype != dt or t.dim() != 2 or t.shape[0] != T or \
                        t.shape[1] != k or t.device != self.device or not t.is_contiguous():
                    self._bad(arg, t, f"a contiguous {dt} tensor [{T}][{k}] on {self.device}")
        if out is not None:
            if not isinstance(out, torch.Tensor) or out.dtype != self.out_dtype or out.dim() != 2 or \
                    out.shape[0] != T or out.shape[1] != self.hidden or out.device != self.device or \
                    not out.is_contiguous():
                self._bad("out", out, f"a contiguous {self.out_dtype} tensor [{T}][{self.hidden}] on {self.device}")
        for arg, t in (("x", x), ("out", out)):
            if t is not None and t.data_ptr() % 16:
                raise ValueError(f"fp4moe.moe: {arg}: data pointer {t.data_ptr():#x} is not 16-byte aligned "
                                 "(a view at an odd offset?)")
        return T

    def _launch(self, x, ids, w, out, T):
        stream = (_raw_stream(self._dev_index) if _raw_stream else torch.cuda.current_stream(self.device).cuda_stream) \
            if self._cuda else None
        with self._hd as h:
            a = self._args
            a.x, a.T, a.out = x.data_ptr(), T, out.data_ptr()
            if ids is None:
                a.topk_ids = a.topk_weights = None
            else:
                a.topk_ids, a.topk_weights = ids.data_ptr(), w.data_ptr()
            if self._cuda:
                a.stream = stream
            rc = self._run(h, self._aref)
        if rc:
            check(rc, "fp4moe.moe")

    def errors(self, raise_on_error=True):
        """Synchronise the current stream and read what the device recorded since
        the last call (fm_layer_errors): ids out of range, NaN/Inf in x or the
        router logits, a dispatched run's bad counts / offsets. Raises fp4moe.Error when something was recorded (or
        returns the record as a dict with raise_on_error=False)."""
        info = _lib.LayerErrorInfo()
        stream = torch.cuda.current_stream(self.device).cuda_stream if self._cuda else None
        with self._hd as h:
            rc = lib.fm_layer_errors(h, stream, C.byref(info))
        rec = {f: getattr(info, f) for f, _ in info._fields_}
        if rc and raise_on_error:
            check(rc, f"fp4moe.moe errors {rec}")
        return rec

    def dispatched(self, x, counts=None, offsets=None, weights=None, x_scales=None):
        """Expert parallelism: the layer's experts on rows an all-to-all dispatch left in place
        (torch.ops.fp4moe.moe_dispatched; fm_layer_run_dispatched), answered in the same layout
        for the combine: counts int32 [n_local] with x [n_local][capacity][hidden]
        (low-latency layout; rows past counts[e] are neither read nor written: zeros in the
        returned tensor), or offsets int32 [n_local + 1] with x [rows][hidden] (rows contiguous
        by expert). x BF16, or uint8 / float8_e4m3fn E4M3 codes with x_scales float32
        [..][ceil(hidden / 128)] for a W4A8 layer (act_fp8 "block128"). weights (float32, one
        per row): out rows multiplied by it; None: the combine applies the routing weights.
        CPU backends, and the cuda backend on BF16 rows of a W4A16 layer (a W4A8 layer's
        rows, BF16 or FP8: fp4moe.Error FM_ERR_UNSUPPORTED, not built on cuda yet): asynchronous on the current stream, counts /
        offsets read and checked on the device, a bad expert's rows skipped (zeros here) and
        reported by errors() (FM_ERR_BAD_SHAPE, bad_experts / first_bad_expert), as NaN/Inf
        in the rows is. Compiled, not yet run on a GPU."""
        return torch.ops.fp4moe.moe_dispatched.default(self.id, x, counts, offsets, weights, x_scales)

    def _dispatched(self, x, counts, offsets, weights, x_scales):
        lead = self._check_dispatched(x, counts, offsets, weights, x_scales)
        out = torch.zeros((*lead, self.hidden), dtype=self.out_dtype, device=self.device)
        a = _lib.LayerDispatchArgs()
        a.layout = 1 if counts is not None else 2
        if x_scales is None:
            a.x = x.data_ptr()
        else:
            a.x_fp8, a.x_scales = x.data_ptr(), x_scales.data_ptr()
        if counts is not None:
            a.counts, a.capacity = counts.data_ptr(), x.shape[1]
        else:  # the rows x holds bound the run (its plan, and offsets past them are refused)
            a.offsets, a.max_rows = offsets.data_ptr(), x.shape[0]
        a.weights = None if weights is None else weights.data_ptr()
        a.out = out.data_ptr()
        if self._cuda:
            a.stream = _raw_stream(self._dev_index) if _raw_stream else torch.cuda.current_stream(self.device).cuda_stream
        with self._hd as h:
            rc = lib.fm_layer_run_dispatched(h, C.byref(a))
        if rc:
            check(rc, "fp4moe.moe_dispatched")
        return out

    def _check_dispatched(self, x, counts, offsets, weights, x_scales, fake=False):
        """The dispatched rows' arguments, each named; returns the layout's leading shape
        (fake: at trace time, where tensors have no data)."""
        what = "fp4moe.moe_dispatched"
        if (counts is None) == (offsets is None):
            raise ValueError(f"{what}: counts, offsets: give counts (expert-major layout) or offsets (rows by "
                             "expert), one of them")
        H, nl, dev = self.hidden, self.layer.n_local, self.device
        fp8 = x_scales is not None
        xdt = (torch.uint8, getattr(torch, "float8_e4m3fn", torch.uint8)) if fp8 else (torch.bfloat16,)
        ndim = 3 if counts is not None else 2
        if not isinstance(x, torch.Tensor) or x.dtype not in xdt or x.dim() != ndim or x.shape[-1] != H or \
                (ndim == 3 and (x.shape[0] != nl or x.shape[1] < 1)) or x.device != dev or not x.is_contiguous():
            shape = f"[{nl}][capacity][{H}]" if ndim == 3 else f"[rows][{H}]"
            self._bad("x", x, f"a contiguous {' or '.join(map(str, xdt))} tensor {shape} on {dev}")
        lead = tuple(x.shape[:-1])
        nb = (H + 127) // 128
        for arg, t, dt, shape in (("counts", counts, torch.int32, (nl,)), ("offsets", offsets, torch.int32, (nl + 1,)),
                                  ("weights", weights, torch.float32, lead),
                                  ("x_scales", x_scales, torch.float32, (*lead, nb))):
            if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != dt or tuple(t.shape) != shape or
                                  t.device != dev or not t.is_contiguous()):
                self._bad(arg, t, f"a contiguous {dt} tensor {list(shape)} on {dev}")
        if not fake and x.data_ptr() % 16:
            raise ValueError(f"{what}: x: data pointer {x.data_ptr():#x} is not 16-byte aligned")
        return lead

    # ---- weights as checkpoints store them ---------------------------------
    @classmethod
    def from_checkpoint(cls, path, layer, *, routing=None, first_expert=0, n_local=0, **kw):
        """Load layer `layer` of a ModelOpt / gpt-oss checkpoint (file, folder or index);
        with n_local, the expert-parallel shard [first_expert, first_expert + n_local)
        (global router and ids, the output is the shard's partial sum)."""
        from .checkpoint import Checkpoint

        with Checkpoint(path) as ck:  # a shard: the global router (fm_ckpt_load_opts.global_router)
            loaded = ck.load_layer(layer, first_expert, n_local, routing=routing,
                                   global_router=bool(first_expert or n_local))
        try:
            return cls(None, loaded, **kw)  # a shard's first_expert / n_local: the loaded layer's
        finally:
            loaded.close()

    @classmethod
    def _from_tensors(cls, cfg, tensors, what, kw):
        """The layer the C loader makes of tensors named as a checkpoint of their layout."""
        from .checkpoint import load_tensors

        loaded = load_tensors(cfg, tensors, what, kw.get("first_expert", 0), kw.get("n_local", 0))
        try:
            return cls(cfg, loaded, **kw)
        finally:
            loaded.close()

    @classmethod
    def from_modelopt(cls, cfg, router_weight, w13_weight, w13_weight_scale, w13_weight_scale_2, w2_weight,
                      w2_weight_scale, w2_weight_scale_2, *, router_bias=None, w13_input_scale=None,
                      w2_input_scale=None, shared_w13=None, shared_w2=None, **kw):
        """ModelOpt NVFP4 expert weights stacked over experts, as engines hold them:
        w13_weight uint8 [E][2*inter][hidden/2] (gate rows then up rows, low nibble
        = even element), w13_weight_scale float8_e4m3fn (or uint8) [E][2*inter][hidden/16],
        w13_weight_scale_2 float32 [E] (or [E][2]: gate, up), w2_* likewise
        [E][hidden][inter/2] ..., input scales float32 [E] (or [E][2]). Loaded by the
        library's ModelOpt loader (src/io/load_modelopt.c) as the per-expert tensors
        they hold, so differing gate / up globals are taken as they are, as from a
        checkpoint (fm_moe_weights.w13_up_global: no block scale re-encoded; the cuda
        backend's FC1 epilogue applies each half's global).
        With first_expert / n_local, E is the shard's experts and the router global."""
        if cfg.wfmt != "nvfp4":
            raise ValueError(f"cfg.wfmt: ModelOpt weights are NVFP4, cfg says {cfg.wfmt!r}")
        d13, s13, g13 = _host(w13_weight, "w13_weight"), _host(w13_weight_scale, "w13_weight_scale"), \
            _float(w13_weight_scale_2, "w13_weight_scale_2")
        d2, s2, g2 = _host(w2_weight, "w2_weight"), _host(w2_weight_scale, "w2_weight_scale"), \
            _float(w2_weight_scale_2, "w2_weight_scale_2")
        a1, a2 = _float(w13_input_scale, "w13_input_scale"), _float(w2_input_scale, "w2_input_scale")
        for arg, a in (("w13_weight", d13), ("w13_weight_scale", s13), ("w2_weight", d2), ("w2_weight_scale", s2)):
            if a.ndim != 3:
                raise ValueError(f"{arg}: expected [E][rows][cols], got shape {list(a.shape)}")
        if d13.shape[1] % 2 or s13.shape[1] != d13.shape[1]:
            raise ValueError(f"w13_weight, w13_weight_scale: expected [E][2*inter] rows each (gate then up), got "
                             f"{list(d13.shape)} and {list(s13.shape)}")
        E, half = d13.shape[0], d13.shape[1] // 2
        experts = []
        for e in range(E):
            g = _pair("w13_weight_scale_2", g13, e, E)
            i = None if a1 is None else _pair("w13_input_scale", a1, e, E)
            gate = {"weight": d13[e, :half], "weight_scale": s13[e, :half], "weight_scale_2": g[0]}
            up = {"weight": d13[e, half:], "weight_scale": s13[e, half:], "weight_scale_2": g[1]}
            down = {"weight": d2[e], "weight_scale": s2[e], "weight_scale_2": _pair("w2_weight_scale_2", g2, e, E)[0]}
            if i is not None:
                gate["input_scale"], up["input_scale"] = i
            if a2 is not None:
                down["input_scale"] = _pair("w2_input_scale", a2, e, E)[0]
            experts.append({"gate_proj": gate, "up_proj": up, "down_proj": down})
        shared = None
        if shared_w13 is not None or shared_w2 is not None:
            sw13, sw2 = _bf16(shared_w13, "shared_w13"), _bf16(shared_w2, "shared_w2")
            if sw13 is None or sw2 is None or sw13.ndim != 2 or sw13.shape[0] % 2:
                raise ValueError("shared_w13, shared_w2: give both, shared_w13 [2*shared_inter][hidden]")
            S = sw13.shape[0] // 2
            shared = {"gate_proj": sw13[:S], "up_proj": sw13[S:], "down_proj": sw2}
        from .checkpoint import modelopt_tensors

        t = modelopt_tensors(_float(router_weight, "router_weight"), experts, _float(router_bias, "router_bias"),
                             shared, kw.get("first_expert", 0))
        return cls._from_tensors(cfg, t, "MoE.from_modelopt", kw)

    @classmethod
    def from_modelopt_experts(cls, cfg, router_weight, experts, **kw):
        """experts: a list over experts of {"gate_proj": {"weight", "weight_scale",
        "weight_scale_2"[, "input_scale"]}, "up_proj": {...}, "down_proj": {...}},
        the per-expert tensors of a ModelOpt checkpoint as they are stored, loaded by
        the library's ModelOpt loader (src/io/load_modelopt.c); gate and up may have
        different weight_scale_2, taken as they are (as from_modelopt)."""
        if not isinstance(experts, (list, tuple)):
            raise TypeError(f"experts: expected a list of per-expert dicts, got {type(experts).__name__}")
        host = [{p: {k: _float(a, f"experts[{e}][{p!r}][{k!r}]") for k, a in d.items()}
                 if isinstance(d, dict) else d for p, d in ex.items()} if isinstance(ex, dict) else ex
                for e, ex in enumerate(experts)]
        from .checkpoint import modelopt_tensors

        t = modelopt_tensors(_float(router_weight, "router_weight"), host, first_expert=kw.get("first_expert", 0))
        return cls._from_tensors(cfg, t, "MoE.from_modelopt_experts", kw)

    @classmethod
    def from_gpt_oss(cls, cfg, router_weight, gate_up_proj_blocks, gate_up_proj_scales, down_proj_blocks,
                     down_proj_scales, *, gate_up_proj_bias=None, down_proj_bias=None, router_bias=None, **kw):
        """gpt-oss MXFP4 experts as the checkpoint stores them: *_blocks uint8
        [E][N][K/32][16], *_scales uint8 (UE8M0) [E][N][K/32]; gate_up rows
        interleave gate and up (row 2i = gate i, 2i+1 = up i), and so does
        gate_up_proj_bias [E][2*inter] (down_proj_bias [E][hidden]; float32 /
        bfloat16 / float16). router_bias: the router's logit bias [E] (score
        "softmax-topk"). cfg must say gpt-oss's experts: activation="swiglu-gptoss"
        with its swiglu_limit (7.0 in the released models). Loaded by the library's
        gpt-oss loader (src/io/load_gptoss.c); with first_expert / n_local, E is the
        layer's experts or the shard's, the router global."""
        if cfg.wfmt != "mxfp4":
            raise ValueError(f"cfg.wfmt: gpt-oss weights are MXFP4, cfg says {cfg.wfmt!r}")
        if cfg.activation != "swiglu-gptoss":
            raise ValueError(f"cfg.activation: gpt-oss's experts are 'swiglu-gptoss' (with swiglu_limit, 7.0 in "
                             f"the released models), cfg says {cfg.activation!r}")
        fused = {"gate_up_proj_blocks": _host(gate_up_proj_blocks, "gate_up_proj_blocks"),
                 "gate_up_proj_scales": _host(gate_up_proj_scales, "gate_up_proj_scales"),
                 "gate_up_proj_bias": _float(gate_up_proj_bias, "gate_up_proj_bias"),
                 "down_proj_blocks": _host(down_proj_blocks, "down_proj_blocks"),
                 "down_proj_scales": _host(down_proj_scales, "down_proj_scales"),
                 "down_proj_bias": _float(down_proj_bias, "down_proj_bias")}
        from .checkpoint import gpt_oss_tensors

        t = gpt_oss_tensors(_float(router_weight, "router_weight"), fused, _float(router_bias, "router_bias"))
        return cls._from_tensors(cfg, t, "MoE.from_gpt_oss", kw)


# torch dtypes numpy has only through ml_dtypes: (ml_dtypes name, torch dtype of the same width)
_ML = {torch.bfloat16: ("bfloat16", torch.int16), torch.float8_e4m3fn: ("float8_e4m3fn", torch.uint8),
       torch.float8_e5m2: ("float8_e5m2", torch.uint8)}
if hasattr(torch, "float8_e8m0fnu"):
    _ML[torch.float8_e8m0fnu] = ("float8_e8m0fnu", torch.uint8)


def _host(t, arg):
    """A host numpy array of t's bytes and element type, for the C loaders to read:
    a contiguous CPU tensor is shared, not copied (a device or strided one is copied
    once); bfloat16 / float8 as ml_dtypes arrays."""
    if t is None or isinstance(t, np.ndarray):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg}: expected a torch.Tensor or numpy array, got {type(t).__name__}")
    t = t.detach().to("cpu").contiguous()
    m = _ML.get(t.dtype)
    if m is not None:
        import ml_dtypes

        return t.view(m[1]).numpy().view(getattr(ml_dtypes, m[0]))
    try:
        return t.numpy()
    except TypeError:
        raise TypeError(f"{arg}: {t.dtype} has no checkpoint dtype") from None


def _float(t, arg):
    """_host, with float64 (which no layout stores for these tensors) as float32."""
    a = _host(t, arg)
    return a.astype(np.float32) if a is not None and a.dtype == np.float64 else a


def _bf16(t, arg):
    """A BF16 shared-expert matrix: uint16 arrays hold BF16 bits; torch floats are rounded to BF16."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        t = t.to(torch.bfloat16)
    a = _host(t, arg)
    if a is not None and a.dtype == np.uint16:
        import ml_dtypes

        a = np.ascontiguousarray(a).view(ml_dtypes.bfloat16)
    return a


def _pair(arg, a, e, E):
    """(gate, up) one-element views of expert e's scale in a [E], [E][1] or [E][2] array."""
    if a.shape[:1] != (E,) or a.ndim > 2 or (a.ndim == 2 and a.shape[1] not in (1, 2)):
        raise ValueError(f"{arg}: expected [{E}] (or [{E}][2] gate/up), got shape {list(a.shape)}")
    if a.ndim == 1:
        return a[e:e + 1], a[e:e + 1]
    return a[e, :1], a[e, -1:]


def _rejected(L, x, ids, w, out):
    """A fast check failed: _check raises, naming the argument."""
    L._check(x, ids, w, out)
    raise ValueError("fp4moe.moe: the arguments were rejected (x, topk_ids, topk_weights, out)")


def _moe(layer, x, topk_ids=None, topk_weights=None):
    try:
        L = _registry[layer]
    except (KeyError, TypeError):
        L = _get(layer)
    y = L._fast(x, topk_ids, topk_weights, None)
    if y is None:
        _rejected(L, x, topk_ids, topk_weights, None)
    return y


def _moe_out(layer, x, topk_ids, topk_weights, out):
    if out is None:
        raise ValueError("fp4moe.moe_out: out: required")
    try:
        L = _registry[layer]
    except (KeyError, TypeError):
        L = _get(layer)
    if L._fast(x, topk_ids, topk_weights, out) is None:
        _rejected(L, x, topk_ids, topk_weights, out)


def _moe_routed(layer, x):
    return _get(layer)._routed(x)


def _moe_dispatched(layer, x, counts, offsets, weights=None, x_scales=None):
    return _get(layer)._dispatched(x, counts, offsets, weights, x_scales)


for _key in ("CPU", "CUDA"):
    _LIB.impl("moe", _moe, _key)
    _LIB.impl("moe_out", _moe_out, _key)
    _LIB.impl("moe_routed", _moe_routed, _key)
    _LIB.impl("moe_dispatched", _moe_dispatched, _key)


def _fake_check(L, x, ids, w, out):
    """The shape/dtype checks that do not need data, at trace time."""
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != L.hidden:
        L._bad("x", x, f"a torch.bfloat16 tensor [T][{L.hidden}]")
    if (ids is None) != (w is None):
        raise ValueError("fp4moe.moe: topk_ids, topk_weights: give both (external routing) or neither")
    if ids is not None and (ids.dtype != torch.int32 or w.dtype != torch.float32 or ids.dim() != 2 or
                            ids.shape[1] != L.top_k):
        L._bad("topk_ids", ids, f"int32 [T][{L.top_k}] with float32 topk_weights")
    if out is not None and (out.dtype != L.out_dtype or out.dim() != 2 or out.shape[1] != L.hidden):
        L._bad("out", out, f"{L.out_dtype} [T][{L.hidden}]")


@torch.library.register_fake("fp4moe::moe", lib=_LIB)
def _moe_fake(layer, x, topk_ids=None, topk_weights=None):
    L = _get(layer)
    _fake_check(L, x, topk_ids, topk_weights, None)
    return x.new_empty((x.shape[0], L.hidden), dtype=L.out_dtype)


@torch.library.register_fake("fp4moe::moe_out", lib=_LIB)
def _moe_out_fake(layer, x, topk_ids, topk_weights, out):
    _fake_check(_get(layer), x, topk_ids, topk_weights, out)
    return None


@torch.library.register_fake("fp4moe::moe_routed", lib=_LIB)
def _moe_routed_fake(layer, x):
    L = _get(layer)
    _fake_check(L, x, None, None, None)
    T = x.shape[0]
    return (x.new_empty((T, L.hidden), dtype=L.out_dtype), x.new_empty((T, L.top_k), dtype=torch.int32),
            x.new_empty((T, L.top_k), dtype=torch.float32))


@torch.library.register_fake("fp4moe::moe_dispatched", lib=_LIB)
def _moe_dispatched_fake(layer, x, counts, offsets, weights=None, x_scales=None):
    L = _get(layer)
    lead = L._check_dispatched(x, counts, offsets, weights, x_scales, fake=True)
    return x.new_empty((*lead, L.hidden), dtype=L.out_dtype)


__all__ = ["MoE", "MoEConfig", "MoEWeights"]
