"""fp4moe: MoE layers with NVFP4 / MXFP4 weights on the CPU and NVIDIA GPUs.

numpy (no torch needed):
    q = fp4moe.quantize(w, "nvfp4"); w2 = fp4moe.dequantize(q)
    layer = fp4moe.Layer(cfg, weights, backend="cpu"); y = layer.run(x)
    ck = fp4moe.Checkpoint(path); layer = fp4moe.Layer(None, ck.load_layer(3))
torch (imported on first use of fp4moe.torch_ops): torch.ops.fp4moe.moe / moe_out,
graph-capturable, traced by torch.compile. See docs/python.md.
"""

from ._lib import ClosedError, Error, LibraryMismatchError, library_path
from ._lib import lib as _clib
from .checkpoint import Checkpoint, LoadedLayer, NotModelledWarning
from .format import QTensor, dequantize, qtensor, quantize
from .layer import Layer, MoEConfig, MoEWeights, PlansWarning, route, to_bf16_bits

__version__ = _clib.fm_version().decode()


def backend_available(name):
    """True when backend name ("cpu-ref", "cpu", "cuda") can run here."""
    from ._args import as_choice
    from .layer import BACKENDS

    as_choice(name, "name", BACKENDS)
    return _clib.fm_backend_available(BACKENDS[name]) == 0


def __getattr__(name):
    if name == "torch_ops":  # lazily: importing fp4moe must not import torch
        import importlib

        return importlib.import_module(".torch_ops", __name__)
    raise AttributeError(f"module 'fp4moe' has no attribute {name!r}")


__all__ = ["Error", "ClosedError", "LibraryMismatchError", "library_path", "Checkpoint", "LoadedLayer", "NotModelledWarning", "QTensor",
           "quantize", "dequantize", "qtensor", "Layer", "PlansWarning", "MoEConfig", "MoEWeights", "route", "to_bf16_bits",
           "backend_available"]
