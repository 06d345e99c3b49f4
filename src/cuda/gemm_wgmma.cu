/* gemm_wgmma.cu - the FP4 grouped GEMM on Hopper's warpgroup MMA (sm_90a).
 *
 * Same operation, weights and epilogues as gemm_swapab.cu (Y_e = X_e . W_e^T,
 * expert offsets on the device), same swap-AB orientation, but the MMA is
 * wgmma.mma_async m64nNk16 with
 *  - A = the dequantized weights, straight from registers: the register
 *    fragment of wgmma's A is, per warp, the m16n8k16 A fragment, which is what
 *    one prepacked 16-byte word per lane decodes to (src/cuda/prepack.c), so
 *    a weight element is decoded once per CTA and never stored back;
 *  - B = the token tile X[8*NT][KC], read by the tensor cores from shared
 *    memory in the no-swizzle K-major core-matrix layout: core matrix
 *    (token group rg, K group c) = 8 tokens x 8 K x 2 B = 128 contiguous bytes
 *    at (rg * KC/8 + c) * 128; descriptor LBO (next 8 K) = 128 B,
 *    SBO (next 8 tokens) = KC * 16 B. The K order inside a 64-K chunk is the
 *    prepack's, not the natural one: the prepacked A fragment of MMA step s
 *    holds, in lane (g, t), K = 16t + 4s + {0,1} (logical k 2t, 2t+1) and
 *    16t + 4s + {2,3} (logical k 2t+8, 2t+9) (so that gemm_swapab.cu reads X
 *    with 16-byte loads), so core matrix 2s + h of a chunk holds, in 4-byte
 *    column t, X[16t + 4s + 2h .. +1]: the token tile is loaded into registers
 *    (16-byte loads) and stored transposed (16-byte stores), one stage ahead
 *    (the descriptor and fragment conventions are checked by
 *    bench/probe/wgmma_rs_probe.cu, the whole kernel by tests/gpu);
 *  - N = 8*NT tokens per wgmma (up to 256), M = 64 features per warpgroup and
 *    m64 tile, MT tiles per warpgroup, 1 or 2 warpgroups per CTA.
 * One CTA computes one (expert, 8*NT-token pass, feature block) tile; the 1-D
 * grid enumerates tiles expert by expert (each expert's weights and rows are
 * then read by CTAs that run at the same time: the L2 serves the re-reads),
 * and every warp finds its CTA's tile from the device offsets by a warp scan,
 * so the host never needs the row counts (graph-capturable). The stage
 * weights and scale bytes come by cp.async, STAGES deep, one barrier a stage;
 * the tensor cores run stage k while the warps decode stage k+1 into a second
 * register set and store the token tile of stage k+2.
 * Shared memory = fm_smem_wgmma(tile) (src/plan/fm_kernels_smem.c), all dynamic.
 * Only the sm_90a build has a body; the launcher refuses other devices.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/kernel_common.cuh"
#include "cuda/wgmma_rs.cuh"

namespace {
using namespace fm_kc;

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

template <int WARPS, int MT, int NT, int KC, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, 1) wgmma_kernel(const fm_swapab_params p, int nfb)
{
#ifdef FM_WGMMA_BODY
    constexpr int TOK = 8 * NT;          /* tokens per pass = wgmma N */
    constexpr int CPS = KC / 64;         /* prepacked chunks per stage */
    constexpr int W_OFF = TOK * KC * 2;  /* X tile of a stage, core-matrix layout */
    constexpr int S_OFF = W_OFF + WARPS * MT * CPS * 512;
    constexpr int STAGE_B = (S_OFF + WARPS * MT * CPS * 64 + 1023) / 1024 * 1024; /* swizzle atoms 1 KB aligned */
    constexpr unsigned FULL = 0xFFFFFFFFu;
    extern __shared__ __align__(1024) unsigned char smem[];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    /* ---- which tile: expert-major enumeration, nfb feature blocks x passes per expert */
    const int slot = blockIdx.x;
    int       e = -1, local = 0, base = 0;
    for (int e0 = 0; e0 < p.n_experts; e0 += 32) {
        int ee = e0 + lane, cnt = 0;
        if (ee < p.n_experts) {
            int r0 = p.offsets[ee], r1 = min(p.offsets[ee + 1], p.max_rows);
            if (r0 >= 0 && r1 > r0) cnt = ((r1 - r0 + TOK - 1) / TOK) * nfb;
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
            break;
        }
        base += tot;
    }
    if (e < 0) return; /* the same answer in every warp: the whole CTA leaves */
    const int row0 = p.offsets[e], m = min(p.offsets[e + 1], p.max_rows) - row0;
    const int npass = (m + TOK - 1) / TOK;
    const int fb = local / npass, pass0 = (local % npass) * TOK;
    const int rows = min(TOK, m - pass0);

    /* ---- this warp's bands: warp wl of warpgroup wg holds rows 16*wl.. of each m64 tile */
    const int  wg = warp >> 2, wl = warp & 3;
    const int  KB = p.kp / 64, nks = (p.kp + KC - 1) / KC;
    const int  nbands = p.n / 16;
    const bool swiglu = p.epi == FM_CUDA_EPI_SWIGLU;
    int        band[MT];
    bool       bvalid[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        if (swiglu) { /* MT == 2 (launcher): tile 0 gate rows, tile 1 the matching up rows */
            int gb = (fb * (WARPS / 4) + wg) * 4 + wl;
            band[i] = gb + (i ? nbands / 2 : 0);
            bvalid[i] = gb < nbands / 2;
        } else {
            band[i] = ((fb * (WARPS / 4) + wg) * MT + i) * 4 + wl;
            bvalid[i] = band[i] < nbands;
        }
    }
    const uint4    *wd = (const uint4 *)p.wdata + (size_t)e * nbands * KB * 32;
    const uint16_t *ws = (const uint16_t *)p.wscale + (size_t)e * nbands * KB * 32;
    const float     osc = p.oscale[e];
    const uint16_t *xg = p.x + (size_t)(row0 + pass0) * p.k;

    /* X, in the prepack's K order (see the header): pair (t, s, h) of a 64-K chunk,
     * K = 16t + 4s + 2h (+1), goes to core matrix 2s + h (MMA step s, its K half h),
     * 4-byte column t. Natural 16-byte chunk u (K 8u..8u+7) word w is pair 4u + w:
     * core 4(u%2) + w, column u/2. So a thread loads the 4 even (or odd) chunks of
     * one token row and chunk, 16 B each (registers, one stage ahead), transposes
     * the 4x4 words and stores 4 whole core-matrix rows of 16 B: 8 threads of
     * consecutive tokens fill 128 contiguous bytes (no bank conflict). Tokens past
     * the pass and K past p.k are zeros. */
