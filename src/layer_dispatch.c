/* layer_dispatch.c - the rows an expert-parallel dispatch hands the layer
 * (fm_layer_run_dispatched, include/fp4moe/layer.h): the counts / offsets checks every
 * backend that reads them on the host shares, and the packed order the experts run in.
 * Checked in full before anything is computed, so a bad count never reaches a buffer. */
#include "backend.h"

#include <float.h>

fm_status fm_dispatch_row_f32(const fm_layer_dispatch_args *a, size_t r, int H, int e, const char *who, float *dst)
{
    if (a->x) {
        const uint16_t *xr = a->x + r * (size_t)H;
        for (int i = 0; i < H; i++) {
            if ((xr[i] & 0x7f80u) == 0x7f80u) /* BF16 exponent all ones: Inf or NaN */
                return fm_fail(FM_ERR_NONFINITE, "%s: x row %zu (local expert %d), element %d is NaN or Inf", who, r, e,
                               i);
            dst[i] = fm_bf16_decode(xr[i]);
        }
        return FM_OK;
    }
    const int      nb = (H + 127) / 128;
    const uint8_t *q = a->x_fp8 + r * (size_t)H;
    const float   *sc = a->x_scales + r * (size_t)nb;
    for (int b = 0; b < nb; b++)
        if (!(sc[b] > 0.0f && sc[b] <= FLT_MAX))
            return fm_fail(FM_ERR_NONFINITE, "%s: x_scales row %zu (local expert %d), block %d = %g: a scale must be "
                                             "finite and > 0", who, r, e, b, (double)sc[b]);
    for (int i = 0; i < H; i++) {
        if ((q[i] & 0x7f) == 0x7f)
            return fm_fail(FM_ERR_NONFINITE, "%s: x_fp8 row %zu (local expert %d), element %d is the E4M3 NaN code 0x%02x",
                           who, r, e, i, q[i]);
        dst[i] = fm_e4m3_decode(q[i]) * sc[i / 128];
    }
    return FM_OK;
}

fm_status fm_dispatch_rows(const fm_layer_dispatch_args *a, int n_local, int64_t max_rows, const char *who,
                           int32_t *offsets, int *rows)
{
    int64_t total = 0;
    const int by_caller = a->max_rows > 0 && a->max_rows < max_rows; /* the args' bound is the tighter */
    if (by_caller) max_rows = a->max_rows;
    offsets[0] = 0;
    for (int e = 0; e < n_local; e++) {
        int64_t n;
        if (a->layout == FM_DISPATCH_EXPERT_MAJOR) {
            n = a->counts[e];
            if (n < 0 || n > a->capacity)
                return fm_fail(FM_ERR_BAD_SHAPE, "%s: counts[%d] = %lld outside [0, capacity=%d]", who, e, (long long)n,
                               a->capacity);
        } else {
            if (e == 0 && a->offsets[0] != 0)
                return fm_fail(FM_ERR_BAD_SHAPE, "%s: offsets[0] = %d, must be 0", who, (int)a->offsets[0]);
            n = (int64_t)a->offsets[e + 1] - a->offsets[e];
            if (n < 0)
                return fm_fail(FM_ERR_BAD_SHAPE, "%s: offsets decrease at local expert %d (offsets[%d] = %d > offsets[%d] = %d)",
                               who, e, e, (int)a->offsets[e], e + 1, (int)a->offsets[e + 1]);
        }
        total += n;
        if (total > max_rows)
            return by_caller
                       ? fm_fail(FM_ERR_BAD_SHAPE, "%s: more rows received (%lld by local expert %d) than the args' "
                                                   "max_rows = %lld", who, (long long)total, e, (long long)max_rows)
                       : fm_fail(FM_ERR_BAD_SHAPE, "%s: more rows received (%lld by local expert %d) than the layer "
                                                   "holds (max_tokens x top_k = %lld; create it with a larger "
                                                   "max_tokens)", who, (long long)total, e, (long long)max_rows);
        offsets[e + 1] = (int32_t)total;
    }
    *rows = (int)total;
    return FM_OK;
}
