/* decode_parts.cuh - the device parts of the one-launch decode kernel (decode.cu, which says
 * what the kernel does and why): its tile constants, the routing tables every CTA builds,
 * the decode buffer's layout, the acquire / release counters, one GEMM pass of an FC1 or
 * FC2 unit, the split-K sum and the finalize of an output block. Included by decode.cu
 * only (an anonymous namespace: one copy). */
#ifndef FM_CUDA_DECODE_PARTS_CUH
#define FM_CUDA_DECODE_PARTS_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/decode.h"
#include "cuda/kernel_common.cuh"

namespace {
using namespace fm_kc;

/* FM_DECODE_STAGES (K stages in flight) and FM_DECODE_MIN_BLOCKS (the CTAs per SM the
 * registers are bounded for): build-time knobs for A/B measurements (cmake
 * -DFM_DECODE_DEFS="FM_DECODE_MIN_BLOCKS=4;FM_DECODE_STAGES=6": this file's units only); the defaults are the measured choice (bench/RESULTS.md). The sums do not
 * depend on either (K stages are consumed in order). */
#ifndef FM_DECODE_STAGES
#define FM_DECODE_STAGES 4
#endif
#ifndef FM_DECODE_MIN_BLOCKS
#define FM_DECODE_MIN_BLOCKS 3
#endif
constexpr int NW = 4, MT = 2, KC = FM_DECODE_KC, ST = FM_DECODE_STAGES, TOK = 8, CPS = KC / 64, NTHR = NW * 32;
static_assert(ST >= 2 && ST <= 8, "FM_DECODE_STAGES: 2 to 8");
constexpr int ROWB = 2 * KC + 16;                  /* staged X row: 16 B of padding (bank conflicts) */
constexpr int W_OFF = TOK * ROWB;                  /* weight chunks of a stage */
constexpr int S_OFF = W_OFF + NW * MT * CPS * 512; /* their scale bytes */
constexpr int STAGE_B = S_OFF + NW * MT * CPS * 64;
constexpr int SMEM = ST * STAGE_B;
constexpr int MAXR = FM_DECODE_MAX_SLOTS;
static_assert(NTHR == FM_DECODE_THREADS, "decode.h's thread count");
static_assert(NW * 16 == FM_DECODE_FC1_COLS && NW * MT * 16 == FM_DECODE_FC2_COLS, "decode.h's blocks");
static_assert(TOK * KC / 8 == NTHR, "one 16-byte X segment a thread a stage");
static_assert(MAXR <= NTHR, "one routed slot a thread");
static_assert(STAGE_B % 16 == 0, "16-byte cp.async destinations");

#ifdef FM_DECODE_TL
/* A probe build's phase timeline (-DFM_DECODE_DEFS="FM_DECODE_TL=1"; bench_layer --decode
 * prints it, fm_decode_timeline reads it): thread 0 of each CTA writes %globaltimer (ns) at
 * its entry, after the routing, after its FC1 units, after its FC2 units (finalize included),
 * at its exit, the ns it spent in FC2's flag waits, its SM, and its unit counts (FC1 | FC2 <<
 * 16); every launch overwrites the record. Never in a shipped build. */
#define FM_DECODE_TL_CAP 2048
__device__ unsigned long long fm_decode_tl[FM_DECODE_TL_CAP][8];
__device__ __forceinline__ unsigned long long tl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define FM_TL(slot, v)                                                                                            \
    do {                                                                                                          \
        if (threadIdx.x == 0 && blockIdx.x < FM_DECODE_TL_CAP) fm_decode_tl[blockIdx.x][slot] = (v);              \
    } while (0)
#define FM_TL_NOW(slot) FM_TL(slot, tl_now())
#else
#define FM_TL(slot, v) ((void)0)
#define FM_TL_NOW(slot) ((void)0)
#endif

/* The routing of the run, the same in every CTA. Rows are indexed by their place in the
 * expert-sorted order (short: R <= 128). */
struct route_tab {
    int   le[MAXR];    /* local expert of slot s, -1: not this shard's (or a bad id, or -1) */
    float rw[MAXR];    /* row p's routing weight */
    int   act_e[MAXR]; /* the a-th expert with rows, ascending */
    short tslot[MAXR]; /* slot s -> row p, -1 */
    short perm[MAXR];  /* row p -> slot s */
    short act_off[MAXR], act_cnt[MAXR]; /* first row and rows of the a-th expert */
    short off_s[MAXR], cnt_s[MAXR];     /* per slot: its expert's first row and rows (for the list) */
    int   nact, npass; /* experts with rows; their 8-row passes summed */
};

/* Counters and partials in the decode buffer (offsets of ints; partials in bytes). The
 * counters sit where every run finds them: laid out for the most slots a launch takes
 * (MAXR), never for this run's R, because the partials of a run with few slots start where
 * a larger run's counters would lie, and a counter must find 0 there at the next launch
 * (the rest state). The partials, written before they are read within a launch, follow at
 * offsets of this run's R and splits; the host sizes the buffer for its largest bucket. */
struct buf_layout {
    size_t c1, c2, ready, fin, fin_all, part1, part2, bytes;
    size_t work; /* [0] the next unit to take, [1] the CTAs past their last unit (fm_decode_params.dynamic) */
    int    nb1, nb2;
};
__host__ __device__ inline buf_layout layout_of(int R, int n_local, int n1, int n2, int ks1, int ks2)
{
    buf_layout l;
    const int A = MAXR < n_local ? MAXR : n_local; /* experts with rows, at most */
    l.nb1 = (n1 / 32 + NW - 1) / NW;               /* gate bands / bands a block */
    l.nb2 = (n2 / 16 + NW * MT - 1) / (NW * MT);
    /* (expert, row pass) indices: off / 8 + a + pass < R / 8 + A (gemm_mma.cuh's split index) */
    const size_t npair = (size_t)MAXR / TOK + A + 1;
    size_t       at = 0;
    l.c1 = at, at += npair * l.nb1;
    l.c2 = at, at += npair * l.nb2;
    l.ready = at, at += (size_t)A * l.nb1;
    l.fin = at, at += l.nb2;
    l.fin_all = at, at += 1;
    l.work = at, at += 2;
    size_t b = (at * 4 + 255) / 256 * 256;
    l.part1 = b, b += ks1 > 1 ? (size_t)ks1 * R * n1 * 4 : 0;
    b = (b + 255) / 256 * 256;
    l.part2 = b, b += ks2 > 1 ? (size_t)ks2 * R * n2 * 4 : 0;
    l.bytes = (b + 255) / 256 * 256;
    return l;
}

__device__ __forceinline__ int ld_acquire(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(int *p, int v)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* Phase 1: the routing tables (every thread), the error word (CTA 0). Ends with a barrier. */
__device__ void route(const fm_decode_params &p, route_tab &rt)
{
    const int R = p.T * p.top_k, s = threadIdx.x;
    if (s == 0) rt.npass = 0;
    int e = -1;
    if (s < R) {
        const int g = p.ids[s];
        e = g - p.first >= 0 && g - p.first < p.n_local ? g - p.first : -1;
        rt.le[s] = e;
        if (blockIdx.x == 0 && p.err) { /* permute.cu's bookkeeping, once per launch */
            if (e >= 0 && !isfinite(p.weights[s])) atomicAdd(&p.err->nonfinite_w, 1ull);
            else if (e < 0 && (g < -1 || g >= p.n_global)) {
                atomicAdd(&p.err->bad_ids, 1ull);
                atomicMin(&p.err->first_bad_slot, (unsigned long long)s);
            }
        }
    }
    if (s == 0 && blockIdx.x == 0 && p.err && p.bad_logit && *p.bad_logit != ~0ull)
        atomicMin(&p.err->bad_logit, *p.bad_logit);
    __syncthreads();
    int first = 0;
    if (e >= 0) {
        int before = 0, same = 0, same_before = 0; /* the stable counting sort, one slot a thread */
        for (int q = 0; q < R; q++) {
            const int f = rt.le[q];
            before += f >= 0 && f < e;
            same += f == e;
            same_before += f == e && q < s;
        }
        const int row = before + same_before;
        rt.tslot[s] = (short)row;
        rt.perm[row] = (short)s;
        rt.rw[row] = p.weights[s];
        first = same_before == 0;
        rt.off_s[s] = (short)before, rt.cnt_s[s] = (short)same;
        if (first) atomicAdd(&rt.npass, (same + TOK - 1) / TOK); /* integers: any order, one sum */
    } else if (s < R) {
        rt.tslot[s] = -1;
    }
    const int nact = __syncthreads_count(first); /* le, off_s, cnt_s visible */
    if (first) {
        int a = 0; /* experts with rows below e */
        for (int q = 0; q < R; q++) {
            const int f = rt.le[q];
            a += f >= 0 && f < e && rt.cnt_s[q] > 0 && rt.tslot[q] == rt.off_s[q];
        }
        rt.act_e[a] = e, rt.act_off[a] = rt.off_s[s], rt.act_cnt[a] = rt.cnt_s[s];
    }
    if (s == 0) rt.nact = nact;
    __syncthreads();
}

/* One 8-row pass of one unit: acc = X[rows] . W_e[bands]^T over K stages [kbeg, kbeg + nks).
 * FC2: the X rows are h rows, and stage ks is loaded only once the FC1 blocks under its
 * columns have counted `need` passes in ready[]. The compute is gemm_mma.cuh's (the same
 * fragments, dequantization and mma order), so the sums are that kernel's bit for bit. */
template <bool FC2>
__device__ __forceinline__ void gemm_pass(const fm_decode_params &p, const route_tab &rt, unsigned char *smem, int e,
                                          const int (&band)[MT], const bool (&valid)[MT], int rbase, int rows,
                                          int kbeg, int nks, const int *ready, int need, int nb1,
                                          float (&acc)[MT][4], unsigned long long *tl_wait = nullptr)
{
    (void)tl_wait; /* the probe build's FC2 wait time (FM_DECODE_TL) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int nbands = FC2 ? p.n2 / 16 : p.n1 / 16, K = FC2 ? p.k2 : p.k1, KB = (FC2 ? p.kp2 : p.kp1) / 64;
    const uint4         *wd = (const uint4 *)(FC2 ? p.w2data : p.w1data);
    const unsigned char *wsc = (const unsigned char *)(FC2 ? p.w2scale : p.w1scale);
    const uint4         *wsrc[MT];
    const unsigned char *ssrc[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const size_t b = valid[i] ? (size_t)band[i] : 0;
        wsrc[i] = wd + ((size_t)e * nbands + b) * KB * 32 + lane;
        ssrc[i] = wsc + ((size_t)e * nbands + b) * KB * 64 + (lane & 3) * 16;
    }
    /* this thread's X segment: row r, columns c8..c8+7 of every stage */
    const int       r = tid / (KC / 8), c8 = (tid % (KC / 8)) * 8;
    const bool      rin = r < rows;
    const uint16_t *xbase = FC2 ? p.h : p.x;
    const uint16_t *xsrc = xbase;
    if (rin) xsrc = FC2 ? p.h + (size_t)(rbase + r) * p.k2 + c8
                        : p.x + (size_t)(rt.perm[rbase + r] / p.top_k) * p.k1 + c8;
    auto load_stage = [&](int ls) {
        const int      ks = kbeg + ls;
        unsigned char *buf = smem + (ls % ST) * STAGE_B;
#pragma unroll
        for (int c = 0; c < CPS; c++) {
            const int  kb = ks * CPS + c;
            const bool kin = kb < KB; /* zeros past kp */
            const int  kbc = kin ? kb : 0;
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const bool ok = valid[i] && kin;
                const int  slot = (warp * MT + i) * CPS + c;
                cp_async16(buf + W_OFF + slot * 512 + lane * 16, wsrc[i] + kbc * 32, ok ? 16 : 0);
                if (lane < 4) cp_async16(buf + S_OFF + slot * 64 + lane * 16, ssrc[i] + kbc * 64, ok ? 16 : 0);
            }
        }
        if (FC2) { /* the h columns of this stage: FC1 blocks [ks*KC/64, (ks+1)*KC/64) of this expert */
            if (tid == 0) {
#ifdef FM_DECODE_TL
                const unsigned long long w0 = tl_now();
#endif
                const int f0 = ks * KC / FM_DECODE_FC1_COLS, f1 = min((ks + 1) * KC / FM_DECODE_FC1_COLS, nb1);
                for (int f = f0; f < f1; f++)
                    while (ld_acquire(ready + f) < need) {
                    }
#ifdef FM_DECODE_TL
                if (tl_wait) *tl_wait += tl_now() - w0;
#endif
            }
            __syncthreads();
        }
        const int  k = ks * KC + c8;
        const bool ok = rin && k < K; /* rows past the count and columns past K: zeros */
        cp_async16(buf + r * ROWB + c8 * 2, ok ? xsrc + ks * KC : xbase, ok ? 16 : 0);
    };
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[i][q] = 0.0f;
    const bool wv = valid[0] || valid[1];
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nks) load_stage(s);
        cp_async_commit();
    }
    for (int ks = 0; ks < nks; ks++) {
        cp_async_wait<ST - 2>();
        __syncthreads(); /* stage ks visible to all; stage ks-1 free for reuse */
        if (ks + ST - 1 < nks) load_stage(ks + ST - 1);
        cp_async_commit();
        const unsigned char *buf = smem + (ks % ST) * STAGE_B;
        if (!wv) continue;
#pragma unroll
        for (int c = 0; c < CPS; c++) {
            const uint4 *src = (const uint4 *)(buf + g * ROWB + (c * 64 + 16 * t) * 2);
            const uint4  xb[2] = {src[0], src[1]};
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int      slot = (warp * MT + i) * CPS + c;
                const uint4    wq = *(const uint4 *)(buf + W_OFF + slot * 512 + lane * 16);
                const uint32_t sc = *(const uint16_t *)(buf + S_OFF + slot * 64 + lane * 2);
                const uint32_t s_lo = (sc & 0xFFu) * p.sc_mul + p.sc_add, s_hi = (sc >> 8) * p.sc_mul + p.sc_add;
                const uint32_t w4[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    uint32_t a[4];
                    dequant_step(w4[s], s_lo, s_hi, a);
                    const uint4 &q = xb[s >> 1];
                    mma_bf16(acc[i], a, (s & 1) ? q.z : q.x, (s & 1) ? q.w : q.y);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the next pass overwrites the stages */
}

/* Split K (gemm_mma.cuh split_fixup, one 8-token group): this CTA's partials out, counted
 * in; the last of the ks CTAs sums every split's partials in split order into acc, resets
 * the counter and returns true. Every thread calls it (barriers inside). */
__device__ __forceinline__ bool split_sum(float *part, int *cnt, int ks, int n, int R, float (&acc)[MT][4],
                                          const int (&band)[MT], const bool (&valid)[MT], int rbase, int rows,
                                          int split)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int tok = 2 * t + (q & 1);
            if (valid[i] && tok < rows)
                part[((size_t)split * R + rbase + tok) * n + band[i] * 16 + g + 8 * (q >> 1)] = acc[i][q];
        }
    __threadfence();
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == ks - 1;
    if (!__syncthreads_or(last)) return false;
    __threadfence();
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int tok = 2 * t + (q & 1);
            if (!valid[i] || tok >= rows) continue;
            const float *src = part + ((size_t)rbase + tok) * n + band[i] * 16 + g + 8 * (q >> 1);
            float        v = 0.0f;
            for (int s = 0; s < ks; s++) v += __ldcg(src + (size_t)s * R * n);
            acc[i][q] = v;
        }
    if (threadIdx.x == 0) *cnt = 0; /* rest state for the next launch */
    return true;
}