#if FM_WGMMA_SW128
    /* 128-byte swizzle, K-major: the 64 K of one token row (8 core-matrix columns
     * j of 16 B) fill one 128-byte line; 8 token rows = one 1 KB atom; column j of
     * row r sits at 16 * (j ^ (r % 8)), so 8 rows of one column hit 8 different
     * bank groups, for these stores and for the tensor cores' reads.
     * Stage tile = [chunk c64][token group][8 rows][128 B]. */
    auto x_row_off = [](int c64, int r) { return c64 * TOK * 128 + r * 128; };
    auto x_col_off = [](int j, int r8) { return (j ^ r8) * 16; };
#else
    /* no swizzle: core matrix (token group, K group) = 128 contiguous bytes */
    auto x_row_off = [](int c64, int r) { return ((r / 8) * (KC / 8) + c64 * 8) * 128 + (r % 8) * 16; };
    auto x_col_off = [](int j, int) { return j * 128; };
#endif
    constexpr int XITEMS = TOK * CPS * 2;                       /* (token, chunk, parity) */
    constexpr int XI = (XITEMS + WARPS * 32 - 1) / (WARPS * 32); /* per thread */
    uint4         xr[XI][4];
    auto x_fetch = [&](int ks) {
#pragma unroll
        for (int it = 0; it < XI; it++) {
            int item = threadIdx.x + it * WARPS * 32;
            int r8 = item & 7, par = (item >> 3) & 1, rest = item >> 4, c64 = rest % CPS, rg = rest / CPS;
            int r = rg * 8 + r8, k0 = ks * KC + c64 * 64 + par * 8;
            bool rok = item < XITEMS && r < rows;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int k = k0 + 16 * j;
                xr[it][j] = rok && k < p.k ? __ldg((const uint4 *)(xg + (size_t)r * p.k + k)) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    auto x_store = [&](int ks) {
        unsigned char *buf = smem + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int it = 0; it < XI; it++) {
            int item = threadIdx.x + it * WARPS * 32;
            if (item >= XITEMS) continue;
            int r8 = item & 7, par = (item >> 3) & 1, rest = item >> 4, c64 = rest % CPS, rg = rest / CPS;
            unsigned char *row = buf + x_row_off(c64, rg * 8 + r8);
            int            j0 = par * 4;
            *(uint4 *)(row + x_col_off(j0 + 0, r8)) = make_uint4(xr[it][0].x, xr[it][1].x, xr[it][2].x, xr[it][3].x);
            *(uint4 *)(row + x_col_off(j0 + 1, r8)) = make_uint4(xr[it][0].y, xr[it][1].y, xr[it][2].y, xr[it][3].y);
            *(uint4 *)(row + x_col_off(j0 + 2, r8)) = make_uint4(xr[it][0].z, xr[it][1].z, xr[it][2].z, xr[it][3].z);
            *(uint4 *)(row + x_col_off(j0 + 3, r8)) = make_uint4(xr[it][0].w, xr[it][1].w, xr[it][2].w, xr[it][3].w);
        }
    };
    /* the weights and scale bytes of a stage, by cp.async */
    auto load_stage = [&](int ks) {
        unsigned char *buf = smem + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int c = 0; c < CPS; c++) {
            int kb = ks * CPS + c;
#pragma unroll
            for (int i = 0; i < MT; i++) {
                bool   ok = bvalid[i] && kb < KB;
                size_t off = ok ? ((size_t)band[i] * KB + kb) * 32 : 0;
                int    sl = (warp * MT + i) * CPS + c;
                cp_async16(buf + W_OFF + sl * 512 + lane * 16, wd + off + lane, ok ? 16 : 0);
                if (lane < 4)
                    cp_async16(buf + S_OFF + sl * 64 + lane * 16, (const unsigned char *)(ws + off) + lane * 16,
                               ok ? 16 : 0);
            }
        }
    };

    float acc[MT][TOK / 2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < TOK / 2; j++) acc[i][j] = 0.0f;

    /* the A operand of one stage: chunk c, m64 tile i, MMA step s -> 4 registers */
    typedef uint32_t stage_regs[CPS][MT][4][4];
    auto dequant = [&](int ks, stage_regs &a) {
        const unsigned char *buf = smem + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int i = 0; i < MT; i++) {
                int      sl = (warp * MT + i) * CPS + c;
                uint4    wq = *(const uint4 *)(buf + W_OFF + sl * 512 + lane * 16);
                uint32_t sc = *(const uint16_t *)(buf + S_OFF + sl * 64 + lane * 2);
                uint32_t s_lo = (sc & 0xFFu) * p.sc_mul + p.sc_add;
                uint32_t s_hi = (sc >> 8) * p.sc_mul + p.sc_add;
                dequant_step(wq.x, s_lo, s_hi, a[c][i][0]);
                dequant_step(wq.y, s_lo, s_hi, a[c][i][1]);
                dequant_step(wq.z, s_lo, s_hi, a[c][i][2]);
                dequant_step(wq.w, s_lo, s_hi, a[c][i][3]);
            }
    };
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    auto issue = [&](int ks, const stage_regs &a) {
        const uint32_t sb = smem0 + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < TOK / 2; j++) asm volatile("" : "+f"(acc[i][j])::"memory");
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                /* MMA step c*4+s: core-matrix columns 2(c*4+s) and +1 of the stage */
#if FM_WGMMA_SW128
                /* step s = columns 2s, 2s+1 of chunk c's lines: +32 B inside the atom
                 * (the hardware applies the XOR); next 8 tokens: SBO = 1 KB */
                uint64_t desc = smem_desc(sb + c * TOK * 128 + s * 32, 16, 1024) | (1ull << 62);
