/* gemm_launch.c - the public GPU grouped GEMM API (fp4moe/cuda.h): weight
 * prepack + upload, argument validation, tile choice, and the launch, whose
 * dynamic shared memory is computed by the planner's model fm_smem_swapab and
 * refused with FM_ERR_SMEM_EXCEEDED above the limit (nothing launched then). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "fp4moe/kernels.h"
#include "fm_internal.h"

/* The kernel family of a tile: wgmma when it says so, else mma.sync (AUTO: a tile
 * written by its first five fields). */
static int is_wgmma(const fm_tile *t) { return t->family == FM_FAMILY_FP4MOE_WGMMA; }

/* The family's shared-memory model (the planner's function) with a limit. */
static fm_status tile_smem_check(const fm_tile *t, size_t limit, fm_smem_breakdown *bd)
{
    return is_wgmma(t) ? fm_smem_wgmma_check(t, limit, bd) : fm_smem_swapab_check(t, limit, bd);
}

static char *tile_name(const fm_tile *t, char *buf, size_t n)
{
    return is_wgmma(t) ? fm_wgmma_tile_name(t, buf, n) : fm_swapab_tile_name(t, buf, n);
}

static fm_status cuda_fail(cudaError_t err, const char *what)
{
    if (err == cudaErrorMemoryAllocation) return fm_fail(FM_ERR_OOM, "%s: %s", what, cudaGetErrorString(err));
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
        return fm_fail(FM_ERR_NO_DEVICE, "%s: %s", what, cudaGetErrorString(err));
    return fm_fail(FM_ERR_CUDA, "%s: %s", what, cudaGetErrorString(err));
}

void fm_cuda_weights_destroy(fm_cuda_weights *w)
{
    if (!w) return;
    cudaFree(w->d_data);
    cudaFree(w->d_scale);
    cudaFree(w->d_oscale);
    free(w);
}

