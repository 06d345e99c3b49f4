/* ref.c - fm_moe_forward_ref, the oracle every backend is measured against.
 *
 * Simple loops, FP32 accumulation in plain K order, nothing clever:
 *   route (shared router logits + fm_moe_route), permute (fm_moe_permute),
 *   then for each routed row p of expert e (token t):
 *     a = x[t] (BF16 -> FP32), NVFP4 round trip first when act_nvfp4 (FP8 when act_fp8)
 *     g[n] = a . W13_e[n] (+ w13_bias[e][n])  for n < 2*inter (gate rows, then up rows; the
 *       up rows decoded with w13_up_global[e] when given, the gate rows with w13[e]'s global)
 *     h = act(g): silu(g[0..inter)) * g[inter..2*inter), or gpt-oss's clamped form
 *       (fm_moe_expert_act); NVFP4 round trip when act_nvfp4 (FP8 when act_fp8)
 *     y_p[n] = h . W2_e[n] (+ w2_bias[e][n])
 *   out[t] = sum_j weight[t][j] * y_(slot t,j)   (j ascending)  + shared(x[t])
 * Weights are dequantized one row at a time with fm_dequantize (the format
 * engineer's codec, so the oracle shares no decoding code with the fast path).
 * Everything is computed into a private buffer and copied to `out` only when
 * the whole pass succeeded: the caller's buffer never holds a partial result.
 * Policy: NaN/Inf in x is rejected (FM_ERR_NONFINITE); so is an output that
 * overflowed to Inf, rather than handing back Inf silently, and an FC2 input that
 * overflowed when it is to be quantized (act_nvfp4 / act_fp8: no scale from Inf).
 */
#include "backend.h"
#include "moe/moe_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* out[n] = W[n] . a for every row n of w (one dequantized row at a time). */
static fm_status gemv_rows(const fm_qtensor *w, const float *a, float *wrow, float *out)
{
    const fm_format_traits *tr = fm_format_traits_get(w->fmt);
    size_t row_bytes = fm_format_row_bytes(w->fmt, w->cols);
    size_t sc_bytes = tr->block ? (size_t)(w->cols / tr->block) : 0;
    for (int64_t n = 0; n < w->rows; n++) {
        fm_qtensor row = *w;
        row.rows = 1;
        row.data = (uint8_t *)w->data + (size_t)n * row_bytes;
        row.scales = w->scales ? w->scales + (size_t)n * sc_bytes : NULL;
        FM_CHECK(fm_dequantize(&row, wrow));
        float acc = 0.0f;
        for (int64_t k = 0; k < w->cols; k++) acc += wrow[k] * a[k];
        out[n] = acc;
    }
    return FM_OK;
}

/* BF16 SwiGLU MLP of one token (the shared expert). */
static fm_status shared_mlp(const fm_moe_config *cfg, const fm_moe_weights *w, const float *a, float *wrow, float *g,
                            float *h, float *y)
{
    int H = cfg->hidden, S = cfg->shared_inter;
    fm_qtensor w13 = {.fmt = FM_FORMAT_BF16, .rows = 2LL * S, .cols = H, .data = (void *)w->shared_w13,
                      .global_scale = 1.0f};
    fm_qtensor w2 = {.fmt = FM_FORMAT_BF16, .rows = H, .cols = S, .data = (void *)w->shared_w2, .global_scale = 1.0f};
    FM_CHECK(gemv_rows(&w13, a, wrow, g));
    fm_moe_swiglu(g, g + S, S, h);
    return gemv_rows(&w2, h, wrow, y);
}

typedef struct {
    float   *logits, *wts, *a, *g, *h, *y, *acc, *wrow, *sy;
    int32_t *ids, *offsets, *perm, *pos;
    void    *qscratch;
} ref_bufs;

static void bufs_free(ref_bufs *b)
{
    void *all[] = {b->logits, b->wts, b->a, b->g, b->h, b->y, b->acc, b->wrow, b->sy, b->ids, b->offsets, b->perm,
                   b->pos, b->qscratch};
    for (size_t i = 0; i < FM_ARRAY_LEN(all); i++) free(all[i]);
}

