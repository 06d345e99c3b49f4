#!/usr/bin/env python3
"""sim_measured_cli.py - `fp4moe simulate` with the committed H200 table
(bench/h200_fp4moe_gemm.csv) on GLM-5 EP8 and TP8: the output parses, says it
used the measured table, and its FC1/FC2 times are what the table gives for the
expected active experts (bounded by the table's own per-expert times), not the
roofline's.  Also --validate (CSV parses, one line per table row) and
--calibrated-h200 (its errors are smaller than the defaults').  No timing of
anything is asserted: only that the numbers come from the table.

usage: sim_measured_cli.py FP4MOE_BINARY SOURCE_DIR
"""
import csv
import io
import json
import subprocess
import sys


def run(cli, *args, want=0):
    r = subprocess.run([cli, "simulate", *args], capture_output=True, text=True)
    if r.returncode != want:
        sys.exit(f"simulate {' '.join(args)}: exit {r.returncode}, wanted {want}\n{r.stderr}")
    return r


def main():
    cli, src = sys.argv[1], sys.argv[2]
    table = f"{src}/bench/h200_fp4moe_gemm.csv"
    rows = list(csv.DictReader(line for line in open(table) if not line.startswith("#")))
    for par, experts in (("ep", 32), ("tp", 256)):
        base = ["--model", "glm5", "--gpu", "h200", "--gpus", "8", "--parallel", par, "--kernel", "fp4moe",
                "--max-running-requests", "64"]
        meas = json.loads(run(cli, *base, "--measured", table, "--json").stdout)
        roof = json.loads(run(cli, *base, "--json").stdout)
        assert meas["config"]["measured_table"] is True, meas["config"]
        assert roof["config"]["measured_table"] is False
        p, q = meas["points"][0], roof["points"][0]
        assert p["measured"] == 1 and q["measured"] == 0, (p["measured"], q["measured"])
        assert p["local_experts"] == experts
        for gemm, key in (("fc1", "fc1_us"), ("fc2", "fc2_us")):
            n, k = p[f"{gemm}_n"], p[f"{gemm}_k"]
            per = [float(r["us"]) / int(r["experts"]) for r in rows
                   if r["gemm"] == gemm and int(r["n"]) == n and int(r["k"]) == k]
            assert per, f"{par}: table has no {gemm} row for N={n} K={k}"
            # expected time = sum over active experts of a per-expert time inside the table's range
            lo, hi = p["active_experts"] * min(per), p["active_experts"] * max(per)
            assert lo * (1 - 1e-6) <= p[key] <= hi * (1 + 1e-6), (par, gemm, p[key], lo, hi)
            assert abs(p[key] - q[key]) > 1e-6 * q[key], (par, gemm, "same as the roofline")
        txt = run(cli, *base, "--measured", table).stdout
        assert "(measured)" in txt, txt
    # a model whose shapes the table lacks: exit 2 naming the shape
    r = run(cli, "--model", "deepseek-v3", "--measured", table, want=2)
    assert "N=4096 K=7168" in r.stderr, r.stderr
    # --validate: one CSV line per table row, errors as the ratio they claim to be
    out = run(cli, "--validate", table, "--kernel", "fp4moe", "--csv").stdout
    val = list(csv.DictReader(io.StringIO(out)))
    assert len(val) == len(rows), (len(val), len(rows))
    for v in val:
        rel = (float(v["pred_us"]) - float(v["measured_us"])) / float(v["measured_us"])
        assert abs(rel - float(v["rel_err"])) < 1e-4, v
    med = {}
    for flags in (["--kernel", "fp4moe"], ["--calibrated-h200"]):
        txt = run(cli, "--validate", table, *flags).stdout
        line = [l for l in txt.splitlines() if l.startswith("regime all")]
        assert len(line) == 1, txt
        med[flags[0]] = float(line[0].split("median |err|")[1].split("%")[0])
    assert med["--calibrated-h200"] < med["--kernel"], med
    r = run(cli, "--calibrated-h200", "--gpu", "b200", want=2)
    assert "--calibrated-h200" in r.stderr, r.stderr
    print("ok")


if __name__ == "__main__":
    main()
