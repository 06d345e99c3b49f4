"""fp4moe_vllm against vLLM 0.33.0's own classes (scripts/requirements-vllm.txt), on fp4moe's CPU
backend: no GPU is lent to these tests, so nothing here runs on cuda (docs/engines.md, "vLLM").

- the contract: Fp4moeExperts leaves none of FusedMoEExpertsModular's abstract methods
  unimplemented, and each method vLLM calls has the base class's parameters, in order, with the
  same static-ness;
- the workspace: fp4moe's query says 0 bytes and workspace_shapes asks vLLM for nothing but the
  output [M][K];
- apply() on random NVFP4 weights against fp4moe's CPU reference layer (cpu-ref), same weights,
  ids and weights: outputs poisoned with NaN before, NaN/Inf checked first;
- apply() against an independent float64 model of the experts whose weights are dequantized by
  vLLM's own NVFP4 dequantizer (nvfp4_emulation_utils.dequantize_to_dtype): the layout fp4moe
  reads is the one vLLM means, not only the one fp4moe's quantizer writes;
- vLLM's own modular kernel (FusedMoEKernel with its no-DP/EP prepare/finalize, the quant config
  the NVFP4 oracle makes for EMULATION, buffers from its workspace manager) running the experts;
- vLLM's ModelOpt and compressed-tensors W4A4 NVFP4 MoE methods (ModelOptNvFp4FusedMoE,
  CompressedTensorsW4A4Nvfp4MoEMethod) with the selection installed: each
  one's oracle call answers (EMULATION, Fp4moeExperts), its process_weights_after_loading converts
  and builds the kernel, which calls ours, and its kernel's apply() is within the cpu-ref bound;
- the oracle entry: vLLM's EMULATION conversion, which the selection names, hands the weights on
  as stored;
- the selection (NVFP4 and gpt-oss MXFP4; the MXFP4 experts are tested in test_vllm_mxfp4.py): off unless FP4MOE_VLLM=1 (also through vLLM's own plugin loader and the entry
  point pyproject.toml declares), a bad value refused naming the variable;
- refusals: vLLM's checks and fp4moe.supports's reasons, passed through word for word."""
import inspect
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

import fp4moe
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (FusedMoEConfig, FusedMoEParallelConfig,
                                                         FusedMoEQuantConfig, RoutingMethodType)
from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
from vllm.model_executor.layers.quantization.utils.quant_utils import (kMxfp4Static, kNvfp4Dynamic,
                                                                       kNvfp4Static)

from fp4moe_vllm import experts as fx
from fp4moe_vllm.experts import Fp4moeExperts

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def moe_config(E=8, k=2, H=256, I=128, max_num_tokens=16, activation=MoEActivation.SILU, parallel=None,
               in_dtype=torch.bfloat16):
    return FusedMoEConfig(num_experts=E, experts_per_token=k, hidden_dim=H, intermediate_size=I,
                          num_local_experts=E, num_logical_experts=E, activation=activation, device="cpu",
                          routing_method=RoutingMethodType.Renormalize,
                          moe_parallel_config=parallel or FusedMoEParallelConfig.make_no_parallel(),
                          in_dtype=in_dtype, max_num_tokens=max_num_tokens)


def experts(cfg):
    return Fp4moeExperts(cfg, FusedMoEQuantConfig.make(quant_dtype=None))


# ---- the contract ----
def test_no_abstract_method_left():
    assert issubclass(Fp4moeExperts, mk.FusedMoEExpertsModular)
    assert not inspect.isabstract(Fp4moeExperts), Fp4moeExperts.__abstractmethods__
    wanted = {n for c in Fp4moeExperts.__mro__ for n in getattr(c, "__abstractmethods__", ())}
    assert wanted >= {"apply", "workspace_shapes", "finalize_weight_and_reduce_impl", "activation_format",
                      "_supports_current_device", "_supports_no_act_and_mul", "_supports_quant_scheme",
                      "_supports_activation", "_supports_parallel_config"}, wanted
    for n in wanted:
        assert getattr(Fp4moeExperts, n) is not getattr(mk.FusedMoEExpertsModular, n, None), n


