/* gemm_wgmma.cu - the launcher of the wgmma grouped GEMM kernels (gemm_wgmma.cuh,
 * sm_90a), and the X-packing kernel their packed-X form reads. The kernels live in
 * generated units compiled for sm_90a alone (gemm_wgmma_row.cuh); this file reaches
 * them through the build's table (units.h: fm_wgmma_units) and launches them by handle.
 * A build without sm_90a has every entry NULL: device.c then offers no wgmma tile. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "cuda/units.h"
#include "kernels/fm_build.h"
#include "kernels/fm_tile_layout.h" /* FM_WGMMA_PRODUCER_WARPS */

namespace {

__global__ void x_pack_kernel(const uint4 *x, uint4 *out, int rows, int k)
{
    /* one thread per 16-byte output chunk j of a 64-column block: gathers 4 pairs */
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, nch = (long long)rows * (k / 8);
    if (i >= nch) return;
    long long row = i / (k / 8);
    int       c8 = (int)(i % (k / 8)), blk = c8 >> 3, j = c8 & 7;
    const uint32_t *src = (const uint32_t *)(x + row * (k / 8) + blk * 8); /* 32 pairs of the block */
    /* packed chunk j = core column (s, h) = j: pairs 8t + j for t = 0..3 */
    out[i] = make_uint4(src[j], src[8 + j], src[16 + j], src[24 + j]);
}

#define FM_WGMMA_MAX_DEV 64
#define FM_WGMMA_MAX_ROWS 64
size_t k_dyn_set[FM_WGMMA_MAX_DEV][FM_WGMMA_MAX_ROWS][4];

const fm_wgmma_unit *unit(int idx) { return idx >= 0 && idx < fm_build_n_wgmma ? fm_wgmma_units[idx] : NULL; }

} // namespace

extern "C" int fm_wgmma_persistent(int idx) { return unit(idx) && unit(idx)->persist; }

/* CTAs of a launch: one per tile (an upper bound: the device has the counts), the
 * persistent kernel at most one per SM of the device (sms) */
extern "C" long long fm_wgmma_grid(int idx, const fm_gemm_params *p, int sms)
{
    const fm_wgmma_unit *x = unit(idx);
    if (!x) return -1;
    long long tok = 8LL * x->nt;
    int       per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x->warps * x->mt / 2 : x->warps * x->mt; /* bands per CTA */
    int       bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    long long nfb = (bands + per_cta - 1) / per_cta;
    /* sum over experts of ceil(m_e / tok) <= (max_rows + E*(tok-1)) / tok */
    long long passes = ((long long)p->max_rows + (long long)p->n_experts * (tok - 1)) / tok;
    long long tiles = nfb * passes;
    if (x->persist && tiles > sms) tiles = sms; /* one CTA per SM: its registers and shared memory allow no second */
    return tiles;
}

extern "C" int fm_wgmma_launch(int dev, int sms, int idx, const fm_gemm_params *p, const fm_gemm_oss *oss_args,
                               size_t smem, void *stream)
{
    const fm_wgmma_unit *x = unit(idx);
    if (!x) return (int)cudaErrorInvalidDeviceFunction; /* not in this build */
    const int   nat = !p->x_packed;
    /* gpt-oss's epilogues only where the call has them (kernel_common.cuh: why separate kernels) */
    const int   oss = oss_args && (oss_args->bias != NULL || oss_args->act != FM_ACT_SWIGLU);
    const void *fn = oss ? (nat ? x->oss->natural : x->oss->packed) : nat ? x->natural : x->packed;
    if (!fn) return (int)cudaErrorInvalidValue; /* the launcher refuses natural X for it first */
    size_t *set = dev >= 0 && dev < FM_WGMMA_MAX_DEV && idx < FM_WGMMA_MAX_ROWS ? &k_dyn_set[dev][idx][nat + 2 * oss] : NULL;
    if (!set || smem > *set) {
        cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return (int)err;
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared);
        if (err != cudaSuccess) return (int)err;
        if (set) *set = smem;
    }
    int       per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x->warps * x->mt / 2 : x->warps * x->mt;
    int       bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    int       nfb = (bands + per_cta - 1) / per_cta;
    long long grid = fm_wgmma_grid(idx, p, sms);
    if (grid < 0) return (int)cudaErrorInvalidDevice;
    if (grid == 0) return 0; /* no rows: nothing to launch */
    if (grid > 0x7FFFFFFFLL) return (int)cudaErrorInvalidConfiguration;
    /* packed X: + the producer warpgroup (fm_kernel_threads counts the same: the kernels'
     * __launch_bounds__ and test_kernel_resources hold all three to one constant) */
    const int threads = (nat ? x->warps : x->warps + FM_WGMMA_PRODUCER_WARPS) * 32;
    void     *args[] = {(void *)p, (void *)&nfb, (void *)oss_args}; /* oss_args: the twins' third parameter */
    if (p->pdl) return (int)fm_launch_pdl(fn, dim3((unsigned)grid), dim3(threads), smem, stream, args);
    return (int)cudaLaunchKernel(fn, dim3((unsigned)grid), dim3(threads), args, smem, (cudaStream_t)stream);
}

extern "C" int fm_wgmma_occupancy(int idx, int x_packed, size_t smem, int *blocks, int *regs)
{
    const fm_wgmma_unit *x = unit(idx);
    if (!x) return (int)cudaErrorInvalidValue;
    const void *fn = x_packed ? x->packed : x->natural;
    if (!fn) return (int)cudaErrorInvalidValue;
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            blocks, fn, (x_packed ? x->warps + FM_WGMMA_PRODUCER_WARPS : x->warps) * 32, smem);
    cudaFuncAttributes a;
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, fn);
    if (err == cudaSuccess) *regs = a.numRegs;
    return (int)err;
}

extern "C" int fm_wgmma_attributes(int idx, int x_packed, size_t *static_smem, size_t *max_dyn)
{
    const fm_wgmma_unit *x = unit(idx);
    if (!x) return (int)cudaErrorInvalidValue;
    const void *fn = x_packed ? x->packed : x->natural;
    if (!fn) return (int)cudaErrorInvalidValue;
    cudaFuncAttributes a;
    cudaError_t        err = cudaFuncGetAttributes(&a, fn);
    if (err != cudaSuccess) return (int)err;
    if (static_smem) *static_smem = a.sharedSizeBytes;
    if (max_dyn) *max_dyn = (size_t)a.maxDynamicSharedSizeBytes;
    return 0;
}

extern "C" int fm_x_pack_launch(const uint16_t *x, uint16_t *out, int rows, int k, void *stream)
{
    long long nch = (long long)rows * (k / 8);
    if (nch <= 0) return 0;
    long long blocks = (nch + 255) / 256;
    if (blocks > 0x7FFFFFFFLL) return (int)cudaErrorInvalidConfiguration;
    x_pack_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>((const uint4 *)x, (uint4 *)out, rows, k);
    return (int)cudaGetLastError();
}

extern "C" const void *fm_wgmma_generic_kernel(void) { return (const void *)x_pack_kernel; }
