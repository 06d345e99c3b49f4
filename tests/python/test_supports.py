"""fp4moe.supports against what fp4moe.Layer really creates (numpy only, CPU build or not).

For each configuration, on every backend name: supports says yes exactly when Layer(...)
is created, and when it says no its reason is the status and message of the Layer's
fp4moe.Error. Weights are fresh random ones quantized by fp4moe itself."""
import numpy as np
import pytest

import fp4moe
from fp4moe import MoEConfig, MoEWeights

BASE = dict(n_experts=8, top_k=2, hidden=64, inter=32)


def _cases():
    return [
        ("accepted", dict(), {}),
        ("top_k > n_experts", dict(top_k=9), {}),
        ("groups not dividing", dict(n_group=3, topk_group=1), {}),
        ("gpt-oss activation without a limit", dict(activation="swiglu-gptoss"), {}),
        ("swiglu with a limit", dict(swiglu_limit=7.0), {}),
        ("shared_inter 8", dict(shared_inter=8), {}),
        ("softmax-topk", dict(score="softmax-topk"), {}),
        ("gpt-oss", dict(score="softmax-topk", activation="swiglu-gptoss", swiglu_limit=7.0, wfmt="mxfp4"),
         dict(expert_bias=True, router_bias=True)),
        ("act_nvfp4", dict(act_nvfp4=True), {}),
        ("act_fp8", dict(act_fp8="block128"), {}),
        ("act_fp8 with act_nvfp4", dict(act_fp8="token", act_nvfp4=True), {}),
        ("bf16 experts", dict(wfmt="bf16"), {}),
        ("shard", dict(), dict(first_expert=2, n_local=4)),
        ("bad shard", dict(), dict(first_expert=2, n_local=7)),
    ]


def _weights(cfg, rng, flags, n_local):
    E, H, I = cfg.n_experts, cfg.hidden, cfg.inter
    w13 = rng.standard_normal((n_local, 2 * I, H)).astype(np.float32) / np.sqrt(H)
    w2 = rng.standard_normal((n_local, H, I)).astype(np.float32) / np.sqrt(I)
    router = rng.standard_normal((E, H)).astype(np.float32) / np.sqrt(H)
    W = MoEWeights.quantize(cfg, router, w13, w2)
    if flags.get("expert_bias"):
        W.w13_bias = rng.standard_normal((n_local, 2 * I)).astype(np.float32)
        W.w2_bias = rng.standard_normal((n_local, H)).astype(np.float32)
    if flags.get("router_bias"):
        W.router_bias = rng.standard_normal(E).astype(np.float32)
    return W


@pytest.mark.parametrize("backend", ["cpu-ref", "cpu", "cuda", "auto"])
@pytest.mark.parametrize("name,fields,opts", _cases(), ids=[c[0] for c in _cases()])
def test_supports_matches_layer(backend, name, fields, opts):
    rng = np.random.default_rng()
    cfg_fields = {**BASE, **fields}
    cfg = MoEConfig(**cfg_fields)
    flags = {k: opts[k] for k in ("expert_bias", "router_bias") if k in opts}
    shard = {k: opts[k] for k in ("first_expert", "n_local", "max_tokens") if k in opts}
    ok, why = fp4moe.supports(cfg, backend, **flags, **shard)
    assert isinstance(ok, bool) and isinstance(why, str)
    try:  # weights of the shard's experts; a configuration the library refuses gets the base shapes'
        cfg._c()  # (create refuses it before it reads them)
        wcfg = cfg
    except fp4moe.Error:
        wcfg = MoEConfig(**BASE)
    W = _weights(wcfg, rng, flags, min(shard.get("n_local") or wcfg.n_experts, wcfg.n_experts))
    try:
        layer = fp4moe.Layer(cfg, W, backend=backend, max_tokens=shard.get("max_tokens", 256),
                             first_expert=shard.get("first_expert", 0), n_local=shard.get("n_local", 0),
                             out_dtype="bf16")
    except fp4moe.Error as e:
        assert not ok, f"{name}: supports said yes, Layer raised {e}"
        # the same status, and the library's message (the package prefixes what it was creating)
        assert why.startswith(f"{e.status}: ") and why[len(e.status) + 2:] in e.detail, (why, str(e))
        return
    layer.close()
    assert ok, f"{name}: supports said no ({why}), Layer was created"
    assert why == ""


def test_supports_arguments():
    cfg = MoEConfig(**BASE)
    assert fp4moe.supports(cfg) == (True, "")
    with pytest.raises(TypeError):
        fp4moe.supports(dict(BASE))
    with pytest.raises(ValueError, match="device"):
        fp4moe.supports(cfg, "tpu")
    with pytest.raises(ValueError, match="out_dtype"):
        fp4moe.supports(cfg, out_dtype="f16")
    with pytest.raises(ValueError, match="max_tokens"):  # as Layer(max_tokens=0) raises
        fp4moe.supports(cfg, max_tokens=0)
    ok, why = fp4moe.supports(MoEConfig(**{**BASE, "act_nvfp4": True}), "cuda")
    assert not ok and why.startswith("FM_ERR_")  # no backend, no device, or the kernels' refusal (W4A4)
