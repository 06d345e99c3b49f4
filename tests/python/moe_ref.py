"""The oracle of the Python tests: a MoE layer in numpy written from the formula in
include/fp4moe/moe.h, and an FP4 decoder from the format definitions
(docs/formats.md) with ml_dtypes for E4M3. Nothing here calls fp4moe.

    logits = x . router_w^T; scores = softmax | sigmoid(logits)
    top_k experts on scores + bias (bias ranks only; optional group limit);
    weights = chosen scores, renormalised if asked, times routed_scale
    y = sum_j w_j * (silu(x W_gate^T) * (x W_up^T)) W2^T  (+ shared expert)
"""

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def decode_scales(codes, fmt):
    codes = np.asarray(codes).view(np.uint8)
    if fmt == "nvfp4":
        import ml_dtypes
        return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return np.ldexp(np.float32(1), codes.astype(np.int32) - 127).astype(np.float32)  # UE8M0


def dequant(data, scales, glob, fmt):
    """[..][rows][cols] float32 from packed FP4 (low nibble = even column) or BF16 bits."""
    data = np.asarray(data)
    if fmt == "bf16":
        return bf16_to_f32(data)
    lo, hi = E2M1[data & 0xF], E2M1[data >> 4]
    vals = np.stack([lo, hi], -1).reshape(*data.shape[:-1], data.shape[-1] * 2)
    blk = 16 if fmt == "nvfp4" else 32
    s = np.repeat(decode_scales(scales, fmt), blk, axis=-1)
    g = np.asarray(glob, np.float32).reshape(*np.shape(glob), *([1] * (vals.ndim - np.ndim(glob))))
    return ((vals * s) * g).astype(np.float32)


def bf16_to_f32(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def route(logits, score, top_k, bias=None, renormalize=True, routed_scale=1.0, n_group=0, topk_group=0):
    """(ids [T][k], weights [T][k], margin): margin = the smallest gap between the
    k-th and (k+1)-th ranking score of any token (small: the choice is fragile)."""
    lg = np.asarray(logits, np.float64)
    if score == "softmax-topk":  # gpt-oss: top-k of logits + bias, softmax over the k chosen
        b = lg + (0 if bias is None else np.asarray(bias, np.float64))
        order = np.argsort(-b, 1, kind="stable")
        ids = order[:, :top_k]
        srt = np.take_along_axis(b, order, 1)
        margin = np.min(srt[:, top_k - 1] - srt[:, top_k]) if top_k < b.shape[1] else np.inf
        ch = np.take_along_axis(b, ids, 1)
        e = np.exp(ch - ch.max(1, keepdims=True))
        return ids.astype(np.int32), e / e.sum(1, keepdims=True) * routed_scale, margin
    if score == "softmax":
        e = np.exp(lg - lg.max(1, keepdims=True))
        s = e / e.sum(1, keepdims=True)
    else:
        s = 1 / (1 + np.exp(-lg))
    rank = s + (0 if bias is None else np.asarray(bias, np.float64))
    T, E = rank.shape
    if n_group > 1:
        gsz = E // n_group
        g = rank.reshape(T, n_group, gsz)
        gscore = np.sort(g, -1)[..., -2:].sum(-1) if gsz >= 2 else g.max(-1)
        keep = np.argsort(-gscore, 1, kind="stable")[:, :topk_group]
        mask = np.zeros((T, n_group), bool)
        np.put_along_axis(mask, keep, True, 1)
        rank = np.where(np.repeat(mask, gsz, 1), rank, -np.inf)
    order = np.argsort(-rank, 1, kind="stable")
    ids = order[:, :top_k]
    srt = np.take_along_axis(rank, order, 1)
    margin = np.min(srt[:, top_k - 1] - srt[:, top_k]) if top_k < E else np.inf
    w = np.take_along_axis(s, ids, 1)
    if renormalize:
        tot = w.sum(1, keepdims=True)
        w = np.where(tot > 0, w / np.where(tot > 0, tot, 1), w)
    return ids.astype(np.int32), (w * routed_scale), margin


def silu(v):
    return v / (1 + np.exp(-v))


def gptoss_act(gate_up, limit, alpha=1.702):
    """gpt-oss's clamped SwiGLU as transformers' GptOssExperts writes it, on fp4moe's
    [gate | up] halves (the model's gate_up[..., ::2] / [..., 1::2])."""
    inter = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :inter], gate_up[..., inter:]
    gate = np.minimum(gate, limit)
    up = np.clip(up, -limit, limit)
    return (up + 1) * (gate * (1 / (1 + np.exp(-gate * alpha))))


def moe(x, w13, w2, ids, weights, inter, shared=None, b13=None, b2=None, limit=None):
    """x [T][H] float; w13 [E][2I][H], w2 [E][H][I] dequantized; ids global (-1 skipped).
    b13 [E][2I] / b2 [E][H]: expert biases; limit: gpt-oss's clamped SwiGLU (else SwiGLU)."""
    x = np.asarray(x, np.float64)
    T = x.shape[0]
    y = np.zeros((T, w2.shape[1]), np.float64)
    for t in range(T):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            if e < 0:
                continue
            g = w13[e].astype(np.float64) @ x[t]
            if b13 is not None:
                g = g + b13[e]
            h = silu(g[:inter]) * g[inter:] if limit is None else gptoss_act(g, limit)
            o = w2[e].astype(np.float64) @ h
            if b2 is not None:
                o = o + b2[e]
            y[t] += weights[t, j] * o
    if shared is not None:
        s13, s2 = (np.asarray(a, np.float64) for a in shared)
        si = s2.shape[1]
        g = x @ s13.T
        y += (silu(g[:, :si]) * g[:, si:]) @ s2.T
    return y


def nmse(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(((got - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300))
