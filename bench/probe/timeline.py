#!/usr/bin/env python3
"""timeline.py - summarize bench_gemm --timeline CSVs (probe build): per launch, where the
time between two queued launches goes. For each launch: span = first CTA start -> last CTA
end; gap = previous launch's last end -> this launch's first start; ramp = first start ->
the time every SM has its full complement of CTAs; tail = the first SM going idle for good
-> last end; resident CTAs over the span in 8 bins; CTA duration median/p90.
Usage: timeline.py FILE..."""
import csv, statistics, sys


def summarize(path):
    head = open(path).readline().strip()
    rows = [r for r in csv.DictReader(l for l in open(path) if not l.startswith('#'))]
    by = {}
    for r in rows:
        by.setdefault(int(r['launch']), []).append((int(r['sm']), int(r['start_ns']), int(r['end_ns'])))
    print(head)
    prev_end = None
    for l in sorted(by):
        c = by[l]
        t0 = min(s for _, s, _ in c)
        t1 = max(e for _, _, e in c)
        sms = {}
        for sm, s, e in c:
            sms.setdefault(sm, []).append((s, e))
        sm_last = sorted(max(e for _, e in v) for v in sms.values())
        sm_first = sorted(min(s for s, _ in v) for v in sms.values())
        dur = sorted(e - s for _, s, e in c)
        # resident CTAs over time: peak concurrency and the time it is first reached
        ev = sorted([(s, 1) for _, s, _ in c] + [(e, -1) for _, _, e in c])
        cur = peak = 0
        for t, d in ev:
            cur += d
            peak = max(peak, cur)
        cur = 0
        t_full = None
        for t, d in ev:
            cur += d
            if cur == peak and t_full is None:
                t_full = t
        bins = 8
        w = (t1 - t0) / bins
        occ = []
        for b in range(bins):
            a, z = t0 + b * w, t0 + (b + 1) * w
            occ.append(sum(max(0, min(e, z) - max(s, a)) for _, s, e in c) / w)
        gap = (t0 - prev_end) / 1e3 if prev_end else float('nan')
        prev_end = t1
        print(f"  launch {l}: CTAs {len(c)} on {len(sms)} SMs, peak resident {peak}; span {(t1 - t0) / 1e3:.2f} us, "
              f"gap before {gap:.2f} us; all SMs started by {(sm_first[-1] - t0) / 1e3:.2f} us, peak residency at "
              f"{(t_full - t0) / 1e3:.2f} us; first SM idle for good at {(sm_last[0] - t0) / 1e3:.2f} us "
              f"(10 % idle {(sm_last[len(sm_last) // 10] - t0) / 1e3:.2f}, 50 % {(sm_last[len(sm_last) // 2] - t0) / 1e3:.2f}); "
              f"CTA us median {statistics.median(dur) / 1e3:.2f} p10 {dur[len(dur) // 10] / 1e3:.2f} p90 {dur[len(dur) * 9 // 10] / 1e3:.2f}")
        print("    resident CTAs by eighth of the span: " + " ".join(f"{o:.0f}" for o in occ))


for p in sys.argv[1:]:
    summarize(p)
