"""fp4moe as a vLLM NVFP4 / MXFP4 (gpt-oss) MoE experts backend (docs/engines.md, "vLLM").

vLLM (0.33.0, scripts/requirements-vllm.txt) calls register() in every process through the
`vllm.general_plugins` entry point (pyproject.toml). register() changes nothing unless
FP4MOE_VLLM=1 is set: vLLM's --moe-backend is a closed Literal and its NVFP4 oracle a closed
enum, so a plugin cannot add a name there; an environment variable is the explicit setting,
and without it vLLM picks its own kernels exactly as if the plugin were absent.

With FP4MOE_VLLM=1, ModelOpt and compressed-tensors W4A4 NVFP4 MoE layers select fp4moe_vllm.experts.Fp4moeExperts (a
FusedMoEExpertsModular), and gpt-oss MXFP4 MoE layers (GptOssMxfp4MoEMethod)
fp4moe_vllm.experts.Fp4moeMxfp4Experts, or fail at load with fp4moe's reason (fp4moe.supports):
an explicit choice never falls back silently to another kernel."""

import os

ENV = "FP4MOE_VLLM"


def enabled():
    """True when FP4MOE_VLLM selects fp4moe; a value other than unset, "", "0" or "1" raises,
    so a typo (e.g. "true") is not read as off."""
    v = os.environ.get(ENV, "")
    if v not in ("", "0", "1"):
        raise ValueError(f"{ENV}: expected '1' (fp4moe runs the NVFP4 / gpt-oss MXFP4 MoE experts) or '0' / unset "
                         f"(vLLM's own kernels), got {v!r}")
    return v == "1"


def register():
    """The vllm.general_plugins entry point; vLLM may call it several times per process."""
    if not enabled():
        return
    from . import selection

    selection.install()
