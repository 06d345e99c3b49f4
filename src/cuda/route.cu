/* route.cu - routing on the device for the cuda backend: router logits and top-k
 * routing (the stable permutation is permute.cu's; the gather and the shared expert
 * are in moe_kernels.cu). Everything runs on the device so that a forward needs no host
 * round trip between the logits and the GEMMs (graph-capturable). It reproduces
 * the CPU code operation for operation (docs/cuda-routing.md):
 *   logits  one warp per (token, expert); lane j multiplies element k0+j and
 *           the 8 partial sums of fm_moe_router_logits (chain c takes k = c,
 *           c+8, c+16, ... in ascending order) are accumulated by shuffles,
 *           then folded in the CPU's tree. __fmul_rn/__fadd_rn forbid FMA
 *           contraction, so every rounding is the CPU's: bit-identical. The
 *           staged, tiled and oneshot kernels keep the same chains elsewhere
 *           (one chain a thread), folded by the same shuffles (fold_parts8).
 *   route   one warp per token; per-token scratch in global memory (score,
 *           biased score, keep flags, group scores): any E, no shared-memory
 *           limit. Arg-max = lane scans + a butterfly on (value desc, index
 *           asc), a total order, so ties go to the lowest index as on the CPU.
 *           Sequential FP32 sums (softmax denominator, top-k weight sum) are
 *           kept sequential: every lane adds the 32 values of a chunk in order,
 *           broadcast by shuffles.
 */
#include <atomic>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/kernel_common.cuh"
#include "cuda/moe_kernels.h"

namespace {

#define FM_FULL 0xffffffffu

/* ---- router logits ---------------------------------------------------------- */

/* The CPU's fold ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) of the 8 chains of a logit held by 8
 * neighbouring lanes (lane & 7 = chain), the result on the group's chain-0 lane (FP32
 * addition commutes). Every lane of the warp must call it. */
__device__ __forceinline__ float fold_parts8(float part)
{
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 1));
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 2));
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 4));
    return part;
}

/* logits[t][e], one warp each. Chain c = lane & 7 is the CPU's part[c]: it adds
 * x[k]*w[k] for k = c, c+8, c+16, ... in ascending k (lanes c, c+8, c+16, c+24
 * of each 32-wide step hold them); lanes 8-31 repeat chains 0-7 so that every
 * lane takes part in the shuffles. */
template <int U>
__global__ void router_logits_kernel(const uint16_t *x, const float *rw, int T, int E, int H, float *logits)
{
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int       lane = threadIdx.x & 31, c = lane & 7;
    if (warp >= (long long)T * E) return; /* whole warps leave together */
    const int       t = (int)(warp / E), e = (int)(warp % E);
    const uint16_t *xr = x + (size_t)t * H;
    const float    *wr = rw + (size_t)e * H;
    float           part = 0.0f; /* the CPU's part[c] = {0} */
    /* U groups of 32 products loaded before any is summed: U loads of x and w in flight
     * per lane (one warp per logit has nothing else to hide the latency with: at decode
     * T x E warps are a few per SM); the sums stay in the CPU's order, k ascending. U = 16:
     * 12 dependent round trips at H = 6,144; U = 48: 4 (FM_ROUTER_WARP48, not yet measured) */
    for (int k0 = 0; k0 < H; k0 += 32 * U) {
        float p[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + 32 * u + lane;
            p[u] = k < H ? __fmul_rn(__uint_as_float((uint32_t)xr[k] << 16), wr[k]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const float q = __shfl_sync(FM_FULL, p[u], c + 8 * m);
                if (k0 + 32 * u + c + 8 * m < H) part = __fadd_rn(part, q);
            }
    }
    part = fold_parts8(part); /* ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) on lane 0 */
    if (lane == 0) logits[(size_t)t * E + e] = part;
}

/* logits of a tile of RT_T tokens x RT_E experts per CTA, for larger T. The warp kernel
 * reads a token's x row and an expert's router row per logit: T x E x 36 KB from L2 at
 * GLM-5's 6,144, 9.6 GB at T = 1,024, where internal routing cost ~1.36 ms more than
 * external on the H200 (2026-12-03). This one stages RT_K-wide slices of x and of the
 * router in shared memory once per tile. Same roundings as the CPU: thread (c = tid & 7,
 * g = tid >> 3) keeps chain c (the CPU's part[c]) of 2 tokens x 8 experts, adding
 * k = c, c+8, ... in ascending k; the 8 chains of a logit sit in 8 neighbouring lanes
 * and are folded in the CPU's tree by shuffles (FP32 addition commutes). Within a warp
 * the 4 groups share their tokens (x: broadcasts) and differ in experts (w rows padded
 * to RT_K + 1 floats: 32 distinct banks). The next slice is loaded into registers while
 * this one is summed. */
#define RT_T 16
#define RT_E 32
#define RT_K 64
__global__ void __launch_bounds__(256)
    router_logits_tiled_kernel(const uint16_t *x, const float *rw, int T, int E, int H, float *logits)
{
    __shared__ float xs[RT_T][RT_K];
    __shared__ float ws[RT_E][RT_K + 1];
    const int tid = threadIdx.x, c = tid & 7, g = tid >> 3, eg = g & 3, tp = g >> 2;
    const int t0 = blockIdx.x * RT_T, e0 = blockIdx.y * RT_E;
    /* loaders: w 32 rows x 64 = 8 floats a thread; x 16 rows x 64 = 4 BF16 a thread */
    const int wrow = tid >> 3, wcol = (tid & 7) * 8, xrow = tid >> 4, xcol = (tid & 15) * 4;
    const bool wok = e0 + wrow < E, xok = t0 + xrow < T;
    const float    *wsrc = rw + (size_t)(wok ? e0 + wrow : 0) * H;
    const uint16_t *xsrc = x + (size_t)(xok ? t0 + xrow : 0) * H;
    float    wr[8];
    uint16_t xr[4];
    float    acc[2][8];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[a][i] = 0.0f; /* the CPU's part[c] = {0} */
#define RT_LOAD(k0)                                                                      \
    do {                                                                                 \
        _Pragma("unroll") for (int i = 0; i < 8; i++) {                                  \
            const int k = (k0) + wcol + i;                                               \
            wr[i] = wok && k < H ? wsrc[k] : 0.0f;                                       \
        }                                                                                \
        _Pragma("unroll") for (int i = 0; i < 4; i++) {                                  \
            const int k = (k0) + xcol + i;                                               \
            xr[i] = xok && k < H ? xsrc[k] : (uint16_t)0;                                \
        }                                                                                \
    } while (0)
    RT_LOAD(0);
    for (int k0 = 0; k0 < H; k0 += RT_K) {
#pragma unroll
        for (int i = 0; i < 8; i++) ws[wrow][wcol + i] = wr[i];
#pragma unroll
        for (int i = 0; i < 4; i++) xs[xrow][xcol + i] = __uint_as_float((uint32_t)xr[i] << 16);
        __syncthreads();
        if (k0 + RT_K < H) RT_LOAD(k0 + RT_K); /* in flight while this slice is summed */
#pragma unroll
        for (int j = 0; j < RT_K / 8; j++) {
            const int kk = c + 8 * j;
            if (k0 + kk < H) {
                const float x0 = xs[2 * tp][kk], x1 = xs[2 * tp + 1][kk];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float w = ws[eg * 8 + i][kk];
                    acc[0][i] = __fadd_rn(acc[0][i], __fmul_rn(x0, w));
                    acc[1][i] = __fadd_rn(acc[1][i], __fmul_rn(x1, w));
                }
            }
        }
        __syncthreads();
    }
#undef RT_LOAD
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[a][i] = fold_parts8(acc[a][i]); /* ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) */
    /* lane c of the group writes expert eg*8 + c of both tokens (static register indices) */
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i == c) {
            const int e = e0 + eg * 8 + i;
#pragma unroll
            for (int a = 0; a < 2; a++) {
                const int t = t0 + 2 * tp + a;
                if (t < T && e < E) logits[(size_t)t * E + e] = acc[a][i];
            }
        }
}

