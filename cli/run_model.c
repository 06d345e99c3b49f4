/* run_model.c - random GLM-5-shaped layers for `fp4moe run`.
 *
 * Weights are Gaussian with sigma 1/sqrt(K) per matrix, drawn per expert from a
 * seeded xoshiro stream and quantized with fm_quantize (so every backend sees
 * exactly the checkpoint-layout tensors a ModelOpt file would hold). Experts are
 * generated in parallel (one RNG stream per expert: the result does not depend
 * on the thread count).
 */
#include "run_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fm_internal.h"
#include "fm_rng.h"
#include "moe/moe_internal.h"

void fm_run_opts_default(fm_run_opts *o)
{
    memset(o, 0, sizeof *o);
    fm_moe_config_default(&o->cfg);
    o->backend = FM_BACKEND_AUTO;
    o->tokens = 4;
    o->iters = 5;
    o->seed = 1;
    o->layer = -1;
}

static void fill_normal(fm_rng *r, float *x, size_t n, float sigma)
{
    for (size_t i = 0; i < n; i++) x[i] = sigma * fm_rng_normal_fast(r);
}

static fm_status build_random(const fm_run_opts *o, fm_run_model *m)
{
    const fm_moe_config *c = &m->cfg;
    int E = c->n_experts, H = c->hidden, I = c->inter;
    size_t d13, s13, d2, s2;
    FM_CHECK(fm_qtensor_bytes(c->wfmt, 2LL * I, H, &d13, &s13));
    FM_CHECK(fm_qtensor_bytes(c->wfmt, H, I, &d2, &s2));
    size_t per = d13 + s13 + d2 + s2;
    m->blob = malloc(per * (size_t)E);
    m->w13 = calloc((size_t)E, sizeof *m->w13);
    m->w2 = calloc((size_t)E, sizeof *m->w2);
    m->router_w = malloc((size_t)E * H * sizeof(float));
    m->router_bias = malloc((size_t)E * sizeof(float));
    if (!m->blob || !m->w13 || !m->w2 || !m->router_w || !m->router_bias)
        return fm_fail(FM_ERR_OOM, "not enough host memory for %d experts (%.1f GB)", E, per * (double)E / 1e9);
    fm_status err = FM_OK;
    int done = 0;
#pragma omp parallel
    {
        size_t big = (size_t)2 * I * H;
        float *tmp = malloc(big * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int e = 0; e < E; e++) {
            if (!tmp) {
#pragma omp critical
                err = FM_ERR_OOM;
                continue;
            }
            uint8_t *base = (uint8_t *)m->blob + per * (size_t)e;
            m->w13[e] = (fm_qtensor){c->wfmt, 2LL * I, H, base, s13 ? base + d13 : NULL, 1.0f};
            m->w2[e] = (fm_qtensor){c->wfmt, H, I, base + d13 + s13, s2 ? base + d13 + s13 + d2 : NULL, 1.0f};
            fm_rng r;
            fm_rng_init(&r, o->seed * 1000003u + (uint64_t)e + 1);
            fill_normal(&r, tmp, big, 1.0f / sqrtf((float)H));
            fm_status s1 = fm_quantize(tmp, NULL, &m->w13[e]);
            fill_normal(&r, tmp, (size_t)H * I, 1.0f / sqrtf((float)I));
            fm_status s2_ = fm_quantize(tmp, NULL, &m->w2[e]);
            if (s1 != FM_OK || s2_ != FM_OK) {
#pragma omp critical
                err = s1 != FM_OK ? s1 : s2_;
            }
#pragma omp atomic
            done++;
            fm_cli_progress("\rfp4moe run: quantizing expert weights %d/%d", done, E);
        }
        free(tmp);
    }
    fm_cli_progress("\n");
    if (err != FM_OK) return err == FM_ERR_OOM ? fm_fail(err, "out of host memory while quantizing") : err;

    fm_rng r;
    fm_rng_init(&r, o->seed ^ 0x5eedull);
    fill_normal(&r, m->router_w, (size_t)E * H, 1.0f / sqrtf((float)H));
    fill_normal(&r, m->router_bias, (size_t)E, 0.01f);
    if (c->shared_inter > 0) {
        size_t n = (size_t)2 * c->shared_inter * H;
        m->shared_w13 = malloc(n * sizeof(uint16_t));
        m->shared_w2 = malloc((size_t)H * c->shared_inter * sizeof(uint16_t));
        if (!m->shared_w13 || !m->shared_w2) return fm_fail(FM_ERR_OOM, "out of host memory (shared expert)");
        for (size_t i = 0; i < n; i++) m->shared_w13[i] = fm_bf16_encode(fm_rng_normal_fast(&r) / sqrtf((float)H));
        for (size_t i = 0; i < (size_t)H * c->shared_inter; i++)
            m->shared_w2[i] = fm_bf16_encode(fm_rng_normal_fast(&r) / sqrtf((float)c->shared_inter));
    }
    m->w = (fm_moe_weights){.router_w = m->router_w, .router_bias = m->router_bias, .w13 = m->w13, .w2 = m->w2,
                            .shared_w13 = m->shared_w13, .shared_w2 = m->shared_w2};
    return FM_OK;
}

