/* moe_kernels.cu - the small kernels around the grouped GEMMs of the cuda
 * backend besides routing (route.cu): the gather of token rows into expert order,
 * the store of dispatched rows' results back into their layout, and the BF16 shared
 * expert, a BF16 GEMV per token (decode batches), written
 * for clarity: one warp per output, FP32 accumulation, 16-byte loads. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/kernel_common.cuh"
#include "cuda/moe_kernels.h"

namespace {

/* xp[p] = x[perm[p] / top_k] (16-byte copies; H % 8 == 0). packed: the columns
 * in the prepack K order (fm_cuda_kpack_col; H % 64 == 0): 16-byte chunk j of a
 * 64-column block holds the column pairs 8t + j, t = 0..3 (what wgmma tiles read). */
__device__ __forceinline__ bool bf16x2_nonfinite(uint32_t v) /* either half has exponent all ones */
{
    return (v & 0x7f800000u) == 0x7f800000u || (v & 0x7f80u) == 0x7f80u;
}

__global__ void gather_rows_kernel(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, int packed,
                                   uint16_t *xp, const int32_t *n_rows, unsigned long long *bad_x, int pdl)
{
    if (pdl) { /* FC1 (launched with PDL) may then be scheduled during the gather; it waits for it */
        fm_kc::pdl_trigger();
        fm_kc::pdl_wait();
    }
    int p = blockIdx.y;
    if (p >= rows || (n_rows && p >= *n_rows)) return;
    const size_t t = (size_t)(perm[p] / top_k);
    const uint4 *src = (const uint4 *)(x + t * H);
    uint4       *dst = (uint4 *)(xp + (size_t)p * H);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H / 8; i += gridDim.x * blockDim.x) {
        uint4 v;
        if (!packed) {
            v = src[i];
        } else {
            const uint32_t *b = (const uint32_t *)(src + (i & ~7)); /* the 32 pairs of the block */
            int             j = i & 7;
            v = make_uint4(b[j], b[8 + j], b[16 + j], b[24 + j]);
        }
        dst[i] = v;
        if (bad_x && (bf16x2_nonfinite(v.x) | bf16x2_nonfinite(v.y) | bf16x2_nonfinite(v.z) | bf16x2_nonfinite(v.w))) {
            /* rare: find the first bad column of what this chunk copied (natural: its 8
             * columns; packed: it holds pairs from the whole 64-column block) */
            const size_t c0 = packed ? (size_t)(i & ~7) * 8 : (size_t)i * 8;
            const int    nc = packed ? 64 : 8;
            for (int q = 0; q < nc; q++)
                if ((x[t * H + c0 + q] & 0x7f80u) == 0x7f80u) {
                    atomicMin(bad_x, (unsigned long long)(t * H + c0 + q));
                    break;
                }
        }
    }
}

__global__ void store_bf16_kernel(const float *in, long long n4, uint16_t *out)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 v = ((const float4 *)in)[i];
        uint2  o;
        o.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.x)) |
              ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.y)) << 16);
        o.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.z)) |
              ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.w)) << 16);
        ((uint2 *)out)[i] = o;
    }
}

/* out[perm[p]] = scratch[p], FP32 or BF16 (RNE, as the finalize reduce rounds), one
 * packed row per blockIdx.y, a float4 per thread; rows past *n_rows are left alone. */
__global__ void dispatch_store_kernel(const float *scratch, const int32_t *perm, const int32_t *n_rows, int rows,
                                      int H, float *out, uint16_t *out_bf16)
{
    const int p = blockIdx.y, c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (p >= rows || p >= *n_rows || c >= H) return;
    const float4 v = *(const float4 *)(scratch + (size_t)p * H + c);
    const size_t o = (size_t)perm[p] * H + c;
    if (out_bf16) {
        uint2 b;
        b.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.x)) |
              ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.y)) << 16);
        b.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.z)) |
              ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v.w)) << 16);
        *(uint2 *)(out_bf16 + o) = b;
    } else {
        *(float4 *)(out + o) = v;
    }
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

