/* gemm_fp8.cu - the W4A8 grouped GEMM on mma.sync E4M3 (gemm_fp8.h says what it computes).
 *
 * Swap-AB as the mma family: the weights are the A operand of mma.m16n8k32 (16 output
 * features), the tokens its B operand (8 per fragment). A CTA of 4 warps takes 64 features of
 * one expert, each warp a band of 16, and walks the expert's rows 16 at a time. Per 128-K group
 * and row of W the lane finds the largest UE8M0 code c of the group's (up to) 4 blocks; each
 * block's E2M1 codes become E4M3 codes of e2m1 x 2^(code - c + 6) through an 8-entry table
 * (`prmt` picks 4 magnitudes at once, the signs are ORed in), so the largest code is at most
 * 6 x 64 = 384 <= 448; the group's FP32 partial sum is then multiplied by 2^(c - 133) (row)
 * and the token's activation scale, and added to the accumulator (per-128 promotion: the FP8
 * MMA's own accumulation stays within one group). X is read from global memory through L1
 * (the 4 warps of a CTA read the same rows) in the first kernel (FM_FP8MMA_FIRST), a
 * correctness-first main loop; the pipelined, staged (cp.async) and wgmma kernels below are
 * the tuned ones. */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/gemm_fp8.h"
#include "cuda/kernel_common.cuh"
#include "cuda/wgmma_rs_fp8.cuh"
#include "cuda/wgmma_ss_fp8.cuh"
#include "kernels/fm_tile_layout.h"

namespace {
using namespace fm_kc;

constexpr int NW = 4, NT = 2, TOK = 8 * NT;

__device__ __forceinline__ uint32_t e4m3_of(float v)
{
    return (uint32_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/* E4M3 codes of the 8 E2M1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} x 2^j, bytes 0..7 of {hi:lo} */
__device__ __forceinline__ void make_table(int j, uint32_t &lo, uint32_t &hi)
{
    const float s = ldexpf(1.0f, j);
    lo = e4m3_of(0.0f) | e4m3_of(0.5f * s) << 8 | e4m3_of(s) << 16 | e4m3_of(1.5f * s) << 24;
    hi = e4m3_of(2.0f * s) | e4m3_of(3.0f * s) << 8 | e4m3_of(4.0f * s) << 16 | e4m3_of(6.0f * s) << 24;
}

/* Four E2M1 codes (nibble i = element i) -> four E4M3 codes (byte i) */
__device__ __forceinline__ uint32_t decode4(uint32_t v, uint32_t lo, uint32_t hi)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(v & 0x7777u));
    return r | (v & 0x8u) << 4 | (v & 0x80u) << 8 | (v & 0x800u) << 12 | (v & 0x8000u) << 16;
}

__device__ __forceinline__ void mma_e4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1; /* not launched there (fm_fp8mma_launch checks the device) */
#endif
}

/* d = A x B over 16 of K from zero (m16n8k16 E4M3, PTX 8.7+, sm_89+): a0 / a1 rows g / g + 8 at
 * K 4t..4t+3, b0 K 4t..4t+3 of token g: the first (or, with a2 / a3 and b1, the second) half of
 * an m16n8k32 fragment, so an NVFP4 16-block is one MMA of its own size */
__device__ __forceinline__ void mma_e4m3_k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#else
    (void)a0, (void)a1, (void)b0;
    d[0] = d[1] = d[2] = d[3] = 0.0f; /* not launched there */
#endif
}

/* NVFP4 on the F16 pipe (sm_90 .. sm_11x). Those targets have no FP8 mma.sync in hardware:
 * ptxas lowers every E4M3 mma.sync into F2FP.F16.E4M3 conversions of A and B, HMMA F16 (two
 * HMMA.1688 for m16n8k16, two HMMA.16816 for m16n8k32) from zero and an FADD of C (SASS of
 * sm_90a / sm_100f / sm_103f / sm_110f; sm_89 and sm_120f / sm_121f have a QMMA). So there an
 * E4M3 MMA is an F16 MMA plus overhead, and the NVFP4 per-16 path (an MMA from zero per block,
 * then FMUL + FFMA per accumulator) is instruction-bound. E2M1 x E4M3 is exact in F16 (at most
 * 6 significant bits, |v| in [2^-10, 2688], multiples of 2^-10), and E4M3 activations are
 * exact in F16: the block scale is folded into the F16 weights (one mul.rn.f16x2, exact) and a
 * 16-block is one m16n8k16 F16 MMA accumulating in FP32 across the group, as the BF16 path.
 * Exact products either way; only the FP32 accumulation order differs from the per-16 path. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200
constexpr bool kNvF16 = true;
#else
constexpr bool kNvF16 = false;
#endif

/* bytes 0, 1 of v (E4M3) -> lo (F16x2, byte 0 in the low half), bytes 2, 3 -> hi */
__device__ __forceinline__ void e4m3x4_f16(uint32_t v, uint32_t &lo, uint32_t &hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(v));
#else
    lo = hi = 0u * v; /* not launched there */
#endif
}

/* byte i (0..3) of w, an E4M3 code -> F16x2 {code, code}: one prmt (the byte twice), one cvt */
__device__ __forceinline__ uint32_t e4m3_f16x2(uint32_t w, int i)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t r, p;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(p) : "r"(w), "r"((uint32_t)i * 0x11u));
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\t}" : "=r"(r) : "r"(p));
    return r;
#else
    return 0u * w * (uint32_t)i; /* not launched there */
#endif
}

/* a x b, F16x2, round to nearest (exact here: the block scale times an E2M1 value) */
__device__ __forceinline__ uint32_t hmul2_rn(uint32_t a, uint32_t b)
{
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/* c += A x B, m16n8k16 F16 -> FP32 */
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The F16 A fragment of one NVFP4 16-block: x0 / x1 the E4M3 codes of rows g / g + 8 at K
 * 4t..4t+3 (an m16n8k16 E4M3 fragment), times the rows' block scales s0 / s1 (F16x2 {s, s}).
 * E4M3 K 4t, 4t+1 -> F16 K 2t, 2t+1 (a[0], a[1]) and 4t+2, 4t+3 -> 2t+8, 2t+9 (a[2], a[3]):
 * e4m3x4_f16 of the B word (K 4t..4t+3 of token g) gives the matching b0 / b1. */
__device__ __forceinline__ void nv_frag_f16(uint32_t x0, uint32_t x1, uint32_t s0, uint32_t s1, uint32_t (&a)[4])
{
    uint32_t l0, h0, l1, h1;
    e4m3x4_f16(x0, l0, h0);
    e4m3x4_f16(x1, l1, h1);
    a[0] = hmul2_rn(l0, s0), a[1] = hmul2_rn(l1, s1), a[2] = hmul2_rn(h0, s0), a[3] = hmul2_rn(h1, s1);
}

/* Four E2M1 codes (nibble i = element i) -> four E4M3 codes (byte i), constant table: the
 * magnitudes by one prmt, the signs (nibble bit 3 -> byte bit 7) by a second prmt that picks
 * byte 0 (0x00) or byte 1 (0x80) of 0x8000 */
__device__ __forceinline__ uint32_t decode4c(uint32_t v, uint32_t lo, uint32_t hi)
{
    uint32_t m, sg;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(m) : "r"(lo), "r"(hi), "r"(v & 0x7777u));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(sg) : "r"(0x8000u), "r"(0u), "r"((v >> 3) & 0x1111u));
    return m | sg;
}

/* A lane's A fragment of one 32-K block from its two packed words: rows g (table lo0 / hi0) and
 * g + 8 (lo1 / hi1) at K 4t..4t+3 (a0, a1) and 16+4t..16+4t+3 (a2, a3) */
