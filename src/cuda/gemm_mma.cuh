/* gemm_mma.cuh - grouped GEMM with FP4 weights for small per-expert batches.
 *
 * Y_e = X_e . W_e^T for every expert e, rows of expert e = [offsets[e], offsets[e+1])
 * read on the device. At 1-32 rows per expert the job is streaming each expert's
 * FP4 weights once, so the kernel is built around that stream:
 *  - swap-AB: the weights are the A operand of mma.sync.m16n8k16 (16 output
 *    features = M), the tokens its B operand (8 per fragment = N); no token padding
 *    to 64/128 rows;
 *  - one coalesced 16-byte copy per lane is a whole A fragment for 64 of K
 *    (src/cuda/prepack.c); weights, their scale bytes and the token tile go
 *    global -> shared by cp.async, STAGES deep, so that many bytes are in flight
 *    per SM without spending registers (each lane reads back only its own weight
 *    bytes; the stage barrier is there for X and the scales);
 *  - E2M1 -> BF16 by bit placement (1-6 integer ops per pair) and one BF16x2
 *    multiply by the block scale, decoded from its byte with one integer
 *    multiply-add; products are exact, so only FP32 accumulation order differs
 *    from the reference;
 *  - the token tile X[8*NT][KC] rows are padded by 16 B in shared memory
 *    (conflict-free 16-byte fragment reads); rows past
 *    the expert's count and columns past K are zero-filled by cp.async;
 *  - grid (feature blocks, experts); a CTA of an expert with no rows exits at once;
 *    an expert with more than 8*NT rows loops over passes. The multi-block kernel
 *    (MB, p.nb > 1) gives a CTA p.nb consecutive feature blocks with one K pipeline
 *    across them (short K);
 *  - BF16 outputs of 16+-token tiles leave through shared memory as 16-byte row
 *    segments (epilogue_staged, kernel_common.cuh, shared with the wgmma
 *    kernels); the other epilogues store from the registers.
 * Shared memory = fm_smem_mma(tile) (src/kernels/fm_kernels_smem.c), all dynamic.
 * Instantiated one catalogue row per generated unit (gemm_mma_row.cuh); launched by
 * gemm_mma.cu through the build's unit table (units.h).
 * The sm_90a and sm_80 builds share this source: mma.sync runs on both (and on
 * SM120 within its 99 KB), nothing here needs wgmma.
 */
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <string.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"

#ifdef FM_PROBE_TIMELINE
/* Probe builds only (cmake -DFM_PROBE_TIMELINE=ON; bench_gemm --timeline): thread 0 of
 * every CTA writes its SM, start and end (%globaltimer, ns) into launch slot
 * seq % FM_PROBE_TL_LAUNCHES of fm_probe_tl; the last CTA to finish advances seq.
 * Launches in one stream do not overlap, so every CTA of a launch reads the same seq. */
#define FM_PROBE_TL_LAUNCHES 4
/* static: each generated unit has its own copies (no relocatable device code); its
 * fm_mma_unit.probe_timeline sets them */
static __device__ unsigned long long *fm_probe_tl;
static __device__ unsigned            fm_probe_tl_cap, fm_probe_tl_seq, fm_probe_tl_done;
__device__ __forceinline__ unsigned long long fm_probe_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void fm_probe_end(unsigned long long t0)
{
    if (threadIdx.x != 0 || !fm_probe_tl) return;
    unsigned smid, seq = *(volatile unsigned *)&fm_probe_tl_seq;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    size_t cta = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
    if (cta < fm_probe_tl_cap) {
        unsigned long long *r = fm_probe_tl + ((size_t)(seq % FM_PROBE_TL_LAUNCHES) * fm_probe_tl_cap + cta) * 3;
        r[0] = smid;
        r[1] = t0;
        r[2] = fm_probe_now();
    }
    __threadfence();
    if (atomicAdd(&fm_probe_tl_done, 1u) == gridDim.x * gridDim.y - 1) {
        fm_probe_tl_done = 0;
        atomicAdd(&fm_probe_tl_seq, 1u);
    }
}
#endif

