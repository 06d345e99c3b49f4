/* quantize.c - FP32 <-> NVFP4 / MXFP4 / BF16 matrices (row-major [rows][cols],
 * blocks along cols).
 *
 * NVFP4 follows NVIDIA ModelOpt (NVFP4QTensor), every step in float32 in this
 * order, so that a numpy float32 re-implementation (tests/py) is bit-exact:
 *     g     = amax / 2688                 (6 * 448; or the caller's global; amax == 0 -> 1)
 *     s_b   = E4M3(amax_b / (6 * g))      (saturating at 448)
 *     q_i   = E2M1(x_i / (dec(s_b) * g))  (0 when dec(s_b) * g == 0)
 * MXFP4 follows the OCP MX v1.0 spec: s_b = 2^(floor(log2(amax_b)) - 2)
 * (2 = emax of E2M1), clamped to the UE8M0 range [2^-127, 2^127]; an all-zero
 * block gets 2^-127; q_i = E2M1(x_i / s_b), saturating at ±6.
 *
 * Caller buffers are written only after the whole input has been validated
 * (shapes, pointers, finiteness), so a failing call changes nothing.
 */
#include "fm_internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Validate the view and return its traits; `who` names the caller in messages. */
static fm_status check_view(const char *who, const fm_qtensor *t, const fm_format_traits **tr)
{
    if (!t) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL tensor", who);
    *tr = fm_format_traits_get(t->fmt);
    if (!*tr) return fm_fail(FM_ERR_FORMAT, "%s: unknown format %d", who, (int)t->fmt);
    size_t db, sb;
    fm_status st = fm_qtensor_bytes(t->fmt, t->rows, t->cols, &db, &sb);
    if (st != FM_OK)
        return fm_fail(st, "%s: rows=%lld cols=%lld invalid for %s (cols must be a positive multiple of %d)", who,
                       (long long)t->rows, (long long)t->cols, (*tr)->name, (*tr)->block > 0 ? (*tr)->block : 1);
    if (!t->data) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL data buffer", who);
    if ((*tr)->block > 0 && !t->scales) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL scales buffer", who);
    return FM_OK;
}

static float block_amax(const float *x, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    return m;
}

/* 2^e as the UE8M0 code, e clamped to the representable [-127, 127]. */
static uint8_t mx_scale_code(float amax)
{
    if (amax == 0.0f) return 0; /* 2^-127: the smallest scale; every element is 0 */
    int e2;
    (void)frexpf(amax, &e2); /* amax = f * 2^e2, f in [0.5, 1): floor(log2) = e2 - 1 */
    int e = (e2 - 1) - 2;    /* minus emax(E2M1) = 2 */
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return (uint8_t)(e + 127);
}

static void quant_nvfp4(const float *src, float g, int64_t rows, int64_t cols, uint8_t *data, uint8_t *scales)
{
    const int64_t nb = cols / 16;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * cols;
        uint8_t *q = data + r * (cols / 2);
        for (int64_t b = 0; b < nb; b++) {
            float amax = block_amax(x + b * 16, 16);
            uint8_t sc = fm_e4m3_encode(amax / (6.0f * g));
            scales[r * nb + b] = sc;
            float denom = fm_e4m3_decode(sc) * g;
            for (int i = 0; i < 16; i += 2) {
                float v0 = x[b * 16 + i], v1 = x[b * 16 + i + 1];
                uint8_t c0 = denom != 0.0f ? fm_e2m1_encode(v0 / denom) : 0;
                uint8_t c1 = denom != 0.0f ? fm_e2m1_encode(v1 / denom) : 0;
                q[(b * 16 + i) / 2] = (uint8_t)(c0 | (c1 << 4)); /* low nibble = even column */
            }
        }
    }
}

static void quant_mxfp4(const float *src, int64_t rows, int64_t cols, uint8_t *data, uint8_t *scales)
{
    const int64_t nb = cols / 32;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * cols;
        uint8_t *q = data + r * (cols / 2);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t sc = mx_scale_code(block_amax(x + b * 32, 32));
            scales[r * nb + b] = sc;
            float s = fm_ue8m0_decode(sc);
            for (int i = 0; i < 32; i += 2) {
                uint8_t c0 = fm_e2m1_encode(x[b * 32 + i] / s);
                uint8_t c1 = fm_e2m1_encode(x[b * 32 + i + 1] / s);
                q[(b * 32 + i) / 2] = (uint8_t)(c0 | (c1 << 4));
            }
        }
    }
}

