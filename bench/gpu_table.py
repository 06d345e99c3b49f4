#!/usr/bin/env python3
"""gpu_table.py - join bench_gemm's CSV lines with torch_peer.json into the
short table gpu-check.sh prints last (and bench/RESULTS.md quotes)."""
import json
import sys


def main():
    log, peer_json = sys.argv[1], sys.argv[2]
    peer = json.load(open(peer_json))
    tp = {(p["shape"], p["m"]): p["us"] for p in peer["grouped_mm"]}
    best = {}
    for line in open(log):
        if not line.startswith("csv,"):
            continue
        _, shape, m, tile, is_def, us, tbs, tfl, floor = line.strip().split(",")
        key = (shape, int(m))
        if key not in best or float(us) < best[key][1]:
            best[key] = (tile, float(us), float(tbs), float(tfl), float(floor))
    print(f"copy {peer['copy_tbs']:.3f} TB/s, BF16 {peer['bf16_tflops']:.0f} TFLOP/s (torch, same run)")
    print(f"| shape | rows/expert | fp4moe us | tile | TB/s | TFLOP/s | floor us | x floor | torch BF16 us | speed-up |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for (shape, m), (tile, us, tbs, tfl, floor) in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        t = tp.get((shape, m), float("nan"))
        print(f"| {shape} | {m} | {us:.1f} | {tile} | {tbs:.2f} | {tfl:.0f} | {floor:.1f} | {us / floor:.2f} | "
              f"{t:.1f} | {t / us:.2f} |")


if __name__ == "__main__":
    main()