/* logits of RS_T tokens x RS_E experts per CTA of 64 threads, for small T (the
 * warp kernels keep one warp per logit busy on its own loads: at T = 1 the H200 ran
 * them at 23-33 us for 6.3 MB of router weights, 2026-12-03; the tiled kernel has
 * only E / 32 CTAs there). Thread (g = tid >> 3, c = tid & 7) keeps chain c of the
 * CPU's part[] for token g / RS_E and expert g % RS_E: one chain a thread, so that
 * E / RS_E x T / RS_T CTAs of few threads spread over every SM at T = 1. Slices of KS
 * of the x and router rows are copied global -> shared by cp.async (16-byte copies),
 * STAGES buffers deep: slices s + 1 .. s + STAGES - 1 load while s is awaited and summed. Rows
 * padded by 8 elements (KS % 32 == 0: the 2 experts / 2 tokens a warp reads sit in
 * different banks). Needs H % 8 == 0 and 16-byte aligned x and rw (the launcher falls
 * back to the warp kernel otherwise). Same roundings as the CPU: bit-identical.
 * <2, 1024> (FM_ROUTER_STAGED, the layer's pick): 17.1-17.5 us at T = 1 on the H200.
 * <4, 736> (4 slices in flight, 46.5 KB of static shared memory) was 1.2-1.5x slower at
 * every T (bench/RESULTS.md, 2026-12-03 fourth session): fewer CTAs per SM. */
#define RS_T 4
#define RS_E 2
template <int STAGES, int KS>
__global__ void __launch_bounds__(64)
    router_logits_staged_kernel(const uint16_t *x, const float *rw, int T, int E, int H, float *logits)
{
    static_assert(KS % 32 == 0 && STAGES >= 2, "slices: a multiple of 32, two buffers at least");
    __shared__ __align__(16) float    ws[STAGES][RS_E][KS + 8];
    __shared__ __align__(16) uint16_t xs[STAGES][RS_T][KS + 8];
    const int tid = threadIdx.x, c = tid & 7, g = tid >> 3, tl = g / RS_E, el = g % RS_E;
    const int t0 = blockIdx.y * RS_T, e0 = blockIdx.x * RS_E;
    const int S = (H + KS - 1) / KS;
    /* slice s into buffer s % STAGES, one commit group (empty past the last slice, so that
     * group i is slice i and wait_group<STAGES - 1> below means slice s has landed) */
    auto issue = [&](int s) {
        if (s < S) {
            const int k0 = s * KS, n = H - k0 < KS ? H - k0 : KS, b = s % STAGES;
            for (int i = tid; i < RS_E * (n / 4); i += 64) {
                const int  r = i / (n / 4), q = i % (n / 4);
                const bool ok = e0 + r < E;
                fm_kc::cp_async16(&ws[b][r][4 * q], rw + (size_t)(ok ? e0 + r : 0) * H + k0 + 4 * q, ok ? 16 : 0);
            }
            for (int i = tid; i < RS_T * (n / 8); i += 64) {
                const int  r = i / (n / 8), q = i % (n / 8);
                const bool ok = t0 + r < T;
                fm_kc::cp_async16(&xs[b][r][8 * q], x + (size_t)(ok ? t0 + r : 0) * H + k0 + 8 * q, ok ? 16 : 0);
            }
        }
        fm_kc::cp_async_commit();
    };
    float part = 0.0f; /* the CPU's part[c] = {0} */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) issue(s);
    for (int s = 0; s < S; s++) {
        issue(s + STAGES - 1);              /* into the buffer of slice s - 1, free since the last sync */
        fm_kc::cp_async_wait<STAGES - 1>(); /* slice s has landed; STAGES - 1 later ones in flight */
        __syncthreads();
        const int       n = H - s * KS < KS ? H - s * KS : KS, b = s % STAGES;
        const float    *wr = ws[b][el];
        const uint16_t *xr = xs[b][tl];
#pragma unroll 8
        for (int k = c; k < n; k += 8) /* k ascending within the chain, slice after slice */
            part = __fadd_rn(part, __fmul_rn(__uint_as_float((uint32_t)xr[k] << 16), wr[k]));
        __syncthreads(); /* buffer b is refilled by the next iteration's issue */
    }
    fm_kc::cp_async_wait<0>(); /* the empty groups: nothing in flight at exit */
    part = fold_parts8(part); /* the 8 chains of a logit are 8 neighbouring lanes */
    const int t = t0 + tl, e = e0 + el;
    if (c == 0 && t < T && e < E) logits[(size_t)t * E + e] = part;
}

