/* decode.cu - the MoE layer of a decode batch (at most FM_DECODE_MAX_SLOTS routed slots)
 * in one persistent launch, on mma.sync (sm_80, sm_90a, sm_100f, sm_120f alike; nothing
 * here is arch-specific). docs/decode-kernel.md has the why; what the code relies on:
 *
 * gpt-oss (issue 32): a twin kernel, decode_oss_kernel (fm_decode_oss), adds FC1's expert bias
 * and gpt-oss's clamped SwiGLU to phase 2's epilogue and FC2's expert bias, before the row
 * weight, to phase 3's: the chain's OSS epilogues operation for operation (decode_parts.cuh
 * oss_h, oss_fc2), after the split sum as the plain epilogues; the plain kernel is unchanged.
 *
 * Phases of every CTA (grid = CTAs that can all be resident, a cooperative launch; units
 * u = blockIdx.x, + gridDim.x, ... below, or from a counter: fm_decode_params.dynamic):
 *  1. routing: the R = T x top_k ids into shared memory, sorted stably by local expert
 *     (rank = slots of smaller experts + earlier slots of the same expert: the order of
 *     permute.cu, no atomics deciding it), the experts with rows in ascending order; CTA 0
 *     alone records bad ids / NaN weights / the router's bad logit (as permute.cu does);
 *     then an L2 prefetch of the weights of the CTA's first FC2 unit, so that FC2's bytes
 *     stream while FC1 runs;
 *  2. FC1 units (u = blockIdx.x, + gridDim.x, ..., or from the counter): (expert with rows a, feature block of 64
 *     h columns, K split); X rows read straight from x[token] (no gather); with K split,
 *     FP32 partials and the last CTA of the (row pass, block) sums them in split order (the
 *     split_fixup of gemm_mma.cuh); SwiGLU into h (BF16), then the block's ready counter is
 *     incremented (a release after every thread's fence and a barrier);
 *  3. FC2 units (expert a, output block of 128 columns, K split over inter): before loading
 *     the h columns of a K stage, thread 0 waits (acquire loads) until the ready counters of
 *     the FC1 blocks under that stage count every row pass of a; the stage's weights are
 *     issued before the wait. Partials summed in split order as FC1's; the weighted rows
 *     (row weight x output scale, as FINALIZE_DET) go to scratch;
 *  4. finalize: each (expert, row pass) counted into its output block's counter; the last
 *     one writes out for that block: init (or 0) + each token's rows in slot order (the
 *     finalize reduce of gemm_mma.cu, same order, same bits). The last output block resets
 *     the ready counters.
 * No deadlock: FC1 units never wait (the split's last CTA sums, the others leave), every
 * CTA runs all its FC1 units before any FC2 unit, and every CTA is resident, so every
 * counter an FC2 unit waits for is raised by a CTA that is running or done. With
 * fm_decode_params.dynamic the units come from a counter, FC1's before FC2's, so an FC2
 * unit's FC1 units were all taken by CTAs that are running: no residency needed, so that form
 * is a plain launch (the strided form a cooperative one). The host takes the counter from
 * FM_DECODE_COUNTER_MIN_T tokens (decode.h: where it measured faster), and where the strided
 * form's cooperative launch is refused (fewer SMs than the device reports: MPS with an SM
 * limit) the layer runs the counter form instead (layer_run.c).
 * Rest state: every counter is back at 0 when the launch ends (split counters by their
 * last CTA, output-block counters by their last, ready counters by the last block, the unit
 * counter by the last CTA past its units), so a
 * graph replay finds what an eager run finds; no launch resets anything.
 * Determinism: every sum has a fixed order (K in ascending stages, splits in split order,
 * slots in slot order), whichever CTA is last: replay = eager bit for bit, and the chain
 * with the same tile geometry (mma_w4m2n1k128s4) and K splits gives the same bits.
 * Memory: counters read with ld.acquire.gpu, raised with red.release.gpu after a
 * __threadfence by every writer and a barrier; data another CTA wrote is read through L2
 * only (cp.async.cg, ld.cg), never from a stale L1 line. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/decode.h"
#include "cuda/decode_parts.cuh"

namespace {
using namespace fm_kc;

#ifdef FM_DECODE_DELAY
/* A test build's random delays (-DFM_DECODE_DEFS="FM_DECODE_DELAY=1"; bench/gpu-check.sh
 * decode-delay): thread 0 of the CTA sleeps 0 .. FM_DECODE_DELAY_NS (default 20 us) at `site`
 * (a hash of the CTA, the site, the unit and the clock), the CTA waits for it, so that CTAs reach
 * the flags in orders a plain run never shows: an FC2 unit before the FC1 blocks it waits for,
 * a split's partials late, the finalize's counters out of order. The results must not change
 * (test_cuda_decode checks decode = chain bit for bit); never in a shipped build. */
