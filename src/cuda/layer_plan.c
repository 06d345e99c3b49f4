/* layer_plan.c - the cuda layer's plans: the bucket policy's choices (src/layer/
 * buckets.c) resolved into fm_gemm_plans per bucket at create (install) and at
 * fm_layer_set_plan, checked as their launches would check them, and the split-K
 * buffer they need; fm_layer_plan reads them back. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/layer_cuda.h"
#include "fm_internal.h"

/* T's bucket among the installed ones (T up to max_tokens: the last holds it) */
int fm_cuda_layer_bucket(const fm_cuda_layer *s, int T)
{
    const int b = fm_layer_bucket_of(T);
    return b < s->n_buckets ? b : s->n_buckets - 1;
}

/* The split buffer the plans need: counters of the larger GEMM at the largest split
 * bucket + the largest partials (cuda.h's layout lets FC1 and FC2 share it, one after
 * the other). */
static size_t split_need(const fm_cuda_layer *s, const fm_bucket_plan *plans)
{
    size_t cnt_max = 0, part_max = 0;
    for (int b = 0; b < s->n_buckets; b++) {
        /* a bucket's runs have at most its largest T tokens */
        const int              R = fm_layer_bucket_tokens(s->p.max_tokens, b) * s->p.cfg.top_k;
        const fm_cuda_weights *wk[2] = {s->w13, s->w2};
        const int              ks[2] = {plans[b].ks1, plans[b].ks2};
        for (int g = 0; g < 2; g++) {
            if (ks[g] < 2) continue;
            size_t cb = fm_cuda_split_counter_bytes(wk[g], R), pb = fm_cuda_gemm_split_ws_bytes(wk[g], R, ks[g]) - cb;
            if (cb > cnt_max) cnt_max = cb;
            if (pb > part_max) part_max = pb;
        }
    }
    return cnt_max + part_max;
}

/* GEMM g (0 FC1, 1 FC2) of bucket plan pl resolved for launch: made once per bucket
 * (create, fm_layer_set_plan), so that a run only launches. */
static fm_status make_gemm_plan(const fm_cuda_layer *s, fm_bucket_plan *pl, int g)
{
    const fm_gemm_request r =
        g ? (fm_gemm_request){.w = s->w2, .epi = FM_CUDA_EPI_FINALIZE_DET, .x_packed = pl->pk2, .tile = &pl->t2,
                              .feature_blocks = pl->nb2 > 0 ? pl->nb2 : 1, .k_splits = pl->ks2,
                              .work_list = pl->slots > 0, .expert_slots = pl->slots, .pdl = 1,
                              .pdl_reduce = s->pdl_chain}
          : (fm_gemm_request){.w = s->w13, .epi = FM_CUDA_EPI_SWIGLU, .x_packed = pl->pk1, .y_packed = pl->pk2,
                              .tile = &pl->t1, .feature_blocks = pl->nb1 > 0 ? pl->nb1 : 1, .k_splits = pl->ks1,
                              .work_list = pl->slots > 0, .expert_slots = pl->slots, .pdl = 1};
    return fm_cuda_gemm_plan_make(s->dev, &r, &pl->g[g]);
}

fm_status fm_cuda_layer_gemm_choose(void *state, int g, const fm_gemm_hint *h, fm_tile *tile, int *feature_blocks,
                                    int *k_splits, double *est_us)
{
    const fm_cuda_layer  *s = state;
    const fm_gemm_request r = {.w = g ? s->w2 : s->w13,
                               .epi = g ? FM_CUDA_EPI_FINALIZE_DET : FM_CUDA_EPI_SWIGLU,
                               .x_packed = h->x_packed,
                               .expected_rows = h->rows,
                               .active_experts = h->active,
                               .k_splits = h->k_splits_auto ? FM_CUDA_K_SPLITS_AUTO : 0};
    fm_clear_error();
    return fm_cuda_gemm_plan_choose(s->dev, &r, tile, feature_blocks, k_splits, est_us);
}

int fm_cuda_layer_packed_x_ok(void *state, int g)
{
    const fm_cuda_layer *s = state; /* K of FC1 is hidden, of FC2 inter */
    return fm_cuda_packed_x_ok(s->dev, g ? s->p.cfg.inter : s->p.cfg.hidden);
}

/* The policy's plans of every bucket (fm_layer_plan_buckets) resolved for launch, and the
 * split buffer they need. */
