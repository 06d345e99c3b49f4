/* layer_run.c - the cuda layer's run (backend_cuda.c's header lists the steps): the
 * launches of one forward on the caller's stream, the same chain on dispatched rows
 * (fm_layer_run_dispatched), the error word, and fm_layer_forward's host-pointer path
 * on the layer's own stream. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/decode.h"
#include "cuda/gemm_fp8.h"
#include "cuda/layer_cuda.h"
#include "fm_internal.h"

/* A W4A8 layer's dispatched rows (fm_cuda_layer_run_dispatched): compiled always, run where
 * the build enables them (cmake -DFM_CUDA_W4A8_DISPATCH, ON by default since test_cuda_dispatch's
 * W4A8 cases passed on the H100, 2026-12-07), refused in a build with it OFF */
#ifndef FM_CUDA_W4A8_DISPATCH /* CMakeLists.txt defines it, 0 or 1, from the option */
#error "FM_CUDA_W4A8_DISPATCH is not defined: build with CMake (option FM_CUDA_W4A8_DISPATCH, ON by default)"
#endif

/* The shared expert (the shard holding expert 0): its sums into out (FP32 out) or out32 (BF16
 * out, where the routed sums then start), cleared first; *acc = where they are, NULL without
 * one. */
static fm_status shared_expert(fm_cuda_layer *s, const fm_layer_run_args *a, float **acc, void *stream)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *c = &p->cfg;
    unsigned char *ws = fm_cuda_layer_ws(s, a->workspace);
    *acc = NULL;
    if (p->first != 0 || c->shared_inter <= 0) return FM_OK;
    *acc = p->out_dtype == FM_OUT_BF16 ? (float *)(ws + s->ws.out32) : (float *)a->out;
    const int   T = a->T, H = c->hidden;
    cudaError_t e = cudaMemsetAsync(*acc, 0, sizeof(float) * (size_t)T * H, (cudaStream_t)stream);
    if (e != cudaSuccess) return fm_cuda_layer_fail(e, "clear out");
    int le = fm_moe_shared_expert_launch(a->x, s->d_sw13, s->d_sw2, T, H, c->shared_inter,
                                         (float *)(ws + s->ws.hs), *acc, stream);
    return le ? fm_cuda_layer_fail(le, "shared expert") : FM_OK;
}

/* W4A8 (act_fp8): the chain on FP8 activations, in the buckets whose plan says fp8 (every
 * bucket unless desc.act_fp8_path allows W4A16; no decode kernel, no plan's
 * tiles: the W4A8 GEMM has one kernel family, gemm_fp8.cu, its kernel chosen per launch):
 *   permute (as the BF16 chain) -> x[perm[p] / top_k] quantized to E4M3 codes + FP32 scales
 *   (w4a8_quantize_x) -> the experts (w4a8_experts) -> the slot-order reduce
 *   (fm_finalize_reduce_launch, deterministic) over the shared expert's sums or zero.
 * The experts, on rows p < off[L] whose FP8 codes and scales are in the workspace's xq / xsc:
 *   FC1 on the FP8 MMA into FP32 y1[p][2I] -> gate / up global scales, FC1 bias, SwiGLU (or
 *   gpt-oss's) in FP32 and quantized again for FC2 in the same pass (fm_w4a8_act_fp8_launch:
 *   h never goes through memory in FP32; a NaN/Inf h recorded: FC2's input overflowed) -> FC2 on the FP8 MMA, its epilogue
 *   (acc x global + FC2 bias) x routing weight into scratch[p]. */