__device__ __forceinline__ void decode_frag(uint32_t wa, uint32_t wc, uint32_t lo0, uint32_t hi0, uint32_t lo1,
                                            uint32_t hi1, uint32_t (&af)[4])
{
    af[0] = decode4c(wa & 0xffffu, lo0, hi0), af[1] = decode4c(wa >> 16, lo1, hi1);
    af[2] = decode4c(wc & 0xffffu, lo0, hi0), af[3] = decode4c(wc >> 16, lo1, hi1);
}

/* the output of row r, column col of expert e: (v + bias) x row weight, as the layer's FC2 */
__device__ __forceinline__ float epilogue(const fm_fp8mma_args &a, int e, int r, int col, float v)
{
    if (a.bias) v += __ldg(a.bias + (size_t)e * a.N + col);
    if (a.row_weight) v *= __ldg(a.row_weight + r);
    return v;
}

__device__ __forceinline__ void mma_e4m3_z(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1)
{
    const uint32_t af[4] = {a0, a1, a2, a3};
    c[0] = c[1] = c[2] = c[3] = 0.0f;
    mma_e4m3(c, af, b0, b1);
}

/* Expert e's rows [r0, r1), max_rows applied; false: none (every kernel's first exit, before
 * any barrier) */
__device__ __forceinline__ bool expert_rows(const fm_fp8mma_args &a, int e, int &r0, int &r1)
{
    r0 = a.offsets[e], r1 = min(a.offsets[e + 1], a.max_rows);
    return r0 >= 0 && r1 > r0;
}

/* A warp's 16-feature band of expert blockIdx.y and the expert's rows [r0, r1); false: nothing
 * to do (past N, or no rows) */
__device__ __forceinline__ bool warp_work(const fm_fp8mma_args &a, int &band, int &r0, int &r1)
{
    band = blockIdx.x * NW + (threadIdx.x >> 5);
    return band * 16 < a.N && expert_rows(a, blockIdx.y, r0, r1);
}

__global__ void __launch_bounds__(NW * 32) fp8mma_kernel(const fm_fp8mma_args a)
{
    const int e = blockIdx.y, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int       band, r0, r1;
    if (!warp_work(a, band, r0, r1)) return; /* no barriers below: a warp may leave alone */
    const int     nblk = a.K / 32, ngrp = (a.K + 127) / 128, nch = a.K / 64;
    const uint4  *wp = (const uint4 *)(a.wq + ((size_t)e * (a.N / 16) + band) * (size_t)nch * 512) + lane;
    const uint8_t *ex0 = a.wexp + ((size_t)e * a.N + band * 16 + g) * nblk, *ex1 = ex0 + (size_t)8 * nblk;
    const float   osc = a.oscale ? a.oscale[e] : 1.0f;
    for (int rb = r0; rb < r1; rb += TOK) {
        float acc[NT][4] = {};
        for (int gi = 0; gi < ngrp; gi++) {
            const int kb0 = gi * 4, nb = nblk - kb0 < 4 ? nblk - kb0 : 4;
            int       c0 = 0, c1 = 0;
            for (int b = 0; b < nb; b++) c0 = max(c0, (int)ex0[kb0 + b]), c1 = max(c1, (int)ex1[kb0 + b]);
            float tmp[NT][4] = {};
            for (int b = 0; b < nb; b++) {
                const int  k32 = kb0 + b;
                const uint4 w = __ldg(wp + (size_t)(k32 >> 1) * 32);
                const uint32_t wa = k32 & 1 ? w.z : w.x, wb = k32 & 1 ? w.w : w.y;
                uint32_t   lo0, hi0, lo1, hi1;
                make_table((int)ex0[k32] - c0 + 6, lo0, hi0);
                make_table((int)ex1[k32] - c1 + 6, lo1, hi1);
                const uint32_t af[4] = {decode4(wa & 0xffffu, lo0, hi0), decode4(wa >> 16, lo1, hi1),
                                        decode4(wb & 0xffffu, lo0, hi0), decode4(wb >> 16, lo1, hi1)};
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const int r = rb + n * 8 + g;
                    uint32_t  b0 = 0, b1 = 0;
                    if (r < r1) {
                        const uint8_t *xr = a.xq + (size_t)r * a.ldx + k32 * 32 + 4 * t;
                        b0 = __ldg((const uint32_t *)xr);
                        b1 = __ldg((const uint32_t *)(xr + 16));
                    }
                    mma_e4m3(tmp[n], af, b0, b1);
                }
            }
            const float f0 = ldexpf(1.0f, c0 - 133), f1 = ldexpf(1.0f, c1 - 133); /* 2^(c - 127 - 6) */
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int r = rb + n * 8 + 2 * t + (q & 1);
                    const float xs = r < r1 ? __ldg(a.xs + (size_t)r * a.ldxs + (a.xs_per_128 ? gi : 0)) : 0.0f;
                    acc[n][q] += tmp[n][q] * (q < 2 ? f0 : f1) * xs;
                }
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = rb + n * 8 + 2 * t + (q & 1), col = band * 16 + g + 8 * (q >> 1);
                if (r < r1) a.y[(size_t)r * a.N + col] = epilogue(a, e, r, col, acc[n][q] * osc);
            }
    }
}


/* The pipelined kernel (fm_fp8mma_args.kernel 0 / 2 / 3). Each lane keeps PF 64-K chunks in
 * flight in registers (its 16 weight bytes, the rows' two UE8M0 pairs, its tokens' X words),
 * refilling a chunk's slot as soon as it is used, so that a warp has PF x 512 B of weights in
 * flight instead of one load. The weights are decoded with one constant table (the E4M3 codes
 * of the 8 E2M1 magnitudes: no exponent folded in, no table built per block) and each 32-K
 * block's MMA starts from zero: its FP32 result times 2^(code - 127) of the row's block (exact,
 * a power of two) is added to the 128-K group's sum, which the token's activation scale then
 * promotes (per 128) or the epilogue scales (per row). Exact in the weights for every UE8M0
 * code (the first kernel folds the block exponents into E4M3 codes: exact within 14 binades). */
template <bool NV>
__device__ __forceinline__ uint2 load_scales(const uint8_t *ex0, const uint8_t *ex1, int c)
{
    if (NV) return make_uint2(__ldg((const uint32_t *)ex0 + c), __ldg((const uint32_t *)ex1 + c));
    return make_uint2(__ldg((const uint16_t *)ex0 + c), __ldg((const uint16_t *)ex1 + c));
}