static fm_status bufs_alloc(const fm_moe_config *c, int T, ref_bufs *b)
{
    size_t P = (size_t)T * c->top_k, H = c->hidden, I = c->inter, S = c->shared_inter;
    size_t wide = H > 2 * I ? H : 2 * I;
    if (2 * S > wide) wide = 2 * S;
    memset(b, 0, sizeof *b);
    b->logits = malloc(sizeof(float) * (size_t)T * c->n_experts);
    b->wts = malloc(sizeof(float) * P);
    b->a = malloc(sizeof(float) * wide);
    b->g = malloc(sizeof(float) * wide);
    b->h = malloc(sizeof(float) * wide);
    b->y = malloc(sizeof(float) * P * H);
    b->acc = malloc(sizeof(float) * (size_t)T * H);
    b->wrow = malloc(sizeof(float) * wide);
    b->sy = malloc(sizeof(float) * H);
    b->ids = malloc(sizeof(int32_t) * P);
    b->offsets = malloc(sizeof(int32_t) * ((size_t)c->n_experts + 1));
    b->perm = malloc(sizeof(int32_t) * P);
    b->pos = malloc(sizeof(int32_t) * P);
    b->qscratch = malloc(fm_moe_act_quant_scratch((int)wide));
    if (!b->logits || !b->wts || !b->a || !b->g || !b->h || !b->y || !b->acc || !b->wrow || !b->sy || !b->ids ||
        !b->offsets || !b->perm || !b->pos || !b->qscratch) {
        bufs_free(b);
        return fm_fail(FM_ERR_OOM, "fm_moe_forward_ref: out of memory for T=%d (%zu routed rows)", T, P);
    }
    return FM_OK;
}

/* y = local expert e's output for the row in b->a (FP32; the chain in the comment at the top);
 * x_on_grid: b->a holds an FP8 row as a dispatch sent it (q * scale), not quantized again. */
static fm_status expert_row(const fm_moe_config *c, const fm_moe_weights *w, int e, int x_on_grid, ref_bufs *b,
                            float *y)
{
    const int H = c->hidden, I = c->inter;
    if (c->act_nvfp4) FM_CHECK(fm_moe_act_quant_row(b->a, H, w->a1_scale ? &w->a1_scale[e] : NULL, b->qscratch, b->a));
    if (c->act_fp8 && !x_on_grid) FM_CHECK(fm_moe_act_fp8_row(b->a, H, c->act_fp8, b->a));
    for (int half = 0; half < 2; half++) { /* gate rows, then up rows, each under its own global */
        const fm_qtensor t = fm_moe_w13_half(w, e, I, half);
        FM_CHECK(gemv_rows(&t, b->a, b->wrow, b->g + (size_t)half * I));
    }
    fm_moe_expert_act(c, w->w13_bias ? w->w13_bias + (size_t)e * 2 * I : NULL, b->g, b->h);
    /* h is finite unless FC1 overflowed FP32: no FP8 / NVFP4 scale can be made from it */
    if ((c->act_nvfp4 || c->act_fp8) && fm_moe_first_nonfinite(b->h, (size_t)I) >= 0)
        return fm_fail(FM_ERR_NONFINITE, "cpu-ref: FC2 input of local expert %d (its activation output) overflowed "
                                         "(inputs too large)", e);
    if (c->act_nvfp4) FM_CHECK(fm_moe_act_quant_row(b->h, I, w->a2_scale ? &w->a2_scale[e] : NULL, b->qscratch, b->h));
    if (c->act_fp8) FM_CHECK(fm_moe_act_fp8_row(b->h, I, c->act_fp8, b->h));
    FM_CHECK(gemv_rows(&w->w2[e], b->h, b->wrow, y));
    if (w->w2_bias)
        for (int n = 0; n < H; n++) y[n] += w->w2_bias[(size_t)e * H + n];
    return FM_OK;
}

static fm_status forward(const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T,
                         const int32_t *ext_ids, const float *ext_wts, int first, int n_local, ref_bufs *b)
{
    int K = c->top_k, H = c->hidden, rows = 0;
    FM_CHECK(fm_moe_plan_rows(c, w, x, T, ext_ids, ext_wts, first, n_local, "fm_moe_forward_ref", b->logits, b->ids,
                              b->wts, b->offsets, b->perm, b->pos, &rows));

    for (int e = 0; e < n_local; e++) { /* local expert e = global first + e */
        for (int32_t p = b->offsets[e]; p < b->offsets[e + 1]; p++) {
            int t = b->perm[p] / K;
            for (int k = 0; k < H; k++) b->a[k] = fm_bf16_decode(x[(size_t)t * H + k]);
            FM_CHECK(expert_row(c, w, e, 0, b, b->y + (size_t)p * H));
        }
    }

    /* Finalize: token t's slots in ascending j (skipped slots: other shards, id -1),
     * then the shared expert (held by the shard that starts at expert 0). */
    const int *pos = b->pos;
    for (int t = 0; t < T; t++) {
        float *o = b->acc + (size_t)t * H;
        for (int n = 0; n < H; n++) o[n] = 0.0f;
        for (int j = 0; j < K; j++) {
            if (pos[t * K + j] < 0) continue;
            const float *y = b->y + (size_t)pos[t * K + j] * H;
            float wt = b->wts[t * K + j];
            for (int n = 0; n < H; n++) o[n] += wt * y[n];
        }
        if (c->shared_inter > 0 && first == 0) {
            for (int k = 0; k < H; k++) b->a[k] = fm_bf16_decode(x[(size_t)t * H + k]);
            FM_CHECK(shared_mlp(c, w, b->a, b->wrow, b->g, b->h, b->sy));
            for (int n = 0; n < H; n++) o[n] += b->sy[n];
        }
    }
    long bad = fm_moe_first_nonfinite(b->acc, (size_t)T * H);
    if (bad >= 0)
        return fm_fail(FM_ERR_NONFINITE, "fm_moe_forward_ref: out[%ld][%ld] overflowed to %g (inputs too large)",
                       bad / H, bad % H, (double)b->acc[bad]);
    return FM_OK;
}

