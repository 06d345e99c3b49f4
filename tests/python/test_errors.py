"""Bad arguments raise a Python exception that names the argument (or carries the
library's status and message); nothing crashes, nothing caller-owned changes."""

import ctypes as C
import importlib
import os

import numpy as np
import pytest

import fp4moe
from fp4moe import _lib
from conftest import make_layer, make_x, write_modelopt


@pytest.fixture
def layer(rng):
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=4) as L:
        yield L


def test_quantize_errors():
    with pytest.raises(fp4moe.Error, match="multiple of the nvfp4 block") as e:
        fp4moe.quantize(np.ones((2, 24), np.float32), "nvfp4")
    assert e.value.status == "FM_ERR_BAD_SHAPE"
    x = np.ones((2, 32), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.quantize(x, "mxfp4")
    assert e.value.status == "FM_ERR_NONFINITE"
    with pytest.raises(ValueError, match="x: expected a 2-D"):
        fp4moe.quantize(np.ones(32, np.float32))
    with pytest.raises(TypeError, match="x: expected a floating-point"):
        fp4moe.quantize(np.ones((2, 32), np.int32))
    with pytest.raises(ValueError, match="fmt: unknown format 'fp8': expected one of 'nvfp4', 'mxfp4', 'bf16'"):
        fp4moe.quantize(x, "fp8")
    with pytest.raises(ValueError, match="global_scale: only NVFP4"):
        fp4moe.quantize(np.ones((2, 32), np.float32), "mxfp4", global_scale=1.0)
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.quantize(np.ones((2, 32), np.float32), "nvfp4", global_scale=-1.0)
    assert e.value.status == "FM_ERR_INVALID_ARG"


def test_dequantize_nan_scale():
    q = fp4moe.quantize(np.ones((1, 16), np.float32), "nvfp4")
    q.scales[0, 0] = 0x7F  # E4M3 NaN
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.dequantize(q)
    assert e.value.status == "FM_ERR_NONFINITE"
    with pytest.raises(TypeError, match="q: expected fp4moe.QTensor"):
        fp4moe.dequantize(np.zeros((1, 8), np.uint8))


def test_run_argument_errors(layer, rng):
    H = layer.cfg.hidden
    bits, _ = make_x(rng, 2, H)
    cases = [
        (dict(x=bits[:, :32]), ValueError, r"x: expected shape \[T\]\[64\]"),
        (dict(x=np.zeros((5, H), np.uint16)), ValueError, r"x: T=5 outside \[1, max_tokens=4\]"),
        (dict(x=bits.astype(np.int32)), TypeError, "x: expected BF16"),
        (dict(x=bits, out=np.zeros((2, H), np.float64)), ValueError, "out: expected a C-contiguous float32"),
        (dict(x=bits, out=np.zeros((H, 2), np.float32).T), ValueError, "out: .*strided"),
        (dict(x=bits, topk_ids=np.zeros((2, 2), np.int32)), ValueError, "topk_ids, topk_weights: give both"),
    ]
    cases += [
        (dict(x=bits, topk_ids=np.zeros((2, 2), np.int64), topk_weights=np.ones((2, 2), np.float32)),
         TypeError, "topk_ids: expected dtype int32"),
        (dict(x=bits, topk_ids=np.zeros((2, 3), np.int32), topk_weights=np.ones((2, 3), np.float32)),
         ValueError, r"topk_ids: expected shape \(2, 2\)"),
    ]
    for kw, exc, msg in cases:
        out = kw.get("out")
        before = None if out is None else out.copy()
        with pytest.raises(exc, match=msg):
            layer.run(**kw)
        if out is not None:
            assert np.array_equal(out, before)


def test_nonfinite_x_leaves_out_untouched(layer, rng):
    bits, _ = make_x(rng, 2, layer.cfg.hidden)
    bits[1, 5] = 0x7FC0  # BF16 NaN
    out = np.full((2, layer.cfg.hidden), 7.0, np.float32)
    with pytest.raises(fp4moe.Error) as e:
        layer.run(bits, out=out)
    assert e.value.status == "FM_ERR_NONFINITE" and "x[1][5]" in e.value.detail
    assert np.all(out == 7.0)


def test_bad_expert_id(layer, rng):
    bits, _ = make_x(rng, 2, layer.cfg.hidden)
    ids = np.array([[0, 1], [2, 9]], np.int32)
    with pytest.raises(fp4moe.Error) as e:
        layer.run(bits, ids, np.ones((2, 2), np.float32))
    assert e.value.status == "FM_ERR_OUT_OF_RANGE"


def test_layer_construction_errors(rng):
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    with pytest.raises(ValueError, match="backend: expected one of"):
        fp4moe.Layer(cfg, W, backend="tpu")
    with pytest.raises(ValueError, match=r"max_tokens: 0 is outside \[1, "):
        fp4moe.Layer(cfg, W, max_tokens=0)
    with pytest.raises(TypeError, match="weights: expected fp4moe.MoEWeights"):
        fp4moe.Layer(cfg, {"w13": 1})
    bad = fp4moe.MoEWeights(W.router_w, W.w13_data[:, :, :16], W.w13_scales, W.w13_global, W.w2_data, W.w2_scales,
                            W.w2_global)
    with pytest.raises(ValueError, match=r"w13_data: expected shape \(4, 64, 32\)"):
        fp4moe.Layer(cfg, bad)
    bad = fp4moe.MoEWeights(W.router_w.astype(np.float64), W.w13_data, W.w13_scales, W.w13_global, W.w2_data,
                            W.w2_scales, W.w2_global)
    with pytest.raises(TypeError, match="router_w: expected dtype float32"):
        fp4moe.Layer(cfg, bad)
    g = W.w2_global.copy()
    g[1] = np.inf
    bad = fp4moe.MoEWeights(W.router_w, W.w13_data, W.w13_scales, W.w13_global, W.w2_data, W.w2_scales, g)
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.Layer(cfg, bad)
    assert e.value.status == "FM_ERR_NONFINITE" and "w2[1]" in e.value.detail
    c2 = fp4moe.MoEConfig(n_experts=4, top_k=5, hidden=64, inter=32)
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.Layer(c2, W)
    assert e.value.status == "FM_ERR_INVALID_ARG"


def test_closed_layer(rng):
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    L = fp4moe.Layer(cfg, W, max_tokens=2)
    L.close()
    with pytest.raises(fp4moe.ClosedError, match="^Layer is closed$"):  # a ValueError, as a closed file's
        L.run(np.zeros((1, cfg.hidden), np.uint16))
    assert issubclass(fp4moe.ClosedError, ValueError)


def test_closed_checkpoint_objects(rng, tmp_path):
    """A closed Checkpoint / LoadedLayer names itself (a LoadedLayer said AttributeError about NoneType)."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    write_modelopt(tmp_path / "m.safetensors", cfg, W)
    ck = fp4moe.Checkpoint(tmp_path / "m.safetensors")
    lw = ck.load_layer(0, routing=cfg)
    ck.close()
    for call in (ck.names, ck.scan, lambda: ck.tensor("x"), lambda: ck.load_layer(0, routing=cfg),
                 lambda: ck.load_shard(0, 0, 2, routing=cfg)):
        with pytest.raises(fp4moe.ClosedError, match="^Checkpoint is closed$"):
            call()
    assert lw.weights().w13_data.shape == W.w13_data.shape  # a loaded layer outlives its checkpoint
    lw.close()
    lw.close()
    for call in (lw.weights, lambda: fp4moe.Layer(None, lw)):
        with pytest.raises(fp4moe.ClosedError, match="^LoadedLayer is closed$"):
            call()


def test_abi_check_catches_a_drifted_mirror(monkeypatch):
    """The import-time layout check must fail on a mirror that differs from the C struct,
    with fp4moe.LibraryMismatchError (an ImportError) naming the library and the field."""
    class Drifted(C.Structure):
        _fields_ = [f for f in _lib.QTensor._fields_ if f[0] != "global_scale"]

    monkeypatch.setitem(_lib._MIRRORS, "fm_qtensor", Drifted)
    with pytest.raises(fp4moe.LibraryMismatchError, match="fm_qtensor") as ei:
        _lib._check_abi(_lib.lib, "/x/libfp4moe.so")
    assert isinstance(ei.value, ImportError)
    assert ei.value.library == "/x/libfp4moe.so" and f"{C.sizeof(Drifted)} in the binding" in ei.value.reason

    class Moved(C.Structure):
        _fields_ = [("fmt", C.c_int64), ("rows", C.c_int64), ("cols", C.c_int64), ("data", C.c_void_p),
                    ("scales", C.c_void_p), ("global_scale", C.c_float)]
    monkeypatch.setitem(_lib._MIRRORS, "fm_qtensor", Moved)
    with pytest.raises(fp4moe.LibraryMismatchError, match="fm_qtensor.fmt"):
        _lib._check_abi(_lib.lib, "/x/libfp4moe.so")


def test_missing_entry_point():
    """Every entry point is required (no probing, no fallback to older ones): a library
    without fm_layer_run is refused, naming it."""
    class Lib:
        pass

    lib = Lib()
    for name in _lib._PROTOS:
        if name != "fm_layer_run":
            setattr(lib, name, getattr(_lib.lib, name))
    with pytest.raises(fp4moe.LibraryMismatchError) as ei:
        _lib._bind(lib, "/old/libfp4moe.so")
    assert ei.value.library == "/old/libfp4moe.so" and "fm_layer_run" in ei.value.reason
    assert not hasattr(fp4moe, "HAS_RUN_API")


def test_import_against_another_library(tmp_path):
    """Importing the package against a shared library that is not libfp4moe fails at
    import with LibraryMismatchError, .library the path and .reason the first missing symbol."""
    import ctypes.util
    import subprocess
    import sys

    other = ctypes.util.find_library("m") or "libm.so.6"
    path = C.CDLL(other)._name
    probe = ("import sys\n"
             "try:\n"
             "    import fp4moe\n"
             "except ImportError as e:\n"
             "    print(type(e).__name__, e.library, '|', e.reason)\n"
             "    sys.exit(0)\n"
             "sys.exit(1)\n")
    env = dict(os.environ, FP4MOE_LIBRARY=_resolve(path))
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"LibraryMismatchError {env['FP4MOE_LIBRARY']} | no fm_"), r.stdout


def _resolve(name):
    """A path to a loaded shared object named name (libm), for FP4MOE_LIBRARY, which must be a file."""
    if os.path.isfile(name):
        return name
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if os.path.basename(p).startswith(name.split(".so")[0] + ".so") or os.path.basename(p) == name:
                return p
    pytest.skip(f"cannot find the file of {name}")


def test_bad_library_path(monkeypatch):
    monkeypatch.setenv("FP4MOE_LIBRARY", "/nonexistent/libfp4moe.so")
    with pytest.raises(ImportError, match="FP4MOE_LIBRARY"):
        _lib._library_path()
    assert importlib.import_module("fp4moe") is fp4moe


def test_big_endian_arrays_are_read_by_value(layer, rng):
    """A non-native (big-endian) array has the dtype name of a native one ("uint16",
    "float32"): its values are what C must read, not its bytes; an out array C would
    write in the wrong byte order is refused, untouched."""
    H, k = layer.cfg.hidden, layer.cfg.top_k
    bits, _ = make_x(rng, 2, H)
    ids = np.array([[0, 1], [3, 2]], np.int32)
    w = np.array([[0.75, 0.25], [0.5, 0.125]], np.float32)
    want = layer.run(bits, ids, w)
    be = lambda a: a.astype(a.dtype.newbyteorder(">"))  # noqa: E731
    assert np.array_equal(layer.run(be(bits), be(ids), be(w)), want)
    assert np.array_equal(layer.run(be(bits)), layer.run(bits))
    out = np.full((2, H), 7.0, be(np.zeros(1, np.float32)).dtype)
    with pytest.raises(ValueError, match="out: expected this host's byte order"):
        layer.run(bits, ids, w, out=out)
    assert np.all(out == 7.0)
    logits = rng.standard_normal((3, layer.cfg.n_experts)).astype(np.float32)
    cfg = layer.cfg
    got, want_r = fp4moe.route(cfg, be(logits)), fp4moe.route(cfg, logits)
    assert all(np.array_equal(a, b) for a, b in zip(got, want_r))
    # the weights: router, bias and scales read by value too
    cfg2, W, _ = make_layer(rng, "nvfp4", E=4, k=2, bias=True)
    W2 = fp4moe.MoEWeights(be(W.router_w), W.w13_data, W.w13_scales, be(W.w13_global), W.w2_data, W.w2_scales,
                           be(W.w2_global), router_bias=be(W.router_bias), w13_up_global=be(W.w13_global))
    with fp4moe.Layer(cfg2, W, max_tokens=2) as a, fp4moe.Layer(cfg2, W2, max_tokens=2) as b:
        assert np.array_equal(a.run(bits), b.run(bits))
    # BF16 QTensor data
    x = rng.standard_normal((4, 32)).astype(np.float32)
    q = fp4moe.quantize(x, "bf16")
    ref = fp4moe.dequantize(q)
    assert np.array_equal(fp4moe.dequantize(fp4moe.QTensor("bf16", be(q.data), None, 1.0)), ref)
    assert np.array_equal(fp4moe.dequantize(fp4moe.qtensor("bf16", be(q.data))), ref)


def test_config_changed_after_create(rng):
    """The layer keeps its own copy of cfg: a caller changing its MoEConfig afterwards (to
    build another layer) does not change what run checks x, ids and out against (the C
    layer's shapes; else C read and wrote past the caller's arrays)."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=8, k=4, H=64)
    with fp4moe.Layer(cfg, W, max_tokens=16) as L:
        bits, _ = make_x(rng, 16, 64)
        want = L.run(bits)
        cfg.hidden, cfg.top_k = 16, 1
        assert L.cfg.hidden == 64 and L.cfg.top_k == 4 and cfg.hidden == 16
        out = np.full((16, 16), 7.0, np.float32)
        with pytest.raises(ValueError, match=r"x: expected shape \[T\]\[64\]"):
            L.run(bits[:, :16], out=out)
        assert np.all(out == 7.0)
        y, ids, w = L.run(bits, return_routing=True)
        assert ids.shape == (16, 4) and np.array_equal(y, want)
        assert np.array_equal(L.run(bits, ids, w), want)
        # nor does a change of the layer's own attributes (out dtype, shard size)
        L.cfg.hidden, L.out_dtype, L.n_local = 16, "bf16", 2
        assert L.run(bits).dtype == np.float32
        with pytest.raises(ValueError, match=r"x: expected shape \[8\]\[capacity\]\[64\]"):
            L.run_dispatched(np.zeros((2, 3, 64), np.uint16), counts=np.ones(2, np.int32))


def test_route_and_supports_name_a_bad_argument():
    """A wrong kind of cfg / out_dtype: an exception naming the argument (was AttributeError
    "'str' object has no attribute '_c'" and TypeError "unhashable type: 'list'")."""
    with pytest.raises(TypeError, match="cfg: expected fp4moe.MoEConfig, got str"):
        fp4moe.route("cfg", np.zeros((2, 4), np.float32))
    cfg = fp4moe.MoEConfig(n_experts=4, top_k=2, hidden=64, inter=32)
    for bad in ([], "f16", None):
        with pytest.raises(ValueError, match="out_dtype: expected one of 'f32'"):
            fp4moe.supports(cfg, "cpu", out_dtype=bad)
    assert fp4moe.supports(cfg, "cpu", out_dtype="bf16") == (True, "")
