/* backend_fast.c - the "cpu" backend: the fast CPU path (OpenMP + AVX2/AVX-512).
 *
 * One forward = route -> permute -> FC1 (+ bias) -> activation -> FC2 (+ bias) -> finalize, like the
 * reference, but each GEMM phase is a flat list of work items (one item = one
 * expert's weight rows [n0, n1) times ALL rows routed to that expert), shared
 * dynamically by the threads. So each active expert's FP4 weights are streamed
 * from memory once per forward, both cores stream at once, and experts with
 * zero rows cost nothing. The shared expert (BF16) is one more item list with
 * all T tokens as its rows.
 * Routing and the NVFP4 activation round trip use the same code as the
 * reference (moe/shared.c), so only GEMM summation order differs from it; see
 * docs/accuracy.md for the bound.
 * Buffers are sized for max_tokens at create time; forward allocates nothing.
 * A layer must not run two forwards at once (they share those buffers).
 */
#include "cpu_internal.h"
#include "moe/moe_internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS_PER_ITEM = 64 }; /* weight rows per work item: ~200 KB of NVFP4 at K=6144, 4 prefill panels */

typedef struct {
    const fm_qtensor *w;
    const float      *A;   /* M activation rows, stride lda */
    int64_t           lda;
    int               M;
    float            *Y;   /* M output rows, stride ldy */
    int64_t           ldy;
    int64_t           n0, n1;
} work_item;

typedef struct {
    fm_moe_config  cfg;        /* the model's layer (n_experts global) */
    fm_layer_params p;
    int            max_tokens, nthreads;
    int64_t        max_k;   /* widest K of any GEMM: sizes the kernels' work buffers */
    fm_cpu_weights cw;
    fm_qtensor     sh13, sh2; /* shared expert as BF16 tensors */
    fm_qtensor    *w13h;      /* [n_local][2]: gate / up rows of w13 under their own globals (fm_moe_w13_half),
                                 or NULL when no expert's gate and up globals differ */
    fm_cpu_luts    L;
    fm_cpu_gemm_fn gemm;
    const char    *isa;
    /* per-forward buffers, sized for max_tokens (P = max_tokens * top_k routed rows) */
    float         *logits, *wts, *A1, *G, *Hh, *Y, *XS, *SG, *SH, *SY, *acc, *work;
    int32_t       *ids, *offsets, *perm, *pos, *rowexp;
    unsigned char *qscratch;
    work_item     *items;
    size_t         max_items;
} fast_state;

static fm_status fast_available(void) { return FM_OK; }

static void fast_destroy(void *state)
{
    fast_state *s = state;
    if (!s) return;
    void *bufs[] = {s->logits, s->wts, s->A1, s->G, s->Hh, s->Y, s->XS, s->SG, s->SH, s->SY, s->acc, s->work,
                    s->ids, s->offsets, s->perm, s->pos, s->rowexp, s->qscratch, s->items, s->w13h};
    for (size_t i = 0; i < FM_ARRAY_LEN(bufs); i++) free(bufs[i]);
    fm_cpu_weights_free(&s->cw);
    free(s);
}

