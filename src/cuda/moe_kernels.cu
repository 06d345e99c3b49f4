/* moe_kernels.cu - the small kernels around the grouped GEMMs of the cuda
 * backend: router logits and the gather of token rows into expert order.
 * Both are tiny next to the weight stream (T x E dot products of length H; T*k
 * row copies), so they are written for clarity: one warp per output. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/moe_kernels.h"

namespace {

/* logits[t][e] = x[t] . router_w[e], FP64 accumulation so that the ranking
 * matches the FP32 CPU reference except for true near-ties. */
__global__ void router_logits_kernel(const uint16_t *x, const float *rw, int T, int E, int H, float *logits)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= T * E) return;
    int          t = warp / E, e = warp % E;
    const uint16_t *xr = x + (size_t)t * H;
    const float    *wr = rw + (size_t)e * H;
    double          s = 0;
    for (int k = lane; k < H; k += 32) s += (double)__uint_as_float((uint32_t)xr[k] << 16) * wr[k];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) logits[(size_t)t * E + e] = (float)s;
}

/* xp[p] = x[perm[p] / top_k] (16-byte copies; H % 8 == 0). */
__global__ void gather_rows_kernel(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, uint16_t *xp)
{
    int p = blockIdx.y;
    if (p >= rows) return;
    const uint4 *src = (const uint4 *)(x + (size_t)(perm[p] / top_k) * H);
    uint4       *dst = (uint4 *)(xp + (size_t)p * H);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H / 8; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

} // namespace

extern "C" int fm_moe_router_logits_launch(const uint16_t *x, const float *rw, int T, int E, int H, float *logits,
                                           void *stream)
{
    long long warps = (long long)T * E;
    unsigned  blocks = (unsigned)((warps * 32 + 255) / 256);
    router_logits_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
    return (int)cudaGetLastError();
}

extern "C" int fm_moe_gather_launch(const uint16_t *x, const int32_t *perm, int rows, int top_k, int H, uint16_t *xp,
                                    void *stream)
{
    if (rows <= 0) return 0;
    dim3 grid((unsigned)((H / 8 + 255) / 256), (unsigned)rows);
    gather_rows_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(x, perm, rows, top_k, H, xp);
    return (int)cudaGetLastError();
}
