/* test_moe_fixture.h - random MoE layers for the moe/cpu tests (header-only,
 * static inline, so each test program carries its own copy).
 *
 * Weights are N(0, 1/K) so every GEMM output is O(1) whatever the shape, then
 * quantized with the library's fm_quantize (the codecs have their own tests
 * against ml_dtypes); the tests' float64 oracle decodes them independently.
 */
#ifndef FM_TEST_MOE_FIXTURE_H
#define FM_TEST_MOE_FIXTURE_H

#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fm_moe_config  cfg;
    fm_moe_weights w;
    float         *router_w, *router_bias, *a1, *a2;
    fm_qtensor    *w13, *w2;
    uint16_t      *sw13, *sw2;
} fx_layer;

/* Small sizes under sanitizers (FM_ASAN=1): they run ~20x slower. */
static inline int fx_asan(void)
{
    const char *e = getenv("FM_ASAN");
    return e && *e == '1';
}

static inline fm_moe_config fx_config(int E, int top_k, int hidden, int inter, fm_format f)
{
    fm_moe_config c;
    fm_moe_config_default(&c);
    c.n_experts = E;
    c.top_k = top_k;
    c.hidden = hidden;
    c.inter = inter;
    c.wfmt = f;
    return c;
}

static inline void fx_quant(fm_rng *r, fm_format f, int64_t rows, int64_t cols, fm_qtensor *q)
{
    size_t db = 0, sb = 0;
    assert_int_equal(fm_qtensor_bytes(f, rows, cols, &db, &sb), FM_OK);
    float *src = malloc(sizeof(float) * rows * cols);
    assert_non_null(src);
    fm_rng_fill_normal(r, src, (size_t)(rows * cols), 1.0f / sqrtf((float)cols));
    *q = (fm_qtensor){.fmt = f, .rows = rows, .cols = cols, .data = malloc(db), .scales = sb ? malloc(sb) : NULL};
    assert_non_null(q->data);
    assert_int_equal(fm_quantize(src, NULL, q), FM_OK);
    free(src);
}

static inline uint16_t *fx_bf16(fm_rng *r, size_t n, float sigma)
{
    uint16_t *v = malloc(sizeof(uint16_t) * n);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = fm_bf16_encode(sigma * fm_rng_normal(r));
    return v;
}

/* A random layer for cfg; with_bias adds a router bias, with_ascale static
 * activation scales (a1/a2: a plausible calibration, amax ~ 4 sigma). */
static inline void fx_build(fx_layer *L, const fm_moe_config *cfg, fm_rng *r, int with_bias, int with_ascale)
{
    memset(L, 0, sizeof *L);
    L->cfg = *cfg;
    int E = cfg->n_experts, H = cfg->hidden, I = cfg->inter, S = cfg->shared_inter;
    L->router_w = malloc(sizeof(float) * E * H);
    assert_non_null(L->router_w);
    fm_rng_fill_normal(r, L->router_w, (size_t)E * H, 1.0f / sqrtf((float)H));
    if (with_bias) {
        L->router_bias = malloc(sizeof(float) * E);
        fm_rng_fill_normal(r, L->router_bias, E, 0.3f);
    }
    if (with_ascale) {
        L->a1 = malloc(sizeof(float) * E);
        L->a2 = malloc(sizeof(float) * E);
        for (int e = 0; e < E; e++) {
            L->a1[e] = (float)(4.0 * (0.8 + 0.4 * fm_rng_uniform(r)) / (6 * 448)); /* x ~ N(0,1) */
            L->a2[e] = (float)(1.0 * (0.8 + 0.4 * fm_rng_uniform(r)) / (6 * 448)); /* h is smaller */
        }
    }
    L->w13 = calloc(E, sizeof(fm_qtensor));
    L->w2 = calloc(E, sizeof(fm_qtensor));
    for (int e = 0; e < E; e++) {
        fx_quant(r, cfg->wfmt, 2LL * I, H, &L->w13[e]);
        fx_quant(r, cfg->wfmt, H, I, &L->w2[e]);
    }
    if (S > 0) {
        L->sw13 = fx_bf16(r, 2 * (size_t)S * H, 1.0f / sqrtf((float)H));
        L->sw2 = fx_bf16(r, (size_t)H * S, 1.0f / sqrtf((float)S));
    }
    L->w = (fm_moe_weights){.router_w = L->router_w, .router_bias = L->router_bias, .w13 = L->w13, .w2 = L->w2,
                            .a1_scale = L->a1, .a2_scale = L->a2, .shared_w13 = L->sw13, .shared_w2 = L->sw2};
}

/* 64-byte aligned memory (the layer's 16-byte rule with room), failing the test if none. */
static inline void *fx_aligned(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(p);
    return p;
}

/* The shard [first, first + n_local) of L on backend b (the local experts' weights, the
 * global router; n_local 0: to the last expert); the test fails when create does. */
static inline fm_layer *fx_shard_layer(fm_backend_kind b, const fx_layer *L, int max_tokens, int first, int n_local,
                                       fm_out_dtype od)
{
    fm_moe_weights w = L->w;
    w.w13 = L->w13 + first;
    w.w2 = L->w2 + first;
    if (w.a1_scale) w.a1_scale += first, w.a2_scale += first;
    if (w.w13_up_global) w.w13_up_global += first;
    if (w.w13_bias) w.w13_bias += (size_t)first * 2 * L->cfg.inter;
    if (w.w2_bias) w.w2_bias += (size_t)first * L->cfg.hidden;
    fm_layer_desc d = {.backend = b, .max_tokens = max_tokens, .out_dtype = od, .first_expert = first,
                       .n_local = n_local};
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &L->cfg, &w, &l);
    if (s != FM_OK) fail_msg("create: %s: %s", fm_status_name(s), fm_last_error());
    return l;
}

/* An engine's routing of T tokens: top_k distinct experts per token (as a router gives),
 * a slot -1 with probability p_none, weights in [0.1, 1.1). */
static inline void fx_random_routing(fm_rng *r, int T, int K, int E, double p_none, int32_t *ids, float *wts)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, again;
            do {
                e = fm_rng_uniform(r) < p_none ? -1 : (int)(fm_rng_uniform(r) * E);
                again = 0;
                for (int q = 0; q < j; q++) again |= e >= 0 && ids[t * K + q] == e;
            } while (again);
            ids[t * K + j] = e;
            wts[t * K + j] = (float)(0.1 + fm_rng_uniform(r));
        }
}

/* Free (after scribbling over the weight bytes, so a backend that kept
 * pointers instead of copying reads garbage; ASan reports the use after free). */
static inline void fx_free(fx_layer *L)
{
    for (int e = 0; e < L->cfg.n_experts; e++) {
        fm_qtensor *q[2] = {&L->w13[e], &L->w2[e]};
        for (int j = 0; j < 2; j++) {
            size_t db = 0, sb = 0;
            (void)fm_qtensor_bytes(q[j]->fmt, q[j]->rows, q[j]->cols, &db, &sb);
            memset(q[j]->data, 0x77, db);
            free(q[j]->data);
            free(q[j]->scales);
        }
    }
    free(L->w13), free(L->w2), free(L->router_w), free(L->router_bias), free(L->a1), free(L->a2);
    free(L->sw13), free(L->sw2);
    memset(L, 0, sizeof *L);
}

#endif
