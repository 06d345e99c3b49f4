/* act_fp8.cu - FP8 activations on the device (W4A8, docs/formats.md "FP8 activations"):
 * rows quantized to E4M3 codes with one FP32 scale per 128 columns (FM_ACT_FP8_BLOCK128) or
 * per row (FM_ACT_FP8_TOKEN), the numbers of the CPU oracle's fm_moe_act_fp8_row
 * (src/moe/shared.c) bit for bit:
 *   amax = max |v| over the block, s = amax / 448 (FP32 division, nearest even), s = 1 where
 *   s < FLT_MIN (a zero block, or one whose values all underflow E4M3 anyway),
 *   q = E4M3(v / s): the FP32 quotient rounded to nearest even, saturating at +-448
 *   (cvt.rn.satfinite; amax / s can exceed 448 by an ulp of s's rounding).
 * The GEMM then sees dec(q) x s. The source is a gather of BF16 token rows (row p = x[perm[p]
 * / top_k], the layer's FC1 input, with the gather's NaN/Inf report) or FP32 rows in place
 * (FC1's output, FC2's input). One CTA of 128 threads per row: block128 gives each warp
 * whole 128-column blocks (4 columns a lane, a warp max), token reduces the row's max across
 * the CTA first. The W4A8 GEMMs (gemm_fp8.cu) read q and s; this is their input, tested
 * against the oracle on its own (tests/gpu/test_cuda_act_fp8.c). */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "cuda/moe_kernels.h"
#include "fp4moe/moe.h"