OVERRIDDEN = ["apply", "workspace_shapes", "finalize_weight_and_reduce_impl", "activation_format",
              "_supports_current_device", "_supports_no_act_and_mul", "_supports_quant_scheme",
              "_supports_activation", "_supports_parallel_config", "is_supported_config",
              "process_weights_after_loading", "expects_unquantized_inputs", "supports_expert_map", "__init__"]


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_signatures_match_vllm(name):
    base = next(c for c in mk.FusedMoEExpertsModular.__mro__ if name in vars(c)) \
        if name != "supports_expert_map" else None
    ours = inspect.getattr_static(Fp4moeExperts, name)
    if base is None:  # not on the base class: the modular kernel asks for it where it exists (b12x.py)
        assert callable(ours)
        return
    theirs = inspect.getattr_static(base, name)
    assert type(ours) is type(theirs), f"{name}: {type(ours).__name__} here, {type(theirs).__name__} in vLLM"
    if isinstance(theirs, property):
        return
    f_ours, f_theirs = (getattr(m, "__func__", m) for m in (ours, theirs))
    p_ours = [(p.name, p.kind) for p in inspect.signature(f_ours).parameters.values()]
    p_theirs = [(p.name, p.kind) for p in inspect.signature(f_theirs).parameters.values()]
    assert p_ours == p_theirs, f"{name}: {p_ours} != vLLM's {p_theirs}"


def test_oracle_view():
    assert Fp4moeExperts.activation_format() == mk.FusedMoEActivationFormat.Standard
    assert Fp4moeExperts.is_monolithic() is False
    ex = experts(moe_config())
    assert ex.expects_unquantized_inputs is True
    assert isinstance(ex.finalize_weight_and_reduce_impl(), TopKWeightAndReduceNoOP)
    ok, why = Fp4moeExperts.is_supported_config(Fp4moeExperts, moe_config(), kNvfp4Static, kNvfp4Dynamic,
                                                mk.FusedMoEActivationFormat.Standard)
    assert ok and why is None, why


# ---- weights, workspace, apply ----
def random_layer(E, H, I, seed):
    """vLLM's ModelOpt NVFP4 layer as its method leaves it for EMULATION: packed uint8, E4M3 block
    scales, one float32 global per expert and matrix; with the fp4moe.MoEWeights of the same codes."""
    rng = np.random.default_rng(seed)
    q13 = [fp4moe.quantize(rng.standard_normal((2 * I, H), dtype=np.float32) * 0.05, "nvfp4") for _ in range(E)]
    q2 = [fp4moe.quantize(rng.standard_normal((H, I), dtype=np.float32) * 0.05, "nvfp4") for _ in range(E)]

    def st(qs, f):
        return torch.from_numpy(np.stack([np.asarray(getattr(q, f)) for q in qs]))

    class Layer:
        apply_router_weight_on_input = False

    L = Layer()
    L.w13_weight, L.w2_weight = st(q13, "data"), st(q2, "data")
    L.w13_weight_scale = st(q13, "scales").view(torch.float8_e4m3fn)
    L.w2_weight_scale = st(q2, "scales").view(torch.float8_e4m3fn)
    L.w13_weight_scale_2 = torch.tensor([q.global_scale for q in q13], dtype=torch.float32)
    L.w2_weight_scale_2 = torch.tensor([q.global_scale for q in q2], dtype=torch.float32)
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=2, hidden=H, inter=I)
    W = fp4moe.MoEWeights.from_qtensors(np.zeros((E, H), np.float32), q13, q2)
    return L, cfg, W


def test_workspace():
    L, _, _ = random_layer(8, 256, 128, 1)
    ex = experts(moe_config())
    ex.process_weights_after_loading(L)
    assert ex.workspace_bytes() == 0  # fp4moe's query: the layer owns its scratch
    for M in (1, 7, 16, 300):
        assert ex.workspace_shapes(M, 256, 256, 2, 8, 8, None, MoEActivation.SILU) == ((0,), (0,), (M, 256))
    ex.moe.close()


