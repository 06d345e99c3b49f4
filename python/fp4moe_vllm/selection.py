"""The explicit selection (FP4MOE_VLLM=1): vLLM's ModelOpt and compressed-tensors W4A4 NVFP4
MoE methods ask select_nvfp4_moe_backend for (backend, experts class); installed, this answers
(NvFp4MoeBackend.EMULATION, Fp4moeExperts) or raises with fp4moe's reason.

EMULATION is the backend whose weight conversion (oracle/nvfp4.py,
convert_to_nvfp4_moe_kernel_format) keeps the packed weights and the block scales as the
checkpoint stores them (no swizzle, no shuffle, no repack), which is what fp4moe's loader reads,
and whose quant config marks the scales unswizzled; its kernel class is replaced by ours. Both
methods leave the layer's tensors under ModelOpt's names after the conversion (compressed-tensors'
weight_packed renamed weight, its global scales inverted into weight_scale_2) and then call the
experts' process_weights_after_loading."""

import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4 as _ct  # noqa: E501
import vllm.model_executor.layers.quantization.modelopt as _modelopt
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

from .experts import Fp4moeExperts

_MODULES = (_modelopt, _ct)


def select_nvfp4_moe_backend(config, weight_key, activation_key):
    fmt = (mk.FusedMoEActivationFormat.BatchedExperts if config.moe_parallel_config.use_batched_activation_format
           else mk.FusedMoEActivationFormat.Standard)
    ok, reason = Fp4moeExperts.is_supported_config(Fp4moeExperts, config, weight_key, activation_key, fmt)
    if not ok:
        raise ValueError(f"FP4MOE_VLLM=1 selects fp4moe for the NVFP4 MoE experts, and it refuses this layer: "
                         f"{reason}. Unset FP4MOE_VLLM to let vLLM pick its own kernel.")
    return NvFp4MoeBackend.EMULATION, Fp4moeExperts


def install():
    """Point the methods' name at our selector; twice is harmless."""
    for m in _MODULES:
        if m.select_nvfp4_moe_backend is not select_nvfp4_moe_backend:
            m._fp4moe_vllm_original_select = m.select_nvfp4_moe_backend
            m.select_nvfp4_moe_backend = select_nvfp4_moe_backend


def installed():
    return all(m.select_nvfp4_moe_backend is select_nvfp4_moe_backend for m in _MODULES)
