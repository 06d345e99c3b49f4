/* probe_tl.h - the per-CTA timeline records of a probe build (FM_PROBE_TIMELINE:
 * fm_mma_probe_timeline's buffer, 4 launch slots of cap CTAs x {sm, start_ns, end_ns})
 * written as the CSV rows bench/probe/timeline.py reads (bench_gemm --timeline,
 * bench_layer --timeline). */
#ifndef FM_BENCH_PROBE_TL_H
#define FM_BENCH_PROBE_TL_H
#include <stdio.h>

static inline void fm_probe_tl_write(FILE *f, const unsigned long long *tl, unsigned cap)
{
    fprintf(f, "launch,cta,sm,start_ns,end_ns\n");
    for (int r = 0; r < 4; r++)
        for (unsigned c = 0; c < cap; c++) {
            const unsigned long long *q = tl + ((size_t)r * cap + c) * 3;
            if (q[1]) fprintf(f, "%d,%u,%llu,%llu,%llu\n", r, c, q[0], q[1], q[2]);
        }
}
#endif