template <int NTT, bool NV>
__global__ void __launch_bounds__(NW * 32, NTT > 2 ? 2 : NV ? 3 : 4) fp8mma_pipe_kernel(const fm_fp8mma_args a)
{
    constexpr int PF = NTT > 2 ? 3 : 4; /* 32 tokens: their X words take the registers of a fourth chunk */
    const int e = blockIdx.y, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int       band, r0, r1;
    if (!warp_work(a, band, r0, r1)) return; /* no barriers below: a warp may leave alone */
    const int       nch = a.K / 64, nblk = NV ? a.K / 16 : a.K / 32;
    const uint4    *wp = (const uint4 *)(a.wq + ((size_t)e * (a.N / 16) + band) * (size_t)nch * 512) + lane;
    /* the block scales of rows g and g + 8 for one 64-K chunk: MXFP4 two UE8M0 codes (a 16-bit
     * load), NVFP4 four E4M3 codes (a 32-bit load; nblk is a multiple of 4) */
    const uint8_t  *ex0 = a.wexp + ((size_t)e * a.N + band * 16 + g) * nblk, *ex1 = ex0 + (size_t)8 * nblk;
    const float     osc = a.oscale ? a.oscale[e] : 1.0f;
    const uint32_t  tlo = FM_FP8MMA_TLO, thi = FM_FP8MMA_THI;
    for (int rb = r0; rb < r1; rb += 8 * NTT) {
        uint4    wb[PF];
        uint2    eb[PF];
        uint32_t xb[PF][NTT][4];
        const uint8_t *xrow[NTT]; /* a row past the expert's reads its last row; its MMA column is never stored */
#pragma unroll
        for (int n = 0; n < NTT; n++) {
            const int r = rb + n * 8 + g;
            xrow[n] = a.xq + (size_t)(r < r1 ? r : r1 - 1) * a.ldx + 4 * t;
        }
#pragma unroll
        for (int s = 0; s < PF; s++) {
            if (s < nch) {
                wb[s] = __ldg(wp + (size_t)s * 32);
                eb[s] = load_scales<NV>(ex0, ex1, s);
#pragma unroll
                for (int n = 0; n < NTT; n++)
#pragma unroll
                    for (int j = 0; j < 4; j++) xb[s][n][j] = __ldg((const uint32_t *)(xrow[n] + s * 64 + 16 * j));
            }
        }
        float acc[NTT][4] = {}, gacc[NTT][4] = {}, xsg[NTT][2] = {};
        for (int c0 = 0; c0 < nch; c0 += PF) {
#pragma unroll
            for (int s = 0; s < PF; s++) {
                const int c = c0 + s;
                if (c >= nch) break;
                if (a.xs_per_128 && !(c & 1)) /* the group's activation scales, used two chunks on */
#pragma unroll
                    for (int n = 0; n < NTT; n++)
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const int r = rb + n * 8 + 2 * t + j;
                            xsg[n][j] = r < r1 ? __ldg(a.xs + (size_t)r * a.ldxs + (c >> 1)) : 0.0f;
                        }
                const uint4    w = wb[s];
                const uint2    ec = eb[s];
#pragma unroll
                for (int kb = 0; kb < 2; kb++) {
                    const uint32_t wa = kb ? w.z : w.x, wc = kb ? w.w : w.y;
                    const uint32_t af[4] = {decode4c(wa & 0xffffu, tlo, thi), decode4c(wa >> 16, tlo, thi),
                                            decode4c(wc & 0xffffu, tlo, thi), decode4c(wc >> 16, tlo, thi)};
                    if (!NV) { /* one UE8M0 scale per row and 32 of K: one MMA */
                        const float sw0 = fm_fp8mma_ue8m0((ec.x >> (8 * kb)) & 0xffu), sw1 = fm_fp8mma_ue8m0((ec.y >> (8 * kb)) & 0xffu);
#pragma unroll
                        for (int n = 0; n < NTT; n++) {
                            float d[4];
                            mma_e4m3_z(d, af[0], af[1], af[2], af[3], xb[s][n][2 * kb], xb[s][n][2 * kb + 1]);
                            gacc[n][0] = fmaf(d[0], sw0, gacc[n][0]);
                            gacc[n][1] = fmaf(d[1], sw0, gacc[n][1]);
                            gacc[n][2] = fmaf(d[2], sw1, gacc[n][2]);
                            gacc[n][3] = fmaf(d[3], sw1, gacc[n][3]);
                        }
                    } else if (kNvF16) { /* the F16 pipe (sm_90 .. sm_11x): scales folded into the weights */
                        uint32_t a0[4], a1[4];
                        nv_frag_f16(af[0], af[1], e4m3_f16x2(ec.x, 2 * kb), e4m3_f16x2(ec.y, 2 * kb), a0);
                        nv_frag_f16(af[2], af[3], e4m3_f16x2(ec.x, 2 * kb + 1), e4m3_f16x2(ec.y, 2 * kb + 1), a1);
#pragma unroll
                        for (int n = 0; n < NTT; n++) {
                            uint32_t b0l, b0h, b1l, b1h;
                            e4m3x4_f16(xb[s][n][2 * kb], b0l, b0h);
                            e4m3x4_f16(xb[s][n][2 * kb + 1], b1l, b1h);
                            mma_f16(gacc[n], a0, b0l, b0h);
                            mma_f16(gacc[n], a1, b1l, b1h);
                        }
                    } else { /* an E4M3 scale per row and 16 of K: one MMA per half, the other half's A zero */
                        const float s00 = fm_fp8mma_e4m3((ec.x >> (16 * kb)) & 0xffu), s01 = fm_fp8mma_e4m3((ec.x >> (16 * kb + 8)) & 0xffu);
                        const float s10 = fm_fp8mma_e4m3((ec.y >> (16 * kb)) & 0xffu), s11 = fm_fp8mma_e4m3((ec.y >> (16 * kb + 8)) & 0xffu);
#pragma unroll
                        for (int n = 0; n < NTT; n++) {
                            float d[4], h[4];
                            mma_e4m3_z(d, af[0], af[1], 0u, 0u, xb[s][n][2 * kb], xb[s][n][2 * kb + 1]);
                            mma_e4m3_z(h, 0u, 0u, af[2], af[3], xb[s][n][2 * kb], xb[s][n][2 * kb + 1]);
                            gacc[n][0] = fmaf(h[0], s01, fmaf(d[0], s00, gacc[n][0]));
                            gacc[n][1] = fmaf(h[1], s01, fmaf(d[1], s00, gacc[n][1]));
                            gacc[n][2] = fmaf(h[2], s11, fmaf(d[2], s10, gacc[n][2]));
                            gacc[n][3] = fmaf(h[3], s11, fmaf(d[3], s10, gacc[n][3]));
                        }
                    }
                }
                if (c + PF < nch) { /* refill the slot: chunk c + PF */
                    wb[s] = __ldg(wp + (size_t)(c + PF) * 32);
                    eb[s] = load_scales<NV>(ex0, ex1, c + PF);
#pragma unroll
                    for (int n = 0; n < NTT; n++)
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            xb[s][n][j] = __ldg((const uint32_t *)(xrow[n] + (c + PF) * 64 + 16 * j));
                }
                if (a.xs_per_128 && ((c & 1) || c == nch - 1)) /* the 128-K group ends: promote */
#pragma unroll
                    for (int n = 0; n < NTT; n++)
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            acc[n][q] = fmaf(gacc[n][q], xsg[n][q & 1], acc[n][q]);
                            gacc[n][q] = 0.0f;
                        }
            }
        }
#pragma unroll
        for (int n = 0; n < NTT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = rb + n * 8 + 2 * t + (q & 1), col = band * 16 + g + 8 * (q >> 1);
                if (r < r1) {
                    const float v = a.xs_per_128 ? acc[n][q] : gacc[n][q] * __ldg(a.xs + (size_t)r * a.ldxs);
                    a.y[(size_t)r * a.N + col] = epilogue(a, e, r, col, v * osc);
                }
            }
    }
}

/* The staged kernels (fm_fp8mma_args.kernel FM_FP8MMA_STAGED16 / 32 / 64): the W4A16 mma
 * kernels' shape (gemm_mma.cuh) for E4M3. A CTA of 4 warps takes 2 bands of 16 features a
 * warp (128 features of one expert) and walks the expert's rows 8 x NT at a time; per 128-K
 * stage, the rows' E4M3 tile [8 x NT][128 + 16 B] (shared by the CTA's 8 bands), each warp's
 * two bands' 2 chunks of packed codes (512 B each, a lane's 16 B) and the bands' group
 * scales (fm_fp8mma_pack_scales) go global -> shared by cp.async, STAGES deep, so that
 * bytes stay in flight without registers. Each A fragment is decoded once and used by NT
 * MMAs (16-64 tokens), each B fragment by the warp's 2 bands.
 * MXFP4: a 128-K group whose 16 rows' codes fold (gemm_fp8.h, FM_FP8MMA_FOLD_MIN; all real
 * checkpoints we read do) is one MMA chain over its 4 blocks with the exponents in the
 * E4M3 codes (a per-block table of two integer ops), times 2^(max - 133) once; a group that
 * does not (the warp votes) takes the pipelined kernels' exact per-block path. NVFP4: a
 * per-16 path always (E4M3 block scales do not fold exactly): on sm_89 / sm_120f one m16n8k16
 * E4M3 MMA per 16-block (the pipelined kernels spend a k32 MMA with half its A zero on it); on
 * sm_90 .. sm_11x (kNvF16 above: no FP8 mma.sync there) the block scale folded into F16 weights
 * and one m16n8k16 F16 MMA per 16-block. Exact in the weights for every scale either way; FP32
 * accumulation order differs from the oracle. */
