"""The layer on the CPU backends against the numpy oracle (moe_ref.py).

Bound: NMSE <= 1e-9 against a float64 computation on the same dequantized
weights. The library computes in FP32 (docs/accuracy.md: reference vs float64
1e-14..2e-13, fast path vs reference 1e-9), so 1e-9 leaves room for the fast
path's summation order while a wrong expert, row, scale, nibble order or routing
weight gives >= 1e-4. Outputs are poisoned with NaN first (preallocated out),
and NaN/Inf is checked before the bound."""

import json
import os
import warnings

import numpy as np
import pytest

import fp4moe
import moe_ref
from conftest import gpt_oss_dict, make_layer, make_x, modelopt_dict, reference, write_modelopt, write_safetensors

BOUND = 1e-9


def check(got, ref, margin=np.inf):
    assert np.all(np.isfinite(got)), "NaN/Inf in the output (an element left unwritten?)"
    assert margin > 1e-6, f"routing near a tie (margin {margin}): re-run (the seed is printed)"
    err = moe_ref.nmse(got, ref)
    assert err <= BOUND, f"NMSE {err:.3e} > {BOUND}"


@pytest.mark.parametrize("backend", ["cpu-ref", "cpu"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "bf16"])
def test_layer_vs_numpy(rng, backend, fmt):
    cfg, W, ref = make_layer(rng, fmt)
    T = 5
    bits, xf = make_x(rng, T, cfg.hidden)
    with fp4moe.Layer(cfg, W, backend=backend, max_tokens=8) as layer:
        out = np.full((T, cfg.hidden), np.nan, np.float32)
        got = layer.run(bits, out=out)
        assert got is out
    want, margin = reference(cfg, ref, xf)
    check(got, want, margin)


@pytest.mark.parametrize("routing", [
    dict(score="sigmoid", bias=True, routed_scale=2.5),                   # GLM-5 / DeepSeek-V3
    dict(score="sigmoid", bias=True, n_group=4, topk_group=2, routed_scale=2.5, k=4),
    dict(score="softmax", renormalize=False),                            # Qwen3-MoE norm_topk_prob=False
    dict(score="softmax", shared=32),                                    # shared expert, BF16
])
def test_routing_variants(rng, routing):
    cfg, W, ref = make_layer(rng, "nvfp4", **routing)
    bits, xf = make_x(rng, 6, cfg.hidden)
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=6) as layer:
        got = layer.run(bits)
    want, margin = reference(cfg, ref, xf)
    check(got, want, margin)


def test_float_input_is_rounded_to_bf16(rng):
    cfg, W, ref = make_layer(rng)
    xf32 = rng.standard_normal((3, cfg.hidden)).astype(np.float32)
    with fp4moe.Layer(cfg, W, backend="cpu-ref", max_tokens=4) as layer:
        a = layer.run(xf32)
        b = layer.run(moe_ref.f32_to_bf16(xf32))
    assert np.array_equal(a, b)


def test_external_routing(rng):
    cfg, W, ref = make_layer(rng, "nvfp4", E=8, k=3)
    T = 7
    bits, xf = make_x(rng, T, cfg.hidden)
    ids = np.stack([rng.permutation(cfg.n_experts)[:cfg.top_k] for _ in range(T)]).astype(np.int32)
    ids[2, 1] = -1  # "no expert": skipped
    w = rng.random((T, cfg.top_k)).astype(np.float32)
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=T) as layer:
        got = layer.run(bits, ids, w)
    want, _ = reference(cfg, ref, xf, ids, w)
    check(got, want)