namespace {
using namespace fm_kc;

/* Split K: store this CTA's FP32 partials (the valid tokens of the pass, the valid
 * bands) to split_part[split][row][feature], count the CTA in, and if it is the last of
 * the p.ksplit CTAs of (row pass, block) cidx: sum every split's partials in split
 * order into acc (deterministic: the same order whichever CTA is last), reset the
 * counter and return true (the caller runs the epilogue); else false. Called by every
 * thread of the CTA (barriers inside). The threadfence / counter / threadfence order is
 * the CUDA programming guide's last-block pattern; the last CTA reads through L2 (ld.cg). */
template <int MT, int NT>
__device__ __forceinline__ bool split_fixup(const fm_gemm_params &p, const fm_gemm_work &wk, float (&acc)[MT][NT][4],
                                            const int (&bj)[MT], const bool (&vj)[MT], int rbase, int rows, int split,
                                            int cidx, int g, int t)
{
    float *part = wk.split_part;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int tok = n * 8 + 2 * t + (q & 1);
                if (vj[i] && tok < rows)
                    part[((size_t)split * p.max_rows + rbase + tok) * p.n + bj[i] * 16 + g + 8 * (q >> 1)] = acc[i][n][q];
            }
    __threadfence();
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) last = atomicAdd(&wk.split_cnt[cidx], 1) == wk.ksplit - 1;
    if (!__syncthreads_or(last)) return false;
    __threadfence();
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int tok = n * 8 + 2 * t + (q & 1);
                if (!vj[i] || tok >= rows) continue;
                const float *src = part + ((size_t)rbase + tok) * p.n + bj[i] * 16 + g + 8 * (q >> 1);
                float        v = 0.0f;
                for (int s = 0; s < wk.ksplit; s++) v += __ldcg(src + (size_t)s * p.max_rows * p.n);
                acc[i][n][q] = v;
            }
    if (threadIdx.x == 0) wk.split_cnt[cidx] = 0; /* ready for the next launch */
    return true;
}

/* MB (multi-block): the CTA computes p.nb consecutive feature blocks of its
 * expert, one K pipeline running across them, so that the next block's stages
 * are in flight while this block finishes and writes its epilogue (short K: a
 * block alone is one or two stages, too few to keep bytes in flight). */
/* The stage layout is fm_tile_layout.h's (the planner's model expands the same
 * macros); __launch_bounds__' minimum blocks per SM is its FM_MMA_MIN_BLOCKS hint
 * (the cost model's occupancy uses it too). */
/* One unit of work: feature block(s) ux of expert e (split K: ux = block x ksplit +
 * split), every row pass of the expert. LIST: the work-list kernel's unit (split K,
 * wk); without it the split code is compiled out, so the plain and multi-block
 * kernels are what they were before the work list (registers, SASS: the planner's
 * fitted occupancy and timings stay theirs). */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool MB, bool LIST, bool OSS>