/* logits of OS_T tokens x OS_E experts per CTA of 256 threads with every load of the CTA
 * issued at once (FM_ROUTER_ONESHOT, for decode: T <= 4 is one CTA row). The staged kernel
 * waits on H / 1,024 slices in series (6 at GLM-5's 6,144: 17.5 us at T = 1 against a
 * 1.5 us floor); here the CTA's two router rows (2 x 24 KB at 6,144) go global -> shared by
 * cp.async (16-byte copies, all threads), its tokens' x rows global -> registers (16-byte
 * loads, all issued before any is stored) -> shared as FP32, transposed to [chain][j]
 * (k = 8j + chain), then one wait (NG = 1), or NG commit groups of consecutive k ranges
 * awaited in order so that range g is summed while the later ones land (NG = 4,
 * FM_ROUTER_ONESHOT4). Summing: thread (g = tid >> 3 < 8, c = tid & 7) keeps the CPU's
 * part[c] of token g / OS_E and expert g % OS_E, adding x[k] * w[k] for k = c, c+8, ...
 * in ascending k (__fmul_rn then __fadd_rn: the CPU's roundings), reading 16 k's ahead of
 * the add chain (one float4 of x per 4 adds, w as scalars: 2.25 instructions per add
 * under the 4-cycle FADD latency); then fold_parts8. Bit-identical to the CPU.
 * Shared memory (dynamic, sized from H and min(T, OS_T) at launch): w rows of
 * WP = H rounded to 32 + 8 floats (the two experts of a warp in different banks), x
 * chains of S = H / 8 rounded to 4 (+ 4 if S / 4 is even: the 8 chains of a token in
 * different banks for the float4 reads) floats: (2 WP + 8 S tokens) x 4 B = 49.2 KB + 24.7 KB
 * a token at 6,144 (148 KB at 4 tokens). Needs H % 8 == 0, 16-byte aligned x and rw (the
 * launcher falls back as for the staged kernel) and the device's opt-in shared memory (else
 * the staged kernel). Measured (bench_route, H100 2026-12-07): 11.3 / 11.5 / 12.3 us at T = 1 / 2
 * / 4 against the staged kernel's 16.7 / 16.2 / 17.1; AUTO's pick up to FM_ROUTER_ONESHOT_MAX_T
 * tokens (13.1 against 17.8 us at T = 1 in one call, 2026-12-07 15:04 UTC). */
#define OS_T 4
#define OS_E 2
#define OS_THREADS 256
#define OS_B 16 /* j (adds of a chain) per block: the next block is read while one is summed */
#define OS_XQ 3 /* x chunks (8 BF16) per thread and token per batch: 768 chunks at 6,144 = one batch */

__host__ __device__ __forceinline__ int os_wp(int H) { return (H + 31) / 32 * 32 + 8; }
__host__ __device__ __forceinline__ int os_s(int H)
{
    const int s = (H / 8 + 3) / 4 * 4;
    return (s / 4) % 2 ? s : s + 4;
}

__device__ __forceinline__ void cp_async_wait_upto(int n) /* n constant after unrolling */
{
    switch (n) {
    case 0: fm_kc::cp_async_wait<0>(); break;
    case 1: fm_kc::cp_async_wait<1>(); break;
    case 2: fm_kc::cp_async_wait<2>(); break;
    default: fm_kc::cp_async_wait<3>(); break;
    }
}

/* one block of a chain, j = j0 .. j0 + OS_B - 1: x[j] (xq = &x[j0], 16-byte aligned) and
 * w[8j] (wq = &w[8 j0]): 4 float4 and OS_B scalar reads at immediate offsets */
struct os_raw {
    float4 x[OS_B / 4];
    float  w[OS_B];
};
__device__ __forceinline__ void os_load(const float *xq, const float *wq, os_raw &r)
{
#pragma unroll
    for (int i = 0; i < OS_B / 4; i++) r.x[i] = *(const float4 *)(xq + 4 * i);
#pragma unroll
    for (int i = 0; i < OS_B; i++) r.w[i] = wq[8 * i];
}
/* the block's products, each rounded (__fmul_rn: never fused into the add) */
__device__ __forceinline__ void os_mul(const os_raw &r, float (&pv)[OS_B])
{
#pragma unroll
    for (int i = 0; i < OS_B / 4; i++) {
        pv[4 * i] = __fmul_rn(r.x[i].x, r.w[4 * i]);
        pv[4 * i + 1] = __fmul_rn(r.x[i].y, r.w[4 * i + 1]);
        pv[4 * i + 2] = __fmul_rn(r.x[i].z, r.w[4 * i + 2]);
        pv[4 * i + 3] = __fmul_rn(r.x[i].w, r.w[4 * i + 3]);
    }
}
__device__ __forceinline__ float os_add(float part, const float (&pv)[OS_B])
{
#pragma unroll
    for (int i = 0; i < OS_B; i++) part = __fadd_rn(part, pv[i]); /* j ascending */
    return part;
}

