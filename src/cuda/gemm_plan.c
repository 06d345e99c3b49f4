/* gemm_plan.c - fm_gemm_plan (gemm_plan.h): the tile choice and the tile checks made
 * once per plan, and the launch of a plan. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "cuda/gemm_plan.h"
#include "fm_internal.h"
#include "fp4moe/plan.h"

/* The kernel family of a tile: wgmma when it says so, else mma.sync (AUTO: a tile
 * written by its first five fields). */
static int is_wgmma(const fm_tile *t) { return t->family == FM_FAMILY_FP4MOE_WGMMA; }

/* The family's shared-memory model (the planner's function) with a limit. */
static fm_status tile_smem_check(const fm_tile *t, size_t limit, fm_smem_breakdown *bd)
{
    return is_wgmma(t) ? fm_smem_wgmma_check(t, limit, bd) : fm_smem_mma_check(t, limit, bd);
}

static char *tile_name(const fm_tile *t, char *buf, size_t n)
{
    return is_wgmma(t) ? fm_wgmma_tile_name(t, buf, n) : fm_mma_tile_name(t, buf, n);
}

fm_status fm_cuda_status(int err, const char *what)
{
    const cudaError_t e = (cudaError_t)err;
    if (e == cudaErrorMemoryAllocation) return fm_fail(FM_ERR_OOM, "%s: %s", what, cudaGetErrorString(e));
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return fm_fail(FM_ERR_NO_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    return fm_fail(FM_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

int fm_cuda_packed_x_ok(const fm_cuda_device *d, int k)
{
    unsigned long long mma, wgmma;
    fm_cuda_device_rows(d, &mma, &wgmma);
    return wgmma != 0 && k % 64 == 0;
}

/* The shared-memory limit of a request on d: the device's opt-in limit, or lower. */
static size_t smem_limit(const fm_cuda_device *d, const fm_gemm_request *r)
{
    size_t limit = fm_cuda_device_limits(d)->smem_block_optin;
    if (r->smem_limit && r->smem_limit < limit) limit = r->smem_limit;
    return limit;
}

fm_status fm_cuda_gemm_plan_choose(const fm_cuda_device *d, const fm_gemm_request *r, fm_tile *tile,
                                   int *feature_blocks, int *k_splits, double *est_us)
{
    const fm_gpu_info     *g = fm_cuda_device_plan_gpu(d);
    const fm_cuda_weights *w = r->w;
    const fm_pack_format  *pf = fm_pack_format_get(w->fmt);
    if (!pf)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_choose: w is not prepacked FP4 weights (format %d)", (int)w->fmt);
    fm_fp4moe_query q = {.weights = pf->elem,
                         .x_packed = r->x_packed != 0,
                         .swiglu = r->epi == FM_CUDA_EPI_SWIGLU,
                         .feature_blocks = r->feature_blocks,
                         .smem_limit = smem_limit(d, r),
                         .max_k_splits = r->k_splits == FM_CUDA_K_SPLITS_AUTO ? FM_CUDA_MAX_K_SPLITS : 0};
    fm_cuda_device_rows(d, &q.mma_rows, &q.wgmma_rows);
    fm_fp4moe_choice c;
    size_t           n = 0;
    int              rows = r->expected_rows > 0 ? r->expected_rows : 1;
    int              ex = r->active_experts > 0 && r->active_experts < w->n_experts ? r->active_experts : w->n_experts;
    fm_status        st = fm_plan_fp4moe(g, &q, rows, w->n, w->k, ex, &c, 1, &n, NULL);
    if (st != FM_OK) return fm_fail(st, "fm_cuda_gemm: no tile for this call: %s", fm_last_error());
    *tile = c.tile;
    if (feature_blocks) *feature_blocks = c.feature_blocks;
    if (k_splits) *k_splits = c.k_splits > 1 ? c.k_splits : 1;
    if (est_us) *est_us = c.est_us;
    return FM_OK;
}

/* Feature blocks per CTA for tile t (index idx): -1 if r->feature_blocks > 1
 * asks for a multi-block kernel the tile does not have. Automatic: short K
 * (<= 512, at most 4 stages of 128 per block) with blocks to spare, i.e. so that
 * experts x blocks / nb still gives ~16 CTAs per SM of a 132-SM part. */
static int feature_blocks(const fm_gemm_request *r, const fm_tile *t, int idx, int sms)
{
    int has = !is_wgmma(t) && fm_mma_has_mb(idx);
    if (r->feature_blocks > 1) return has ? r->feature_blocks : -1;
    if (r->feature_blocks == 1 || !has) return 1;
    return fm_plan_fp4moe_auto_blocks(t->warps, t->mt, r->epi == FM_CUDA_EPI_SWIGLU, r->w->n, r->w->k,
                                      r->w->n_experts, sms);
}

/* The tile checks of a launch (family, compiled in, wgmma on sm_90a, X / Y layouts, SwiGLU,
 * feature blocks, K splits, shared memory): *idx, *nb (feature blocks per CTA) and *bd on FM_OK.
 * chosen_nb: the planner's feature blocks (0: from r->feature_blocks). */
static fm_status check_tile(const fm_gemm_request *r, const fm_tile *t, int chosen_nb, int ks,
                            const fm_cuda_device *dev, size_t limit, int *idx_out, int *nb_out, fm_smem_breakdown *bd)
{
    const int cc = fm_cuda_device_limits(dev)->cc;
    const fm_cuda_weights *w = r->w;
    char name[64];
    if (t->family != FM_FAMILY_AUTO && t->family != FM_FAMILY_FP4MOE_MMA && t->family != FM_FAMILY_FP4MOE_WGMMA)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: tile family %d is not fp4moe-mma or fp4moe-wgmma",
                       (int)t->family);
    int wg = is_wgmma(t);
    int idx = wg ? fm_wgmma_tile_index(t) : fm_mma_tile_index(t);
    if (idx < 0)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: tile %s is not compiled in (see %s)",
                       tile_name(t, name, sizeof name), wg ? "fm_wgmma_tiles" : "fm_mma_tiles");
    if (!fm_cuda_device_has_tile(dev, wg, idx))
        return fm_fail(FM_ERR_NO_KERNEL,
                       "fm_cuda_gemm: tile %s has no code for this device (compute capability %d.%d) in this build "
                       "(targets %s)%s",
                       tile_name(t, name, sizeof name), cc / 10, cc % 10, fm_cuda_build_targets(),
                       wg ? ": wgmma exists on sm_90a only; use an mma tile" : "");
    if (r->x_packed && !wg)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: x_packed (X in the prepack K order) is read by the wgmma "
                                           "tiles only, not by %s",
                       tile_name(t, name, sizeof name));
    if (wg && !r->x_packed && fm_wgmma_persistent(idx))
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: %s (the persistent kernel) reads packed X only "
                                           "(x_packed, fm_cuda_x_pack); for natural X use a wgmma tile with persist = 0",
                       tile_name(t, name, sizeof name));
    if (r->x_packed && w->k % 64)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: x_packed needs K %% 64 == 0 (K=%d)", w->k);
    if (r->y_packed) {
        int width = r->epi == FM_CUDA_EPI_SWIGLU ? w->n / 2 : w->n;
        if (r->epi != FM_CUDA_EPI_NONE && r->epi != FM_CUDA_EPI_SWIGLU)
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: y_packed applies to the BF16 outputs (NONE, SWIGLU)");
        if (width % 64)
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: y_packed needs an output width %% 64 == 0 (%d)", width);
    }
    if (r->epi == FM_CUDA_EPI_SWIGLU && (t->mt % 2 || w->n % 32))
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: SwiGLU needs an even mt (tile %s) and N %% 32 == 0 (N=%d)",
                       tile_name(t, name, sizeof name), w->n);
    int nb = chosen_nb ? chosen_nb
                       : ((ks > 1 && r->feature_blocks == 0) ? 1
                                                             : feature_blocks(r, t, idx, fm_cuda_device_limits(dev)->sms));
    if (nb < 0)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: feature_blocks=%d needs an mma tile with a multi-block "
                                           "kernel (include/fp4moe/cuda.h lists them); %s has none",
                       r->feature_blocks, tile_name(t, name, sizeof name));
    if (ks > 1) {
        int stages = (w->kp + t->kc - 1) / t->kc;
        if (wg || nb != 1 || ks > stages)
            return fm_fail(FM_ERR_UNSUPPORTED,
                           "fm_cuda_gemm: k_splits=%d needs an mma tile's plain kernel (one feature block per CTA) and "
                           "at most its %d K stages; %s with %d feature block(s) per CTA",
                           ks, stages, tile_name(t, name, sizeof name), nb);
    }
    FM_CHECK(tile_smem_check(t, limit, bd));
    *idx_out = idx;
    *nb_out = nb;
    return FM_OK;
}

