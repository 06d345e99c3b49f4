#!/usr/bin/env python3
"""results_to_csv.py - turn the GPU table of bench/RESULTS.md into the simulator's
measured-times CSV (docs/simulate.md, "Measured times"), so `fp4moe simulate
--measured` and `--validate` read the same numbers the bench reported.

Why a script: RESULTS.md and HISTORY.md are the reviewed record (written by
bench/gpu_table.py from a full gpu-check run; the simulator's CSVs come from the last
full tile sweep's section, "## GPU, 2026-11-30 sixth session ...", now in HISTORY.md:
the section is looked up in RESULTS.md first, then HISTORY.md); the CSV is derived from it and must be regenerated,
never hand-edited, whenever the table changes:

    python3 bench/results_to_csv.py                   # -> bench/h200_fp4moe_gemm.csv
    python3 bench/results_to_csv.py --peer torch -o bench/h200_torch_bf16_gemm.csv

Rows of the table look like
    | EP8-FC1 | 8 | 162.1 | swapab_w4m1n1k256s4 | 2.83 | 80 | 108.8 | 1.49 | 579.9 | 3.58 |
columns: shape, rows/expert, fp4moe us, tile, TB/s, TFLOP/s, floor us, x floor,
torch BF16 us, speed-up (the fourth session's tables and later have a `launcher us`
column before torch's: the columns are found by the header row's names).  The shape
names map to GLM-5's per-GPU GEMMs
(background.md): EP8 = 32 experts with full shapes, TP8 = 256 experts sliced.
Only the standard library is used.
"""
import argparse
import re
import sys

# shape label -> (experts, N, K): GLM-5 hidden 6144, expert intermediate 2048, 8 GPUs
SHAPES = {
    "EP8-FC1": (32, 4096, 6144),
    "EP8-FC2": (32, 6144, 2048),
    "TP8-FC1": (256, 512, 6144),
    "TP8-FC2": (256, 6144, 256),
}
# table columns (0-based after splitting on '|'), the header row's names
HEAD_SHAPE, HEAD_ROWS, HEAD_FP4MOE_US, HEAD_TILE, HEAD_TORCH_US = "shape", "rows/expert", "fp4moe us", "tile", "torch BF16 us"


def ncols(col):
    return len(col)


def parse(path, section):
    """Rows of the first table of the first section whose heading starts with
    `section`: (shape, rows, fp4moe_us, tile, torch_us)."""
    out = []
    in_gpu = False
    col = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("## "):
                if out:
                    break
                in_gpu = line.strip().startswith("## " + section)
                continue
            if not in_gpu:
                continue
            if not line.startswith("|"):
                if out:
                    break  # the section's first table only (later tables are quick re-checks)
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and cells[0] == HEAD_SHAPE:  # the header: where each column is
                col = {name: i for i, name in enumerate(cells)}
                need = (HEAD_SHAPE, HEAD_ROWS, HEAD_FP4MOE_US, HEAD_TILE, HEAD_TORCH_US)
                if any(n not in col for n in need):
                    sys.exit(f"{path}:{lineno}: the table header lacks {[n for n in need if n not in col]}")
                continue
            if not cells or cells[0] not in SHAPES:
                continue  # separator or another table
            if col is None:
                sys.exit(f"{path}:{lineno}: a table row before the table's header")
            if len(cells) != ncols(col):
                sys.exit(f"{path}:{lineno}: expected {ncols(col)} columns (the header's), got {len(cells)}")
            try:
                rows = int(cells[col[HEAD_ROWS]])
                us = float(cells[col[HEAD_FP4MOE_US]].replace(",", ""))
                torch_us = float(cells[col[HEAD_TORCH_US]].replace(",", ""))
            except ValueError as e:
                sys.exit(f"{path}:{lineno}: {e}")
            out.append((cells[col[HEAD_SHAPE]], rows, us, cells[col[HEAD_TILE]], torch_us))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", action="append", default=None,
                    help="markdown file(s) to look for the section in, in order "
                         "(default: bench/RESULTS.md, then bench/HISTORY.md)")
    ap.add_argument("--peer", choices=["fp4moe", "torch"], default="fp4moe",
                    help="fp4moe: the swap-AB NVFP4 times; torch: torch._grouped_mm BF16 times")
    ap.add_argument("--gpu", default="h200", help="GPU short name as in the planner's GPU table")
    ap.add_argument("--section", default="GPU, 2026-11-30 sixth session",
                    help="heading (after '## ') the table's section starts with: the newest full run by default "
                         "('GPU' alone: the first session's table)")
    ap.add_argument("-o", "--output", default=None)
    a = ap.parse_args()
    out_path = a.output or ("bench/h200_fp4moe_gemm.csv" if a.peer == "fp4moe" else "bench/h200_torch_bf16_gemm.csv")
    files = a.results or ["bench/RESULTS.md", "bench/HISTORY.md"]
    rows, src = [], None
    for path in files:
        rows = parse(path, a.section)
        if rows:
            src = path
            break
    if not rows:
        sys.exit(f"{', '.join(files)}: no GPU table rows ({', '.join(SHAPES)}) found under '## {a.section}'")
    fmt = "nvfp4" if a.peer == "fp4moe" else "bf16"
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(f"# generated by bench/results_to_csv.py from {src} (section '{a.section}'); do not edit by hand\n")
        if a.peer == "fp4moe":
            f.write("# fp4moe FP4 grouped GEMM (NVFP4 weights, BF16 X/Y; mma.sync and wgmma kernels), fastest compiled tile per point\n")
        else:
            f.write("# torch._grouped_mm with BF16 weights, same shapes, same run\n")
        f.write("# GLM-5 per-GPU shapes: EP8 = 32 experts full size, TP8 = 256 experts sliced by 8\n")
        f.write("gpu,format,gemm,experts,n,k,rows_per_expert,us\n")
        for shape, r, us, tile, torch_us in rows:
            e, n, k = SHAPES[shape]
            t = us if a.peer == "fp4moe" else torch_us
            gemm = shape.split("-")[1].lower()
            f.write(f"{a.gpu},{fmt},{gemm},{e},{n},{k},{r},{t:g}\n")
    print(f"{out_path}: {len(rows)} points", file=sys.stderr)


if __name__ == "__main__":
    main()