__device__ __forceinline__ void mma_unit(const fm_gemm_params &p, const fm_gemm_work &wk, const fm_gemm_oss &o, int e,
                                         int ux)
{
    constexpr int TOK = 8 * NT;           /* tokens per pass */
    constexpr int CPS = KC / 64;          /* prepacked chunks per stage */
    constexpr int ROWB = FM_MMA_ROW_BYTES(KC);                 /* bytes per staged X row */
    constexpr int W_OFF = FM_MMA_W_OFF(NT, KC);                /* weight chunks of a stage */
    constexpr int S_OFF = FM_MMA_S_OFF(WARPS, MT, NT, KC);     /* their scale bytes */
    constexpr int STAGE_B = FM_MMA_STAGE_BYTES(WARPS, MT, NT, KC);
    extern __shared__ __align__(16) unsigned char smem[];
    int       row0 = p.offsets[e], row1 = p.offsets[e + 1];
    if (row1 > p.max_rows) row1 = p.max_rows;
    const int m = row1 - row0;
    if (m <= 0 || row0 < 0) return;


    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    /* split K (plain kernel): CTA x of the grid = feature block bx, split `split` of ksp;
     * this CTA's K stages are [kbeg, kbeg + nks) of the nks_all (the launcher keeps
     * ksp <= nks_all, so every split has at least one) */
    const int ksp = !LIST || wk.ksplit < 2 ? 1 : wk.ksplit;
    const int bx = MB ? ux : ux / ksp, split = ux - bx * ksp;
    const int KB = p.kp / 64, nks_all = (p.kp + KC - 1) / KC;
    const int kbeg = split * nks_all / ksp, nks = (split + 1) * nks_all / ksp - kbeg;
    const int nbands = p.n / 16;
    const bool swiglu = p.epi == FM_CUDA_EPI_SWIGLU;
    constexpr int HALF = MT >= 2 ? MT / 2 : 1; /* launcher refuses SwiGLU with MT == 1 */
    /* feature blocks of this CTA: [blk0, blk0 + nblk); block j's bands are block 0's + j * bstride */
    const int blk0 = MB ? bx * p.nb : bx;
    const int bstride = swiglu ? WARPS * HALF : WARPS * MT;
    const int nblk = MB ? min(p.nb, ((swiglu ? nbands / 2 : nbands) + bstride - 1) / bstride - blk0) : 1;
    /* bands of this warp's tiles in the CTA's first block, and the bound of each */
    int  band[MT], blim[MT];
    bool bvalid[MT]; /* N need not fill a warp's mt bands: each band on its own */
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (swiglu) {
            int gb = (blk0 * WARPS + warp) * HALF + (i % HALF);
            band[i] = gb + (i >= HALF ? nbands / 2 : 0);
            blim[i] = i >= HALF ? nbands : nbands / 2;
        } else {
            band[i] = (blk0 * WARPS + warp) * MT + i;
            blim[i] = nbands;
        }
        bvalid[i] = band[i] < blim[i];
    }
    /* Per-lane copy sources, fixed for the whole CTA: each stage only adds its K
     * offset (the address work of a stage is a few integer ops per cp.async). A band
     * outside N reads band 0 with src-size 0 (zero fill, no bytes read). */
    const uint4         *wsrc[MT];
    const unsigned char *ssrc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        size_t b = bvalid[i] ? (size_t)band[i] : 0;
        wsrc[i] = (const uint4 *)p.wdata + ((size_t)e * nbands + b) * KB * 32 + lane;
        ssrc[i] = (const unsigned char *)p.wscale + (((size_t)e * nbands + b) * KB * 32) * 2 + (lane & 3) * 16;
    }
    const float osc = p.oscale[e];
    constexpr int SEGS_ROW = KC / 8;                          /* 16-byte X segments per staged row */
    constexpr int XIT = (TOK * SEGS_ROW + WARPS * 32 - 1) / (WARPS * 32); /* X segments per thread, at most */
    /* every thread has XIT segments of the tile: the rows past the count are zero-filled
     * by their own cp.async (src-size 0) in every stage; otherwise they are zeroed once
     * per pass and their segments skipped */
    constexpr bool XFULL = TOK * SEGS_ROW % (WARPS * 32) == 0;
    /* BF16 outputs through shared memory (epilogue_staged): tiles of 16+ tokens
     * without MB (whose next block is in flight during the epilogue), the output
     * 16-byte aligned, the staged tile within the stage buffers */
    constexpr bool STAGE_FITS = !MB && NT >= 2 && staged_tile_bytes(WARPS * MT * 16, TOK) <= STAGES * STAGE_B;
    constexpr bool STAGE_FITS32 = !MB && NT >= 2 && staged_tile_bytes_f32(WARPS * MT * 16, TOK) <= STAGES * STAGE_B;
    /* FINALIZE_DET: scratch is 16-byte aligned (fm_cuda_gemm checks it) */
    const bool staged = (STAGE_FITS && (p.epi == FM_CUDA_EPI_NONE || p.epi == FM_CUDA_EPI_SWIGLU) &&
                         (uintptr_t)p.y % 16 == 0) ||
                        (STAGE_FITS32 && p.epi == FM_CUDA_EPI_FINALIZE_DET);

    for (int pass0 = 0; pass0 < m; pass0 += TOK) {
        const int rows = min(TOK, m - pass0);
        /* this thread's X segments of every stage: source row/column and shared offset
         * fixed for the pass (rows past the count were zeroed at the pass start) */
        const uint16_t *xsrc[XIT];
        int             xdst[XIT], xcol[XIT];
#pragma unroll
        for (int j = 0; j < XIT; j++) {
            int sgi = threadIdx.x + j * (WARPS * 32);
            int r = sgi / SEGS_ROW, c8 = (sgi % SEGS_ROW) * 8;
            bool in = sgi < rows * SEGS_ROW;
            xsrc[j] = p.x + (size_t)(row0 + pass0 + (in ? r : 0)) * p.k + c8;
            xdst[j] = r * ROWB + c8 * 2;
            xcol[j] = in ? c8 : INT_MAX / 2; /* past the rows: zero fill (XFULL) or no copy */
        }

        /* one stage: X tile (whole CTA), this warp's weight chunks (each lane its own
         * 16 B: no other lane reads them), their scale bytes (lanes 0-3, 16 B each) */
        auto load_stage = [&](int ls) { /* ls: stage of the CTA's pipeline = block lj, K stage ks */
            const int      lj = MB ? ls / nks : 0, ks = (MB ? ls - lj * nks : ls) + kbeg;
            unsigned char *buf = smem + (ls % STAGES) * STAGE_B;
#pragma unroll
            for (int j = 0; j < XIT; j++) {
                int k = ks * KC + xcol[j];
                if (XFULL || xcol[j] < INT_MAX / 2) {
                    bool ok = k < p.k;
                    cp_async16(buf + xdst[j], ok ? xsrc[j] + ks * KC : p.x, ok ? 16 : 0);
                }
            }
#pragma unroll
            for (int c = 0; c < CPS; c++) {
                int kb = ks * CPS + c;
                bool kin = kb < KB; /* zeros past kp */
                int  kbc = kin ? kb : 0;
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    bool   bin = MB ? band[i] + lj * bstride < blim[i] : bvalid[i];
                    bool   ok = bin && kin; /* zeros past N */
                    size_t boff = MB && bin ? (size_t)lj * bstride * KB * 32 : 0;
                    int    slot = (warp * MT + i) * CPS + c;
                    cp_async16(buf + W_OFF + slot * 512 + lane * 16, wsrc[i] + boff + kbc * 32, ok ? 16 : 0);
                    if (lane < 4)
                        cp_async16(buf + S_OFF + slot * 64 + lane * 16, ssrc[i] + boff * 2 + kbc * 64, ok ? 16 : 0);
                }
            }
        };

        if (!XFULL && rows < TOK) /* zero the missing token rows of every stage once (visible after the first barrier) */
            for (int i = threadIdx.x; i < STAGES * (TOK - rows) * (KC / 8); i += WARPS * 32) {
                int st = i / ((TOK - rows) * (KC / 8)), rem = i % ((TOK - rows) * (KC / 8));
                int r = rows + rem / (KC / 8), c8 = (rem % (KC / 8)) * 8;
                *(uint4 *)(smem + st * STAGE_B + r * ROWB + c8 * 2) = make_uint4(0, 0, 0, 0);
            }

        const int nst = nblk * nks; /* stages of the CTA's pipeline */
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < nst) load_stage(s);
            cp_async_commit();
        }

        for (int j = 0; j < nblk; j++) { /* without MB: one block */
            int  bj[MT];
            bool vj[MT], wv = false;
#pragma unroll
            for (int i = 0; i < MT; i++) {
                bj[i] = band[i] + j * bstride;
                vj[i] = MB ? bj[i] < blim[i] : bvalid[i];
                wv |= vj[i];
            }
            float acc[MT][NT][4];
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int q = 0; q < 4; q++) acc[i][n][q] = 0.0f;

            for (int ks = 0; ks < nks; ks++) {
                const int cs = j * nks + ks;
                cp_async_wait<STAGES - 2>();
                __syncthreads(); /* stage cs visible to all; stage cs-1 free for reuse */
                if (cs + STAGES - 1 < nst) load_stage(cs + STAGES - 1);
                cp_async_commit();
                const unsigned char *buf = smem + (cs % STAGES) * STAGE_B;
                if (wv) {
#pragma unroll
                    for (int c = 0; c < CPS; c++) {
                        uint4 xb[NT][2];
#pragma unroll
                        for (int n = 0; n < NT; n++) { /* rows past the count read zeros */
                            const uint4 *src = (const uint4 *)(buf + (n * 8 + g) * ROWB + (c * 64 + 16 * t) * 2);
                            xb[n][0] = src[0];
                            xb[n][1] = src[1];
                        }
#pragma unroll
                        for (int i = 0; i < MT; i++) {
                            uint4    wq;
                            uint32_t s_lo, s_hi;
                            load_chunk(buf, W_OFF, S_OFF, (warp * MT + i) * CPS + c, lane, p, wq, s_lo, s_hi);
                            uint32_t wv4[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
                            for (int s = 0; s < 4; s++) {
                                uint32_t a[4];
                                dequant_step(wv4[s], s_lo, s_hi, a);
#pragma unroll
                                for (int n = 0; n < NT; n++) {
                                    const uint4 &q = xb[n][s >> 1];
                                    uint32_t     b0 = (s & 1) ? q.z : q.x, b1 = (s & 1) ? q.w : q.y;
                                    mma_bf16(acc[i][n], a, b0, b1);
                                }
                            }
                        }
                    }
                }
            }
            /* split K: every CTA leaves its partials; the last of the (row pass, block)
             * sums them all and goes on to the epilogue, the others are done with the pass */
            const bool epi_here = MB || ksp == 1 ||
                                  split_fixup<MT, NT>(p, wk, acc, bj, vj, row0 + pass0, rows, split,
                                                      (row0 / TOK + e + pass0 / TOK) * wk.nbx + bx,
                                                      g, t);
            if (epi_here && staged) { /* every thread: the tile goes through shared memory */
                cp_async_wait<0>();
                __syncthreads(); /* all stage reads done, no copy in flight */
                epilogue_staged<OSS, WARPS * MT * 16, MT, NT, WARPS * 32>(
                    p, o, smem, blk0, vj, row0 + pass0, rows, e, osc, g, t, threadIdx.x, 0,
                    p.epi == FM_CUDA_EPI_SWIGLU ? WARPS * MT * 8 : WARPS * MT * 16, /* every output column */
                    [&](int i, int n, int q) { return acc[i][n][q]; },
                    [&](int i, bool sw) { return (warp * (sw ? HALF : MT) + i) * 16; }, /* the CTA's bands, warp by warp */
                    [] { __syncthreads(); });
            } else if (epi_here && wv) {
                epilogue<OSS, MT, NT>(p, o, bj, vj, row0 + pass0, rows, e, osc, g, t,
                                 [&](int i, int n, int q) { return acc[i][n][q]; });
            }
        }
        cp_async_wait<0>();
        __syncthreads(); /* the next pass overwrites the stages */
    }
}