static fm_status fast_create(const fm_layer_params *lp, const fm_moe_weights *w, void **state)
{
    const fm_moe_config *c = &lp->cfg;
    const int max_tokens = lp->max_tokens;
    fm_moe_config lcfg = *c; /* the shard's experts */
    lcfg.n_experts = lp->n_local;
    FM_CHECK(fm_moe_weights_check_scales(&lcfg, w));
    if ((int64_t)max_tokens * c->top_k > INT32_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE, "cpu: max_tokens=%d x top_k=%d routed rows exceed int32", max_tokens,
                       c->top_k);
    fast_state *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(FM_ERR_OOM, "cpu: out of memory");
    s->cfg = *c;
    s->p = *lp;
    s->max_tokens = max_tokens;
    s->nthreads = omp_get_max_threads();
    s->gemm = fm_cpu_gemm_select(&s->isa);
    fm_cpu_luts_init(&s->L, c->wfmt);
    fm_status st = fm_cpu_weights_copy(c, lp->n_local, w, &s->cw);
    if (st != FM_OK) {
        free(s);
        return st;
    }
    size_t T = (size_t)max_tokens, P = T * c->top_k, E = c->n_experts, L = lp->n_local, H = c->hidden,
           I = c->inter, S = lp->first == 0 ? c->shared_inter : 0; /* the shared expert: the shard at expert 0 */
    if (S > 0) {
        s->sh13 = (fm_qtensor){FM_FORMAT_BF16, 2 * (int64_t)S, (int64_t)H, (void *)s->cw.w.shared_w13, NULL, 1.0f};
        s->sh2 = (fm_qtensor){FM_FORMAT_BF16, (int64_t)H, (int64_t)S, (void *)s->cw.w.shared_w2, NULL, 1.0f};
    }
    size_t wide = H > I ? H : I, rows = 2 * I > H ? 2 * I : H;
    if (S > wide) wide = S;
    if (2 * S > rows) rows = 2 * S;
    s->max_k = (int64_t)wide;
    s->max_items = (L + 1) * ((rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM + 1); /* + 1: w13 in two halves */
    s->logits = malloc(sizeof(float) * T * E);
    s->wts = malloc(sizeof(float) * P);
    s->A1 = malloc(sizeof(float) * P * H);
    s->G = malloc(sizeof(float) * P * 2 * I);
    s->Hh = malloc(sizeof(float) * P * I);
    s->Y = malloc(sizeof(float) * P * H);
    s->XS = malloc(sizeof(float) * T * H);
    s->SG = malloc(sizeof(float) * (T * 2 * S + 1));
    s->SH = malloc(sizeof(float) * (T * S + 1));
    s->SY = malloc(sizeof(float) * T * H);
    s->acc = malloc(sizeof(float) * T * H);
    s->work = malloc(sizeof(float) * fm_cpu_work_floats(wide) * s->nthreads);
    s->ids = malloc(sizeof(int32_t) * P);
    s->offsets = malloc(sizeof(int32_t) * (L + 1));
    s->perm = malloc(sizeof(int32_t) * P);
    s->pos = malloc(sizeof(int32_t) * P);
    s->rowexp = malloc(sizeof(int32_t) * P);
    s->qscratch = malloc(fm_moe_act_quant_scratch((int)wide) * s->nthreads);
    s->items = malloc(sizeof(work_item) * s->max_items);
    int split = 0;
    for (size_t e = 0; e < L; e++) split |= fm_moe_w13_split(&s->cw.w, (int)e);
    if (split && (s->w13h = malloc(sizeof(fm_qtensor) * 2 * L)) != NULL)
        for (size_t e = 0; e < L; e++)
            for (int h = 0; h < 2; h++) s->w13h[2 * e + h] = fm_moe_w13_half(&s->cw.w, (int)e, c->inter, h);
    if ((split && !s->w13h) || !s->logits || !s->wts || !s->A1 || !s->G || !s->Hh || !s->Y || !s->XS || !s->SG || !s->SH || !s->SY ||
        !s->acc || !s->work || !s->ids || !s->offsets || !s->perm || !s->pos || !s->rowexp || !s->qscratch ||
        !s->items) {
        fast_destroy(s);
        return fm_fail(FM_ERR_OOM, "cpu: out of memory for work buffers (max_tokens=%d)", max_tokens);
    }
    *state = s;
    return FM_OK;
}

/* Append the items of one GEMM: rows [0, w->rows) of w against M rows of A, into Y of row
 * stride ldy. */
static size_t add_items_ld(work_item *it, size_t n, const fm_qtensor *w, const float *A, int M, float *Y,
                           int64_t ldy)
{
    for (int64_t n0 = 0; n0 < w->rows; n0 += ROWS_PER_ITEM) {
        int64_t n1 = n0 + ROWS_PER_ITEM < w->rows ? n0 + ROWS_PER_ITEM : w->rows;
        it[n++] = (work_item){w, A, w->cols, M, Y, ldy, n0, n1};
    }
    return n;
}

static size_t add_items(work_item *it, size_t n, const fm_qtensor *w, const float *A, int M, float *Y)
{
    return add_items_ld(it, n, w, A, M, Y, w->rows);
}

static void run_items(fast_state *s, size_t n_items)
{
    const work_item *it = s->items;
#pragma omp parallel for schedule(dynamic, 1) num_threads(s->nthreads)
    for (long i = 0; i < (long)n_items; i++) {
        float *work = s->work + (size_t)omp_get_thread_num() * fm_cpu_work_floats(s->max_k);
        s->gemm(it[i].w, &s->L, it[i].n0, it[i].n1, it[i].A, it[i].lda, it[i].M, it[i].Y, it[i].ldy, work);
    }
}

/* NVFP4 round trip of rows [0, P) of X (width n), per-expert static scale or
 * dynamic. Returns the first failing row or -1. */
static long act_quant_rows(fast_state *s, float *X, int P, int n, const float *gscale)
{
    long bad = -1;
    size_t scratch = fm_moe_act_quant_scratch((int)s->max_k);
#pragma omp parallel for schedule(static) num_threads(s->nthreads)
    for (int p = 0; p < P; p++) {
        void *q = s->qscratch + (size_t)omp_get_thread_num() * scratch;
        const float *g = gscale ? &gscale[s->rowexp[p]] : NULL;
        if (fm_moe_act_quant_row(X + (size_t)p * n, n, g, q, X + (size_t)p * n) != FM_OK) {
#pragma omp critical(fm_cpu_act_bad)
            if (bad < 0 || p < bad) bad = p;
        }
    }
    return bad;
}

/* FP8 round trip of rows [0, P) of X (width n). Returns the first failing row or -1. */
static long act_fp8_rows(fast_state *s, float *X, int P, int n)
{
    long bad = -1;
#pragma omp parallel for schedule(static) num_threads(s->nthreads)
    for (int p = 0; p < P; p++)
        if (fm_moe_act_fp8_row(X + (size_t)p * n, n, s->cfg.act_fp8, X + (size_t)p * n) != FM_OK) {
#pragma omp critical(fm_cpu_act_bad)
            if (bad < 0 || p < bad) bad = p;
        }
    return bad;
}

/* The experts on the P packed rows of s->A1 (local expert e's rows at [offsets[e],
 * offsets[e + 1]), rowexp set): Y[p] = W2_e act(W13_e A1[p] (+ bias)) (+ bias), with the
 * NVFP4 / FP8 round trips of act_nvfp4 / act_fp8; with S > 0 the shared expert on the T rows of s->XS too
 * (into s->SY). x_on_grid: A1 holds FP8 rows as a dispatch sent them (already q * scale), not
 * quantized again. Shared by the token-order run and the dispatched one, so a row's result does
 * not depend on where it came from. */
static fm_status experts(fast_state *s, int P, int T, int S, int x_on_grid)
{
    const fm_moe_config  *c = &s->cfg;
    const fm_moe_weights *w = &s->cw.w;
    const int             E = s->p.n_local, H = c->hidden, I = c->inter;
    if (c->act_nvfp4) {
        long bad = act_quant_rows(s, s->A1, P, H, w->a1_scale);
        if (bad >= 0) return fm_fail(FM_ERR_NONFINITE, "cpu: FC1 input row %ld is not finite", bad);
    }
    if (c->act_fp8 && !x_on_grid) {
        long bad = act_fp8_rows(s, s->A1, P, H);
        if (bad >= 0) return fm_fail(FM_ERR_NONFINITE, "cpu: FC1 input row %ld is not finite", bad);
    }

    size_t n = 0;
    for (int e = 0; e < E; e++) {
        int          M = s->offsets[e + 1] - s->offsets[e];
        const float *A = s->A1 + (size_t)s->offsets[e] * H;
        float       *G = s->G + (size_t)s->offsets[e] * 2 * I;
        if (!M) continue;
        if (!fm_moe_w13_split(w, e)) {
            n = add_items(s->items, n, &w->w13[e], A, M, G);
            continue;
        }
        /* gate and up globals differ: each half its own GEMM under its own global, which the
         * kernels apply to the finished sum as they apply w13's (one FP32 product per output,
         * no extra rounding); the halves land where w13's rows would (gate, then up) */
        n = add_items_ld(s->items, n, &s->w13h[2 * e], A, M, G, 2 * (int64_t)I);
        n = add_items_ld(s->items, n, &s->w13h[2 * e + 1], A, M, G + I, 2 * (int64_t)I);
    }
    if (S > 0) n = add_items(s->items, n, &s->sh13, s->XS, T, s->SG);
    run_items(s, n);

#pragma omp parallel for schedule(static) num_threads(s->nthreads)
    for (int p = 0; p < P; p++) /* + the expert bias (gpt-oss), then SwiGLU or gpt-oss's clamped form */
        fm_moe_expert_act(c, w->w13_bias ? w->w13_bias + (size_t)s->rowexp[p] * 2 * I : NULL,
                          s->G + (size_t)p * 2 * I, s->Hh + (size_t)p * I);
    for (int t = 0; t < T && S > 0; t++) fm_moe_swiglu(s->SG + (size_t)t * 2 * S, s->SG + (size_t)t * 2 * S + S, S,
                                                       s->SH + (size_t)t * S);
    if (c->act_nvfp4) {
        long bad = act_quant_rows(s, s->Hh, P, I, w->a2_scale);
        if (bad >= 0)
            return fm_fail(FM_ERR_NONFINITE, "cpu: FC2 input row %ld overflowed (inputs too large)", bad);
    }
    if (c->act_fp8) {
        long bad = act_fp8_rows(s, s->Hh, P, I);
        if (bad >= 0)
            return fm_fail(FM_ERR_NONFINITE, "cpu: FC2 input row %ld overflowed (inputs too large)", bad);
    }

    n = 0;
    for (int e = 0; e < E; e++) {
        int M = s->offsets[e + 1] - s->offsets[e];
        if (M) n = add_items(s->items, n, &w->w2[e], s->Hh + (size_t)s->offsets[e] * I, M,
                             s->Y + (size_t)s->offsets[e] * H);
    }
    if (S > 0) n = add_items(s->items, n, &s->sh2, s->SH, T, s->SY);
    run_items(s, n);
    if (w->w2_bias) {
#pragma omp parallel for schedule(static) num_threads(s->nthreads)
        for (int p = 0; p < P; p++) {
            float       *y = s->Y + (size_t)p * H;
            const float *b = w->w2_bias + (size_t)s->rowexp[p] * H;
            for (int i = 0; i < H; i++) y[i] += b[i];
        }
    }
    return FM_OK;
}

static fm_status fast_run(void *state, const fm_layer_run_args *a, fm_run_stats *stats)
{
    fast_state *s = state;
    const fm_moe_config *c = &s->cfg;
    const fm_moe_weights *w = &s->cw.w;
    const uint16_t *x = a->x;
    const int T = a->T, E = s->p.n_local, K = c->top_k, H = c->hidden;
    const int S = s->p.first == 0 ? c->shared_inter : 0;
    int P = 0; /* local routed rows */
    double t0 = omp_get_wtime();

    for (size_t i = 0; i < (size_t)T * H; i++)
        if ((x[i] & 0x7f80u) == 0x7f80u) /* BF16 exponent all ones: Inf or NaN */
            return fm_fail(FM_ERR_NONFINITE, "cpu: x[%zu][%zu] is NaN or Inf (policy: reject)", i / H, i % H);
    FM_CHECK(fm_moe_plan_rows(c, w, x, T, a->topk_ids, a->topk_weights, s->p.first, E, "cpu", s->logits, s->ids,
                              s->wts, s->offsets, s->perm, s->pos, &P));
    for (int e = 0; e < E; e++)
        for (int32_t p = s->offsets[e]; p < s->offsets[e + 1]; p++) s->rowexp[p] = e;

    /* FC1 inputs: x in FP32 per token, then gathered per routed row. */
#pragma omp parallel for schedule(static) num_threads(s->nthreads)
    for (long i = 0; i < (long)T * H; i++) s->XS[i] = fm_bf16_decode(x[i]);
#pragma omp parallel for schedule(static) num_threads(s->nthreads)
    for (int p = 0; p < P; p++) memcpy(s->A1 + (size_t)p * H, s->XS + (size_t)(s->perm[p] / K) * H, sizeof(float) * H);
    FM_CHECK(experts(s, P, T, S, 0));

    /* Finalize in the reference's order: slots j ascending, then the shared expert. */
#pragma omp parallel for schedule(static) num_threads(s->nthreads)
    for (int t = 0; t < T; t++) {
        float *o = s->acc + (size_t)t * H;
        for (int i = 0; i < H; i++) o[i] = 0.0f;
        for (int j = 0; j < K; j++) {
            if (s->pos[t * K + j] < 0) continue; /* another shard's expert, or id -1 */
            const float *y = s->Y + (size_t)s->pos[t * K + j] * H;
            const float wt = s->wts[t * K + j];
            for (int i = 0; i < H; i++) o[i] += wt * y[i];
        }
        if (S > 0)
            for (int i = 0; i < H; i++) o[i] += s->SY[(size_t)t * H + i];
    }
    long bad = fm_moe_first_nonfinite(s->acc, (size_t)T * H);
    if (bad >= 0)
        return fm_fail(FM_ERR_NONFINITE, "cpu: out[%ld][%ld] overflowed to %g (inputs too large)", bad / H, bad % H,
                       (double)s->acc[bad]);
    if (s->p.out_dtype == FM_OUT_BF16) fm_layer_store_bf16(s->acc, (size_t)T * H, a->out);
    else memcpy(a->out, s->acc, sizeof(float) * (size_t)T * H);
    if (a->routed_ids) { /* internal routing only (fm_layer_run checks) */
        memcpy(a->routed_ids, s->ids, sizeof(int32_t) * (size_t)T * K);
        memcpy(a->routed_weights, s->wts, sizeof(float) * (size_t)T * K);
    }
    if (stats) stats->ms = (omp_get_wtime() - t0) * 1e3;
    return FM_OK;
}

/* Dispatched rows (fm_layer_run_dispatched): the packed order is the layout's own (expert,
 * then row), the same order fm_layer_run packs a routing's rows in, so each row meets the
 * same GEMM work items and its result is bit-identical to the token-order run's. */
static fm_status fast_run_dispatched(void *state, const fm_layer_dispatch_args *a, fm_run_stats *stats)
{
    fast_state          *s = state;
    const fm_moe_config *c = &s->cfg;
    const int            E = s->p.n_local, H = c->hidden;
    static const char    who[] = "cpu: fm_layer_run_dispatched";
    int                  P = 0;
    double               t0 = omp_get_wtime();
    FM_CHECK(fm_dispatch_rows(a, E, (int64_t)s->max_tokens * c->top_k, who, s->offsets, &P));
    for (int e = 0; e < E; e++) /* checked and decoded in packed order: the first bad row is named */
        for (int32_t p = s->offsets[e]; p < s->offsets[e + 1]; p++) {
            const size_t r = fm_dispatch_slot(a, s->offsets, e, p);
            FM_CHECK(fm_dispatch_row_f32(a, r, H, e, who, s->A1 + (size_t)p * H));
            if (a->weights && !isfinite(a->weights[r]))
                return fm_fail(FM_ERR_NONFINITE, "%s: weights[%zu] (local expert %d) = %g", who, r, e,
                               (double)a->weights[r]);
            s->rowexp[p] = e;
        }
    FM_CHECK(experts(s, P, 0, 0, a->x_fp8 != NULL));
    if (a->weights) /* the combine's weight applied here: one product per element, as the finalize does */
        for (int e = 0; e < E; e++)
            for (int32_t p = s->offsets[e]; p < s->offsets[e + 1]; p++) {
                const float wt = a->weights[fm_dispatch_slot(a, s->offsets, e, p)];
                float      *y = s->Y + (size_t)p * H;
                for (int i = 0; i < H; i++) y[i] = wt * y[i];
            }
    long bad = fm_moe_first_nonfinite(s->Y, (size_t)P * H);
    if (bad >= 0)
        return fm_fail(FM_ERR_NONFINITE, "%s: packed row %ld overflowed to %g (inputs too large)", who, bad / H,
                       (double)s->Y[bad]);
    for (int e = 0; e < E; e++) /* every check passed: now the caller's rows */
        for (int32_t p = s->offsets[e]; p < s->offsets[e + 1]; p++) {
            const size_t r = fm_dispatch_slot(a, s->offsets, e, p);
            const float *y = s->Y + (size_t)p * H;
            if (s->p.out_dtype == FM_OUT_BF16) fm_layer_store_bf16(y, (size_t)H, (uint16_t *)a->out + r * H);
            else memcpy((float *)a->out + r * H, y, sizeof(float) * (size_t)H);
        }
    if (stats) stats->ms = (omp_get_wtime() - t0) * 1e3;
    return FM_OK;
}

const fm_backend_ops fm_cpu_ops = {
    .name = "cpu",
    .available = fast_available,
    .create = fast_create,
    .run = fast_run,
    .run_dispatched = fast_run_dispatched,
    .destroy = fast_destroy,
};
