"""Safetensors checkpoints (ModelOpt NVFP4, compressed-tensors, gpt-oss MXFP4) through
the library's reader and layer loaders (include/fp4moe/io.h, docs/checkpoints.md), from
files or from tensors in memory (Checkpoint.from_tensors: the same loaders, so no layout
is converted here)."""

import ctypes as C
import warnings

import numpy as np

from . import _lib
from ._args import as_cstr, as_int, as_path
from ._lib import check, lib
from .format import FORMAT_NAMES
from .layer import MoEConfig, MoEWeights

# fm_dtype -> numpy dtype of one element (None: no numpy equivalent; bytes returned).
_NP = {0: np.bool_, 1: np.uint8, 2: np.int8, 3: np.uint16, 4: np.int16, 5: np.uint32, 6: np.int32, 7: np.uint64,
       8: np.int64, 9: np.float16, 10: "bfloat16", 11: np.float32, 12: np.float64, 13: "float8_e4m3fn",
       14: "float8_e5m2", 15: "float8_e8m0fnu", 16: None}


def _code_of(a, arg):
    """The fm_dtype of a numpy array's element type (ml_dtypes' bfloat16 / float8 included)."""
    name = a.dtype.name
    for code, d in _NP.items():
        if d is not None and (d == name if isinstance(d, str) else np.dtype(d) == a.dtype):
            return code
    raise TypeError(f"{arg}: dtype {name} has no safetensors equivalent (expected one of bool, (u)int8-64, "
                    "float16/32/64, bfloat16, float8_e4m3fn, float8_e5m2, float8_e8m0fnu)")


def _np_dtype(code):
    d = _NP.get(code)
    if isinstance(d, str):
        try:
            import ml_dtypes
            return np.dtype(getattr(ml_dtypes, d))
        except (ImportError, AttributeError):
            return np.dtype(np.uint16 if d == "bfloat16" else np.uint8)  # raw codes
    return None if d is None else np.dtype(d)


