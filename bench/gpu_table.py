#!/usr/bin/env python3
"""gpu_table.py - join bench_gemm's CSV lines with torch_peer.json into the
short table gpu-check.sh prints last (and bench/RESULTS.md quotes)."""
import json
import sys


def main():
    log, peer_json = sys.argv[1], sys.argv[2]
    peer = json.load(open(peer_json))
    tp = {(p["shape"], p["m"]): p["us"] for p in peer["grouped_mm"]}
    tp1 = {(p["shape"], p["m"]): p.get("us_single", float("nan")) for p in peer["grouped_mm"]}
    tpc = {(p["shape"], p["m"]): p.get("us_chain", float("nan")) for p in peer["grouped_mm"]}
    best, chosen, single, chain, read = {}, {}, {}, {}, {}
    for line in open(log):
        if line.startswith("csvc,"):  # the best tile, interleaved: queued, chained, chained+PDL (medians), min/max of each
            f = line.strip().split(",")
            chain[(f[1], int(f[2]))] = ([float(v) for v in f[4:13]] + [float("nan")] * 9)[:9]
            continue
        if line.startswith("# read,"):  # same-size plain read of the weight set
            f = line.split()[1].split(",")
            read[f[1]] = float(f[3])
            continue
        if line.startswith("csvs,"):  # the best tile timed one launch at a time (host path included)
            _, shape, m, tile, us = line.strip().split(",")
            single[(shape, int(m))] = float(us)
            continue
        if not line.startswith("csv,"):
            continue
        _, shape, m, tile, is_def, us, tbs, tfl, floor = line.strip().split(",")
        key = (shape, int(m))
        if is_def in ("1", "2"):  # the launcher's choice (the planner's first candidate): natural / packed X
            chosen[(key, is_def)] = float(us)
        if key not in best or float(us) < best[key][1]:
            best[key] = (tile, float(us), float(tbs), float(tfl), float(floor))
    print(f"copy {peer['copy_tbs']:.3f} TB/s, BF16 {peer['bf16_tflops']:.0f} TFLOP/s (torch, same run)")
    print("fp4moe us = the fastest tile measured at the point, launches queued back to back (an event between each "
          "two); launcher us = what fm_cuda_gemm runs with no tile (the planner's first candidate), natural X / packed X; "
          "1-launch us = fp4moe's tile and torch timed one launch at a time (event, launch, event, synchronize: the host's "
          "launch path inside the time, the earlier sections' method)")
    print(f"| shape | rows/expert | fp4moe us | tile | TB/s | TFLOP/s | floor us | x floor | launcher us nat / pk | torch BF16 us | speed-up | 1-launch us fp4moe / torch |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (shape, m), (tile, us, tbs, tfl, floor) in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        t = tp.get((shape, m), float("nan"))
        c1, c2 = chosen.get(((shape, m), "1")), chosen.get(((shape, m), "2"))
        ch = " / ".join(f"{c:.1f}" if c else "-" for c in (c1, c2))
        print(f"| {shape} | {m} | {us:.1f} | {tile} | {tbs:.2f} | {tfl:.0f} | {floor:.1f} | {us / floor:.2f} | "
              f"{ch} | {t:.1f} | {t / us:.2f} | {single.get((shape, m), float('nan')):.1f} / {tp1.get((shape, m), float('nan')):.1f} |")
    if not chain:
        return
    print()
    print("launch modes, interleaved round by round (9 rounds of 20 launches each, median of the rounds' time / 20, "
          "min-max): queued = an event between each two launches (the table above's method), chained = no event "
          "between them, +PDL = chained with fm_cuda_gemm_args.pdl; fp4moe's tile of the table above. torch chained = "
          "20 calls back to back (torch_peer.py, before the bench; torch has no PDL). read us = a plain read of the "
          "shape's weight bytes (FP4 + scales) in one launch, queued: what one launch of that size costs with no GEMM")
    print("| shape | rows/expert | queued us | chained us | chained+PDL us | x floor (PDL) | floor us | read us | torch chained us | speed-up (PDL) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (shape, m), (tile, us, tbs, tfl, floor) in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        c = chain.get((shape, m))
        if not c:
            continue
        t = tpc.get((shape, m), float("nan"))
        print(f"| {shape} | {m} | {c[0]:.1f} ({c[3]:.1f}-{c[4]:.1f}) | {c[1]:.1f} ({c[5]:.1f}-{c[6]:.1f}) | "
              f"{c[2]:.1f} ({c[7]:.1f}-{c[8]:.1f}) | {c[2] / floor:.2f} | {floor:.1f} | {read.get(shape, float('nan')):.1f} | "
              f"{t:.1f} | {t / c[2]:.2f} |")


if __name__ == "__main__":
    main()