namespace {

constexpr int NTHR = 128;

__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Four consecutive columns c..c+3 of the source row (c % 4 == 0; those past n read as 0). */
__device__ __forceinline__ void load4(const uint16_t *xb, const float *xf, int n, int c, float (&v)[4])
{
    if (c + 4 <= n && xb) {
        const uint2 u = *(const uint2 *)(xb + c);
        v[0] = bf16_to_f32((uint16_t)(u.x & 0xffffu)), v[1] = bf16_to_f32((uint16_t)(u.x >> 16));
        v[2] = bf16_to_f32((uint16_t)(u.y & 0xffffu)), v[3] = bf16_to_f32((uint16_t)(u.y >> 16));
        return;
    }
    if (c + 4 <= n) {
        const float4 f = *(const float4 *)(xf + c);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        return;
    }
    for (int i = 0; i < 4; i++) v[i] = c + i < n ? (xb ? bf16_to_f32(xb[c + i]) : xf[c + i]) : 0.0f;
}

__device__ __forceinline__ float amax4(const float (&v)[4])
{
    return fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
}

/* The largest of every thread's m in the CTA of NTHR threads, for every thread */
__device__ __forceinline__ float cta_max(float m)
{
    __shared__ float wmax[NTHR / 32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = wmax[0];
    for (int w = 1; w < NTHR / 32; w++) amax = fmaxf(amax, wmax[w]);
    return amax;
}

__device__ __forceinline__ float scale_of(float amax)
{
    float s = __fdiv_rn(amax, 448.0f);
    return s >= FLT_MIN ? s : 1.0f; /* also amax NaN: never reached, NaN rows are reported */
}

/* q for columns c..c+3 (those < n), one 32-bit store where all four are in the row */
__device__ __forceinline__ void store4(uint8_t *qr, int n, int c, const float (&v)[4], float s)
{
    uint32_t w = 0;
    for (int i = 0; i < 4; i++) {
        const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(__fdiv_rn(v[i], s), __NV_SATFINITE, __NV_E4M3);
        w |= (uint32_t)q << (8 * i);
    }
    if (c + 4 <= n) *(uint32_t *)(qr + c) = w;
    else
        for (int i = 0; c + i < n; i++) qr[c + i] = (uint8_t)(w >> (8 * i));
}

/* bad (or NULL): atomicMin of the smallest src_row * n + c whose value is NaN/Inf */
__device__ __forceinline__ void check4(const float (&v)[4], int n, int c, long long src_row,
                                       unsigned long long *bad)
{
    if (!bad) return;
    for (int i = 0; i < 4; i++)
        if (c + i < n && !isfinite(v[i])) {
            atomicMin(bad, (unsigned long long)(src_row * n + c + i));
            return;
        }
}

__global__ void __launch_bounds__(NTHR) act_fp8_kernel(const uint16_t *x, const float *xf, const int32_t *perm,
                                                       int top_k, int rows, const int32_t *n_rows, int n, int mode,
                                                       uint8_t *q, long long ldq, float *scales, int ldsc,
                                                       unsigned long long *bad)
{
    const int p = blockIdx.x;
    if (p >= rows || (n_rows && p >= *n_rows)) return;
    const long long src = perm ? (long long)(perm[p] / top_k) : p;
    const uint16_t *xb = x ? x + src * n : nullptr;
    const float    *xr = x ? nullptr : xf + src * n;
    uint8_t        *qr = q + (long long)p * ldq;
    float          *sr = scales + (long long)p * ldsc;
    const int       warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (mode == FM_ACT_FP8_MODE_BLOCK128) {
        const int nb = (n + 127) / 128;
        for (int b = warp; b < nb; b += NTHR / 32) {
            const int c = b * 128 + lane * 4;
            float     v[4];
            load4(xb, xr, n, c, v);
            check4(v, n, c, src, bad);
            const float amax = warp_max(amax4(v));
            const float s = scale_of(amax);
            store4(qr, n, c, v, s);
            if (lane == 0) sr[b] = s;
        }
        return;
    }
    float m = 0.0f;
    for (int c = threadIdx.x * 4; c < n; c += NTHR * 4) {
        float v[4];
        load4(xb, xr, n, c, v);
        check4(v, n, c, src, bad);
        m = fmaxf(m, amax4(v));
    }
    const float s = scale_of(cta_max(m));
    for (int c = threadIdx.x * 4; c < n; c += NTHR * 4) {
        float v[4];
        load4(xb, xr, n, c, v);
        store4(qr, n, c, v, s);
    }
    if (threadIdx.x == 0) sr[0] = s;
}

/* One element of W4A8's activation from FC1's gate and up outputs g, u of expert e (global
 * scales sg, su; FC1 biases *bg, *bu, NULL without): FP32 throughout and expf, as
 * fm_moe_expert_act on the CPU */
__device__ __forceinline__ float act1(float g, float u, float sg, float su, const float *bg, const float *bu, int act,
                                      float limit)
{
    float gv = g * sg, uv = u * su;
    if (bg) gv += *bg, uv += *bu;
    if (act == FM_ACT_SWIGLU_GPTOSS) {
        gv = gv > limit ? limit : gv; /* comparisons, not fminf: a NaN stays NaN, as torch.clamp */
        uv = uv > limit ? limit : uv < -limit ? -limit : uv;
        return (uv + 1.0f) * (gv / (1.0f + expf(-1.702f * gv)));
    }
    return gv / (1.0f + expf(-gv)) * uv;
}

/* Columns c..c+3 of row p's activation into v (c % 4 == 0, I % 4 == 0: all four in the row or
 * none, and then 0, as load4's); *bad |= a NaN/Inf among them */
__device__ __forceinline__ void act4(const float *yr, int I, int c, float sg, float su, const float *b13e, int act,
                                     float limit, float (&v)[4], int *bad)
{
    if (c >= I) {
        v[0] = v[1] = v[2] = v[3] = 0.0f;
        return;
    }
    const float4 g = *(const float4 *)(yr + c), u = *(const float4 *)(yr + I + c);
    float4       bg = make_float4(0.0f, 0.0f, 0.0f, 0.0f), bu = bg;
    if (b13e) bg = *(const float4 *)(b13e + c), bu = *(const float4 *)(b13e + I + c);
    const int b = b13e != nullptr;
    v[0] = act1(g.x, u.x, sg, su, b ? &bg.x : nullptr, &bu.x, act, limit);
    v[1] = act1(g.y, u.y, sg, su, b ? &bg.y : nullptr, &bu.y, act, limit);
    v[2] = act1(g.z, u.z, sg, su, b ? &bg.z : nullptr, &bu.z, act, limit);
    v[3] = act1(g.w, u.w, sg, su, b ? &bg.w : nullptr, &bu.w, act, limit);
    *bad |= !isfinite(v[0]) || !isfinite(v[1]) || !isfinite(v[2]) || !isfinite(v[3]);
}

/* W4A8's activation quantized for FC2 in one pass (fm_w4a8_act_fp8_launch): one CTA of 128
 * threads per row p < off[L], its expert found by a binary search of off; h computed in FP32
 * (act1) and quantized as act_fp8_kernel quantizes an FP32 row (block128: a warp per 128
 * columns, 4 a lane; token: the row's max over the CTA, then h computed again from y1's row,
 * hot in L1 / L2, and its codes: the same bits, and no shared memory, so any I), so the codes
 * and scales are those of h written out and quantized apart, without h's round trip through
 * memory. */
__global__ void __launch_bounds__(NTHR) w4a8_act_fp8_kernel(const float *y1, const int32_t *off, int L, int rows,
                                                            int I, const float *gs, const float *us, const float *b13,
                                                            int act, float limit, int mode, uint8_t *q, float *scales,
                                                            int ldsc, unsigned long long *bad_h)
{
    const int p = blockIdx.x;
    if (p >= rows || p >= off[L]) return;
    int lo = 0, hi = L; /* the expert of row p: off[lo] <= p < off[lo + 1] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (off[mid] <= p) lo = mid;
        else hi = mid;
    }
    const int    e = lo, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *yr = y1 + (size_t)p * 2 * I, *b13e = b13 ? b13 + (size_t)e * 2 * I : nullptr;
    const float  sg = gs[e], su = us[e];
    uint8_t     *qr = q + (size_t)p * I;
    float       *sr = scales + (size_t)p * ldsc;
    int          bad = 0;
    if (mode == FM_ACT_FP8_MODE_BLOCK128) {
        const int nb = (I + 127) / 128;
        for (int b = warp; b < nb; b += NTHR / 32) {
            const int c = b * 128 + lane * 4;
            float     v[4];
            act4(yr, I, c, sg, su, b13e, act, limit, v, &bad);
            const float amax = warp_max(amax4(v));
            const float s = scale_of(amax);
            store4(qr, I, c, v, s);
            if (lane == 0) sr[b] = s;
        }
    } else {
        float m = 0.0f;
        for (int c = threadIdx.x * 4; c < I; c += NTHR * 4) {
            float v[4];
            act4(yr, I, c, sg, su, b13e, act, limit, v, &bad);
            m = fmaxf(m, amax4(v));
        }
        const float s = scale_of(cta_max(m));
        for (int c = threadIdx.x * 4; c < I; c += NTHR * 4) { /* the same columns, the same values */
            float v[4];
            act4(yr, I, c, sg, su, b13e, act, limit, v, &bad);
            store4(qr, I, c, v, s);
        }
        if (threadIdx.x == 0) sr[0] = s;
    }
    if (bad) atomicMin(bad_h, (unsigned long long)e);
}