def test_plan_cpu(rng):
    """Layer.plan: the CPU backends have no tile plan (FM_ERR_UNSUPPORTED); T checked first."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=8, k=2)
    with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=4) as layer:
        with pytest.raises(fp4moe.Error, match="no tile plan") as e:
            layer.plan(2)
        assert e.value.status == "FM_ERR_UNSUPPORTED"
        for T in (0, 5):
            with pytest.raises(fp4moe.Error) as e:
                layer.plan(T)
            assert e.value.status == "FM_ERR_BAD_SHAPE"
        with pytest.raises(TypeError, match="T"):
            layer.plan(2.0)
        plan = {"active_experts": 1, "work_list": False,
                "fc1": {"tile": "mma_w4m2n1k256s3", "k_splits": 1, "x_packed": False, "feature_blocks": 1},
                "fc2": {"tile": "mma_w4m2n1k256s3", "k_splits": 1, "x_packed": False, "feature_blocks": 1}}
        with pytest.raises(fp4moe.Error, match="no tile plan") as e:
            layer.set_plan(2, plan)
        assert e.value.status == "FM_ERR_UNSUPPORTED"
        with pytest.raises(fp4moe.Error) as e:
            layer.set_plan(5, plan)
        assert e.value.status == "FM_ERR_BAD_SHAPE"
        with pytest.raises(ValueError, match="not a tile name"):
            layer.set_plan(2, {**plan, "fc1": {**plan["fc1"], "tile": "tile_x"}})
        with pytest.raises(ValueError, match="missing 'fc2'"):
            layer.set_plan(2, {k: v for k, v in plan.items() if k != "fc2"})
        with pytest.raises(TypeError, match="plan"):
            layer.set_plan(2, [plan])
        with pytest.raises(fp4moe.Error, match="no tile plan") as e:
            layer.tune(2)
        assert e.value.status == "FM_ERR_UNSUPPORTED"
        with pytest.raises(fp4moe.Error) as e:
            layer.tune(0)
        assert e.value.status == "FM_ERR_BAD_SHAPE"
        with pytest.raises(TypeError, match="stream"):
            layer.tune(2, stream="s")


def test_tuning_options(rng):
    """work_list / row_quantile: checked on every backend (the CPU ones ignore them)."""
    cfg, W, _ = make_layer(rng, "nvfp4", E=8, k=2)
    for wl, q in (("off", "mean"), ("on", 0.9), ("auto", 0.5), ("auto", "auto"), ("on", -1.0), ("off", 0.0)):
        with fp4moe.Layer(cfg, W, backend="cpu", max_tokens=4, work_list=wl, row_quantile=q) as layer:
            assert np.all(np.isfinite(layer.run(make_x(rng, 2, cfg.hidden)[0])))
    with pytest.raises(ValueError, match="work_list"):
        fp4moe.Layer(cfg, W, backend="cpu", work_list="sometimes")
    for q in (0.3, 1.0, -0.5, float("nan")):
        with pytest.raises(fp4moe.Error, match="row_quantile"):
            fp4moe.Layer(cfg, W, backend="cpu", row_quantile=q)
    with pytest.raises(ValueError, match="row_quantile"):
        fp4moe.Layer(cfg, W, backend="cpu", row_quantile="median")


@pytest.mark.parametrize("backend", ["cpu-ref", "cpu"])
def test_return_routing(rng, backend):
    """The routing the layer chose, handed back: valid top-k sets, weights as the
    numpy oracle's router gives them, and passed back as external routing the same
    output bit for bit."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=16, k=4)
    T = 5
    bits, xf = make_x(rng, T, cfg.hidden)
    with fp4moe.Layer(cfg, W, backend=backend, max_tokens=T) as layer:
        out = np.full((T, cfg.hidden), np.nan, np.float32)
        got, ids, w = layer.run(bits, out=out, return_routing=True)
        assert got is out and ids.shape == (T, cfg.top_k) and w.shape == (T, cfg.top_k)
        assert ids.dtype == np.int32 and w.dtype == np.float32
        assert np.all((ids >= 0) & (ids < cfg.n_experts))
        assert all(len(set(r)) == cfg.top_k for r in ids.tolist())
        assert np.all(np.isfinite(w)) and np.all(w > 0)
        again = layer.run(bits, ids, w)
        assert np.array_equal(got.view(np.uint32), again.view(np.uint32))
        assert np.array_equal(got.view(np.uint32), layer.run(bits).view(np.uint32))  # asking changes nothing
        with pytest.raises(ValueError, match="return_routing"):
            layer.run(bits, ids, w, return_routing=True)
    want, margin = reference(cfg, ref, xf)
    check(got, want, margin)
    logits = xf.astype(np.float64) @ ref["router"].astype(np.float64).T  # the oracle's routing, per token
    rids, rw, _ = moe_ref.route(logits, cfg.score, cfg.top_k, ref["bias"], cfg.renormalize, cfg.routed_scale,
                                cfg.n_group, cfg.topk_group)
    for t in range(T):
        mine = dict(zip(ids[t].tolist(), w[t].tolist()))
        theirs = dict(zip(np.asarray(rids[t]).tolist(), np.asarray(rw[t]).tolist()))
        assert set(mine) == set(theirs), f"token {t}: experts {sorted(mine)} vs the oracle's {sorted(theirs)}"
        for e, v in theirs.items():
            assert abs(mine[e] - v) <= 1e-5 * abs(v), f"token {t} expert {e}: weight {mine[e]} vs {v}"


