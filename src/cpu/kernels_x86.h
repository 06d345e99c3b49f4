/* kernels_x86.h - what the x86 kernel files share (not installed): target
 * attributes (the SIMD code is compiled per function and chosen at run time,
 * so the library needs no -march flag), the fixed lane folds that make every
 * path sum an output the same way, and the AVX2 16-element FP4 decoder. */
#ifndef FM_CPU_KERNELS_X86_H
#define FM_CPU_KERNELS_X86_H

#include "cpu_internal.h"

#include <immintrin.h>
#include <string.h>

#define FM_AVX2 __attribute__((target("avx2,fma")))
#define FM_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline
#define FM_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define FM_AVX512_INLINE __attribute__((target("avx512f,avx2,fma"), always_inline)) inline
#define FM_PREFETCH 1024 /* bytes ahead in the weight stream: ~16 lines covers DRAM latency */

static inline float fm_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16; /* BF16 is the top half of an FP32 */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Fixed fold of 8 lanes: (0+4, 2+6) + (1+5, 3+7), as the scalar path does. */
FM_AVX2_INLINE static float fm_hsum8(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l + (l+4) */
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));                                         /* (0+4)+(2+6), (1+5)+(3+7) */
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/* Lane l + lane l+8, then the 8-lane fold: the AVX2 path's two 8-lane
 * accumulators (elements k%16 < 8 and >= 8) folded the same way. */
FM_AVX512_INLINE static float fm_hsum16(__m512 v)
{
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return fm_hsum8(_mm256_add_ps(lo, hi));
}

/* 16 E2M1 codes from 8 bytes -> two vectors of 8 floats, times s: split
 * nibbles, interleave lo,hi (the low nibble is the even column), pshufb
 * through the 2*E2M1 table, sign-extend, convert, scale. */
FM_AVX2_INLINE static void fm_dec16(const uint8_t *q, __m128i lut, __m256 s, __m256 *f0, __m256 *f1)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadl_epi64((const __m128i *)q);
    __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
    __m128i v = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    *f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), s);
    *f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), s);
}

/* 16 E2M1 codes from 8 bytes -> 16 floats by one vpermps into a 16-entry
 * table already multiplied by the block scale (the lookup uses the low 4 bits
 * of each index, so the high nibble left in each byte is ignored). */
FM_AVX512_INLINE static __m512 fm_dec16_512(const uint8_t *q, __m512 table_scaled)
{
    __m128i v = _mm_loadl_epi64((const __m128i *)q);
    __m128i codes = _mm_unpacklo_epi8(v, _mm_srli_epi16(v, 4));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), table_scaled);
}

/* The 16 products 2*E2M1(c), as floats, for the vpermps table. */
FM_AVX512_INLINE static __m512 fm_e2m1_table512(const fm_cpu_luts *L)
{
    float t[16];
    for (int c = 0; c < 16; c++) t[c] = (float)L->e2m1_x2[c];
    return _mm512_loadu_ps(t);
}

#endif
