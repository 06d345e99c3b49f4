/* backend_cuda.c - the "cuda" backend: the routed MoE layer on the GPU, as a
 * serving engine calls it (fp4moe/layer.h: fm_layer_run).
 *
 * run(x[T][H] on the device, the caller's stream): launches only, no host
 * round trip, no allocation, no planning (CUDA-graph capturable):
 *   1. internal routing: router logits (route.cu, bit-identical to the CPU's),
 *      then scores, bias, group limit, top-k, weights as fm_moe_route (a NaN/Inf
 *      logit is recorded on the device); external routing: the caller's
 *      topk_ids / topk_weights are read directly by step 2;
 *   2. the stable permutation of the shard's local slots (fm_moe_permute's
 *      order): offsets, perm, row weights, token slots (-1 for slots left out:
 *      id -1, another shard's expert, a bad id, which is counted);
 *   3. gather the routed rows into expert order (NaN/Inf in x recorded);
 *   4. FC1 + SwiGLU: fm_cuda_gemm(FM_CUDA_EPI_SWIGLU) -> h[rows][inter] BF16
 *      (X gathered and h written in the prepack K order where the planner
 *      prefers the packed-X wgmma kernel);
 *   5. the BF16 shared expert (the shard holding expert 0 only);
 *   6. FC2 + FINALIZE_DET: out[t] = (shared) + sum over t's local slots of
 *      weight * (h . W2^T) in slot order (deterministic), FP32 or BF16.
 * Tiles: chosen at create time for every batch-size bucket (T a power of two up
 * to max_tokens; the planner's ranking for the rows per expert and the active
 * experts each bucket gives, K split over several CTAs where few experts leave
 * SMs idle); run looks its bucket up. The GEMMs get max_rows = T * top_k: the row
 * counts live only on the device (offsets).
 * Devices: every CUDA call runs with the layer's device current and restores
 * the caller's device. fm_layer_forward (host pointers) runs on a private
 * stream of the layer: upload, run, one sync, the error word, download.
 * Not done yet: act_nvfp4, gpt-oss's softmax-topk routing and its experts (clamped SwiGLU,
 * expert biases): create returns FM_ERR_UNSUPPORTED.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_internal.h"
#include "cuda/gemm_plan.h"
#include "cuda/layer_cuda.h"
#include "cuda/moe_kernels.h"

fm_status fm_cuda_layer_fail(int err, const char *what)
{
    const cudaError_t e = (cudaError_t)err;
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) return fm_fail(FM_ERR_OOM, "cuda backend: %s: %s", what, cudaGetErrorString(e));
    return fm_fail(FM_ERR_CUDA, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

static fm_status cuda_available(void)
{
    int n = 0;
    if (fm_device_count(&n) != FM_OK)
        return fm_fail(FM_ERR_NO_DEVICE, "cuda backend: no usable CUDA device (%s)", fm_last_error());
    return FM_OK;
}

static size_t take(size_t *at, size_t bytes)
{
    size_t o = *at;
    *at += (bytes + FM_WS_ALIGN - 1) / FM_WS_ALIGN * FM_WS_ALIGN;
    return o;
}

static fm_ws_layout layout_of(const fm_layer_params *p)
{
    const fm_moe_config *c = &p->cfg;
    const size_t T = (size_t)p->max_tokens, R = T * c->top_k, E = (size_t)c->n_experts, H = (size_t)c->hidden,
                 I = (size_t)c->inter, S = p->first == 0 ? (size_t)c->shared_inter : 0;
    fm_ws_layout l;
    size_t    at = 0;
    l.xp = take(&at, sizeof(uint16_t) * R * H);
    l.h = take(&at, sizeof(uint16_t) * R * I);
    l.logits = take(&at, sizeof(float) * T * E);
    l.out32 = take(&at, sizeof(float) * T * H);
    l.scratch = take(&at, sizeof(float) * R * H);
    l.rw = take(&at, sizeof(float) * R);
    l.off = take(&at, sizeof(int32_t) * ((size_t)p->n_local + 1));
    l.perm = take(&at, sizeof(int32_t) * R);
    l.slots = take(&at, sizeof(int32_t) * R);
    l.ids = take(&at, sizeof(int32_t) * R);
    l.wts = take(&at, sizeof(float) * R);
    l.rscratch = take(&at, fm_moe_route_scratch_bytes(c, p->max_tokens));
    l.pscratch = take(&at, fm_moe_permute_scratch_bytes(p->max_tokens, c->top_k, p->n_local) + 4);
    l.hs = take(&at, sizeof(float) * (T * S + 1));
    l.badlogit = take(&at, sizeof(unsigned long long));
    l.active = take(&at, sizeof(int32_t) * ((size_t)p->n_local + 1));
    l.total = at;
    return l;
}

static void cuda_destroy(void *ptr)
{
    fm_cuda_layer *s = ptr;
    if (!s) return;
    int prev = -1;
    if (fm_cuda_device_enter(s->dev, &prev) != FM_OK) prev = -1;
    fm_cuda_weights_destroy(s->w13);
    fm_cuda_weights_destroy(s->w2);
    void *dev[] = {s->d_router, s->d_bias, s->d_sw13, s->d_sw2, s->d_err, s->ws_own, s->d_xstage, s->d_ostage,
                   s->d_split};
    for (size_t i = 0; i < FM_ARRAY_LEN(dev); i++) cudaFree(dev[i]);
    if (s->ev0) cudaEventDestroy(s->ev0);
    if (s->ev1) cudaEventDestroy(s->ev1);
    if (s->own_stream) cudaStreamDestroy(s->own_stream);
    fm_cuda_device_leave(s->dev, prev);
    free(s);
}

/* The split buffer the plans need: counters of the larger GEMM at the largest split
 * bucket + the largest partials (cuda.h's layout lets FC1 and FC2 share it, one after
 * the other). */
