/* wgmma_common.cuh - what the two wgmma kernels of gemm_wgmma.cu share: the
 * shared-memory matrix descriptor, the mbarrier helpers (mbarrier.cuh), the
 * device-side tile lookup, the consumer side (decode, MMA issue) and the staged
 * BF16 epilogue (wg_staged, wg_epilogue_staged: kernel_common.cuh's
 * epilogue_staged with the wgmma band mapping). Included inside gemm_wgmma.cu's
 * anonymous namespace (after kernel_common.cuh and wgmma_rs.cuh). */
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FM_WGMMA_BODY 1

__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    /* start address, LBO, SBO in 16-byte units; base offset 0; the layout bits (62-63)
     * are the caller's: wg_issue sets 1 = 128-byte swizzle */
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
#endif

#ifdef FM_WGMMA_BODY
#include "cuda/mbarrier.cuh" /* mbar_init, mbar_arrive, mbar_arrive_cp_async, mbar_wait */
#endif

/* Which tile `slot` is: tiles are enumerated expert by expert, nfb feature
 * blocks x ceil(rows / tok) passes each, from the device offsets (rows clamped
 * to max_rows; a negative start or no rows: no tile). A warp scan over 32
 * experts at a time, from the group at expert *e0 whose tiles start at *base
 * (0, 0: the first; the persistent kernel's slots only grow, so it resumes where
 * its last tile was found, and find_tile leaves the cursor at the tile's group);
 * every warp computes the same answer. e = -1: no tile with that slot. */
__device__ __forceinline__ void find_tile(const fm_gemm_params &p, int nfb, int tok, int lane, int slot, int &e,
                                          int &local, int &cur_e0, int &cur_base)
{
    constexpr unsigned FULL = 0xFFFFFFFFu;
    int                base = cur_base;
    e = -1;
    local = 0;
    for (int e0 = cur_e0; e0 < p.n_experts; e0 += 32) {
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
            cur_e0 = e0;
            cur_base = base;
            return;
        }
        base += tot;
    }
}
__device__ __forceinline__ void find_tile(const fm_gemm_params &p, int nfb, int tok, int lane, int &e, int &local)
{
    int e0 = 0, base = 0;
    find_tile(p, nfb, tok, lane, (int)blockIdx.x, e, local, e0, base);
}

#ifdef FM_WGMMA_BODY
/* ---- the consumer side both kernels share ---- */

/* The A operand of one stage: chunk c, m64 tile i, MMA step s -> 4 registers. */
template <int CPS, int MT> struct stage_regs_t {
    uint32_t r[CPS][MT][4][4];
};

/* Decode this warp's weights of one stage (slots (w*MT + i)*CPS + c) into A registers. */
template <int CPS, int MT>
__device__ __forceinline__ void wg_dequant(const unsigned char *buf, int w_off, int s_off, int w, int lane,
                                           const fm_gemm_params &p, stage_regs_t<CPS, MT> &a)
{
#pragma unroll
    for (int c = 0; c < CPS; c++)
#pragma unroll
        for (int i = 0; i < MT; i++) {
            uint4    wq;
            uint32_t s_lo, s_hi;
            load_chunk(buf, w_off, s_off, (w * MT + i) * CPS + c, lane, p, wq, s_lo, s_hi);
            dequant_step(wq.x, s_lo, s_hi, a.r[c][i][0]);
            dequant_step(wq.y, s_lo, s_hi, a.r[c][i][1]);
            dequant_step(wq.z, s_lo, s_hi, a.r[c][i][2]);
            dequant_step(wq.w, s_lo, s_hi, a.r[c][i][3]);
        }
}

/* The MMAs read the A registers and write the accumulators asynchronously: these
 * empty asm statements keep them alive and in place until a wgmma wait. */
template <int MT, int N> __device__ __forceinline__ void wg_fence_acc(float (&acc)[MT][N])
{
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < N; j++) asm volatile("" : "+f"(acc[i][j])::"memory");
}
template <int CPS, int MT> __device__ __forceinline__ void wg_fence_regs(stage_regs_t<CPS, MT> &a)
{
#pragma unroll
    for (int c = 0; c < CPS; c++)
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int s = 0; s < 4; s++)
#pragma unroll
                for (int q = 0; q < 4; q++) asm volatile("" : "+r"(a.r[c][i][s][q])::"memory");
}

/* Issue one stage's MMAs (X of the stage at shared address sb) as one group. */
template <int TOK, int KC, int CPS, int MT>
__device__ __forceinline__ void wg_issue(uint32_t sb, float (&acc)[MT][TOK / 2], stage_regs_t<CPS, MT> &a)
{
    wg_fence_acc(acc);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int c = 0; c < CPS; c++)