static fm_status check_x(const fm_moe_config *cfg, const uint16_t *x, int T, const char *who)
{
    size_t n = (size_t)T * cfg->hidden;
    for (size_t i = 0; i < n; i++)
        if ((x[i] & 0x7f80u) == 0x7f80u) /* BF16 exponent all ones: Inf or NaN */
            return fm_fail(FM_ERR_NONFINITE, "%s: x[%zu][%zu] is NaN or Inf (policy: reject)", who, i / cfg->hidden,
                           i % cfg->hidden);
    return FM_OK;
}

fm_status fm_moe_forward_ref_run(const fm_moe_config *cfg, const fm_moe_weights *w, const uint16_t *x, int T,
                                 const int32_t *ext_ids, const float *ext_wts, int first, int n_local, float *out,
                                 int32_t *routed_ids, float *routed_wts)
{
    FM_CHECK(check_x(cfg, x, T, "fm_moe_forward_ref"));
    ref_bufs b;
    FM_CHECK(bufs_alloc(cfg, T, &b));
    fm_status s = forward(cfg, w, x, T, ext_ids, ext_wts, first, n_local, &b);
    if (s == FM_OK) memcpy(out, b.acc, sizeof(float) * (size_t)T * cfg->hidden);
    if (s == FM_OK && routed_ids) {
        memcpy(routed_ids, b.ids, sizeof(int32_t) * (size_t)T * cfg->top_k);
        memcpy(routed_wts, b.wts, sizeof(float) * (size_t)T * cfg->top_k);
    }
    bufs_free(&b);
    return s;
}

fm_status fm_moe_forward_ref(const fm_moe_config *cfg, const fm_moe_weights *w, const uint16_t *x, int T, float *out)
{
    fm_clear_error();
    if (!cfg || !w || !x || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_moe_forward_ref: NULL cfg, w, x or out");
    FM_CHECK(fm_moe_config_check(cfg));
    if (T < 1) return fm_fail(FM_ERR_BAD_SHAPE, "fm_moe_forward_ref: T=%d < 1", T);
    /* routed slots t * top_k + j are int (as fm_moe_permute's; fm_layer_create bounds
     * max_tokens x top_k the same way) */
    if ((int64_t)T * cfg->top_k > INT32_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_moe_forward_ref: T=%d x top_k=%d = %lld routed rows exceed 2^31-1", T,
                       cfg->top_k, (long long)T * cfg->top_k);
    FM_CHECK(fm_moe_weights_check(cfg, w));
    FM_CHECK(fm_moe_weights_check_scales(cfg, w));
    return fm_moe_forward_ref_run(cfg, w, x, T, NULL, NULL, 0, cfg->n_experts, out, NULL, NULL);
}

fm_status fm_moe_dispatched_ref(const fm_moe_config *cfg, const fm_moe_weights *w, const fm_layer_dispatch_args *a,
                                int n_local, int64_t max_rows, float *y_rows, int32_t *offsets, int *rows)
{
    static const char who[] = "cpu-ref: fm_layer_run_dispatched";
    const int         H = cfg->hidden;
    FM_CHECK(fm_dispatch_rows(a, n_local, max_rows, who, offsets, rows));
    ref_bufs b;
    FM_CHECK(bufs_alloc(cfg, 1, &b));
    fm_status s = FM_OK;
    for (int e = 0; e < n_local && s == FM_OK; e++)
        for (int32_t p = offsets[e]; p < offsets[e + 1] && s == FM_OK; p++) {
            const size_t r = fm_dispatch_slot(a, offsets, e, p);
            float       *y = y_rows + (size_t)p * H;
            s = fm_dispatch_row_f32(a, r, H, e, who, b.a);
            if (s == FM_OK && a->weights && !isfinite(a->weights[r]))
                s = fm_fail(FM_ERR_NONFINITE, "%s: weights[%zu] (local expert %d) = %g", who, r, e,
                            (double)a->weights[r]);
            if (s == FM_OK) s = expert_row(cfg, w, e, a->x_fp8 != NULL, &b, y);
            if (s == FM_OK && a->weights)
                for (int n = 0; n < H; n++) y[n] = a->weights[r] * y[n];
        }
    bufs_free(&b);
    if (s != FM_OK) return s;
    long bad = fm_moe_first_nonfinite(y_rows, (size_t)*rows * H);
    if (bad >= 0)
        return fm_fail(FM_ERR_NONFINITE, "%s: packed row %ld overflowed to %g (inputs too large)", who, bad / H,
                       (double)y_rows[bad]);
    return FM_OK;
}