@pytest.mark.parametrize("T", [1, 5, 37])  # 37 > max_num_tokens 16: three fp4moe calls
def test_apply_against_cpu_reference(T):
    E, H, I, k = 8, 256, 128, 2
    L, cfg, W = random_layer(E, H, I, 100 + T)
    ex = experts(moe_config(E, k, H, I))
    ex.process_weights_after_loading(L)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.softmax(torch.randn(T, k, generator=g), -1)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    assert ex.apply(out, x, L.w13_weight, L.w2_weight, w, ids, MoEActivation.SILU, E, None, None, None,
                    torch.empty(0), torch.empty(0), None, False) is None
    assert torch.isfinite(out).all(), "NaN/Inf left in the output (the poison, or a non-finite result)"
    y = reference(cfg, W, x, ids, w)
    assert torch.isfinite(y).all()
    o = out.float()
    # The reference is the FP32 sum of the same FP4 products (out_dtype f32), ours that sum in
    # another order rounded to BF16 (vLLM's activation dtype): rounding is at most 2^-9 relative,
    # the order a few FP32 ulps, so every element within 2^-8 of its reference's magnitude plus
    # 1e-6, and NMSE <= 1e-5 (BF16 rounding alone gives about 2^-18 / 3 = 1.3e-6; seen 2.7e-6).
    nmse = float(((o - y) ** 2).sum() / (y ** 2).sum())
    print(f"apply T={T}: NMSE {nmse:.2e} against cpu-ref, max |diff| {float((o - y).abs().max()):.2e}")
    assert nmse <= 1e-5, nmse
    assert ((o - y).abs() <= y.abs() * 2 ** -8 + 1e-6).all(), float((o - y).abs().max())
    ex.moe.close()


def reference(cfg, W, x, ids, w):
    with fp4moe.Layer(cfg, W, backend="cpu-ref", max_tokens=x.shape[0]) as ref:
        y = ref.run(x.view(torch.int16).numpy().view(np.uint16), ids.numpy(), w.numpy())
    return torch.from_numpy(np.asarray(y).astype(np.float32))


def test_apply_against_vllms_dequantization():
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    E, H, I, k, T = 8, 256, 128, 2, 37
    L, _, _ = random_layer(E, H, I, 5)
    ex = experts(moe_config(E, k, H, I))
    ex.process_weights_after_loading(L)
    w13, w2 = (dequantize_to_dtype(d, s, g, torch.float32, swizzle=False).double() for d, s, g in
               ((L.w13_weight, L.w13_weight_scale, L.w13_weight_scale_2),
                (L.w2_weight, L.w2_weight_scale, L.w2_weight_scale_2)))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.softmax(torch.randn(T, k, generator=g), -1)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    ex.apply(out, x, None, None, w, ids, MoEActivation.SILU, E, None, None, None, None, None, None, False)
    assert torch.isfinite(out).all()
    ref = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = x[t].double() @ w13[e].T  # gate rows then up rows, as vLLM's w13
            ref[t] += float(w[t, j]) * ((torch.nn.functional.silu(h[:I]) * h[I:]) @ w2[e].T)
    o = out.double()
    nmse = float(((o - ref) ** 2).sum() / (ref ** 2).sum())
    print(f"apply vs vLLM's dequantization, float64: NMSE {nmse:.2e}")
    # The same FP4 values both sides; fp4moe's FP32 sums (and any BF16 rounding of the SwiGLU
    # product before FC2, 2^-9 relative) and the output's BF16 rounding (2^-9) each give about
    # 1.3e-6 of NMSE on these random weights: 1e-5 bounds them (seen 2.8e-6). A layout error
    # in the model gives NMSE of order 1 (tried: gate and up swapped 0.47, nibbles swapped 1.9).
    assert nmse <= 1e-5, nmse
    ex.moe.close()