static size_t split_need(const fm_cuda_layer *s, const fm_bucket_plan *plans)
{
    size_t cnt_max = 0, part_max = 0;
    for (int b = 0; b < s->n_buckets; b++) {
        const int              R = fm_layer_bucket_tokens(s->p.max_tokens, b) * s->p.cfg.top_k; /* a bucket's runs have at most T tokens */
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

static fm_status cuda_gemm_choose(void *state, int g, const fm_gemm_hint *h, fm_tile *tile, int *feature_blocks,
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

static int cuda_packed_x_ok(void *state, int g)
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

static fm_status cuda_install(void *state, const fm_layer_plan_info *plans, int n)
{
    fm_cuda_layer *s = state;
    int            prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = install_on(s, plans, n);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

static fm_status create_on_device(fm_cuda_layer *s, const fm_moe_weights *w)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *cfg = &p->cfg;
    const int E = cfg->n_experts, H = cfg->hidden, L = p->n_local, S = p->first == 0 ? cfg->shared_inter : 0;
    cudaError_t e = cudaSuccess;
    FM_CHECK(fm_cuda_weights_create(w->w13, L, &s->w13));
    FM_CHECK(fm_cuda_weights_create(w->w2, L, &s->w2));
#define DALLOC(ptr, bytes) \
    if ((e = cudaMalloc((void **)&(ptr), (bytes))) != cudaSuccess) return fm_cuda_layer_fail(e, "cudaMalloc")
#define UPLOAD(dst, src, bytes) \
    if ((e = cudaMemcpy((dst), (src), (bytes), cudaMemcpyHostToDevice)) != cudaSuccess) return fm_cuda_layer_fail(e, "upload")
    DALLOC(s->d_router, sizeof(float) * (size_t)E * H);
    UPLOAD(s->d_router, w->router_w, sizeof(float) * (size_t)E * H);
    if (w->router_bias) {
        DALLOC(s->d_bias, sizeof(float) * (size_t)E);
        UPLOAD(s->d_bias, w->router_bias, sizeof(float) * (size_t)E);
        for (int i = 0; i < E && s->bad_bias < 0; i++)
            if (!isfinite(w->router_bias[i])) {
                s->bad_bias = i;
                s->bad_bias_value = w->router_bias[i];
            }
    }
    if (S > 0) {
        DALLOC(s->d_sw13, sizeof(uint16_t) * 2 * (size_t)S * H);
        DALLOC(s->d_sw2, sizeof(uint16_t) * (size_t)S * H);
        UPLOAD(s->d_sw13, w->shared_w13, sizeof(uint16_t) * 2 * (size_t)S * H);
        UPLOAD(s->d_sw2, w->shared_w2, sizeof(uint16_t) * (size_t)S * H);
    }
    DALLOC(s->d_err, sizeof(fm_moe_dev_errors));
    s->ws = layout_of(p);
    if (!p->caller_workspace) DALLOC(s->ws_own, s->ws.total);
    DALLOC(s->d_xstage, sizeof(uint16_t) * (size_t)p->max_tokens * H);
    DALLOC(s->d_ostage, sizeof(float) * (size_t)p->max_tokens * H);
#undef DALLOC
#undef UPLOAD
    if ((e = cudaStreamCreateWithFlags(&s->own_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreate(&s->ev0)) != cudaSuccess || (e = cudaEventCreate(&s->ev1)) != cudaSuccess)
        return fm_cuda_layer_fail(e, "stream/event create");
    int le = fm_moe_dev_errors_reset_launch(s->d_err, s->own_stream);
    if (le || (e = cudaStreamSynchronize(s->own_stream)) != cudaSuccess)
        return fm_cuda_layer_fail(le ? (cudaError_t)le : e, "clear the error word");
    /* the uploads (cudaMemcpy from pageable memory may return before its DMA lands) ran on
     * the legacy stream, which a caller's non-blocking stream does not wait for */
    if ((e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) return fm_cuda_layer_fail(e, "upload");
    return FM_OK;
}

static fm_status cuda_create(const fm_layer_params *p, const fm_moe_weights *w, void **state)
{
    const fm_moe_config *cfg = &p->cfg;
    if (cfg->act_nvfp4) return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: act_nvfp4 (W4A4) is not implemented yet");
    if (cfg->score == FM_SCORE_SOFTMAX_TOPK) /* route.cu knows softmax and sigmoid only */
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "cuda backend: score softmax-topk (gpt-oss routing) is not implemented; use a CPU backend");
    if (cfg->activation != FM_ACT_SWIGLU || w->w13_bias || w->w2_bias) /* the GEMM epilogues: plain SwiGLU, no bias */
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "cuda backend: gpt-oss's clamped SwiGLU and expert biases are not implemented in the GPU "
                       "kernels; use a CPU backend");
    if (cfg->shared_inter % 16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: shared_inter=%d must be a multiple of 16", cfg->shared_inter);
    if (cfg->wfmt == FM_FORMAT_BF16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: BF16 routed experts are not supported (FP4 only)");
    /* The gather and the deterministic finalize put routed rows / tokens on the
     * grid's y dimension (at most 65,535); bigger batches are split by the caller. */
    if ((int64_t)p->max_tokens * cfg->top_k > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "cuda backend: max_tokens=%d x top_k=%d = %lld routed rows > 65,535 per run (grid y limit); "
                       "run the batch in chunks",
                       p->max_tokens, cfg->top_k, (long long)p->max_tokens * cfg->top_k);
    if (cfg->n_experts > 65535)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: n_experts=%d > 65,535 (grid y limit)", cfg->n_experts);
    if (cfg->hidden % 16 || cfg->inter % 16)
        return fm_fail(FM_ERR_UNSUPPORTED, "cuda backend: hidden=%d and inter=%d must be multiples of 16", cfg->hidden,
                       cfg->inter);
    fm_cuda_layer *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(FM_ERR_OOM, "cuda backend: out of host memory");
    s->p = *p;
    s->dev = p->device;
    s->bad_bias = -1;
    /* fm_layer_desc.pdl_chain: on where the device has PDL (layer.h says what it gains) */
    s->pdl_chain = p->pdl_chain != FM_PDL_CHAIN_OFF && fm_cuda_device_limits(s->dev)->cc >= 90;
    int       prev = -1;
    fm_status st = fm_cuda_device_enter(s->dev, &prev);
    if (st != FM_OK) {
        free(s);
        return st;
    }
    st = create_on_device(s, w);
    fm_cuda_device_leave(s->dev, prev);
    if (st != FM_OK) {
        cuda_destroy(s);
        return st;
    }
    *state = s;
    return FM_OK;
}

/* T's bucket among the installed ones (T up to max_tokens: the last holds it) */
static int bucket_of(const fm_cuda_layer *s, int T)
{
    const int b = fm_layer_bucket_of(T);
    return b < s->n_buckets ? b : s->n_buckets - 1;
}

/* Enqueue one run on `stream` (the layer's device is current). */
fm_status fm_cuda_layer_enqueue(fm_cuda_layer *s, const fm_layer_run_args *a, void *stream)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *c = &p->cfg;
    const int T = a->T, E = c->n_experts, H = c->hidden, K = c->top_k, L = p->n_local, R = T * K;
    const int shared = p->first == 0 && c->shared_inter > 0;
    unsigned char *ws = a->workspace ? (unsigned char *)a->workspace : (unsigned char *)s->ws_own;
    uint16_t *xp = (uint16_t *)(ws + s->ws.xp), *h = (uint16_t *)(ws + s->ws.h);
    float    *logits = (float *)(ws + s->ws.logits), *out32 = (float *)(ws + s->ws.out32);
    float    *scratch = (float *)(ws + s->ws.scratch), *rw = (float *)(ws + s->ws.rw);
    int32_t  *off = (int32_t *)(ws + s->ws.off), *perm = (int32_t *)(ws + s->ws.perm);
    int32_t  *slots = (int32_t *)(ws + s->ws.slots), *ids = (int32_t *)(ws + s->ws.ids);
    float    *wts = (float *)(ws + s->ws.wts), *hs = (float *)(ws + s->ws.hs);
    unsigned long long *badlogit = (unsigned long long *)(ws + s->ws.badlogit);
    int32_t            *active = (int32_t *)(ws + s->ws.active); /* the experts with rows: the GEMMs' work list */
    const fm_bucket_plan  *pl = &s->plan[bucket_of(s, T)];
    int le;

    const int32_t *rid = a->topk_ids;
    const float   *rwt = a->topk_weights;
    const unsigned long long *bl = NULL;
    if (!rid) {
        if (s->bad_bias >= 0) /* what fm_moe_route says for it, before any work */
            return fm_fail(FM_ERR_NONFINITE, "cuda backend: router_bias[%d] = %g is not finite", s->bad_bias,
                           (double)s->bad_bias_value);
        if ((le = fm_moe_router_logits_launch(a->x, s->d_router, T, E, H, logits, stream)) != 0)
            return fm_cuda_layer_fail(le, "router logits");
        if (a->routed_ids) ids = a->routed_ids, wts = a->routed_weights; /* the caller keeps the routing */
        if ((le = fm_moe_route_launch(c, s->d_bias, logits, T, ids, wts, ws + s->ws.rscratch, badlogit, stream)) != 0)
            return fm_cuda_layer_fail(le, "routing");
        rid = ids, rwt = wts, bl = badlogit;
    }
    if ((le = fm_moe_permute_launch(rid, rwt, T, K, L, p->first, E, off, perm, slots, rw, NULL, ws + s->ws.pscratch,
                                    s->d_err, bl, pl->slots ? active : NULL, stream)) != 0)
        return fm_cuda_layer_fail(le, "permutation");
    if ((le = fm_moe_gather_launch(a->x, perm, R, K, H, pl->pk1, xp, off + L, &s->d_err->first_nonfinite_x,
                                   s->pdl_chain, stream)) != 0)
        return fm_cuda_layer_fail(le, "gather");
    /* PDL (sm_90+, in the plans): each GEMM's CTAs take the SM slots the kernel before it frees */
    const fm_gemm_operands o1 = {.w = s->w13, .x = xp, .offsets = off, .max_rows = R, .y = h,
                                 .split_ws = s->d_split, .split_ws_bytes = s->split_bytes,
                                 .expert_list = pl->slots ? active : NULL};
    FM_CHECK(fm_cuda_gemm_launch(s->dev, &pl->g[0], &o1, stream));
    const int bf16 = p->out_dtype == FM_OUT_BF16;
    float    *acc = bf16 ? out32 : (float *)a->out; /* FP32 sums: the caller's out, or ours for BF16 */
    if (shared) {
        cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * (size_t)T * H, (cudaStream_t)stream);
        if (e != cudaSuccess) return fm_cuda_layer_fail(e, "clear out");
        if ((le = fm_moe_shared_expert_launch(a->x, s->d_sw13, s->d_sw2, T, H, c->shared_inter, hs, acc, stream)) != 0)
            return fm_cuda_layer_fail(le, "shared expert");
    }
    const fm_gemm_operands o2 = {.w = s->w2, .x = h, .offsets = off, .max_rows = R,
                                 .y = bf16 && !shared ? NULL : acc, .y_zero_init = !shared,
                                 .y_bf16 = bf16 ? (uint16_t *)a->out : NULL, .row_weight = rw, .n_tokens = T,
                                 .top_k = K, .token_slots = slots, .scratch = scratch,
                                 .split_ws = s->d_split, .split_ws_bytes = s->split_bytes,
                                 .expert_list = pl->slots ? active : NULL};
    return fm_cuda_gemm_launch(s->dev, &pl->g[1], &o2, stream);
}

static fm_status cuda_run(void *ptr, const fm_layer_run_args *a, fm_run_stats *stats)
{
    (void)stats;
    fm_cuda_layer *s = ptr;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = fm_cuda_layer_enqueue(s, a, a->stream);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

/* Read and clear the error word (stream already synchronised by the caller). */
fm_status fm_cuda_layer_read_errors(fm_cuda_layer *s, cudaStream_t stream, fm_layer_error_info *info)
{
    fm_moe_dev_errors h;
    cudaError_t       e = cudaMemcpyAsync(&h, s->d_err, sizeof h, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) {
        int le = fm_moe_dev_errors_reset_launch(s->d_err, stream);
        e = le ? (cudaError_t)le : cudaStreamSynchronize(stream);
    }
    if (e != cudaSuccess) return fm_cuda_layer_fail(e, "read the error word");
    const int E = s->p.cfg.n_experts, K = s->p.cfg.top_k, H = s->p.cfg.hidden;
    if (info) {
        info->bad_ids = (long long)h.bad_ids;
        info->first_bad_slot = h.first_bad_slot == ~0ull ? -1 : (long long)h.first_bad_slot;
        info->nonfinite_x = h.first_nonfinite_x != ~0ull;
        info->first_nonfinite = h.first_nonfinite_x == ~0ull ? -1 : (long long)h.first_nonfinite_x;
        info->nonfinite_logits = h.bad_logit != ~0ull;
        info->nonfinite_weights = (long long)h.nonfinite_w;
    }
    if (h.bad_ids)
        return fm_fail(FM_ERR_OUT_OF_RANGE,
                       "cuda backend: %llu routed slot(s) had an expert id outside [-1, %d) (first: topk_ids[%llu][%llu]); "
                       "they were skipped", h.bad_ids, E, h.first_bad_slot / K, h.first_bad_slot % K);
    if (h.first_nonfinite_x != ~0ull)
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: x[%llu][%llu] is NaN or Inf", h.first_nonfinite_x / H,
                       h.first_nonfinite_x % H);
    if (h.bad_logit != ~0ull) /* the CPU backends' check and message (fm_moe_route_tokens) */
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: router logit [%llu][%llu] overflowed (inputs too large)",
                       h.bad_logit / (unsigned long long)E, h.bad_logit % (unsigned long long)E);
    if (h.nonfinite_w)
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: %llu topk_weights of local slots were NaN or Inf",
                       h.nonfinite_w);
    return FM_OK;
}

static fm_status cuda_errors(void *ptr, void *stream, fm_layer_error_info *info)
{
    fm_cuda_layer *s = ptr;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    fm_status   st = e != cudaSuccess ? fm_cuda_layer_fail(e, "an earlier run failed") : fm_cuda_layer_read_errors(s, (cudaStream_t)stream, info);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

static fm_status forward_host_on(fm_cuda_layer *s, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    const int    H = s->p.cfg.hidden;
    cudaStream_t st = s->own_stream;
    cudaError_t  e;
    if ((e = cudaMemcpyAsync(s->d_xstage, x, sizeof(uint16_t) * (size_t)T * H, cudaMemcpyHostToDevice, st)) !=
        cudaSuccess)
        return fm_cuda_layer_fail(e, "upload x");
    cudaEventRecord(s->ev0, st);
    fm_layer_run_args a = {.x = s->d_xstage, .T = T, .out = s->d_ostage};
    FM_CHECK(fm_cuda_layer_enqueue(s, &a, st));
    cudaEventRecord(s->ev1, st);
    if ((e = cudaStreamSynchronize(st)) != cudaSuccess) return fm_cuda_layer_fail(e, "forward");
    FM_CHECK(fm_cuda_layer_read_errors(s, st, NULL));
    /* copy out only now: `out` stays untouched on every failure above */
    if ((e = cudaMemcpy(out, s->d_ostage, sizeof(float) * (size_t)T * H, cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fm_cuda_layer_fail(e, "download out");
    if (stats) {
        float ms = 0;
        cudaEventElapsedTime(&ms, s->ev0, s->ev1);
        stats->ms = ms;
    }
    return FM_OK;
}

static fm_status cuda_forward_host(void *ptr, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    fm_cuda_layer *s = ptr;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = forward_host_on(s, x, T, out, stats);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

static size_t cuda_workspace_bytes(void *ptr) { return ((fm_cuda_layer *)ptr)->ws.total; }

static fm_status cuda_plan(void *state, int T, fm_layer_plan_info *info)
{
    const fm_cuda_layer  *s = state;
    const int          b = bucket_of(s, T);
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
static fm_status cuda_set_plan(void *state, int T, const fm_layer_plan_info *info)
{
    fm_cuda_layer          *s = state;
    const fm_moe_config *c = &s->p.cfg;
    const int            b = bucket_of(s, T);
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

static fm_status cuda_set_plan_on(void *state, int T, const fm_layer_plan_info *info)
{
    fm_cuda_layer *s = state;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = cuda_set_plan(s, T, info);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

const fm_backend_ops fm_cuda_ops = {.name = "cuda",
                                    .available = cuda_available,
                                    .create = cuda_create,
                                    .run = cuda_run,
                                    .forward_host = cuda_forward_host,
                                    .errors = cuda_errors,
                                    .gemm_choose = cuda_gemm_choose,
                                    .packed_x_ok = cuda_packed_x_ok,
                                    .install = cuda_install,
                                    .plan = cuda_plan,
                                    .set_plan = cuda_set_plan_on,
                                    .tune_begin = fm_cuda_tune_begin,
                                    .tune_time = fm_cuda_tune_time,
                                    .tune_end = fm_cuda_tune_end,
                                    .tune_tiles = fm_cuda_tune_tiles,
                                    .workspace_bytes = cuda_workspace_bytes,
                                    .destroy = cuda_destroy};
