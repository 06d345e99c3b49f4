/* kernels_avx512.c - the AVX-512 kernels' entry point and decode regime.
 *
 * Per 16 FP4 elements: movq, shift, interleave, zero-extend to 16 dwords, one
 * vpermps into the 2*E2M1 table pre-multiplied by the block scale
 * (fm_dec16_512), then one FMA per activation row: ~30 % fewer instructions
 * per weight byte than the AVX2 decoder, so a core keeps up with its share of
 * DRAM bandwidth. With M <= FM_DIRECT512_MAX_M rows per expert the decoded
 * chunk stays in registers and the weights are streamed once; with more rows
 * (or BF16 weights) the prefill kernel (kernels_prefill512.c) takes over. The
 * table holds the same exact products as the AVX2 path and the 16 lanes fold
 * like its two 8-lane accumulators, so the results match it bit for bit.
 */
#if defined(__x86_64__) && defined(__GNUC__)
#include "kernels_x86.h"

/* Measured (one core, K = 6144): the register path wins up to 3 rows; from 4
 * the panel kernel's one decode per weight row and wider reuse win. */
#define FM_DIRECT512_MAX_M 3

/* Weight row n against MM rows; MM and CPB (16-element chunks per scale
 * block: 1 NVFP4, 2 MXFP4) are constants after inlining. */
FM_AVX512_INLINE static void fp4_row_direct512(const fm_qtensor *w, const fm_cpu_luts *L, __m512 table, int64_t n,
                                               const float *A, int64_t lda, const int MM, const int CPB, float *Y,
                                               int64_t ldy)
{
    const int64_t K = w->cols, nb = K / (16 * CPB);
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * nb;
    __m512 acc[FM_DIRECT512_MAX_M];
    for (int m = 0; m < MM; m++) acc[m] = _mm512_setzero_ps();
    const float *a = A;
    for (int64_t b = 0; b < nb; b++) {
        const __m512 ts = _mm512_mul_ps(table, _mm512_set1_ps(L->scale[sc[b]]));
        if ((b & (8 / CPB - 1)) == 0) _mm_prefetch((const char *)(q + FM_PREFETCH), _MM_HINT_T0); /* a line per 64 B */
        for (int c = 0; c < CPB; c++, q += 8, a += 16) {
            const __m512 f = fm_dec16_512(q, ts);
            for (int m = 0; m < MM; m++) acc[m] = _mm512_fmadd_ps(f, _mm512_loadu_ps(a + m * lda), acc[m]);
        }
    }
    for (int m = 0; m < MM; m++) Y[m * ldy + n] = fm_hsum16(acc[m]) * w->global_scale;
}

#define FM_DIRECT512_CASE(MM, CPB)                                                                    \
    case MM * 10 + CPB:                                                                               \
        for (int64_t n = n0; n < n1; n++) fp4_row_direct512(w, L, table, n, A, lda, MM, CPB, Y, ldy); \
        break

FM_AVX512 void fm_cpu_gemm_avx512(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                                  int64_t lda, int M, float *Y, int64_t ldy, float *work)
{
    const int blk = fm_cpu_fmt_block(w->fmt);
    if ((w->fmt == FM_FORMAT_BF16 || M > FM_DIRECT512_MAX_M) && w->cols % 16 == 0) {
        fm_cpu_prefill512(w, L, n0, n1, A, lda, M, Y, ldy, work);
        return;
    }
    if (w->fmt == FM_FORMAT_BF16 || M > FM_DIRECT512_MAX_M || (blk != 16 && blk != 32)) {
        fm_cpu_gemm_avx2(w, L, n0, n1, A, lda, M, Y, ldy, work); /* K not a multiple of 16 (BF16 only) */
        return;
    }
    const __m512 table = fm_e2m1_table512(L);
    switch (M * 10 + blk / 16) {
        FM_DIRECT512_CASE(1, 1); FM_DIRECT512_CASE(2, 1); FM_DIRECT512_CASE(3, 1);
        FM_DIRECT512_CASE(1, 2); FM_DIRECT512_CASE(2, 2); FM_DIRECT512_CASE(3, 2);
    default: break; /* not reached: M in 1..3, block 16 or 32 */
    }
}
#undef FM_DIRECT512_CASE
#else
typedef int fm_cpu_kernels_avx512_unused; /* ISO C: no empty translation unit */
#endif
