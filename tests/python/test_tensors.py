"""Checkpoint layouts from tensors in memory (fp4moe.Checkpoint.from_tensors, the C
fm_checkpoint_open_tensors) against the same tensors written to a file and opened by
path: the same C loaders, so the same layer bit for bit; shards of a layer summing to
the layer; bad input refused with the library's status, the caller's arrays untouched."""

import dataclasses
import json

import numpy as np
import pytest

import fp4moe
import moe_ref
from conftest import gpt_oss_dict, make_layer, make_x, modelopt_dict, reference, typed, write_safetensors
from fp4moe.checkpoint import gpt_oss_tensors, load_tensors, modelopt_tensors


def same_weights(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y), f.name


def load_both(tmp_path, tensors, routing, **kw):
    """(from the file, from memory): LoadedLayers of layer 0 of the same tensors."""
    write_safetensors(tmp_path / "model.safetensors", tensors)
    with fp4moe.Checkpoint(tmp_path / "model.safetensors") as ck:
        f = ck.load_layer(0, routing=routing, **kw)
    with fp4moe.Checkpoint.from_tensors(typed(tensors)) as ck:
        m = ck.load_layer(0, routing=routing, **kw)
    return f, m


def run(loaded, bits, **kw):
    with fp4moe.Layer(None, loaded, backend="cpu-ref", max_tokens=bits.shape[0], **kw) as L:
        return L.run(bits)


@pytest.mark.parametrize("shard", [None, (2, 4)])
def test_modelopt_memory_equals_file(rng, tmp_path, shard):
    cfg, W, ref = make_layer(rng, "nvfp4", E=8, k=2)
    t = modelopt_dict(cfg, W)
    first, n = shard or (0, 0)
    f, m = load_both(tmp_path, t, cfg, first_expert=first, n_experts=n)
    try:
        assert f.cfg == m.cfg and f.layout == m.layout == "modelopt"
        same_weights(f.weights(), m.weights())
        bits, xf = make_x(rng, 5, cfg.hidden)
        assert np.array_equal(run(f, bits), run(m, bits))
    finally:
        f.close()
        m.close()


@pytest.mark.parametrize("shard", [None, (4, 4)])
def test_gpt_oss_memory_equals_file(rng, tmp_path, shard):
    cfg, W, ref = make_layer(rng, "mxfp4", E=8, k=2)
    E, I, H = cfg.n_experts, cfg.inter, cfg.hidden
    t = gpt_oss_dict(W, cfg, (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32),
                     (rng.standard_normal((E, H)) * 0.5).astype(np.float32),
                     (rng.standard_normal(E) * 0.5).astype(np.float32))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "num_experts_per_tok": 2}))
    routing = dataclasses.replace(cfg, score="softmax-topk")
    first, n = shard or (0, 0)
    f, m = load_both(tmp_path, t, routing, first_expert=first, n_experts=n, global_router=shard is not None)
    try:
        assert f.cfg == m.cfg and f.cfg.activation == "swiglu-gptoss" and f.layout == "gpt-oss"
        same_weights(f.weights(), m.weights())
        bits, _ = make_x(rng, 5, H)
        assert np.array_equal(run(f, bits), run(m, bits))
    finally:
        f.close()
        m.close()


def test_gpt_oss_shards_from_memory(rng):
    """An expert-parallel rank holds fused tensors of its own experts only: with the global
    router the loader takes them (dim 0 = the shard's experts); the ranks' partial sums
    are the whole layer, and a rank's tensors of the wrong expert count are refused."""
    cfg, W, ref = make_layer(rng, "mxfp4", E=8, k=2)
    E, I, H = cfg.n_experts, cfg.inter, cfg.hidden
    cfg = dataclasses.replace(cfg, score="softmax-topk", activation="swiglu-gptoss", swiglu_limit=7.0)
    rb = (rng.standard_normal(E) * 0.5).astype(np.float32)
    whole = typed(gpt_oss_dict(W, cfg, r_bias=rb))
    bits, xf = make_x(rng, 6, H)
    loaded = load_tensors(cfg, whole, "whole")
    try:
        want = run(loaded, bits)
    finally:
        loaded.close()
    total = 0
    for first in (0, 4):
        part = {k: (v[first:first + 4] if ".experts." in k else v) for k, v in whole.items()}
        loaded = load_tensors(cfg, part, "rank", first, 4)
        try:
            assert loaded.cfg.n_experts == E and loaded.n_local == 4 and loaded.first_expert == first
            total = total + run(loaded, bits)  # the loaded shard: first_expert / n_local taken from it
        finally:
            loaded.close()
    assert moe_ref.nmse(total, want) <= 1e-12
    part = {k: (v[:3] if ".experts." in k else v) for k, v in whole.items()}
    with pytest.raises(fp4moe.Error, match="holds 3 experts: expected the router's 8") as e:
        load_tensors(cfg, part, "rank", 0, 4)
    assert e.value.status == "FM_ERR_BAD_SHAPE"