/* The plain and multi-block kernels' body (OSS: the gpt-oss epilogues, kernel_common.cuh). */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool MB, bool OSS>
__device__ __forceinline__ void mma_body(const fm_gemm_params &p, const fm_gemm_oss &o)
{
#ifdef FM_PROBE_TIMELINE
    const unsigned long long probe_t0 = fm_probe_now();
#endif
    pdl_trigger();
    pdl_wait();
    mma_unit<WARPS, MT, NT, KC, STAGES, MB, false, OSS>(p, fm_gemm_work{}, o, (int)blockIdx.y, (int)blockIdx.x);
#ifdef FM_PROBE_TIMELINE
    fm_probe_end(probe_t0);
#endif
}

template <int WARPS, int MT, int NT, int KC, int STAGES, bool MB>
__global__ void __launch_bounds__(WARPS * 32, FM_MMA_MIN_BLOCKS(WARPS, MT, NT, KC, STAGES))
    mma_kernel(const fm_gemm_params p)
{
    mma_body<WARPS, MT, NT, KC, STAGES, MB, false>(p, fm_gemm_oss{});
}

/* the same with gpt-oss's epilogues (p.bias, p.act): launched when the call has them */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool MB>
__global__ void __launch_bounds__(WARPS * 32, FM_MMA_MIN_BLOCKS(WARPS, MT, NT, KC, STAGES))
    mma_oss_kernel(const fm_gemm_params p, const fm_gemm_oss o)
{
    mma_body<WARPS, MT, NT, KC, STAGES, MB, true>(p, o);
}