static fm_status install_on(fm_cuda_layer *s, const fm_layer_plan_info *plans, int n)
{
    for (int b = 0; b < n; b++) {
        const fm_layer_plan_info *in = &plans[b];
        fm_bucket_plan           *pl = &s->plan[b];
        pl->rows = in->expected_rows, pl->act = in->active_experts;
        pl->t1 = in->tile[0], pl->t2 = in->tile[1];
        pl->nb1 = in->feature_blocks[0], pl->nb2 = in->feature_blocks[1];
        pl->ks1 = in->k_splits[0], pl->ks2 = in->k_splits[1];
        pl->pk1 = in->x_packed[0], pl->pk2 = in->x_packed[1];
        pl->slots = in->work_list ? in->active_experts : 0; /* 0: no work list */
        FM_CHECK(make_gemm_plan(s, pl, 0));
        FM_CHECK(make_gemm_plan(s, pl, 1));
        s->n_buckets = b + 1;
    }
    s->split_bytes = split_need(s, s->plan);
    cudaError_t e;
    if (s->split_bytes) { /* the layer's own (a layer runs one call at a time): zero once, kept zero by the runs */
        if ((e = cudaMalloc(&s->d_split, s->split_bytes)) != cudaSuccess) return fm_cuda_layer_fail(e, "cudaMalloc");
        if ((e = cudaMemset(s->d_split, 0, s->split_bytes)) != cudaSuccess)
            return fm_cuda_layer_fail(e, "clear split counters");
        /* the memset ran on the legacy stream, which a caller's non-blocking stream does not wait for */
        if ((e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) return fm_cuda_layer_fail(e, "clear split counters");
    }
    return FM_OK;
}

fm_status fm_cuda_layer_install(void *state, const fm_layer_plan_info *plans, int n)
{
    fm_cuda_layer *s = state;
    int            prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = install_on(s, plans, n);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

fm_status fm_cuda_layer_plan(void *state, int T, fm_layer_plan_info *info)
{
    const fm_cuda_layer  *s = state;
    const int          b = fm_cuda_layer_bucket(s, T);
    const fm_bucket_plan *pl = &s->plan[b];
    *info = (fm_layer_plan_info){.bucket_tokens = fm_layer_bucket_tokens(s->p.max_tokens, b),
                                 .expected_rows = pl->rows, .active_experts = pl->act, .work_list = pl->slots > 0,
                                 .tile = {pl->t1, pl->t2}, .k_splits = {pl->ks1, pl->ks2},
                                 .x_packed = {pl->pk1, pl->pk2}, .feature_blocks = {pl->nb1, pl->nb2}};
    return FM_OK;
}

/* Replace T's bucket plan with *info (fm_layer_set_plan): each GEMM's tile, K splits,
 * X layout and feature blocks checked as its launch would check them; the split buffer
 * grown if the new splits need more (zeroed: the counters' rest state). *s unchanged on
 * failure. */
static fm_status set_plan_on(void *state, int T, const fm_layer_plan_info *info)
{
    fm_cuda_layer          *s = state;
    const fm_moe_config *c = &s->p.cfg;
    const int            b = fm_cuda_layer_bucket(s, T);
    const char *const    gemm[2] = {"FC1", "FC2"};
    for (int g = 0; g < 2; g++)
        if (info->k_splits[g] < 1 || info->k_splits[g] > FM_CUDA_MAX_K_SPLITS || info->feature_blocks[g] < 1)
            return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: %s k_splits=%d (1..%d), feature_blocks=%d (>= 1)",
                           gemm[g], info->k_splits[g], FM_CUDA_MAX_K_SPLITS, info->feature_blocks[g]);
    if (info->work_list != 0 && info->work_list != 1)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: work_list=%d (0 or 1)", info->work_list);
    if (info->work_list && (info->active_experts < 1 || info->active_experts > s->p.n_local))
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_set_plan: the work list's grid is sized for active_experts=%d, outside [1, %d local "
                       "experts]",
                       info->active_experts, s->p.n_local);
    fm_bucket_plan plans[FM_LAYER_BUCKETS];
    memcpy(plans, s->plan, sizeof plans);
    fm_bucket_plan *pl = &plans[b];
    pl->t1 = info->tile[0], pl->t2 = info->tile[1];
    pl->nb1 = info->feature_blocks[0], pl->nb2 = info->feature_blocks[1];
    pl->ks1 = info->k_splits[0], pl->ks2 = info->k_splits[1];
    pl->pk1 = info->x_packed[0], pl->pk2 = info->x_packed[1];
    pl->slots = info->work_list ? info->active_experts : 0;
    pl->act = info->active_experts > 0 ? info->active_experts : pl->act;
    pl->rows = info->expected_rows > 0 ? info->expected_rows : pl->rows;
    for (int g = 0; g < 2; g++) {
        const int width = g ? c->hidden : c->inter; /* K of the GEMM: what packed X needs % 64 */
        if (info->x_packed[g] != 0 && info->x_packed[g] != 1)
            return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: %s x_packed=%d (0 or 1)", gemm[g], info->x_packed[g]);
        if (info->x_packed[g] && !fm_cuda_packed_x_ok(s->dev, width))
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_layer_set_plan: %s x_packed needs sm_90a and K %% 64 == 0 (K=%d)",
                           gemm[g], width);
        const int wg = info->tile[g].family == FM_FAMILY_FP4MOE_WGMMA;
        if (info->work_list && (wg || info->feature_blocks[g] != 1))
            return fm_fail(FM_ERR_UNSUPPORTED,
                           "fm_layer_set_plan: the work list runs mma tiles with one feature block per CTA; %s has a "
                           "%s tile with %d",
                           gemm[g], wg ? "wgmma" : "mma", info->feature_blocks[g]);
        /* the launch's own tile checks, made once here: the runs only launch the plan */
        fm_status st = make_gemm_plan(s, pl, g);
        if (st != FM_OK) return fm_fail(st, "fm_layer_set_plan: %s: %s", gemm[g], fm_last_error());
    }
    size_t need = split_need(s, plans);
    if (need > s->split_bytes) {
        void       *d = NULL;
        cudaError_t e = cudaMalloc(&d, need);
        if (e == cudaSuccess) e = cudaMemset(d, 0, need);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy); /* before a run on the caller's stream */
        if (e != cudaSuccess) {
            if (d) cudaFree(d);
            return fm_cuda_layer_fail(e, "fm_layer_set_plan: the split-K buffer");
        }
        cudaFree(s->d_split); /* the caller has no run in flight (fm_layer_set_plan's contract) */
        s->d_split = d, s->split_bytes = need;
    }
    memcpy(s->plan, plans, sizeof plans);
    return FM_OK;
}

fm_status fm_cuda_layer_set_plan(void *state, int T, const fm_layer_plan_info *info)
{
    fm_cuda_layer *s = state;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = set_plan_on(s, T, info);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}