def test_through_vllms_modular_kernel():
    """vLLM's FusedMoEKernel calls prepare (no quantization: expects_unquantized_inputs), asks
    workspace_shapes, takes the buffers from its workspace manager, calls apply, then its no-op
    finalize; the result is the reference's within test_apply_against_cpu_reference's bound."""
    from vllm.model_executor.layers.fused_moe.prepare_finalize.no_dp_ep import MoEPrepareAndFinalizeNoDPEPModular
    from vllm.v1.worker import workspace

    E, H, I, k, T = 8, 256, 128, 2, 37
    L, cfg, W = random_layer(E, H, I, 7)
    one = torch.ones(E)
    qc = oracle.make_nvfp4_moe_quant_config(oracle.NvFp4MoeBackend.EMULATION, L.w13_weight_scale,
                                            L.w2_weight_scale, L.w13_weight_scale_2, L.w2_weight_scale_2, one, one)
    ex = Fp4moeExperts(moe_config(E, k, H, I), qc)
    ex.process_weights_after_loading(L)
    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(torch.device("cpu"))
    kernel = mk.FusedMoEKernel(MoEPrepareAndFinalizeNoDPEPModular(), ex)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.softmax(torch.randn(T, k, generator=g), -1)
    y = kernel.apply(x, L.w13_weight, L.w2_weight, w, ids, MoEActivation.SILU, E, None, False)
    assert isinstance(y, torch.Tensor) and y.shape == (T, H) and y.dtype == torch.bfloat16
    assert torch.isfinite(y).all()
    r = reference(cfg, W, x, ids, w)
    o = y.float()
    nmse = float(((o - r) ** 2).sum() / (r ** 2).sum())
    assert nmse <= 1e-5, nmse
    assert ((o - r).abs() <= r.abs() * 2 ** -8 + 1e-6).all(), float((o - r).abs().max())
    ex.moe.close()


def test_apply_refuses():
    L, _, _ = random_layer(8, 256, 128, 2)
    ex = experts(moe_config())
    x, out = torch.zeros(2, 256, dtype=torch.bfloat16), torch.zeros(2, 256, dtype=torch.bfloat16)
    ids, w = torch.zeros(2, 2, dtype=torch.int32), torch.full((2, 2), 0.5)
    with pytest.raises(RuntimeError, match="before process_weights_after_loading"):
        ex.apply(out, x, None, None, w, ids, MoEActivation.SILU, 8, None, None, None, None, None, None, False)
    ex.process_weights_after_loading(L)
    with pytest.raises(ValueError, match="expert_map"):
        ex.apply(out, x, None, None, w, ids, MoEActivation.SILU, 8, torch.arange(8), None, None, None, None, None,
                 False)
    with pytest.raises(ValueError, match="apply_router_weight_on_input"):
        ex.apply(out, x, None, None, w, ids, MoEActivation.SILU, 8, None, None, None, None, None, None, True)
    with pytest.raises(ValueError, match="fp4moe.moe: x"):  # fp4moe's own argument check
        ex.apply(out, x.float(), None, None, w, ids, MoEActivation.SILU, 8, None, None, None, None, None, None,
                 False)
    ex.moe.close()
    L.apply_router_weight_on_input = True
    with pytest.raises(ValueError, match="apply_router_weight_on_input"):
        experts(moe_config()).process_weights_after_loading(L)


def test_oracle_emulation_keeps_weights_as_stored():
    """The selection answers EMULATION: its conversion must hand fp4moe the checkpoint's tensors."""
    L, _, _ = random_layer(4, 64, 32, 3)
    a = torch.ones(4)
    r = oracle.convert_to_nvfp4_moe_kernel_format(oracle.NvFp4MoeBackend.EMULATION, L, L.w13_weight,
                                                  L.w13_weight_scale, L.w13_weight_scale_2, a, L.w2_weight,
                                                  L.w2_weight_scale, L.w2_weight_scale_2, a, True)
    for got, want in zip((r[0], r[1], r[2], r[4], r[5], r[6]),
                         (L.w13_weight, L.w13_weight_scale, L.w13_weight_scale_2, L.w2_weight,
                          L.w2_weight_scale, L.w2_weight_scale_2)):
        assert got is want


