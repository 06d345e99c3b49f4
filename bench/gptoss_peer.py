#!/usr/bin/env python3
"""gptoss_peer.py - the peer for bench_layer --model gpt-oss-120b (issue 32): gpt-oss-120b's
MoE layer as vLLM runs it on Hopper, with OpenAI's triton_kernels (matmul_ogs, MXFP4 weights,
BF16 activations), timed on the current GPU in the same device call as fp4moe's numbers.
Status (2026-12-06): written and checked on the CPU (routing under Triton's interpreter, the
weight swizzle's round trip, the reference against triton_kernels' torch ops); matmul_ogs itself,
graph capture and the timings have not run yet: no device machine could be started for it.

What is timed (one "forward", as vLLM's triton_kernel_moe_forward -> triton_kernel_fused_experts):
  1. routing from the router logits (gating_output, BF16 [T, 128]): softmax-topk, top-4,
     sm_first=False (gpt-oss renormalizes: softmax over the 4 selected logits), then the
     ragged metadata and the gather/scatter indices;
  2. matmul_ogs FC1: x gathered per expert, x @ W13 (MXFP4, hidden 2880 -> 2 x 2880,
     gate/up interleaved), + FP32 bias, fused clamped SwiGLU (alpha 1.702, limit 7.0,
     reduction_n=2), BF16 out [T*4, 2880];
  3. matmul_ogs FC2: @ W2 (MXFP4, 2880 -> 2880), + FP32 bias, times the routing weights
     (gammas), scattered back and summed over the 4 experts of each token: out [T, 2880].
The router GEMM (hidden -> 128 logits) is not inside (vLLM runs it as a separate linear
layer before the MoE); the logits are an input, as bench_layer's external routing has ids.

triton_kernels: the copy of triton-lang/triton's python/triton_kernels/triton_kernels at tag
v3.6.0, commit 7c56a5e40f7fd928dfd5c72902d5def0097db73a ("[release 3.6] Release Triton to
pypi (#9254)", 2026-01-20, also the tip of release/3.6.x), the triton that torch 2.11 ships.
It lives in <repo>/.triton_kernels/triton_kernels (git-ignored, carried to the device, never
committed; .triton_kernels/SOURCE says where it came from). An installed triton_kernels is
used first if there is one (the banner prints which file was imported).

How vLLM calls it, at this triton_kernels version (v3.6.0 has no triton_kernels.routing
module any more: vLLM, SGLang and triton's own bench/distributed.py build the routing
from topk + the bitmatrix metadata + make_ragged_tensor_metadata, as done here):
  * weights: the checkpoint's layout, w13 [E, 2*I, H/2] uint8 (e2m1 pairs, low nibble
    first) + scales [E, 2*I, H/32] (e8m0), w2 [E, H, I/2] + [E, H, I/32]; quantized here
    from random BF16 with triton_kernels' downcast_to_mxfp(w, torch.uint8, axis=-1), then
    swizzled as vLLM's _swizzle_mxfp4 (mxfp4_utils.py) does: transpose(-2, -1),
    wrap_torch_tensor(..., dtype=FP4) / wrap_torch_tensor(scale), convert_layout with
    layout.make_default_matmul_mxfp4_w_layout(mx_axis=1) and
    make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8) (on Hopper:
    HopperMXValueLayout / HopperMXScaleLayout), PrecisionConfig(weight_scale=...,
    flex_ctx=FlexCtx(rhs_data=InFlexData())). Biases FP32 [E, 2*I] and [E, H].
  * local (all 128 experts on this GPU): sparse = topk(logits, 4, apply_softmax=True);
    combine = sparse.mask_metadata.col_sorted_indx, dispatch = ...row_sorted_indx;
    ragged = make_ragged_tensor_metadata(sparse.mask_metadata.col_sum, dispatch.shape[0]);
    RoutingData(sparse.vals.flatten()[combine], ragged.slice_sizes, 128, 4, ragged),
    GatherIndx(combine, dispatch), ScatterIndx(dispatch, combine).
  * ep8 (EP rank 0 of 8: experts 0..15 of 128 local, every rank sees all T tokens, the
    partial outputs are all-reduced afterwards, not timed here): vLLM's OAITritonExperts
    path: global top-4 ids/weights (vLLM takes them from its own router kernel; here the
    same triton_kernels topk stands in for it), topk_ids = expert_map[topk_ids] (-1 for
    the other ranks' experts), ids to int16, weights to BF16, invalid weights set to -1,
    the local ids packed into a [T, 16] bitmatrix (a small Triton kernel here, as vLLM's
    pack_bitmatrix), SparseMatrix(indx, vals, mask) -> the same metadata/RoutingData with
    16 local experts, and matmul_ogs on the 16-expert weights. This is vLLM's emulation,
    not an approximation: rows whose expert is elsewhere are dropped by the ragged metadata
    (FC1) and masked in matmul_ogs's final reduction (FC2).

How it is timed (as bench_layer's rot_time): 8 distinct inputs (x and logits, so 8
routings) are rotated so nothing is served from L2; per T the forward is
  * graph: captured once per input (torch.cuda.CUDAGraph, each its own pool), replays
    queued back to back with a CUDA event between each two;
  * eager: the Python calls queued back to back with an event between each two (the
    host's dispatch cost is inside when it exceeds the GPU time, as vLLM without graphs);
--warmup calls first, then --reps timed calls (default 50) rotating over the inputs; the
reported us is the mean over the inputs of the median of each input's timings (the
floor is averaged over the same inputs). If capture fails the graph column is "n/a" and
the reason is printed.
Logits are a random permutation of distinct BF16 values per row (k/16 - 4), so the top-4
is unique and the torch reference routes exactly as the kernels do.

Columns: mode, T, experts_hit (experts of this GPU that get rows, mean over the inputs),
weight_bytes (their MXFP4 bytes: FC1 2880*5760/2 + 2880/32*5760 scales, FC2 2880*2880/2 +
2880/32*2880 scales, + FP32 biases 4*(5760+2880); 13,253,760 per expert), floor_us
(weight_bytes / --bw GB/s, default 4200, the H200's measured copy, as bench_layer), graph_us,
eager_us, x_floor (graph_us / floor_us, eager_us where there is no graph). bench_layer's
floor also counts x, out and a FLOP bound; this one is the weights only.

Check: at T = 4 and T = 64 (those of --ts; --no-check skips it) the output of each mode is
compared with a plain torch FP32 reference computed from the dequantized MXFP4 weights
(an independent e2m1 table, not triton_kernels' upcast), the same routing recomputed with
torch.topk + softmax, FC1 activations rounded to BF16 as the kernel stores them; NMSE is
printed, WARNING when > 1e-2 (no assert). The graph replay's output is compared with the
eager one's too.

Exit: 0, 1 if some (mode, T) failed (the others still run), 77 (skip) if torch, CUDA or
triton_kernels is missing.

Run from the repo root, e.g. on the device (the device call must carry the git-ignored
.triton_kernels folder: carry [".triton_kernels"]; a first run compiles the Triton kernels,
a few minutes):
  PYTHONPATH=python python3 bench/gptoss_peer.py --csv $OUT/gptoss_peer.csv
  python3 bench/gptoss_peer.py --modes ep8 --ts 1,16,256 --reps 100 --no-graph
Options: --modes local,ep8  --ts 1,4,16,64,256,1024,4096  --reps 50  --warmup 10
  --inputs 8  --bw 4200  --seed 0  --no-graph  --no-check  --csv FILE
"""
import argparse
import csv
import os
import statistics
import sys