template <bool NV, int NT, int STAGES>
struct staged_cfg { /* fm_tile_layout.h's FM_FP8S_* layout */
    static constexpr int MT = FM_FP8S_BANDS, KC = FM_FP8S_KC, TOK = 8 * NT, ROWB = FM_FP8S_ROW_BYTES;
    static constexpr int W_OFF = FM_FP8S_W_OFF(NT), SB = FM_FP8S_SF_BYTES(NV), S_OFF = FM_FP8S_S_OFF(NW, MT, NT);
    static constexpr int STAGE_B = FM_FP8S_STAGE_BYTES(NW, MT, NT, NV), SMEM = FM_FP8S_SMEM(NW, MT, NT, STAGES, NV);
    static_assert(KC == 2 * FM_TILE_CHUNK_K && SB == 16 * (NV ? 8 : 4) && NW == FM_FP8S_WARPS,
                  "one stage = one 128-K group, 2 chunks; the CTA's warps");
    static_assert(W_OFF % 16 == 0 && S_OFF % 16 == 0 && STAGE_B % 16 == 0, "16-byte copies");
};

/* What one thread copies of each 128-K group's stage, for the staged and the wgmma kernels: its
 * 16-byte segments of the rows' tile (xdst: where each lands, in the kernel's own layout), the
 * two 64-K code chunks of MT bands (stage slot slot[i]: 2 x 512 B at w_off) and their group
 * scales (SB bytes a band at s_off, copied by lanes < SB / 16); rows past the pass's count, K
 * past the end and bands past N are zero-filled (cp.async src-size 0, from a valid address). */
template <int MT, int XIT, int SB> struct group_copy {
    const uint8_t *xsrc[XIT];
    int            xdst[XIT], xcol[XIT];
    bool           xin[XIT];
    const uint4   *wsrc[MT];
    const uint8_t *ssrc[MT];
    bool           bv[MT];
    int            slot[MT];
    /* band i of the CTA is band `band` of expert e, at stage slot `sl` */
    __device__ __forceinline__ void set_band(const fm_fp8mma_args &a, int i, int band, int sl, int e, int nbands, int nch,
                                             int ngrp, int lane)
    {
        bv[i] = band < nbands, slot[i] = sl;
        const size_t b = bv[i] ? (size_t)band : 0; /* a band past N reads band 0 with src-size 0 */
        wsrc[i] = (const uint4 *)(a.wq + ((size_t)e * nbands + b) * (size_t)nch * 512) + lane;
        ssrc[i] = a.wsp + ((size_t)e * nbands + b) * (size_t)ngrp * SB + (lane & (SB / 16 - 1)) * 16;
    }
    /* segment j: row r (< rows: in the pass) of the rows from `first`, columns col.. of each group, at dst */
    __device__ __forceinline__ void set_seg(const fm_fp8mma_args &a, int j, int r, int col, int dst, int rows, size_t first)
    {
        xcol[j] = col, xin[j] = r < rows, xdst[j] = dst;
        xsrc[j] = a.xq + (first + (size_t)(xin[j] ? r : 0)) * a.ldx + col;
    }
    __device__ __forceinline__ void load(unsigned char *buf, int ks, const fm_fp8mma_args &a, int nch, int w_off, int s_off,
                                         int lane) const
    {
#pragma unroll
        for (int j = 0; j < XIT; j++) {
            const bool ok = xin[j] && ks * 128 + xcol[j] < a.K;
            cp_async16(buf + xdst[j], ok ? xsrc[j] + (size_t)ks * 128 : a.xq, ok ? 16 : 0);
        }
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int  ch = ks * 2 + c;
            const bool kin = ch < nch;
#pragma unroll
            for (int i = 0; i < MT; i++)
                cp_async16(buf + w_off + (slot[i] * 2 + c) * 512 + lane * 16, wsrc[i] + (size_t)(kin ? ch : 0) * 32,
                           bv[i] && kin ? 16 : 0);
        }
        if (lane < SB / 16)
#pragma unroll
            for (int i = 0; i < MT; i++)
                cp_async16(buf + s_off + slot[i] * SB + lane * 16, ssrc[i] + (size_t)ks * SB, bv[i] ? 16 : 0);
    }
};

template <bool NV, int NT, int STAGES>
__global__ void __launch_bounds__(NW * 32, NT >= 8 ? 1 : 2) fp8mma_staged_kernel(const fm_fp8mma_args a)
{
    using C = staged_cfg<NV, NT, STAGES>;
    constexpr int MT = C::MT, KC = C::KC, TOK = C::TOK, SEGS = KC / 16, XIT = TOK * SEGS / (NW * 32);
    static_assert(TOK * SEGS % (NW * 32) == 0, "every thread copies whole row segments");
    extern __shared__ __align__(16) unsigned char smem[];
    const int e = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int       row0, row1;
    if (!expert_rows(a, e, row0, row1)) return; /* the whole CTA, before any barrier */
    const int m = row1 - row0, nbands = a.N / 16, nch = a.K / 64, ngrp = (a.K + 127) / 128;
    int       band[MT];
    bool      wv = false; /* warp-uniform */
    group_copy<MT, XIT, C::SB> cp;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        band[i] = (blockIdx.x * NW + warp) * MT + i;
        cp.set_band(a, i, band[i], warp * MT + i, e, nbands, nch, ngrp, lane);
        wv |= cp.bv[i];
    }
    const float osc = a.oscale ? a.oscale[e] : 1.0f;
    for (int pass0 = 0; pass0 < m; pass0 += TOK) {
        const int rows = min(TOK, m - pass0);
#pragma unroll
        for (int j = 0; j < XIT; j++) {
            const int sgi = threadIdx.x + j * NW * 32, r = sgi / SEGS, col = (sgi % SEGS) * 16;
            cp.set_seg(a, j, r, col, r * C::ROWB + col, rows, (size_t)(row0 + pass0));
        }
        /* one stage = one 128-K group: the row tile, each warp's weight chunks, its bands' scales */
        auto load_stage = [&](int ks) { cp.load(smem + (ks % STAGES) * C::STAGE_B, ks, a, nch, C::W_OFF, C::S_OFF, lane); };
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < ngrp) load_stage(s);
            cp_async_commit();
        }
        float acc[MT][NT][4] = {};
        for (int ks = 0; ks < ngrp; ks++) {
            cp_async_wait<STAGES - 2>();
            __syncthreads(); /* stage ks visible to all; stage ks - 1 free */
            if (ks + STAGES - 1 < ngrp) load_stage(ks + STAGES - 1);
            cp_async_commit();
            float xsg[NT][2]; /* the group's activation scales (1 per row: the epilogue's), loaded before the MMAs */
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int r = pass0 + n * 8 + 2 * t + j;
                    xsg[n][j] = !a.xs_per_128 ? 1.0f : r < m ? __ldg(a.xs + (size_t)(row0 + r) * a.ldxs + ks) : 0.0f;
                }
            if (!wv) continue;
            const unsigned char *buf = smem + (ks % STAGES) * C::STAGE_B;
            uint2 sc0[MT], sc1[MT]; /* rows g, g + 8: MXFP4 4 codes (.x), NVFP4 8 codes */
            bool  fold[MT];
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const unsigned char *sp = buf + C::S_OFF + (warp * MT + i) * C::SB;
                if (NV) {
                    sc0[i] = *(const uint2 *)(sp + g * 8), sc1[i] = *(const uint2 *)(sp + (g + 8) * 8);
                    fold[i] = false;
                } else {
                    sc0[i] = make_uint2(*(const uint32_t *)(sp + g * 4), 0u);
                    sc1[i] = make_uint2(*(const uint32_t *)(sp + (g + 8) * 4), 0u);
                    fold[i] = __all_sync(0xffffffffu, fm_fp8mma_folds(sc0[i].x) && fm_fp8mma_folds(sc1[i].x));
                }
            }
            float tmp[MT][NT][4] = {}; /* a folded group's MMA chain (MXFP4; NVFP4 on the F16 pipe; the other paths add into acc) */
