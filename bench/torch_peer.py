#!/usr/bin/env python3
"""torch_peer.py - the peer and the ceilings for bench_gemm (issue 4), same run.

Measures on the current GPU, CUDA events, median after warm-up (calls queued back to
back with an event between each two; the peer also one call at a time, "us_single"):
  * copy ceiling: 2 GiB device-to-device copy (bytes read + written);
  * BF16 GEMM ceiling: 8192^3 torch.matmul on random data;
  * torch._grouped_mm with BF16 weights (also chained: 20 calls back to back, no event
    between them, "us_chain") on the GLM-5 EP8/TP8 shapes at 1..1024
    rows per expert (the peer the FP4 kernel is compared with).
Writes JSON to --out and prints a table. Weights are random (never zeros), several
times the L2, so each call streams them from HBM.
"""
import argparse
import json
import sys

import torch

SHAPES = [("EP8-FC1", 32, 4096, 6144), ("EP8-FC2", 32, 6144, 2048),
          ("TP8-FC1", 256, 512, 6144), ("TP8-FC2", 256, 6144, 256)]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def bench_chain(fn, chain=20, chains=9):
    """Median us of one call in a chain: `chain` calls back to back with no event between
    them, 9 chains (after one warm-up chain), each timed from an event before its first call
    to one after its last, divided by `chain` (bench_gemm's `csvc` plain column)."""
    ts = []
    for c in range(chains + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(chain):
            fn()
        b.record()
        b.synchronize()
        if c:
            ts.append(a.elapsed_time(b) / chain)
    ts.sort()
    return ts[len(ts) // 2] * 1e3  # us


def bench(fn, reps=25, warm=3, queued=True):
    """Median us of one call. queued: the calls enqueued back to back with an event
    between each two (the GPU's time per call, not the host's dispatch path: every
    call timed here takes 100+ us on the GPU, more than Python's dispatch); else
    one call at a time (event, call, event, synchronize), as bench_gemm's `csvs`."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    if queued:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        ev[0].record()
        for r in range(reps):
            fn()
            ev[r + 1].record()
        ev[reps].synchronize()
        ts = [ev[r].elapsed_time(ev[r + 1]) for r in range(reps)]
    else:
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2] * 1e3  # us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="torch_peer.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    n = 1 << 30  # 2 GiB of bf16
    src = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = bench(lambda: dst.copy_(src))
    res["copy_tbs"] = 2 * n * 2 / (us * 1e-6) / 1e12
    del src, dst
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    us = bench(lambda: a @ b, reps=15)
    res["bf16_tflops"] = 2 * 8192 ** 3 / (us * 1e-6) / 1e12
    del a, b
    print(f"# torch {torch.__version__} on {res['device']}: copy {res['copy_tbs']:.3f} TB/s, "
          f"BF16 GEMM {res['bf16_tflops']:.0f} TFLOP/s", flush=True)
    peer = []
    ms = [1, 8, 32, 128] if args.quick else MS
    for name, E, N, K in SHAPES:
        # two weight sets used alternately (0.8-1.6 GB each): no call finds its weights in L2
        w = [torch.randn(E, N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(2)]
        wt = [v.transpose(-2, -1) for v in w]  # [E, K, N] views, column-major as _grouped_mm wants
        for m in ms:
            x = [torch.randn(m * E, K, device=dev, dtype=torch.bfloat16) for _ in range(2)]
            offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * m
            i = [0]

            def run():
                i[0] ^= 1
                return torch._grouped_mm(x[i[0]], wt[i[0]], offs=offs)
            try:
                us = bench(run)
                us1 = bench(run, reps=15, queued=False)
                usc = bench_chain(run)
            except Exception as ex:  # an old torch without _grouped_mm for this shape
                print(f"# {name} m={m}: torch._grouped_mm failed: {ex}", file=sys.stderr)
                us = us1 = usc = float("nan")
            bytes_ = E * N * K * 2 + m * E * (K + N) * 2
            flops = 2 * m * E * N * K
            peer.append({"shape": name, "m": m, "us": us, "us_single": us1, "us_chain": usc, "tbs": bytes_ / (us * 1e-6) / 1e12,
                         "tflops": flops / (us * 1e-6) / 1e12})
            print(f"torch,{name},{m},{us:.1f},{peer[-1]['tbs']:.3f},{peer[-1]['tflops']:.1f}", flush=True)
            del x
        del w, wt
        torch.cuda.empty_cache()
    res["grouped_mm"] = peer
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