HIDDEN, INTER, N_EXPERTS, TOPK = 2880, 2880, 128, 4
EP, EP_LOCAL = 8, 16  # ep8: rank 0 holds experts 0..15
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
MX_BLOCK = 32
TK_COMMIT = "7c56a5e40f7fd928dfd5c72902d5def0097db73a"  # triton v3.6.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TK_DIR = os.path.join(REPO, ".triton_kernels")


def expert_bytes(h=HIDDEN, i=INTER):
    """MXFP4 bytes of one expert: FP4 data + e8m0 scales of FC1 (h -> 2i) and FC2 (i -> h),
    + the FP32 biases."""
    fc1 = h * 2 * i // 2 + (h // MX_BLOCK) * 2 * i
    fc2 = i * h // 2 + (i // MX_BLOCK) * h
    return fc1 + fc2 + 4 * (2 * i + h)


def skip(msg):
    print(f"gptoss_peer: SKIP: {msg}", file=sys.stderr)
    sys.exit(77)


def import_stack():
    """torch, triton, triton_kernels (installed, else <repo>/.triton_kernels); exit 77 if not."""
    try:
        import torch
        import triton
    except Exception as e:  # noqa: BLE001 - any import failure means skip
        skip(f"torch/triton not importable: {e!r}")
    try:
        import triton_kernels  # noqa: F401
    except ImportError:
        sys.path.insert(0, TK_DIR)
        try:
            import triton_kernels  # noqa: F401
        except ImportError as e:
            skip(f"triton_kernels not importable (not installed, nor in {TK_DIR}: copy triton "
                 f"v3.6.0's python/triton_kernels/triton_kernels there): {e!r}")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    try:
        import triton_kernels.swiglu  # noqa: F401
        import triton_kernels.matmul_ogs  # noqa: F401
        import triton_kernels.topk  # noqa: F401
        import triton_kernels.tensor  # noqa: F401
        import triton_kernels.tensor_details.layout  # noqa: F401
        import triton_kernels.numerics_details.mxfp  # noqa: F401
        import triton_kernels.numerics  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an API mismatch with this triton
        skip(f"triton_kernels ({triton_kernels.__file__}) does not import with triton "
             f"{triton.__version__}: {e!r}")
    return torch, triton