#pragma unroll
            for (int kb = 0; kb < 4; kb++) { /* the group's 32-K blocks */
                uint32_t bx[NT][2], bh[NV && kNvF16 ? NT : 1][4]; /* bh: the F16 pipe's B, converted once for the bands */
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const unsigned char *xp = buf + (n * 8 + g) * C::ROWB + kb * 32 + 4 * t;
                    bx[n][0] = *(const uint32_t *)xp, bx[n][1] = *(const uint32_t *)(xp + 16);
                    if (NV && kNvF16) e4m3x4_f16(bx[n][0], bh[n][0], bh[n][1]), e4m3x4_f16(bx[n][1], bh[n][2], bh[n][3]);
                }
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    if (!cp.bv[i]) continue;
                    const uint4    w = *(const uint4 *)(buf + C::W_OFF + ((warp * MT + i) * 2 + (kb >> 1)) * 512 + lane * 16);
                    const uint32_t wa = kb & 1 ? w.z : w.x, wc = kb & 1 ? w.w : w.y;
                    if (!NV) {
                        const uint32_t c0 = sc0[i].x >> (8 * kb) & 0xffu, c1 = sc1[i].x >> (8 * kb) & 0xffu;
                        if (fold[i]) {
                            uint32_t lo0, hi0, lo1, hi1;
                            fm_fp8mma_fold_table((int)c0 - (int)fm_fp8mma_maxb(sc0[i].x) + 6, &lo0, &hi0);
                            fm_fp8mma_fold_table((int)c1 - (int)fm_fp8mma_maxb(sc1[i].x) + 6, &lo1, &hi1);
                            uint32_t af[4];
                            decode_frag(wa, wc, lo0, hi0, lo1, hi1, af);
#pragma unroll
                            for (int n = 0; n < NT; n++) mma_e4m3(tmp[i][n], af, bx[n][0], bx[n][1]);
                        } else {
                            const float sw0 = fm_fp8mma_ue8m0(c0), sw1 = fm_fp8mma_ue8m0(c1);
                            uint32_t    af[4];
                            decode_frag(wa, wc, FM_FP8MMA_TLO, FM_FP8MMA_THI, FM_FP8MMA_TLO, FM_FP8MMA_THI, af);
#pragma unroll
                            for (int n = 0; n < NT; n++) {
                                float d[4];
                                mma_e4m3_z(d, af[0], af[1], af[2], af[3], bx[n][0], bx[n][1]);
                                acc[i][n][0] = fmaf(d[0], sw0 * xsg[n][0], acc[i][n][0]);
                                acc[i][n][1] = fmaf(d[1], sw0 * xsg[n][1], acc[i][n][1]);
                                acc[i][n][2] = fmaf(d[2], sw1 * xsg[n][0], acc[i][n][2]);
                                acc[i][n][3] = fmaf(d[3], sw1 * xsg[n][1], acc[i][n][3]);
                            }
                        }
                    } else if (kNvF16) { /* the F16 pipe (sm_90 .. sm_11x): blocks 2 kb, 2 kb + 1 with
                                          * their scales in the weights, one chain a group (tmp) */
                        const uint32_t w0 = kb < 2 ? sc0[i].x : sc0[i].y, w1 = kb < 2 ? sc1[i].x : sc1[i].y;
                        const int      by = 2 * (kb & 1); /* the pair's first code: byte by of w0 / w1 */
                        uint32_t       af[4], a0[4], a1[4];
                        decode_frag(wa, wc, FM_FP8MMA_TLO, FM_FP8MMA_THI, FM_FP8MMA_TLO, FM_FP8MMA_THI, af);
                        nv_frag_f16(af[0], af[1], e4m3_f16x2(w0, by), e4m3_f16x2(w1, by), a0);
                        nv_frag_f16(af[2], af[3], e4m3_f16x2(w0, by + 1), e4m3_f16x2(w1, by + 1), a1);
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            mma_f16(tmp[i][n], a0, bh[n][0], bh[n][1]);
                            mma_f16(tmp[i][n], a1, bh[n][2], bh[n][3]);
                        }
                    } else { /* blocks 2 kb, 2 kb + 1 of 16: one m16n8k16 MMA each (the pipelined kernels
                              * run a k32 MMA with the other half's A zero instead) */
                        const uint32_t w0 = kb < 2 ? sc0[i].x : sc0[i].y, w1 = kb < 2 ? sc1[i].x : sc1[i].y;
                        const int      sh = 16 * (kb & 1);
                        const float    s00 = fm_fp8mma_e4m3(w0 >> sh & 0xffu), s01 = fm_fp8mma_e4m3(w0 >> (sh + 8) & 0xffu);
                        const float    s10 = fm_fp8mma_e4m3(w1 >> sh & 0xffu), s11 = fm_fp8mma_e4m3(w1 >> (sh + 8) & 0xffu);
                        uint32_t af[4];
                        decode_frag(wa, wc, FM_FP8MMA_TLO, FM_FP8MMA_THI, FM_FP8MMA_TLO, FM_FP8MMA_THI, af);
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            float d[4], h[4];
                            mma_e4m3_k16(d, af[0], af[1], bx[n][0]);
                            mma_e4m3_k16(h, af[2], af[3], bx[n][1]);
                            const float x0 = xsg[n][0], x1 = xsg[n][1];
                            acc[i][n][0] = fmaf(h[0], s01 * x0, fmaf(d[0], s00 * x0, acc[i][n][0]));
                            acc[i][n][1] = fmaf(h[1], s01 * x1, fmaf(d[1], s00 * x1, acc[i][n][1]));
                            acc[i][n][2] = fmaf(h[2], s11 * x0, fmaf(d[2], s10 * x0, acc[i][n][2]));
                            acc[i][n][3] = fmaf(h[3], s11 * x1, fmaf(d[3], s10 * x1, acc[i][n][3]));
                        }
                    }
                }
            }
            if (NV && kNvF16) /* the F16 pipe's group sum times the activation scale (1: per row) */
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int q = 0; q < 4; q++) acc[i][n][q] = fmaf(tmp[i][n][q], xsg[n][q & 1], acc[i][n][q]);
            /* a folded group's sum times 2^(max - 133) (rows g / g + 8) and the activation scale */
            if (!NV)
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    if (!fold[i]) continue;
                    const float f0 = ldexpf(1.0f, (int)fm_fp8mma_maxb(sc0[i].x) - 133);
                    const float f1 = ldexpf(1.0f, (int)fm_fp8mma_maxb(sc1[i].x) - 133);
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int q = 0; q < 4; q++)
                            acc[i][n][q] = fmaf(tmp[i][n][q] * (q < 2 ? f0 : f1), xsg[n][q & 1], acc[i][n][q]);
                }
        }
        if (wv)
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (!cp.bv[i]) continue;
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int r = pass0 + n * 8 + 2 * t + (q & 1), col = band[i] * 16 + g + 8 * (q >> 1);
                        if (r >= m) continue;
                        const int   row = row0 + r;
                        const float v = a.xs_per_128 ? acc[i][n][q] : acc[i][n][q] * __ldg(a.xs + (size_t)row * a.ldxs);
                        a.y[(size_t)row * a.N + col] = epilogue(a, e, row, col, v * osc);
                    }
            }
        cp_async_wait<0>();
        __syncthreads(); /* the next pass overwrites the stages */
    }
}

