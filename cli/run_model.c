/* run_model.c - the layer `fp4moe run` executes: random GLM-5-shaped
 * weights, or a checkpoint's layer (routing from the model, flags override);
 * its input (seeded, or --input .npy) and output file; the up-front size check.
 *
 * Weights are Gaussian with sigma 1/sqrt(K) per matrix, drawn per expert from a
 * seeded xoshiro stream and quantized with fm_quantize (so every backend sees
 * exactly the checkpoint-layout tensors a ModelOpt file would hold). Experts are
 * generated in parallel (one RNG stream per expert: the result does not depend
 * on the thread count).
 */
#define _POSIX_C_SOURCE 200809L
#include "run_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    /* experts made: all, or with --global-experts the shard's (expert e's seed is its global index) */
    int E = m->n_held, E0 = m->first_held, H = c->hidden, I = c->inter, EG = c->n_experts;
    size_t d13, s13, d2, s2;
    FM_CHECK(fm_qtensor_bytes(c->wfmt, 2LL * I, H, &d13, &s13));
    FM_CHECK(fm_qtensor_bytes(c->wfmt, H, I, &d2, &s2));
    size_t per = d13 + s13 + d2 + s2;
    m->blob = malloc(per * (size_t)E);
    m->w13 = calloc((size_t)E, sizeof *m->w13);
    m->w2 = calloc((size_t)E, sizeof *m->w2);
    m->router_w = malloc((size_t)EG * H * sizeof(float));
    m->router_bias = malloc((size_t)EG * sizeof(float));
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
            fm_rng_init(&r, o->seed * 1000003u + (uint64_t)(E0 + e) + 1);
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
    fill_normal(&r, m->router_w, (size_t)EG * H, 1.0f / sqrtf((float)H));
    fill_normal(&r, m->router_bias, (size_t)EG, 0.01f);
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

/* Active experts of the shard for x: routed with the library's own logits and
 * router, so the count (and the bytes reported) is exactly what every backend routes. */
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
        m->active_experts = 0, m->local_rows = 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= m->shard_first && ids[i] < m->shard_first + m->shard_n) {
                m->local_rows++;
                if (!seen[ids[i]]) seen[ids[i]] = 1, m->active_experts++;
            }
    }
    free(logits);
    free(wts);
    free(ids);
    free(seen);
    return s;
}

/* What a routing setting is in cfg, for the stderr notes. */
static void route_value(const fm_moe_config *c, int which, char *buf, size_t n)
{
    switch (which) {
    case FM_ROUTE_TOP_K: snprintf(buf, n, "top_k %d", c->top_k); break;
    case FM_ROUTE_SCORE: snprintf(buf, n, "score %s", fm_score_name(c->score)); break;
    case FM_ROUTE_RENORMALIZE: snprintf(buf, n, "renormalize %d", c->renormalize); break;
    case FM_ROUTE_SCALE: snprintf(buf, n, "routed_scale %g", (double)c->routed_scale); break;
    default: snprintf(buf, n, "groups %d (keep %d)", c->n_group, c->topk_group); break;
    }
}

/* "config.json num_experts_per_tok", "qwen3_moe default", ... */
static void route_origin(const fm_ckpt_layer *l, int which, char *buf, size_t n)
{
    const fm_route_origin *r = &l->route_from[which];
    switch (r->from) {
    case FM_ROUTE_FROM_CONFIG: snprintf(buf, n, "config.json %s", r->key ? r->key : "?"); break;
    case FM_ROUTE_FROM_MODEL_DEFAULT: snprintf(buf, n, "%s default", l->model_type[0] ? l->model_type : "model-type"); break;
    case FM_ROUTE_FROM_CALLER: snprintf(buf, n, "command line"); break;
    case FM_ROUTE_FROM_ABSENT: snprintf(buf, n, "no n_group in config.json"); break;
    default: snprintf(buf, n, "unknown"); break;
    }
}

