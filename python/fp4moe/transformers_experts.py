"""fp4moe as a Hugging Face transformers experts implementation (docs/engines.md).

transformers 5.x dispatches the forward of every experts module whose class carries
its `@use_experts_implementation` decorator (Qwen2/3-MoE, Mixtral, DeepSeek-V3,
GLM-4-MoE, ...) through `ExpertsInterface`, by the name in
`config._experts_implementation`; the MoE block keeps its own router and calls
`experts(hidden_states, top_k_index, top_k_weights)`. This module registers "fp4moe"
there, so nothing of transformers is patched:

    from fp4moe import transformers_experts as fx
    fx.quantize_experts(model)       # every experts module: its weights quantized to NVFP4 by
                                     # fp4moe's quantizer into an fp4moe layer; the BF16 ones freed
    model.generate(...)              # the experts run in fp4moe, with transformers' routing

`quantize_experts` registers the name and switches the model to it; `register()` alone
is for a model whose modules already hold a layer (`attach`). A module holds its layer
in `module.fp4moe` (a torch_ops.MoE, external routing: transformers' router picks the
experts and their weights), so the experts' weights stay in FP4 in memory (the layer's
own copy: packed codes and block scales as given on the CPU backends, prepacked FP4 on the
device for cuda; quantize_experts also returns the QTensors it made, for the caller to keep
or drop); the module's `gate_up_proj` / `down_proj` (and biases) become empty (a model so converted is for inference: save the FP4 weights, not its
state_dict). Layers run on the model's device ("cpu": fp4moe's CPU backend; "cuda").

Tested with transformers 5.17.0 and torch 2.14.0 (TESTED; scripts/deps.sh --engines
installs them). Two experts layouts are taken: transformers' default (gate then up rows
concatenated, [E][N][K], no bias, SiLU: Qwen, Mixtral, DeepSeek, GLM) and gpt-oss's
(transposed, gate and up interleaved, biases, the clamped SwiGLU: fp4moe's swiglu-gptoss,
which the CPU and cuda backends run); another is refused naming the module and what differs.
"""

import re

import numpy as np
import torch

from . import engines
from .format import quantize
from .layer import MoEConfig, MoEWeights
from .torch_ops import MoE

NAME = "fp4moe"
TESTED = {"transformers": "5.17.0", "torch": "2.14.0"}


def register():
    """Add "fp4moe" to transformers' ExpertsInterface (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts of one MoE block through the module's fp4moe layer: hidden_states [T][hidden]
    in the model's dtype, top_k_index [T][top_k] (transformers' int64 ids), top_k_weights
    [T][top_k]; returns [T][hidden] in hidden_states' dtype. fp4moe takes BF16 activations:
    a float32 model's hidden states are rounded to BF16 here (the layer's output is float32
    for a float32 model, BF16 for a BF16 one). Batches above the layer's max_tokens run in
    chunks of it."""
    moe = getattr(self, "fp4moe", None)
    if moe is None:
        raise RuntimeError(f"{type(self).__name__}: experts_implementation={NAME!r} but this module holds no fp4moe "
                           "layer: convert the model with fp4moe.transformers_experts.quantize_experts (or attach)")
    T = hidden_states.shape[0]
    x = hidden_states.to(torch.bfloat16).contiguous()
    ids = top_k_index.to(torch.int32).contiguous()
    w = top_k_weights.to(torch.float32).contiguous()
    out = torch.empty((T, moe.hidden), dtype=moe.out_dtype, device=hidden_states.device)
    step = moe.max_tokens
    for s in range(0, T, step):
        moe(x[s:s + step], ids[s:s + step], w[s:s + step], out=out[s:s + step])
    return out.to(hidden_states.dtype)


def experts_modules(model):
    """[(layer index or None, name, module)] of the experts modules transformers dispatches
    by experts_implementation (its decorator sets `is_concatenated` on them)."""
    found = []
    for name, m in model.named_modules():
        if hasattr(m, "is_concatenated") and hasattr(m, "gate_up_proj") and hasattr(m, "down_proj"):
            li = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
            found.append((int(li.group(1)) if li else None, name, m))
    return found


GPTOSS_ALPHA = 1.702  # fp4moe's swiglu-gptoss: h = (clamp(u) + 1) * g' * sigmoid(1.702 g')


def _layout(name, m):
    """"swiglu" (transformers' default layout: gate rows then up rows, [E][N][K], no bias, SiLU)
    or "gptoss" (gpt-oss: [E][K][N] with gate and up columns interleaved, biases, the clamped
    SwiGLU of alpha 1.702 and limit m.limit); else ValueError naming the module and what differs."""
    from transformers.integrations import moe as tmoe

    if (not m.is_concatenated and m.is_transposed and m.has_bias and hasattr(m, "limit")
            and getattr(m, "alpha", None) == GPTOSS_ALPHA and hasattr(m, "gate_up_proj_bias")):
        return "gptoss"
    why = []
    if not m.is_concatenated:
        why.append("gate and up interleaved")
    if m.is_transposed:
        why.append("weights transposed")
    if m.has_bias:
        why.append("expert biases")
    if not getattr(m, "has_gate", True):
        why.append("no gate")
    act = type(getattr(m, "act_fn", None)).__name__
    if act not in ("SiLU", "SiLUActivation"):
        why.append(f"activation {act} (fp4moe's is SwiGLU: silu(gate) * up)")
    if getattr(type(m), "_apply_gate", None) is not getattr(tmoe, "_default_apply_gate", None):
        why.append("its own _apply_gate")
    if m.gate_up_proj.dim() != 3 or m.down_proj.dim() != 3:
        why.append("weights not stacked [E][N][K]")
    if why:
        raise ValueError(f"{name} ({type(m).__name__}): not an experts layout fp4moe takes: {', '.join(why)} "
                         "(taken: transformers' default SwiGLU layout, and gpt-oss's)")
    return "swiglu"


