/* scales.c - the checks every consumer of outside scales runs (see
 * format_internal.h for why they are in one place): the NaN block-scale scan
 * and the overflow check of the decoded values; and the re-encoding of a w13's
 * two globals to one (fm_w13_one_global).
 */
#include "format/format_internal.h"

#include <math.h>
#include <string.h>

fm_status fm_scales_check_codes(const char *who, fm_scale_type st, const uint8_t *s, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0 || st == FM_SCALE_NONE) return FM_OK;
    const int64_t n = rows * cols;
    int64_t i = 0;
    while (i < n && !fm_scale_code_is_nan(st, s[i])) i++;
    if (i == n) return FM_OK;
    return fm_fail(FM_ERR_NONFINITE, "%s%sblock scale [%lld][%lld] = 0x%02X decodes to NaN", who ? who : "",
                   who ? ": " : "", (long long)(i / cols), (long long)(i % cols), s[i]);
}

/* The largest-magnitude non-NaN scale code: for both scale types the
 * magnitude grows with the code (E4M3: with its low 7 bits). */
static uint8_t max_scale_code(fm_scale_type st, const uint8_t *s, int64_t n)
{
    uint8_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint8_t c = st == FM_SCALE_E4M3 ? (uint8_t)(s[i] & 0x7Fu) : s[i];
        if (!fm_scale_code_is_nan(st, c) && c > m) m = c;
    }
    return m;
}

static float scale_value(fm_scale_type st, uint8_t c)
{
    return st == FM_SCALE_E4M3 ? fm_e4m3_decode(c) : fm_ue8m0_decode(c);
}

fm_status fm_qtensor_check_finite(const char *who, const fm_qtensor *t)
{
    const fm_format_traits *tr = fm_format_traits_get(t->fmt);
    if (!tr || tr->scale_type == FM_SCALE_NONE || t->rows <= 0 || t->cols <= 0) return FM_OK;
    const fm_scale_type st = tr->scale_type;
    const int block = tr->block;
    const int64_t nb = t->cols / block;
    const float g = t->fmt == FM_FORMAT_NVFP4 ? t->global_scale : 1.0f;
    /* Fast path: if 6 x the largest block scale x g is finite, so is every element. */
    if (isfinite((6.0f * scale_value(st, max_scale_code(st, t->scales, t->rows * nb))) * g)) return FM_OK;
    const uint8_t *q = t->data;
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t c = t->scales[r * nb + b];
            if (fm_scale_code_is_nan(st, c)) continue;
            float s = scale_value(st, c);
            if (isfinite((6.0f * s) * g)) continue;
            const uint8_t *qb = q + r * (t->cols / 2) + b * (block / 2);
            for (int i = 0; i < block; i++) {
                float e = fm_e2m1_decode((uint8_t)(i & 1 ? qb[i / 2] >> 4 : qb[i / 2] & 0xF));
                if (isfinite((e * s) * g)) continue;
                return fm_fail(FM_ERR_NONFINITE,
                               "%s%selement [%lld][%lld] = (%g x block scale %g) x global scale %g overflows FP32",
                               who ? who : "", who ? ": " : "", (long long)r, (long long)(b * block + i), (double)e,
                               (double)s, (double)g);
            }
        }
    return FM_OK;
}

void fm_w13_one_global(const fm_qtensor *w13, float g_up, uint8_t *scales_out, fm_qtensor *out)
{
    const float  g_gate = w13->global_scale, g = g_gate > g_up ? g_gate : g_up;
    const size_t half = (size_t)(w13->rows / 2) * (size_t)(w13->cols / 16); /* scale bytes per half */
    for (int h = 0; h < 2; h++) {
        const uint8_t *src = w13->scales + h * half;
        uint8_t       *dst = scales_out + h * half;
        const float    gh = h ? g_up : g_gate;
        if (gh == g) {
            if (dst != src) memcpy(dst, src, half);
            continue;
        }
        const float ratio = gh / g; /* < 1: this half had the smaller global */
        for (size_t i = 0; i < half; i++) dst[i] = fm_e4m3_encode(fm_e4m3_decode(src[i]) * ratio);
    }
    *out = *w13;
    out->scales = scales_out;
    out->global_scale = g;
}
