#!/usr/bin/env python3
"""torch_layer.py - the peer of bench_layer: the same GLM-5 EP8 MoE layer in torch
with BF16 weights (torch._grouped_mm), same shapes, same T list, same two routings.

Layer (external routing, as bench_layer's first columns): ids/weights [T][8] given;
the slots of local experts (id < 32) sorted by expert (a stable argsort), rows
gathered, FC1 = _grouped_mm(x_sorted, W13^T, offs), SwiGLU, FC2 = _grouped_mm(h, W2^T,
offs), scaled by the slot weights and index_add'ed into out[T][6144] FP32. No host
sync inside (offs stays on the device), so the whole layer is captured into a CUDA
graph and replayed; eager times too (calls queued, an event between each two).
Two weight sets alternated, four routings rotated (nothing from L2). Median us.
"""
import argparse
import json

import torch

H, I, EL, K = 6144, 2048, 32, 8
TS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]


def make_layer(gen):
    w13 = (torch.randn(EL, 2 * I, H, device="cuda", generator=gen) / H ** 0.5).to(torch.bfloat16)
    w2 = (torch.randn(EL, H, I, device="cuda", generator=gen) / I ** 0.5).to(torch.bfloat16)
    return w13.transpose(1, 2), w2.transpose(1, 2)  # [E][K][N] views: _grouped_mm's mat2


def layer(x, ids, wts, w13t, w2t, out):
    T = x.shape[0]
    flat = ids.reshape(-1)
    local = flat < EL
    key = torch.where(local, flat, torch.full_like(flat, EL))  # non-local slots sort last
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(EL + 1, dtype=torch.int64, device=x.device).scatter_add_(0, key, torch.ones_like(key))[:EL]
    # (bincount would read its max back to the host: no graph capture)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    slot = order  # slots in expert order; the tail (non-local) is masked below
    xs = x.index_select(0, slot // K)
    h = torch._grouped_mm(xs, w13t, offs=offs)
    h = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
    y = torch._grouped_mm(h, w2t, offs=offs).float()
    keep = local.index_select(0, slot)[:, None]  # rows past offs[-1] are not computed: mask, never multiply
    y = torch.where(keep, y * wts.reshape(-1).index_select(0, slot)[:, None], 0.0)
    out.zero_()
    out.index_add_(0, slot // K, y)
    return out


def timed(fn, reps, warm=3):
    for _ in range(warm):
        fn(0)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for r in range(reps):
        fn(r)
        ev[r + 1].record()
    ev[reps].synchronize()
    ts = sorted(ev[r].elapsed_time(ev[r + 1]) * 1e3 for r in range(reps))
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(7)
    sets = [make_layer(gen) for _ in range(2)]
    res = []
    print(f"# torch_layer: torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'route':6} {'T':>5} {'graph_us':>10} {'eager_us':>10}")
    for mode, EG in (("ep8", 256), ("local", 32)):
        for T in ([1, 4, 64, 1024] if a.quick else TS):
            xs = [torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)]
            ids = [torch.argsort(torch.rand(T, EG, device="cuda", generator=gen), dim=1)[:, :K].to(torch.int64)
                   for _ in range(4)]
            wts = [0.05 + 0.2 * torch.rand(T, K, device="cuda", generator=gen) for _ in range(4)]
            out = torch.empty(T, H, device="cuda", dtype=torch.float32)
            eager = timed(lambda r: layer(xs[r % 4], ids[r % 4], wts[r % 4], *sets[r % 2], out), a.reps)
            graph_us = float("nan")
            try:
                graphs = []
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for r in range(8):
                        layer(xs[r % 4], ids[r % 4], wts[r % 4], *sets[r % 2], out)  # warm inside the stream
                torch.cuda.current_stream().wait_stream(s)
                for r in range(8):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        layer(xs[r % 4], ids[r % 4], wts[r % 4], *sets[r % 2], out)
                    graphs.append(g)
                graph_us = timed(lambda r: graphs[r % 8].replay(), a.reps)
            except Exception as e:  # capture unsupported in this torch: report eager only
                print(f"# graph capture failed at T={T}: {type(e).__name__}: {e}")
            print(f"{mode:6} {T:5d} {graph_us:10.1f} {eager:10.1f}", flush=True)
            res.append({"route": mode, "T": T, "graph_us": graph_us, "eager_us": eager})
            del xs, ids, wts, out
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
