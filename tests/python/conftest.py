"""Shared fixtures of the Python tests. The package is imported as the CTest
run sets it up (PYTHONPATH=python/, FP4MOE_LIBRARY=the build's libfp4moe.so) or
as installed; failing to import it is a failure, never a skip. Seeds are fresh
each run and printed; FM_SEED=<n> replays one."""

import json
import os
import random
import struct
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp4moe  # noqa: E402

import moe_ref  # noqa: E402


def pytest_report_header(config):
    return f"fp4moe {fp4moe.__version__} from {fp4moe.library_path}"


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("FM_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"{request.node.name}: FM_SEED={seed}")
    return np.random.default_rng(seed)


def make_layer(rng, fmt="nvfp4", E=8, k=2, H=64, I=32, score="softmax", shared=0, bias=False, n_group=0,
               topk_group=0, routed_scale=1.0, renormalize=True):
    """A random layer: (cfg, MoEWeights, reference pieces). Router weights scaled by
    1/sqrt(H), so that logits are ~N(0, 1) and sigmoid scores do not saturate to 1.0
    (with 0.5 instead, logits ~N(0, 4-8) tied in FP32 for about half the tokens of the
    GPU suite: routing ties are now rare; tests still check the margin)."""
    cfg = fp4moe.MoEConfig(n_experts=E, top_k=k, hidden=H, inter=I, score=score, n_group=n_group,
                           topk_group=topk_group, renormalize=renormalize, routed_scale=routed_scale,
                           shared_inter=shared, wfmt=fmt)
    router = (rng.standard_normal((E, H)) / np.sqrt(H)).astype(np.float32)  # logits ~ N(0, 1): sigmoid unsaturated
    w13 = (rng.standard_normal((E, 2 * I, H)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((E, H, I)) * 0.2).astype(np.float32)
    rb = (rng.standard_normal(E) * 0.1).astype(np.float32) if bias else None
    sw13 = moe_ref.f32_to_bf16(rng.standard_normal((2 * shared, H)) * 0.2) if shared else None
    sw2 = moe_ref.f32_to_bf16(rng.standard_normal((H, shared)) * 0.2) if shared else None
    W = fp4moe.MoEWeights.quantize(cfg, router, w13, w2, router_bias=rb, shared_w13=sw13, shared_w2=sw2)
    ref = {
        "w13": moe_ref.dequant(W.w13_data, W.w13_scales, W.w13_global, fmt),
        "w2": moe_ref.dequant(W.w2_data, W.w2_scales, W.w2_global, fmt),
        "router": router, "bias": rb,
        "shared": None if not shared else (moe_ref.bf16_to_f32(sw13), moe_ref.bf16_to_f32(sw2)),
    }
    return cfg, W, ref


def make_x(rng, T, H):
    """BF16 bits of x, the float32 values they hold."""
    bits = moe_ref.f32_to_bf16(rng.standard_normal((T, H)))
    return bits, moe_ref.bf16_to_f32(bits)


def reference(cfg, ref, xf, ids=None, weights=None):
    """The numpy oracle's output, routing from the formula unless ids/weights given."""
    margin = np.inf
    if ids is None:
        logits = xf.astype(np.float64) @ ref["router"].astype(np.float64).T
        ids, weights, margin = moe_ref.route(logits, cfg.score, cfg.top_k, ref["bias"], cfg.renormalize,
                                             cfg.routed_scale, cfg.n_group, cfg.topk_group)
    return moe_ref.moe(xf, ref["w13"], ref["w2"], ids, weights, cfg.inter, ref["shared"]), margin


def write_safetensors(path, tensors):
    """Independent writer (the format: u64 header length, JSON header, data)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_modelopt(path, cfg, W, layer=0):
    """W (NVFP4 MoEWeights of cfg) as layer `layer` of a ModelOpt-layout checkpoint file."""
    write_safetensors(path, modelopt_dict(cfg, W, layer))


def typed(tensors):
    """{name: (safetensors dtype, array)} -> {name: array of that element type}, what
    fp4moe.Checkpoint.from_tensors takes (F8 / BF16 as ml_dtypes views of the same bytes)."""
    import ml_dtypes

    as_np = {"U8": np.uint8, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
             "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E8M0": ml_dtypes.float8_e8m0fnu}
    return {n: np.ascontiguousarray(a).view(as_np[d]) for n, (d, a) in tensors.items()}


def modelopt_dict(cfg, W, layer=0):
    """W as the {name: (dtype, array)} tensors of a ModelOpt layer."""
    I = cfg.inter
    t = {f"model.layers.{layer}.mlp.gate.weight": ("F32", W.router_w)}
    for e in range(cfg.n_experts):
        p = f"model.layers.{layer}.mlp.experts.{e}."
        for proj, d, s, g in (("gate_proj", W.w13_data[e, :I], W.w13_scales[e, :I], W.w13_global[e]),
                              ("up_proj", W.w13_data[e, I:], W.w13_scales[e, I:], W.w13_global[e]),
                              ("down_proj", W.w2_data[e], W.w2_scales[e], W.w2_global[e])):
            t[p + proj + ".weight"] = ("U8", d)
            t[p + proj + ".weight_scale"] = ("F8_E4M3", s)
            t[p + proj + ".weight_scale_2"] = ("F32", np.array([g], np.float32))
    return t


def gpt_oss_dict(W, cfg, gu_bias=None, dn_bias=None, r_bias=None):
    """MXFP4 W of cfg as the {name: (dtype, array)} tensors of a gpt-oss layer 0: fused
    over the experts, gate_up rows (and gu_bias, given interleaved) interleaving gate and up."""
    E, I, H = W.w13_data.shape[0], cfg.inter, cfg.hidden
    fused = np.empty_like(W.w13_data)  # gpt-oss: fused row 2i = gate row i, 2i+1 = up row i
    fused[:, 0::2], fused[:, 1::2] = W.w13_data[:, :I], W.w13_data[:, I:]
    fs = np.empty_like(W.w13_scales)
    fs[:, 0::2], fs[:, 1::2] = W.w13_scales[:, :I], W.w13_scales[:, I:]
    pre = "model.layers.0.mlp."
    t = {pre + "router.weight": ("F32", W.router_w),
         pre + "experts.gate_up_proj_blocks": ("U8", fused.reshape(E, 2 * I, H // 32, 16)),
         pre + "experts.gate_up_proj_scales": ("U8", fs),
         pre + "experts.down_proj_blocks": ("U8", W.w2_data.reshape(E, H, I // 32, 16)),
         pre + "experts.down_proj_scales": ("U8", W.w2_scales)}
    for name, b in (("router.bias", r_bias), ("experts.gate_up_proj_bias", gu_bias),
                    ("experts.down_proj_bias", dn_bias)):
        if b is not None:
            t[pre + name] = ("F32", b)
    return t


def race(call, close, expect=None):
    """call() in a loop in a thread until it raises; close() from this thread meanwhile.
    Returns (completed calls, the exception that ended the loop)."""
    started, done = threading.Event(), []
    ended = []

    def loop():
        try:
            while True:
                r = call()
                if expect is not None:
                    expect(r)
                done.append(1)
                started.set()
        except BaseException as e:  # noqa: B902 (reported to the main thread)
            ended.append(e)
            started.set()

    t = threading.Thread(target=loop)
    t.start()
    assert started.wait(60)
    threading.Event().wait(random.uniform(0, 0.004))
    close()
    t.join(60)
    assert not t.is_alive()
    return len(done), ended[0]


def closed(exc, what):
    """exc is the error of a call on a closed `what` (a ValueError, as a closed file's)."""
    assert isinstance(exc, fp4moe.ClosedError) and isinstance(exc, ValueError), repr(exc)
    assert str(exc) == f"{what} is closed"