fm_status fm_cuda_gemm_plan_fill(const fm_cuda_device *d, const fm_gemm_request *r, const fm_tile *t, int chosen_nb,
                                 int ks, fm_gemm_plan *out)
{
    const fm_cuda_weights *w = r->w;
    const fm_pack_format  *pf = fm_pack_format_get(w->fmt);
    if (!pf) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: w is not prepacked FP4 weights (format %d)", (int)w->fmt);
    int               idx = -1, nb = 1;
    fm_smem_breakdown bd;
    FM_CHECK(check_tile(r, t, chosen_nb, ks, d, smem_limit(d, r), &idx, &nb, &bd));
    const int       cc = fm_cuda_device_limits(d)->cc;
    fm_gemm_variant v;
    if (is_wgmma(t)) v = fm_wgmma_persistent(idx) ? FM_GEMM_WGMMA_PERSISTENT : FM_GEMM_WGMMA;
    /* the work-list kernel takes split K and the experts' list; the multi-block kernel
     * takes neither and computes every expert with rows, the same result */
    else v = nb > 1 ? FM_GEMM_MMA_MULTI : (ks > 1 || r->work_list) ? FM_GEMM_MMA_LIST : FM_GEMM_MMA;
    *out = (fm_gemm_plan){.tile = *t,
                          .idx = idx,
                          .variant = v,
                          .epi = (int)r->epi,
                          .x_packed = r->x_packed != 0,
                          .y_packed = r->y_packed != 0,
                          .nb = nb,
                          .k_splits = ks,
                          .expert_slots = r->expert_slots,
                          .smem = bd.total,
                          .pdl = r->pdl && cc >= 90,
                          .pdl_reduce = r->pdl_reduce && r->pdl && cc >= 90,
                          .sc_mul = pf->sc_mul,
                          .sc_add = pf->sc_add,
                          .n_experts = w->n_experts,
                          .n = w->n,
                          .k = w->k};
    return FM_OK;
}