/* part += x[j] * w[8j] for the blocks b0 .. b1 - 1 (b0 < b1) in ascending j: the CPU's
 * part[c] += x * w, product rounded, then the sum. Three stages in flight so that the add
 * chain never waits on shared memory: block b added, block b + 1 multiplied (its reads
 * landed a step ago), block b + 2 read; the product sets ping-pong (no register copies).
 * Nothing past block b1 - 1 is read (the next range may still be in flight). */
__device__ __forceinline__ float os_sum_blocks(float part, const float *xq, const float *wq, int b0, int b1)
{
    float  pa[OS_B], pb[OS_B];
    os_raw r;
    int    n = b1 - b0; /* blocks left, the first one's products in pa, the next one's reads in r */
    xq += OS_B * b0, wq += 8 * OS_B * b0;
    os_load(xq, wq, r);
    os_mul(r, pa);
    if (n >= 2) os_load(xq + OS_B, wq + 8 * OS_B, r);
    for (; n >= 4; n -= 2) {
        xq += 2 * OS_B, wq += 16 * OS_B;
        os_mul(r, pb);       /* block + 1 */
        os_load(xq, wq, r);  /* block + 2 */
        part = os_add(part, pa);
        os_mul(r, pa);       /* block + 2 */
        os_load(xq + OS_B, wq + 8 * OS_B, r); /* block + 3 */
        part = os_add(part, pb);
    }
    if (n == 1) return os_add(part, pa);
    os_mul(r, pb);
    if (n == 2) return os_add(os_add(part, pa), pb);
    os_load(xq + 2 * OS_B, wq + 16 * OS_B, r); /* n == 3 */
    part = os_add(part, pa);
    os_mul(r, pa);
    return os_add(os_add(part, pb), pa);
}

/* The oneshot kernels' body (os_sm: the dynamic shared memory, oneshot_smem bytes) */
template <int NG>
__device__ __forceinline__ void oneshot_logits(const uint16_t *__restrict__ x, const float *__restrict__ rw, int T,
                                               int E, int H, float *__restrict__ logits, float *os_sm)
{
    static_assert(NG >= 1 && NG <= 4, "1 to 4 commit groups (cp_async_wait_upto)");
    const int WP = os_wp(H), S = os_s(H), Hj = H / 8, nb = Hj / OS_B;
    float    *ws = os_sm, *xs = os_sm + OS_E * WP; /* ws[e][k]; xs[t][c][j] = x[t][8j + c] */
    const int tid = threadIdx.x, t0 = blockIdx.y * OS_T, e0 = blockIdx.x * OS_E;
    const int nt = T - t0 < OS_T ? T - t0 : OS_T, ne = E - e0 < OS_E ? E - e0 : OS_E;

    /* 1. the router rows, NG commit groups of k ranges (boundaries at whole blocks) */
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int kb = 8 * OS_B * (nb * g / NG), ke = g == NG - 1 ? H : 8 * OS_B * (nb * (g + 1) / NG);
#pragma unroll
        for (int el = 0; el < OS_E; el++)
            if (el < ne) {
                const float *src = rw + (size_t)(e0 + el) * H;
                float       *dst = ws + el * WP;
                for (int r = kb / 4 + tid; r < ke / 4; r += OS_THREADS) fm_kc::cp_async16(dst + 4 * r, src + 4 * r, 16);
            }
        fm_kc::cp_async_commit();
    }
    /* 2. x: chunk q (k = 8q .. 8q+7) of each token, every load of a batch before its stores;
     * word i holds k = 8q + 2i (low half) and 8q + 2i + 1 (high): BF16 -> FP32 is exact */
    for (int q0 = tid; q0 < Hj; q0 += OS_THREADS * OS_XQ) {
        uint4 v[OS_T][OS_XQ];
#pragma unroll
        for (int tl = 0; tl < OS_T; tl++)
#pragma unroll
            for (int a = 0; a < OS_XQ; a++) {
                const int q = q0 + OS_THREADS * a;
                v[tl][a] = tl < nt && q < Hj ? __ldg((const uint4 *)(x + (size_t)(t0 + tl) * H) + q) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int tl = 0; tl < OS_T; tl++)
#pragma unroll
            for (int a = 0; a < OS_XQ; a++) {
                const int q = q0 + OS_THREADS * a;
                if (tl < nt && q < Hj) {
                    float         *d = xs + (size_t)tl * 8 * S + q;
                    const uint32_t w[4] = {v[tl][a].x, v[tl][a].y, v[tl][a].z, v[tl][a].w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        d[(2 * i) * S] = __uint_as_float(w[i] << 16);
                        d[(2 * i + 1) * S] = __uint_as_float(w[i] & 0xffff0000u);
                    }
                }
            }
    }
    /* 3. the sums: chain c of (token tl, expert el) for tid < 8 OS_T OS_E */
    const int   c = tid & 7, g8 = tid >> 3, el = g8 % OS_E, tl = g8 / OS_E;
    const bool  chain = tl < nt && el < ne;
    const float *xp = chain ? xs + (size_t)(tl * 8 + c) * S : xs, *wp = chain ? ws + el * WP + c : ws;
    float        part = 0.0f; /* the CPU's part[c] = {0} */