fm_status fm_quantize(const float *src, const float *global_scale_in, fm_qtensor *dst)
{
    fm_clear_error();
    const fm_format_traits *tr;
    FM_CHECK(check_view("fm_quantize", dst, &tr));
    if (!src) return fm_fail(FM_ERR_INVALID_ARG, "fm_quantize: NULL src");
    const int64_t n = dst->rows * dst->cols;

    /* Validate every input value before touching dst. */
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = src[i];
        if (!isfinite(v))
            return fm_fail(FM_ERR_NONFINITE, "fm_quantize: src[%lld][%lld] = %g is not finite",
                           (long long)(i / dst->cols), (long long)(i % dst->cols), (double)v);
        float a = fabsf(v);
        if (a > amax) amax = a;
    }
    if (dst->fmt == FM_FORMAT_BF16 && isinf(fm_bf16_decode(fm_bf16_encode(amax)))) /* >= 0x1.ffp127 */
        return fm_fail(FM_ERR_NONFINITE, "fm_quantize: |x| = %g overflows BF16", (double)amax);

    float g = 1.0f;
    if (dst->fmt == FM_FORMAT_NVFP4) {
        if (global_scale_in) {
            g = *global_scale_in;
            if (!isfinite(g) || !(g >= FLT_MIN))
                return fm_fail(FM_ERR_INVALID_ARG,
                               "fm_quantize: global scale %g must be a finite normal positive float", (double)g);
        } else if (amax > 0.0f) {
            g = amax / (6.0f * 448.0f);
            if (!(g >= FLT_MIN)) g = FLT_MIN; /* keep s_b * g away from 0; amax < 3e-35 only */
        }
    }

    switch (dst->fmt) {
    case FM_FORMAT_BF16: {
        uint16_t *d = dst->data;
        for (int64_t i = 0; i < n; i++) d[i] = fm_bf16_encode(src[i]);
        break;
    }
    case FM_FORMAT_NVFP4: quant_nvfp4(src, g, dst->rows, dst->cols, dst->data, dst->scales); break;
    case FM_FORMAT_MXFP4: quant_mxfp4(src, dst->rows, dst->cols, dst->data, dst->scales); break;
    default: return fm_fail(FM_ERR_FORMAT, "fm_quantize: format %d has no quantizer", (int)dst->fmt);
    }
    dst->global_scale = g;
    return FM_OK;
}

fm_status fm_dequantize(const fm_qtensor *src, float *dst)
{
    fm_clear_error();
    const fm_format_traits *tr;
    FM_CHECK(check_view("fm_dequantize", src, &tr));
    if (!dst) return fm_fail(FM_ERR_INVALID_ARG, "fm_dequantize: NULL dst");
    const int64_t rows = src->rows, cols = src->cols;

    if (src->fmt == FM_FORMAT_BF16) {
        const uint16_t *d = src->data;
        for (int64_t i = 0; i < rows * cols; i++) dst[i] = fm_bf16_decode(d[i]);
        return FM_OK;
    }
    const int block = tr->block;
    const int64_t nb = cols / block;
    const float g = src->fmt == FM_FORMAT_NVFP4 ? src->global_scale : 1.0f;
    if (!isfinite(g))
        return fm_fail(FM_ERR_NONFINITE, "fm_dequantize: global scale %g is not finite", (double)g);
    /* Every scale must decode to a finite value before dst is written. */
    for (int64_t i = 0; i < rows * nb; i++) {
        uint8_t c = src->scales[i];
        int bad = src->fmt == FM_FORMAT_NVFP4 ? (c & 0x7F) == 0x7F : c == 0xFF;
        if (bad)
            return fm_fail(FM_ERR_NONFINITE, "fm_dequantize: scale[%lld][%lld] = 0x%02X decodes to NaN",
                           (long long)(i / nb), (long long)(i % nb), c);
    }
    const uint8_t *q = src->data;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t c = src->scales[r * nb + b];
            float s = src->fmt == FM_FORMAT_NVFP4 ? fm_e4m3_decode(c) : fm_ue8m0_decode(c);
            for (int i = 0; i < block; i++) {
                int64_t k = b * block + i;
                uint8_t byte = q[r * (cols / 2) + k / 2];
                float e = fm_e2m1_decode((k & 1) ? (uint8_t)(byte >> 4) : byte);
                /* e * s is exact (2 x 4 significant bits); one rounding for g. */
                dst[r * cols + k] = (e * s) * g;
            }
        }
    }
    return FM_OK;
}