/* Active experts for x: routed with the library's own logits and router, so the
 * count (and the bytes reported) is exactly what every backend routes. */
static fm_status count_active(fm_run_model *m, int T)
{
    const fm_moe_config *c = &m->cfg;
    size_t E = (size_t)c->n_experts, K = (size_t)c->top_k, n = (size_t)T * K;
    float *logits = malloc((size_t)T * E * sizeof(float));
    float *wts = malloc(n * sizeof(float));
    int32_t *ids = malloc(n * sizeof(int32_t));
    char *seen = calloc(E, 1);
    fm_status s = FM_OK;
    if (!logits || !wts || !ids || !seen) s = fm_fail(FM_ERR_OOM, "out of host memory (routing)");
    if (s == FM_OK) {
        fm_moe_router_logits(c, m->w.router_w, m->x, T, logits);
        s = fm_moe_route(c, m->w.router_bias, logits, T, ids, wts);
    }
    if (s == FM_OK) {
        m->active_experts = 0;
        for (size_t i = 0; i < n; i++)
            if (!seen[ids[i]]) seen[ids[i]] = 1, m->active_experts++;
    }
    free(logits);
    free(wts);
    free(ids);
    free(seen);
    return s;
}

/* A real layer: every expert of layer --layer, routing settings from the
 * checkpoint's config.json (fm_checkpoint_load_layer documents the fallbacks). */
static fm_status load_checkpoint(const fm_run_opts *o, fm_run_model *m)
{
    fm_checkpoint *ck = NULL;
    fm_ckpt_layer *l = NULL;
    fm_cli_progress("fp4moe run: loading layer %d from %s...\n", o->layer < 0 ? 0 : o->layer, o->weights_path);
    FM_CHECK(fm_checkpoint_open(o->weights_path, &ck));
    fm_ckpt_load_opts lo = {0};
    fm_status s = fm_checkpoint_load_layer(ck, o->layer < 0 ? 0 : o->layer, &lo, &l);
    fm_checkpoint_close(ck); /* the loaded layer owns copies of everything it needs */
    if (s != FM_OK) return s;
    m->ckpt = l;
    m->cfg = l->cfg;
    m->w = l->w;
    return FM_OK;
}

fm_status fm_run_model_build(const fm_run_opts *o, fm_run_model *m)
{
    memset(m, 0, sizeof *m);
    m->cfg = o->cfg;
    fm_status s;
    if (o->weights_path) {
        s = load_checkpoint(o, m);
    } else {
        s = fm_moe_config_check(&m->cfg);
        if (s == FM_OK) s = build_random(o, m);
    }
    if (s == FM_OK) {
        size_t n = (size_t)o->tokens * m->cfg.hidden;
        m->x = malloc(n * sizeof *m->x);
        if (!m->x) s = fm_fail(FM_ERR_OOM, "out of host memory (input)");
        fm_rng r;
        fm_rng_init(&r, o->seed ^ 0xabcdefull);
        for (size_t i = 0; s == FM_OK && i < n; i++) m->x[i] = fm_bf16_encode(fm_rng_normal_fast(&r));
    }
    if (s == FM_OK) s = count_active(m, o->tokens);
    if (s != FM_OK) fm_run_model_free(m);
    return s;
}

void fm_run_model_free(fm_run_model *m)
{
    free(m->blob);
    free(m->w13);
    free(m->w2);
    free(m->router_w);
    free(m->router_bias);
    free(m->shared_w13);
    free(m->shared_w2);
    free(m->x);
    fm_ckpt_layer_free(m->ckpt);
    memset(m, 0, sizeof *m);
}

double fm_run_model_bytes(const fm_run_model *m, int T)
{
    const fm_moe_config *c = &m->cfg;
    size_t d13 = 0, s13 = 0, d2 = 0, s2 = 0;
    fm_qtensor_bytes(c->wfmt, 2LL * c->inter, c->hidden, &d13, &s13);
    fm_qtensor_bytes(c->wfmt, c->hidden, c->inter, &d2, &s2);
    double b = (double)m->active_experts * (double)(d13 + s13 + d2 + s2);
    b += (double)c->n_experts * c->hidden * 4.0;                 /* router (FP32) */
    b += 3.0 * c->shared_inter * (double)c->hidden * 2.0;         /* shared expert (BF16) */
    b += (double)T * c->hidden * (2.0 + 4.0);                     /* x (BF16) in, out (FP32) */
    return b;
}

double fm_run_model_flops(const fm_run_model *m, int T)
{
    const fm_moe_config *c = &m->cfg;
    double routed = (double)T * c->top_k * 3.0 * c->inter * c->hidden;
    double shared = (double)T * 3.0 * c->shared_inter * c->hidden;
    double router = (double)T * c->n_experts * c->hidden;
    return 2.0 * (routed + shared + router);
}