#ifndef FM_DECODE_DELAY_NS
#define FM_DECODE_DELAY_NS 20000
#endif
__device__ __forceinline__ void delay_cta(unsigned site, unsigned unit)
{
    if (threadIdx.x == 0) {
        unsigned h = blockIdx.x * 0x9E3779B9u ^ site * 0x85EBCA6Bu ^ unit * 0xC2B2AE35u ^ (unsigned)clock64();
        h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
        __nanosleep(h % FM_DECODE_DELAY_NS);
    }
    __syncthreads();
}
#define FM_DELAY(site, unit) delay_cta(site, unit)
#else
#define FM_DELAY(site, unit) ((void)0)
#endif


/* p.dynamic's next unit: thread 0 takes it from the counter, the CTA reads it after a barrier
 * (the barrier before: every thread is past the previous unit's read of s_unit). */
__device__ __forceinline__ int take_unit(int *work, int *s_unit)
{
    __syncthreads();
    if (threadIdx.x == 0) *s_unit = atomicAdd(work, 1);
    __syncthreads();
    return *s_unit;
}

/* The kernel's body; OSS: the gpt-oss twin's epilogues (oss_h, oss_fc2: decode_parts.cuh), a
 * template flag as the chain's (kernel_common.cuh), so that the plain kernel's code is what it
 * was. */
