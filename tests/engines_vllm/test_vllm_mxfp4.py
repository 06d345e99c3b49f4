"""fp4moe_vllm's gpt-oss MXFP4 experts (Fp4moeMxfp4Experts) against vLLM 0.33.0's own classes, on
fp4moe's CPU backend (no GPU is lent to these tests; docs/engines.md, "vLLM").

- the contract: no abstract method left, every overridden method with vLLM's parameters, the
  MXFP4 oracle's own check of an experts class (_validate_mxfp4_experts_config, which
  make_mxfp4_moe_kernel runs) passing with the scheme it derives, (kMxfp4Static, None);
- the workspace: 0 bytes, vLLM allocates only the output;
- apply() on a gpt-oss-like layer (random MXFP4 codes, E8M0 scales, BF16 biases, w13 rows
  interleaving gate and up as vLLM's gpt-oss loader keeps them) against (a) fp4moe's CPU
  reference layer (cpu-ref) given the same codes de-interleaved by this test, not by the loader,
  and (b) a float64 torch model of gpt-oss's experts that dequantizes the MXFP4 codes with its own
  code (E2M1 table x 2^(e8m0 - 127), low nibble first) and applies the clamped SwiGLU on the
  interleaved rows; outputs poisoned with NaN, NaN/Inf checked first;
- vLLM's GptOssMxfp4MoEMethod itself, with the selection installed: its constructor's oracle
  call answers (EMULATION, Fp4moeMxfp4Experts), create_weights / process_weights_after_loading
  (EMULATION's conversion, vLLM's quant config with gemm1_alpha 1.702, gemm1_beta 1.0, clamp
  7.0, make_mxfp4_moe_kernel) build the kernel, which builds the fp4moe layer, and the kernel's
  apply() matches the torch model;
- the selection: vLLM's select_mxfp4_moe_backend untouched without FP4MOE_VLLM=1, replaced with
  it; refusals (alpha / beta other than gpt-oss's, named; shapes fp4moe refuses, with
  fp4moe.supports's reason; quantized activations; expert parallelism; SiLU) carried in the
  ValueError."""
import inspect

import numpy as np
import pytest
import torch

import fp4moe
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType
from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
from vllm.model_executor.layers.quantization.utils.quant_utils import (kMxfp4Static, kMxfp8Dynamic, kNvfp4Dynamic,
                                                                       kNvfp4Static)

from fp4moe_vllm import selection
from fp4moe_vllm.experts import Fp4moeExperts, Fp4moeMxfp4Experts

STD = mk.FusedMoEActivationFormat.Standard
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                    dtype=torch.float64)


def moe_config(E=8, k=2, H=256, I=128, max_num_tokens=16, activation=MoEActivation.SWIGLUOAI, parallel=None,
               in_dtype=torch.bfloat16, has_bias=True, **kw):
    return FusedMoEConfig(num_experts=E, experts_per_token=k, hidden_dim=H, intermediate_size=I,
                          num_local_experts=E, num_logical_experts=E, activation=activation, device="cpu",
                          routing_method=RoutingMethodType.Renormalize,
                          moe_parallel_config=parallel or FusedMoEParallelConfig.make_no_parallel(),
                          in_dtype=in_dtype, max_num_tokens=max_num_tokens, has_bias=has_bias, **kw)


def quant_config(L, alpha=1.702, beta=1.0, limit=7.0):
    """What GptOssMxfp4MoEMethod.get_fused_moe_quant_config makes for EMULATION."""
    return oracle.make_mxfp4_moe_quant_config(oracle.Mxfp4MoeBackend.EMULATION, w1_scale=L.w13_weight_scale,
                                              w2_scale=L.w2_weight_scale, w1_bias=L.w13_bias, w2_bias=L.w2_bias,
                                              gemm1_alpha=alpha, gemm1_beta=beta, swiglu_limit=limit)


class Layer(torch.nn.Module):
    """What the experts and GptOssMxfp4MoEMethod read of vLLM's RoutedExperts."""
    apply_router_weight_on_input = False

    def _expert_routing_tables(self):
        return None