static fm_status w4a8_experts(fm_cuda_layer *s, unsigned char *ws, int R, void *stream)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *c = &p->cfg;
    const int H = c->hidden, I = c->inter, L = p->n_local, blk = c->act_fp8 == FM_ACT_FP8_BLOCK128;
    const int bh = fm_act_fp8_nscales(c->act_fp8, H), bi = fm_act_fp8_nscales(c->act_fp8, I);
    float    *scratch = (float *)(ws + s->ws.scratch), *rw = (float *)(ws + s->ws.rw);
    int32_t  *off = (int32_t *)(ws + s->ws.off);
    uint8_t  *xq = ws + s->ws.xq, *hq = ws + s->ws.hq;
    float    *xsc = (float *)(ws + s->ws.xsc), *y1 = (float *)(ws + s->ws.y1);
    float    *hsc = (float *)(ws + s->ws.hsc);
    int       le;
    fm_fp8mma_args g1 = {.wq = s->q8.q13, .wexp = s->q8.sc13, .xq = xq, .xs = xsc, .offsets = off, .y = y1, .E = L,
                         .N = 2 * I, .K = H, .ldx = H, .ldxs = bh, .xs_per_128 = blk, .max_rows = R, .fmt = c->wfmt,
                         .wsp = s->q8.sp13, .kernel = s->q8.kernel};
    if ((le = fm_fp8mma_launch(&g1, stream)) != 0) return fm_cuda_layer_fail(le, "W4A8 FC1");
    if ((le = fm_w4a8_act_fp8_launch(y1, off, L, R, I, s->q8.gs13, s->q8.us13, s->d_b13, (int)c->activation,
                                     c->swiglu_limit, c->act_fp8, hq, hsc, bi, &s->d_err->nonfinite_h, stream)) != 0)
        return fm_cuda_layer_fail(le, "W4A8 activation and FP8 of FC2's input");
    fm_fp8mma_args g2 = {.wq = s->q8.q2, .wexp = s->q8.sc2, .oscale = s->q8.osc2, .xq = hq, .xs = hsc, .offsets = off,
                         .y = scratch, .E = L, .N = H, .K = I, .ldx = I, .ldxs = bi, .xs_per_128 = blk, .max_rows = R,
                         .fmt = c->wfmt, .bias = s->d_b2, .row_weight = rw, .wsp = s->q8.sp2, .kernel = s->q8.kernel};
    if ((le = fm_fp8mma_launch(&g2, stream)) != 0) return fm_cuda_layer_fail(le, "W4A8 FC2");
    return FM_OK;
}

/* BF16 rows x[perm[p] / top_k] (p < off[L]) quantized to FP8 into the workspace's xq / xsc, the
 * W4A8 experts' input (act_fp8.cu, the oracle's numbers bit for bit; a NaN/Inf element
 * recorded as the gather records it) */
static int w4a8_quantize_x(fm_cuda_layer *s, unsigned char *ws, const uint16_t *x, const int32_t *perm, int top_k,
                           int rows, void *stream)
{
    const fm_moe_config *c = &s->p.cfg;
    return fm_act_fp8_launch(x, NULL, perm, top_k, rows, (int32_t *)(ws + s->ws.off) + s->p.n_local, c->hidden,
                             c->act_fp8, ws + s->ws.xq, c->hidden, (float *)(ws + s->ws.xsc),
                             fm_act_fp8_nscales(c->act_fp8, c->hidden), &s->d_err->first_nonfinite_x, stream);
}

static fm_status enqueue_w4a8(fm_cuda_layer *s, const fm_layer_run_args *a, const int32_t *rid, const float *rwt,
                              const unsigned long long *bl, void *stream)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *c = &p->cfg;
    const int T = a->T, E = c->n_experts, H = c->hidden, K = c->top_k, L = p->n_local, R = T * K;
    unsigned char *ws = fm_cuda_layer_ws(s, a->workspace);
    float    *scratch = (float *)(ws + s->ws.scratch), *rw = (float *)(ws + s->ws.rw);
    int32_t  *off = (int32_t *)(ws + s->ws.off), *perm = (int32_t *)(ws + s->ws.perm);
    int32_t  *slots = (int32_t *)(ws + s->ws.slots);
    int       le;
    if ((le = fm_moe_permute_launch(rid, rwt, T, K, L, p->first, E, off, perm, slots, rw, NULL, ws + s->ws.pscratch,
                                    s->d_err, bl, NULL, stream)) != 0)
        return fm_cuda_layer_fail(le, "permutation");
    if ((le = w4a8_quantize_x(s, ws, a->x, perm, K, R, stream)) != 0) return fm_cuda_layer_fail(le, "FP8 gather of x");
    float *acc; /* the shared expert's sums, where the reduce starts (NULL: none) */
    FM_CHECK(shared_expert(s, a, &acc, stream));
    FM_CHECK(w4a8_experts(s, ws, R, stream));
    const int bf16 = p->out_dtype == FM_OUT_BF16;
    if ((le = fm_finalize_reduce_launch(scratch, slots, T, K, H, R, acc, bf16 ? NULL : (float *)a->out,
                                        bf16 ? (uint16_t *)a->out : NULL, 0, stream)) != 0)
        return fm_cuda_layer_fail(le, "reduce");
    return FM_OK;
}