template <bool OSS> __device__ __forceinline__ void decode_body(const fm_decode_params &p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ route_tab rt;
    if (p.T < 1) return;
    FM_TL_NOW(0);
    const int R = p.T * p.top_k, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2,
              t = lane & 3;
    route(p, rt);
    FM_TL_NOW(1);
#ifdef FM_DECODE_TL
    unsigned long long tl_wait = 0; /* thread 0's ns in FC2's flag waits (gemm_pass) */
    unsigned           tl_units = 0;
#define FM_TL_WAIT &tl_wait
#else
#define FM_TL_WAIT NULL
#endif
    const buf_layout L = layout_of(R, p.n_local, p.n1, p.n2, p.ks1, p.ks2);
    int   *cnt = (int *)p.buf;
    float *part1 = (float *)((unsigned char *)p.buf + L.part1), *part2 = (float *)((unsigned char *)p.buf + L.part2);
    const int nact = rt.nact, nb1 = L.nb1, nb2 = L.nb2;
    const int n1u = nact * nb1 * p.ks1, n2u = nact * nb2 * p.ks2;
    if ((int)blockIdx.x < n2u) prefetch_fc2(p, rt, blockIdx.x, nb2);
    FM_DELAY(1, 0);
    /* The units (FC1's, then FC2's, one index space u < n1u + n2u): p.dynamic = 0, by strides
     * of the grid (u = blockIdx.x, + gridDim.x, ...; FC2's from n1u + blockIdx.x); 1, from the
     * counter work[0] in the decode buffer: thread 0 takes the CTA's first unit, then its next
     * one as a unit ends, so the units go to the CTAs that are free (GLM-5 EP8's FC1 units
     * leave 140 of 396 CTAs idle at T = 1-8 and take 1.3 waves at T = 16), and every FC1 unit
     * an FC2 unit waits for was taken before it by a CTA that is running (FC1 units never wait):
     * deadlock-free without residency. p.dynamic is the same in every CTA (a kernel argument),
     * so the barriers of take_unit are reached by all of the CTA's threads. */
    __shared__ int s_unit;
    int *const work = cnt + L.work;
    const bool dyn = p.dynamic != 0;
    int        u = dyn ? take_unit(work, &s_unit) : (int)blockIdx.x;

    /* FC1 + SwiGLU -> h, then the block's ready counter */
    const int nks1 = (p.kp1 + KC - 1) / KC;
    for (; u < n1u; u = dyn ? take_unit(work, &s_unit) : u + (int)gridDim.x) {
#ifdef FM_DECODE_TL
        tl_units += 1;
#endif
        const int a = u / (nb1 * p.ks1), rem = u % (nb1 * p.ks1), fb = rem / p.ks1, split = rem % p.ks1;
        const int e = rt.act_e[a], row0 = rt.act_off[a], m = rt.act_cnt[a];
        const int kbeg = split * nks1 / p.ks1, nks = (split + 1) * nks1 / p.ks1 - kbeg;
        const int gb = fb * NW + warp; /* this warp's gate band; its up band is inter/16 further */
        const int  band[MT] = {gb, gb + p.n1 / 32};
        const bool valid[MT] = {gb < p.n1 / 32, gb < p.n1 / 32};
        const float osc = p.w1osc[e], oscu = p.w1osc[p.n_local + e]; /* gate, up (cuda_internal.h) */
        for (int pass0 = 0; pass0 < m; pass0 += TOK) {
            const int rows = min(TOK, m - pass0);
            float     acc[MT][4];
            gemm_pass<false>(p, rt, smem, e, band, valid, row0 + pass0, rows, kbeg, nks, NULL, 0, nb1, acc);
            if (p.ks1 > 1 &&
                !split_sum(part1, cnt + L.c1 + (size_t)(row0 / TOK + a + pass0 / TOK) * nb1 + fb, p.ks1, p.n1, R,
                           acc, band, valid, row0 + pass0, rows, split))
                continue;
            if (valid[0])
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int tok = 2 * t + (q & 1);
                    if (tok >= rows) continue;
                    const float gv = acc[0][q] * osc, uv = acc[1][q] * oscu;
                    p.h[(size_t)(row0 + pass0 + tok) * p.k2 + gb * 16 + g + 8 * (q >> 1)] =
                        __bfloat16_as_ushort(__float2bfloat16(
                            OSS ? oss_h(p, e, gb * 16 + g + 8 * (q >> 1), acc[0][q], osc, acc[1][q], oscu)
                                : silu(gv) * uv));
                }
            __threadfence(); /* every thread's h stores, then one release */
            __syncthreads();
            if (tid == 0) red_release_add(cnt + L.ready + (size_t)a * nb1 + fb, 1);
            FM_DELAY(2, (unsigned)u);
        }
    }

    FM_TL_NOW(2);
    /* FC2 -> weighted rows in scratch -> the output block's finalize */
    const int nks2 = (p.kp2 + KC - 1) / KC;
    if (!dyn) u = n1u + (int)blockIdx.x;
    for (; u < n1u + n2u; u = dyn ? take_unit(work, &s_unit) : u + (int)gridDim.x) {
#ifdef FM_DECODE_TL
        tl_units += 1u << 16;
#endif
        const int u2 = u - n1u; /* the FC2 unit */
        const int a = u2 / (nb2 * p.ks2), rem = u2 % (nb2 * p.ks2), ob = rem / p.ks2, split = rem % p.ks2;
        const int e = rt.act_e[a], row0 = rt.act_off[a], m = rt.act_cnt[a];
        const int kbeg = split * nks2 / p.ks2, nks = (split + 1) * nks2 / p.ks2 - kbeg;
        const int b0 = (ob * NW + warp) * MT;
        const int  band[MT] = {b0, b0 + 1};
        const bool valid[MT] = {b0 < p.n2 / 16, b0 + 1 < p.n2 / 16};
        const float osc = p.w2osc[e];
        const int   need = (m + TOK - 1) / TOK; /* every pass of expert a counted in each FC1 block */
        for (int pass0 = 0; pass0 < m; pass0 += TOK) {
            const int rows = min(TOK, m - pass0);
            float     acc[MT][4];
            FM_DELAY(3, (unsigned)u2);
            gemm_pass<true>(p, rt, smem, e, band, valid, row0 + pass0, rows, kbeg, nks,
                            cnt + L.ready + (size_t)a * nb1, need, nb1, acc, FM_TL_WAIT);
            if (p.ks2 > 1 &&
                !split_sum(part2, cnt + L.c2 + (size_t)(row0 / TOK + a + pass0 / TOK) * nb2 + ob, p.ks2, p.n2, R,
                           acc, band, valid, row0 + pass0, rows, split))
                continue;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int tok = 2 * t + (q & 1);
                if (tok >= rows) continue;
                const int   r = row0 + pass0 + tok;
                const float w = rt.rw[r] * osc;
#pragma unroll
                for (int i = 0; i < MT; i++)
                    if (valid[i])
                        p.scratch[(size_t)r * p.n2 + band[i] * 16 + g + 8 * (q >> 1)] =
                            OSS ? oss_fc2(p, e, band[i] * 16 + g + 8 * (q >> 1), acc[i][q], osc, rt.rw[r], w)
                                : acc[i][q] * w;
            }
            __threadfence();
            __syncthreads();
            FM_DELAY(4, (unsigned)u2);
            int last = 0;
            if (tid == 0) last = atomicAdd(cnt + L.fin + ob, 1) == rt.npass - 1;
            if (!__syncthreads_or(last)) continue;
            __threadfence(); /* every (expert, pass) of block ob is in scratch */
            reduce_block(p, rt, ob);
            if (tid == 0) cnt[L.fin + ob] = 0;
            /* the last block: every FC2 unit is past its waits, every FC1 block done */
            if (tid == 0) last = atomicAdd(cnt + L.fin_all, 1) == nb2 - 1;
            if (__syncthreads_or(tid == 0 && last)) {
                for (int i = tid; i < nact * nb1; i += NTHR) cnt[L.ready + i] = 0;
                if (tid == 0) cnt[L.fin_all] = 0;
            }
        }
    }
    FM_TL_NOW(3);
    /* rest state (p.dynamic): the last CTA past its units (no take follows in this launch)
     * zeroes the counter; fenced as the other counters' resets (this CTA's takes before its
     * count, every count before the reset) */
    if (dyn && tid == 0) {
        __threadfence();
        if (atomicAdd(work + 1, 1) == (int)gridDim.x - 1) {
            __threadfence();
            work[0] = 0, work[1] = 0;
        }
    }
    if (nact == 0) /* no local rows: out = init or 0, block by block */
        for (int ob = blockIdx.x; ob < nb2; ob += gridDim.x) reduce_block(p, rt, ob);

    /* NaN/Inf in the x rows the run read (tokens with a local slot): the gather's report */
    if (p.err) {
        const long long n8 = (long long)p.T * p.k1 / 8;
        for (long long i = (long long)blockIdx.x * NTHR + tid; i < n8; i += (long long)gridDim.x * NTHR) {
            const int tk = (int)(i * 8 / p.k1);
            bool      read = false;
            for (int j = 0; j < p.top_k; j++) read |= rt.tslot[tk * p.top_k + j] >= 0;
            if (!read) continue;
            const uint4 v = *(const uint4 *)(p.x + i * 8);
            const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
            bool bad = false;
#pragma unroll
            for (int q = 0; q < 4; q++)
                bad |= (w4[q] & 0x7f800000u) == 0x7f800000u || (w4[q] & 0x7f80u) == 0x7f80u;
            if (bad)
                for (int q = 0; q < 8; q++)
                    if ((p.x[i * 8 + q] & 0x7f80u) == 0x7f80u) {
                        atomicMin(&p.err->first_nonfinite_x, (unsigned long long)(i * 8 + q));
                        break;
                    }
        }
    }