# ----------------------------------------------------------------------------------------
# everything below runs after import_stack()

try:  # the Triton kernel of this file is defined at module level (Triton resolves its globals)
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - reported (exit 77) by import_stack()
    triton = None

if triton is not None:
    @triton.jit
    def _or(a, b):
        return a | b

    @triton.jit
    def _pack_bitmatrix(Ids, stride_im, Bits, stride_bm, stride_bn, n_rows, K: tl.constexpr,
                        BLOCK_K: tl.constexpr, N_WORDS: tl.constexpr, BLOCK_M: tl.constexpr):
        """Row t of Bits: bit e set iff e is one of t's K ids (ids < 0: not local, skipped);
        vLLM's pack_bitmatrix does the same for its EP path."""
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        mask = (offs_m[:, None] < n_rows) & (offs_k[None, :] < K)
        ids = tl.load(Ids + offs_m[:, None] * stride_im + offs_k[None, :], mask=mask, other=-1).to(tl.int32)
        bit = tl.full([BLOCK_M, BLOCK_K], 1, tl.uint32) << (ids & 31).to(tl.uint32)
        for w in tl.static_range(N_WORDS):
            v = tl.where((ids >= 0) & ((ids >> 5) == w), bit, tl.zeros([BLOCK_M, BLOCK_K], tl.uint32))
            tl.store(Bits + offs_m * stride_bm + w * stride_bn, tl.reduce(v, 1, _or), mask=offs_m < n_rows)