#else
                uint64_t desc = smem_desc(sb + (c * 4 + s) * 256, 128, KC * 16);
#endif
#pragma unroll
                for (int i = 0; i < MT; i++) wgmma_rs_t<TOK>::run(acc[i], a[c][i][s], desc);
            }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    };

    /* Software pipeline: the tensor cores run stage ks (A from registers `a`, X from
     * buffer ks) while the warps decode stage ks+1 into `an`; buffers ks+2 .. ks+STAGES-1
     * are in flight. The load issued at step ks refills buffer ks-1, whose MMAs every
     * warpgroup waited for before the barrier. One cp.async group is committed per
     * prologue stage and per iteration (empty ones included), so stage ks+1 has landed
     * when at most STAGES-3 groups are pending. */
    static_assert(STAGES >= 4, "stage ks in the MMAs, ks+1 in decode, ks+2 being stored, ks-2's buffer reused");
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nks) load_stage(s);
        cp_async_commit();
    }
    x_fetch(0);
    x_store(0);
    if (nks > 1) {
        x_fetch(1);
        x_store(1);
    }
    if (nks > 2) x_fetch(2);
    cp_async_wait<STAGES - 2>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* stores and cp.async data -> tensor-core reads */
    __syncthreads();
    stage_regs a, an;
    dequant(0, a);
    for (int ks = 0; ks < nks; ks++) {
        issue(ks, a);
        if (ks + 1 < nks) {
            /* X of stage ks+2 into buffer ks+2-STAGES <= ks-2, whose MMAs every
             * warpgroup finished before the previous barrier */
            if (ks + 2 < nks) x_store(ks + 2);
            if (ks + 3 < nks) x_fetch(ks + 3);
            cp_async_wait<STAGES - 3>();
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads(); /* stage ks+1 visible; every warpgroup finished the MMAs of ks-1 */
            if (ks + STAGES - 1 < nks) load_stage(ks + STAGES - 1);
            cp_async_commit();
            dequant(ks + 1, an);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        /* The MMAs read `a` and write `acc` asynchronously: these empty asm keep both
         * alive (and unmoved) until the wait, so `an` cannot take a's registers while
         * the tensor cores still read them. */
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < TOK / 2; j++) asm volatile("" : "+f"(acc[i][j])::"memory");
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int s = 0; s < 4; s++)
#pragma unroll
                    for (int q = 0; q < 4; q++) asm volatile("" : "+r"(a[c][i][s][q])::"memory");
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int s = 0; s < 4; s++)
#pragma unroll
                    for (int q = 0; q < 4; q++) a[c][i][s][q] = an[c][i][s][q];
    }
    cp_async_wait<0>();

    /* accumulator j of a thread: 8-token group j/4, element j%4 of the m16n8 C layout */
    epilogue<MT, NT>(p, band, bvalid, row0 + pass0, rows, osc, g, t,
                     [&](int i, int n, int q) { return acc[i][n * 4 + q]; });
