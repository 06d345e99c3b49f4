"""Scalar arguments are checked before they reach C (python/fp4moe/_args.py): ctypes would
keep the low 32 bits of a large int, truncate a float and cut a string at a NUL, so
each of these would otherwise run as some other call. Errors name the argument:
TypeError for the wrong kind of value, ValueError for one out of range."""

import numpy as np
import pytest

import fp4moe
from conftest import make_layer, write_modelopt

CFG = dict(n_experts=4, top_k=2, hidden=64, inter=32)
INT_FIELDS = ("n_experts", "top_k", "hidden", "inter", "n_group", "topk_group", "shared_inter")


@pytest.mark.parametrize("field", INT_FIELDS)
def test_config_ints_out_of_c_int(field):
    for v in (2**32 + 4, 2**31, -(2**31) - 1):
        with pytest.raises(ValueError, match=rf"^{field}: {v} is outside \[-2147483648, 2147483647\]"):
            fp4moe.MoEConfig(**{**CFG, field: v})


@pytest.mark.parametrize("field", INT_FIELDS)
def test_config_ints_must_be_ints(field):
    for v in (4.7, 4.0, "four", True, None, np.float32(4)):
        with pytest.raises(TypeError, match=rf"^{field}: expected an int, got {type(v).__name__}"):
            fp4moe.MoEConfig(**{**CFG, field: v})


def test_config_checked_again_before_c():
    """The fields are mutable: the check runs again whenever the config goes to C."""
    cfg = fp4moe.MoEConfig(**CFG)
    cfg.n_experts = 2**32 + 4
    with pytest.raises(ValueError, match="n_experts: 4294967300 is outside"):
        fp4moe.route(cfg, np.zeros((1, 4), np.float32))


def test_config_accepts_numpy_ints_and_names_other_fields():
    cfg = fp4moe.MoEConfig(n_experts=np.int64(4), top_k=np.int32(2), hidden=np.uint16(64), inter=32, wfmt="MXFP4")
    assert cfg.n_experts == 4 and type(cfg.n_experts) is int and cfg.wfmt == "mxfp4"
    ids, _ = fp4moe.route(cfg, np.zeros((3, 4), np.float32))
    assert ids.shape == (3, 2)
    for kw, exc, msg in ((dict(routed_scale="2.5"), TypeError, "routed_scale: expected a number, got str"),
                         (dict(swiglu_limit=[7.0]), TypeError, "swiglu_limit: expected a number, got list"),
                         (dict(score="topk"), ValueError, "score: expected one of 'softmax', 'sigmoid'"),
                         (dict(score=["softmax"]), ValueError, "score: expected one of"),
                         (dict(activation=None), ValueError, "activation: expected one of 'swiglu'"),
                         (dict(wfmt="fp8"), ValueError, "wfmt: unknown format 'fp8': expected one of 'nvfp4'"),
                         (dict(wfmt=True), ValueError, "wfmt: unknown format True")):
        with pytest.raises(exc, match=msg):
            fp4moe.MoEConfig(**CFG, **kw)


def test_qtensor_unknown_format():
    with pytest.raises(ValueError, match="QTensor.fmt: unknown format 'fp8': expected one of 'nvfp4', 'mxfp4', 'bf16'"):
        fp4moe.QTensor("fp8", np.zeros((1, 8), np.uint8), np.zeros((1, 1), np.uint8), 1.0)
    assert fp4moe.QTensor("NVFP4", np.zeros((1, 8), np.uint8), np.zeros((1, 1), np.uint8), 1.0).fmt == "nvfp4"
    with pytest.raises(TypeError, match="global_scale: expected a number, got str"):
        fp4moe.quantize(np.ones((1, 16), np.float32), "nvfp4", global_scale="1")