fm_status fm_cuda_gemm_plan_make(const fm_cuda_device *d, const fm_gemm_request *r, fm_gemm_plan *out)
{
    fm_tile t;
    int     chosen_nb = 0, ks = r->k_splits > 1 ? r->k_splits : 1;
    if (r->tile) t = *r->tile;
    else FM_CHECK(fm_cuda_gemm_plan_choose(d, r, &t, &chosen_nb, r->k_splits == FM_CUDA_K_SPLITS_AUTO ? &ks : NULL,
                                           NULL)); /* the planner's first candidate (fm_plan_fp4moe) */
    return fm_cuda_gemm_plan_fill(d, r, &t, chosen_nb, ks, out);
}

fm_status fm_cuda_gemm_launch(const fm_cuda_device *d, const fm_gemm_plan *pl, const fm_gemm_operands *o, void *stream)
{
    const fm_cuda_weights *w = o->w;
    if (!w || w->n_experts != pl->n_experts || w->n != pl->n || w->k != pl->k)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: the weights are not the shape the plan was made for");
    const int ks = pl->k_splits;
    if (ks > 1 && (!o->split_ws || o->split_ws_bytes < fm_cuda_gemm_split_ws_bytes(w, o->max_rows, ks)))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: k_splits=%d needs split_ws of %zu bytes "
                                           "(fm_cuda_gemm_split_ws_bytes), got %zu",
                       ks, fm_cuda_gemm_split_ws_bytes(w, o->max_rows, ks), o->split_ws_bytes);
    const int wg = pl->variant == FM_GEMM_WGMMA || pl->variant == FM_GEMM_WGMMA_PERSISTENT;
    const int dev = fm_cuda_device_ordinal(d), sms = fm_cuda_device_limits(d)->sms;
    fm_gemm_params p = {
        .wdata = w->d_data, .wscale = w->d_scale, .oscale = w->d_oscale, .x = o->x, .offsets = o->offsets,
        .max_rows = o->max_rows, .n_experts = w->n_experts, .n = w->n, .k = w->k, .kp = w->kp,
        .sc_mul = pl->sc_mul, .sc_add = pl->sc_add, .epi = pl->epi,
        .x_packed = pl->x_packed, .y_packed = pl->y_packed, .y = o->y,
        .nb = pl->nb, .row_weight = o->row_weight, .row_token = o->row_token, .scratch = o->scratch,
        .pdl = pl->pdl};
    const fm_gemm_oss oss = {.bias = o->bias, .act = o->act, .act_limit = o->act_limit};
    fm_gemm_work work = {.ksplit = ks, .active = o->expert_list, .slots = pl->expert_slots};
    if (ks > 1) { /* split_ws: the counters from its start, the partials at its end (so that
                   * calls of other shapes or row counts on one buffer never write partials
                   * over counters: cuda.h) */
        size_t part = (size_t)ks * (size_t)o->max_rows * (size_t)w->n * sizeof(float);
        work.split_cnt = (int *)o->split_ws;
        work.split_part = (float *)((unsigned char *)o->split_ws + ((o->split_ws_bytes - part) & ~(size_t)15));
    }
    if (wg && fm_wgmma_grid(pl->idx, &p, sms) > 0x7FFFFFFFLL) {
        char name[64];
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: %s would need %lld CTAs (> 2^31-1) for max_rows=%d",
                       tile_name(&pl->tile, name, sizeof name), fm_wgmma_grid(pl->idx, &p, sms), o->max_rows);
    }
    int err = wg ? fm_wgmma_launch(dev, sms, pl->idx, &p, &oss, pl->smem, stream)
                 : fm_mma_launch(dev, pl->idx, &p, pl->variant == FM_GEMM_MMA_LIST ? &work : NULL, &oss, pl->smem,
                                 stream);
    if (err) return fm_cuda_status(err, "fm_cuda_gemm: launch");
    if (pl->epi == FM_CUDA_EPI_FINALIZE_DET) {
        err = fm_finalize_reduce_launch(o->scratch, o->token_slots, o->n_tokens, o->top_k, w->n, o->max_rows,
                                        o->y_zero_init ? NULL : (const float *)o->y, (float *)o->y, o->y_bf16,
                                        pl->pdl_reduce, stream);
        if (err) return fm_cuda_status(err, "fm_cuda_gemm: finalize reduce launch");
    }
    return FM_OK;
}

fm_status fm_cuda_tile_attributes(const fm_tile *t, fm_format fmt, size_t *static_smem, size_t *max_dynamic_smem)
{
    fm_clear_error();
    (void)fmt; /* one kernel serves both formats (scale decode constants are parameters) */
    if (!t) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_tile_attributes: t is NULL");
    int wg = is_wgmma(t);
    int idx = wg ? fm_wgmma_tile_index(t) : fm_mma_tile_index(t);
    if (idx < 0) return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_tile_attributes: tile not compiled in");
    int err = wg ? fm_wgmma_attributes(idx, 1, static_smem, max_dynamic_smem) /* the packed-X kernel */
                 : fm_mma_attributes(idx, static_smem, max_dynamic_smem);
    if (err) return fm_cuda_status(err, "fm_cuda_tile_attributes");
    return FM_OK;
}