@pytest.mark.parametrize("out_dtype", ["f32", "bf16"])
def test_expert_shard_partial_sums(rng, out_dtype):
    E = 8
    cfg, W, ref = make_layer(rng, "nvfp4", E=E, k=2)
    T = 5
    bits, xf = make_x(rng, T, cfg.hidden)
    parts = []
    for first in (0, 4):
        sl = slice(first, first + 4)
        Ws = fp4moe.MoEWeights(W.router_w, W.w13_data[sl], W.w13_scales[sl], W.w13_global[sl], W.w2_data[sl],
                               W.w2_scales[sl], W.w2_global[sl])
        with fp4moe.Layer(cfg, Ws, backend="cpu", max_tokens=T, first_expert=first, n_local=4,
                          out_dtype=out_dtype) as layer:
            y = layer.run(bits)
        parts.append(y.astype(np.float32) if out_dtype == "f32" else moe_ref.bf16_to_f32(y))
    want, margin = reference(cfg, ref, xf)
    if out_dtype == "f32":
        check(parts[0] + parts[1], want, margin)
    else:  # two BF16 roundings (unit roundoff 2^-9): NMSE ~ 2 * 1.3e-6
        assert np.all(np.isfinite(parts[0] + parts[1]))
        assert moe_ref.nmse(parts[0] + parts[1], want) <= 1e-5