/* out for output block ob: init (or 0) + each token's weighted rows in slot order
 * (finalize_reduce_kernel's order). Four tokens at a time, a float4 a thread. */
__device__ void reduce_block(const fm_decode_params &p, const route_tab &rt, int ob)
{
    const int c = ob * FM_DECODE_FC2_COLS + (threadIdx.x & 31) * 4;
    if (c >= p.n2) return;
    for (int tk = threadIdx.x >> 5; tk < p.T; tk += NTHR / 32) {
        float4 acc = p.init ? *(const float4 *)(p.init + (size_t)tk * p.n2 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < p.top_k; j++) {
            const int r = rt.tslot[tk * p.top_k + j];
            if (r < 0) continue;
            const float4 v = __ldcg((const float4 *)(p.scratch + (size_t)r * p.n2 + c));
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        if (p.out_bf16) {
            uint2 o;
            o.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.x)) |
                  ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.y)) << 16);
            o.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.z)) |
                  ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(acc.w)) << 16);
            *(uint2 *)(p.out_bf16 + (size_t)tk * p.n2 + c) = o;
        } else {
            *(float4 *)(p.out + (size_t)tk * p.n2 + c) = acc;
        }
    }
}

/* The L2 prefetch of FC2 unit u's weights and scales (its bands x its K stages). */
__device__ void prefetch_fc2(const fm_decode_params &p, const route_tab &rt, int u, int nb2)
{
    const int a = u / (nb2 * p.ks2), rem = u % (nb2 * p.ks2), ob = rem / p.ks2, split = rem % p.ks2;
    const int e = rt.act_e[a], nbands = p.n2 / 16, KB = p.kp2 / 64, nks_all = (p.kp2 + KC - 1) / KC;
    const int kb0 = split * nks_all / p.ks2 * CPS, kb1 = min((split + 1) * nks_all / p.ks2 * CPS, KB);
    if (kb1 <= kb0) return;
    const int lines = (kb1 - kb0) * 4 + ((kb1 - kb0) * 64 + 127) / 128; /* 128-byte lines a band */
    for (int i = threadIdx.x; i < NW * MT * lines; i += NTHR) {
        const int b = ob * NW * MT + i / lines, l = i % lines;
        if (b >= nbands) break;
        const size_t base = ((size_t)e * nbands + b) * KB + kb0;
        if (l < (kb1 - kb0) * 4) prefetch_l2((const unsigned char *)p.w2data + base * 512 + (size_t)l * 128);
        else prefetch_l2((const unsigned char *)p.w2scale + base * 64 + (size_t)(l - (kb1 - kb0) * 4) * 128);
    }
}