/* What the checkpoint's model computes and fp4moe's layer does not (fm_ckpt_layer's flags,
 * docs/checkpoints.md): said on stderr before the run, since --check compares with fp4moe's own
 * reference of the same layer and cannot see it. */
static void warn_not_modelled(const fm_ckpt_layer *l)
{
    if (l->ignored_bias || l->ignored_router_bias)
        fprintf(stderr, "fp4moe run: warning: layer %d: the checkpoint's %s not loaded: fp4moe's layer does not "
                "model %s; the output is not the model's layer (--check compares with fp4moe's reference of the "
                "same computation)\n", l->layer,
                l->ignored_bias && l->ignored_router_bias ? "expert biases and router logit bias are"
                : l->ignored_bias                        ? "expert biases are"
                                                         : "router logit bias is",
                l->ignored_bias + l->ignored_router_bias > 1 ? "them" : "it");
    if (l->w13_split_globals)
        fprintf(stderr, "fp4moe run: note: layer %d: %d experts' gate and up global scales differ: each half "
                "keeps its own on the CPU backends; the cuda backend re-encodes the smaller half's block scales "
                "against the larger (lossy, its epilogue applies one global per matrix)\n",
                l->layer, l->w13_split_globals);
}

/* A real layer: every expert of layer --layer, routing from the model
 * (fm_checkpoint_load_layer); flags in route_set override, each said on stderr
 * with the value and origin it replaces (from a validate-only load without them). */
static fm_status load_checkpoint(const fm_run_opts *o, fm_run_model *m)
{
    fm_checkpoint *ck = NULL;
    fm_ckpt_layer *l = NULL, *base = NULL;
    int L = o->layer < 0 ? 0 : o->layer;
    fm_cli_progress("fp4moe run: loading layer %d from %s...\n", L, o->weights_path);
    FM_CHECK(fm_checkpoint_open(o->weights_path, &ck));
    fm_ckpt_load_opts lo = {0};
    fm_moe_config keep; /* --act-nvfp4 / --act-fp8 alone: the model's routing, plus the activation format */
    if (o->route_set || o->cfg.act_nvfp4 || o->cfg.act_fp8) {
        fm_ckpt_load_opts vo = {.validate_only = 1};
        if (fm_checkpoint_load_layer(ck, L, &vo, &base) != FM_OK) base = NULL; /* the model alone does not say */
        fm_clear_error();
        lo.routing = &o->cfg;
        lo.routing_fields = o->route_set ? o->route_set : 0u;
        if (!o->route_set) { /* --act-nvfp4 / --act-fp8 alone: keep the model's routing, take only that */
            if (!base) {
                fm_status s = fm_checkpoint_load_layer(ck, L, &vo, &base); /* its error is the answer */
                fm_checkpoint_close(ck);
                return s;
            }
            keep = base->cfg;
            keep.act_nvfp4 = o->cfg.act_nvfp4;
            keep.act_fp8 = o->cfg.act_fp8;
            lo.routing = &keep;
        }
    }
    fm_status s = fm_checkpoint_load_layer(ck, L, &lo, &l);
    fm_checkpoint_close(ck); /* the loaded layer owns copies of everything it needs */
    if (s == FM_OK)
        for (int i = 0; i < FM_ROUTE_N; i++) {
            if (!(o->route_set & (1u << i))) continue;
            char now[64], was[64] = "", from[96] = "";
            route_value(&l->cfg, i, now, sizeof now);
            if (base) {
                route_value(&base->cfg, i, was, sizeof was);
                route_origin(base, i, from, sizeof from);
                fprintf(stderr, "fp4moe run: %s from the command line overrides %s (%s)\n", now, was, from);
            } else {
                fprintf(stderr, "fp4moe run: %s from the command line (the checkpoint does not say)\n", now);
            }
        }
    fm_ckpt_layer_free(base);
    if (s != FM_OK) return s;
    warn_not_modelled(l);
    m->ckpt = l;
    m->cfg = l->cfg;
    m->w = l->w;
    return FM_OK;
}

