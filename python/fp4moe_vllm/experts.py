"""Fp4moeExperts (NVFP4) and Fp4moeMxfp4Experts (gpt-oss MXFP4): vLLM's modular MoE experts
interface (FusedMoEExpertsModular, vLLM 0.33.0) on fp4moe.torch_ops.MoE.

vLLM hands apply() the activations (BF16: expects_unquantized_inputs, so its prepare step does
not quantize them), its own top-k ids and weights, and an output [M][K]; fp4moe computes the
weighted sum over the top-k itself, so the finalize step is vLLM's no-op. The fp4moe layer is
made once, in process_weights_after_loading, from the tensors vLLM's ModelOpt NVFP4 method leaves
on the layer when its oracle's conversion keeps them as the checkpoint stores them (packed E2M1
uint8 [E][2*inter][hidden/2], E4M3 block scales row-major, float32 global scales): the C loader
reads them as it reads a checkpoint. Fp4moeMxfp4Experts does the same for the tensors vLLM's
gpt-oss MXFP4 method (GptOssMxfp4MoEMethod) leaves when its oracle answers EMULATION: the
checkpoint's bytes (rows of w13 interleaving gate and up), read by fp4moe's gpt-oss loader."""

import torch

import fp4moe
from fp4moe.torch_ops import MoE

import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP
from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static, kNvfp4Dynamic, kNvfp4Static
from vllm.platforms import current_platform


def fp4moe_config(moe_config, wfmt="nvfp4", swiglu_limit=None):
    """The fp4moe.MoEConfig of a vLLM FusedMoEConfig. The routing fields are fp4moe's defaults
    (gpt-oss's softmax-topk for MXFP4): vLLM routes and passes ids and weights, so the layer's
    own router is never run. inter is the tensor-parallel partition's (the layer then returns the
    partition's partial sum, which vLLM all-reduces as it does for its own kernels). MXFP4 is
    gpt-oss's experts: activation "swiglu-gptoss" with the clamp swiglu_limit."""
    if wfmt == "mxfp4":
        return fp4moe.MoEConfig(n_experts=moe_config.num_experts, top_k=moe_config.experts_per_token,
                                hidden=moe_config.hidden_dim, inter=moe_config.intermediate_size_per_partition,
                                score="softmax-topk", wfmt="mxfp4", activation="swiglu-gptoss",
                                swiglu_limit=swiglu_limit)
    return fp4moe.MoEConfig(n_experts=moe_config.num_experts, top_k=moe_config.experts_per_token,
                            hidden=moe_config.hidden_dim, inter=moe_config.intermediate_size_per_partition,
                            wfmt="nvfp4")


def fp4moe_device():
    """fp4moe's name of the device vLLM runs on: the current CUDA ordinal, or the CPU backend."""
    if current_platform.is_cuda():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


# fp4moe takes BF16 activations, and vLLM's output has the activations' dtype
_OUT_DTYPES = {torch.bfloat16: "bf16"}