/* Enqueue one run on `stream` (the layer's device is current). */
fm_status fm_cuda_layer_enqueue(fm_cuda_layer *s, const fm_layer_run_args *a, void *stream)
{
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *c = &p->cfg;
    const int T = a->T, E = c->n_experts, H = c->hidden, K = c->top_k, L = p->n_local, R = T * K;
    const int shared = p->first == 0 && c->shared_inter > 0;
    unsigned char *ws = fm_cuda_layer_ws(s, a->workspace);
    uint16_t *xp = (uint16_t *)(ws + s->ws.xp), *h = (uint16_t *)(ws + s->ws.h);
    float    *logits = (float *)(ws + s->ws.logits), *out32 = (float *)(ws + s->ws.out32);
    float    *scratch = (float *)(ws + s->ws.scratch), *rw = (float *)(ws + s->ws.rw);
    int32_t  *off = (int32_t *)(ws + s->ws.off), *perm = (int32_t *)(ws + s->ws.perm);
    int32_t  *slots = (int32_t *)(ws + s->ws.slots), *ids = (int32_t *)(ws + s->ws.ids);
    float    *wts = (float *)(ws + s->ws.wts);
    unsigned long long *badlogit = (unsigned long long *)(ws + s->ws.badlogit);
    int32_t            *active = (int32_t *)(ws + s->ws.active); /* the experts with rows: the GEMMs' work list */
    const fm_bucket_plan  *pl = &s->plan[fm_cuda_layer_bucket(s, T)];
    int le;

    const int32_t *rid = a->topk_ids;
    const float   *rwt = a->topk_weights;
    const unsigned long long *bl = NULL;
    if (!rid) {
        if (s->bad_bias >= 0) /* what fm_moe_route says for it, before any work */
            return fm_fail(FM_ERR_NONFINITE, "cuda backend: router_bias[%d] = %g is not finite", s->bad_bias,
                           (double)s->bad_bias_value);
        if (a->routed_ids) ids = a->routed_ids, wts = a->routed_weights; /* the caller keeps the routing */
        /* T <= 4: logits and routing in one launch where it applies (-1: it does not) */
        le = fm_moe_route_fused_launch(c, s->d_bias, a->x, s->d_router, T, logits, ids, wts, badlogit, s->d_ticket, stream);
        if (le > 0) return fm_cuda_layer_fail(le, "router logits and routing");
        if (le < 0) {
            if ((le = fm_moe_router_logits_launch(a->x, s->d_router, T, E, H, logits, stream)) != 0)
                return fm_cuda_layer_fail(le, "router logits");
            if ((le = fm_moe_route_launch(c, s->d_bias, logits, T, ids, wts, ws + s->ws.rscratch, badlogit, stream)) != 0)
                return fm_cuda_layer_fail(le, "routing");
        }
        rid = ids, rwt = wts, bl = badlogit;
    }
    if (s->w4a8 && pl->fp8) return enqueue_w4a8(s, a, rid, rwt, bl, stream);
    if (pl->decode) { /* one launch: routing, FC1, FC2 and the finalize (decode.cu) */
        const int bf16 = p->out_dtype == FM_OUT_BF16;
        float    *acc; /* the shared expert's output, where the sums start */
        FM_CHECK(shared_expert(s, a, &acc, stream));
        fm_decode_params dp = {
            .w1data = s->w13->d_data, .w1scale = s->w13->d_scale, .w1osc = s->w13->d_oscale,
            .w2data = s->w2->d_data, .w2scale = s->w2->d_scale, .w2osc = s->w2->d_oscale,
            .n1 = s->w13->n, .k1 = s->w13->k, .kp1 = s->w13->kp, .n2 = s->w2->n, .k2 = s->w2->k, .kp2 = s->w2->kp,
            .sc_mul = pl->g[0].sc_mul, .sc_add = pl->g[0].sc_add, .x = a->x, .ids = rid, .weights = rwt, .T = T,
            .top_k = K, .n_local = L, .first = p->first, .n_global = E, .ks1 = pl->dks1, .ks2 = pl->dks2, .h = h,
            .scratch = scratch, .init = acc, .out = bf16 ? NULL : (float *)a->out,
            .out_bf16 = bf16 ? (uint16_t *)a->out : NULL, .err = s->d_err, .bad_logit = bl, .buf = s->d_decode,
            .buf_bytes = s->decode_bytes,
            /* gpt-oss: what the chain's FC1 / FC2 take (o1 / o2 below): the twin kernel when set */
            .b1 = s->d_b13, .b2 = s->d_b2, .act = c->activation, .act_limit = c->swiglu_limit,
            .dynamic = pl->dcounter};
        le = fm_decode_launch(&dp, pl->dgrid, stream);
        if (le == (int)cudaErrorCooperativeLaunchTooLarge && !dp.dynamic) {
            /* fewer SMs than the plan's grid assumed (MPS with an SM limit): the counter form
             * needs no residency and gives the same bits (decode.cu) */
            (void)cudaGetLastError();
            dp.dynamic = 1;
            le = fm_decode_launch(&dp, pl->dgrid, stream);
        }
        if (le != 0) return fm_cuda_layer_fail(le, "decode kernel");
        return FM_OK;
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
                                 .expert_list = pl->slots ? active : NULL, .bias = s->d_b13,
                                 .act = c->activation, .act_limit = c->swiglu_limit};
    FM_CHECK(fm_cuda_gemm_launch(s->dev, &pl->g[0], &o1, stream));
    const int bf16 = p->out_dtype == FM_OUT_BF16;
    float    *acc; /* FP32 sums: the caller's out, or ours for BF16 (the shared expert's, if any) */
    FM_CHECK(shared_expert(s, a, &acc, stream));
    if (!acc) acc = bf16 ? out32 : (float *)a->out;
    const fm_gemm_operands o2 = {.w = s->w2, .x = h, .offsets = off, .max_rows = R,
                                 .y = bf16 && !shared ? NULL : acc, .y_zero_init = !shared,
                                 .y_bf16 = bf16 ? (uint16_t *)a->out : NULL, .row_weight = rw, .n_tokens = T,
                                 .top_k = K, .token_slots = slots, .scratch = scratch,
                                 .split_ws = s->d_split, .split_ws_bytes = s->split_bytes,
                                 .expert_list = pl->slots ? active : NULL, .bias = s->d_b2};
    return fm_cuda_gemm_launch(s->dev, &pl->g[1], &o2, stream);
}

