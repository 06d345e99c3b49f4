/* mbarrier.cuh - the mbarrier helpers of the sm_90a producer / consumer kernels (gemm_wgmma.cu's
 * warp-specialized W4A16 kernels through wgmma_common.cuh, gemm_fp8.cu's ws W4A8 kernels):
 * shared::cta mbarriers at 32-bit shared addresses. Included where those kernels' bodies are
 * compiled (sm_90a code only: try_wait.parity needs sm_90). */
#pragma once

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
