/* backend_cuda.c - the "cuda" backend: the routed MoE layer on the GPU.
 *
 * forward(x[T][H]): x goes up, then everything runs on the device, in one
 * stream, with no host round trip until the output comes back (the part
 * between the upload and the download is CUDA-graph capturable):
 *   1. router logits (route.cu), bit-identical to the CPU's;
 *   2. routing: scores, bias, group limit, top-k, weights, as fm_moe_route
 *      (same ties; a NaN/Inf logit is flagged on the device, reported after);
 *   3. the stable permutation of fm_moe_permute: offsets, perm, row weights,
 *      token slots, all on the device;
 *   4. gather the routed rows into expert order;
 *   5. FC1 + SwiGLU: fm_cuda_gemm(FM_CUDA_EPI_SWIGLU) -> h[rows][inter] BF16
 *      (on sm_90 with more than 16 rows per expert: X gathered and h written in
 *      the prepack K order, so both GEMMs run the packed-X wgmma kernel);
 *   6. the BF16 shared expert, if any: out[t] = its SwiGLU MLP of x[t] (FP32);
 *   7. FC2 + FINALIZE_DET: out[t] += sum over t's slots of weight * (h . W2^T),
 *      deterministic slot order;
 *   8. one host sync; the overflow flag (8 bytes) and out come back. The
 *      kernels' time (CUDA events, steps 1-7) goes into stats.
 * The GEMMs get max_rows = the capacity (max_tokens * top_k): the row counts
 * live only on the device (offsets). Every fm_moe_config routing mode runs on
 * the device; there is no host-routing fallback. Not done yet: act_nvfp4
 * (create returns FM_ERR_UNSUPPORTED).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_internal.h"
#include "cuda/moe_kernels.h"

typedef struct {
    fm_moe_config    cfg;
    int              max_tokens;
    fm_cuda_weights *w13, *w2;
    int              bad_bias; /* index of a NaN/Inf router bias (reported by forward, as fm_moe_route does), or -1 */
    int              sm90;     /* compute capability 9.0: the wgmma tiles (packed X) for > 16 rows per expert */
    float            bad_bias_value;
    float           *d_router, *d_bias; /* d_bias NULL without a bias */
    uint16_t        *d_x, *d_xp, *d_h;
    float           *d_logits, *d_out, *d_scratch, *d_rw, *d_hs, *d_wts;
    uint16_t        *d_sw13, *d_sw2; /* shared expert, BF16 */
    int32_t         *d_off, *d_perm, *d_slots, *d_ids;
    void            *d_rscratch; /* routing scratch, fm_moe_route_scratch_bytes */
    unsigned long long *d_bad;   /* first non-finite logit t*E+e, or UINT64_MAX */
    cudaEvent_t      ev0, ev1;
} cuda_state;