# ---- refusals ----
def test_refusals_pass_through():
    fmt = mk.FusedMoEActivationFormat.Standard
    sup = Fp4moeExperts.is_supported_config
    ok, why = sup(Fp4moeExperts, moe_config(H=100), kNvfp4Static, kNvfp4Dynamic, fmt)
    ok2, why2 = fp4moe.supports(fp4moe.MoEConfig(n_experts=8, top_k=2, hidden=100, inter=128), "cpu",
                                max_tokens=16)
    assert not ok and not ok2 and why == f"fp4moe: {why2}", (why, why2)
    assert why2.startswith("FM_ERR_")
    ok, why = sup(Fp4moeExperts, moe_config(activation=MoEActivation.GELU), kNvfp4Static, kNvfp4Dynamic, fmt)
    assert not ok and "activation" in why, why
    for wk, ak in ((kMxfp4Static, None), (kNvfp4Static, None)):  # MXFP4; NVFP4 W4A16
        ok, why = sup(Fp4moeExperts, moe_config(), wk, ak, fmt)
        assert not ok and "quantization scheme" in why, why
    ep = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=1, ep_size=2, tp_rank=0, pcp_rank=0, dp_rank=0,
                                ep_rank=0, sp_size=1, use_ep=True, all2all_backend="naive", enable_eplb=False)
    ok, why = sup(Fp4moeExperts, moe_config(parallel=ep), kNvfp4Static, kNvfp4Dynamic, fmt)
    assert not ok and "parallel config" in why, why
    for field, value in (("swiglu_limit", 7.0), ("swiglu_alpha", 1.702), ("swiglu_beta", 1.0), ("has_bias", True)):
        c = moe_config()
        setattr(c, field, value)
        ok, why = sup(Fp4moeExperts, c, kNvfp4Static, kNvfp4Dynamic, fmt)
        assert not ok and why.startswith("fp4moe: ") and field in why, why
    for dt in (torch.float16, torch.float32):
        ok, why = sup(Fp4moeExperts, moe_config(in_dtype=dt), kNvfp4Static, kNvfp4Dynamic, fmt)
        assert not ok and str(dt) in why, why


# ---- the selection ----
def _py(code, env_extra, pythonpath_extra=()):
    env = {k: v for k, v in os.environ.items() if k != "FP4MOE_VLLM"}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath_extra, os.path.join(ROOT, "python"),
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


SELECT = """
import fp4moe_vllm, vllm.model_executor.layers.quantization.modelopt as m
from vllm.model_executor.layers.fused_moe.oracle import nvfp4
fp4moe_vllm.register(); fp4moe_vllm.register()
import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4 as ct
import vllm.model_executor.layers.quantization.mxfp4 as q
from vllm.model_executor.layers.fused_moe.oracle import mxfp4
print("SELECT", m.select_nvfp4_moe_backend is nvfp4.select_nvfp4_moe_backend,
      ct.select_nvfp4_moe_backend is nvfp4.select_nvfp4_moe_backend,
      q.select_mxfp4_moe_backend is mxfp4.select_mxfp4_moe_backend)
"""


@pytest.mark.parametrize("value,vllms", [(None, True), ("0", True), ("", True), ("1", False)])
def test_selection_is_explicit(value, vllms):
    r = _py(SELECT, {} if value is None else {"FP4MOE_VLLM": value})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"SELECT {vllms} {vllms} {vllms}" in r.stdout, r.stdout


def test_selection_bad_value_named():
    r = _py(SELECT, {"FP4MOE_VLLM": "true"})
    assert r.returncode != 0 and "FP4MOE_VLLM: expected '1'" in r.stderr, r.stderr[-2000:]


def test_selection_answer_and_refusal():
    from fp4moe_vllm import selection

    fmt = mk.FusedMoEActivationFormat.Standard
    assert selection.select_nvfp4_moe_backend(moe_config(), kNvfp4Static, kNvfp4Dynamic) == \
        (oracle.NvFp4MoeBackend.EMULATION, Fp4moeExperts)
    _, why = Fp4moeExperts.is_supported_config(Fp4moeExperts, moe_config(H=100), kNvfp4Static, kNvfp4Dynamic, fmt)
    with pytest.raises(ValueError) as e:
        selection.select_nvfp4_moe_backend(moe_config(H=100), kNvfp4Static, kNvfp4Dynamic)
    assert why in str(e.value) and "FP4MOE_VLLM" in str(e.value), str(e.value)


