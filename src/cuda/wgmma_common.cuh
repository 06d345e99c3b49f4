/* wgmma_common.cuh - what the two wgmma kernels of gemm_wgmma.cu share: the
 * layout switch, the shared-memory matrix descriptor, mbarrier helpers and the
 * device-side tile lookup. Included inside gemm_wgmma.cu's anonymous namespace
 * (after kernel_common.cuh and wgmma_rs.cuh). */
#pragma once

#ifndef FM_WGMMA_SW128
#define FM_WGMMA_SW128 1 /* token tile in the 128-byte-swizzled layout (0: no swizzle) */
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FM_WGMMA_BODY 1

__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    /* start address, LBO, SBO in 16-byte units; base offset 0; layout 0 = no swizzle */
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
#endif

#ifdef FM_WGMMA_BODY
__device__ __forceinline__ void mbar_init(uint32_t a, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
/* one arrival when all of this thread's earlier cp.async have landed */
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t a)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}" ::"r"(a),
                 "r"(parity)
                 : "memory");
}
#endif

/* Which tile CTA blockIdx.x computes: tiles are enumerated expert by expert,
 * nfb feature blocks x ceil(rows / tok) passes each, from the device offsets
 * (rows clamped to max_rows; a negative start or no rows: no tile). A warp scan
 * over 32 experts at a time; every warp computes the same answer. e = -1: no
 * tile for this CTA. */
__device__ __forceinline__ void find_tile(const fm_swapab_params &p, int nfb, int tok, int lane, int &e, int &local)
{
    constexpr unsigned FULL = 0xFFFFFFFFu;
    const int          slot = blockIdx.x;
    int                base = 0;
    e = -1;
    local = 0;
    for (int e0 = 0; e0 < p.n_experts; e0 += 32) {
        int ee = e0 + lane, cnt = 0;
        if (ee < p.n_experts) {
            int r0 = p.offsets[ee], r1 = min(p.offsets[ee + 1], p.max_rows);
            if (r0 >= 0 && r1 > r0) cnt = ((r1 - r0 + tok - 1) / tok) * nfb;
        }
        int inc = cnt;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            int v = __shfl_up_sync(FULL, inc, d);
            if (lane >= d) inc += v;
        }
        int tot = __shfl_sync(FULL, inc, 31);
        if (slot < base + tot) {
            unsigned bal = __ballot_sync(FULL, slot < base + inc);
            int      l = __ffs(bal) - 1;
            int      inc_l = __shfl_sync(FULL, inc, l), cnt_l = __shfl_sync(FULL, cnt, l);
            e = e0 + l;
            local = slot - (base + inc_l - cnt_l);
            return;
        }
        base += tot;
    }
}
