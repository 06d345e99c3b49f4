/* kernels.c - the fast path's GEMM kernels: many activation rows times one
 * weight matrix stored as NVFP4, MXFP4 or BF16, without ever materialising the
 * dequantized matrix.
 *
 * Decode (1-4 tokens) is memory-bound: each weight byte must be read once and
 * decoded faster than DRAM delivers it. Per 16-element chunk (8 bytes):
 *   movq 8 bytes -> split nibbles (and / shift) -> interleave lo,hi (element
 *   order: the low nibble is the even column) -> pshufb through a 16-entry
 *   table of 2*E2M1 (all integers: 0,1,2,3,4,6,8,12 and negatives) ->
 *   sign-extend to 2x8 int32 -> float -> times 0.5*block_scale (one 256-entry
 *   table per scale type, built from the format codecs)
 * then one FMA per activation row and 8 lanes. The global scale multiplies the
 * final sum. With M <= 4 rows the decoded chunk stays in registers ("direct");
 * with more rows the row is decoded once into a per-thread buffer (K floats,
 * L1/L2 resident) and reused by every group of 4 rows ("buffered"), so the
 * weights are still streamed from memory once.
 * Lane structure: lane l of two accumulators sums elements k with k % 16 == l
 * (and l+8), in K order, folded by a fixed tree: every output is the same
 * whatever M, the path or the thread that computes it.
 * AVX-512 (where present) replaces the int8 table + convert by one vpermps
 * into a 16-float table pre-scaled per block, ~30 % fewer instructions per
 * byte, and keeps up to 8 rows in registers; beyond 8 rows (prefill) a
 * register-blocked 4 weight rows x 6 activation rows kernel takes over.
 * The SIMD code is compiled with target attributes and chosen at run time
 * (__builtin_cpu_supports), so the library needs no -march flag; the scalar
 * path is the portable fallback.
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define FM_X86 1
#include <immintrin.h>
#endif

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

static int fmt_block(fm_format f)
{
    const fm_format_traits *tr = fm_format_traits_get(f);
    return tr && tr->block ? tr->block : 1;
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16; /* BF16 is the top half of an FP32 */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- portable path ---------------------------------------------------------- */

static void decode_row_scalar(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n, float *row)
{
    const int64_t K = w->cols;
    if (w->fmt == FM_FORMAT_BF16) {
        const uint16_t *d = (const uint16_t *)w->data + n * K;
        for (int64_t k = 0; k < K; k++) row[k] = bf16_to_f32(d[k]);
        return;
    }
    const int blk = fmt_block(w->fmt);
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * (K / blk);
    for (int64_t k = 0; k < K; k += 2) {
        float s = L->scale[sc[k / blk]];
        row[k] = (float)L->e2m1_x2[q[k / 2] & 15] * s;
        row[k + 1] = (float)L->e2m1_x2[q[k / 2] >> 4] * s;
    }
}

static void gemm_scalar(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                        int64_t lda, int M, float *Y, int64_t ldy, float *rowbuf)
{
    const int64_t K = w->cols;
    for (int64_t n = n0; n < n1; n++) {
        decode_row_scalar(w, L, n, rowbuf);
        for (int m = 0; m < M; m++) {
            const float *a = A + m * lda;
            float lane[16] = {0}; /* the lane structure of the vector path */
            int64_t k = 0;
            for (; k + 16 <= K; k += 16)
                for (int l = 0; l < 16; l++) lane[l] += rowbuf[k + l] * a[k + l];
            float tail = 0.0f;
            for (; k < K; k++) tail += rowbuf[k] * a[k];
            float s8[8];
            for (int l = 0; l < 8; l++) s8[l] = lane[l] + lane[l + 8];
            float sum = ((s8[0] + s8[4]) + (s8[2] + s8[6])) + ((s8[1] + s8[5]) + (s8[3] + s8[7]));
            Y[m * ldy + n] = (sum + tail) * w->global_scale;
        }
    }
}

/* ---- AVX2 + FMA path -------------------------------------------------------- */
#ifdef FM_X86
#define FM_AVX2 __attribute__((target("avx2,fma")))
#define FM_PREFETCH 1024 /* bytes ahead in the weight stream: ~16 lines covers DRAM latency */
#define FM_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