#pragma unroll
    for (int g = 0; g < NG; g++) {
        cp_async_wait_upto(NG - 1 - g); /* this thread's copies of range g have landed */
        __syncthreads();                /* everyone's (and, at g = 0, the x stores) */
        if (chain) {
            const int b0 = nb * g / NG, b1 = nb * (g + 1) / NG;
            if (b0 < b1) part = os_sum_blocks(part, xp, wp, b0, b1); /* k = c + 8j, j ascending */
            if (g == NG - 1) /* the last j's (H / 8 not a multiple of OS_B), ascending */
                for (int j = nb * OS_B; j < Hj; j++) part = __fadd_rn(part, __fmul_rn(xp[j], wp[8 * j]));
        }
    }
    part = fold_parts8(part); /* every thread: the 8 chains of a logit are 8 neighbouring lanes */
    if (chain && c == 0) logits[(size_t)(t0 + tl) * E + e0 + el] = part;
}

template <int NG>
__global__ void __launch_bounds__(OS_THREADS, 1) /* one CTA an SM at 4 tokens (148 KB): registers are free */
    router_logits_oneshot_kernel(const uint16_t *__restrict__ x, const float *__restrict__ rw, int T, int E, int H,
                                 float *__restrict__ logits)
{
    extern __shared__ __align__(16) float os_sm[];
    oneshot_logits<NG>(x, rw, T, E, H, logits, os_sm);
}

/* ---- routing ------------------------------------------------------------------ */

typedef struct {
    int   E, K, G, topk_group, softmax, renormalize;
    float routed_scale;
    int   topk_softmax; /* FM_SCORE_SOFTMAX_TOPK (gpt-oss): score = logit + bias, softmax over the chosen k */
} route_cfg;

/* expf correctly rounded: exp in FP64 (<= 1 ulp of a double) rounded once to
 * FP32. The CPU calls libm's expf, which is correctly rounded for almost every
 * input (glibc's: error bound 0.502 ulp); CUDA's expf is only within 2 ulp. */
__device__ __forceinline__ float route_expf(float v) { return __double2float_rn(exp((double)v)); }

/* (av, ai) comes first in a descending arg-max with ties to the lower index;
 * index -1 = nothing. A total order, so a butterfly gives every lane the same
 * winner as the CPU's ascending scan with a strict '>'. */
__device__ __forceinline__ bool arg_before(float av, int ai, float bv, int bi)
{
    if (ai < 0) return false;
    if (bi < 0) return true;
    if (av > bv) return true;
    if (bv > av) return false;
    return ai < bi;
}

__device__ __forceinline__ int warp_argmax(float v, int i)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(FM_FULL, v, o);
        const int   oi = __shfl_xor_sync(FM_FULL, i, o);
        if (arg_before(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
    return i;
}

/* A warp's working set in shared memory (route_kernel's in_smem): [score E][biased E][gscore G]
 * floats, then [keep E][chosen G] bytes, rounded up to 16 bytes */
__host__ __device__ __forceinline__ size_t route_warp_smem(int E, int G)
{
    return (((size_t)(2 * E + G) * sizeof(float) + (size_t)(E + G)) + 15) & ~(size_t)15;
}

/* One token's routing by one warp (route.c's steps and order): lg its E logits, score / keep
 * the warp's working set (route_warp_smem's layout: [score E][biased E][gscore G] floats, then
 * [keep E][chosen G] bytes, in shared or global memory), ids / wts the token's top-k */
__device__ __forceinline__ void route_token(const route_cfg &c, const float *bias, const float *lg, int t,
                                            int32_t *ids, float *wts, float *score, uint8_t *keep,
                                            unsigned long long *bad, int lane)
{
    const int E = c.E, K = c.K, G = c.G;
    float   *biased = score + E, *gscore = biased + E;
    uint8_t *chosen = keep + E;

    for (int e = lane; e < E; e += 32)
        if (!isfinite(lg[e])) atomicMin(bad, (unsigned long long)t * E + e);

    if (c.topk_softmax) { /* the bias is the router's logit bias: it ranks and weighs (route.c) */
        for (int e = lane; e < E; e += 32) {
            score[e] = __fadd_rn(lg[e], bias ? bias[e] : 0.0f);
            if (!isfinite(score[e])) atomicMin(bad, (unsigned long long)t * E + e); /* the CPU's overflow check */
        }
    } else if (c.softmax) {
        float mx = lg[0]; /* the max is order-free (+0/-0 give the same exp) */
        for (int e = lane; e < E; e += 32) mx = lg[e] > mx ? lg[e] : mx;
        for (int o = 16; o; o >>= 1) {
            const float om = __shfl_xor_sync(FM_FULL, mx, o);
            mx = om > mx ? om : mx;
        }
        float sum = 0.0f; /* sequential in e, as the CPU: each lane adds a chunk's 32 values in order */
        for (int base = 0; base < E; base += 32) {
            const int e = base + lane;
            float     v = 0.0f;
            if (e < E) score[e] = v = route_expf(__fsub_rn(lg[e], mx));
            const int n = E - base < 32 ? E - base : 32;
            for (int i = 0; i < n; i++) sum = __fadd_rn(sum, __shfl_sync(FM_FULL, v, i));
        }
        for (int e = lane; e < E; e += 32) score[e] = __fdiv_rn(score[e], sum);
    } else {
        for (int e = lane; e < E; e += 32) score[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, route_expf(-lg[e])));
    }
    for (int e = lane; e < E; e += 32) {
        biased[e] = c.topk_softmax ? score[e] : __fadd_rn(score[e], bias ? bias[e] : 0.0f);
        keep[e] = 1;
    }
    __syncwarp();

    if (G) { /* limit_groups of route.c, one lane per group, same scans */
        const int gs = E / G;
        for (int g = lane; g < G; g += 32) {
            const float *b = biased + (size_t)g * gs;
            int          i1 = 0, i2 = -1;
            for (int i = 1; i < gs; i++)
                if (b[i] > b[i1]) i1 = i;
            for (int i = 0; i < gs; i++)
                if (i != i1 && (i2 < 0 || b[i] > b[i2])) i2 = i;
            gscore[g] = __fadd_rn(b[i1], i2 >= 0 ? b[i2] : 0.0f);
            chosen[g] = 0;
        }
        for (int r = 0; r < c.topk_group; r++) {
            float bv = 0.0f;
            int   bi = -1;
            for (int g = lane; g < G; g += 32)
                if (!chosen[g] && (bi < 0 || gscore[g] > bv)) {
                    bv = gscore[g];
                    bi = g;
                }
            bi = warp_argmax(bv, bi);
            if (bi >= 0 && (bi & 31) == lane) chosen[bi] = 1; /* its owner lane: the only one scanning it */
        }
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            if (!chosen[e / gs]) keep[e] = 0;
    }

    int32_t *id = ids + (size_t)t * K;
    float   *wt = wts + (size_t)t * K, sum = 0.0f;
    for (int j = 0; j < K; j++) {
        float bv = 0.0f;
        int   bi = -1;
        for (int e = lane; e < E; e += 32)
            if (keep[e] && (bi < 0 || biased[e] > bv)) {
                bv = biased[e];
                bi = e;
            }
        bi = warp_argmax(bv, bi);
        if (bi < 0) bi = 0; /* cannot happen for a checked config; stay in bounds anyway */
        if ((bi & 31) == lane) keep[bi] = 0;
        const float s = score[bi]; /* written before the __syncwarp above */
        if (lane == 0) {
            id[j] = bi;
            wt[j] = s;
        }
        sum = __fadd_rn(sum, s); /* in j order on every lane */
    }
    __syncwarp();
    if (c.topk_softmax) { /* wt holds the chosen logits, wt[0] the largest: route.c's loop, on one lane */
        if (lane == 0) {
            const float mx = wt[0];
            float       z = 0.0f;
            for (int j = 0; j < K; j++) {
                const float v = route_expf(__fsub_rn(wt[j], mx));
                wt[j] = v;
                z = __fadd_rn(z, v);
            }
            for (int j = 0; j < K; j++) wt[j] = __fmul_rn(__fdiv_rn(wt[j], z), c.routed_scale); /* z >= 1 */
        }
        return;
    }
    for (int j = lane; j < K; j += 32) {
        float w = wt[j];
        if (c.renormalize && sum > 0.0f) w = __fdiv_rn(w, sum);
        wt[j] = __fmul_rn(w, c.routed_scale);
    }
}

