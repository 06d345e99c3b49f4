/* kernels.c - the fast path's GEMM kernels, common part: lookup tables, the
 * portable scalar kernel, and the run-time choice of ISA. The kernels multiply
 * many activation rows by one weight matrix stored as NVFP4, MXFP4 or BF16.
 *
 * Two regimes (per expert, M = rows routed to it):
 *  - decode (M <= 3 on AVX-512, <= 4 on AVX2): memory-bound. Each weight byte
 *    is read once and decoded in registers faster than DRAM delivers it
 *    (kernels_avx2.c, kernels_avx512.c).
 *  - prefill (larger M): compute-bound. A panel of weight rows is dequantized
 *    once into an L2-resident FP32 buffer and a register-blocked micro-kernel
 *    runs over it in K blocks that stay in L1 (kernels_prefill512.c).
 * Decoding: per 16-element chunk, split nibbles, look 2*E2M1 up (an integer:
 * 0,1,2,3,4,6,8,12 and negatives), times 0.5*block_scale from a 256-entry
 * table built from the format codecs; every product is exact in FP32. The
 * global scale multiplies the final sum.
 * Lane structure (all paths): lane l of the accumulator sums elements k with
 * k % 16 == l, in K order, with FMA; the 16 lanes are folded by a fixed tree
 * (l + l+8, then (0+4, 2+6) + (1+5, 3+7)). So every output is the same
 * whatever M, the SIMD path or the thread that computes it (the scalar path
 * keeps the lanes but multiplies and adds separately: last-bit differences).
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

void fm_cpu_luts_init(fm_cpu_luts *L, fm_format f)
{
    for (int c = 0; c < 16; c++) L->e2m1_x2[c] = (int8_t)(2.0f * fm_e2m1_decode((uint8_t)c));
    for (int c = 0; c < 256; c++) {
        float s = 1.0f;
        if (f == FM_FORMAT_NVFP4) s = fm_e4m3_decode((uint8_t)c);
        if (f == FM_FORMAT_MXFP4) s = fm_ue8m0_decode((uint8_t)c);
        L->scale[c] = 0.5f * s; /* exact: a power-of-two step */
    }
}

int fm_cpu_fmt_block(fm_format f)
{
    const fm_format_traits *tr = fm_format_traits_get(f);
    return tr && tr->block ? tr->block : 1;
}

static float bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16; /* BF16 is the top half of an FP32 */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void decode_row_scalar(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n, float *row)
{
    const int64_t K = w->cols;
    if (w->fmt == FM_FORMAT_BF16) {
        const uint16_t *d = (const uint16_t *)w->data + n * K;
        for (int64_t k = 0; k < K; k++) row[k] = bf16_f32(d[k]);
        return;
    }
    const int blk = fm_cpu_fmt_block(w->fmt);
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * (K / blk);
    for (int64_t k = 0; k < K; k += 2) {
        float s = L->scale[sc[k / blk]];
        row[k] = (float)L->e2m1_x2[q[k / 2] & 15] * s;
        row[k + 1] = (float)L->e2m1_x2[q[k / 2] >> 4] * s;
    }
}

void fm_cpu_gemm_scalar(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                        int64_t lda, int M, float *Y, int64_t ldy, float *work)
{
    const int64_t K = w->cols;
    for (int64_t n = n0; n < n1; n++) {
        decode_row_scalar(w, L, n, work);
        for (int m = 0; m < M; m++) {
            const float *a = A + m * lda;
            float lane[16] = {0}; /* the lane structure of the vector paths */
            int64_t k = 0;
            for (; k + 16 <= K; k += 16)
                for (int l = 0; l < 16; l++) lane[l] += work[k + l] * a[k + l];
            float tail = 0.0f;
            for (; k < K; k++) tail += work[k] * a[k];
            float s8[8];
            for (int l = 0; l < 8; l++) s8[l] = lane[l] + lane[l + 8];
            float sum = ((s8[0] + s8[4]) + (s8[2] + s8[6])) + ((s8[1] + s8[5]) + (s8[3] + s8[7]));
            Y[m * ldy + n] = (sum + tail) * w->global_scale;
        }
    }
}

fm_cpu_gemm_fn fm_cpu_gemm_select(const char **name)
{
    const char *isa = getenv("FM_CPU_ISA");
    int want_scalar = isa && strcmp(isa, "scalar") == 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int want_avx2 = isa && strcmp(isa, "avx2") == 0;
    if (!want_scalar && !want_avx2 && __builtin_cpu_supports("avx512f")) {
        if (name) *name = "avx512";
        return fm_cpu_gemm_avx512;
    }
    if (!want_scalar && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        if (name) *name = "avx2";
        return fm_cpu_gemm_avx2;
    }
#endif
    (void)want_scalar;
    if (name) *name = "scalar";
    return fm_cpu_gemm_scalar;
}