#ifdef FM_DECODE_TL
    FM_TL_NOW(4);
    FM_TL(5, tl_wait);
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    FM_TL(6, smid);
    FM_TL(7, tl_units);
#endif
#undef FM_TL_WAIT
}

__global__ void __launch_bounds__(NTHR, FM_DECODE_MIN_BLOCKS) decode_kernel(const fm_decode_params p)
{
    decode_body<false>(p);
}

/* the gpt-oss twin (fm_decode_oss): FC1 / FC2 biases, the clamped SwiGLU */
__global__ void __launch_bounds__(NTHR, FM_DECODE_MIN_BLOCKS) decode_oss_kernel(const fm_decode_params p)
{
    decode_body<true>(p);
}

} // namespace

extern "C" size_t fm_decode_buffer_bytes(int slots, int n_local, int n1, int n2, int ks1, int ks2)
{
    return layout_of(slots, n_local, n1, n2, ks1, ks2).bytes;
}

extern "C" size_t fm_decode_smem_bytes(void) { return (size_t)SMEM; }

extern "C" int fm_decode_occupancy(int oss, int *blocks_per_sm, int *regs)
{
    const void *fn = oss ? (const void *)decode_oss_kernel : (const void *)decode_kernel;
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, fn, NTHR, SMEM);
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, fn);
    if (e == cudaSuccess && regs) *regs = fa.numRegs;
    return (int)e;
}

