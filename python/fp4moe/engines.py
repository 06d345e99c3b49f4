"""What an engine asks before it picks fp4moe for a MoE layer (docs/engines.md).

supports(cfg, device) answers from the library's fm_layer_supports: the checks
fm_layer_create_desc makes for that configuration on that backend and device,
before any weight exists. So an engine can fall back to its own kernel with the
library's reason instead of failing at load time."""

import ctypes as C

from . import _lib
from ._args import as_choice, as_int
from ._lib import lib
from .layer import BACKENDS, OUT_DTYPES, MoEConfig, _open_device

# fm_layer_supports's feature bits (include/fp4moe/layer.h, FM_FEATURE_*)
FEATURE_EXPERT_BIAS = 0x1
FEATURE_ROUTER_BIAS = 0x2
FEATURE_A_SCALE = 0x4


def _backend_and_ordinal(device):
    """("cpu" | "cpu-ref" | "cuda" | "auto", CUDA ordinal or None) from a device: a backend
    name, "cuda:N", an int ordinal, or a torch.device (read by its type and index)."""
    if hasattr(device, "type") and hasattr(device, "index") and not isinstance(device, str):
        device = device.type if device.index is None else f"{device.type}:{device.index}"
    if isinstance(device, str):
        if device in BACKENDS:
            return device, None
        if device.startswith("cuda:") and device[5:].isdigit():
            return "cuda", as_int(int(device[5:]), "device", 0)
        raise ValueError(f"device: expected one of {', '.join(map(repr, BACKENDS))}, 'cuda:N', an int ordinal or a "
                         f"torch.device, got {device!r}")
    return "cuda", as_int(device, "device", 0)


def supports(cfg, device="cpu", *, max_tokens=256, first_expert=0, n_local=0, out_dtype="bf16",
             expert_bias=False, router_bias=False, input_scales=False):
    """(True, "") when fp4moe.Layer / torch_ops.MoE would be created for cfg on device, else
    (False, reason): the status and message the library's create gives (e.g.
    "FM_ERR_UNSUPPORTED: cuda backend: act_nvfp4 (W4A4) is not implemented yet"). device: "cpu", "cpu-ref", "cuda", "cuda:N", an int
    ordinal, a torch.device, or "auto". The flags say which optional weights will come
    (gpt-oss expert biases, a router bias, static input scales). Not judged: the weights'
    values and shapes, and memory. A wrong argument type still raises (TypeError /
    ValueError), as everywhere in the package."""
    if not isinstance(cfg, MoEConfig):
        raise TypeError(f"cfg: expected fp4moe.MoEConfig, got {type(cfg).__name__}")
    backend, ordinal = _backend_and_ordinal(device)
    as_choice(out_dtype, "out_dtype", OUT_DTYPES)  # a str, one of them (a list: not a TypeError "unhashable")
    max_tokens = as_int(max_tokens, "max_tokens", 1)  # Layer's own argument checks, the same bounds
    first_expert = as_int(first_expert, "first_expert", 0)
    n_local = as_int(n_local, "n_local", 0)
    features = ((FEATURE_EXPERT_BIAS if expert_bias else 0) | (FEATURE_ROUTER_BIAS if router_bias else 0)
                | (FEATURE_A_SCALE if input_scales else 0))
    try:
        ccfg = cfg._c()  # Layer / MoE check the configuration first, then open the device
    except _lib.Error as e:
        return False, str(e)
    dev = None
    if backend == "cuda":
        try:  # Layer / MoE open the device first (once per process): its refusal is the answer
            dev = _open_device(ordinal or 0)
        except _lib.Error as e:
            return False, str(e)
    desc = _lib.LayerDesc(BACKENDS[backend], dev, max_tokens, OUT_DTYPES[out_dtype], first_expert, n_local, 0,
                          0, 0.0, None, 0)
    why = C.create_string_buffer(1024)
    s = lib.fm_layer_supports(C.byref(desc), C.byref(ccfg), features, why, len(why))
    if s == 0:
        return True, ""
    return False, f"{_lib.status_name(s)}: {why.value.decode(errors='replace')}"