class Checkpoint:
    """A safetensors file, a folder of shards or an index (fm_checkpoint_open). Its methods
    may be called from several threads; each takes the checkpoint's lock for its C calls
    (they take turns), and close() waits for the call in flight, after which calls raise
    fp4moe.ClosedError. Layers it loaded are independent of it and outlive it."""

    def __init__(self, path):
        self.path, cpath = as_path(path, "path")
        h = C.c_void_p()
        check(lib.fm_checkpoint_open(cpath, C.byref(h)), self.path)
        self._keep = None
        self._hd = _lib.Handle("Checkpoint", h)

    @classmethod
    def from_tensors(cls, tensors, label="tensors in memory"):
        """A checkpoint over arrays in memory (fm_checkpoint_open_tensors): `tensors` maps
        names to numpy arrays named, shaped and typed as a checkpoint stores them (the
        layouts of docs/checkpoints.md; bfloat16 / float8 as ml_dtypes arrays), read by
        the same C loaders as a file. The arrays are borrowed, not copied (a strided one
        is read through a contiguous copy) and never written; the checkpoint keeps them
        alive until close(). There is no config.json: give load_layer / load_shard the
        routing."""
        if not isinstance(tensors, dict):
            raise TypeError(f"tensors: expected a dict of name -> numpy array, got {type(tensors).__name__}")
        clabel = as_cstr(label, "label")
        views, keep = (_lib.TensorView * max(len(tensors), 1))(), []
        for i, (name, a) in enumerate(tensors.items()):
            cname = as_cstr(name, "tensors name")
            if not isinstance(a, np.ndarray):
                raise TypeError(f"tensors[{name!r}]: expected a numpy array, got {type(a).__name__}")
            if a.ndim > _lib.ST_MAX_DIMS:
                raise ValueError(f"tensors[{name!r}]: {a.ndim} dimensions, more than {_lib.ST_MAX_DIMS}")
            if not a.dtype.isnative:  # safetensors data is little-endian, as this host
                a = a.astype(a.dtype.newbyteorder("="))
            code = _code_of(a, f"tensors[{name!r}]")
            a = np.ascontiguousarray(a)
            keep += [cname, a]
            views[i] = _lib.TensorView(cname, code, a.ndim, (C.c_int64 * _lib.ST_MAX_DIMS)(*a.shape),
                                       a.ctypes.data if a.size else None)
        h = C.c_void_p()
        check(lib.fm_checkpoint_open_tensors(views, len(tensors), clabel, C.byref(h)), label)
        self = cls.__new__(cls)
        self.path, self._keep = label, keep
        self._hd = _lib.Handle("Checkpoint", h)
        return self

    def close(self):
        hd = getattr(self, "_hd", None)
        if hd is not None:
            hd.close(lib.fm_checkpoint_close)
            self._keep = None  # after the close: the library no longer reads them

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def names(self):
        with self._hd as h:  # the names live in the checkpoint's memory
            return [lib.fm_checkpoint_tensor_at(h, i).contents.name.decode()
                    for i in range(lib.fm_checkpoint_tensor_count(h))]

    def tensor(self, name):
        """A copy of one tensor as numpy (F4 as packed uint8 bytes)."""
        cname = as_cstr(name, "name")
        p = C.POINTER(_lib.StTensor)()
        with self._hd as h:  # p points into the checkpoint
            check(lib.fm_checkpoint_find(h, cname, C.byref(p)), name)
            t = p.contents
            raw = np.empty(t.nbytes, np.uint8)
            check(lib.fm_st_read(p, 0, t.nbytes, raw.ctypes.data), name)
            dt = _np_dtype(t.dtype)
            shape = tuple(t.shape[i] for i in range(t.ndim))
        return raw if dt is None else raw.view(dt).reshape(shape)

    def scan(self):
        """{layout, wfmt, layers: {layer: experts}, expert_bytes} (fm_checkpoint_scan)."""
        s = _lib.CkptScan()
        with self._hd as h:
            check(lib.fm_checkpoint_scan(h, None, C.byref(s)), self.path)
        try:
            return {"layout": lib.fm_ckpt_layout_name(s.layout).decode(), "wfmt": FORMAT_NAMES[s.wfmt],
                    "layers": {s.layers[i]: s.experts[i] for i in range(s.n_layers)},
                    "expert_bytes": s.expert_bytes}
        finally:
            lib.fm_ckpt_scan_free(C.byref(s))

    def load_layer(self, layer, first_expert=0, n_experts=0, routing=None, global_router=False):
        """MoE layer `layer` in fp4moe's layout (fm_checkpoint_load_layer): experts
        [first_expert, first_expert + n_experts) (0 = all). routing: a MoEConfig
        whose top_k/score/groups/renormalize/routed_scale/act_nvfp4 replace what
        config.json next to the checkpoint says. global_router: the experts are a
        shard of the whole layer (fm_ckpt_load_opts.global_router: the router keeps
        every expert's row, cfg.n_experts is the layer's; see load_shard)."""
        layer = as_int(layer, "layer", 0)
        opts = _lib.CkptLoadOpts()
        opts.first_expert, opts.n_experts = as_int(first_expert, "first_expert", 0), as_int(n_experts, "n_experts", 0)
        opts.global_router = 1 if global_router else 0
        rc = None
        if routing is not None:
            if not isinstance(routing, MoEConfig):
                raise TypeError(f"routing: expected fp4moe.MoEConfig, got {type(routing).__name__}")
            rc = routing._c()
            opts.routing = C.pointer(rc)
        out = C.POINTER(_lib.CkptLayer)()
        with self._hd as h:
            check(lib.fm_checkpoint_load_layer(h, layer, C.byref(opts), C.byref(out)), f"{self.path} layer {layer}")
        return LoadedLayer(out)


    def load_shard(self, layer, first_expert, n_local, routing=None):
        """An expert-parallel shard: experts [first_expert, first_expert + n_local)
        with the GLOBAL router (all experts' rows, and the ranking bias), so that
        Layer(cfg, weights, first_expert=, n_local=) routes over global ids and
        returns this shard's partial sum. (load_layer with first_expert/n_experts
        instead makes a standalone layer routing among the loaded experts only.)
        Returns (cfg with the global n_experts, MoEWeights)."""
        layer = as_int(layer, "layer", 0)
        first_expert, n_local = as_int(first_expert, "first_expert", 0), as_int(n_local, "n_local", 0)
        part = self.load_layer(layer, first_expert, n_local, routing, global_router=True)
        try:
            return part.cfg, part.weights()
        finally:
            part.close()