def test_modelopt_tensor_names(rng):
    """modelopt_tensors names what an engine holds as a ModelOpt layer; the loader gives
    back the same weights (global expert numbers for a shard)."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=6, k=2)
    import ml_dtypes

    I = cfg.inter
    experts = [{"gate_proj": {"weight": W.w13_data[e, :I], "weight_scale": W.w13_scales[e, :I].view(ml_dtypes.float8_e4m3fn),
                              "weight_scale_2": W.w13_global[e:e + 1]},
                "up_proj": {"weight": W.w13_data[e, I:], "weight_scale": W.w13_scales[e, I:],
                            "weight_scale_2": W.w13_global[e:e + 1]},
                "down_proj": {"weight": W.w2_data[e], "weight_scale": W.w2_scales[e],
                              "weight_scale_2": W.w2_global[e:e + 1]}} for e in range(6)]
    loaded = load_tensors(cfg, modelopt_tensors(W.router_w, experts), "test")
    try:
        same_weights(loaded.weights(), W)
    finally:
        loaded.close()
    loaded = load_tensors(cfg, modelopt_tensors(W.router_w, experts[2:4], first_expert=2), "test", 2, 2)
    try:
        back = loaded.weights()
        assert np.array_equal(back.w13_data, W.w13_data[2:4]) and np.array_equal(back.router_w, W.router_w)
    finally:
        loaded.close()
    with pytest.raises(ValueError, match=r"cfg.inter is 64, the tensors say 32"):
        load_tensors(dataclasses.replace(cfg, inter=64), modelopt_tensors(W.router_w, experts), "test")
    assert gpt_oss_tensors(W.router_w, {"down_proj_bias": None}) == {"model.layers.0.mlp.router.weight": W.router_w}


def test_bad_tensors_refused_untouched(rng):
    """Bad input: the library's status naming the tensor; nothing the caller holds written."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=4, k=2)
    t = typed(modelopt_dict(cfg, W))
    before = {k: v.copy() for k, v in t.items()}
    name = "model.layers.0.mlp.experts.1.up_proj.weight_scale"
    bad = dict(t)
    bad[name] = t[name][:, :1]  # a strided slice of the wrong shape
    with fp4moe.Checkpoint.from_tensors(bad) as ck:
        with pytest.raises(fp4moe.Error, match=name) as e:
            ck.load_layer(0, routing=cfg)
    assert e.value.status == "FM_ERR_BAD_SHAPE"
    bad[name] = t[name].view(np.int8)
    with fp4moe.Checkpoint.from_tensors(bad) as ck:
        with pytest.raises(fp4moe.Error, match=name) as e:
            ck.load_layer(0, routing=cfg)
    assert e.value.status == "FM_ERR_FORMAT"
    del bad[name]
    with fp4moe.Checkpoint.from_tensors(bad) as ck:
        with pytest.raises(fp4moe.Error, match=name) as e:
            ck.load_layer(0, routing=cfg)
    assert e.value.status == "FM_ERR_NOT_FOUND"
    with fp4moe.Checkpoint.from_tensors(t) as ck:  # no config.json: the routing must be given
        with pytest.raises(fp4moe.Error, match="tensors in memory") as e:
            ck.load_layer(0)
    assert e.value.status == "FM_ERR_NOT_FOUND"
    for k, v in t.items():
        assert np.array_equal(v.view(np.uint8), before[k].view(np.uint8)), k
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.Checkpoint.from_tensors({})
    assert e.value.status == "FM_ERR_NOT_FOUND"
    with pytest.raises(TypeError, match="complex64 has no safetensors equivalent"):
        fp4moe.Checkpoint.from_tensors({"a": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError, match="expected a numpy array"):
        fp4moe.Checkpoint.from_tensors({"a": [1, 2]})
    with pytest.raises(TypeError, match="expected a dict"):
        fp4moe.Checkpoint.from_tensors([("a", np.zeros(2))])
    with pytest.raises(ValueError, match="NUL"):
        fp4moe.Checkpoint.from_tensors({"a\0b": np.zeros(2)})


def test_from_tensors_reads_the_arrays_at_load(rng):
    """The checkpoint borrows the arrays (no copy at open): what a load reads is what they
    hold then; the loaded layer owns copies, so it outlives the checkpoint and the arrays."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=4, k=2)
    t = typed(modelopt_dict(cfg, W))
    r = "model.layers.0.mlp.gate.weight"
    ck = fp4moe.Checkpoint.from_tensors(t)
    t[r][0, 0] = 42.0
    loaded = ck.load_layer(0, routing=cfg)
    ck.close()
    t[r][0, 0] = -1.0
    try:
        assert loaded.weights().router_w[0, 0] == 42.0
        bits, xf = make_x(rng, 3, cfg.hidden)
        ref["router"] = loaded.weights().router_w
        want, margin = reference(cfg, ref, xf)
        assert moe_ref.nmse(run(loaded, bits), want) <= 1e-9 or margin < 1e-6
    finally:
        loaded.close()
    with pytest.raises(fp4moe.ClosedError, match="Checkpoint is closed"):
        ck.names()


def test_whole_loaded_layer_is_not_a_shard(rng):
    """A loaded layer holding all its experts, given a shard's first_expert / n_local, is
    refused: the library would run the first n_local loaded experts as the shard's."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    with fp4moe.Checkpoint.from_tensors(typed(modelopt_dict(cfg, W))) as ck:
        whole = ck.load_layer(0, routing=cfg)
        shard = ck.load_layer(0, 1, 2, routing=cfg, global_router=True)
    try:
        for fe, nl in ((1, 2), (2, 0), (0, 2), (0, 5)):
            with pytest.raises(ValueError, match=rf"first_expert, n_local: \({fe}, {nl}\): the loaded layer holds "
                                                 "all its 4 experts"):
                fp4moe.Layer(None, whole, first_expert=fe, n_local=nl)
        bits, _ = make_x(rng, 2, cfg.hidden)
        ids, w = np.array([[1, 2], [2, 1]], np.int32), np.full((2, 2), 0.5, np.float32)
        with fp4moe.Layer(None, whole, first_expert=0, n_local=4) as a, fp4moe.Layer(None, whole) as b, \
                fp4moe.Layer(None, shard) as s:
            assert np.array_equal(a.run(bits, ids, w), b.run(bits, ids, w))
            assert np.array_equal(s.run(bits, ids, w), b.run(bits, ids, w))  # experts 1, 2: all in the shard
    finally:
        whole.close()
        shard.close()


def test_loaded_layer_shapes_are_its_own(rng):
    """A cfg given with a loaded layer, or the loaded layer's own cfg changed since, cannot
    change the shapes it was loaded with: the library read the loaded arrays by the cfg's
    (w13[4] of 4 experts, router rows past the loaded ones) or used a subset of them."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=4, k=2)
    with fp4moe.Checkpoint.from_tensors(typed(modelopt_dict(cfg, W))) as ck:
        loaded = ck.load_layer(0, routing=cfg)
    try:
        for kw, msg in ((dict(n_experts=64), "cfg.n_experts: 64, but the loaded layer's is 4"),
                        (dict(n_experts=2, top_k=1), "cfg.n_experts: 2, but the loaded layer's is 4"),
                        (dict(inter=64), "cfg.inter: 64"), (dict(hidden=128), "cfg.hidden: 128"),
                        (dict(shared_inter=16), "cfg.shared_inter: 16"), (dict(wfmt="mxfp4"), "cfg.wfmt: 'mxfp4'")):
            with pytest.raises(ValueError, match=msg):
                fp4moe.Layer(dataclasses.replace(cfg, **kw), loaded)
        with fp4moe.Layer(dataclasses.replace(cfg, top_k=3, score="sigmoid"), loaded) as L:  # routing: allowed
            assert L.cfg.top_k == 3
        loaded.cfg.n_experts = 4096
        with pytest.raises(ValueError, match="cfg.n_experts: 4096, but the loaded layer's is 4"):
            fp4moe.Layer(None, loaded)
        assert loaded.weights().router_w.shape == (4, cfg.hidden)
    finally:
        loaded.close()