def test_modelopt_checkpoint(rng, tmp_path):
    """A ModelOpt-layout NVFP4 checkpoint written here, loaded by the library, run, checked."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=4, k=2)
    I = cfg.inter
    write_modelopt(tmp_path / "model.safetensors", cfg, W)
    with fp4moe.Checkpoint(tmp_path / "model.safetensors") as ck:
        assert ck.scan()["layers"] == {0: cfg.n_experts}
        assert np.array_equal(ck.tensor("model.layers.0.mlp.experts.1.up_proj.weight"), W.w13_data[1, I:])
        with warnings.catch_warnings():
            warnings.simplefilter("error", fp4moe.NotModelledWarning)  # a layer fp4moe models: no warning
            loaded = ck.load_layer(0, routing=cfg)
    assert loaded.cfg.hidden == cfg.hidden and loaded.cfg.inter == I and loaded.layout == "modelopt"
    assert loaded.not_modelled == ()
    back = loaded.weights()
    assert np.array_equal(back.w13_data, W.w13_data) and np.array_equal(back.w2_scales, W.w2_scales)
    bits, xf = make_x(rng, 4, cfg.hidden)
    with fp4moe.Layer(None, loaded, backend="cpu", max_tokens=4) as layer:
        got = layer.run(bits)
    loaded.close()
    want, margin = reference(cfg, ref, xf)
    check(got, want, margin)
    # expert-parallel shards of the checkpoint: global router, partial sums
    total = 0
    with fp4moe.Checkpoint(tmp_path / "model.safetensors") as ck:
        for first in (0, 2):
            scfg, sw = ck.load_shard(0, first, 2, routing=cfg)
            assert scfg.n_experts == cfg.n_experts and sw.w13_data.shape[0] == 2
            with fp4moe.Layer(scfg, sw, backend="cpu", max_tokens=4, first_expert=first, n_local=2) as L:
                total = total + L.run(bits)
    check(total, want, margin)


def test_gate_up_globals(rng, tmp_path):
    """Separate gate and up global scales per expert, taken as they are: MoEWeights with
    w13_up_global or a [E][2] w13_global, and a ModelOpt checkpoint whose up weight_scale_2
    differ (LoadedLayer.w13_split_globals, weights().w13_up_global), against the numpy
    oracle whose up rows carry their own global; bad up globals refused naming the entry."""
    import dataclasses

    cfg, W, ref = make_layer(rng, "nvfp4", E=4, k=2)
    I = cfg.inter
    up = (W.w13_global * np.array([1.9, 0.4, 1.0, 0.7], np.float32)).astype(np.float32)
    ref_up = dict(ref, w13=ref["w13"].copy())
    ref_up["w13"][:, I:] *= (up / W.w13_global)[:, None, None]
    bits, xf = make_x(rng, 6, cfg.hidden)
    want, margin = reference(cfg, ref_up, xf)
    for b in ("cpu", "cpu-ref"):
        for w in (dataclasses.replace(W, w13_up_global=up),
                  dataclasses.replace(W, w13_global=np.stack([W.w13_global, up], 1))):
            with fp4moe.Layer(cfg, w, backend=b, max_tokens=8) as layer:
                check(layer.run(bits), want, margin)
    with pytest.raises(ValueError, match="give the up globals once"):
        fp4moe.Layer(cfg, dataclasses.replace(W, w13_global=np.stack([W.w13_global, up], 1), w13_up_global=up))
    with pytest.raises(ValueError, match=r"w13_up_global: expected shape \(4,\)"):
        fp4moe.Layer(cfg, dataclasses.replace(W, w13_up_global=up[:3]))
    for v in (np.nan, 0.0, -1.0, np.inf):
        bad = up.copy()
        bad[1] = v
        with pytest.raises(fp4moe.Error, match=r"w13_up_global\[1\] = ") as e:
            fp4moe.Layer(cfg, dataclasses.replace(W, w13_up_global=bad))
        assert e.value.status == "FM_ERR_NONFINITE"
    # a checkpoint file: the up projections' weight_scale_2 as stored
    t = modelopt_dict(cfg, W)
    for e in range(cfg.n_experts):
        t[f"model.layers.0.mlp.experts.{e}.up_proj.weight_scale_2"] = ("F32", np.array(up[e], np.float32))
    write_safetensors(tmp_path / "model.safetensors", t)
    with fp4moe.Checkpoint(tmp_path / "model.safetensors") as ck:
        loaded = ck.load_layer(0, routing=cfg)
    assert loaded.w13_split_globals == 3  # expert 2's agree
    back = loaded.weights()
    assert np.array_equal(back.w13_global, W.w13_global) and np.array_equal(back.w13_up_global, up)
    assert np.array_equal(back.w13_scales, W.w13_scales)  # no block scale re-encoded
    with fp4moe.Layer(None, loaded, backend="cpu", max_tokens=8) as layer:
        check(layer.run(bits), want, margin)
    loaded.close()


@pytest.mark.parametrize("limit", [None, 0.75])
def test_gpt_oss_checkpoint(rng, tmp_path, limit):
    """A gpt-oss MXFP4 layer as the checkpoint holds it (fused, interleaved gate/up rows and
    biases, router logit bias, config.json) loads and runs as the model defines it: softmax
    over the top-k biased logits, gate_up bias, the clamped SwiGLU (swiglu_limit from
    config.json, 7.0 without; 0.75 makes the clamps bite), down bias; against the numpy
    oracle; nothing reported as not modelled."""
    cfg, W, ref = make_layer(rng, "mxfp4", E=8, k=2)
    E, I, H = cfg.n_experts, cfg.inter, cfg.hidden
    gu_bias = (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32)  # interleaved, as stored
    dn_bias = (rng.standard_normal((E, H)) * 0.5).astype(np.float32)
    r_bias = (rng.standard_normal(E) * 0.5).astype(np.float32)
    t = gpt_oss_dict(W, cfg, gu_bias, dn_bias, r_bias)
    write_safetensors(tmp_path / "model.safetensors", t)
    conf = {"model_type": "gpt_oss", "num_experts_per_tok": 2}
    if limit is not None:
        conf["swiglu_limit"] = limit
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with fp4moe.Checkpoint(tmp_path / "model.safetensors") as ck:
        with warnings.catch_warnings():
            warnings.simplefilter("error", fp4moe.NotModelledWarning)
            loaded = ck.load_layer(0)
    L = 7.0 if limit is None else limit
    try:
        assert loaded.layout == "gpt-oss" and loaded.has_expert_bias and loaded.not_modelled == ()
        assert loaded.cfg.score == "softmax-topk" and loaded.cfg.activation == "swiglu-gptoss"
        assert loaded.cfg.swiglu_limit == np.float32(L)
        back = loaded.weights()
        assert np.array_equal(back.w13_data, W.w13_data) and np.array_equal(back.w2_data, W.w2_data)
        b13 = np.concatenate([gu_bias[:, 0::2], gu_bias[:, 1::2]], 1)  # gate then up, as w13's rows
        assert np.array_equal(back.w13_bias, b13) and np.array_equal(back.w2_bias, dn_bias)
        T = 6
        bits, xf = make_x(rng, T, H)
        outs = []
        for backend in ("cpu-ref", "cpu"):
            with fp4moe.Layer(None, loaded, backend=backend, max_tokens=T) as layer:
                outs.append(layer.run(bits))
    finally:
        loaded.close()
    logits = xf.astype(np.float64) @ ref["router"].astype(np.float64).T
    ids, w, margin = moe_ref.route(logits, "softmax-topk", 2, r_bias)
    want = moe_ref.moe(xf, ref["w13"], ref["w2"], ids, w, I, b13=b13, b2=dn_bias, limit=L)
    g = np.stack([ref["w13"][e].astype(np.float64) @ xf.T for e in range(E)]) + b13[:, :, None]
    if limit is not None:  # the clamps really bite: some gate above L, some up outside [-L, L]
        assert (g[:, :I] > L).any() and (np.abs(g[:, I:]) > L).any()
    for got in outs:
        check(got, want, margin)
    plain = moe_ref.moe(xf, ref["w13"], ref["w2"], ids, w, I)  # what fp4moe computed before: far off
    assert moe_ref.nmse(plain, want) > 1e-2
    # Expert-parallel shards: the router (weights and logit bias) is global over all 8
    # experts whichever 4 a shard loads; the shards' partial sums are the whole layer.
    total = 0
    with fp4moe.Checkpoint(tmp_path / "model.safetensors") as ck:
        for first in (0, 4):
            scfg, sw = ck.load_shard(0, first, 4)
            assert scfg.n_experts == E and sw.router_w.shape == (E, H) and sw.router_bias.shape == (E,)
            assert sw.w13_data.shape[0] == 4 and sw.w13_bias.shape == (4, 2 * I)
            assert scfg.swiglu_limit == np.float32(L) and scfg.score == "softmax-topk"
            with fp4moe.Layer(scfg, sw, backend="cpu-ref", max_tokens=T, first_expert=first, n_local=4) as layer:
                total = total + layer.run(bits)
    check(total, want, margin)


def test_route_matches_formula(rng):
    cfg = fp4moe.MoEConfig(n_experts=16, top_k=4, hidden=64, inter=32, score="sigmoid", routed_scale=2.5)
    logits = (rng.standard_normal((9, 16)) * 2).astype(np.float32)
    ids, w = fp4moe.route(cfg, logits)
    rid, rw, margin = moe_ref.route(logits, "sigmoid", 4, routed_scale=2.5)
    assert margin > 1e-6
    assert np.array_equal(ids, rid)
    np.testing.assert_allclose(w, rw, rtol=1e-6)


def test_checkpoint_missing_file(tmp_path):
    with pytest.raises(fp4moe.Error) as e:
        fp4moe.Checkpoint(os.fspath(tmp_path / "nope.safetensors"))
    assert e.value.status == "FM_ERR_IO"


def test_plans_on_cpu(tmp_path):
    """A plan file given to a CPU layer is not read (a PlansWarning says why, the layer works);
    Layer.save_plans on a CPU layer is refused and writes nothing; a NUL in the path refused."""
    cfg, w, _ = make_layer(np.random.default_rng())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = fp4moe.Layer(cfg, w, backend="cpu", max_tokens=2, plans=tmp_path / "none.json")
    assert any(issubclass(c.category, fp4moe.PlansWarning) for c in caught)
    assert "not used" in layer.plans_note and "cpu backend" in layer.plans_note
    target = tmp_path / "plans.json"
    with pytest.raises(fp4moe.Error) as e:
        layer.save_plans(target)
    assert e.value.status == "FM_ERR_UNSUPPORTED"
    assert not target.exists()
    with pytest.raises(ValueError, match="NUL"):
        fp4moe.Layer(cfg, w, backend="cpu", max_tokens=2, plans="a\0b")
    assert fp4moe.Layer(cfg, w, backend="cpu", max_tokens=2).plans_note == ""



def test_act_fp8(rng):
    """W4A8 (MoEConfig.act_fp8) through Python: the two CPU backends agree within the accuracy
    table's bound (1e-4), differ from W4A16 as FP8 activations do (~1e-3), and a name the
    library does not know is refused before any C call (the numerics: test_layer_fp8.c)."""
    cfg, W, _ = make_layer(rng, "nvfp4", H=256, I=128)
    bits, _ = make_x(rng, 6, cfg.hidden)
    outs = {}
    for act in ("off", "block128", "token"):
        cfg.act_fp8 = act
        for be in ("cpu", "cpu-ref"):
            with fp4moe.Layer(cfg, W, backend=be, max_tokens=6) as layer:
                outs[act, be] = layer.run(bits).astype(np.float64)
    nm = lambda a, b: float(((a - b) ** 2).sum() / (b ** 2).sum())
    for act in ("block128", "token"):
        assert np.isfinite(outs[act, "cpu"]).all()
        assert nm(outs[act, "cpu"], outs[act, "cpu-ref"]) <= 1e-4
        assert 2e-4 < nm(outs[act, "cpu-ref"], outs["off", "cpu-ref"]) < 1e-2
    cfg.act_fp8 = "e5m2"
    with pytest.raises(ValueError, match="act_fp8"):
        fp4moe.Layer(cfg, W, backend="cpu", max_tokens=6)