double fm_run_host_bytes(const fm_moe_config *c, int T, int check, int cpu_ws)
{
    double t = T, H = c->hidden, P = t * c->top_k, I = c->inter, S = c->shared_inter;
    double b = t * H * (2.0 + 4.0 + (check ? 4.0 : 0.0)); /* x, out, ref */
    b += t * c->n_experts * 4.0 + P * 12.0;             /* logits, weights, ids (count_active) */
    if (cpu_ws) b += P * (H + 3 * I + H) * 4.0 + P * 16.0 + t * H * 4.0 * 3 + t * 3 * S * 4.0; /* backend_fast.c */
    return b;
}

/* Refuse, before allocating anything big, a run that cannot work: what
 * fm_layer_create would reject, or more host memory than the machine has. */
static fm_status check_run_size(const fm_run_opts *o, const fm_moe_config *c, int T)
{
    if ((long long)T * c->hidden > 2147483647LL)
        return fm_fail(FM_ERR_INVALID_ARG, "%d tokens x hidden %d = %lld elements exceeds 2^31-1, the most a layer takes "
                       "per forward; run fewer tokens", T, c->hidden, (long long)T * c->hidden);
    if ((long long)T * c->top_k > 2147483647LL)
        return fm_fail(FM_ERR_INVALID_ARG, "%d tokens x top_k %d exceeds 2^31-1 routed rows", T, c->top_k);
    int cpu = o->backend == FM_BACKEND_CPU || o->backend == FM_BACKEND_CPU_REF ||
              (o->backend == FM_BACKEND_AUTO && fm_backend_available(FM_BACKEND_CUDA) != FM_OK);
    fm_clear_error();
    double need = fm_run_host_bytes(c, T, o->check, cpu);
    if (!o->weights_path) { /* the random weights too */
        size_t d13 = 0, s13 = 0, d2 = 0, s2 = 0;
        if (fm_qtensor_bytes(c->wfmt, 2LL * c->inter, c->hidden, &d13, &s13) == FM_OK &&
            fm_qtensor_bytes(c->wfmt, c->hidden, c->inter, &d2, &s2) == FM_OK)
            need += (double)(o->global_experts ? o->shard_count : c->n_experts) * (double)(d13 + s13 + d2 + s2);
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    if (have > 0 && need > have)
        return fm_fail(FM_ERR_INVALID_ARG, "%d tokens at hidden %d would need about %.1f GB of host memory (inputs, "
                       "outputs%s and %s buffers); this machine has %.1f GB: run fewer tokens", T, c->hidden, need / 1e9,
                       o->check ? ", the --check reference" : "", cpu ? "CPU backend" : "routing", have / 1e9);
    return FM_OK;
}

/* x from --input: [T][hidden], BF16 bits kept, FP32 rounded to BF16 (RNE). */
static fm_status read_input(const fm_run_opts *o, fm_run_model *m)
{
    fm_npy a;
    FM_CHECK(fm_npy_read(o->input_path, &a));
    fm_status s = FM_OK;
    if (a.ndim != 2 || a.shape[1] != m->cfg.hidden || a.shape[0] < 1 || a.shape[0] > (1 << 20))
        s = fm_fail(FM_ERR_BAD_SHAPE, "%s: shape has %d dims (%lld x %lld...): expected [T][%d] with 1 <= T <= %d "
                    "(T tokens, hidden %d)", o->input_path, a.ndim, (long long)(a.ndim > 0 ? a.shape[0] : 0),
                    (long long)(a.ndim > 1 ? a.shape[1] : 0), m->cfg.hidden, 1 << 20, m->cfg.hidden);
    else if (o->tokens_set && a.shape[0] != o->tokens)
        s = fm_fail(FM_ERR_BAD_SHAPE, "%s holds %lld tokens but --tokens says %d", o->input_path, (long long)a.shape[0],
                    o->tokens);
    if (s == FM_OK) s = check_run_size(o, &m->cfg, (int)a.shape[0]);
    if (s == FM_OK && !(m->x = malloc(a.numel * sizeof *m->x))) s = fm_fail(FM_ERR_OOM, "out of host memory (input)");
    if (s == FM_OK) {
        m->tokens = (int)a.shape[0];
        if (a.dtype == FM_DTYPE_BF16) memcpy(m->x, a.data, a.numel * 2);
        else
            for (uint64_t i = 0; i < a.numel; i++) m->x[i] = fm_bf16_encode(((const float *)a.data)[i]);
    }
    fm_npy_free(&a);
    return s;
}

fm_status fm_run_write_output(const fm_run_opts *o, const fm_run_model *m, const float *out)
{
    if (!o->output_path) return FM_OK;
    int64_t shape[2] = {m->tokens, m->cfg.hidden};
    return fm_npy_write(o->output_path, FM_DTYPE_F32, 2, shape, out);
}

fm_status fm_run_model_build(const fm_run_opts *o, fm_run_model *m)
{
    memset(m, 0, sizeof *m);
    m->cfg = o->cfg;
    m->tokens = o->tokens;
    fm_status s;
    if (o->weights_path) {
        s = load_checkpoint(o, m);
        m->first_held = 0, m->n_held = m->cfg.n_experts;
        if (s == FM_OK && !o->input_path) s = check_run_size(o, &m->cfg, o->tokens);
    } else {
        s = fm_moe_config_check(&m->cfg);
        m->first_held = o->global_experts ? o->shard_first : 0;
        m->n_held = o->global_experts ? o->shard_count : m->cfg.n_experts;
        if (s == FM_OK && (m->n_held < 1 || (long long)m->first_held + m->n_held > m->cfg.n_experts))
            s = fm_fail(FM_ERR_INVALID_ARG, "experts [%d, %d) are not a range of the layer's %d experts",
                        m->first_held, m->first_held + m->n_held, m->cfg.n_experts);
        if (s == FM_OK && !o->input_path) s = check_run_size(o, &m->cfg, o->tokens);
        if (s == FM_OK) s = build_random(o, m);
    }
    if (s == FM_OK) { /* the shard run (checked against cfg by the caller when from a checkpoint) */
        m->shard_first = o->shard_count ? o->shard_first : 0;
        m->shard_n = o->shard_count ? o->shard_count : m->cfg.n_experts;
    }
    int bad_input = 0;
    if (s == FM_OK && o->input_path) {
        bad_input = (s = read_input(o, m)) != FM_OK;
    } else if (s == FM_OK) {
        size_t n = (size_t)o->tokens * m->cfg.hidden;
        m->x = malloc(n * sizeof *m->x);
        if (!m->x) s = fm_fail(FM_ERR_OOM, "out of host memory (input)");
        fm_rng r;
        fm_rng_init(&r, o->seed ^ 0xabcdefull);
        for (size_t i = 0; s == FM_OK && i < n; i++) m->x[i] = fm_bf16_encode(fm_rng_normal_fast(&r));
    }
    if (s == FM_OK) s = count_active(m, m->tokens);
    if (s != FM_OK) fm_run_model_free(m);
    m->bad_input = bad_input;
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
    if (m->shard_first == 0) b += 3.0 * c->shared_inter * (double)c->hidden * 2.0; /* shared expert (BF16) */
    b += (double)T * c->hidden * (2.0 + 4.0);                     /* x (BF16) in, out (FP32) */
    return b;
}

double fm_run_model_flops(const fm_run_model *m, int T)
{
    const fm_moe_config *c = &m->cfg;
    double routed = (double)m->local_rows * 3.0 * c->inter * c->hidden; /* the rows routed to the shard's experts */
    double shared = m->shard_first == 0 ? (double)T * 3.0 * c->shared_inter * c->hidden : 0.0;
    double router = (double)T * c->n_experts * c->hidden;
    return 2.0 * (routed + shared + router);
}
