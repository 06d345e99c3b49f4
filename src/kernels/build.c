/* build.c - the questions asked of the build table (fm_build.h). */
#include <stdio.h>
#include <string.h>

#include "kernels/fm_build.h"
#include "kernels/fm_targets.h"

void fm_build_targets_for(int cc, unsigned *sass, unsigned *ptx)
{
    *sass = *ptx = 0;
    for (int i = 0; i < fm_build_n_targets; i++) {
        fm_target t;
        if (fm_target_from(fm_build_target_names[i] + (strncmp(fm_build_target_names[i], "sm_", 3) ? 0 : 3), &t))
            continue;
        if (cc < t.cc_lo || cc > t.cc_hi) continue;
        if (t.ptx) *ptx |= 1u << i;
        else *sass |= 1u << i;
    }
}

void fm_build_rows_for(int cc, unsigned long long *mma_rows, unsigned long long *wgmma_rows)
{
    unsigned sass, ptx;
    fm_build_targets_for(cc, &sass, &ptx);
    unsigned use = sass ? sass : ptx;
    *mma_rows = *wgmma_rows = 0;
    for (int r = 0; r < fm_build_n_mma && r < 64; r++)
        if (fm_build_mma_targets[r] & use) *mma_rows |= 1ull << r;
    for (int r = 0; r < fm_build_n_wgmma && r < 64; r++)
        if (fm_build_wgmma_targets[r] & use) *wgmma_rows |= 1ull << r;
}

const char *fm_build_targets_str(char *buf, unsigned long n)
{
    size_t o = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < fm_build_n_targets && o < n; i++) {
        int k = snprintf(buf + o, n - o, "%s%s", i ? " " : "", fm_build_target_names[i]);
        if (k < 0) break;
        o += (size_t)k;
    }
    return buf;
}

#include "fp4moe/layer.h"
const char *fm_cuda_build_targets(void) { return fm_build_targets_string; }