fm_status fm_cuda_layer_run(void *ptr, const fm_layer_run_args *a, fm_run_stats *stats)
{
    (void)stats;
    fm_cuda_layer *s = ptr;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = fm_cuda_layer_enqueue(s, a, a->stream);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

/* fm_layer_run_dispatched: the chain of fm_cuda_layer_enqueue (gather, FC1, FC2) on rows a
 * dispatch left in place, as if they were T' = rows tokens of top_k 1: a device kernel
 * turns the layout into the chain's offsets / perm / row weights (the layout's own order,
 * expert then row, which is the order the token-order run packs a routing's rows in), the
 * gather reads x[perm[p]], FC1 and FC2 run as in a run, FC2's FINALIZE_DET epilogue leaves
 * weight x row in scratch (its slot-order reduce is not launched: no token gets a sum) and
 * a store kernel writes packed row p to out[perm[p]], so that the layout's rows nobody sent
 * (past counts[e]) stay untouched. The counts / offsets stay on the device: checked there
 * (fm_moe_dispatch_layout_launch), a bad expert's rows skipped and recorded for
 * fm_layer_errors; no host synchronisation, no allocation: capturable.
 * The plan: the bucket of the rows the host knows bound the run, as tokens of top_k rows
 * (ceil(bound / top_k), at most max_tokens): the smallest of n_local x capacity (the
 * expert-major layout), the args' max_rows and the layer's max_tokens x top_k (the total of
 * the rows is only on the device). The bucket's tiles and splits were sized for at least
 * that many rows (its largest T x top_k), so the split-K buffer and the grids fit; rows past
 * the bound are dropped on the device (the experts from the first one over) and reported. */
fm_status fm_cuda_layer_run_dispatched(void *ptr, const fm_layer_dispatch_args *a, fm_run_stats *stats)
{
    (void)stats;
    fm_cuda_layer         *s = ptr;
    const fm_layer_params *p = &s->p;
    const fm_moe_config   *c = &p->cfg;
    static const char      who[] = "cuda backend: fm_layer_run_dispatched";
    const int     H = c->hidden, K = c->top_k, L = p->n_local;
    int64_t       bound = (int64_t)p->max_tokens * K;
    if (a->layout == FM_DISPATCH_EXPERT_MAJOR) {
        if ((int64_t)L * a->capacity > INT32_MAX)
            return fm_fail(FM_ERR_UNSUPPORTED, "%s: n_local x capacity = %d x %d rows: more than 2^31 - 1 layout rows", who,
                           L, a->capacity);
        if ((int64_t)L * a->capacity < bound) bound = (int64_t)L * a->capacity;
    }
    if (a->max_rows > 0 && a->max_rows < bound) bound = a->max_rows; /* the caller's bound: a smaller bucket */
    const int max_rows = (int)bound, T_eq = (int)((bound + K - 1) / K);
    const fm_bucket_plan *pl = &s->plan[fm_cuda_layer_bucket(s, T_eq)];
    /* the W4A8 chain: FP8 rows always; BF16 rows where the bucket's plan runs W4A8 */
    const int fp8 = a->x_fp8 || (s->w4a8 && pl->fp8);
    if (fp8 && !FM_CUDA_W4A8_DISPATCH)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: a W4A8 layer's (act_fp8) dispatched rows on the W4A8 chain (FP8 rows, "
                                           "or BF16 rows in a bucket that runs W4A8) are disabled in this build "
                                           "(cmake -DFM_CUDA_W4A8_DISPATCH=OFF; ON, the default, runs them); "
                                           "fm_layer_run runs the W4A8 layer",
                       who);
    unsigned char *ws = fm_cuda_layer_ws(s, a->workspace);
    uint16_t *xp = (uint16_t *)(ws + s->ws.xp), *h = (uint16_t *)(ws + s->ws.h);
    float    *scratch = (float *)(ws + s->ws.scratch), *rw = (float *)(ws + s->ws.rw);
    int32_t  *off = (int32_t *)(ws + s->ws.off), *perm = (int32_t *)(ws + s->ws.perm);
    int32_t  *active = (int32_t *)(ws + s->ws.active);
    int32_t  *dscratch = (int32_t *)(ws + s->ws.pscratch); /* >= n_local + 1 int32 (layout_of) */
    void     *stream = a->stream;
    int       prev = -1, le;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = FM_OK;
    if ((le = fm_moe_dispatch_layout_launch((int)a->layout, a->counts, a->capacity, a->offsets, a->weights, L,
                                            max_rows, off, perm, rw, pl->slots && !fp8 ? active : NULL,
                                            dscratch, s->d_err, stream)) != 0) {
        st = fm_cuda_layer_fail(le, "dispatched rows' layout");
        goto done;
    }
    if (fp8) { /* the rows into FP8 (BF16 rows quantized as a run's, FP8 rows as they are), the experts */
        le = a->x ? w4a8_quantize_x(s, ws, a->x, perm, 1, max_rows, stream)
                  : fm_fp8_rows_launch(a->x_fp8, a->x_scales, perm, max_rows, off + L, H, ws + s->ws.xq, H,
                                       (float *)(ws + s->ws.xsc), fm_act_fp8_nscales(c->act_fp8, H),
                                       &s->d_err->first_nonfinite_x, stream);
        if (le != 0) {
            st = fm_cuda_layer_fail(le, a->x ? "FP8 gather of the rows" : "the FP8 rows");
            goto done;
        }
        if ((st = w4a8_experts(s, ws, max_rows, stream)) != FM_OK) goto done;
        goto store;
    }
    if ((le = fm_moe_gather_launch(a->x, perm, max_rows, 1, H, pl->pk1, xp, off + L, &s->d_err->first_nonfinite_x,
                                   s->pdl_chain, stream)) != 0) {
        st = fm_cuda_layer_fail(le, "gather");
        goto done;
    }
    const fm_gemm_operands o1 = {.w = s->w13, .x = xp, .offsets = off, .max_rows = max_rows, .y = h,
                                 .split_ws = s->d_split, .split_ws_bytes = s->split_bytes,
                                 .expert_list = pl->slots ? active : NULL, .bias = s->d_b13,
                                 .act = c->activation, .act_limit = c->swiglu_limit};
    if ((st = fm_cuda_gemm_launch(s->dev, &pl->g[0], &o1, stream)) != FM_OK) goto done;
    /* n_tokens 0: the FINALIZE_DET reduce is not launched; scratch[p] = weight x (h W2 (+ b2)) */
    const fm_gemm_operands o2 = {.w = s->w2, .x = h, .offsets = off, .max_rows = max_rows, .y_zero_init = 1,
                                 .row_weight = rw, .n_tokens = 0, .top_k = 1, .scratch = scratch,
                                 .split_ws = s->d_split, .split_ws_bytes = s->split_bytes,
                                 .expert_list = pl->slots ? active : NULL, .bias = s->d_b2};
    if ((st = fm_cuda_gemm_launch(s->dev, &pl->g[1], &o2, stream)) != FM_OK) goto done;
store:;
    const int bf16 = p->out_dtype == FM_OUT_BF16;
    if ((le = fm_moe_dispatch_store_launch(scratch, perm, off + L, max_rows, H, bf16 ? NULL : (float *)a->out,
                                           bf16 ? (uint16_t *)a->out : NULL, stream)) != 0)
        st = fm_cuda_layer_fail(le, "store the rows");
done:
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
        info->bad_experts = (long long)h.bad_experts;
        info->first_bad_expert = h.first_bad_expert == ~0ull ? -1 : (long long)FM_DISPATCH_BAD_E(h.first_bad_expert);
    }
    if (h.bad_experts) { /* fm_layer_run_dispatched's counts / offsets: the CPU backends' status */
        const int      be = FM_DISPATCH_BAD_E(h.first_bad_expert), v = FM_DISPATCH_BAD_VALUE(h.first_bad_expert);
        const int64_t  rows = (int64_t)s->p.max_tokens * K;
        const unsigned long long n = h.bad_experts;
        switch (FM_DISPATCH_BAD_KIND(h.first_bad_expert)) {
        case FM_DISPATCH_BAD_COUNT:
            return fm_fail(FM_ERR_BAD_SHAPE, "cuda backend: fm_layer_run_dispatched: counts[%d] = %d outside [0, "
                                             "capacity]; %llu local expert(s)' rows skipped", be, v, n);
        case FM_DISPATCH_BAD_OFFSET0:
            return fm_fail(FM_ERR_BAD_SHAPE, "cuda backend: fm_layer_run_dispatched: offsets[0] = %d, must be 0; %llu "
                                             "local expert(s)' rows skipped", v, n);
        case FM_DISPATCH_BAD_ORDER:
            return fm_fail(FM_ERR_BAD_SHAPE, "cuda backend: fm_layer_run_dispatched: offsets decrease at or around "
                                             "local expert %d (offsets[%d] = %d is not within the offsets before and "
                                             "after it); %llu local expert(s)' rows skipped", be, be, v, n);
        default:
            return fm_fail(FM_ERR_BAD_SHAPE, "cuda backend: fm_layer_run_dispatched: more rows received (%d by local "
                                             "expert %d) than the run's bound (the args' max_rows, or what the "
                                             "layer holds: max_tokens x top_k = %lld; create it with a larger "
                                             "max_tokens); %llu local expert(s)' rows skipped",
                           v, be, (long long)rows, n);
        }
    }
    if (h.bad_ids)
        return fm_fail(FM_ERR_OUT_OF_RANGE,
                       "cuda backend: %llu routed slot(s) had an expert id outside [-1, %d) (first: topk_ids[%llu][%llu]); "
                       "they were skipped", h.bad_ids, E, h.first_bad_slot / K, h.first_bad_slot % K);
    if (h.first_nonfinite_x != ~0ull)
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: x[%llu][%llu] is NaN or Inf", h.first_nonfinite_x / H,
                       h.first_nonfinite_x % H);
    if (h.nonfinite_h != ~0ull) /* cpu-ref's message */
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: FC2 input of local expert %llu (its activation output) "
                                         "overflowed (inputs too large)", h.nonfinite_h);
    if (h.bad_logit != ~0ull) /* the CPU backends' check and message (fm_moe_route_tokens) */
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: router logit [%llu][%llu] overflowed (inputs too large)",
                       h.bad_logit / (unsigned long long)E, h.bad_logit % (unsigned long long)E);
    if (h.nonfinite_w)
        return fm_fail(FM_ERR_NONFINITE, "cuda backend: %llu weights of local slots (topk_weights, or the "
                                         "dispatched rows' weights) were NaN or Inf", h.nonfinite_w);
    return FM_OK;
}

fm_status fm_cuda_layer_errors(void *ptr, void *stream, fm_layer_error_info *info)
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

fm_status fm_cuda_layer_forward_host(void *ptr, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    fm_cuda_layer *s = ptr;
    int         prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = forward_host_on(s, x, T, out, stats);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}