#else
    (void)p;
    (void)nfb;
#endif
}

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

/* Warp-specialized version: one producer warpgroup (warps 0-3) streams the stages
 * (token tile, already in the prepack's K order, and weights and scale bytes,
 * all by 16-byte cp.async; 128-byte swizzle), each completing on the stage's
 * `full` mbarrier (cp.async.mbarrier.arrive); WARPS consumer warps (WARPS/4
 * warpgroups) decode and run the MMAs: stage k is decoded into one of two
 * register sets while the MMAs of stage k-1 may still run, and stage k-1's
 * buffer is handed back (`empty` mbarrier) once they have. No CTA-wide barrier
 * in the main loop. With two consumer warpgroups, setmaxnreg moves registers
 * from the producer (56) to the consumers (224). */
template <int WARPS, int MT, int NT, int KC, int STAGES>
__global__ void __launch_bounds__((WARPS + 4) * 32, 1) wgmma_ws_kernel(const fm_swapab_params p, int nfb)
{
#ifdef FM_WGMMA_BODY
    constexpr int TOK = 8 * NT;
    constexpr int CPS = KC / 64;
    constexpr int W_OFF = TOK * KC * 2;
    constexpr int S_OFF = W_OFF + WARPS * MT * CPS * 512;
    constexpr int STAGE_B = (S_OFF + WARPS * MT * CPS * 64 + 1023) / 1024 * 1024;
    constexpr unsigned FULL = 0xFFFFFFFFu;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t bar_full = smem0 + STAGES * STAGE_B, bar_empty = bar_full + 8 * STAGES;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

    /* ---- which tile (every warp computes the same answer) */
    const int slot = blockIdx.x;
    int       e = -1, local = 0, base = 0;
    for (int e0 = 0; e0 < p.n_experts; e0 += 32) {
        int ee = e0 + lane, cnt = 0;
        if (ee < p.n_experts) {
            int r0 = p.offsets[ee], r1 = min(p.offsets[ee + 1], p.max_rows);
            if (r0 >= 0 && r1 > r0) cnt = ((r1 - r0 + TOK - 1) / TOK) * nfb;
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
            break;
        }
        base += tot;
    }
    if (e < 0) return;
    const int row0 = p.offsets[e], m = min(p.offsets[e + 1], p.max_rows) - row0;
    const int npass = (m + TOK - 1) / TOK;
    const int fb = local / npass, pass0 = (local % npass) * TOK;
    const int rows = min(TOK, m - pass0);
    const int KB = p.kp / 64, nks = (p.kp + KC - 1) / KC;
    const int nbands = p.n / 16;
    const bool swiglu = p.epi == FM_CUDA_EPI_SWIGLU;

    /* the bands of consumer warp cw (warpgroup cw/4, rows 16*(cw%4).. of each m64 tile) */
    auto band_of = [&](int cw, int i, bool &valid) {
        int cg = cw >> 2, cl = cw & 3;
        if (swiglu) {
            int gb = (fb * (WARPS / 4) + cg) * 4 + cl;
            valid = gb < nbands / 2;
            return gb + (i ? nbands / 2 : 0);
        }
        int b = ((fb * (WARPS / 4) + cg) * MT + i) * 4 + cl;
        valid = b < nbands;
        return b;
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bar_full + 8 * s, 128);   /* every producer thread's cp.async arrival */
            mbar_init(bar_empty + 8 * s, WARPS); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp < 4) {
        /* ================= producer warpgroup ================= */
        if (WARPS == 8) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
        const int       pt = threadIdx.x; /* 0..127 */
        const uint16_t *xg = p.x + (size_t)(row0 + pass0) * p.k;
        const uint4    *wd = (const uint4 *)p.wdata + (size_t)e * nbands * KB * 32;
        const unsigned char *ws = (const unsigned char *)p.wscale + (size_t)e * nbands * KB * 64;
        /* Every copy of this thread, worked out once: only the K offset moves from
         * stage to stage (the producer is one warp per scheduler: its issue rate is
         * what feeds the consumers). X: 16-byte chunk j of a row's 64-K block, already
         * in the prepack's K order (fm_cuda_x_pack), is core-matrix column j; 8
         * threads copy one 128-byte line. */
        constexpr int XN = TOK * KC / 8, XPER = (XN + 127) / 128;
        constexpr int XROWS = 16 / CPS; /* rows between a thread's copies (128 threads x 8 chunks / CPS) */
        static_assert(XN <= 128 || XROWS % 8 == 0, "a thread's rows keep their swizzle phase");
        const int pj = pt & 7, prest = pt >> 3, xc64 = (prest % CPS) * 64 + pj * 8, pr = prest / CPS;
        const int xoff0 = pr * p.k + xc64;
#if FM_WGMMA_SW128
        const int xdst0 = (prest % CPS) * TOK * 128 + pr * 128 + ((pj ^ (pr & 7)) * 16);
#else
        const int xdst0 = ((pr / 8) * (KC / 8) + (prest % CPS) * 8 + pj) * 128 + (pr & 7) * 16;
#endif
        unsigned xmask = 0; /* copy i has a real token row */
#pragma unroll
        for (int i = 0; i < XPER; i++)
            if (pt + 128 * i < XN && pr + XROWS * i < rows) xmask |= 1u << i;
        /* weights: slot sl = (consumer warp, tile, chunk) of 32 x 16 B; lane = 16-byte
         * part, slots pt/32 + 4i; its 4 x 16 B of scale bytes by threads sl*4 + part */
        constexpr int SLOTS = WARPS * MT * CPS, WPER = (SLOTS + 3) / 4;
        auto slot_src = [&](int sl, int &c, bool &bv) { /* (band*KB + chunk) of slot sl */
            c = sl % CPS;
            int b = band_of(sl / (CPS * MT), (sl / CPS) % MT, bv);
            return b * KB + c;
        };
        int      woff[WPER];
        unsigned wmask = 0;
        int      wc = 0;
#pragma unroll
        for (int i = 0; i < WPER; i++) {
            int  sl = (pt >> 5) + 4 * i, c;
            bool bv;
            int  bk = slot_src(sl < SLOTS ? sl : 0, c, bv);
            woff[i] = bk * 512 + (pt & 31) * 16;
            wc = c; /* the same for every i: 4i keeps sl % CPS (CPS <= 2) */
            if (sl < SLOTS && bv) wmask |= 1u << i;
        }
        const bool sthr = pt < SLOTS * 4; /* this thread copies 16 B of scale bytes */
        int        soff = 0, sc_c = 0;
        bool       sok = false;
        if (sthr) soff = slot_src(pt >> 2, sc_c, sok) * 64 + (pt & 3) * 16;
        for (int ks = 0; ks < nks; ks++) {
            const int s = ks % STAGES;
            mbar_wait(bar_empty + 8 * s, ((ks / STAGES) + 1) & 1);
            unsigned char *buf = smem + s * STAGE_B;
            const bool kin = ks * KC + xc64 < p.k;
#pragma unroll
            for (int i = 0; i < XPER; i++) {
                if (pt + 128 * i >= XN) break;
                bool ok = kin && ((xmask >> i) & 1);
#if FM_WGMMA_SW128
                int dst = xdst0 + XROWS * i * 128;
#else
                int dst = xdst0 + (XROWS / 8) * i * (KC / 8) * 128;
#endif
                cp_async16(buf + dst, ok ? xg + xoff0 + (size_t)XROWS * i * p.k + ks * KC : p.x, ok ? 16 : 0);
            }
            const bool wkin = ks * CPS + wc < KB;
#pragma unroll
            for (int i = 0; i < WPER; i++) {
                if ((pt >> 5) + 4 * i >= SLOTS) break;
                bool ok = wkin && ((wmask >> i) & 1);
                const unsigned char *src = (const unsigned char *)wd + woff[i] + (size_t)ks * CPS * 512;
                cp_async16(buf + W_OFF + ((pt >> 5) + 4 * i) * 512 + (pt & 31) * 16, ok ? (const void *)src : (const void *)p.x,
                           ok ? 16 : 0);
            }
            if (sthr) {
                bool ok = sok && ks * CPS + sc_c < KB;
                cp_async16(buf + S_OFF + pt * 16, ok ? (const void *)(ws + soff + (size_t)ks * CPS * 64) : (const void *)p.x,
                           ok ? 16 : 0);
            }
            mbar_arrive_cp_async(bar_full + 8 * s);
        }
        cp_async_wait<0>();
        return;
    }

    /* ================= consumer warpgroups ================= */
    if (WARPS == 8) asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    const int cw = warp - 4;
    int       band[MT];
    bool      bvalid[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) band[i] = band_of(cw, i, bvalid[i]);
    const float osc = p.oscale[e];

    float acc[MT][TOK / 2];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < TOK / 2; j++) acc[i][j] = 0.0f;

    typedef uint32_t stage_regs[CPS][MT][4][4];
    auto dequant = [&](int ks, stage_regs &a) {
        const unsigned char *buf = smem + (ks % STAGES) * STAGE_B;
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int i = 0; i < MT; i++) {
                int      sl = (cw * MT + i) * CPS + c;
                uint4    wq = *(const uint4 *)(buf + W_OFF + sl * 512 + lane * 16);
                uint32_t sc = *(const uint16_t *)(buf + S_OFF + sl * 64 + lane * 2);
                uint32_t s_lo = (sc & 0xFFu) * p.sc_mul + p.sc_add;
                uint32_t s_hi = (sc >> 8) * p.sc_mul + p.sc_add;
                dequant_step(wq.x, s_lo, s_hi, a[c][i][0]);
                dequant_step(wq.y, s_lo, s_hi, a[c][i][1]);
                dequant_step(wq.z, s_lo, s_hi, a[c][i][2]);
                dequant_step(wq.w, s_lo, s_hi, a[c][i][3]);
            }
    };
    auto fence_acc = [&]() {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < TOK / 2; j++) asm volatile("" : "+f"(acc[i][j])::"memory");
    };
    auto fence_regs = [&](stage_regs &a) {
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int s = 0; s < 4; s++)
#pragma unroll
                    for (int q = 0; q < 4; q++) asm volatile("" : "+r"(a[c][i][s][q])::"memory");
    };
    auto issue = [&](int ks, stage_regs &a) {
        const uint32_t sb = smem0 + (ks % STAGES) * STAGE_B;
        fence_acc();
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int c = 0; c < CPS; c++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
#if FM_WGMMA_SW128
                uint64_t desc = smem_desc(sb + c * TOK * 128 + s * 32, 16, 1024) | (1ull << 62);
#else
                uint64_t desc = smem_desc(sb + (c * 4 + s) * 256, 128, KC * 16);
#endif
#pragma unroll
                for (int i = 0; i < MT; i++) wgmma_rs_t<TOK>::run(acc[i], a[c][i][s], desc);
            }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    };
    /* stage ks: wait until it has landed, decode it, issue its MMAs, then wait for
     * the MMAs of ks-1 (ks's may run on) and give ks-1's buffer back. Two register
     * sets, used alternately (the loop body is written twice). */
    auto step = [&](int ks, stage_regs &cur, stage_regs &prev) {
        const int s = ks % STAGES;
        mbar_wait(bar_full + 8 * s, (ks / STAGES) & 1);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* cp.async data -> tensor-core reads */
        dequant(ks, cur);
        issue(ks, cur);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        fence_acc();
        fence_regs(prev);
        fence_regs(cur);
        if (ks > 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_empty + 8 * ((ks - 1) % STAGES));
        }
    };
    stage_regs ra, rb;
    int        ks = 0;
    for (; ks + 1 < nks; ks += 2) {
        step(ks, ra, rb);
        step(ks + 1, rb, ra);
    }
    if (ks < nks) step(ks, ra, rb);
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    fence_acc();

    epilogue<MT, NT>(p, band, bvalid, row0 + pass0, rows, osc, g, t,
                     [&](int i, int n, int q) { return acc[i][n * 4 + q]; });