/* sum over 8-element chunks of a . b, both BF16 rows of n elements (n % 8 == 0) */
__device__ __forceinline__ float warp_dot_bf16(const uint16_t *a, const uint16_t *b, int n, int lane)
{
    float s = 0;
    for (int i = lane * 8; i < n; i += 256) {
        uint4 x = *(const uint4 *)(a + i), y = *(const uint4 *)(b + i);
        s += bf16_lo(x.x) * bf16_lo(y.x) + bf16_hi(x.x) * bf16_hi(y.x) + bf16_lo(x.y) * bf16_lo(y.y) +
             bf16_hi(x.y) * bf16_hi(y.y) + bf16_lo(x.z) * bf16_lo(y.z) + bf16_hi(x.z) * bf16_hi(y.z) +
             bf16_lo(x.w) * bf16_lo(y.w) + bf16_hi(x.w) * bf16_hi(y.w);
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* hs[t][j] = silu(x[t] . w13[j]) * (x[t] . w13[S + j]) */
__global__ void shared_fc1_kernel(const uint16_t *x, const uint16_t *w13, int T, int H, int S, float *hs)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= T * S) return;
    int   t = warp / S, j = warp % S;
    float g = warp_dot_bf16(x + (size_t)t * H, w13 + (size_t)j * H, H, lane);
    float u = warp_dot_bf16(x + (size_t)t * H, w13 + (size_t)(S + j) * H, H, lane);
    if (lane == 0) hs[(size_t)t * S + j] = g / (1.0f + expf(-g)) * u;
}

/* out[t][n] += hs[t] . w2[n] (hs FP32, w2 BF16) */
__global__ void shared_fc2_kernel(const float *hs, const uint16_t *w2, int T, int H, int S, float *out)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= T * H) return;
    int          t = warp / H, n = warp % H;
    const float *h = hs + (size_t)t * S;
    const uint16_t *w = w2 + (size_t)n * S;
    float        s = 0;
    for (int i = lane * 8; i < S; i += 256) {
        uint4  y = *(const uint4 *)(w + i);
        float4 a = *(const float4 *)(h + i), b = *(const float4 *)(h + i + 4);
        s += a.x * bf16_lo(y.x) + a.y * bf16_hi(y.x) + a.z * bf16_lo(y.y) + a.w * bf16_hi(y.y) + b.x * bf16_lo(y.z) +
             b.y * bf16_hi(y.z) + b.z * bf16_lo(y.w) + b.w * bf16_hi(y.w);
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[(size_t)t * H + n] += s;
}

} // namespace

extern "C" int fm_moe_shared_expert_launch(const uint16_t *x, const uint16_t *w13, const uint16_t *w2, int T, int H,
                                           int S, float *hs, float *out, void *stream)
{
    long long w1 = (long long)T * S, w2n = (long long)T * H;
    shared_fc1_kernel<<<(unsigned)((w1 * 32 + 255) / 256), 256, 0, (cudaStream_t)stream>>>(x, w13, T, H, S, hs);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    shared_fc2_kernel<<<(unsigned)((w2n * 32 + 255) / 256), 256, 0, (cudaStream_t)stream>>>(hs, w2, T, H, S, out);
    return (int)cudaGetLastError();
}

extern "C" int fm_moe_gather_launch(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, int packed,
                                    uint16_t *xp, const int32_t *n_rows, unsigned long long *bad_x, int pdl,
                                    void *stream)
{
    if (rows <= 0) return 0;
    if (packed && H % 64) return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)((H / 8 + 255) / 256), (unsigned)rows);
    if (pdl) {
        void *args[] = {(void *)&x,  (void *)&perm,   (void *)&rows,  (void *)&top_k, (void *)&H,
                        (void *)&packed, (void *)&xp, (void *)&n_rows, (void *)&bad_x, (void *)&pdl};
        return (int)fm_launch_pdl((const void *)gather_rows_kernel, grid, dim3(256), 0, stream, args);
    }
    gather_rows_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(x, perm, rows, top_k, H, packed, xp, n_rows, bad_x, 0);
    return (int)cudaGetLastError();
}

extern "C" int fm_moe_store_bf16_launch(const float *in, long long n, uint16_t *out, void *stream)
{
    if (n <= 0) return 0;
    if (n % 4) return (int)cudaErrorInvalidValue;
    long long blocks = (n / 4 + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    store_bf16_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(in, n / 4, out);
    return (int)cudaGetLastError();
}

extern "C" int fm_moe_dispatch_store_launch(const float *scratch, const int32_t *perm, const int32_t *n_rows, int rows,
                                            int H, float *out, uint16_t *out_bf16, void *stream)
{
    if (rows <= 0) return 0;
    if (H % 4 || rows > 65535) return (int)cudaErrorInvalidValue; /* rows: the grid's y */
    dim3 grid((unsigned)((H / 4 + 127) / 128), (unsigned)rows);
    dispatch_store_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(scratch, perm, n_rows, rows, H, out, out_bf16);
    return (int)cudaGetLastError();
}

extern "C" const void *fm_moe_generic_kernel(void) { return (const void *)gather_rows_kernel; }