/* The work-list kernel (plain, one feature block a unit): with wk.active (the experts
 * with rows, fm_cuda_gemm_args.expert_list) its CTAs take units w = blockIdx.x,
 * + gridDim.x, ... of active[0] experts x wk.upe units each (a grid sized for the
 * experts expected to have rows, not for all of them); without it, unit blockIdx.x of
 * expert blockIdx.y as the plain kernel. Split K when wk.ksplit > 1. */
template <int WARPS, int MT, int NT, int KC, int STAGES, bool OSS>
__device__ __forceinline__ void mma_list_body(const fm_gemm_params &p, const fm_gemm_work &wk, const fm_gemm_oss &o)
{
#ifdef FM_PROBE_TIMELINE
    const unsigned long long probe_t0 = fm_probe_now(); /* before the PDL wait: the time a CTA waits shows */
#endif
    pdl_trigger();
    pdl_wait();
    if (!wk.active) {
        mma_unit<WARPS, MT, NT, KC, STAGES, false, true, OSS>(p, wk, o, (int)blockIdx.y, (int)blockIdx.x);
    } else {
        const int n_units = wk.active[0] * wk.upe;
        for (int w = (int)blockIdx.x; w < n_units; w += (int)gridDim.x)
            mma_unit<WARPS, MT, NT, KC, STAGES, false, true, OSS>(p, wk, o, wk.active[1 + w / wk.upe], w % wk.upe);
    }
#ifdef FM_PROBE_TIMELINE
    fm_probe_end(probe_t0);
#endif
}

template <int WARPS, int MT, int NT, int KC, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, FM_MMA_MIN_BLOCKS(WARPS, MT, NT, KC, STAGES))
    mma_list_kernel(const fm_gemm_params p, const fm_gemm_work wk)
{
    mma_list_body<WARPS, MT, NT, KC, STAGES, false>(p, wk, fm_gemm_oss{});
}

/* the work-list kernel with gpt-oss's epilogues */
template <int WARPS, int MT, int NT, int KC, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, FM_MMA_MIN_BLOCKS(WARPS, MT, NT, KC, STAGES))
    mma_oss_list_kernel(const fm_gemm_params p, const fm_gemm_work wk, const fm_gemm_oss o)
{
    mma_list_body<WARPS, MT, NT, KC, STAGES, true>(p, wk, o);
}

} // namespace
