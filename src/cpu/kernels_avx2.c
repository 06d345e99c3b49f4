/* kernels_avx2.c - the AVX2+FMA kernels (decode and buffered paths), for
 * x86-64 CPUs without AVX-512 (and the AVX-512 path's fallback for BF16 weights
 * with K not a multiple of 16).
 *
 * Register path (M <= 4 rows per expert, FP4): each 16-element chunk is
 * decoded in registers (fm_dec16) and used by one FMA per row and 8 lanes;
 * the weights are streamed from memory once, with a software prefetch ahead.
 * Buffered path (more rows, or BF16): each weight row is decoded once into
 * the per-thread work buffer (K floats, L1/L2 resident) and reused by every
 * group of 4 rows.
 * Two 8-lane accumulators per row (elements k % 16 < 8 and >= 8) are the 16
 * lanes of kernels.c's lane structure, folded the same way.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include "kernels_x86.h"

/* Weight row n of an FP4 matrix against MM (1..4) activation rows, decoded
 * chunk by chunk in registers. MM and CPB (16-element chunks per scale block:
 * 1 for NVFP4, 2 for MXFP4) are compile-time constants after inlining, so the
 * accumulators live in registers and the loop carries only two pointers. */
FM_AVX2_INLINE static void fp4_row_direct(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n, const float *A,
                                          int64_t lda, const int MM, const int CPB, float *Y, int64_t ldy)
{
    const int64_t K = w->cols, nb = K / (16 * CPB);
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * nb;
    const __m128i lut = _mm_loadu_si128((const __m128i *)L->e2m1_x2);
    __m256 acc0[4], acc1[4];
    for (int m = 0; m < MM; m++) acc0[m] = acc1[m] = _mm256_setzero_ps();
    const float *a = A;
    for (int64_t b = 0; b < nb; b++) {
        const __m256 s = _mm256_set1_ps(L->scale[sc[b]]);
        if ((b & (8 / CPB - 1)) == 0) _mm_prefetch((const char *)(q + FM_PREFETCH), _MM_HINT_T0); /* a line per 64 B */
        for (int c = 0; c < CPB; c++, q += 8, a += 16) {
            __m256 f0, f1;
            fm_dec16(q, lut, s, &f0, &f1);
            for (int m = 0; m < MM; m++) {
                acc0[m] = _mm256_fmadd_ps(f0, _mm256_loadu_ps(a + m * lda), acc0[m]);
                acc1[m] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(a + m * lda + 8), acc1[m]);
            }
        }
    }
    for (int m = 0; m < MM; m++) Y[m * ldy + n] = fm_hsum8(_mm256_add_ps(acc0[m], acc1[m])) * w->global_scale;
}

/* All rows [n0, n1) through fp4_row_direct with constant MM and CPB. */
#define FM_DIRECT_CASE(MM, CPB)                                                          \
    for (int64_t n = n0; n < n1; n++) fp4_row_direct(w, L, n, A, lda, MM, CPB, Y, ldy); \
    break

FM_AVX2 static void fp4_direct(const fm_qtensor *w, const fm_cpu_luts *L, int blk, int64_t n0, int64_t n1,
                               const float *A, int64_t lda, int M, float *Y, int64_t ldy)
{
    switch (M * 10 + blk / 16) {
    case 11: FM_DIRECT_CASE(1, 1);
    case 21: FM_DIRECT_CASE(2, 1);
    case 31: FM_DIRECT_CASE(3, 1);
    case 41: FM_DIRECT_CASE(4, 1);
    case 12: FM_DIRECT_CASE(1, 2);
    case 22: FM_DIRECT_CASE(2, 2);
    case 32: FM_DIRECT_CASE(3, 2);
    case 42: FM_DIRECT_CASE(4, 2);
    default: break; /* not reached: M in 1..4, block 16 or 32 */
    }
}
#undef FM_DIRECT_CASE

FM_AVX2 static void decode_row_avx2(const fm_qtensor *w, const fm_cpu_luts *L, int blk, int64_t n, float *row)
{
    const int64_t K = w->cols;
    if (w->fmt == FM_FORMAT_BF16) {
        const uint16_t *d = (const uint16_t *)w->data + n * K;
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(d + k));
            __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16);
            __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16);
            _mm256_storeu_ps(row + k, _mm256_castsi256_ps(lo));
            _mm256_storeu_ps(row + k + 8, _mm256_castsi256_ps(hi));
        }
        for (; k < K; k++) row[k] = fm_bf16_to_f32(d[k]);
        return;
    }
    const int64_t nb = K / blk;
    const int cpb = blk / 16;
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * nb;
    const __m128i lut = _mm_loadu_si128((const __m128i *)L->e2m1_x2);
    for (int64_t b = 0; b < nb; b++) {
        const __m256 s = _mm256_set1_ps(L->scale[sc[b]]);
        for (int c = 0; c < cpb; c++) {
            const int64_t k = (b * cpb + c) * 16;
            __m256 f0, f1;
            fm_dec16(q + k / 2, lut, s, &f0, &f1);
            _mm256_storeu_ps(row + k, f0);
            _mm256_storeu_ps(row + k + 8, f1);
        }
    }
}

/* A decoded row (K floats) against MM (1..4) activation rows. */
FM_AVX2_INLINE static void row_dot(const float *row, int64_t K, float g, int64_t n, const float *A, int64_t lda,
                                   const int MM, float *Y, int64_t ldy)
{
    __m256 acc0[4], acc1[4];
    for (int m = 0; m < MM; m++) acc0[m] = acc1[m] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 f0 = _mm256_loadu_ps(row + k), f1 = _mm256_loadu_ps(row + k + 8);
        for (int m = 0; m < MM; m++) {
            acc0[m] = _mm256_fmadd_ps(f0, _mm256_loadu_ps(A + m * lda + k), acc0[m]);
            acc1[m] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(A + m * lda + k + 8), acc1[m]);
        }
    }
    for (int m = 0; m < MM; m++) {
        float tail = 0.0f;
        for (int64_t j = k; j < K; j++) tail += row[j] * A[m * lda + j];
        Y[m * ldy + n] = (fm_hsum8(_mm256_add_ps(acc0[m], acc1[m])) + tail) * g;
    }
}

FM_AVX2 void fm_cpu_gemm_avx2(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                              int64_t lda, int M, float *Y, int64_t ldy, float *work)
{
    const int blk = fm_cpu_fmt_block(w->fmt);
    const int64_t K = w->cols;
    if (w->fmt != FM_FORMAT_BF16 && M <= 4 && (blk == 16 || blk == 32)) {
        fp4_direct(w, L, blk, n0, n1, A, lda, M, Y, ldy);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        decode_row_avx2(w, L, blk, n, work);
        int m = 0;
        for (; m + 4 <= M; m += 4) row_dot(work, K, w->global_scale, n, A + m * lda, lda, 4, Y + m * ldy, ldy);
        switch (M - m) {
        case 1: row_dot(work, K, w->global_scale, n, A + m * lda, lda, 1, Y + m * ldy, ldy); break;
        case 2: row_dot(work, K, w->global_scale, n, A + m * lda, lda, 2, Y + m * ldy, ldy); break;
        case 3: row_dot(work, K, w->global_scale, n, A + m * lda, lda, 3, Y + m * ldy, ldy); break;
        default: break;
        }
    }
}

#else
typedef int fm_cpu_kernels_avx2_unused; /* ISO C: no empty translation unit */
#endif