class NotModelledWarning(UserWarning):
    """A loaded layer's model computes something fp4moe's layer did not load (expert biases or
    a router logit bias the layout leaves out): the layer runs, but its output is not the
    model's (LoadedLayer.not_modelled lists what)."""


class LoadedLayer:
    """One layer loaded from a checkpoint (owns the library's fm_ckpt_layer).
    Pass it as the weights of fp4moe.Layer; .weights() copies it into MoEWeights.
    not_modelled: what the model computes and fp4moe's layer does not (empty for the
    layers it models exactly); loading such a layer warns (NotModelledWarning).
    w13_split_globals: experts whose gate and up weight_scale_2 differ (held as stored:
    weights().w13_up_global; no block scale re-encoded)."""

    def __init__(self, ptr):
        self._hd = _lib.Handle("LoadedLayer", ptr)
        c = ptr.contents
        self.cfg = MoEConfig._from_c(c.cfg)
        self.layer, self.first_expert, self.n_local = c.layer, c.first_expert, c.n_local
        self.layout = lib.fm_ckpt_layout_name(c.layout).decode()
        self.has_router_bias, self.has_input_scales = bool(c.has_router_bias), bool(c.has_input_scales)
        self.w13_split_globals, self.ignored_bias = c.w13_split_globals, bool(c.ignored_bias)
        self.ignored_router_bias = bool(c.ignored_router_bias)
        self.has_expert_bias = bool(c.has_expert_bias)
        nm = []
        if self.ignored_bias:
            nm.append("expert biases")
        if self.ignored_router_bias:
            nm.append("a router logit bias")
        self.not_modelled = tuple(nm)
        if nm:
            warnings.warn(f"layer {self.layer}: {', '.join(nm)}: not loaded (fp4moe's layer does not model "
                          f"{'them' if len(nm) > 1 else 'it'}); its output is not the model's layer",
                          NotModelledWarning, stacklevel=3)

    def close(self):
        """Free the loaded arrays, after a weights() or Layer(None, this) in flight in another
        thread; later uses raise fp4moe.ClosedError. A Layer made from it keeps working."""
        hd = getattr(self, "_hd", None)
        if hd is not None:
            hd.close(lib.fm_ckpt_layer_free)

    __del__ = close

    def weights(self):
        """Copies of the loaded arrays as MoEWeights (for inspection or a reference)."""
        with self._hd as p:
            return self._weights(p.contents)

    def _weights(self, c):
        cfg = c.cfg  # the shapes the arrays have: not self.cfg, which the caller may change
        E, H, S = c.n_local, cfg.hidden, cfg.shared_inter  # experts held (a global router: fewer than its rows)
        R = cfg.n_experts

        def f32(p, n):
            return None if not p else np.ctypeslib.as_array(p, (n,)).copy()

        def mats(arr):
            ds, ss, gs = [], [], []
            for e in range(E):
                q = arr[e]
                fp4 = q.fmt != 0
                nb = q.rows * q.cols // 2 if fp4 else q.rows * q.cols * 2
                ds.append(np.frombuffer(C.string_at(q.data, nb), np.uint8 if fp4 else np.uint16)
                          .reshape(q.rows, -1))
                if fp4:
                    blk = 16 if q.fmt == 1 else 32
                    ss.append(np.frombuffer(C.string_at(q.scales, q.rows * q.cols // blk), np.uint8)
                              .reshape(q.rows, -1))
                gs.append(q.global_scale)
            return np.stack(ds), (np.stack(ss) if ss else None), np.array(gs, np.float32)

        d13, s13, g13 = mats(c.w13)
        d2, s2, g2 = mats(c.w2)
        rw = np.ctypeslib.as_array(c.router_w, (R * H,)).reshape(R, H).copy()
        sw13 = None if not c.shared_w13 else np.ctypeslib.as_array(c.shared_w13, (2 * S * H,)).reshape(2 * S, H).copy()
        sw2 = None if not c.shared_w2 else np.ctypeslib.as_array(c.shared_w2, (H * S,)).reshape(H, S).copy()
        I = cfg.inter
        b13 = None if not c.w13_bias else np.ctypeslib.as_array(c.w13_bias, (E * 2 * I,)).reshape(E, 2 * I).copy()
        b2 = None if not c.w2_bias else np.ctypeslib.as_array(c.w2_bias, (E * H,)).reshape(E, H).copy()
        return MoEWeights(rw, d13, s13, g13, d2, s2, g2, f32(c.router_bias, R), f32(c.a1_scale, E),
                          f32(c.a2_scale, E), sw13, sw2, b13, b2, f32(c.w13_up_global, E))


# ---- framework tensors through the C loaders ----------------------------------
# What an engine holds (MoE.from_modelopt / from_modelopt_experts / from_gpt_oss)
# is named here as layer 0 of a checkpoint of that layout (include/fp4moe/io.h's
# default patterns) and loaded by the library's layout loader: no layout is
# converted in Python. Only the names are made here; every check of dtype, shape
# and value is the loader's (fp4moe.Error naming the tensor).
_PRE = "model.layers.0.mlp."


def modelopt_tensors(router_weight, experts, router_bias=None, shared=None, first_expert=0):
    """{name: array} of a ModelOpt layer: experts is a list over the experts held of
    {proj: {suffix: array}} (proj gate_proj / up_proj / down_proj, suffix weight /
    weight_scale / weight_scale_2 / input_scale), numbered from first_expert; shared
    {proj: BF16 array} or None."""
    t = {_PRE + "gate.weight": router_weight}
    if router_bias is not None:
        t[_PRE + "gate.e_score_correction_bias"] = router_bias
    for i, ex in enumerate(experts):
        if not isinstance(ex, dict):
            raise TypeError(f"experts[{i}]: expected a dict of projection -> tensors, got {type(ex).__name__}")
        for proj, d in ex.items():
            if not isinstance(d, dict):
                raise TypeError(f"experts[{i}][{proj!r}]: expected a dict of tensors, got {type(d).__name__}")
            for k, a in d.items():
                t[f"{_PRE}experts.{first_expert + i}.{proj}.{k}"] = a
    for proj, a in (shared or {}).items():
        t[f"{_PRE}shared_experts.{proj}.weight"] = a
    return t


def gpt_oss_tensors(router_weight, fused, router_bias=None):
    """{name: array} of a gpt-oss layer: fused {"gate_up_proj_blocks": ..., ...} over the
    experts held (all of the layer's, or an expert-parallel shard's)."""
    t = {_PRE + "router.weight": router_weight}
    if router_bias is not None:
        t[_PRE + "router.bias"] = router_bias
    t.update({_PRE + "experts." + k: a for k, a in fused.items() if a is not None})
    return t


def load_tensors(cfg, tensors, what, first_expert=0, n_local=0):
    """The LoadedLayer of layer 0 of Checkpoint.from_tensors(tensors), its routing cfg's,
    with the global router (a shard when n_local): its shapes must agree with cfg."""
    if not isinstance(cfg, MoEConfig):
        raise TypeError(f"cfg: expected fp4moe.MoEConfig, got {type(cfg).__name__}")
    with Checkpoint.from_tensors(tensors, what) as ck:
        loaded = ck.load_layer(0, first_expert, n_local, routing=cfg, global_router=True)
    for f in ("n_experts", "hidden", "inter", "shared_inter", "wfmt"):
        if getattr(loaded.cfg, f) != getattr(cfg, f):
            got = getattr(loaded.cfg, f)
            loaded.close()
            raise ValueError(f"{what}: cfg.{f} is {getattr(cfg, f)!r}, the tensors say {got!r}")
    return loaded