/* One warp per token; lane owns experts lane, lane+32, ... (and groups alike).
 * The working set (score, biased, gscore, keep, chosen) is the warp's slice of dynamic shared
 * memory where in_smem (route_warp_smem per warp: the launcher's choice where it fits), else
 * fs: per token [score E][biased E][gscore G] floats and bs: [keep E][chosen G] in global
 * scratch. The arithmetic and its order are the same either way: only where the lanes' values
 * wait between the steps differs (global scratch: every step's reads a round trip to L2,
 * sequential in the top-k loop). */
__global__ void route_kernel(route_cfg c, const float *bias, const float *logits, int T, int32_t *ids, float *wts,
                             float *fs, uint8_t *bs, unsigned long long *bad, int in_smem)
{
    extern __shared__ __align__(16) unsigned char route_sm[];
    const int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (warp >= T) return;
    const int t = warp, E = c.E, G = c.G;
    float    *score;
    uint8_t  *keep;
    if (in_smem) {
        unsigned char *w = route_sm + (size_t)(threadIdx.x >> 5) * route_warp_smem(E, G);
        score = (float *)w;
        keep = w + (size_t)(2 * E + G) * sizeof(float);
    } else {
        score = fs + (size_t)t * (2 * E + G);
        keep = bs + (size_t)t * (E + G);
    }
    route_token(c, bias, logits + (size_t)t * E, t, ids, wts, score, keep, bad, lane);
}

/* Router logits and routing in one launch for T <= OS_T tokens (fm_moe_route_fused_launch): the
 * oneshot kernel's CTAs (the logits, bit for bit as router_logits_oneshot_kernel<1>), then a
 * ticket: each CTA, its logits stored, fences and takes one; the CTA with the last ticket (all
 * logits stored and visible: every CTA fenced before its ticket) resets the ticket and *bad,
 * reads the logits back through L2 (__ldcg) into shared memory and routes the T tokens, warp w
 * token w, as route_kernel (route_token: the same code). ticket: the layer's word, 0 at rest
 * (every launch leaves it 0), so a layer's fused launches must not overlap on the device, as
 * its decode kernel's buffer. Dynamic shared memory: fused_smem. */