/* launch one staged kernel: its shared memory as fm_fp8mma_smem_bytes says (the host's
 * function and the template must agree: cudaErrorAssert otherwise, a defect caught by the
 * GPU test), opting in past 48 KB */
template <bool NV, int NT, int STAGES>
int launch_staged(const fm_fp8mma_args &a, size_t smem, cudaStream_t s)
{
    using C = staged_cfg<NV, NT, STAGES>;
    if ((size_t)C::SMEM != smem) return (int)cudaErrorAssert;
    if (smem > 48 * 1024) {
        const cudaError_t e =
            cudaFuncSetAttribute(fp8mma_staged_kernel<NV, NT, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
    }
    const dim3 grid((unsigned)((a.N / 16 + NW * C::MT - 1) / (NW * C::MT)), (unsigned)a.E);
    fp8mma_staged_kernel<NV, NT, STAGES><<<grid, NW * 32, smem, s>>>(a);
    return (int)cudaGetLastError();
}


/* The wgmma kernels (fm_fp8mma_args.kernel FM_FP8MMA_WG32 / 64 / 128; sm_90a, MXFP4): the
 * staged kernels' stages (one 128-K group each: the rows' tile, the bands' packed codes and
 * group scales, global -> shared by cp.async, STAGES deep) with the MMAs on one warpgroup's
 * wgmma (m64 x TOK x k32, E4M3, FP32): the A operand from registers (each warp's 16 rows of an
 * m64 tile, decoded from the packed codes, whose lane layout is wgmma's register fragment),
 * the B operand the rows' tile in shared memory (K-major, 128-byte swizzle: one row's 128 K =
 * one swizzle line). Per group, when every one of the CTA's rows' block codes fold
 * (gemm_fp8.h, FM_FP8MMA_FOLD_MIN; the CTA votes), each m64 tile's 4 blocks are one wgmma chain from
 * zero with the exponents in the E4M3 codes, times 2^(max - 133) and the activation scale
 * once (the per-128 promotion); else each block is a wgmma from zero times its scale (exact,
 * slower). One vote a group for all the CTA's tiles: a wgmma under a per-tile branch is
 * serialized by ptxas (C7520). Exact in the weights for every scale either way; FP32 accumulation order differs
 * from the oracle's. A build without sm_90a has an empty body: the launcher runs it only
 * where the device is sm_90 and the kernel came from sm_90a code (fm_fp8mma_launch). */
template <int TOK, int MT, int STAGES> struct wg_cfg { /* fm_tile_layout.h's FM_FP8W_* layout */
    static constexpr int KC = FM_FP8S_KC, W_OFF = FM_FP8W_W_OFF(TOK), S_OFF = FM_FP8W_S_OFF(MT, TOK);
    static constexpr int STAGE_B = FM_FP8W_STAGE_BYTES(MT, TOK), SMEM = FM_FP8W_SMEM(MT, TOK, STAGES);
    static_assert(KC == 128 && STAGE_B % 1024 == 0 && W_OFF % 1024 == 0 && S_OFF % 16 == 0,
                  "one stage = one 128-K group = one 128-byte swizzle line a row; 1 KB atoms");
    static_assert(TOK == 32 || TOK == 64 || TOK == 128, "a wgmma_fp8_rs_t shape");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FM_FP8WG_BODY 1
#endif

#ifdef FM_FP8WG_BODY
/* the compiler keeps these registers in place across the asynchronous MMAs (wgmma_common.cuh's fences) */
template <int N> __device__ __forceinline__ void wg8_fence(float (&d)[N])
{
#pragma unroll
    for (int j = 0; j < N; j++) asm volatile("" : "+f"(d[j])::"memory");
}
__device__ __forceinline__ void wg8_fence_a(uint32_t (&af)[4])
{
#pragma unroll
    for (int q = 0; q < 4; q++) asm volatile("" : "+r"(af[q])::"memory");
}
/* the rows' tile at shared address sb, 32-K block kb: +32 B inside the 128-byte swizzle line
 * (the hardware applies the XOR), 8 rows = one 1 KB atom (SBO) */
__device__ __forceinline__ uint64_t wg8_desc(uint32_t sb, int kb)
{
    const uint32_t a = sb + (uint32_t)kb * 32u;
    return (uint64_t)((a & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
#endif

template <int TOK, int MT, int STAGES>
__global__ void __launch_bounds__(128, 1) fp8mma_wg_kernel(const fm_fp8mma_args a)
{
#ifdef FM_FP8WG_BODY
    using C = wg_cfg<TOK, MT, STAGES>;
    constexpr int ND = TOK / 2, XIT = TOK * 8 / 128; /* accumulators a thread; 16-byte row segments a thread */
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    const int e = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int       row0, row1;
    if (!expert_rows(a, e, row0, row1)) return; /* the whole CTA, before any barrier */
    const int      m = row1 - row0, nbands = a.N / 16, nch = a.K / 64, ngrp = (a.K + 127) / 128;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(wg_smem);
    int            band[MT];
    group_copy<MT, XIT, 64> cp;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        band[i] = (blockIdx.x * MT + i) * 4 + warp; /* warp w holds rows 16w.. of m64 tile i */
        cp.set_band(a, i, band[i], i * 4 + warp, e, nbands, nch, ngrp, lane);
    }
    const float osc = a.oscale ? a.oscale[e] : 1.0f;
    for (int pass0 = 0; pass0 < m; pass0 += TOK) {
        const int rows = min(TOK, m - pass0);
#pragma unroll
        for (int j = 0; j < XIT; j++) { /* segment c of row r -> 16 x (c ^ (r % 8)) of the row's line */
            const int sgi = threadIdx.x + j * 128, r = sgi >> 3, c = sgi & 7;
            cp.set_seg(a, j, r, c * 16, r * 128 + ((c ^ (r & 7)) * 16), rows, (size_t)(row0 + pass0));
        }
        auto load_stage = [&](int ks) { cp.load(wg_smem + (ks % STAGES) * C::STAGE_B, ks, a, nch, C::W_OFF, C::S_OFF, lane); };
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < ngrp) load_stage(s);
            cp_async_commit();
        }
        float acc[MT][ND], tmp[MT][ND];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < ND; j++) acc[i][j] = tmp[i][j] = 0.0f;
        for (int ks = 0; ks < ngrp; ks++) {
            float xsg[TOK / 8][2]; /* the group's activation scales of this thread's tokens (1: per row) */
#pragma unroll
            for (int n = 0; n < TOK / 8; n++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int r = pass0 + n * 8 + 2 * t + j;
                    xsg[n][j] = !a.xs_per_128 ? 1.0f : r < m ? __ldg(a.xs + (size_t)(row0 + r) * a.ldxs + ks) : 0.0f;
                }
            cp_async_wait<STAGES - 2>();
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async data -> the wgmma's reads */
            __syncthreads(); /* stage ks visible to all; stage ks - 1 free (every MMA on it waited for) */
            if (ks + STAGES - 1 < ngrp) load_stage(ks + STAGES - 1);
            cp_async_commit();
            const unsigned char *buf = wg_smem + (ks % STAGES) * C::STAGE_B;
            const uint32_t       xb = sbase + (uint32_t)((ks % STAGES) * C::STAGE_B);
            uint32_t             c0[MT], c1[MT];
            uint32_t             af[MT][4][4];
            int                  ok = 1;
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const unsigned char *sp = buf + C::S_OFF + (i * 4 + warp) * 64;
                c0[i] = *(const uint32_t *)(sp + g * 4), c1[i] = *(const uint32_t *)(sp + (g + 8) * 4);
                ok &= fm_fp8mma_folds(c0[i]) && fm_fp8mma_folds(c1[i]);
            }
            const int fold = __syncthreads_and(ok); /* every row of the CTA's m64 tiles: one vote */
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int m0 = (int)fm_fp8mma_maxb(c0[i]), m1 = (int)fm_fp8mma_maxb(c1[i]);
#pragma unroll
                for (int kb = 0; kb < 4; kb++) {
                    const uint4    w = *(const uint4 *)(buf + C::W_OFF + ((i * 4 + warp) * 2 + (kb >> 1)) * 512 + lane * 16);
                    const uint32_t wa = kb & 1 ? w.z : w.x, wc = kb & 1 ? w.w : w.y;
                    uint32_t       lo0 = FM_FP8MMA_TLO, hi0 = FM_FP8MMA_THI, lo1 = FM_FP8MMA_TLO, hi1 = FM_FP8MMA_THI;
                    if (fold) {
                        fm_fp8mma_fold_table((int)(c0[i] >> (8 * kb) & 0xffu) - m0 + 6, &lo0, &hi0);
                        fm_fp8mma_fold_table((int)(c1[i] >> (8 * kb) & 0xffu) - m1 + 6, &lo1, &hi1);
                    }
                    decode_frag(wa, wc, lo0, hi0, lo1, hi1, af[i][kb]);
                }
            }
            if (fold) { /* one chain of 4 MMAs a tile, then the group's promotion */
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    wg8_fence(tmp[i]);
#pragma unroll
                    for (int kb = 0; kb < 4; kb++) wg8_fence_a(af[i][kb]);
                }
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int kb = 0; kb < 4; kb++) wgmma_fp8_rs_t<TOK>::run(tmp[i], af[i][kb], wg8_desc(xb, kb), kb);
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    wg8_fence(tmp[i]);
                    const float f0 = ldexpf(1.0f, (int)fm_fp8mma_maxb(c0[i]) - 133); /* 2^(c - 127 - 6) */
                    const float f1 = ldexpf(1.0f, (int)fm_fp8mma_maxb(c1[i]) - 133);
#pragma unroll
                    for (int j = 0; j < ND; j++)
                        acc[i][j] = fmaf(tmp[i][j] * ((j & 2) ? f1 : f0), xsg[j >> 2][j & 1], acc[i][j]);
                }
            } else { /* a block at a time from zero, times its scale (exact) */
#pragma unroll
                for (int kb = 0; kb < 4; kb++) {
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        wg8_fence(tmp[i]);
                        wg8_fence_a(af[i][kb]);
                    }
                    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                    for (int i = 0; i < MT; i++) wgmma_fp8_rs_t<TOK>::run(tmp[i], af[i][kb], wg8_desc(xb, kb), 0);
                    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        wg8_fence(tmp[i]);
                        const float sw0 = fm_fp8mma_ue8m0(c0[i] >> (8 * kb) & 0xffu), sw1 = fm_fp8mma_ue8m0(c1[i] >> (8 * kb) & 0xffu);
#pragma unroll
                        for (int j = 0; j < ND; j++)
                            acc[i][j] = fmaf(tmp[i][j], ((j & 2) ? sw1 : sw0) * xsg[j >> 2][j & 1], acc[i][j]);
                    }
                }
            }
        }
        /* accumulator j of m64 tile i: row (feature) 16 x warp + g + 8 x ((j >> 1) & 1), token 8 x (j >> 2) + 2t + (j & 1) */
