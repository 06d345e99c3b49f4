/* gemm_mma.cu - the launcher of the mma.sync grouped GEMM kernels (gemm_mma.cuh),
 * and the finalize reduce kernel. The kernels live in generated units, one catalogue
 * row each (gemm_mma_row.cuh); this file reaches them through the build's table
 * (units.h: fm_mma_units, NULL for a row no target of the build carries) and launches
 * them by handle (cudaLaunchKernel / cudaLaunchKernelEx). Whether the device has code
 * for a row is device.c's question, asked once at open; the launcher is given the
 * device's ordinal and never asks the runtime which device is current. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "cuda/units.h"
#include "kernels/fm_build.h"

namespace {
using namespace fm_kc;

__global__ void finalize_reduce_kernel(const float *scratch, const int32_t *token_slots, int n_tokens, int top_k,
                                       int n, int max_rows, const float *init, float *out, uint16_t *out_bf16)
{
    pdl_trigger(); /* no-ops unless launched with PDL (fm_finalize_reduce_launch's pdl) */
    pdl_wait();
    int tkn = blockIdx.y;
    int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (tkn >= n_tokens || c >= n) return;
    float4 acc = init ? *(const float4 *)(init + (size_t)tkn * n + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < top_k; j++) { /* fixed slot order: deterministic */
        int r = token_slots[tkn * top_k + j];
        if (r < 0 || r >= max_rows) continue;
        float4 v = *(const float4 *)(scratch + (size_t)r * n + c);
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
    }
    if (out_bf16) {
        uint2 o;
        o.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.x)) |
              ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.y)) << 16);
        o.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.z)) |
              ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.w)) << 16);
        *(uint2 *)(out_bf16 + (size_t)tkn * n + c) = o;
    } else {
        *(float4 *)(out + (size_t)tkn * n + c) = acc;
    }
}

/* Dynamic shared-memory attribute already set, per device and kernel (plain, MB, list)
 * (the attribute is per device and per function). A race between threads only repeats the
 * idempotent cudaFuncSetAttribute. Devices beyond FM_MMA_MAX_DEV always set it. */
#define FM_MMA_MAX_DEV 64
#define FM_MMA_MAX_ROWS 64
size_t k_dyn_set[FM_MMA_MAX_DEV][FM_MMA_MAX_ROWS][6];

const fm_mma_unit *unit(int idx) { return idx >= 0 && idx < fm_build_n_mma ? fm_mma_units[idx] : NULL; }

} // namespace

extern "C" int fm_mma_has_mb(int idx) { return unit(idx) && unit(idx)->mb != NULL; }

extern "C" int fm_mma_launch(int dev, int idx, const fm_gemm_params *p, const fm_gemm_work *work,
                             const fm_gemm_oss *oss_args, size_t smem, void *stream)
{
    const fm_mma_unit *x = unit(idx);
    if (!x) return (int)cudaErrorInvalidDeviceFunction; /* not in this build */
    const int mb = p->nb > 1;
    if (mb && !x->mb) return (int)cudaErrorInvalidValue;
    if (mb && work) return (int)cudaErrorInvalidValue; /* the work list and split K: the plain kernel only */
    /* gpt-oss's epilogues only where the call has them (kernel_common.cuh: why separate kernels) */
    const int   oss = oss_args && (oss_args->bias != NULL || oss_args->act != FM_ACT_SWIGLU);
    const void *fn = oss ? (mb ? x->oss->mb : work ? *x->oss->list : x->oss->plain) : mb ? x->mb : work ? *x->list : x->plain;
    size_t *set = dev >= 0 && dev < FM_MMA_MAX_DEV && idx < FM_MMA_MAX_ROWS
                      ? &k_dyn_set[dev][idx][(work ? 2 : mb) + 3 * oss]
                      : NULL;
    if (!set || smem > *set) {
        cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return (int)err;
        /* as much shared memory per SM as possible: the CTAs per SM are what keep bytes in flight */
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
        if (err != cudaSuccess) return (int)err;
        if (set) *set = smem;
    }
    int  per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x->warps * x->mt / 2 : x->warps * x->mt; /* bands per CTA */
    int  bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    int  blocks = (bands + per_cta - 1) / per_cta;
    dim3 grid((unsigned)(mb ? (blocks + p->nb - 1) / p->nb : blocks), (unsigned)p->n_experts);
    fm_gemm_work w;
    memset(&w, 0, sizeof w);
    if (work) { /* units of one expert: feature blocks x splits; a 1-D grid of `slots` experts' units with a list */
        w = *work;
        w.ksplit = w.ksplit > 1 ? w.ksplit : 1;
        w.nbx = blocks;
        w.upe = blocks * w.ksplit;
        int slots = w.slots > 0 && w.slots < p->n_experts ? w.slots : p->n_experts;
        grid = w.active ? dim3((unsigned)((long long)w.upe * slots)) : dim3((unsigned)w.upe, (unsigned)p->n_experts);
    }
    /* the plain and MB kernels take p alone, their twins p and oss; list: p, w (and oss) */
    void *args_plain[] = {(void *)p, (void *)oss_args}, *args_list[] = {(void *)p, (void *)&w, (void *)oss_args};
    void **args = work ? args_list : args_plain;
    if (!p->pdl) return (int)cudaLaunchKernel(fn, grid, dim3(x->warps * 32), args, smem, (cudaStream_t)stream);
    return (int)fm_launch_pdl(fn, grid, dim3(x->warps * 32), smem, stream, args);
}