#else
    (void)p;
    (void)nfb;
#endif
}

typedef void (*kernel_fn)(const fm_swapab_params, int);

/* Same rows, same order as k_wgmma_tiles in src/plan/fm_kernels_smem.c. fn: the
 * warp-specialized kernel for packed X (its smem is what fm_smem_wgmma counts);
 * fn_nat: the single-role kernel for natural X (the same smem less the unused
 * mbarrier bytes; it is launched with fm_smem_wgmma's size too). */
struct entry {
    int       warps, mt, nt, kc, stages;
    kernel_fn fn, fn_nat;
};
#define FM_WGMMA_ENTRY(w, mt, nt, kc, st)                                                                            \
    {w, mt, nt, kc, st, wgmma_ws_kernel<w, mt, nt, kc, st>, wgmma_kernel<w, mt, nt, kc, st>}
const entry k_entries[] = {
    FM_WGMMA_ENTRY(8, 2, 16, 64, 4), FM_WGMMA_ENTRY(8, 2, 16, 64, 6), FM_WGMMA_ENTRY(8, 1, 32, 64, 4),
    FM_WGMMA_ENTRY(4, 2, 16, 64, 4), FM_WGMMA_ENTRY(8, 2, 8, 64, 4),
    FM_WGMMA_ENTRY(4, 2, 8, 64, 4),  FM_WGMMA_ENTRY(8, 2, 4, 128, 4), FM_WGMMA_ENTRY(4, 2, 2, 128, 4),
    FM_WGMMA_ENTRY(4, 1, 1, 128, 4), FM_WGMMA_ENTRY(4, 2, 1, 128, 4),
};
const int k_n_entries = sizeof(k_entries) / sizeof(k_entries[0]);
#define FM_WGMMA_MAX_DEV 64
size_t k_dyn_set[FM_WGMMA_MAX_DEV][sizeof(k_entries) / sizeof(k_entries[0])][2];

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

} // namespace