def fp4moe_max_tokens(moe_config):
    """Tokens per fp4moe call: vLLM's max_num_tokens, capped where the cuda backend's grid ends
    (max_tokens x top_k <= 65,535); apply() runs larger batches in chunks of it."""
    return max(1, min(moe_config.max_num_tokens, 65535 // max(1, moe_config.experts_per_token)))


class Fp4moeExperts(mk.FusedMoEExpertsModular):
    """NVFP4 experts (SiLU-gated, gate rows then up rows) run by one fp4moe layer per vLLM MoE layer."""

    def __init__(self, moe_config, quant_config, max_num_tokens=None, num_dispatchers=None):
        super().__init__(moe_config, quant_config, max_num_tokens, num_dispatchers)
        self.moe = None  # fp4moe.torch_ops.MoE, made by process_weights_after_loading

    # ---- what the oracle asks (is_supported_config) ----
    @staticmethod
    def activation_format():
        return mk.FusedMoEActivationFormat.Standard

    @staticmethod
    def _supports_current_device():
        if current_platform.is_cuda():
            return fp4moe.backend_available("cuda")
        # vLLM's CPU platform, or none detected (a CUDA wheel on a machine without a GPU, as
        # in the tests): tensors are on the CPU, which fp4moe's CPU backends run. Other
        # accelerators (ROCm, XPU, ...) hold tensors fp4moe cannot read.
        return current_platform.is_cpu() or current_platform.is_unspecified()

    @staticmethod
    def _supports_no_act_and_mul():
        return False

    @staticmethod
    def _supports_quant_scheme(weight_key, activation_key):
        # W4A4 checkpoints' activations are taken as BF16 (fp4moe's W4A16 path): the input
        # scales vLLM loads are not applied. W4A16 checkpoints (activation_key None) are refused:
        # the EMULATION conversion the selection names raises on their absent input scales.
        return weight_key == kNvfp4Static and activation_key == kNvfp4Dynamic

    @staticmethod
    def _supports_activation(activation):
        return activation == MoEActivation.SILU

    @staticmethod
    def _supports_parallel_config(moe_parallel_config):
        # fp4moe shards are contiguous expert ranges; vLLM's expert_map may place experts
        # otherwise (round robin, EPLB), so expert parallelism is refused until it is mapped.
        p = moe_parallel_config
        return not p.use_ep and p.ep_size == 1 and not p.use_all2all_kernels and not p.enable_eplb

    @staticmethod
    def is_supported_config(cls, moe_config, weight_key, activation_key, activation_format):
        ok, reason = mk.FusedMoEExperts.is_supported_config(cls, moe_config, weight_key, activation_key,
                                                            activation_format)
        if not ok:
            return ok, reason
        # The oracle filters clamped-SwiGLU models by a list of its own backends, which the
        # selection does not pass through: the experts refuse what they would silently drop.
        for f in ("swiglu_limit", "swiglu_alpha", "swiglu_beta"):
            if getattr(moe_config, f, None) is not None:
                return False, f"fp4moe: {f}={getattr(moe_config, f)} (fp4moe's NVFP4 experts run plain SwiGLU)"
        if moe_config.has_bias:
            return False, "fp4moe: expert biases (has_bias) with NVFP4 SwiGLU experts"
        if moe_config.in_dtype not in _OUT_DTYPES:
            return False, f"fp4moe: activations {moe_config.in_dtype} (fp4moe takes torch.bfloat16)"
        ok, why = fp4moe.supports(fp4moe_config(moe_config), fp4moe_device(),
                                  max_tokens=fp4moe_max_tokens(moe_config), out_dtype=_OUT_DTYPES[moe_config.in_dtype])
        return (True, None) if ok else (False, f"fp4moe: {why}")

    # ---- weights ----
    def process_weights_after_loading(self, layer):
        """Make the fp4moe layer from the layer's NVFP4 tensors as vLLM's ModelOpt method left them.
        w13_weight_scale_2 is [E] (vLLM keeps the gate's global and warns when up's differs) or
        [E][2] (gate, up: MoE.from_modelopt takes both as they are, on every backend)."""
        if getattr(layer, "apply_router_weight_on_input", False):
            raise ValueError("fp4moe: apply_router_weight_on_input is not supported (fp4moe weights the "
                             "experts' outputs, not their inputs)")
        dev = layer.w13_weight.device
        cfg = fp4moe_config(self.moe_config)
        E = layer.w13_weight.shape[0]
        if E != self.moe_config.num_local_experts or E != cfg.n_experts:
            raise ValueError(f"fp4moe: layer.w13_weight holds {E} experts, the MoE config {cfg.n_experts} "
                             f"({self.moe_config.num_local_experts} local): expert parallelism is not supported")
        router = torch.zeros(cfg.n_experts, cfg.hidden, dtype=torch.float32)  # never run: vLLM routes
        if self.moe is not None:
            self.moe.close()
        self.moe = MoE.from_modelopt(
            cfg, router, layer.w13_weight, layer.w13_weight_scale, layer.w13_weight_scale_2,
            layer.w2_weight, layer.w2_weight_scale, layer.w2_weight_scale_2,
            device=dev if dev.type == "cuda" else "cpu", max_tokens=fp4moe_max_tokens(self.moe_config),
            out_dtype=self.moe_config.in_dtype)

    def workspace_bytes(self):
        """fp4moe's workspace query (fm_layer_workspace_size): 0 for the layers the Python
        package makes, which own their scratch."""
        import ctypes

        n = ctypes.c_size_t(0)
        with self.moe.layer._hd as h:
            s = fp4moe._lib.lib.fm_layer_workspace_size(h, ctypes.byref(n))
        if s:
            raise RuntimeError(f"fp4moe: fm_layer_workspace_size: {fp4moe._lib.status_name(s)}")
        return n.value

    # ---- the run ----
    @property
    def expects_unquantized_inputs(self):
        return True

    def supports_expert_map(self):
        return False

    def finalize_weight_and_reduce_impl(self):
        return TopKWeightAndReduceNoOP()

    def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                         activation):
        # The fp4moe layer owns its scratch (workspace_bytes() == 0): vLLM allocates nothing for it.
        return (0,), (0,), (M, K)

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        if activation != MoEActivation.SILU:
            raise ValueError(f"fp4moe: activation: {activation} (fp4moe runs SiLU-gated experts)")
        return self._run(output, hidden_states, topk_weights, topk_ids, expert_map, apply_router_weight_on_input)

    def _run(self, output, hidden_states, topk_weights, topk_ids, expert_map, apply_router_weight_on_input):
        """The fp4moe op on vLLM's tensors, in chunks of max_tokens, into output."""
        if self.moe is None:
            raise RuntimeError("fp4moe: apply() before process_weights_after_loading made the layer")
        if expert_map is not None:
            raise ValueError("fp4moe: expert_map: expert parallelism is not supported")
        if apply_router_weight_on_input:
            raise ValueError("fp4moe: apply_router_weight_on_input: not supported")
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
        w = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
        T, step = hidden_states.shape[0], self.moe.max_tokens
        for t in range(0, T, step):
            e = min(T, t + step)
            self.moe(hidden_states[t:e], ids[t:e], w[t:e], out=output[t:e])
        return None


# gpt-oss's clamped SwiGLU as fp4moe implements it ("swiglu-gptoss", include/fp4moe/moe.h):
# g' = min(g, L), u' = clamp(u, -L, L), h = (u' + 1) * g' * sigmoid(1.702 g'). vLLM names the
# 1.702 alpha and the + 1 beta (gemm1_alpha / gemm1_beta on the quant config, TRT-LLM's
# convention, which GptOssMxfp4MoEMethod sets to 1.702 and 1.0; swiglu_alpha / swiglu_beta on
# the MoE config) and the clamp L gemm1_clamp_limit / swiglu_limit; unset, SWIGLUOAI is vLLM's
# swigluoai_and_mul: alpha 1.702, + 1, limit 7.0.
GPTOSS_ALPHA, GPTOSS_BETA, GPTOSS_LIMIT = 1.702, 1.0, 7.0


def gptoss_activation(moe_config, quant_config=None):
    """(swiglu_limit, None) for the clamped SwiGLU the layer asks for, or (None, reason) when it
    is not the one fp4moe implements. The quant config's gemm1_* values override the MoE
    config's swiglu_*, as vLLM's ApplyMoEActivationConfig.from_configs reads them."""
    def pick(qname, mname):
        v = getattr(quant_config, qname, None) if quant_config is not None else None
        return (qname, v) if v is not None else (mname, getattr(moe_config, mname, None))

    name, alpha = pick("gemm1_alpha", "swiglu_alpha")
    if alpha is not None and abs(float(alpha) - GPTOSS_ALPHA) > 1e-6:
        return None, (f"fp4moe: {name}={alpha} (fp4moe's gpt-oss SwiGLU has alpha {GPTOSS_ALPHA}: "
                      f"(u' + 1) * g' * sigmoid(1.702 g'))")
    name, beta = pick("gemm1_beta", "swiglu_beta")
    if beta is not None and float(beta) != GPTOSS_BETA:
        return None, (f"fp4moe: {name}={beta} (fp4moe's gpt-oss SwiGLU adds {GPTOSS_BETA} to the clamped up "
                      f"projection: (u' + 1))")
    _, limit = pick("gemm1_clamp_limit", "swiglu_limit")
    return (GPTOSS_LIMIT if limit is None else float(limit)), None


def _u8(t):
    """E8M0 scales as their uint8 codes (vLLM's MXFP4 methods keep uint8; a float8_e8m0fnu view
    is the same bytes)."""
    return t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t


class Fp4moeMxfp4Experts(Fp4moeExperts):
    """gpt-oss MXFP4 experts (W4A16: BF16 activations; clamped SwiGLU with expert biases, w13 rows
    interleaving gate and up as the checkpoint stores them) run by one fp4moe layer per vLLM MoE
    layer, built by fp4moe's gpt-oss loader (MoE.from_gpt_oss)."""

    @staticmethod
    def _supports_quant_scheme(weight_key, activation_key):
        # MXFP4 weights, activations not quantized (vLLM's gpt-oss checkpoints are W4A16)
        return weight_key == kMxfp4Static and activation_key is None

    @staticmethod
    def _supports_activation(activation):
        # SWIGLUOAI: gate and up interleaved in w13's rows, as gpt-oss stores them and vLLM's
        # gpt-oss loader keeps them. SWIGLUOAI_UNINTERLEAVE (gate rows then up rows) is not taken:
        # no MXFP4 method that the selection hooks loads that layout.
        return activation == MoEActivation.SWIGLUOAI

    @staticmethod
    def is_supported_config(cls, moe_config, weight_key, activation_key, activation_format):
        ok, reason = mk.FusedMoEExperts.is_supported_config(cls, moe_config, weight_key, activation_key,
                                                            activation_format)
        if not ok:
            return ok, reason
        limit, why = gptoss_activation(moe_config)
        if why:
            return False, why
        if moe_config.in_dtype not in _OUT_DTYPES:
            return False, f"fp4moe: activations {moe_config.in_dtype} (fp4moe takes torch.bfloat16)"
        ok, why = fp4moe.supports(fp4moe_config(moe_config, "mxfp4", limit), fp4moe_device(),
                                  max_tokens=fp4moe_max_tokens(moe_config),
                                  out_dtype=_OUT_DTYPES[moe_config.in_dtype], expert_bias=bool(moe_config.has_bias))
        return (True, None) if ok else (False, f"fp4moe: {why}")

    def process_weights_after_loading(self, layer):
        """Make the fp4moe layer from the layer's gpt-oss MXFP4 tensors as vLLM's method leaves them
        for EMULATION (the checkpoint's bytes): w13_weight uint8 [E][2*inter][hidden/2] (row 2i gate
        i, 2i+1 up i), w13_weight_scale uint8 E8M0 [E][2*inter][hidden/32], w13_bias [E][2*inter]
        (interleaved too), w2_weight [E][hidden][inter/2], w2_weight_scale [E][hidden][inter/32],
        w2_bias [E][hidden] (vLLM's loader zeroes it on tensor-parallel ranks other than 0, so the
        all-reduced partial sums add it once). The weights are viewed as the checkpoint's
        *_blocks [E][N][K/32][16] (no copy on the host) and de-interleaved by fp4moe's gpt-oss loader;
        the biases are loaded as stored (BF16), nothing is re-quantized."""
        if getattr(layer, "apply_router_weight_on_input", False):
            raise ValueError("fp4moe: apply_router_weight_on_input is not supported (fp4moe weights the "
                             "experts' outputs, not their inputs)")
        limit, why = gptoss_activation(self.moe_config, self.quant_config)
        if why:
            raise ValueError(why)
        cfg = fp4moe_config(self.moe_config, "mxfp4", limit)
        w13, w2 = layer.w13_weight, layer.w2_weight
        s13, s2 = _u8(layer.w13_weight_scale), _u8(layer.w2_weight_scale)
        E, H, I = w13.shape[0], cfg.hidden, cfg.inter
        if E != self.moe_config.num_local_experts or E != cfg.n_experts:
            raise ValueError(f"fp4moe: layer.w13_weight holds {E} experts, the MoE config {cfg.n_experts} "
                             f"({self.moe_config.num_local_experts} local): expert parallelism is not supported")
        for name, t, shape in (("w13_weight", w13, (E, 2 * I, H // 2)), ("w13_weight_scale", s13, (E, 2 * I, H // 32)),
                               ("w2_weight", w2, (E, H, I // 2)), ("w2_weight_scale", s2, (E, H, I // 32))):
            if tuple(t.shape) != shape or t.dtype != torch.uint8:
                raise ValueError(f"fp4moe: layer.{name} is {t.dtype} {list(t.shape)}, expected torch.uint8 "
                                 f"{list(shape)} (vLLM's gpt-oss MXFP4 layout as EMULATION keeps it)")
        dev = w13.device
        router = torch.zeros(cfg.n_experts, H, dtype=torch.float32)  # never run: vLLM routes
        if self.moe is not None:
            self.moe.close()
        self.moe = MoE.from_gpt_oss(
            cfg, router, w13.reshape(E, 2 * I, H // 32, 16), s13, w2.reshape(E, H, I // 32, 16), s2,
            gate_up_proj_bias=getattr(layer, "w13_bias", None), down_proj_bias=getattr(layer, "w2_bias", None),
            device=dev if dev.type == "cuda" else "cpu", max_tokens=fp4moe_max_tokens(self.moe_config),
            out_dtype=self.moe_config.in_dtype)

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        if activation != MoEActivation.SWIGLUOAI:
            raise ValueError(f"fp4moe: activation: {activation} (fp4moe runs gpt-oss's MXFP4 experts: swigluoai)")
        return self._run(output, hidden_states, topk_weights, topk_ids, expert_map, apply_router_weight_on_input)