def test_entry_point_through_vllms_loader():
    """pyproject.toml's entry point, as an installed fp4moe's metadata would carry it, found and run
    by vLLM's own load_general_plugins: selection on with FP4MOE_VLLM=1, off without."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"fp4moe": "fp4moe_vllm:register"}
    with tempfile.TemporaryDirectory() as d:
        di = os.path.join(d, "fp4moe-0.1.0.dist-info")
        os.mkdir(di)
        with open(os.path.join(di, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: fp4moe\nVersion: 0.1.0\n")
        with open(os.path.join(di, "entry_points.txt"), "w") as f:
            f.write("[vllm.general_plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
        code = SELECT.replace("fp4moe_vllm.register(); fp4moe_vllm.register()",
                              "from vllm.plugins import load_general_plugins; load_general_plugins()")
        for value, vllms in ((None, True), ("1", False)):
            r = _py(code, {} if value is None else {"FP4MOE_VLLM": value}, (d,))
            assert r.returncode == 0, r.stderr[-3000:]
            assert f"SELECT {vllms} {vllms} {vllms}" in r.stdout, (value, r.stdout, r.stderr[-2000:])


@pytest.mark.parametrize("layout", ["modelopt", "compressed-tensors"])
def test_quant_method_end_to_end(layout):
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.\
        compressed_tensors_moe_w4a4_nvfp4 as ct
    import vllm.model_executor.layers.quantization.modelopt as modelopt
    from vllm.v1.worker import workspace

    from fp4moe_vllm import selection

    E, H, I, k, T = 8, 256, 128, 2, 37
    L0, cfg, W = random_layer(E, H, I, 9)
    originals = [(m, m.select_nvfp4_moe_backend) for m in (modelopt, ct)]
    selection.install()
    try:
        mc = moe_config(E, k, H, I)
        method = (modelopt.ModelOptNvFp4FusedMoE(modelopt.ModelOptNvFp4Config(), mc) if layout == "modelopt"
                  else ct.CompressedTensorsW4A4Nvfp4MoEMethod(mc))
        assert (method.nvfp4_backend, method.experts_cls) == (oracle.NvFp4MoeBackend.EMULATION, Fp4moeExperts)

        class Layer(torch.nn.Module):  # what the method reads of vLLM's RoutedExperts
            apply_router_weight_on_input = False

            def _expert_routing_tables(self):
                return None

        layer, P = Layer(), (lambda t: torch.nn.Parameter(t, requires_grad=False))
        layer.moe_config = mc
        g13 = L0.w13_weight_scale_2[:, None].repeat(1, 2).contiguous()  # [E][gate, up], as loaded
        if layout == "modelopt":
            layer.w13_weight, layer.w2_weight = P(L0.w13_weight), P(L0.w2_weight)
            layer.w13_weight_scale_2, layer.w2_weight_scale_2 = P(g13), P(L0.w2_weight_scale_2)
            layer.w13_input_scale, layer.w2_input_scale = P(torch.ones(E)), P(torch.ones(E))
        else:  # packed values named weight_packed, global scales the reciprocal of ModelOpt's
            layer.w13_weight_packed, layer.w2_weight_packed = P(L0.w13_weight), P(L0.w2_weight)
            layer.w13_weight_global_scale = P(1.0 / g13)
            layer.w2_weight_global_scale = P(1.0 / L0.w2_weight_scale_2)
            layer.w13_input_global_scale, layer.w2_input_global_scale = P(torch.ones(E)), P(torch.ones(E))
        layer.w13_weight_scale, layer.w2_weight_scale = P(L0.w13_weight_scale), P(L0.w2_weight_scale)
        method.process_weights_after_loading(layer)
        ex = method.moe_kernel.impl.fused_experts
        assert isinstance(ex, Fp4moeExperts) and ex.moe is not None
        if not workspace.is_workspace_manager_initialized():
            workspace.init_workspace_manager(torch.device("cpu"))
        g = torch.Generator().manual_seed(13)
        x = torch.randn(T, H, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
        w = torch.softmax(torch.randn(T, k, generator=g), -1)
        y = method.moe_kernel.apply(x, layer.w13_weight, layer.w2_weight, w, ids, MoEActivation.SILU, E, None, False)
        assert torch.isfinite(y).all()
        r, o = reference(cfg, W, x, ids, w), y.float()
        nmse = float(((o - r) ** 2).sum() / (r ** 2).sum())
        print(f"{type(method).__name__} on fp4moe: NMSE {nmse:.2e} against cpu-ref")
        assert nmse <= 1e-5, nmse
        assert ((o - r).abs() <= r.abs() * 2 ** -8 + 1e-6).all(), float((o - r).abs().max())
        ex.moe.close()
    finally:
        for m, f in originals:
            m.select_nvfp4_moe_backend = f