def _float_experts(m, layout):
    """w13 [E][2*inter][hidden] (gate rows, then up rows), w2 [E][hidden][inter], float32, and
    the biases in the same row order (or None), from the module's parameters."""
    w13 = m.gate_up_proj.detach().float().cpu().numpy()
    w2 = m.down_proj.detach().float().cpu().numpy()
    if layout == "swiglu":
        return w13, w2, None, None
    w13 = w13.transpose(0, 2, 1)  # [E][2I][H], rows gate0, up0, gate1, ...
    w13 = np.concatenate([w13[:, 0::2], w13[:, 1::2]], axis=1)
    b13 = m.gate_up_proj_bias.detach().float().cpu().numpy()
    b13 = np.concatenate([b13[:, 0::2], b13[:, 1::2]], axis=1)
    return w13, w2.transpose(0, 2, 1), b13, m.down_proj_bias.detach().float().cpu().numpy()


def _top_k(m):
    c = m.config
    for attr in ("num_experts_per_tok", "moe_topk", "top_k"):
        v = getattr(c, attr, None)
        if isinstance(v, int):
            return v
    raise ValueError(f"{type(m).__name__}: its config names no experts per token (num_experts_per_tok)")


def attach(module, cfg, weights, *, device=None, max_tokens=256, out_dtype=None, backend=None):
    """Give one experts module an fp4moe layer of cfg / weights (fp4moe.MoEWeights, FP4),
    free its float weights. device / out_dtype default to the module's weights' device and
    (float32 or BF16) dtype."""
    dev = torch.device(device) if device is not None else module.gate_up_proj.device
    dt = module.gate_up_proj.dtype
    if out_dtype is None:
        out_dtype = torch.float32 if dt == torch.float32 else torch.bfloat16
    bias = isinstance(weights, MoEWeights) and weights.w13_bias is not None
    ok, why = engines.supports(cfg, dev if dev.type == "cuda" else (backend or "cpu"), max_tokens=max_tokens,
                               expert_bias=bias)
    if not ok:
        raise ValueError(f"{type(module).__name__}: fp4moe cannot run these experts here: {why}")
    module.fp4moe = MoE(cfg, weights, device=dev, max_tokens=max_tokens, out_dtype=out_dtype, backend=backend)
    for p in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):  # the layer holds them now
        if hasattr(module, p):
            setattr(module, p, torch.nn.Parameter(torch.empty(0, dtype=dt, device=dev), requires_grad=False))
    return module.fp4moe


def quantize_experts(model, fmt="nvfp4", *, device=None, max_tokens=256, backend=None):
    """Quantize every experts module's weights to fmt ("nvfp4" or "mxfp4") with fp4moe's
    quantizer (one global scale per expert matrix, fm_quantize), move them into fp4moe
    layers (attach), register "fp4moe" and switch the model to it. Returns
    {module name: (QTensor list w13, QTensor list w2)}: the FP4 weights as quantized, so a
    caller can build the dequantized reference (fp4moe.dequantize) or save them."""
    mods = experts_modules(model)
    if not mods:
        raise ValueError(f"{type(model).__name__}: no experts module dispatched by experts_implementation "
                         "(transformers' @use_experts_implementation) was found")
    layouts = [_layout(name, m) for _, name, m in mods]  # every module checked before any is converted
    held = {}
    for (_, name, m), layout in zip(mods, layouts):
        w13, w2, b13, b2 = _float_experts(m, layout)
        E, two_i, H = w13.shape
        act = dict(activation="swiglu-gptoss", swiglu_limit=float(m.limit)) if layout == "gptoss" else {}
        # routing is transformers' (external): the layer's score function and router never run
        cfg = MoEConfig(n_experts=E, top_k=_top_k(m), hidden=H, inter=two_i // 2, score="softmax", wfmt=fmt, **act)
        q13 = [quantize(np.ascontiguousarray(w13[e]), fmt) for e in range(E)]
        q2 = [quantize(np.ascontiguousarray(w2[e]), fmt) for e in range(E)]
        W = MoEWeights.from_qtensors(np.zeros((E, H), np.float32), q13, q2)
        if b13 is not None:
            W.w13_bias, W.w2_bias = np.ascontiguousarray(b13), np.ascontiguousarray(b2)
        attach(m, cfg, W, device=device, max_tokens=max_tokens, backend=backend)
        held[name] = (q13, q2)
    register()
    model.set_experts_implementation(NAME)
    return held