#pragma unroll
        for (int i = 0; i < MT; i++) {
            if (!cp.bv[i]) continue;
#pragma unroll
            for (int j = 0; j < ND; j++) {
                const int r = pass0 + (j >> 2) * 8 + 2 * t + (j & 1), col = band[i] * 16 + g + 8 * ((j >> 1) & 1);
                if (r >= m) continue;
                const int   row = row0 + r;
                const float v = a.xs_per_128 ? acc[i][j] : acc[i][j] * __ldg(a.xs + (size_t)row * a.ldxs);
                a.y[(size_t)row * a.N + col] = epilogue(a, e, row, col, v * osc);
            }
        }
        cp_async_wait<0>();
        __syncthreads(); /* the next pass overwrites the stages */
    }
#else
    (void)a; /* not launched: fm_fp8mma_launch checks the device and the kernel's code */
#endif
}

/* 0 where this wgmma kernel can run on a device of capability cc: sm_90 with the kernel's
 * sm_90a code (a build whose only code for this device is PTX of another target has the empty
 * body: refused, never run); else cudaErrorNotSupported or the query's error */
template <int TOK, int MT, int STAGES>
int wg_here(int cc)
{
    if (cc != 90) return (int)cudaErrorNotSupported; /* wgmma: sm_90a only */
    cudaFuncAttributes fa;
    const cudaError_t  e = cudaFuncGetAttributes(&fa, fp8mma_wg_kernel<TOK, MT, STAGES>);
    if (e != cudaSuccess) return (int)e;
    /* code other than sm_90a's (PTX of another target, JIT-compiled) has an empty body */
    return fa.ptxVersion == 90 && fa.binaryVersion == 90 ? 0 : (int)cudaErrorNotSupported;
}

/* launch one wgmma kernel where wg_here allows it, shared memory as fm_fp8mma_smem_bytes says */
template <int TOK, int MT, int STAGES>
int launch_wg(const fm_fp8mma_args &a, size_t smem, int cc, cudaStream_t s)
{
    using C = wg_cfg<TOK, MT, STAGES>;
    if ((size_t)C::SMEM != smem) return (int)cudaErrorAssert;
    cudaError_t e = (cudaError_t)wg_here<TOK, MT, STAGES>(cc);
    if (e != cudaSuccess) return (int)e;
    if ((e = cudaFuncSetAttribute(fp8mma_wg_kernel<TOK, MT, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem)) != cudaSuccess)
        return (int)e;
    const dim3 grid((unsigned)((a.N / 16 + 4 * MT - 1) / (4 * MT)), (unsigned)a.E);
    fp8mma_wg_kernel<TOK, MT, STAGES><<<grid, 128, smem, s>>>(a);
    return (int)cudaGetLastError();
}

/* the warp-specialized wgmma kernels (FM_FP8MMA_WS*): a producer warpgroup decodes the codes
 * into shared memory, consumer warpgroups run SS wgmma */
#include "cuda/wgmma_ws_fp8.cuh"

/* The current device and its compute capability, major x 10 + minor */
cudaError_t device_cc(int *dev, int *cc)
{
    int         major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, *dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, *dev);
    *cc = major * 10 + minor;
    return e;
}

/* fm_fp8mma_kernel_here on a device of capability cc (sm_89+) */
int kernel_here_cc(int kernel, int cc)
{
    switch (kernel) { /* fm_tile_layout.h's list */
#define FM_FP8W_CASE(tok, mt, st)                                                                                      \
    case FM_FP8MMA_WG##tok: return wg_here<tok, mt, st>(cc);
        FM_FP8W_LIST(FM_FP8W_CASE)
#undef FM_FP8W_CASE
#define FM_FP8WS_CASE(tok, cw, st)                                                                                     \
    case FM_FP8MMA_WS##tok: return ws_here<tok, cw, st>(cc);
        FM_FP8WS_LIST(FM_FP8WS_CASE)
#undef FM_FP8WS_CASE
    default: return 0;
    }
}

} // namespace