def random_gptoss(E, H, I, seed):
    """vLLM's gpt-oss MXFP4 tensors as its loader leaves them: w13 [E][2I][H/2] uint8 with rows
    interleaving gate (even) and up (odd), E8M0 scales uint8 [E][2I][H/32], w2 [E][H][I/2], BF16
    biases (w13_bias interleaved like the rows). Random codes: every nibble, scales 2^-9 .. 2^-3."""
    g = torch.Generator().manual_seed(seed)
    L = Layer()
    L.w13_weight = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
    L.w13_weight_scale = torch.randint(118, 125, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8)
    L.w2_weight = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
    L.w2_weight_scale = torch.randint(118, 125, (E, H, I // 32), generator=g, dtype=torch.uint8)
    L.w13_bias = (torch.randn(E, 2 * I, generator=g) * 0.5).to(torch.bfloat16)
    L.w2_bias = (torch.randn(E, H, generator=g) * 0.5).to(torch.bfloat16)
    return L


def dequant(codes, scales):
    """MXFP4 [..][N][K/2] uint8 (low nibble = even element) and E8M0 [..][N][K/32] -> float64 [..][N][K]."""
    v = torch.stack([E2M1[(codes & 15).long()], E2M1[(codes >> 4).long()]], -1).flatten(-2)
    return v * torch.pow(2.0, scales.double() - 127).repeat_interleave(32, -1)


def torch_gptoss(L, x, ids, w, limit=7.0):
    """gpt-oss's experts in float64 on the interleaved rows: gate = min(g, L), up = clamp(u, -L, L),
    (up + 1) * gate * sigmoid(1.702 gate), biases; the top-k weighted sum. Also returns the share of
    gate / up values the clamp changed (so the bound is known to cover the clamp)."""
    w13, w2 = dequant(L.w13_weight, L.w13_weight_scale), dequant(L.w2_weight, L.w2_weight_scale)
    b13, b2 = L.w13_bias.double(), L.w2_bias.double()
    xd = x.double()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    clamped = n = 0
    for e in ids.unique().tolist():
        t, j = (ids == e).nonzero(as_tuple=True)
        h = xd[t] @ w13[e].T + b13[e]
        gate, up = h[:, ::2], h[:, 1::2]
        clamped += int((gate > limit).sum() + (up.abs() > limit).sum())
        n += gate.numel() + up.numel()
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        a = (up + 1) * gate * torch.sigmoid(1.702 * gate)
        out.index_add_(0, t, w[t, j].double()[:, None] * (a @ w2[e].T + b2[e]))
    return out, clamped / max(1, n)


def cpu_ref(L, x, ids, w, k, limit=7.0):
    """fp4moe's reference layer (cpu-ref, FP32 output) on the same codes, de-interleaved here (not
    by fp4moe's gpt-oss loader) into fp4moe's w13 layout, gate rows then up rows."""
    E, I2, _ = L.w13_weight.shape
    H, I = L.w2_weight.shape[1], I2 // 2
    order = torch.cat([torch.arange(0, I2, 2), torch.arange(1, I2, 2)])
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=k, hidden=H, inter=I, score="softmax-topk", wfmt="mxfp4",
                           activation="swiglu-gptoss", swiglu_limit=limit)
    W = fp4moe.MoEWeights(np.zeros((E, H), np.float32), L.w13_weight[:, order].numpy(),
                          L.w13_weight_scale[:, order].numpy(), np.ones(E, np.float32), L.w2_weight.numpy(),
                          L.w2_weight_scale.numpy(), np.ones(E, np.float32),
                          w13_bias=L.w13_bias[:, order].float().numpy(), w2_bias=L.w2_bias.float().numpy())
    with fp4moe.Layer(cfg, W, backend="cpu-ref", max_tokens=x.shape[0]) as ref:
        y = ref.run(x.view(torch.int16).numpy().view(np.uint16), ids.numpy(), w.numpy())
    return torch.from_numpy(np.asarray(y).astype(np.float32))


def routing(T, E, k, seed, H):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.softmax(torch.randn(T, k, generator=g), -1)
    return x, ids, w


def nmse(o, r):
    return float(((o.double() - r.double()) ** 2).sum() / (r.double() ** 2).sum())


def make_experts(L, E=8, k=2, H=256, I=128, **qkw):
    ex = Fp4moeMxfp4Experts(moe_config(E, k, H, I), quant_config(L, **qkw))
    ex.process_weights_after_loading(L)
    return ex


# ---- the contract ----
def test_no_abstract_method_left():
    assert issubclass(Fp4moeMxfp4Experts, mk.FusedMoEExpertsModular)
    assert not inspect.isabstract(Fp4moeMxfp4Experts), Fp4moeMxfp4Experts.__abstractmethods__


@pytest.mark.parametrize("name", ["_supports_quant_scheme", "_supports_activation", "is_supported_config",
                                  "process_weights_after_loading", "apply"])
def test_signatures_match_vllm(name):
    base = next(c for c in mk.FusedMoEExpertsModular.__mro__ if name in vars(c))
    ours, theirs = inspect.getattr_static(Fp4moeMxfp4Experts, name), inspect.getattr_static(base, name)
    assert name in vars(Fp4moeMxfp4Experts)
    assert type(ours) is type(theirs), f"{name}: {type(ours).__name__} here, {type(theirs).__name__} in vLLM"
    f_ours, f_theirs = (getattr(m, "__func__", m) for m in (ours, theirs))
    assert [(p.name, p.kind) for p in inspect.signature(f_ours).parameters.values()] == \
        [(p.name, p.kind) for p in inspect.signature(f_theirs).parameters.values()], name


def test_oracle_view():
    cls = Fp4moeMxfp4Experts
    assert cls.activation_format() == STD and cls.is_monolithic() is False
    ok, why = cls.is_supported_config(cls, moe_config(), kMxfp4Static, None, STD)
    assert ok and why is None, why
    # the scheme make_mxfp4_moe_kernel derives for an experts class, and its own check of it
    assert oracle._mxfp4_quant_keys_for_experts(cls, oracle.Mxfp4MoeBackend.EMULATION) == (kMxfp4Static, None)
    oracle._validate_mxfp4_experts_config(cls, moe_config(), oracle.Mxfp4MoeBackend.EMULATION)
    # the NVFP4 class and the MXFP4 class each take only their own format
    assert not Fp4moeExperts._supports_quant_scheme(kMxfp4Static, None)
    assert not cls._supports_quant_scheme(kNvfp4Static, kNvfp4Dynamic)
    L = random_gptoss(8, 256, 128, 1)
    ex = make_experts(L)
    assert ex.expects_unquantized_inputs is True
    assert isinstance(ex.finalize_weight_and_reduce_impl(), TopKWeightAndReduceNoOP)
    assert ex.workspace_bytes() == 0
    for M in (1, 7, 16, 300):
        assert ex.workspace_shapes(M, 256, 256, 2, 8, 8, None, MoEActivation.SWIGLUOAI) == ((0,), (0,), (M, 256))
    ex.moe.close()


# ---- apply ----
@pytest.mark.parametrize("T", [1, 5, 37])  # 37 > max_num_tokens 16: three fp4moe calls
def test_apply(T):
    E, H, I, k = 8, 256, 128, 2
    L = random_gptoss(E, H, I, 200 + T)
    ex = make_experts(L)
    x, ids, w = routing(T, E, k, T, H)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    assert ex.apply(out, x, L.w13_weight, L.w2_weight, w, ids, MoEActivation.SWIGLUOAI, E, None, None, None,
                    torch.empty(0), torch.empty(0), None, False) is None
    assert torch.isfinite(out).all(), "NaN/Inf left in the output (the poison, or a non-finite result)"
    r = cpu_ref(L, x, ids, w, k)
    m, clamped = torch_gptoss(L, x, ids, w)
    assert torch.isfinite(r).all() and torch.isfinite(m).all()
    e_ref, e_model = nmse(out, r), nmse(out, m)
    print(f"MXFP4 apply T={T}: NMSE {e_ref:.2e} against cpu-ref, {e_model:.2e} against the float64 torch "
          f"gpt-oss model ({clamped:.1%} of gate/up values clamped); cpu-ref vs model {nmse(r, m):.2e}")
    assert clamped > 0.005  # the clamp is exercised
    # cpu-ref (FP32 output) and the float64 model are the same function up to FP32 rounding
    # (seen 4e-14): fp4moe's reference reads these codes as this test's own dequantization does.
    assert nmse(r, m) <= 1e-10, nmse(r, m)
    # Same FP4 values on every side; the fast CPU backend's sums in FP32 (and any BF16 rounding of
    # the SwiGLU product before FC2, 2^-9 relative) and the output's BF16 rounding (2^-9) give
    # about 1.3e-6 of NMSE each,
    # so 2e-5 bounds them (seen 2.7e-6 .. 3.2e-6). Tried against the same fp4moe output (T=37):
    # the torch model reading w13's rows as gate half then up half gives NMSE 2.0, with each
    # byte's nibbles swapped 2.1, without the biases 0.07, without the clamp 0.009.
    assert e_ref <= 2e-5, e_ref
    assert e_model <= 2e-5, e_model
    ex.moe.close()


def test_apply_refuses():
    L = random_gptoss(8, 256, 128, 2)
    ex = Fp4moeMxfp4Experts(moe_config(), quant_config(L))
    x, out = torch.zeros(2, 256, dtype=torch.bfloat16), torch.zeros(2, 256, dtype=torch.bfloat16)
    ids, w = torch.zeros(2, 2, dtype=torch.int32), torch.full((2, 2), 0.5)
    args = (None, None, None, None, None, None)
    with pytest.raises(RuntimeError, match="before process_weights_after_loading"):
        ex.apply(out, x, None, None, w, ids, MoEActivation.SWIGLUOAI, 8, None, *args[:5], False)
    ex.process_weights_after_loading(L)
    with pytest.raises(ValueError, match="activation"):
        ex.apply(out, x, None, None, w, ids, MoEActivation.SILU, 8, None, *args[:5], False)
    with pytest.raises(ValueError, match="expert_map"):
        ex.apply(out, x, None, None, w, ids, MoEActivation.SWIGLUOAI, 8, torch.arange(8), *args[:5], False)
    ex.moe.close()


@pytest.mark.parametrize("field,kw", [("gemm1_alpha", {"alpha": 1.0}), ("gemm1_beta", {"beta": 0.0})])
def test_weights_refuse_other_swiglu(field, kw):
    """The quant config's values are checked when the layer is built (the oracle sees only the
    MoE config): gpt-oss's 1.702 and + 1 only, refused by name."""
    L = random_gptoss(8, 256, 128, 3)
    with pytest.raises(ValueError, match=field):
        make_experts(L, **kw)


def test_limit_is_vllms():
    """The clamp fp4moe runs is the quant config's gemm1_clamp_limit: with 3.0 the output matches
    the torch model at 3.0 and not at 7.0."""
    E, H, I, k, T = 8, 256, 128, 2, 16
    L = random_gptoss(E, H, I, 4)
    ex = make_experts(L, limit=3.0)
    x, ids, w = routing(T, E, k, 5, H)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    ex.apply(out, x, None, None, w, ids, MoEActivation.SWIGLUOAI, E, None, None, None, None, None, None, False)
    assert torch.isfinite(out).all()
    m3, c3 = torch_gptoss(L, x, ids, w, 3.0)
    m7, _ = torch_gptoss(L, x, ids, w, 7.0)
    print(f"limit 3.0 ({c3:.1%} clamped): NMSE {nmse(out, m3):.2e} against the model at 3.0, "
          f"{nmse(out, m7):.2e} at 7.0")
    assert nmse(out, m3) <= 2e-5 and nmse(out, m7) > 1e-3
    ex.moe.close()


# ---- vLLM's gpt-oss MXFP4 method ----
def test_gptoss_method_end_to_end():
    from vllm.model_executor.layers.quantization import mxfp4 as q
    from vllm.v1.worker import workspace

    E, H, I, k, T = 8, 256, 128, 2, 37
    src = random_gptoss(E, H, I, 9)
    original = q.select_mxfp4_moe_backend
    selection.install()
    try:
        mc = moe_config(E, k, H, I)
        method = q.GptOssMxfp4MoEMethod(mc)
        assert (method.mxfp4_backend, method.experts_cls) == (oracle.Mxfp4MoeBackend.EMULATION, Fp4moeMxfp4Experts)
        assert method.maybe_roundup_sizes(H, I, torch.bfloat16, mc.moe_parallel_config) == (H, I)
        layer = Layer()
        layer.moe_config = mc
        method.create_weights(layer, E, H, I, torch.bfloat16)
        for n in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_bias", "w2_bias"):
            p = getattr(layer, n)
            assert p.shape == getattr(src, n).shape and p.dtype == getattr(src, n).dtype, n
            p.data.copy_(getattr(src, n))
        method.process_weights_after_loading(layer)
        for n in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_bias", "w2_bias"):
            assert torch.equal(getattr(layer, n), getattr(src, n)), f"{n} changed by EMULATION's conversion"
        qc = method.moe_quant_config
        assert (qc.gemm1_alpha, qc.gemm1_beta, qc.gemm1_clamp_limit) == (1.702, 1.0, 7.0)
        ex = method.moe_kernel.impl.fused_experts
        assert isinstance(ex, Fp4moeMxfp4Experts) and ex.moe is not None
        if not workspace.is_workspace_manager_initialized():
            workspace.init_workspace_manager(torch.device("cpu"))
        x, ids, w = routing(T, E, k, 13, H)
        y = method.moe_kernel.apply(x, layer.w13_weight, layer.w2_weight, w, ids, MoEActivation.SWIGLUOAI, E, None,
                                    False)
        assert isinstance(y, torch.Tensor) and y.shape == (T, H) and y.dtype == torch.bfloat16
        assert torch.isfinite(y).all()
        m, clamped = torch_gptoss(src, x, ids, w)
        e = nmse(y, m)
        print(f"GptOssMxfp4MoEMethod on fp4moe: NMSE {e:.2e} against the float64 torch model "
              f"({clamped:.1%} clamped), {nmse(y, cpu_ref(src, x, ids, w, k)):.2e} against cpu-ref")
        assert e <= 2e-5, e
        ex.moe.close()
    finally:
        q.select_mxfp4_moe_backend = original


# ---- the selection and its refusals ----
def test_selection_answer():
    assert selection.select_mxfp4_moe_backend(moe_config()) == (oracle.Mxfp4MoeBackend.EMULATION,
                                                                Fp4moeMxfp4Experts)
    assert selection.select_mxfp4_moe_backend(moe_config(has_bias=False))[1] is Fp4moeMxfp4Experts
    # gpt-oss-20b / -120b's shapes (hidden 2880, 32 / 128 experts, top-4), whole and as the
    # tensor-parallel partitions vLLM's loader makes (2880 / 2, and 2880 / 4 rounded up to 736),
    # with vLLM's default max_num_tokens: taken (the library's answer for the CPU backend here)
    for E, I in ((32, 2880), (128, 2880), (32, 1440), (128, 736)):
        cfg = moe_config(E=E, k=4, H=2880, I=I, max_num_tokens=8192)
        assert selection.select_mxfp4_moe_backend(cfg)[1] is Fp4moeMxfp4Experts, (E, I)


def refusal(cfg, activation_key=None):
    with pytest.raises(ValueError) as e:
        selection.select_mxfp4_moe_backend(cfg, activation_key)
    msg = str(e.value)
    assert msg.startswith("FP4MOE_VLLM=1 selects fp4moe for the MXFP4 MoE experts, and it refuses this layer: ")
    assert "Unset FP4MOE_VLLM" in msg
    return msg


def test_selection_refuses_with_fp4moe_reason():
    # a shape the library refuses (hidden not a multiple of the MX block): fp4moe.supports's reason, verbatim
    cfg = moe_config(H=100)
    ok, why = fp4moe.supports(fp4moe.MoEConfig(n_experts=8, top_k=2, hidden=100, inter=128, score="softmax-topk",
                                               wfmt="mxfp4", activation="swiglu-gptoss", swiglu_limit=7.0),
                              "cpu", max_tokens=16, expert_bias=True)
    assert not ok and why.startswith("FM_ERR_"), why
    assert f"fp4moe: {why}" in refusal(cfg)
    _, reason = Fp4moeMxfp4Experts.is_supported_config(Fp4moeMxfp4Experts, cfg, kMxfp4Static, None, STD)
    assert reason == f"fp4moe: {why}"


@pytest.mark.parametrize("field,value", [("swiglu_alpha", 1.0), ("swiglu_beta", 0.0)])
def test_selection_refuses_other_swiglu(field, value):
    assert f"fp4moe: {field}={value}" in refusal(moe_config(**{field: value}))


def test_selection_takes_gptoss_values():
    for kw in ({"swiglu_alpha": 1.702, "swiglu_beta": 1.0, "swiglu_limit": 7.0}, {"swiglu_limit": 5.5}):
        assert selection.select_mxfp4_moe_backend(moe_config(**kw))[1] is Fp4moeMxfp4Experts


def test_selection_refuses_what_vllm_checks():
    assert "quantization scheme" in refusal(moe_config(), kMxfp8Dynamic)  # W4A8: fp4moe runs MXFP4 on BF16
    assert "activation" in refusal(moe_config(activation=MoEActivation.SILU))
    assert "activation" in refusal(moe_config(activation=MoEActivation.SWIGLUOAI_UNINTERLEAVE))
    ep = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=1, ep_size=2, tp_rank=0, pcp_rank=0, dp_rank=0,
                                ep_rank=0, sp_size=1, use_ep=True, all2all_backend="naive", enable_eplb=False)
    assert "parallel config" in refusal(moe_config(parallel=ep))
    assert "torch.float16" in refusal(moe_config(in_dtype=torch.float16))