def define(torch, triton):
    """The helpers that need triton_kernels (imported by import_stack first), as a dict."""
    import triton_kernels.swiglu
    from triton_kernels.matmul_ogs import (FlexCtx, FnSpecs, FusedActivation, GatherIndx, PrecisionConfig,
                                           RoutingData, ScatterIndx, matmul_ogs)
    from triton_kernels.numerics import InFlexData
    from triton_kernels.numerics_details.mxfp import downcast_to_mxfp
    from triton_kernels.tensor import (BIT, FP4, Bitmatrix, SparseMatrix, convert_layout,
                                       make_ragged_tensor_metadata, wrap_torch_tensor)
    from triton_kernels.tensor_details import layout
    from triton_kernels.topk import topk

    def swizzle_mxfp4(q, s, num_warps=8):
        """vLLM's _swizzle_mxfp4 (mxfp4_utils.py) on CUDA with torch >= 2.8.1: q [E, N, K/2] uint8,
        s [E, N, K/32] uint8 (checkpoint layout) -> matmul_ogs's weight [E, K, N] and scale."""
        value_layout, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
        scale_layout, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=num_warps)
        q = q.transpose(-2, -1)
        s = s.transpose(-2, -1)
        wq = convert_layout(wrap_torch_tensor(q, dtype=FP4), value_layout, **value_opts)
        ws = convert_layout(wrap_torch_tensor(s), scale_layout, **scale_opts)
        return wq, InFlexData(), ws, (value_layout.__name__, scale_layout.__name__)

    def routing_data_from(sparse, n_expts, k):
        md = sparse.mask_metadata
        combine, dispatch = md.col_sorted_indx, md.row_sorted_indx
        ragged = make_ragged_tensor_metadata(md.col_sum, dispatch.shape[0])
        gate_scal = sparse.vals.flatten()[combine]
        rd = RoutingData(gate_scal, ragged.slice_sizes, n_expts, k, ragged)
        return rd, GatherIndx(combine, dispatch), ScatterIndx(dispatch, combine)

    def routing_local(logits, k):
        """vLLM's routing(gating_output, topk, sm_first=False) at triton_kernels v3.6.0."""
        return routing_data_from(topk(logits, k, apply_softmax=True), logits.shape[-1], k)

    def routing_ep(logits, k, expert_map, n_local):
        """vLLM's EP path: global top-k, expert_map, make_routing_data over the local experts."""
        g = topk(logits, k, apply_softmax=True)
        topk_ids = expert_map[g.indx.long()].to(torch.int16)
        topk_w = g.vals.to(torch.bfloat16)
        n_rows = topk_ids.shape[0]
        words = triton.cdiv(n_local, 32)
        data = torch.empty((words, triton.cdiv(n_rows, 32) * 32), dtype=torch.uint32, device=logits.device)
        data = data.transpose(0, 1)[:n_rows]  # column-major, as topk's own bitmatrix
        BLOCK_M = 128
        _pack_bitmatrix[(triton.cdiv(n_rows, BLOCK_M),)](
            topk_ids, topk_ids.stride(0), data, data.stride(0), data.stride(1), n_rows,
            K=k, BLOCK_K=triton.next_power_of_2(k), N_WORDS=words, BLOCK_M=BLOCK_M)
        mask = Bitmatrix(data, dtype=BIT, shape=[n_rows, n_local], shape_max=[n_rows, None])
        topk_w = torch.where(topk_ids == -1, -1.0, topk_w)  # matmul_ogs: invalid weights are -1
        return routing_data_from(SparseMatrix(indx=topk_ids, vals=topk_w, mask=mask), n_local, k)

    act = FusedActivation(FnSpecs("swiglu", triton_kernels.swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                          (SWIGLU_ALPHA, SWIGLU_LIMIT))

    def experts(x, L, rd, gi, si):
        """triton_kernel_fused_experts: FC1 (gather, bias, fused SwiGLU), FC2 (scatter, bias, gammas)."""
        h = matmul_ogs(x, L["w1"], L["b1"], rd, gather_indx=gi, precision_config=L["pc1"], fused_activation=act)
        return matmul_ogs(h, L["w2"], L["b2"], rd, scatter_indx=si, precision_config=L["pc2"], gammas=rd.gate_scal)

    def precision(ws, flex):
        return PrecisionConfig(weight_scale=ws, flex_ctx=FlexCtx(rhs_data=flex))

    return dict(downcast_to_mxfp=downcast_to_mxfp, swizzle_mxfp4=swizzle_mxfp4, routing_local=routing_local,
                routing_ep=routing_ep, experts=experts, precision=precision)


FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant_mxfp4(torch, q, s):
    """[N, K/2] uint8 e2m1 pairs (low nibble first) + [N, K/32] e8m0 -> [N, K] fp32 (plain torch)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=q.device)
    q = q.to(torch.int32)
    v = torch.stack((lut[q & 0xF], lut[(q >> 4) & 0xF]), dim=-1).reshape(q.shape[0], -1)
    scale = torch.exp2(s.to(torch.float32) - 127.0)
    return (v.view(q.shape[0], -1, MX_BLOCK) * scale[..., None]).reshape(q.shape[0], -1)


def reference(torch, x, logits, W, local_experts):
    """FP32 torch forward from the dequantized MXFP4 weights; experts outside local_experts
    contribute nothing (the EP shard's partial sum)."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        vals, idx = torch.topk(logits.float(), TOPK, dim=-1)
        gate = torch.softmax(vals, dim=-1)
        out = torch.zeros((x.shape[0], HIDDEN), dtype=torch.float32, device=x.device)
        xf = x.float()
        for e in torch.unique(idx).tolist():
            if e not in local_experts:
                continue
            le = local_experts[e]
            tok, slot = (idx == e).nonzero(as_tuple=True)
            w13 = dequant_mxfp4(torch, W["q1"][le], W["s1"][le])  # [2I, H]
            w2 = dequant_mxfp4(torch, W["q2"][le], W["s2"][le])  # [H, I]
            h = xf[tok] @ w13.T + W["b1"][le]
            g, u = h[:, 0::2].clamp(max=SWIGLU_LIMIT), h[:, 1::2].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
            a = (g * torch.sigmoid(SWIGLU_ALPHA * g) * (u + 1.0)).to(torch.bfloat16).float()
            y = a @ w2.T + W["b2"][le]
            out.index_add_(0, tok, y * gate[tok, slot][:, None])
        return out, idx
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def nmse(torch, y, ref):
    d = (y.float() - ref).pow(2).sum()
    return (d / ref.pow(2).sum().clamp_min(1e-30)).item()


def make_weights(torch, K, n_experts, seed, chunk=8):
    """Random BF16 weights in the checkpoint's layout, MXFP4-quantized with triton_kernels'
    downcast_to_mxfp; FP32 biases. Keeps the quantized checkpoint tensors (for the
    swizzle and for the reference)."""
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    q1 = torch.empty((n_experts, 2 * INTER, HIDDEN // 2), dtype=torch.uint8, device=dev)
    s1 = torch.empty((n_experts, 2 * INTER, HIDDEN // MX_BLOCK), dtype=torch.uint8, device=dev)
    q2 = torch.empty((n_experts, HIDDEN, INTER // 2), dtype=torch.uint8, device=dev)
    s2 = torch.empty((n_experts, HIDDEN, INTER // MX_BLOCK), dtype=torch.uint8, device=dev)
    for e0 in range(0, n_experts, chunk):
        e1 = min(n_experts, e0 + chunk)
        w13 = (torch.randn((e1 - e0, 2 * INTER, HIDDEN), generator=gen, device=dev) * HIDDEN ** -0.5).bfloat16()
        a, b = K["downcast_to_mxfp"](w13, torch.uint8, axis=-1)
        q1[e0:e1].copy_(a)
        s1[e0:e1].copy_(b)
        del w13, a, b
        w2 = (torch.randn((e1 - e0, HIDDEN, INTER), generator=gen, device=dev) * INTER ** -0.5).bfloat16()
        a, b = K["downcast_to_mxfp"](w2, torch.uint8, axis=-1)
        q2[e0:e1].copy_(a)
        s2[e0:e1].copy_(b)
        del w2, a, b
    b1 = torch.randn((n_experts, 2 * INTER), generator=gen, device=dev) * 0.1
    b2 = torch.randn((n_experts, HIDDEN), generator=gen, device=dev) * 0.1
    torch.cuda.synchronize()
    return dict(q1=q1, s1=s1, q2=q2, s2=s2, b1=b1, b2=b2)


def make_layer(torch, K, W, n_local):
    """matmul_ogs's operands for the first n_local experts, swizzled as vLLM does."""
    w1, f1, ws1, lay = K["swizzle_mxfp4"](W["q1"][:n_local], W["s1"][:n_local])
    w2, f2, ws2, _ = K["swizzle_mxfp4"](W["q2"][:n_local], W["s2"][:n_local])
    torch.cuda.synchronize()
    return dict(w1=w1, w2=w2, pc1=K["precision"](ws1, f1), pc2=K["precision"](ws2, f2),
                b1=W["b1"][:n_local].contiguous(), b2=W["b2"][:n_local].contiguous(), layouts=lay)


def make_inputs(torch, T, n_inputs, seed):
    """n_inputs (x, logits) pairs; logits: per row a random permutation of distinct BF16
    values k/16 - 4 (k < 128), so the top-4 is unique."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    out = []
    for _ in range(n_inputs):
        x = torch.randn((T, HIDDEN), generator=gen, device="cuda").bfloat16()
        perm = torch.argsort(torch.rand((T, N_EXPERTS), generator=gen, device="cuda"), dim=-1)
        logits = (perm.float() / 16.0 - 4.0).bfloat16().contiguous()
        out.append((x, logits))
    return out


def rot_time(torch, fns, reps, warmup):
    """fns[i]() enqueues input i's forward. Warm-up, then reps calls queued back to back
    rotating over the inputs, a CUDA event between each two; us = mean over the inputs of
    the median of that input's times."""
    n = len(fns)
    for it in range(warmup):
        fns[it % n]()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for r in range(reps):
        fns[r % n]()
        ev[r + 1].record()
    ev[reps].synchronize()
    per = [[] for _ in range(n)]
    for r in range(reps):
        per[r % n].append(ev[r].elapsed_time(ev[r + 1]) * 1e3)
    return statistics.mean(statistics.median(p) for p in per if p)


def parse_ints(s):
    return [int(v) for v in s.split(",") if v.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="local,ep8", help="local (128 experts) and/or ep8 (16 of 128)")
    ap.add_argument("--ts", default="1,4,16,64,256,1024,4096", help="token counts")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per (mode, T)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls first")
    ap.add_argument("--inputs", type=int, default=8, help="distinct (x, logits) rotated over")
    ap.add_argument("--bw", type=float, default=4200.0, help="GB/s for the floor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graph", action="store_true", help="eager only")
    ap.add_argument("--no-check", action="store_true", help="skip the torch reference at T=4, 64")
    ap.add_argument("--csv", help="write the table here too")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("local", "ep8"):
            ap.error(f"--modes: {m}: local or ep8")
    ts = parse_ints(args.ts)
    if args.reps < args.inputs:
        ap.error("--reps must be >= --inputs")

    torch, triton = import_stack()
    import triton_kernels
    K = define(torch, triton)
    dev = torch.cuda.get_device_properties(0)
    cap = torch.cuda.get_device_capability(0)
    print(f"# gptoss_peer: gpt-oss-120b MoE (H={HIDDEN}, I={INTER}, E={N_EXPERTS}, top-{TOPK}, MXFP4 w, BF16 x, "
          f"clamped SwiGLU {SWIGLU_ALPHA}/{SWIGLU_LIMIT}), vLLM's triton_kernels path")
    print(f"# device {dev.name} sm_{cap[0]}{cap[1]} {dev.multi_processor_count} SMs; torch {torch.__version__}, "
          f"triton {triton.__version__}; triton_kernels {os.path.dirname(triton_kernels.__file__)} "
          f"(copied from triton {TK_COMMIT[:12]}, v3.6.0)")
    if not triton.__version__.startswith("3.6"):
        print(f"# WARNING: triton {triton.__version__}: this triton_kernels copy is v3.6.0's")
    if cap[0] != 9:
        print(f"# WARNING: sm_{cap[0]}{cap[1]} is not Hopper: triton_kernels picks that arch's layouts/kernels")
    print(f"# timing: {args.inputs} inputs rotated, {args.warmup} warm-up + {args.reps} timed calls queued with "
          f"events between; us = mean over inputs of per-input medians; floor = experts_hit x "
          f"{expert_bytes():,} B / {args.bw:g} GB/s")

    W = make_weights(torch, K, N_EXPERTS, args.seed)
    expert_map = torch.full((N_EXPERTS,), -1, dtype=torch.int32, device="cuda")
    expert_map[:EP_LOCAL] = torch.arange(EP_LOCAL, dtype=torch.int32, device="cuda")

    rows, failed = [], 0
    for mode in modes:
        n_local = N_EXPERTS if mode == "local" else EP_LOCAL
        L = make_layer(torch, K, W, n_local)
        print(f"# {mode}: {n_local} local experts of {N_EXPERTS}; layouts {L['layouts'][0]} / {L['layouts'][1]}")
        if mode == "local":
            route = lambda lg: K["routing_local"](lg, TOPK)  # noqa: E731
        else:
            route = lambda lg: K["routing_ep"](lg, TOPK, expert_map, EP_LOCAL)  # noqa: E731
        local_experts = {e: e for e in range(n_local)}

        def forward(x, lg, route=route, L=L):
            rd, gi, si = route(lg)
            return K["experts"](x, L, rd, gi, si)

        print(f"{'mode':<6} {'T':>5} {'experts':>7} {'weight_MB':>9} {'floor_us':>9} {'graph_us':>9} "
              f"{'eager_us':>9} {'x_floor':>7}")
        for T in ts:
            try:
                inputs = make_inputs(torch, T, args.inputs, args.seed + 1000 + T)
                hits = []
                for _, lg in inputs:
                    ids = torch.topk(lg.float(), TOPK, dim=-1).indices
                    hits.append(int((torch.unique(ids) < n_local).sum().item()))
                hit = statistics.mean(hits)
                wbytes = hit * expert_bytes()
                floor_us = wbytes / (args.bw * 1e3)
                # correctness (first call also compiles every kernel of this shape)
                y0 = forward(*inputs[0])
                torch.cuda.synchronize()
                if not args.no_check and T in (4, 64):
                    ref, _ = reference(torch, inputs[0][0], inputs[0][1], W, local_experts)
                    e = nmse(torch, y0, ref)
                    print(f"# check {mode} T={T} (input 0, {hits[0]} experts hit): NMSE vs torch FP32 "
                          f"reference {e:.3e}"
                          + ("  WARNING: > 1e-2" if e > 1e-2 else ""))
                fns = [lambda x=x, lg=lg: forward(x, lg) for x, lg in inputs]
                eager_us = rot_time(torch, fns, args.reps, args.warmup)
                graph_us = None
                if not args.no_graph:
                    try:
                        s = torch.cuda.Stream()
                        s.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(s):
                            for x, lg in inputs:
                                forward(x, lg)
                        torch.cuda.current_stream().wait_stream(s)
                        torch.cuda.synchronize()
                        graphs, outs = [], []
                        for x, lg in inputs:  # one private memory pool per graph
                            g = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(g):
                                outs.append(forward(x, lg))
                            graphs.append(g)
                        graphs[0].replay()
                        torch.cuda.synchronize()
                        dg = (outs[0].float() - y0.float()).abs().max().item()
                        if dg > 1e-2 * max(1.0, y0.float().abs().max().item()):
                            print(f"# WARNING: {mode} T={T}: graph replay differs from eager by {dg:.3e}")
                        graph_us = rot_time(torch, [g.replay for g in graphs], args.reps, args.warmup)
                        del graphs, outs
                    except Exception as e:  # noqa: BLE001 - capture unsupported: report, go on
                        torch.cuda.synchronize()
                        print(f"# {mode} T={T}: CUDA graph capture/replay failed, graph_us n/a: {e!r}")
                best = graph_us if graph_us is not None else eager_us
                row = dict(mode=mode, T=T, experts_hit=round(hit, 3), weight_bytes=int(round(wbytes)),
                           floor_us=round(floor_us, 2), graph_us="" if graph_us is None else round(graph_us, 2),
                           eager_us=round(eager_us, 2), x_floor=round(best / floor_us, 2) if floor_us > 0 else "")
                rows.append(row)
                gs = "n/a" if graph_us is None else f"{graph_us:9.1f}"
                xf = f"{best / floor_us:7.2f}" if floor_us > 0 else "    inf"
                print(f"{mode:<6} {T:>5} {hit:>7.2f} {wbytes / 1e6:>9.1f} {floor_us:>9.1f} {gs:>9} "
                      f"{eager_us:>9.1f} {xf}", flush=True)
            except Exception as e:  # noqa: BLE001 - one shape failing must not lose the rest
                failed += 1
                print(f"{mode:<6} {T:>5} ERROR {e!r}", flush=True)
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001
                    pass
            finally:
                torch.cuda.empty_cache()
        del L
        torch.cuda.empty_cache()

    if args.csv:
        cols = ["mode", "T", "experts_hit", "weight_bytes", "floor_us", "graph_us", "eager_us", "x_floor"]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        print(f"# wrote {args.csv}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
