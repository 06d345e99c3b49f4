/* quantize.c - FP32 <-> NVFP4 / MXFP4 / BF16 matrices (row-major [rows][cols],
 * blocks along cols).
 *
 * NVFP4 follows NVIDIA ModelOpt (NVFP4QTensor), every step in float32 in this
 * order, so that a numpy float32 re-implementation (tests/py) is bit-exact:
 *     g     = amax / 2688                 (6 * 448; or the caller's global; amax == 0 -> 1)
 *             (a caller's g must be normal, with 6 * 448 * g finite: <= FLT_MAX / 2688)
 *     s_b   = E4M3(amax_b / (6 * g))      (saturating at 448)
 *     q_i   = E2M1(x_i / (dec(s_b) * g))  (0 when dec(s_b) * g == 0)
 * MXFP4 follows the OCP MX v1.0 spec: s_b = 2^(floor(log2(amax_b)) - 2)
 * (2 = emax of E2M1), clamped to the UE8M0 range [2^-127, 2^127]; an all-zero
 * block gets 2^-127; q_i = E2M1(x_i / s_b), saturating at ±6.
 *
 * Caller buffers are written only after the whole input has been validated
 * (shapes, pointers, finiteness), so a failing call changes nothing.
 */
#include "format/e2m1_inline.h"
#include "format/format_internal.h"

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
        return fm_fail(st, "%s: rows=%lld cols=%lld invalid for %s (cols must be a positive multiple of %d): %s",
                       who, (long long)t->rows, (long long)t->cols, (*tr)->name, (*tr)->block > 0 ? (*tr)->block : 1,
                       fm_last_error());
    if (!t->data) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL data buffer", who);
    if ((*tr)->block > 0 && !t->scales) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL scales buffer", who);
    return FM_OK;
}

/* Rows are independent: split them over OpenMP threads once a matrix is big
 * enough to pay for the fork (the CLI quantizes ~10^9 weights at start-up).
 * Uses the enclosing function's `rows` and `cols`. */
#ifdef _OPENMP
#define FM_OMP_ROWS _Pragma("omp parallel for schedule(static) if (rows * cols >= (1 << 18))")
#else
#define FM_OMP_ROWS
#endif

/* Largest |x| as float32 bits.  For |x| (sign cleared) the integer order of
 * the bit patterns is the float order, and Inf/NaN sort above every finite
 * value (>= 0x7F800000), so one integer max reduction, which vectorizes,
 * gives both the amax and the non-finite check. */
static uint32_t abs_bits_max(const float *x, int64_t n)
{
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u &= 0x7FFFFFFFu;
        m = u > m ? u : m;
    }
    return m;
}

static float block_amax(const float *x, int n)
{
    uint32_t m = abs_bits_max(x, n);
    float a;
    memcpy(&a, &m, sizeof a);
    return a;
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

/* E2M1-encode n (a multiple of 2, at most 32) values x[i] / d and pack them,
 * low nibble first.  Plain loops over a fixed-size buffer so the compiler can
 * vectorize the division and the branch-free encoder. */
static void encode_block(const float *x, int n, float d, uint8_t *q)
{
    uint8_t c[32];
    for (int i = 0; i < n; i++) c[i] = fm_e2m1_encode_inl(x[i] / d);
    for (int i = 0; i < n / 2; i++) q[i] = (uint8_t)(c[2 * i] | (c[2 * i + 1] << 4)); /* low nibble = even column */
}

static void quant_nvfp4(const float *src, float g, int64_t rows, int64_t cols, uint8_t *data, uint8_t *scales)
{
    const int64_t nb = cols / 16;
    const float six_g = 6.0f * g;
    FM_OMP_ROWS
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * cols;
        uint8_t *q = data + r * (cols / 2);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t sc = fm_e4m3_encode(block_amax(x + b * 16, 16) / six_g);
            scales[r * nb + b] = sc;
            float denom = fm_e4m3_decode(sc) * g;
            if (denom != 0.0f)
                encode_block(x + b * 16, 16, denom, q + b * 8);
            else
                memset(q + b * 8, 0, 8); /* scale 0: the whole block is 0 */
        }
    }
}

static void quant_mxfp4(const float *src, int64_t rows, int64_t cols, uint8_t *data, uint8_t *scales)
{
    const int64_t nb = cols / 32;
    FM_OMP_ROWS
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * cols;
        uint8_t *q = data + r * (cols / 2);
        for (int64_t b = 0; b < nb; b++) {
            uint8_t sc = mx_scale_code(block_amax(x + b * 32, 32));
            scales[r * nb + b] = sc;
            encode_block(x + b * 32, 32, fm_ue8m0_decode(sc), q + b * 16); /* exact: a power of two */
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
    uint32_t mbits = abs_bits_max(src, n);
    if (mbits >= 0x7F800000u) { /* some NaN/Inf: find the first for the message */
        int64_t i = 0;
        while (isfinite(src[i])) i++;
        return fm_fail(FM_ERR_NONFINITE, "fm_quantize: src[%lld][%lld] = %g is not finite",
                       (long long)(i / dst->cols), (long long)(i % dst->cols), (double)src[i]);
    }
    float amax;
    memcpy(&amax, &mbits, sizeof amax);
    if (dst->fmt == FM_FORMAT_BF16 && isinf(fm_bf16_decode(fm_bf16_encode(amax)))) /* >= 0x1.ffp127 */
        return fm_fail(FM_ERR_NONFINITE, "fm_quantize: |x| = %g overflows BF16", (double)amax);

    float g = 1.0f;
    if (dst->fmt == FM_FORMAT_NVFP4) {
        if (global_scale_in) {
            g = *global_scale_in;
            /* The largest value the tensor can hold is 6 x 448 x g (E2M1 max x
             * E4M3 max), computed as fm_dequantize does: if that overflows, a
             * block near the data's amax can decode to Inf (amax 3.3e38 with
             * g = 1.28e35 did, with FM_OK); above FLT_MAX / 6 even 6 * g is Inf
             * and every block silently quantizes to zero. */
            if (!isfinite(g) || !(g >= FLT_MIN) || !isfinite((6.0f * 448.0f) * g))
                return fm_fail(FM_ERR_INVALID_ARG,
                               "fm_quantize: global scale %g must be a normal positive float with 6 x 448 x scale "
                               "finite, i.e. in [%g, %g]",
                               (double)g, (double)FLT_MIN, (double)(FLT_MAX / 2688.0f));
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
    /* Every scale must decode to a finite value, and every element too, before dst is written. */
    FM_CHECK(fm_scales_check_codes("fm_dequantize", tr->scale_type, src->scales, rows, nb));
    FM_CHECK(fm_qtensor_check_finite("fm_dequantize", src));
    const uint8_t *q = src->data;
    FM_OMP_ROWS
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t c = src->scales[r * nb + b];
            float s = src->fmt == FM_FORMAT_NVFP4 ? fm_e4m3_decode(c) : fm_ue8m0_decode(c);
            /* e2m1 * s is exact (2 x 4 significant bits): a 16-entry table per
             * block, then one rounding for the global scale. */
            float lut[16];
            for (int i = 0; i < 16; i++) lut[i] = fm_e2m1_decode((uint8_t)i) * s;
            const uint8_t *qb = q + r * (cols / 2) + b * (block / 2);
            float *d = dst + r * cols + b * block;
            for (int i = 0; i < block / 2; i++) {
                d[2 * i] = lut[qb[i] & 0xF] * g;
                d[2 * i + 1] = lut[qb[i] >> 4] * g;
            }
        }
    }
    return FM_OK;
}