extern "C" int fm_fp8mma_kernel_here(int kernel)
{
    if (kernel < FM_FP8MMA_AUTO || kernel >= FM_FP8MMA_KERNELS) return (int)cudaErrorInvalidValue;
    int               dev = 0, cc = 0;
    const cudaError_t e = device_cc(&dev, &cc);
    if (e != cudaSuccess) return (int)e;
    if (cc < 89) return (int)cudaErrorNotSupported; /* no FP8 mma before sm_89 */
    return kernel_here_cc(kernel, cc);
}

extern "C" int fm_fp8mma_launch(const fm_fp8mma_args *a, void *stream)
{
    if (!a || !a->wq || !a->wexp || !a->xq || !a->xs || !a->offsets || !a->y || a->E < 1 || a->E > 65535 ||
        a->N < 16 || a->N % 16 || a->K < 64 || a->K % 64 || a->ldx < a->K || a->ldx % 4 || a->max_rows < 0 ||
        a->ldxs < (a->xs_per_128 ? (a->K + 127) / 128 : 1) || a->kernel < FM_FP8MMA_AUTO || a->kernel >= FM_FP8MMA_KERNELS ||
        (a->fmt != 0 && a->fmt != FM_FORMAT_MXFP4 && a->fmt != FM_FORMAT_NVFP4))
        return (int)cudaErrorInvalidValue;
    if (((uintptr_t)a->wq & 15) || ((uintptr_t)a->xq & 3) || ((uintptr_t)a->xs & 3) || ((uintptr_t)a->y & 3))
        return (int)cudaErrorMisalignedAddress; /* 16-byte weight loads, 4-byte X loads */
    if ((uintptr_t)a->wexp & 3) return (int)cudaErrorMisalignedAddress; /* 2- / 4-byte scale loads */
    if (a->kernel >= FM_FP8MMA_STAGED16) { /* packed scales; 16-byte copies of the rows and the scales (staged, wg) */
        if (!a->wsp) return (int)cudaErrorInvalidValue;
        if (((uintptr_t)a->wsp & 15) || ((uintptr_t)a->xq & 15) || a->ldx % 16) return (int)cudaErrorMisalignedAddress;
    }
    int         dev = 0, cc = 0;
    cudaError_t e = device_cc(&dev, &cc);
    if (e != cudaSuccess) return (int)e;
    if (cc < 89) return (int)cudaErrorNotSupported; /* no FP8 mma before sm_89 */
    const int nv = a->fmt == FM_FORMAT_NVFP4;
    fm_fp8mma_args ak;
    /* auto, MXFP4 on sm_90 with sm_90a code, the operands the wgmma kernels need: they beat the
     * pipelined kernels at every m (bench_fp8mma, H100 2026-12-07, gpt-oss FC1 over 8 experts):
     * wg32 110 / 113 / 116 us against pipe16 123 / 126 / 237 at 8 / 16 / 32 rows per expert,
     * wg64 184 / 364 / 706 against 459 / 907 / 1,818 at 64 / 128 / 256 (wg32 221 at 64) */
    if (a->kernel == FM_FP8MMA_AUTO && !nv && a->wsp && !((uintptr_t)a->wsp & 15) && !((uintptr_t)a->xq & 15) &&
        a->ldx % 16 == 0 && cc == 90 && kernel_here_cc(FM_FP8MMA_WG32, cc) == 0) { /* cc already queried */
        ak = *a;
        /* ws128 from 96 rows per expert (bench_fp8mma, H100 2026-12-07 12:05: 298 / 558 us against
         * wg64's 365 / 710 at 128 / 256 rows; 287 against 191 at 64, where wg64 needs one pass) */
        ak.kernel = a->max_rows >= 96 * a->E && kernel_here_cc(FM_FP8MMA_WS128, cc) == 0 ? FM_FP8MMA_WS128
                    : a->max_rows >= 48 * a->E                                           ? FM_FP8MMA_WG64
                                                                                         : FM_FP8MMA_WG32;
        a = &ak;
    }
    if (nv && (a->kernel == FM_FP8MMA_FIRST || a->kernel >= FM_FP8MMA_WG32))
        return (int)cudaErrorInvalidValue; /* the first and the wgmma kernels: MXFP4 only */
    if (a->kernel >= FM_FP8MMA_STAGED16) { /* the staged and wgmma kernels: dynamic shared memory, opted in */
        if (a->kernel >= FM_FP8MMA_WG32 && cc != 90) return (int)cudaErrorNotSupported; /* wgmma: sm_90a only */
        const size_t smem = fm_fp8mma_smem_bytes(a->kernel, nv ? FM_FORMAT_NVFP4 : FM_FORMAT_MXFP4);
        int          optin = 0;
        if ((e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess) return (int)e;
        if (smem > (size_t)optin) return (int)cudaErrorInvalidConfiguration;
        if (a->max_rows == 0) return 0;
        cudaStream_t s = (cudaStream_t)stream;
        switch (a->kernel) { /* fm_tile_layout.h's lists */
#define FM_FP8W_CASE(tok, mt, st)                                                                                      \
    case FM_FP8MMA_WG##tok: return launch_wg<tok, mt, st>(*a, smem, cc, s);
            FM_FP8W_LIST(FM_FP8W_CASE)
#undef FM_FP8W_CASE
#define FM_FP8WS_CASE(tok, cw, st)                                                                                     \
    case FM_FP8MMA_WS##tok: return launch_ws<tok, cw, st>(*a, smem, cc, s);
            FM_FP8WS_LIST(FM_FP8WS_CASE)
#undef FM_FP8WS_CASE
#define FM_FP8S_CASE(tok, nt, st)                                                                                      \
    case FM_FP8MMA_STAGED##tok: return nv ? launch_staged<true, nt, st>(*a, smem, s) : launch_staged<false, nt, st>(*a, smem, s);
            FM_FP8S_LIST(FM_FP8S_CASE)
#undef FM_FP8S_CASE
        default: return (int)cudaErrorInvalidValue;
        }
    }
    if (a->max_rows == 0) return 0;
    const dim3 grid((unsigned)((a->N / 16 + NW - 1) / NW), (unsigned)a->E);
    int        k = a->kernel;
    /* measured (bench_fp8mma, H200 2026-12-06): MXFP4 16 tokens a pass at every m (8-256 rows per
     * expert: 123-1,814 us against 229-1,957 with 32); NVFP4 32 from 32 rows per expert on
     * (1,011 against 1,196 us at 32, 7,959 against 9,518 at 256), 16 below (584 against 943 at 8) */
    if (k == FM_FP8MMA_AUTO) k = nv && a->max_rows >= 24 * a->E ? FM_FP8MMA_PIPE32 : FM_FP8MMA_PIPE16;
    cudaStream_t s = (cudaStream_t)stream;
    if (k == FM_FP8MMA_FIRST) fp8mma_kernel<<<grid, NW * 32, 0, s>>>(*a);
    else if (nv) k == FM_FP8MMA_PIPE16 ? fp8mma_pipe_kernel<2, true><<<grid, NW * 32, 0, s>>>(*a)
                                       : fp8mma_pipe_kernel<4, true><<<grid, NW * 32, 0, s>>>(*a);
    else k == FM_FP8MMA_PIPE16 ? fp8mma_pipe_kernel<2, false><<<grid, NW * 32, 0, s>>>(*a)
                               : fp8mma_pipe_kernel<4, false><<<grid, NW * 32, 0, s>>>(*a);
    return (int)cudaGetLastError();
}