__global__ void __launch_bounds__(OS_THREADS, 1)
    route_fused_kernel(route_cfg c, const float *bias, const uint16_t *__restrict__ x, const float *__restrict__ rw,
                       int T, int H, float *logits, int32_t *ids, float *wts, unsigned long long *bad,
                       unsigned *ticket)
{
    extern __shared__ __align__(16) float os_sm[]; /* no static shared memory: the launcher opts in to the maximum */
    oneshot_logits<1>(x, rw, T, c.E, H, logits, os_sm);
    __threadfence(); /* this CTA's logits before its ticket */
    __syncthreads();
    const int last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(ticket, 1u) == gridDim.x * gridDim.y - 1);
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) {
        *ticket = 0;
        *bad = ~0ull; /* fm_moe_route_launch's memset: no bad logit */
    }
    __syncthreads(); /* the reset before any atomicMin; the logit sums' shared memory free */
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, E = c.E, G = c.G;
    if (w >= T) return;
    unsigned char *base = (unsigned char *)os_sm + (size_t)w * ((size_t)E * sizeof(float) + route_warp_smem(E, G));
    float         *lgs = (float *)base;
    unsigned char *ws = base + (size_t)E * sizeof(float);
    for (int e = lane; e < E; e += 32) lgs[e] = __ldcg(logits + (size_t)w * E + e);
    __syncwarp();
    route_token(c, bias, lgs, w, ids, wts, (float *)ws, ws + (size_t)(2 * E + G) * sizeof(float), bad, lane);
}

} // namespace

extern "C" int fm_moe_router_logits_launch(const uint16_t *x, const float *rw, int T, int E, int H, float *logits,
                                           void *stream)
{
    return fm_moe_router_logits_launch_kind(x, rw, T, E, H, logits, stream, FM_ROUTER_AUTO);
}

/* The oneshot kernel's dynamic shared memory at H for T tokens (0: H too large to size) */
static size_t oneshot_smem(int H, int T)
{
    if (H <= 0 || H > (1 << 24)) return 0;
    const size_t tt = (size_t)(T < OS_T ? T : OS_T);
    return ((size_t)OS_E * (size_t)os_wp(H) + tt * 8 * (size_t)os_s(H)) * sizeof(float);
}

/* Per device: the opt-in shared memory per block (0: not read yet), and whether the oneshot
 * kernels' dynamic shared memory limit was raised to it (per NG). The limit is always set to
 * the device's opt-in maximum, never to one launch's size: host threads that race here make
 * the same calls with the same values (a per-launch size could leave the attribute at a
 * smaller size than the flag says, and every larger launch would then fail). Devices beyond
 * OS_MAX_DEV query and set every time. */
#define OS_MAX_DEV 64
static std::atomic<int> os_optin[OS_MAX_DEV];
static std::atomic<int> os_dyn_set[OS_MAX_DEV][3]; /* oneshot<1>, oneshot<4>, route_fused_kernel */

/* fn's dynamic shared memory limit raised to the device's opt-in maximum, once per device
 * (slot: os_dyn_set's column of fn) */
static cudaError_t oneshot_opt_in(const void *fn, int dev, int optin, int slot)
{
    std::atomic<int> *set = dev >= 0 && dev < OS_MAX_DEV ? &os_dyn_set[dev][slot] : NULL;
    if (set && set->load(std::memory_order_acquire)) return cudaSuccess;
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess && set) set->store(1, std::memory_order_release);
    return err;
}

static int oneshot_fits(size_t smem, int *dev_out, int *optin_out)
{
    int dev = -1, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (dev >= 0 && dev < OS_MAX_DEV && (optin = os_optin[dev].load(std::memory_order_relaxed)) != 0) {
    } else {
        if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        if (dev >= 0 && dev < OS_MAX_DEV) os_optin[dev].store(optin, std::memory_order_relaxed);
    }
    if (dev_out) *dev_out = dev;
    if (optin_out) *optin_out = optin;
    return smem > 0 && smem <= (size_t)optin;
}

extern "C" int fm_moe_router_logits_kind(const uint16_t *x, const float *rw, int T, int E, int H, int kind)
{
    const int staged_ok = H % 8 == 0 && ((uintptr_t)x | (uintptr_t)rw) % 16 == 0 && (T + RS_T - 1) / RS_T <= 65535;
    if (kind == FM_ROUTER_AUTO)
        kind = T >= FM_ROUTER_TILED_MIN_T ? FM_ROUTER_TILED
               : staged_ok && T <= FM_ROUTER_ONESHOT_MAX_T ? FM_ROUTER_ONESHOT
               : staged_ok                ? FM_ROUTER_STAGED
               : T <= FM_ROUTER_WARP48_MAX_T ? FM_ROUTER_WARP48
                                             : FM_ROUTER_WARP16;
    /* the oneshot kernels: the staged kernel's conditions (OS_T = RS_T: the same grid y), then
     * the shared memory (too large H: the staged kernel, which streams H in slices) */
    if ((kind == FM_ROUTER_ONESHOT || kind == FM_ROUTER_ONESHOT4) &&
        (!staged_ok || !oneshot_fits(oneshot_smem(H, T), NULL, NULL)))
        kind = FM_ROUTER_STAGED;
    if (kind == FM_ROUTER_TILED && (E + RT_E - 1) / RT_E > 65535) kind = FM_ROUTER_WARP16; /* grid y limit */
    if (kind == FM_ROUTER_STAGED && !staged_ok) kind = FM_ROUTER_WARP16;
    if (kind < FM_ROUTER_WARP16 || kind > FM_ROUTER_ONESHOT4) kind = FM_ROUTER_WARP16;
    return kind;
}