#pragma unroll
        for (int s = 0; s < 4; s++) {
            /* step s = columns 2s, 2s+1 of chunk c's lines: +32 B inside the 1 KB atom
             * (the hardware applies the XOR); next 8 tokens: SBO = 1 KB */
            uint64_t desc = smem_desc(sb + c * TOK * 128 + s * 32, 16, 1024) | (1ull << 62);
#pragma unroll
            for (int i = 0; i < MT; i++) wgmma_rs_t<TOK>::run(acc[i], a.r[c][i][s], desc);
        }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/* Barrier 1 among the NTHR threads that reach it (the warp-specialized kernel's
 * consumers: its producer warpgroup has left by then; barrier 0 is __syncthreads). */
template <int NTHR> __device__ __forceinline__ void wg_bar_sync()
{
    asm volatile("bar.sync 1, %0;" ::"n"(NTHR) : "memory");
}

/* Whether a pass's output leaves through shared memory (wg_epilogue_staged): BF16
 * (NONE, or SWIGLU with its gate/up pair of m64 tiles, MT == 2) or FINALIZE_DET's
 * FP32 rows when its larger tile fits, 16+ tokens (as
 * the mma.sync kernel's rule), the staged tile within the stage buffers
 * (stage_bytes = STAGES * STAGE_B: below the ws kernel's mbarriers), y 16-byte
 * aligned, and for y_packed the CTA's output columns whole 64-column blocks (the
 * kpack order stays inside the CTA's columns; every compiled tile has them). */
template <int WARPS, int MT, int NT, int STAGE_BYTES>
__device__ __forceinline__ bool wg_staged(const fm_gemm_params &p)
{
    constexpr int  FS = WARPS * MT * 16;
    constexpr bool FITS = NT >= 2 && staged_tile_bytes(FS, 8 * NT) <= STAGE_BYTES;
    constexpr bool FITS32 = NT >= 2 && staged_tile_bytes_f32(FS, 8 * NT) <= STAGE_BYTES;
    if (p.epi == FM_CUDA_EPI_FINALIZE_DET) return FITS32; /* scratch 16-byte aligned: fm_cuda_gemm checks it */
    if (!FITS || (uintptr_t)p.y % 16) return false;
    if (p.epi == FM_CUDA_EPI_NONE) return !p.y_packed || FS % 64 == 0;
    if (p.epi == FM_CUDA_EPI_SWIGLU) return MT == 2 && (!p.y_packed || (FS / 2) % 64 == 0);
    return false;
}

/* The staged epilogue (kernel_common.cuh) of consumer warp cw = 0..WARPS-1 of the
 * CTA of feature block fb, run by all WARPS*32 consumer threads (tid = 0.. among
 * them, bar a barrier among exactly them). The caller first makes every consumer
 * wait for its MMAs (wait_group 0) and its copies, then runs bar (or the same
 * barrier): no stage buffer is read or written any more. Warp cw is row block cw%4 of warpgroup cw/4:
 * band ((fb * WARPS/4 + cw/4) * MT + i) * 4 + cw%4, CTA-local output band
 * (cw/4 * MT + i) * 4 + cw%4; with SwiGLU (MT == 2) gate band (fb * WARPS/4 + cw/4) * 4
 * + cw%4, local output band cw. Accumulator j of m64 tile i: 8-token group j/4,
 * element j%4 of the m16n8 C layout. */
template <bool OSS, int WARPS, int MT, int NT, int NTHR, class Bar>
__device__ __forceinline__ void wg_epilogue_staged(const fm_gemm_params &p, const fm_gemm_oss &o, unsigned char *smem,
                                                   int fb, int cw,
                                                   const bool (&bvalid)[MT], int rbase, int rows, int e, float osc,
                                                   int g, int t, int tid, int c0, int cn,
                                                   const float (&acc)[MT][NT * 4], Bar bar)
{
    epilogue_staged<OSS, WARPS * MT * 16, MT, NT, NTHR>(
        p, o, smem, fb, bvalid, rbase, rows, e, osc, g, t, tid, c0, cn, [&](int i, int n, int q) { return acc[i][n * 4 + q]; },
        [&](int i, bool sw) { return sw ? cw * 16 : (((cw >> 2) * MT + i) * 4 + (cw & 3)) * 16; }, bar);
}

/* The CTA-local output columns of warpgroup wg's bands in wg_epilogue_staged's
 * mapping: MT m64 tiles = MT * 64 features (NONE, FINALIZE_DET), or 64 SwiGLU
 * outputs (gate/up pair, MT == 2) */
__device__ __forceinline__ void wg_columns(const fm_gemm_params &p, int mt, int wg, int &c0, int &cn)
{
    cn = p.epi == FM_CUDA_EPI_SWIGLU ? 64 : mt * 64;
    c0 = wg * cn;
}

/* Named barrier `id` among nthr threads (a runtime id: one per warpgroup). */
__device__ __forceinline__ void wg_bar_sync_id(int id, int nthr)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthr) : "memory");
}
#endif