/* FP8 rows as a dispatch leaves them (fm_fp8_rows_launch): row p = row perm[p] of the source,
 * its codes (16 bytes a thread) and its scales copied as they are; a NaN code (0x7F / 0xFF) or
 * a scale that is not finite and > 0 recorded at its element (a scale at its block's first) */
__global__ void __launch_bounds__(NTHR) fp8_rows_kernel(const uint8_t *xq, const float *xs, const int32_t *perm,
                                                        int rows, const int32_t *n_rows, int n, uint8_t *q,
                                                        long long ldq, float *scales, int ldsc,
                                                        unsigned long long *bad)
{
    const int p = blockIdx.x;
    if (p >= rows || (n_rows && p >= *n_rows)) return;
    const long long src = perm[p];
    const int       nb = (n + 127) / 128;
    for (int c = threadIdx.x * 16; c < n; c += NTHR * 16) {
        const uint4 w = *(const uint4 *)(xq + src * n + c);
        *(uint4 *)(q + (long long)p * ldq + c) = w;
        if (!bad) continue;
        const uint32_t v[4] = {w.x, w.y, w.z, w.w};
        for (int i = 0; i < 16; i++)
            if ((v[i >> 2] >> (8 * (i & 3)) & 0x7fu) == 0x7fu) {
                atomicMin(bad, (unsigned long long)(src * n + c + i));
                break;
            }
    }
    for (int b = threadIdx.x; b < nb; b += NTHR) {
        const float sc = xs[src * nb + b];
        scales[(long long)p * ldsc + b] = sc;
        if (bad && !(sc > 0.0f && sc <= FLT_MAX)) atomicMin(bad, (unsigned long long)(src * n + b * 128));
    }
}

} // namespace