/* gpt-oss's h of one gate/up pair (the twin kernel's FC1 epilogue): kernel_common.cuh's
 * swiglu_out as the chain computes it in mma_w4m2n1k128s4's register epilogue, every rounding
 * spelled out (__fmul_rn, __fadd_rn, __fdiv_rn: never contracted, whatever the code around
 * them), each the instruction the chain's machine code has (its PTX and SASS for sm_80, sm_90a,
 * sm_100f and sm_120f, nvcc 13.0): gate = acc_g x osc, up = acc_u x oscu (FMUL); the bias added
 * after (FADD: the chain's product is outside the bias branch, so never fused into an FFMA);
 * then plain silu(g) x u (the same expression as epilogue()'s), or the clamps as comparisons (a
 * NaN stays NaN) and (u' + 1) x (g' / (1 + __expf(-1.702 g'))): __expf is ex2.approx of x x
 * log2(e), the division IEEE (div.rn). e: the local expert (its bias row: gate columns, the
 * up ones n1 / 2 further), col: the gate column, ag / au: the gate / up accumulators. */
__device__ __forceinline__ float oss_h(const fm_decode_params &p, int e, int col, float ag, float osc, float au,
                                       float oscu)
{
    const float *b13 = p.b1 ? p.b1 + (size_t)e * p.n1 : nullptr;
    float        gv = __fmul_rn(ag, osc), uv = __fmul_rn(au, oscu);
    if (b13) {
        gv = __fadd_rn(gv, __ldg(b13 + col));
        uv = __fadd_rn(uv, __ldg(b13 + p.n1 / 2 + col));
    }
    if (p.act != FM_ACT_SWIGLU_GPTOSS) return __fmul_rn(silu(gv), uv);
    const float L = p.act_limit;
    gv = gv > L ? L : gv;
    uv = uv > L ? L : uv < -L ? -L : uv;
    return __fmul_rn(__fadd_rn(uv, 1.0f), __fdiv_rn(gv, __fadd_rn(1.0f, __expf(__fmul_rn(-1.702f, gv)))));
}

/* FINALIZE_DET's weighted row element (the twin kernel's FC2 epilogue): kernel_common.cuh's
 * finalize_out as the chain's machine code has it: with expert e's FC2 bias (acc x osc +
 * b2[col]) x w, one FFMA (fma.rn in its PTX) then the FMUL by the row's routing weight w;
 * without one acc x rw, rw = w x osc (the plain kernel's product, the caller's). */
__device__ __forceinline__ float oss_fc2(const fm_decode_params &p, int e, int col, float acc, float osc, float w,
                                         float rw)
{
    if (!p.b2) return acc * rw;
    return __fmul_rn(__fmaf_rn(acc, osc, __ldg(p.b2 + (size_t)e * p.n2 + col)), w);
}

} // namespace
#endif