fm_status fm_cuda_weights_create(const fm_qtensor *w, int n_experts, fm_cuda_weights **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_weights_create: out is NULL");
    *out = NULL;
    if (!w || n_experts < 1) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_weights_create: no weights (n_experts=%d)", n_experts);
    for (int e = 0; e < n_experts; e++) {
        if (w[e].fmt != w[0].fmt)
            return fm_fail(FM_ERR_FORMAT, "fm_cuda_weights_create: expert %d has format %d, expert 0 has %d", e,
                           (int)w[e].fmt, (int)w[0].fmt);
        if (w[e].rows != w[0].rows || w[e].cols != w[0].cols)
            return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_weights_create: expert %d is [%lld x %lld], expert 0 [%lld x %lld]",
                           e, (long long)w[e].rows, (long long)w[e].cols, (long long)w[0].rows, (long long)w[0].cols);
    }
    if (w[0].rows > (1 << 24) || w[0].cols > (1 << 24))
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_weights_create: [%lld x %lld] too large", (long long)w[0].rows,
                       (long long)w[0].cols);
    int dev_count = 0;
    if (fm_device_count(&dev_count) != FM_OK)
        return fm_fail(FM_ERR_NO_DEVICE, "fm_cuda_weights_create: %s", fm_last_error());
    size_t db, sb;
    fm_cuda_prepack_sizes(w[0].rows, w[0].cols, &db, &sb);
    uint8_t *hd = malloc(db), *hs = malloc(sb);
    float   *hos = malloc(sizeof(float) * (size_t)n_experts);
    fm_cuda_weights *cw = calloc(1, sizeof *cw);
    fm_status st = FM_OK;
    if (!hd || !hs || !hos || !cw) {
        st = fm_fail(FM_ERR_OOM, "fm_cuda_weights_create: out of host memory");
        goto done;
    }
    cw->fmt = w[0].fmt;
    cw->n_experts = n_experts;
    cw->n = (int)w[0].rows;
    cw->k = (int)w[0].cols;
    cw->kp = (cw->k + FM_PACK_KCHUNK - 1) / FM_PACK_KCHUNK * FM_PACK_KCHUNK;
    cw->data_bytes = db;
    cw->scale_bytes = sb;
    cudaError_t err;
    if ((err = cudaMalloc(&cw->d_data, db * n_experts)) != cudaSuccess ||
        (err = cudaMalloc(&cw->d_scale, sb * n_experts)) != cudaSuccess ||
        (err = cudaMalloc((void **)&cw->d_oscale, sizeof(float) * n_experts)) != cudaSuccess) {
        st = cuda_fail(err, "fm_cuda_weights_create: cudaMalloc");
        goto done;
    }
    for (int e = 0; e < n_experts; e++) {
        if ((st = fm_cuda_prepack(&w[e], hd, hs, &hos[e])) != FM_OK) goto done;
        if ((err = cudaMemcpy((uint8_t *)cw->d_data + db * e, hd, db, cudaMemcpyHostToDevice)) != cudaSuccess ||
            (err = cudaMemcpy((uint8_t *)cw->d_scale + sb * e, hs, sb, cudaMemcpyHostToDevice)) != cudaSuccess) {
            st = cuda_fail(err, "fm_cuda_weights_create: upload");
            goto done;
        }
    }
    if ((err = cudaMemcpy(cw->d_oscale, hos, sizeof(float) * n_experts, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (err = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) /* the DMAs landed: a launch on a
                                                                          * non-blocking stream may follow */
        st = cuda_fail(err, "fm_cuda_weights_create: upload");
done:
    free(hd);
    free(hs);
    free(hos);
    if (st != FM_OK) {
        fm_cuda_weights_destroy(cw);
        return st;
    }
    *out = cw;
    return FM_OK;
}

void fm_cuda_weights_shape(const fm_cuda_weights *w, int *n_experts, int *n, int *k, fm_format *fmt)
{
    if (!w) return;
    if (n_experts) *n_experts = w->n_experts;
    if (n) *n = w->n;
    if (k) *k = w->k;
    if (fmt) *fmt = w->fmt;
}

size_t fm_cuda_weights_bytes(const fm_cuda_weights *w)
{
    return w ? (w->data_bytes + w->scale_bytes) * (size_t)w->n_experts : 0;
}

int64_t fm_cuda_kpack_col(int64_t c)
{
    int64_t n = c & 63, pr = n >> 1;
    return (c & ~(int64_t)63) + (pr & 7) * 8 + (pr >> 3) * 2 + (n & 1);
}

fm_status fm_cuda_x_pack(const uint16_t *x, uint16_t *out, int rows, int k, void *stream)
{
    fm_clear_error();
    if (!x || !out || rows < 0 || k < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_x_pack: NULL pointer or negative size");
    if (x == out) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_x_pack: works out of place (x == out)");
    if (k % 64) return fm_fail(FM_ERR_BAD_SHAPE, "fm_cuda_x_pack: k=%d is not a multiple of 64", k);
    if ((uintptr_t)x % 16 || (uintptr_t)out % 16) return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_x_pack: x and out must be 16-byte aligned");
    int err = fm_x_pack_launch(x, out, rows, k, stream);
    if (err) return cuda_fail((cudaError_t)err, "fm_cuda_x_pack: launch");
    return FM_OK;
}

/* The call's device: the one it names, else the current one (device.c). */
static fm_status gemm_device(const fm_cuda_gemm_args *a, const fm_cuda_device **d)
{
    if (a->device) {
        *d = a->device;
        return FM_OK;
    }
    return fm_cuda_device_current(d);
}

size_t fm_cuda_split_counter_bytes(const fm_cuda_weights *w, int max_rows)
{
    if (!w || max_rows < 0) return 0;
    size_t cnt = ((size_t)max_rows / 8 + (size_t)w->n_experts + 1) * ((size_t)w->n / 16) * sizeof(int32_t);
    return (cnt + 255) / 256 * 256;
}

size_t fm_cuda_gemm_split_ws_bytes(const fm_cuda_weights *w, int max_rows, int k_splits)
{
    if (!w || k_splits < 2 || max_rows < 0) return 0;
    return fm_cuda_split_counter_bytes(w, max_rows) + (size_t)k_splits * (size_t)max_rows * (size_t)w->n * sizeof(float);
}

fm_status fm_cuda_gemm_choose(const fm_cuda_gemm_args *a, fm_tile *tile, int *feature_blocks, int *k_splits,
                              double *est_us)
{
    fm_clear_error();
    if (!a || !a->w || !tile) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_choose: NULL args, w or tile");
    if (a->feature_blocks < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_choose: feature_blocks=%d < 0", a->feature_blocks);
    const fm_cuda_device *dev;
    FM_CHECK(gemm_device(a, &dev));
    const fm_gpu_info *g = fm_cuda_device_plan_gpu(dev);
    size_t             limit = fm_cuda_device_limits(dev)->smem_block_optin;
    if (a->smem_limit && a->smem_limit < limit) limit = a->smem_limit;
    const fm_cuda_weights *w = a->w;
    const fm_pack_format *pf = fm_pack_format_get(w->fmt);
    if (!pf)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_choose: w is not prepacked FP4 weights (format %d)", (int)w->fmt);
    fm_fp4moe_query q = {.weights = pf->elem,
                         .x_packed = a->x_packed != 0,
                         .swiglu = a->epi == FM_CUDA_EPI_SWIGLU,
                         .feature_blocks = a->feature_blocks,
                         .smem_limit = limit,
                         .max_k_splits = a->k_splits == FM_CUDA_K_SPLITS_AUTO ? FM_CUDA_MAX_K_SPLITS : 0};
    fm_cuda_device_rows(dev, &q.mma_rows, &q.wgmma_rows);
    fm_fp4moe_choice c;
    size_t           n = 0;
    int              rows = a->expected_rows > 0 ? a->expected_rows : 1;
    int              ex = a->active_experts > 0 && a->active_experts < w->n_experts ? a->active_experts : w->n_experts;
    fm_status        st = fm_plan_fp4moe(g, &q, rows, w->n, w->k, ex, &c, 1, &n, NULL);
    if (st != FM_OK) return fm_fail(st, "fm_cuda_gemm: no tile for this call: %s", fm_last_error());
    *tile = c.tile;
    if (feature_blocks) *feature_blocks = c.feature_blocks;
    if (k_splits) *k_splits = c.k_splits > 1 ? c.k_splits : 1;
    if (est_us) *est_us = c.est_us;
    return FM_OK;
}

/* Feature blocks per CTA for tile t (index idx): -1 if a->feature_blocks > 1
 * asks for a multi-block kernel the tile does not have. Automatic: short K
 * (<= 512, at most 4 stages of 128 per block) with blocks to spare, i.e. so that
 * experts x blocks / nb still gives ~16 CTAs per SM of a 132-SM part. */
static int feature_blocks(const fm_cuda_gemm_args *a, const fm_tile *t, int idx, int sms)
{
    int has = !is_wgmma(t) && fm_swapab_has_mb(idx);
    if (a->feature_blocks > 1) return has ? a->feature_blocks : -1;
    if (a->feature_blocks == 1 || !has) return 1;
    return fm_plan_fp4moe_auto_blocks(t->warps, t->mt, a->epi == FM_CUDA_EPI_SWIGLU, a->w->n, a->w->k,
                                      a->w->n_experts, sms);
}

/* The tile checks of a launch (family, compiled in, wgmma on sm_90a, X / Y layouts, SwiGLU,
 * feature blocks, K splits, shared memory): *idx, *nb (feature blocks per CTA) and *bd on FM_OK.
 * chosen_nb: the planner's feature blocks (0: from a->feature_blocks). */
static fm_status check_tile(const fm_cuda_gemm_args *a, const fm_tile *t, int chosen_nb, int ks,
                            const fm_cuda_device *dev, size_t limit, int *idx_out, int *nb_out, fm_smem_breakdown *bd)
{
    const int cc = fm_cuda_device_limits(dev)->cc;
    const fm_cuda_weights *w = a->w;
    char name[64];
    if (t->family != FM_FAMILY_AUTO && t->family != FM_FAMILY_FP4MOE_SWAPAB && t->family != FM_FAMILY_FP4MOE_WGMMA)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: tile family %d is not fp4moe-swapab or fp4moe-wgmma",
                       (int)t->family);
    int wg = is_wgmma(t);
    int idx = wg ? fm_wgmma_tile_index(t) : fm_swapab_tile_index(t);
    if (idx < 0)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: tile %s is not compiled in (see %s)",
                       tile_name(t, name, sizeof name), wg ? "fm_wgmma_tiles" : "fm_swapab_tiles");
    if (!fm_cuda_device_has_tile(dev, wg, idx))
        return fm_fail(FM_ERR_NO_KERNEL,
                       "fm_cuda_gemm: tile %s has no code for this device (compute capability %d.%d) in this build "
                       "(targets %s)%s",
                       tile_name(t, name, sizeof name), cc / 10, cc % 10, fm_cuda_build_targets(),
                       wg ? ": wgmma exists on sm_90a only; use an mma tile" : "");
    if (a->x_packed && !wg)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: x_packed (X in the prepack K order) is read by the wgmma "
                                           "tiles only, not by %s",
                       tile_name(t, name, sizeof name));
    if (wg && !a->x_packed && fm_wgmma_persistent(idx))
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: %s (the persistent kernel) reads packed X only "
                                           "(x_packed, fm_cuda_x_pack); for natural X use a wgmma tile with persist = 0",
                       tile_name(t, name, sizeof name));
    if (a->x_packed && w->k % 64)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: x_packed needs K %% 64 == 0 (K=%d)", w->k);
    if (a->y_packed) {
        int width = a->epi == FM_CUDA_EPI_SWIGLU ? w->n / 2 : w->n;
        if (a->epi != FM_CUDA_EPI_NONE && a->epi != FM_CUDA_EPI_SWIGLU)
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: y_packed applies to the BF16 outputs (NONE, SWIGLU)");
        if (width % 64)
            return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: y_packed needs an output width %% 64 == 0 (%d)", width);
    }
    if (a->epi == FM_CUDA_EPI_SWIGLU && (t->mt % 2 || w->n % 32))
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: SwiGLU needs an even mt (tile %s) and N %% 32 == 0 (N=%d)",
                       tile_name(t, name, sizeof name), w->n);
    int nb = chosen_nb ? chosen_nb : ((ks > 1 && a->feature_blocks == 0) ? 1 : feature_blocks(a, t, idx, fm_cuda_device_limits(dev)->sms));
    if (nb < 0)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: feature_blocks=%d needs an mma tile with a multi-block "
                                           "kernel (include/fp4moe/cuda.h lists them); %s has none",
                       a->feature_blocks, tile_name(t, name, sizeof name));
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