def test_layer_ints(rng):
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    for kw, exc, msg in ((dict(max_tokens=2**32 + 1), ValueError, r"max_tokens: 4294967297 is outside \[1, "),
                         (dict(max_tokens=8.0), TypeError, "max_tokens: expected an int, got float"),
                         (dict(max_tokens=True), TypeError, "max_tokens: expected an int, got bool"),
                         (dict(first_expert=2**32), ValueError, "first_expert: 4294967296 is outside"),
                         (dict(n_local=2**32 + 2), ValueError, "n_local: 4294967298 is outside"),
                         (dict(n_local=2.0), TypeError, "n_local: expected an int"),
                         (dict(device=2**32), ValueError, "device: 4294967296 is outside"),
                         (dict(row_quantile="0.9"), ValueError, "row_quantile: expected 'auto', 'mean'"),
                         (dict(row_quantile=[0.9]), TypeError, "row_quantile: expected a number")):
        with pytest.raises(exc, match=msg):
            fp4moe.Layer(cfg, W, backend="cpu", **kw)
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=np.int64(2)) as L:
        assert L.max_tokens == 2
        with pytest.raises(ValueError, match="T: 4294967297 is outside"):
            L.plan(2**32 + 1)
        with pytest.raises(TypeError, match="T: expected an int, got float"):
            L.set_plan(1.0, {})
        with pytest.raises(ValueError, match=r"stream .*: 18446744073709551616 is outside"):
            L.tune(1, stream=2**64)


@pytest.fixture
def ckpt(rng, tmp_path):
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    path = tmp_path / "model.safetensors"
    write_modelopt(path, cfg, W)
    return str(path), cfg, W


def test_checkpoint_ints(ckpt):
    path, cfg, W = ckpt
    with fp4moe.Checkpoint(path) as ck:
        for args, kw, exc, msg in (((2**32,), {}, ValueError, r"layer: 4294967296 is outside \[0, "),
                                   ((0,), dict(first_expert=2**32 + 1), ValueError, "first_expert: 4294967297 is"),
                                   ((0,), dict(n_experts=2**32 + 2), ValueError, "n_experts: 4294967298 is"),
                                   ((0.0,), {}, TypeError, "layer: expected an int, got float"),
                                   (("0",), {}, TypeError, "layer: expected an int, got str"),
                                   ((0,), dict(first_expert=1.5), TypeError, "first_expert: expected an int"),
                                   ((-1,), {}, ValueError, r"layer: -1 is outside \[0, ")):
            with pytest.raises(exc, match=msg):
                ck.load_layer(*args, routing=cfg, **kw)
        with pytest.raises(ValueError, match="n_local: 4294967298 is outside"):
            ck.load_shard(0, 0, 2**32 + 2, routing=cfg)
        with pytest.raises(ValueError, match="layer: 4294967296 is outside"):
            ck.load_shard(2**32, 0, 2, routing=cfg)
        one = ck.load_layer(np.int64(0), first_expert=np.int32(1), n_experts=2, routing=cfg)  # numpy ints are ints
        assert one.first_expert == 1 and one.cfg.n_experts == 2
        one.close()


def test_nul_in_path_and_name(ckpt, tmp_path):
    path, _, _ = ckpt
    with pytest.raises(ValueError, match="path: contains a NUL character"):
        fp4moe.Checkpoint(path + "\0.bak")
    with pytest.raises(ValueError, match="path: contains a NUL character"):
        fp4moe.Checkpoint(tmp_path / "model.safetensors\0x")
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike, got bytes"):
        fp4moe.Checkpoint(path.encode())
    with fp4moe.Checkpoint(path) as ck:
        name = "model.layers.0.mlp.gate.weight"
        assert ck.tensor(name).shape == (4, 64)
        with pytest.raises(ValueError, match="name: contains a NUL character"):
            ck.tensor(name + "\0.ignored")
        with pytest.raises(TypeError, match="name: expected a str, got int"):
            ck.tensor(3)


def test_qtensor_cols_and_backend_name():
    d, sc = np.zeros((2, 16), np.uint8), np.zeros((2, 2), np.uint8)
    assert fp4moe.qtensor("nvfp4", d, sc, cols=32).shape == (2, 32)
    with pytest.raises(ValueError, match=r"cols: 16, but data \(2, 16\) holds 32 nvfp4 columns"):
        fp4moe.qtensor("nvfp4", d, sc, cols=16)
    with pytest.raises(TypeError, match="cols: expected an int, got float"):
        fp4moe.qtensor("nvfp4", d, sc, cols=32.0)
    with pytest.raises(ValueError, match="name: expected one of 'auto', 'cpu-ref'"):
        fp4moe.backend_available(["cpu"])
    assert fp4moe.backend_available("cpu")