static fm_status cu_err(cudaError_t e, const char *what)
{
    if (e == cudaErrorMemoryAllocation) return fm_fail(FM_ERR_OOM, "cuda backend: %s: %s", what, cudaGetErrorString(e));
    return fm_fail(FM_ERR_CUDA, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

static fm_status cuda_available(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        return fm_fail(FM_ERR_NO_DEVICE, "cuda backend: no usable CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    return FM_OK;
}

static void cuda_destroy(void *p)
{
    cuda_state *s = p;
    if (!s) return;
    fm_cuda_weights_destroy(s->w13);
    fm_cuda_weights_destroy(s->w2);
    void *dev[] = {s->d_router, s->d_bias, s->d_x,    s->d_xp,   s->d_h,    s->d_logits,   s->d_out, s->d_scratch,
                   s->d_rw,     s->d_hs,   s->d_wts,  s->d_sw13, s->d_sw2,  s->d_off,      s->d_perm, s->d_slots,
                   s->d_ids,    s->d_rscratch, s->d_bad};
    for (size_t i = 0; i < FM_ARRAY_LEN(dev); i++) cudaFree(dev[i]);
    if (s->ev0) cudaEventDestroy(s->ev0);
    if (s->ev1) cudaEventDestroy(s->ev1);
    free(s);
}

static fm_status cuda_create(const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens, void **state)
{
    if (cfg->act_nvfp4) return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: act_nvfp4 (W4A4) is not implemented yet");
    if (cfg->score == FM_SCORE_SOFTMAX_TOPK) /* route.cu knows softmax and sigmoid only */
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: score softmax-topk (gpt-oss routing) is not implemented; use a CPU backend");
    if (cfg->shared_inter % 16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: shared_inter=%d must be a multiple of 16", cfg->shared_inter);
    if (cfg->wfmt == FM_FORMAT_BF16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: BF16 routed experts are not supported (FP4 only)");
    /* The gather and the deterministic finalize put routed rows / tokens on the
     * grid's y dimension (at most 65,535); bigger batches are split by the caller. */
    if ((int64_t)max_tokens * cfg->top_k > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "cuda backend: max_tokens=%d x top_k=%d = %lld routed rows > 65,535 per forward (grid y limit); "
                       "run the batch in chunks", max_tokens, cfg->top_k, (long long)max_tokens * cfg->top_k);
    if (cfg->n_experts > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: n_experts=%d > 65,535 (grid y limit)", cfg->n_experts);
    if (cfg->hidden % 16 || cfg->inter % 16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: hidden=%d and inter=%d must be multiples of 16", cfg->hidden,
                       cfg->inter);
    FM_CHECK(cuda_available());
    cuda_state *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(FM_ERR_OOM, "cuda backend: out of host memory");
    s->cfg = *cfg;
    s->max_tokens = max_tokens;
    {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
            s->sm90 = major == 9 && minor == 0;
        cudaGetLastError();
    }
    const int    E = cfg->n_experts, H = cfg->hidden, I = cfg->inter, R = max_tokens * cfg->top_k;
    fm_status    st = FM_OK;
    cudaError_t  e = cudaSuccess;
    if ((st = fm_cuda_weights_create(w->w13, E, &s->w13)) != FM_OK) goto fail;
    if ((st = fm_cuda_weights_create(w->w2, E, &s->w2)) != FM_OK) goto fail;
#define DALLOC(ptr, bytes) \
    if ((e = cudaMalloc((void **)&(ptr), (bytes))) != cudaSuccess) goto cuda_fail
    DALLOC(s->d_router, sizeof(float) * (size_t)E * H);
    DALLOC(s->d_x, sizeof(uint16_t) * (size_t)max_tokens * H);
    DALLOC(s->d_xp, sizeof(uint16_t) * (size_t)R * H);
    DALLOC(s->d_h, sizeof(uint16_t) * (size_t)R * I);
    DALLOC(s->d_logits, sizeof(float) * (size_t)max_tokens * E);
    DALLOC(s->d_out, sizeof(float) * (size_t)max_tokens * H);
    DALLOC(s->d_scratch, sizeof(float) * (size_t)R * H);
    DALLOC(s->d_rw, sizeof(float) * (size_t)R);
    DALLOC(s->d_off, sizeof(int32_t) * (size_t)(E + 1));
    DALLOC(s->d_perm, sizeof(int32_t) * (size_t)R);
    DALLOC(s->d_slots, sizeof(int32_t) * (size_t)R);
    DALLOC(s->d_ids, sizeof(int32_t) * (size_t)R);
    DALLOC(s->d_wts, sizeof(float) * (size_t)R);
    DALLOC(s->d_rscratch, fm_moe_route_scratch_bytes(cfg, max_tokens));
    DALLOC(s->d_bad, sizeof(unsigned long long));
    if (w->router_bias) {
        DALLOC(s->d_bias, sizeof(float) * (size_t)E);
    }
    if (cfg->shared_inter > 0) {
        const size_t S = (size_t)cfg->shared_inter;
        DALLOC(s->d_hs, sizeof(float) * (size_t)max_tokens * S);
        DALLOC(s->d_sw13, sizeof(uint16_t) * 2 * S * H);
        DALLOC(s->d_sw2, sizeof(uint16_t) * S * H);
        if ((e = cudaMemcpy(s->d_sw13, w->shared_w13, sizeof(uint16_t) * 2 * S * H, cudaMemcpyHostToDevice)) !=
                cudaSuccess ||
            (e = cudaMemcpy(s->d_sw2, w->shared_w2, sizeof(uint16_t) * S * H, cudaMemcpyHostToDevice)) != cudaSuccess)
            goto cuda_fail;
    }
#undef DALLOC
    if ((e = cudaMemcpy(s->d_router, w->router_w, sizeof(float) * (size_t)E * H, cudaMemcpyHostToDevice)) != cudaSuccess)
        goto cuda_fail;
    if ((e = cudaEventCreate(&s->ev0)) != cudaSuccess || (e = cudaEventCreate(&s->ev1)) != cudaSuccess) goto cuda_fail;
    s->bad_bias = -1;
    if (w->router_bias) {
        for (int i = 0; i < E && s->bad_bias < 0; i++)
            if (!isfinite(w->router_bias[i])) {
                s->bad_bias = i;
                s->bad_bias_value = w->router_bias[i];
            }
        if ((e = cudaMemcpy(s->d_bias, w->router_bias, sizeof(float) * (size_t)E, cudaMemcpyHostToDevice)) !=
            cudaSuccess)
            goto cuda_fail;
    }
    *state = s;
    return FM_OK;
cuda_fail:
    st = cu_err(e, "create");
fail:
    cuda_destroy(s);
    return st;
}

/* 1 if the planner estimates the call faster with packed X than with natural X. */
static int prefer_packed(const fm_cuda_gemm_args *a)
{
    fm_cuda_gemm_args p = *a;
    fm_cuda_tile      t;
    double            nat = 0, pk = 0;
    p.x_packed = 1;
    int ok = fm_cuda_gemm_choose(a, &t, NULL, &nat) == FM_OK && fm_cuda_gemm_choose(&p, &t, NULL, &pk) == FM_OK;
    fm_clear_error();
    return ok && pk < nat;
}

static fm_status cuda_forward(void *p, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    cuda_state          *s = p;
    const fm_moe_config *c = &s->cfg;
    const int            E = c->n_experts, H = c->hidden, K = c->top_k, R = T * K; /* routed rows of this forward: the GEMM grids are sized by it */
    cudaError_t          e;
    int                  le;
    if (s->bad_bias >= 0) /* what fm_moe_route says for it, before any work */
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: router_bias[%d] = %g is not finite", s->bad_bias,
                       (double)s->bad_bias_value);
    if ((e = cudaMemcpy(s->d_x, x, sizeof(uint16_t) * (size_t)T * H, cudaMemcpyHostToDevice)) != cudaSuccess)
        return cu_err(e, "upload x");
    /* ---- from here to ev1: device work only, no host round trip ---- */
    cudaEventRecord(s->ev0, 0);
    if ((le = fm_moe_router_logits_launch(s->d_x, s->d_router, T, E, H, s->d_logits, NULL)) != 0)
        return cu_err((cudaError_t)le, "router logits");
    if ((le = fm_moe_route_launch(c, s->d_bias, s->d_logits, T, s->d_ids, s->d_wts, s->d_rscratch, s->d_bad, NULL)) != 0)
        return cu_err((cudaError_t)le, "routing");
    if ((le = fm_moe_permute_launch(s->d_ids, s->d_wts, T, K, E, s->d_off, s->d_perm, s->d_slots, s->d_rw, NULL,
                                    NULL)) != 0)
        return cu_err((cudaError_t)le, "permutation");
    if ((e = cudaMemsetAsync(s->d_out, 0, sizeof(float) * (size_t)T * H, 0)) != cudaSuccess)
        return cu_err(e, "clear out");
    /* tile choice only (the real counts stay on the device): at most R experts have rows */
    int act = R < E ? (R > 0 ? R : 1) : E, avg = (R + act - 1) / act;
    /* X layout of each GEMM: packed (the prepack K order, read by the sm_90a wgmma
     * kernel only) where the planner's estimate for it beats natural X; the gather
     * writes FC1's X and FC1's epilogue FC2's X in the chosen order at no cost. */
    fm_cuda_gemm_args a1 = {.w = s->w13, .x = s->d_xp, .offsets = s->d_off, .max_rows = R, .epi = FM_CUDA_EPI_SWIGLU,
                            .y = s->d_h, .expected_rows = avg, .active_experts = act};
    fm_cuda_gemm_args a2 = {.w = s->w2, .x = s->d_h, .offsets = s->d_off, .max_rows = R,
                            .epi = FM_CUDA_EPI_FINALIZE_DET, .y = s->d_out, .row_weight = s->d_rw, .n_tokens = T,
                            .top_k = K, .token_slots = s->d_slots, .scratch = s->d_scratch, .expected_rows = avg,
                            .active_experts = act};
    int pk1 = s->sm90 && H % 64 == 0 && prefer_packed(&a1);
    int pk2 = s->sm90 && c->inter % 64 == 0 && prefer_packed(&a2);
    if ((le = fm_moe_gather_launch(s->d_x, s->d_perm, R, K, H, pk1, s->d_xp, NULL)) != 0)
        return cu_err((cudaError_t)le, "gather");
    a1.x_packed = pk1, a1.y_packed = pk2, a2.x_packed = pk2;
    /* PDL (sm_90+): each GEMM's CTAs take the SM slots the kernel before it frees and
     * start the moment it completes */
    a1.pdl = a2.pdl = 1;
    FM_CHECK(fm_cuda_gemm(&a1));
    if (c->shared_inter > 0 && (le = fm_moe_shared_expert_launch(s->d_x, s->d_sw13, s->d_sw2, T, H, c->shared_inter,
                                                                 s->d_hs, s->d_out, NULL)) != 0)
        return cu_err((cudaError_t)le, "shared expert");
    FM_CHECK(fm_cuda_gemm(&a2));
    cudaEventRecord(s->ev1, 0);
    /* ---- the one host sync ---- */
    if ((e = cudaEventSynchronize(s->ev1)) != cudaSuccess) return cu_err(e, "forward");
    unsigned long long bad = 0;
    if ((e = cudaMemcpy(&bad, s->d_bad, sizeof bad, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return cu_err(e, "download routing status");
    if (bad != ~0ull) /* the CPU backends' check and message (fm_moe_route_tokens) */
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: router logit [%llu][%llu] overflowed (inputs too large)",
                       bad / (unsigned long long)E, bad % (unsigned long long)E);
    /* copy out only now: `out` stays untouched on every failure above */
    if ((e = cudaMemcpy(out, s->d_out, sizeof(float) * (size_t)T * H, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return cu_err(e, "download out");
    if (stats) {
        float ms = 0;
        cudaEventElapsedTime(&ms, s->ev0, s->ev1);
        stats->ms = ms;
    }
    return FM_OK;
}

const fm_backend_ops fm_cuda_ops = {
    .name = "cuda", .available = cuda_available, .create = cuda_create, .forward = cuda_forward,
    .destroy = cuda_destroy};