METHOD = """
import fp4moe_vllm, torch
fp4moe_vllm.register()
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig, RoutingMethodType
from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
from vllm.model_executor.layers.quantization import mxfp4 as q
mc = FusedMoEConfig(num_experts=8, experts_per_token=2, hidden_dim=256, intermediate_size=128, num_local_experts=8,
                    num_logical_experts=8, activation=MoEActivation.SWIGLUOAI, device="cpu",
                    routing_method=RoutingMethodType.Renormalize,
                    moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=torch.bfloat16,
                    max_num_tokens=16, has_bias=True)
def pick(f):
    try:
        b, c = f()
        return f"{b.name}/{c.__name__}"
    except Exception as e:
        return f"raised {type(e).__name__}: {str(e)[:200]!r}"
import types
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
# The oracle reads the current config's model_config.quantization_config (a user's MoE activation
# override): a model's config without one. No model is loaded, so it stands in for ModelConfig.
vc = VllmConfig(device_config=DeviceConfig(device="cpu"))
object.__setattr__(vc, "model_config", types.SimpleNamespace(quantization_config=None))
with set_current_vllm_config(vc):
    method = pick(lambda: (lambda m: (m.mxfp4_backend, m.experts_cls))(q.GptOssMxfp4MoEMethod(mc)))
    print("METHOD|" + method + "|" + pick(lambda: oracle.select_mxfp4_moe_backend(mc)))
"""


@pytest.mark.parametrize("value", [None, "1"])  # "0": test_selection_is_explicit
def test_gptoss_method_selection_in_a_fresh_process(value):
    """vLLM's GptOssMxfp4MoEMethod constructed after register(): fp4moe's experts with
    FP4MOE_VLLM=1; otherwise exactly what vLLM's own select_mxfp4_moe_backend answers (or raises)
    on this machine, fp4moe nowhere."""
    import os
    import subprocess
    import sys

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    env = {k: v for k, v in os.environ.items() if k != "FP4MOE_VLLM"}
    if value is not None:
        env["FP4MOE_VLLM"] = value
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "python"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", METHOD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(s for s in r.stdout.splitlines() if s.startswith("METHOD|"))
    _, method, vllms = line.split("|", 2)
    print(f"FP4MOE_VLLM={value}: GptOssMxfp4MoEMethod picks {method}; vLLM's oracle alone: {vllms}")
    if value == "1":
        assert method == "EMULATION/Fp4moeMxfp4Experts", line
    else:
        assert method == vllms and "Fp4moe" not in method, line