/* Fixed fold of 8 lanes: (0+4, 2+6) + (1+5, 3+7), as gemm_scalar does. */
FM_AVX2_INLINE static float hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l + (l+4) */
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));                                         /* (0+4)+(2+6), (1+5)+(3+7) */
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* 16 E2M1 codes from 8 bytes -> two vectors of 8 floats, times s. */
FM_AVX2_INLINE static void dec16(const uint8_t *q, __m128i lut, __m256 s, __m256 *f0, __m256 *f1)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadl_epi64((const __m128i *)q);
    __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
    __m128i v = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    *f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), s);
    *f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), s);
}

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
            dec16(q, lut, s, &f0, &f1);
            for (int m = 0; m < MM; m++) {
                acc0[m] = _mm256_fmadd_ps(f0, _mm256_loadu_ps(a + m * lda), acc0[m]);
                acc1[m] = _mm256_fmadd_ps(f1, _mm256_loadu_ps(a + m * lda + 8), acc1[m]);
            }
        }
    }
    for (int m = 0; m < MM; m++) Y[m * ldy + n] = hsum8(_mm256_add_ps(acc0[m], acc1[m])) * w->global_scale;
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
        for (; k < K; k++) row[k] = bf16_to_f32(d[k]);
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
            dec16(q + k / 2, lut, s, &f0, &f1);
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
        Y[m * ldy + n] = (hsum8(_mm256_add_ps(acc0[m], acc1[m])) + tail) * g;
    }
}

FM_AVX2 static void gemm_avx2(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                              int64_t lda, int M, float *Y, int64_t ldy, float *rowbuf)
{
    const int blk = fmt_block(w->fmt);
    const int64_t K = w->cols;
    if (w->fmt != FM_FORMAT_BF16 && M <= 4 && (blk == 16 || blk == 32)) {
        fp4_direct(w, L, blk, n0, n1, A, lda, M, Y, ldy);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        decode_row_avx2(w, L, blk, n, rowbuf);
        int m = 0;
        for (; m + 4 <= M; m += 4) row_dot(rowbuf, K, w->global_scale, n, A + m * lda, lda, 4, Y + m * ldy, ldy);
        switch (M - m) {
        case 1: row_dot(rowbuf, K, w->global_scale, n, A + m * lda, lda, 1, Y + m * ldy, ldy); break;
        case 2: row_dot(rowbuf, K, w->global_scale, n, A + m * lda, lda, 2, Y + m * ldy, ldy); break;
        case 3: row_dot(rowbuf, K, w->global_scale, n, A + m * lda, lda, 3, Y + m * ldy, ldy); break;
        default: break;
        }
    }
}

/* ---- AVX-512 path -------------------------------------------------------------
 * vpermps looks a 16-entry float table up with the low 4 bits of each 32-bit
 * index, so per 16 elements: movq, shift, interleave (the high bits left in
 * each byte are ignored by the lookup), zero-extend to 16 dwords, one vpermps
 * into a table pre-multiplied by the block scale, and one FMA per row. The
 * table holds 2*E2M1 times 0.5*scale, the same products as the AVX2 path, and
 * the 16 lanes fold exactly like its two 8-lane accumulators, so the results
 * match the AVX2 path bit for bit. */
#define FM_DIRECT512_MAX_M 3 /* rows up to which the register path is used */
#define FM_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define FM_AVX512_INLINE __attribute__((target("avx512f,avx2,fma"), always_inline)) inline

FM_AVX512_INLINE static float hsum16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi)); /* lane l + lane l+8, then the AVX2 fold */
}