extern "C" int fm_decode_launch(const fm_decode_params *p, int grid, void *stream)
{
    if (grid < 1 || p->T * p->top_k > FM_DECODE_MAX_SLOTS || p->ks1 < 1 || p->ks2 < 1 ||
        (p->act != FM_ACT_SWIGLU && p->act != FM_ACT_SWIGLU_GPTOSS))
        return (int)cudaErrorInvalidValue;
    const void *fn = fm_decode_oss(p->act, p->b1, p->b2) ? (const void *)decode_oss_kernel : (const void *)decode_kernel;
    /* the strided form, cooperative: the runtime launches it only if every CTA can be resident
     * at once (the flag waits' guarantee), else fails with cudaErrorCooperativeLaunchTooLarge;
     * the counter form (p->dynamic) needs no residency (decode.cu's header): a plain launch */
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = p->dynamic ? 0 : 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(NTHR);
    cfg.dynamicSmemBytes = SMEM;
    cfg.stream = (cudaStream_t)stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    void *args[] = {(void *)p};
    return (int)cudaLaunchKernelExC(&cfg, fn, args);
}

extern "C" void fm_decode_auto_splits(int grid, int active, int n1, int k1, int n2, int k2, int *ks1, int *ks2)
{
    const buf_layout l = layout_of(1, 1, n1, n2, 1, 1);
    const int        nb[2] = {l.nb1, l.nb2}, ks_k[2] = {k1, k2};
    int             *out[2] = {ks1, ks2};
    active = active > 0 ? active : 1;
    for (int gi = 0; gi < 2; gi++) {
        const int nks = ((ks_k[gi] + 63) / 64 * 64 + KC - 1) / KC, cap = nks < FM_DECODE_MAX_K_SPLITS ? nks : FM_DECODE_MAX_K_SPLITS;
        int       ks = 1; /* the most splits whose units still fit one wave of the grid */
        while (2 * ks <= cap && (long long)active * nb[gi] * 2 * ks <= grid) ks *= 2;
        *out[gi] = ks;
    }
}

extern "C" const void *fm_decode_generic_kernel(void) { return (const void *)decode_kernel; }

extern "C" int fm_decode_timeline(unsigned long long *rec, int cap)
{
#ifdef FM_DECODE_TL
    if (cap > FM_DECODE_TL_CAP) cap = FM_DECODE_TL_CAP;
    if (!rec || cap < 1) return FM_DECODE_TL_CAP;
    const cudaError_t e = cudaMemcpyFromSymbol(rec, fm_decode_tl, sizeof(unsigned long long) * 8 * (size_t)cap);
    return e == cudaSuccess ? cap : -(int)e;
#else
    (void)rec, (void)cap;
    return 0;
#endif
}
