"""The explicit selection (FP4MOE_VLLM=1).

NVFP4: vLLM's ModelOpt and compressed-tensors W4A4 NVFP4 MoE methods ask
select_nvfp4_moe_backend for (backend, experts class); installed, this answers
(NvFp4MoeBackend.EMULATION, Fp4moeExperts) or raises with fp4moe's reason.

EMULATION is the backend whose weight conversion (oracle/nvfp4.py,
convert_to_nvfp4_moe_kernel_format) keeps the packed weights and the block scales as the
checkpoint stores them (no swizzle, no shuffle, no repack), which is what fp4moe's loader reads,
and whose quant config marks the scales unswizzled; its kernel class is replaced by ours. Both
methods leave the layer's tensors under ModelOpt's names after the conversion (compressed-tensors'
weight_packed renamed weight, its global scales inverted into weight_scale_2) and then call the
experts' process_weights_after_loading.

MXFP4: vLLM's gpt-oss MXFP4 MoE method (quantization/mxfp4.py, GptOssMxfp4MoEMethod, the one
caller of select_mxfp4_moe_backend in that module) gets (Mxfp4MoeBackend.EMULATION,
Fp4moeMxfp4Experts) or a refusal with fp4moe's reason. EMULATION is, again, the backend whose
conversion (oracle/mxfp4.py, convert_gpt_oss_weight_to_mxfp4_moe_kernel_format) hands the
weights, E8M0 scales and biases on as loaded (the other backends swizzle them for triton_kernels,
shuffle them for TRT-LLM, de-interleave and swap gate/up for CUTLASS, repack them for Marlin,
all before the experts class sees the layer), and whose size round-up (to the 32-element MX
block) leaves gpt-oss's shapes alone. The other MXFP4 methods (Mxfp4MoEMethod / DeepSeek-V4,
compressed-tensors W4A4 MXFP4, Quark, INC, online MXFP4) keep vLLM's selection: see
docs/engines.md."""

import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4 as _ct  # noqa: E501
import vllm.model_executor.layers.quantization.modelopt as _modelopt
import vllm.model_executor.layers.quantization.mxfp4 as _mxfp4
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static

from .experts import Fp4moeExperts, Fp4moeMxfp4Experts


def _format(config):
    return (mk.FusedMoEActivationFormat.BatchedExperts if config.moe_parallel_config.use_batched_activation_format
            else mk.FusedMoEActivationFormat.Standard)


def select_nvfp4_moe_backend(config, weight_key, activation_key):
    ok, reason = Fp4moeExperts.is_supported_config(Fp4moeExperts, config, weight_key, activation_key, _format(config))
    if not ok:
        raise ValueError(f"FP4MOE_VLLM=1 selects fp4moe for the NVFP4 MoE experts, and it refuses this layer: "
                         f"{reason}. Unset FP4MOE_VLLM to let vLLM pick its own kernel.")
    return NvFp4MoeBackend.EMULATION, Fp4moeExperts


def select_mxfp4_moe_backend(config, activation_key=None):
    """vLLM's select_mxfp4_moe_backend(config, activation_key=None), answered by fp4moe. An
    activation_key (a checkpoint declaring quantized activations) is refused by
    Fp4moeMxfp4Experts' quantization scheme: fp4moe runs MXFP4 experts on BF16 activations."""
    cls = Fp4moeMxfp4Experts
    ok, reason = cls.is_supported_config(cls, config, kMxfp4Static, activation_key, _format(config))
    if not ok:
        raise ValueError(f"FP4MOE_VLLM=1 selects fp4moe for the MXFP4 MoE experts, and it refuses this layer: "
                         f"{reason}. Unset FP4MOE_VLLM to let vLLM pick its own kernel.")
    return Mxfp4MoeBackend.EMULATION, cls


# (module, the name its methods call, ours)
_HOOKS = ((_modelopt, "select_nvfp4_moe_backend", select_nvfp4_moe_backend),
          (_ct, "select_nvfp4_moe_backend", select_nvfp4_moe_backend),
          (_mxfp4, "select_mxfp4_moe_backend", select_mxfp4_moe_backend))


def install():
    """Point the methods' names at our selectors; twice is harmless."""
    for m, name, ours in _HOOKS:
        if getattr(m, name) is not ours:
            setattr(m, f"_fp4moe_vllm_original_{name}", getattr(m, name))
            setattr(m, name, ours)


def installed():
    return all(getattr(m, name) is ours for m, name, ours in _HOOKS)