fm_status fm_cuda_gemm_check_tile(const fm_cuda_gemm_args *a, const fm_tile *t, int k_splits)
{
    fm_clear_error();
    if (!a || !a->w || !t) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm_check_tile: NULL args, w or tile");
    if (k_splits < 1 || k_splits > FM_CUDA_MAX_K_SPLITS)
        return fm_fail(FM_ERR_INVALID_ARG, "k_splits=%d outside [1, %d]", k_splits, FM_CUDA_MAX_K_SPLITS);
    if (a->feature_blocks < 1)
        return fm_fail(FM_ERR_INVALID_ARG, "feature_blocks=%d < 1", a->feature_blocks);
    const fm_cuda_device *dev;
    FM_CHECK(gemm_device(a, &dev));
    size_t limit = fm_cuda_device_limits(dev)->smem_block_optin;
    if (a->smem_limit && a->smem_limit < limit) limit = a->smem_limit;
    int               idx, nb;
    fm_smem_breakdown bd;
    return check_tile(a, t, 0, k_splits, dev, limit, &idx, &nb, &bd);
}

fm_status fm_cuda_gemm(const fm_cuda_gemm_args *a)
{
    fm_clear_error();
    if (!a || !a->w || !a->x || !a->offsets)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: NULL args, w, x or offsets");
    /* y may be NULL only where nothing reads or writes it: FINALIZE_DET from zero into y_bf16 */
    if (!a->y && !(a->epi == FM_CUDA_EPI_FINALIZE_DET && a->y_zero_init && a->y_bf16))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: NULL y");
    if ((a->y_zero_init || a->y_bf16) && a->epi != FM_CUDA_EPI_FINALIZE_DET)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: y_zero_init / y_bf16 apply to FINALIZE_DET only");
    const fm_cuda_weights *w = a->w;
    const fm_pack_format  *pf = fm_pack_format_get(w->fmt); /* the weights' scale decode */
    if (!pf) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: w is not prepacked FP4 weights (format %d)", (int)w->fmt);
    if (a->max_rows < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: max_rows=%d < 0", a->max_rows);
    if (a->expert_slots < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: expert_slots=%d < 0 (0: every expert)", a->expert_slots);
    if ((uintptr_t)a->expert_list % 4)
        return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: expert_list is not 4-byte aligned");
    if (a->feature_blocks < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: feature_blocks=%d < 0", a->feature_blocks);
    if (a->k_splits < FM_CUDA_K_SPLITS_AUTO || a->k_splits > FM_CUDA_MAX_K_SPLITS)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: k_splits=%d outside [-1, %d] (-1: automatic)", a->k_splits,
                       FM_CUDA_MAX_K_SPLITS);
    if (a->k_splits > 1 && (!a->split_ws || a->split_ws_bytes < fm_cuda_gemm_split_ws_bytes(a->w, a->max_rows,
                                                                                              a->k_splits)))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: k_splits=%d needs split_ws of at least %zu bytes "
                                           "(fm_cuda_gemm_split_ws_bytes), got %zu%s",
                       a->k_splits, fm_cuda_gemm_split_ws_bytes(a->w, a->max_rows, a->k_splits), a->split_ws_bytes,
                       a->split_ws ? "" : " (NULL)");
    if ((uintptr_t)a->split_ws % 16)
        return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: split_ws is not 16-byte aligned");
    if ((uintptr_t)a->x % 16) return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: x is not 16-byte aligned");
    if ((int)a->epi < FM_CUDA_EPI_NONE || a->epi > FM_CUDA_EPI_FINALIZE_DET)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: unknown epilogue %d", (int)a->epi);
    if (a->epi == FM_CUDA_EPI_FINALIZE && (!a->row_weight || !a->row_token || a->n_tokens < 0))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: FINALIZE needs row_weight and row_token");
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET &&
        (!a->row_weight || !a->token_slots || !a->scratch || a->top_k < 1 || a->n_tokens < 0))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: FINALIZE_DET needs row_weight, token_slots, scratch, top_k");
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET && ((uintptr_t)a->y % 16 || (uintptr_t)a->scratch % 16 ||
                                               (uintptr_t)a->y_bf16 % 16))
        return fm_fail(FM_ERR_MISALIGNED, "fm_cuda_gemm: FINALIZE_DET output and scratch must be 16-byte aligned "
                                          "(they are read/written as float4)");
    /* experts (GEMM) and tokens (FINALIZE_DET reduce) are the grid's y dimension */
    if (w->n_experts > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: n_experts=%d > 65,535 (grid y limit)", w->n_experts);
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET && a->n_tokens > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: n_tokens=%d > 65,535 (grid y limit); split the batch",
                       a->n_tokens);
    const fm_cuda_device *dv;
    FM_CHECK(gemm_device(a, &dv));
    const fm_device_info *lim = fm_cuda_device_limits(dv);
    const int             dev = fm_cuda_device_ordinal(dv), cc = lim->cc, sms = lim->sms;
    size_t                limit = lim->smem_block_optin;
    if (a->smem_limit && a->smem_limit < limit) limit = a->smem_limit;
    fm_tile t;
    int     chosen_nb = 0, ks = a->k_splits > 1 ? a->k_splits : 1;
    if (a->tile) t = *a->tile;
    else FM_CHECK(fm_cuda_gemm_choose(a, &t, &chosen_nb, a->k_splits == FM_CUDA_K_SPLITS_AUTO ? &ks : NULL,
                                      NULL)); /* the planner's first candidate (fm_plan_fp4moe) */
    if (ks > 1 && (!a->split_ws || a->split_ws_bytes < fm_cuda_gemm_split_ws_bytes(w, a->max_rows, ks)))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_gemm: the planner chose k_splits=%d, which needs split_ws of "
                                           "%zu bytes (fm_cuda_gemm_split_ws_bytes), got %zu",
                       ks, fm_cuda_gemm_split_ws_bytes(w, a->max_rows, ks), a->split_ws_bytes);
    int               idx = -1, nb = 1, wg = is_wgmma(&t);
    fm_smem_breakdown bd;
    char              name[64];
    FM_CHECK(check_tile(a, &t, chosen_nb, ks, dv, limit, &idx, &nb, &bd));
    fm_gemm_params p = {
        .wdata = w->d_data, .wscale = w->d_scale, .oscale = w->d_oscale, .x = a->x, .offsets = a->offsets,
        .max_rows = a->max_rows, .n_experts = w->n_experts, .n = w->n, .k = w->k, .kp = w->kp,
        .sc_mul = pf->sc_mul, .sc_add = pf->sc_add, .epi = (int)a->epi,
        .x_packed = a->x_packed != 0, .y_packed = a->y_packed != 0, .y = a->y,
        .nb = nb, .row_weight = a->row_weight, .row_token = a->row_token, .scratch = a->scratch,
        .pdl = a->pdl && cc >= 90};
    /* the mma work-list kernel: split K and/or the expert list (the multi-block kernel
     * and the wgmma tiles take no list: they compute every expert with rows, the same) */
    fm_gemm_work work = {.ksplit = ks, .active = a->expert_list, .slots = a->expert_slots};
    const int    use_work = !wg && nb <= 1 && (ks > 1 || a->expert_list);
    if (ks > 1) { /* split_ws: the counters from its start, the partials at its end (so that
                   * calls of other shapes or row counts on one buffer never write partials
                   * over counters: cuda.h) */
        size_t part = (size_t)ks * (size_t)a->max_rows * (size_t)w->n * sizeof(float);
        work.split_cnt = (int *)a->split_ws;
        work.split_part = (float *)((unsigned char *)a->split_ws + ((a->split_ws_bytes - part) & ~(size_t)15));
    }
    if (wg && fm_wgmma_grid(idx, &p, sms) > 0x7FFFFFFFLL)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_gemm: %s would need %lld CTAs (> 2^31-1) for max_rows=%d",
                       tile_name(&t, name, sizeof name), fm_wgmma_grid(idx, &p, sms), a->max_rows);
    int err = wg ? fm_wgmma_launch(dev, sms, idx, &p, bd.total, a->stream)
                 : fm_swapab_launch(dev, idx, &p, use_work ? &work : NULL, bd.total, a->stream);
    if (err) return cuda_fail((cudaError_t)err, "fm_cuda_gemm: launch");
    if (a->epi == FM_CUDA_EPI_FINALIZE_DET) {
        err = fm_finalize_reduce_launch(a->scratch, a->token_slots, a->n_tokens, a->top_k, w->n, a->max_rows,
                                        a->y_zero_init ? NULL : (const float *)a->y, (float *)a->y, a->y_bf16,
                                        a->pdl_reduce && a->pdl && cc >= 90, a->stream);
        if (err) return cuda_fail((cudaError_t)err, "fm_cuda_gemm: finalize reduce launch");
    }
    return FM_OK;
}

fm_status fm_cuda_tile_attributes(const fm_tile *t, fm_format fmt, size_t *static_smem, size_t *max_dynamic_smem)
{
    fm_clear_error();
    (void)fmt; /* one kernel serves both formats (scale decode constants are parameters) */
    if (!t) return fm_fail(FM_ERR_INVALID_ARG, "fm_cuda_tile_attributes: t is NULL");
    int wg = is_wgmma(t);
    int idx = wg ? fm_wgmma_tile_index(t) : fm_swapab_tile_index(t);
    if (idx < 0) return fm_fail(FM_ERR_UNSUPPORTED, "fm_cuda_tile_attributes: tile not compiled in");
    int err = wg ? fm_wgmma_attributes(idx, 1, static_smem, max_dynamic_smem) /* the packed-X kernel */
                 : fm_swapab_attributes(idx, static_smem, max_dynamic_smem);
    if (err) return cuda_fail((cudaError_t)err, "fm_cuda_tile_attributes");
    return FM_OK;
}