extern "C" int fm_wgmma_find(const fm_cuda_tile *t)
{
    if (!t || t->kernel != FM_CUDA_KERNEL_WGMMA) return -1;
    for (int i = 0; i < k_n_entries; i++) {
        const entry &x = k_entries[i];
        if (x.warps == t->warps && x.mt == t->mt && x.nt == t->nt && x.kc == t->kc && x.stages == t->stages) return i;
    }
    return -1;
}

extern "C" long long fm_wgmma_grid(int idx, const fm_swapab_params *p)
{
    if (idx < 0 || idx >= k_n_entries) return -1;
    const entry &x = k_entries[idx];
    long long    tok = 8LL * x.nt;
    int          per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x.warps * x.mt / 2 : x.warps * x.mt; /* bands per CTA */
    int          bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    long long    nfb = (bands + per_cta - 1) / per_cta;
    /* sum over experts of ceil(m_e / tok) <= (max_rows + E*(tok-1)) / tok */
    long long passes = ((long long)p->max_rows + (long long)p->n_experts * (tok - 1)) / tok;
    return nfb * passes;
}

extern "C" int fm_wgmma_launch(int idx, const fm_swapab_params *p, size_t smem, void *stream)
{
    if (idx < 0 || idx >= k_n_entries) return (int)cudaErrorInvalidValue;
    const entry &x = k_entries[idx];
    int          dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return (int)cudaGetLastError();
    const int nat = !p->x_packed;
    kernel_fn fn = nat ? x.fn_nat : x.fn;
    size_t   *set = dev >= 0 && dev < FM_WGMMA_MAX_DEV ? &k_dyn_set[dev][idx][nat] : NULL;
    if (!set || smem > *set) {
        cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return (int)err;
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared);
        if (err != cudaSuccess) return (int)err;
        if (set) *set = smem;
    }
    int       per_cta = p->epi == FM_CUDA_EPI_SWIGLU ? x.warps * x.mt / 2 : x.warps * x.mt;
    int       bands = p->epi == FM_CUDA_EPI_SWIGLU ? p->n / 32 : p->n / 16;
    int       nfb = (bands + per_cta - 1) / per_cta;
    long long grid = fm_wgmma_grid(idx, p);
    if (grid <= 0) return 0; /* no rows: nothing to launch */
    if (grid > 0x7FFFFFFFLL) return (int)cudaErrorInvalidConfiguration;
    if (nat) fn<<<(unsigned)grid, x.warps * 32, smem, (cudaStream_t)stream>>>(*p, nfb);
    else fn<<<(unsigned)grid, (x.warps + 4) * 32, smem, (cudaStream_t)stream>>>(*p, nfb); /* + producer warpgroup */
    return (int)cudaGetLastError();
}

extern "C" int fm_wgmma_attributes(int idx, int x_packed, size_t *static_smem, size_t *max_dyn)
{
    if (idx < 0 || idx >= k_n_entries) return (int)cudaErrorInvalidValue;
    cudaFuncAttributes a;
    cudaError_t        err = cudaFuncGetAttributes(&a, x_packed ? k_entries[idx].fn : k_entries[idx].fn_nat);
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
