"""The torch ops on CPU tensors (the CPU backends): same numbers as the numpy
Layer, torch.compile(fullgraph=True) traces them, out= is written in place,
bad tensors raise naming the argument. Skips when torch is not installed."""

import numpy as np
import pytest

import fp4moe
import moe_ref
from conftest import make_layer, make_x, reference

torch = pytest.importorskip("torch", reason="torch is not installed: the torch ops are not tested here")
from fp4moe.torch_ops import MoE  # noqa: E402

need_run_api = pytest.mark.skipif(not fp4moe.HAS_RUN_API, reason="the library does not export fm_layer_run yet")


def bf16(bits):
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)


@pytest.fixture
def setup(rng):
    cfg, W, ref = make_layer(rng, "nvfp4", E=8, k=2)
    m = MoE(cfg, W, device="cpu", out_dtype=torch.float32, max_tokens=8)
    yield cfg, W, ref, m
    m.close()


def test_op_equals_reference(setup, rng):
    cfg, W, ref, m = setup
    bits, xf = make_x(rng, 5, cfg.hidden)
    y = m(bf16(bits))
    assert y.dtype == torch.float32 and y.shape == (5, cfg.hidden)
    want, margin = reference(cfg, ref, xf)
    assert margin > 1e-6 and torch.isfinite(y).all()
    assert moe_ref.nmse(y.numpy(), want) <= 1e-9
    out = torch.full((5, cfg.hidden), float("nan"))
    r = m(bf16(bits), out=out)
    assert r is out and torch.equal(out, y)


def test_compile_fullgraph(setup, rng):
    cfg, W, ref, m = setup
    x = bf16(make_x(rng, 4, cfg.hidden)[0])
    eager = m(x)

    def f(x):
        return m(x) * 2

    def g(x, out):
        m(x, out=out)
        return out + 1

    assert torch.equal(torch.compile(f, fullgraph=True)(x), eager * 2)
    out = torch.empty(4, cfg.hidden)
    r = torch.compile(g, fullgraph=True)(x, out)
    assert torch.equal(out, eager) and torch.equal(r, eager + 1)


@need_run_api
def test_external_routing_and_bf16_out(rng):
    cfg, W, ref = make_layer(rng, "mxfp4", E=8, k=2)
    m = MoE(cfg, W, device="cpu", max_tokens=8)  # BF16 out
    T = 3
    bits, xf = make_x(rng, T, cfg.hidden)
    ids = torch.tensor([[0, 5], [7, -1], [3, 2]], dtype=torch.int32)
    w = torch.rand(T, 2)
    y = m(bf16(bits), ids, w)
    assert y.dtype == torch.bfloat16
    want, _ = reference(cfg, ref, xf, ids.numpy(), w.numpy())
    assert moe_ref.nmse(y.float().numpy(), want) <= 1e-5  # one BF16 rounding of the output: ~1.3e-6


def test_bad_tensors_raise(setup, rng):
    cfg, W, ref, m = setup
    x = bf16(make_x(rng, 2, cfg.hidden)[0])
    ids = torch.zeros(2, 2, dtype=torch.int32)
    wts = torch.ones(2, 2)
    cases = [
        ((x.float(),), "x: expected a contiguous torch.bfloat16"),
        ((x[:, :32],), r"x: expected .* \[T\]\[64\]"),
        ((torch.cat([x, x], 1)[:, ::2],), "non-contiguous"),
        ((x.view(-1)[1:].view(-1)[:2 * 63].view(2, 63),), "x: expected"),
        ((torch.zeros(9, cfg.hidden, dtype=torch.bfloat16),), r"T=9 outside \[1, max_tokens=8\]"),
        ((x, ids, None), "give both"),
        ((x, ids.long(), wts), "topk_ids: expected a contiguous torch.int32"),
        ((x, ids, wts.double()), "topk_weights: expected a contiguous torch.float32"),
        ((x, ids[:, :1], wts[:, :1]), r"topk_ids: expected .* \[2\]\[2\]"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m(*args)
    out = torch.empty(2, cfg.hidden, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out: expected a contiguous torch.float32"):
        m(x, out=out)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        big = torch.empty(2 * cfg.hidden + 1)
        m(x, out=big[1:].view(2, cfg.hidden))
    with pytest.raises(ValueError, match="is not the id of a live"):
        torch.ops.fp4moe.moe(123456, x)
    nan = x.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(fp4moe.Error, match="FM_ERR_NONFINITE"):
        m(nan)


def test_from_modelopt_tensors(rng):
    """Weights as a ModelOpt checkpoint stores them: uint8 packed, float8_e4m3fn scales, FP32 globals."""
    cfg, W, ref = make_layer(rng, "nvfp4", E=4, k=2)
    I = cfg.inter
    experts = []
    for e in range(cfg.n_experts):
        def proj(d, s, g):
            return {"weight": torch.from_numpy(d.copy()),
                    "weight_scale": torch.from_numpy(s.copy()).view(torch.float8_e4m3fn),
                    "weight_scale_2": torch.tensor(g, dtype=torch.float32)}
        experts.append({"gate_proj": proj(W.w13_data[e, :I], W.w13_scales[e, :I], W.w13_global[e]),
                        "up_proj": proj(W.w13_data[e, I:], W.w13_scales[e, I:], W.w13_global[e]),
                        "down_proj": proj(W.w2_data[e], W.w2_scales[e], W.w2_global[e])})
    router = torch.from_numpy(W.router_w).to(torch.float32)
    m = MoE.from_modelopt_experts(cfg, router, experts, device="cpu", out_dtype=torch.float32, max_tokens=4)
    bits, xf = make_x(rng, 3, cfg.hidden)
    want, margin = reference(cfg, ref, xf)
    assert margin > 1e-6 and moe_ref.nmse(m(bf16(bits)).numpy(), want) <= 1e-9
    experts[1]["up_proj"]["weight_scale_2"] = torch.tensor(W.w13_global[1] * 2)
    with pytest.raises(ValueError, match="gate and up global scales differ for expert 1"):
        MoE.from_modelopt_experts(cfg, router, experts, device="cpu")
    experts[1]["up_proj"]["weight_scale_2"] = torch.tensor(W.w13_global[1])
    experts[2]["down_proj"]["weight"] = experts[2]["down_proj"]["weight"].to(torch.int32)
    with pytest.raises(TypeError, match=r"experts\[2\]\['down_proj'\]\['weight'\]: expected torch.uint8"):
        MoE.from_modelopt_experts(cfg, router, experts, device="cpu")