extern "C" int fm_mma_occupancy(int idx, int mb, size_t smem, int *blocks, int *regs)
{
    const fm_mma_unit *x = unit(idx);
    if (!x || (mb && !x->mb)) return (int)cudaErrorInvalidValue;
    const void *fn = mb ? x->mb : x->plain;
    /* the launch's attributes (the tile's smem is fixed: fm_cuda_gemm sets this same value) */
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, fn, x->warps * 32, smem);
    cudaFuncAttributes a;
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&a, fn);
    if (err == cudaSuccess) *regs = a.numRegs;
    return (int)err;
}

extern "C" int fm_mma_attributes(int idx, size_t *static_smem, size_t *max_dyn)
{
    const fm_mma_unit *x = unit(idx);
    if (!x) return (int)cudaErrorInvalidValue;
    cudaFuncAttributes a;
    cudaError_t        err = cudaFuncGetAttributes(&a, x->plain);
    if (err != cudaSuccess) return (int)err;
    if (static_smem) *static_smem = a.sharedSizeBytes;
    if (max_dyn) *max_dyn = (size_t)a.maxDynamicSharedSizeBytes;
    return 0;
}

extern "C" int fm_mma_probe_timeline(void *buf, unsigned cap)
{
    int any = 0;
    for (int i = 0; i < fm_build_n_mma; i++) {
        const fm_mma_unit *x = unit(i);
        if (!x || !x->probe_timeline) continue;
        int err = x->probe_timeline(buf, cap);
        if (err) return err;
        any = 1;
    }
    return any ? 0 : -1; /* -1: not a probe build */
}

extern "C" const void *fm_mma_generic_kernel(void) { return (const void *)finalize_reduce_kernel; }

extern "C" int fm_finalize_reduce_launch(const float *scratch, const int32_t *token_slots, int n_tokens, int top_k,
                                         int n, int max_rows, const float *init, float *out, uint16_t *out_bf16,
                                         int pdl, void *stream)
{
    if (n_tokens <= 0) return 0;
    dim3 grid((unsigned)((n / 4 + 127) / 128), (unsigned)n_tokens);
    if (pdl) {
        void *args[] = {(void *)&scratch, (void *)&token_slots, (void *)&n_tokens, (void *)&top_k, (void *)&n,
                        (void *)&max_rows, (void *)&init, (void *)&out, (void *)&out_bf16};
        return (int)fm_launch_pdl((const void *)finalize_reduce_kernel, grid, dim3(128), 0, stream, args);
    }
    finalize_reduce_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(scratch, token_slots, n_tokens, top_k, n,
                                                                    max_rows, init, out, out_bf16);
    return (int)cudaGetLastError();
}