extern "C" int fm_moe_router_logits_launch_kind(const uint16_t *x, const float *rw, int T, int E, int H,
                                                float *logits, void *stream, int kind)
{
    const long long warps = (long long)T * E;
    if (warps <= 0) return 0;
    kind = fm_moe_router_logits_kind(x, rw, T, E, H, kind);
    if (kind == FM_ROUTER_ONESHOT || kind == FM_ROUTER_ONESHOT4) {
        const size_t smem = oneshot_smem(H, T);
        int          dev = -1, optin = 0;
        if (!oneshot_fits(smem, &dev, &optin))
            return (int)cudaErrorInvalidValue; /* fm_moe_router_logits_kind said it fits */
        const int         v = kind == FM_ROUTER_ONESHOT4;
        const void       *fn = v ? (const void *)router_logits_oneshot_kernel<4> : (const void *)router_logits_oneshot_kernel<1>;
        const cudaError_t err = oneshot_opt_in(fn, dev, optin, v); /* the opt-in maximum: smem <= optin */
        if (err != cudaSuccess) return (int)err;
        dim3 grid((unsigned)((E + OS_E - 1) / OS_E), (unsigned)((T + OS_T - 1) / OS_T));
        if (v)
            router_logits_oneshot_kernel<4><<<grid, OS_THREADS, smem, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
        else
            router_logits_oneshot_kernel<1><<<grid, OS_THREADS, smem, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
        return (int)cudaGetLastError();
    }
    if (kind == FM_ROUTER_TILED) { /* tiles: x and w staged once per tile */
        dim3 grid((unsigned)((T + RT_T - 1) / RT_T), (unsigned)((E + RT_E - 1) / RT_E));
        router_logits_tiled_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
        return (int)cudaGetLastError();
    }
    if (kind == FM_ROUTER_STAGED) {
        dim3 grid((unsigned)((E + RS_E - 1) / RS_E), (unsigned)((T + RS_T - 1) / RS_T));
        router_logits_staged_kernel<2, 1024><<<grid, 64, 0, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
        return (int)cudaGetLastError();
    }
    const unsigned blocks = (unsigned)((warps * 32 + 255) / 256);
    if (kind == FM_ROUTER_WARP48)
        router_logits_kernel<48><<<blocks, 256, 0, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
    else
        router_logits_kernel<16><<<blocks, 256, 0, (cudaStream_t)stream>>>(x, rw, T, E, H, logits);
    return (int)cudaGetLastError();
}

static int route_groups(const fm_moe_config *cfg) { return cfg->n_group > 1 ? cfg->n_group : 0; }

static route_cfg route_cfg_of(const fm_moe_config *cfg)
{
    return route_cfg{cfg->n_experts, cfg->top_k,         route_groups(cfg), cfg->topk_group,
                     cfg->score == FM_SCORE_SOFTMAX, cfg->renormalize, cfg->routed_scale,
                     cfg->score == FM_SCORE_SOFTMAX_TOPK};
}

extern "C" size_t fm_moe_route_scratch_bytes(const fm_moe_config *cfg, int T)
{
    const size_t E = (size_t)cfg->n_experts, G = (size_t)route_groups(cfg), t = T > 0 ? (size_t)T : 0;
    return t * (2 * E + G) * sizeof(float) + t * (E + G);
}

extern "C" int fm_moe_route_launch(const fm_moe_config *cfg, const float *bias, const float *logits, int T,
                                   int32_t *ids, float *weights, void *scratch, unsigned long long *bad, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t  err = cudaMemsetAsync(bad, 0xFF, sizeof *bad, st); /* UINT64_MAX: no bad logit */
    if (err != cudaSuccess || T <= 0) return (int)err;
    const route_cfg c = route_cfg_of(cfg);
    float   *fs = (float *)scratch;
    uint8_t *bs = (uint8_t *)(fs + (size_t)T * (2 * (size_t)c.E + c.G));
    const int warps_per_block = 4;
    /* the warps' working sets in shared memory where 4 fit in the default 48 KB (E <= ~1,300
     * experts at G = 0), else global scratch */
    const size_t smem = (size_t)warps_per_block * route_warp_smem(c.E, c.G);
    const int    in_smem = smem <= 48 * 1024;
    route_kernel<<<(unsigned)((T + warps_per_block - 1) / warps_per_block), 32 * warps_per_block,
                   in_smem ? smem : 0, st>>>(c, bias, logits, T, ids, weights, fs, bs, bad, in_smem);
    return (int)cudaGetLastError();
}

/* route_fused_kernel's dynamic shared memory: the oneshot logits', or T warps' logits and
 * working sets after them, whichever is larger */
static size_t fused_smem(int E, int G, int H, int T)
{
    const size_t os = oneshot_smem(H, T), rt = (size_t)T * ((size_t)E * sizeof(float) + route_warp_smem(E, G));
    return os == 0 ? 0 : os > rt ? os : rt;
}

extern "C" int fm_moe_route_fused_launch(const fm_moe_config *cfg, const float *bias, const uint16_t *x, const float *rw,
                                         int T, float *logits, int32_t *ids, float *weights, unsigned long long *bad,
                                         unsigned *ticket, void *stream)
{
    const int E = cfg->n_experts, H = cfg->hidden, G = route_groups(cfg);
    if (T < 1 || T > OS_T || !ticket || fm_moe_router_logits_kind(x, rw, T, E, H, FM_ROUTER_ONESHOT) != FM_ROUTER_ONESHOT)
        return -1; /* not this kernel's case: the caller launches the two kernels */
    const size_t smem = fused_smem(E, G, H, T);
    int          dev = -1, optin = 0;
    if (!oneshot_fits(smem, &dev, &optin)) return -1;
    if (oneshot_opt_in((const void *)route_fused_kernel, dev, optin, 2) != cudaSuccess) {
        (void)cudaGetLastError(); /* e.g. a device whose opt-in limit the attribute refuses: the two kernels */
        return -1;
    }
    const route_cfg c = route_cfg_of(cfg);
    dim3 grid((unsigned)((E + OS_E - 1) / OS_E), 1u);
    route_fused_kernel<<<grid, OS_THREADS, smem, (cudaStream_t)stream>>>(c, bias, x, rw, T, H, logits, ids, weights, bad,
                                                                          ticket);
    return (int)cudaGetLastError();
}

extern "C" const void *fm_route_generic_kernel(void) { return (const void *)route_kernel; }