extern "C" int fm_w4a8_act_fp8_launch(const float *y1, const int32_t *off, int L, int rows, int I, const float *gs,
                                      const float *us, const float *b13, int act, float limit, int mode, uint8_t *q,
                                      float *scales, int ldsc, unsigned long long *bad_h, void *stream)
{
    if (rows <= 0) return 0;
    if (!y1 || !off || !gs || !us || !q || !scales || !bad_h || L < 1 || I < 4 || I % 4 ||
        (mode != FM_ACT_FP8_MODE_BLOCK128 && mode != FM_ACT_FP8_MODE_TOKEN) || ldsc < fm_act_fp8_nscales(mode, I))
        return (int)cudaErrorInvalidValue;
    /* 16-byte loads of y1 and b13, 4-byte code stores */
    if (((uintptr_t)y1 & 15) || ((uintptr_t)b13 & 15) || ((uintptr_t)q & 3) || ((uintptr_t)scales & 3))
        return (int)cudaErrorMisalignedAddress;
    w4a8_act_fp8_kernel<<<(unsigned)rows, NTHR, 0, (cudaStream_t)stream>>>(y1, off, L, rows, I, gs, us, b13, act,
                                                                              limit, mode, q, scales, ldsc, bad_h);
    return (int)cudaGetLastError();
}

extern "C" int fm_act_fp8_launch(const uint16_t *x, const float *xf, const int32_t *perm, int top_k, int rows,
                                 const int32_t *n_rows, int n, int mode, uint8_t *q, long long ldq, float *scales,
                                 int ldsc, unsigned long long *bad, void *stream)
{
    if (rows <= 0) return 0;
    const int nsc = fm_act_fp8_nscales(mode, n);
    if (!x == !xf || (perm && !x) || n < 1 || n % 4 || ldq < n || ldq % 4 || ldsc < nsc || top_k < 1 ||
        (mode != FM_ACT_FP8_MODE_BLOCK128 && mode != FM_ACT_FP8_MODE_TOKEN))
        return (int)cudaErrorInvalidValue;
    /* the vector accesses: 8-byte BF16 loads, 16-byte FP32 loads, 4-byte code stores */
    if (((uintptr_t)x & 7) || ((uintptr_t)xf & 15) || ((uintptr_t)q & 3) || ((uintptr_t)scales & 3))
        return (int)cudaErrorMisalignedAddress;
    act_fp8_kernel<<<(unsigned)rows, NTHR, 0, (cudaStream_t)stream>>>(x, xf, perm, top_k, rows, n_rows, n, mode, q,
                                                                     ldq, scales, ldsc, bad);
    return (int)cudaGetLastError();
}

extern "C" int fm_fp8_rows_launch(const uint8_t *xq, const float *xs, const int32_t *perm, int rows,
                                  const int32_t *n_rows, int n, uint8_t *q, long long ldq, float *scales, int ldsc,
                                  unsigned long long *bad, void *stream)
{
    if (rows <= 0) return 0;
    if (!xq || !xs || !perm || !q || !scales || n < 16 || n % 16 || ldq < n || ldq % 16 || ldsc < (n + 127) / 128)
        return (int)cudaErrorInvalidValue;
    if (((uintptr_t)xq & 15) || ((uintptr_t)q & 15) || ((uintptr_t)xs & 3) || ((uintptr_t)scales & 3))
        return (int)cudaErrorMisalignedAddress; /* 16-byte code copies, 4-byte scales */
    fp8_rows_kernel<<<(unsigned)rows, NTHR, 0, (cudaStream_t)stream>>>(xq, xs, perm, rows, n_rows, n, q, ldq, scales,
                                                                      ldsc, bad);
    return (int)cudaGetLastError();
}