FM_AVX512_INLINE static void fp4_row_direct512(const fm_qtensor *w, const fm_cpu_luts *L, __m512 table, int64_t n,
                                               const float *A, int64_t lda, const int MM, const int CPB, float *Y,
                                               int64_t ldy)
{
    const int64_t K = w->cols, nb = K / (16 * CPB);
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * nb;
    __m512 acc[8];
    for (int m = 0; m < MM; m++) acc[m] = _mm512_setzero_ps();
    const float *a = A;
    for (int64_t b = 0; b < nb; b++) {
        const __m512 ts = _mm512_mul_ps(table, _mm512_set1_ps(L->scale[sc[b]]));
        if ((b & (8 / CPB - 1)) == 0) _mm_prefetch((const char *)(q + FM_PREFETCH), _MM_HINT_T0);
        for (int c = 0; c < CPB; c++, q += 8, a += 16) {
            __m128i v = _mm_loadl_epi64((const __m128i *)q);
            __m128i codes = _mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4));
            __m512 f = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), ts);
            for (int m = 0; m < MM; m++) acc[m] = _mm512_fmadd_ps(f, _mm512_loadu_ps(a + m * lda), acc[m]);
        }
    }
    for (int m = 0; m < MM; m++) Y[m * ldy + n] = hsum16(acc[m]) * w->global_scale;
}

/* One FP4 weight row decoded (block scales applied) into row[K], the AVX-512
 * way; same values as decode_row_avx2. BF16 goes through the AVX2 decoder. */
FM_AVX512 static void decode_row512(const fm_qtensor *w, const fm_cpu_luts *L, __m512 table, int blk, int64_t n,
                                    float *row)
{
    if (w->fmt == FM_FORMAT_BF16) {
        decode_row_avx2(w, L, blk, n, row);
        return;
    }
    const int64_t K = w->cols, nb = K / blk;
    const int cpb = blk / 16;
    const uint8_t *q = (const uint8_t *)w->data + n * (K / 2), *sc = w->scales + n * nb;
    for (int64_t b = 0; b < nb; b++) {
        const __m512 ts = _mm512_mul_ps(table, _mm512_set1_ps(L->scale[sc[b]]));
        if ((b & (8 / cpb - 1)) == 0) _mm_prefetch((const char *)(q + FM_PREFETCH), _MM_HINT_T0);
        for (int c = 0; c < cpb; c++, q += 8, row += 16) {
            __m128i v = _mm_loadl_epi64((const __m128i *)q);
            __m128i codes = _mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4));
            _mm512_storeu_ps(row, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), ts));
        }
    }
}

/* Register-blocked product for many rows (prefill, M > 8), where decode is
 * no longer the cost: 4 weight rows, decoded once into rowbuf, times MR <= 6
 * activation rows, 24 accumulators; per 16 elements 4 + MR loads feed 4*MR
 * FMAs, so the FMA units, not the loads, set the pace. Missing weight rows
 * (n1 - n < 4) alias row 0 and are not stored. */
