/* route.cu - routing on the device for the cuda backend: router logits and top-k
 * routing (the stable permutation is permute.cu's; the gather and the shared expert
 * are in moe_kernels.cu). Everything runs on the device so that a forward needs no host
 * round trip between the logits and the GEMMs (graph-capturable). It reproduces
 * the CPU code operation for operation (docs/cuda-routing.md):
 *   logits  one warp per (token, expert); lane j multiplies element k0+j and
 *           the 8 partial sums of fm_moe_router_logits (chain c takes k = c,
 *           c+8, c+16, ... in ascending order) are accumulated by shuffles,
 *           then folded in the CPU's tree. __fmul_rn/__fadd_rn forbid FMA
 *           contraction, so every rounding is the CPU's: bit-identical.
 *   route   one warp per token; per-token scratch in global memory (score,
 *           biased score, keep flags, group scores): any E, no shared-memory
 *           limit. Arg-max = lane scans + a butterfly on (value desc, index
 *           asc), a total order, so ties go to the lowest index as on the CPU.
 *           Sequential FP32 sums (softmax denominator, top-k weight sum) are
 *           kept sequential: every lane adds the 32 values of a chunk in order,
 *           broadcast by shuffles.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/kernel_common.cuh"
#include "cuda/moe_kernels.h"

namespace {

#define FM_FULL 0xffffffffu

/* ---- router logits ---------------------------------------------------------- */

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
    /* ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) on lane 0 (FP32 addition commutes) */
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 1));
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 2));
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 4));
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
        for (int i = 0; i < 8; i++) { /* ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) */
            float v = acc[a][i];
            v = __fadd_rn(v, __shfl_xor_sync(FM_FULL, v, 1));
            v = __fadd_rn(v, __shfl_xor_sync(FM_FULL, v, 2));
            v = __fadd_rn(v, __shfl_xor_sync(FM_FULL, v, 4));
            acc[a][i] = v;
        }
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
    /* ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)): the 8 chains of a logit are 8 neighbouring lanes */
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 1));
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 2));
    part = __fadd_rn(part, __shfl_xor_sync(FM_FULL, part, 4));
    const int t = t0 + tl, e = e0 + el;
    if (c == 0 && t < T && e < E) logits[(size_t)t * E + e] = part;
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

/* One warp per token; lane owns experts lane, lane+32, ... (and groups alike).
 * fs: per token [score E][biased E][gscore G] floats; bs: [keep E][chosen G]. */
__global__ void route_kernel(route_cfg c, const float *bias, const float *logits, int T, int32_t *ids, float *wts,
                             float *fs, uint8_t *bs, unsigned long long *bad)
{
    const int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (warp >= T) return;
    const int    t = warp, E = c.E, K = c.K, G = c.G;
    const float *lg = logits + (size_t)t * E;
    float       *score = fs + (size_t)t * (2 * E + G), *biased = score + E, *gscore = biased + E;
    uint8_t     *keep = bs + (size_t)t * (E + G), *chosen = keep + E;

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

} // namespace

extern "C" int fm_moe_router_logits_launch(const uint16_t *x, const float *rw, int T, int E, int H, float *logits,
                                           void *stream)
{
    return fm_moe_router_logits_launch_kind(x, rw, T, E, H, logits, stream, FM_ROUTER_AUTO);
}

extern "C" int fm_moe_router_logits_launch_kind(const uint16_t *x, const float *rw, int T, int E, int H,
                                                float *logits, void *stream, int kind)
{
    const long long warps = (long long)T * E;
    if (warps <= 0) return 0;
    const int staged_ok = H % 8 == 0 && ((uintptr_t)x | (uintptr_t)rw) % 16 == 0 && (T + RS_T - 1) / RS_T <= 65535;
    if (kind == FM_ROUTER_AUTO)
        kind = T >= FM_ROUTER_TILED_MIN_T ? FM_ROUTER_TILED
               : staged_ok                ? FM_ROUTER_STAGED
               : T <= FM_ROUTER_WARP48_MAX_T ? FM_ROUTER_WARP48
                                             : FM_ROUTER_WARP16;
    if (kind == FM_ROUTER_TILED && (E + RT_E - 1) / RT_E > 65535) kind = FM_ROUTER_WARP16; /* grid y limit */
    if (kind == FM_ROUTER_STAGED && !staged_ok) kind = FM_ROUTER_WARP16;
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
    const route_cfg c = {cfg->n_experts, cfg->top_k,         route_groups(cfg), cfg->topk_group,
                         cfg->score == FM_SCORE_SOFTMAX, cfg->renormalize, cfg->routed_scale,
                         cfg->score == FM_SCORE_SOFTMAX_TOPK};
    float   *fs = (float *)scratch;
    uint8_t *bs = (uint8_t *)(fs + (size_t)T * (2 * (size_t)c.E + c.G));
    const int warps_per_block = 4;
    route_kernel<<<(unsigned)((T + warps_per_block - 1) / warps_per_block), 32 * warps_per_block, 0, st>>>(
        c, bias, logits, T, ids, weights, fs, bs, bad);
    return (int)cudaGetLastError();
}

extern "C" const void *fm_route_generic_kernel(void) { return (const void *)route_kernel; }