FM_AVX512_INLINE static void micro512(const float *const rb[4], int64_t K, const float *A, int64_t lda, const int MR,
                                      int nr, float g, float *Y, int64_t ldy)
{
    __m512 acc[6][4];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < 4; r++) acc[i][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        const __m512 w0 = _mm512_loadu_ps(rb[0] + k), w1 = _mm512_loadu_ps(rb[1] + k);
        const __m512 w2 = _mm512_loadu_ps(rb[2] + k), w3 = _mm512_loadu_ps(rb[3] + k);
        for (int i = 0; i < MR; i++) {
            const __m512 a = _mm512_loadu_ps(A + i * lda + k);
            acc[i][0] = _mm512_fmadd_ps(w0, a, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(w1, a, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(w2, a, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(w3, a, acc[i][3]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < nr; r++) Y[i * ldy + r] = hsum16(acc[i][r]) * g;
}

FM_AVX512 static void gemm_blocked512(const fm_qtensor *w, const fm_cpu_luts *L, __m512 table, int64_t n0,
                                      int64_t n1, const float *A, int64_t lda, int M, float *Y, int64_t ldy,
                                      float *rowbuf)
{
    const int blk = fmt_block(w->fmt);
    const int64_t K = w->cols;
    for (int64_t n = n0; n < n1; n += 4) {
        const int nr = n1 - n < 4 ? (int)(n1 - n) : 4;
        const float *rb[4];
        for (int r = 0; r < 4; r++) {
            rb[r] = rowbuf + (r < nr ? r : 0) * K;
            if (r < nr) decode_row512(w, L, table, blk, n + r, rowbuf + r * K);
        }
        for (int m = 0; m < M; m += 6) {
            const float *a = A + m * lda;
            float *y = Y + m * ldy + n;
            switch (M - m < 6 ? M - m : 6) {
            case 1: micro512(rb, K, a, lda, 1, nr, w->global_scale, y, ldy); break;
            case 2: micro512(rb, K, a, lda, 2, nr, w->global_scale, y, ldy); break;
            case 3: micro512(rb, K, a, lda, 3, nr, w->global_scale, y, ldy); break;
            case 4: micro512(rb, K, a, lda, 4, nr, w->global_scale, y, ldy); break;
            case 5: micro512(rb, K, a, lda, 5, nr, w->global_scale, y, ldy); break;
            default: micro512(rb, K, a, lda, 6, nr, w->global_scale, y, ldy); break;
            }
        }
    }
}

#define FM_DIRECT512_CASE(MM, CPB)                                                                    \
    case MM * 10 + CPB:                                                                               \
        for (int64_t n = n0; n < n1; n++) fp4_row_direct512(w, L, table, n, A, lda, MM, CPB, Y, ldy); \
        break

FM_AVX512 static void gemm_avx512(const fm_qtensor *w, const fm_cpu_luts *L, int64_t n0, int64_t n1, const float *A,
                                  int64_t lda, int M, float *Y, int64_t ldy, float *rowbuf)
{
    const int blk = fmt_block(w->fmt);
    float t[16];
    for (int c = 0; c < 16; c++) t[c] = (float)L->e2m1_x2[c];
    const __m512 table = _mm512_loadu_ps(t);
    /* Measured (one core, K = 6144): the register path wins up to 3 rows, the
     * blocked one from 4 (its cost is mostly the one decode per weight row). */
    if ((w->fmt == FM_FORMAT_BF16 || M > FM_DIRECT512_MAX_M) && w->cols % 16 == 0) {
        gemm_blocked512(w, L, table, n0, n1, A, lda, M, Y, ldy, rowbuf);
        return;
    }
    if (w->fmt == FM_FORMAT_BF16 || M > FM_DIRECT512_MAX_M || (blk != 16 && blk != 32)) {
        gemm_avx2(w, L, n0, n1, A, lda, M, Y, ldy, rowbuf); /* K not a multiple of 16 (BF16 only) */
        return;
    }
    switch (M * 10 + blk / 16) {
        FM_DIRECT512_CASE(1, 1); FM_DIRECT512_CASE(2, 1); FM_DIRECT512_CASE(3, 1); FM_DIRECT512_CASE(4, 1);
        FM_DIRECT512_CASE(5, 1); FM_DIRECT512_CASE(6, 1); FM_DIRECT512_CASE(7, 1); FM_DIRECT512_CASE(8, 1);
        FM_DIRECT512_CASE(1, 2); FM_DIRECT512_CASE(2, 2); FM_DIRECT512_CASE(3, 2); FM_DIRECT512_CASE(4, 2);
        FM_DIRECT512_CASE(5, 2); FM_DIRECT512_CASE(6, 2); FM_DIRECT512_CASE(7, 2); FM_DIRECT512_CASE(8, 2);
    default: break; /* not reached */
    }
}
#undef FM_DIRECT512_CASE
#endif /* FM_X86 */

fm_cpu_gemm_fn fm_cpu_gemm_select(const char **name)
{
    const char *isa = getenv("FM_CPU_ISA");
    int want_scalar = isa && strcmp(isa, "scalar") == 0;
#ifdef FM_X86
    __builtin_cpu_init();
    int want_avx2 = isa && strcmp(isa, "avx2") == 0;
    if (!want_scalar && !want_avx2 && __builtin_cpu_supports("avx512f")) {
        if (name) *name = "avx512";
        return gemm_avx512;
    }
    if (!want_scalar && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        if (name) *name = "avx2";
        return gemm_avx2;
    }
#endif
    (void)want_scalar;
    if (name) *name = "scalar";
    return gemm_scalar;
}
