/* load.c - fm_checkpoint_load_layer: the parts every layout shares.
 *
 * Order of work: resolve names; take the expert count and hidden size from the
 * router weight (the one tensor every MoE layer has, [n_total][hidden]); check
 * the expert range; let the layout file validate and convert the experts;
 * then the routing settings (load_routing.c: caller, config.json, the model
 * type's family; never a silent default); the router rows, the optional bias
 * and shared expert; optional 128x4 swizzled
 * scales; finally fm_moe_config_check + fm_moe_weights_check, so what is handed
 * out is a layer fm_layer_create accepts.
 */
#define _POSIX_C_SOURCE 200809L
#include "load_internal.h"

#include "backend.h" /* fm_moe_weights_check */
#include "fm_file.h"
#include "format/format_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fm_ckpt_layer_free(fm_ckpt_layer *l)
{
    if (!l) return;
    int n = l->n_local;
    for (int e = 0; l->w13_sf_swizzled && e < n; e++) free(l->w13_sf_swizzled[e]);
    for (int e = 0; l->w2_sf_swizzled && e < n; e++) free(l->w2_sf_swizzled[e]);
    free(l->w13_sf_swizzled);
    free(l->w2_sf_swizzled);
    free(l->owned_);
    free(l->w13);
    free(l->w2);
    free(l->router_w);
    free(l->router_bias);
    free(l->a1_scale);
    free(l->a2_scale);
    free(l->shared_w13);
    free(l->shared_w2);
    free(l->w13_bias);
    free(l->w2_bias);
    free(l->w13_up_global);
    free(l);
}

/* The router weight and its optional bias: the ranking bias of the names, or,
 * with FM_SCORE_SOFTMAX_TOPK on a gpt-oss layout, the router's logit bias
 * ("...router.bias" next to "...router.weight"), which that score adds to the logits. */
static fm_status load_router(const fm_load_ctx *c, fm_ckpt_layer *l)
{
    const fm_st_tensor *t, *bias = NULL;
    FM_CHECK(fm_load_find(c, c->nm.router, -1, NULL, NULL, &t));
    const char *bias_pat = c->nm.router_bias;
    char rb[512];
    size_t rl = strlen(c->nm.router);
    if (!bias_pat && c->nm.layout == FM_LAYOUT_GPT_OSS && l->cfg.score == FM_SCORE_SOFTMAX_TOPK && rl > 7 &&
        rl < sizeof rb && !strcmp(c->nm.router + rl - 7, ".weight")) {
        memcpy(rb, c->nm.router, rl - 7);
        strcpy(rb + rl - 7, ".bias");
        bias_pat = rb;
    }
    if (bias_pat && fm_load_find(c, bias_pat, -1, NULL, NULL, &bias) == FM_OK) { /* optional */
        if (bias_pat == rb) l->ignored_router_bias = 0;
        if (bias->dtype != FM_DTYPE_F32 && bias->dtype != FM_DTYPE_BF16 && bias->dtype != FM_DTYPE_F16)
            return fm_fail(FM_ERR_FORMAT, "%s: router bias '%s' has dtype %s, expected F32, BF16 or F16", bias->file,
                           bias->name, fm_dtype_name(bias->dtype));
        int64_t want = c->n_total;
        FM_CHECK(fm_load_expect(bias, bias->dtype, -1, 1, &want)); /* FM_ERR_BAD_SHAPE naming both shapes */
    }
    fm_clear_error();
    l->has_router_bias = bias != NULL;
    if (c->dry) return FM_OK;
    /* the rows of the loaded experts, or all of them for a global router */
    const int64_t r0 = c->global_router ? 0 : c->first;
    size_t rows = (size_t)(c->global_router ? c->n_total : c->n), H = (size_t)c->hidden;
    l->router_w = malloc(rows * H * sizeof *l->router_w);
    if (!l->router_w) return fm_fail(FM_ERR_OOM, "router weight: out of memory");
    FM_CHECK(fm_st_to_f32(t, r0 * (int64_t)H, (int64_t)(rows * H), l->router_w));
    if (!bias) return FM_OK;
    if (!(l->router_bias = malloc(rows * sizeof *l->router_bias))) return fm_fail(FM_ERR_OOM, "out of memory");
    return fm_st_to_f32(bias, r0, (int64_t)rows, l->router_bias);
}

/* One shared-expert projection [N][K] into BF16 dst (NULL: validate only,
 * which reads the NVFP4 block scales for NaN codes as a load would):
 * a BF16 weight is copied; an NVFP4 one (ModelOpt tensors) is dequantized and
 * rounded to BF16, since fp4moe's shared expert is a BF16 MLP. */
static fm_status shared_proj(const fm_load_ctx *c, const char *proj, int nvfp4, int64_t N, int64_t K, uint16_t *dst)
{
    const fm_st_tensor *w, *sc = NULL;
    float g = 1.0f;
    const fm_nvfp4_suffixes *sx = fm_nvfp4_suffixes_of(c->nm.layout);
    FM_CHECK(fm_load_find(c, c->nm.shared, -1, proj, nvfp4 ? sx->weight : ".weight", &w));
    int64_t ws[2] = {N, nvfp4 ? K / 2 : K}, ss[2] = {N, K / 16};
    FM_CHECK(fm_load_expect(w, nvfp4 ? FM_DTYPE_U8 : FM_DTYPE_BF16, -1, 2, ws));
    if (nvfp4) {
        const fm_st_tensor *gt;
        FM_CHECK(fm_load_find(c, c->nm.shared, -1, proj, sx->scale, &sc));
        FM_CHECK(fm_load_expect(sc, FM_DTYPE_F8_E4M3, FM_DTYPE_U8, 2, ss));
        FM_CHECK(fm_load_find(c, c->nm.shared, -1, proj, sx->global, &gt));
        FM_CHECK(fm_load_global(gt, sx->reciprocal, &g));
    }
    if (!dst) return nvfp4 ? fm_load_scales(sc, -1, 0, N, K / 16, FM_SCALE_E4M3, NULL) : FM_OK;
    size_t n = (size_t)(N * K);
    if (!nvfp4) return fm_st_read(w, 0, n * 2, dst);
    float *tmp = malloc(n * sizeof *tmp);
    uint8_t *codes = malloc(w->nbytes + sc->nbytes + 1); /* data, then scales */
    fm_status s = tmp && codes ? FM_OK : fm_fail(FM_ERR_OOM, "shared expert: out of memory");
    if (s == FM_OK) s = fm_st_read(w, 0, (size_t)w->nbytes, codes);
    if (s == FM_OK) s = fm_load_scales(sc, -1, 0, N, K / 16, FM_SCALE_E4M3, codes + w->nbytes);
    fm_qtensor q = {.fmt = FM_FORMAT_NVFP4, .rows = N, .cols = K, .data = codes, .scales = codes + w->nbytes,
                    .global_scale = g};
    if (s == FM_OK) s = fm_dequantize(&q, tmp);
    for (size_t i = 0; s == FM_OK && i < n; i++) dst[i] = fm_bf16_encode(tmp[i]);
    free(codes);
    free(tmp);
    return s;
}

/* Shared expert (optional): BF16 or NVFP4 gate/up/down, held as BF16. */
static fm_status load_shared(const fm_load_ctx *c, fm_ckpt_layer *l)
{
    if (!c->nm.shared) return FM_OK;
    const char *up = c->nm.proj_up ? c->nm.proj_up : "up_proj";
    const fm_st_tensor *g;
    const fm_nvfp4_suffixes *sx = fm_nvfp4_suffixes_of(c->nm.layout);
    /* BF16 ".weight" (a shared expert left unquantized), else the layout's NVFP4 weight */
    if (fm_load_find(c, c->nm.shared, -1, c->nm.proj_gate, ".weight", &g) != FM_OK &&
        (!sx || fm_load_find(c, c->nm.shared, -1, c->nm.proj_gate, sx->weight, &g) != FM_OK)) { /* none */
        fm_clear_error();
        return FM_OK;
    }
    int nvfp4 = g->dtype == FM_DTYPE_U8;
    if ((g->dtype != FM_DTYPE_BF16 && !nvfp4) || g->ndim != 2 || g->shape[0] < 1 || g->shape[0] > (1 << 20))
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: shared expert '%s' is %s with %d dims: expected BF16 or U8 (NVFP4) [N][K]",
                       g->file, g->name, fm_dtype_name(g->dtype), g->ndim);
    int64_t si = g->shape[0], H = c->hidden;
    if (nvfp4 && (H % 16 || si % 16))
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: NVFP4 shared expert '%s': hidden %lld and inter %lld must be multiples of 16",
                       g->file, g->name, (long long)H, (long long)si);
    size_t half = (size_t)(si * H);
    if (!c->dry) {
        l->shared_w13 = malloc(2 * half * sizeof *l->shared_w13);
        l->shared_w2 = malloc(half * sizeof *l->shared_w2);
        if (!l->shared_w13 || !l->shared_w2) return fm_fail(FM_ERR_OOM, "shared expert: out of memory");
    }
    /* validate all three before converting any */
    FM_CHECK(shared_proj(c, c->nm.proj_gate, nvfp4, si, H, NULL));
    FM_CHECK(shared_proj(c, up, nvfp4, si, H, NULL));
    FM_CHECK(shared_proj(c, c->nm.proj_down, nvfp4, H, si, NULL));
    l->cfg.shared_inter = (int)si;
    if (c->dry) return FM_OK;
    FM_CHECK(shared_proj(c, c->nm.proj_gate, nvfp4, si, H, l->shared_w13));    /* gate rows */
    FM_CHECK(shared_proj(c, up, nvfp4, si, H, l->shared_w13 + half));          /* then up rows */
    return shared_proj(c, c->nm.proj_down, nvfp4, H, si, l->shared_w2);
}

static fm_status swizzle_all(fm_ckpt_layer *l)
{
    int n = l->n_local;
    if (l->cfg.wfmt == FM_FORMAT_BF16) return FM_OK; /* no block scales */
    l->w13_sf_swizzled = calloc((size_t)n, sizeof *l->w13_sf_swizzled);
    l->w2_sf_swizzled = calloc((size_t)n, sizeof *l->w2_sf_swizzled);
    if (!l->w13_sf_swizzled || !l->w2_sf_swizzled) return fm_fail(FM_ERR_OOM, "swizzled scales: out of memory");
    int blk = fm_format_traits_get(l->cfg.wfmt)->block;
    for (int e = 0; e < n; e++) {
        const fm_qtensor *q[2] = {&l->w13[e], &l->w2[e]};
        uint8_t **dst[2] = {&l->w13_sf_swizzled[e], &l->w2_sf_swizzled[e]};
        for (int k = 0; k < 2; k++) {
            size_t bytes = fm_sf_swizzled_bytes(q[k]->rows, q[k]->cols / blk);
            if (!bytes || !(*dst[k] = malloc(bytes))) return fm_fail(FM_ERR_OOM, "swizzled scales: out of memory");
            FM_CHECK(fm_sf_swizzle(q[k]->scales, q[k]->rows, q[k]->cols / blk, *dst[k]));
        }
    }
    return FM_OK;
}

static fm_status load_into(const fm_load_ctx *c, const fm_ckpt_load_opts *o, const fm_cfgjson *cj, fm_ckpt_layer *l)
{
    l->layer = c->layer;
    l->first_expert = c->first;
    l->n_local = c->n;
    l->layout = c->nm.layout;
    l->cfg.n_experts = c->n;
    l->cfg.hidden = c->hidden;
    if (c->nm.layout == FM_LAYOUT_GPT_OSS) {
        FM_CHECK(fm_load_gptoss(c, l));
        /* gpt-oss's experts: its clamped SwiGLU, the clamp from config.json (transformers'
         * GptOssConfig default 7.0) */
        l->cfg.activation = FM_ACT_SWIGLU_GPTOSS;
        l->cfg.swiglu_limit = cj && cj->has_swiglu_limit ? cj->swiglu_limit : 7.0f;
    } else {
        FM_CHECK(fm_load_modelopt(c, l));
    }
    /* Routing before the router (the score decides what its bias is), but a
     * routing error is reported after the tensors validated: a broken tensor
     * is the first thing to fix. */
    char rmsg[1024] = "";
    fm_status rs = fm_load_routing(c, o, cj, l);
    if (rs != FM_OK) snprintf(rmsg, sizeof rmsg, "%s", fm_last_error());
    FM_CHECK(load_router(c, l));
    FM_CHECK(load_shared(c, l));
    if (rs != FM_OK) return fm_fail(rs, "%s", rmsg);
    l->w = (fm_moe_weights){.router_w = l->router_w, .router_bias = l->router_bias, .w13 = l->w13, .w2 = l->w2,
                            .a1_scale = l->a1_scale, .a2_scale = l->a2_scale, .shared_w13 = l->shared_w13,
                            .shared_w2 = l->shared_w2, .w13_bias = l->w13_bias, .w2_bias = l->w2_bias,
                            .w13_up_global = l->w13_up_global};
    if (o && o->swizzle_scales && !c->dry) FM_CHECK(swizzle_all(l));
    if (c->global_router) l->cfg.n_experts = c->n_total; /* the experts held stay the shard's (n_local) */
    fm_status s = fm_moe_config_check(&l->cfg);
    if (s != FM_OK)
        return fm_fail(s, "layer %d: the loaded configuration is invalid: %s", c->layer, fm_last_error());
    fm_moe_config held = l->cfg; /* the weights check counts the experts held */
    held.n_experts = l->n_local;
    return c->dry ? FM_OK : fm_moe_weights_check(&held, &l->w);
}

fm_status fm_checkpoint_load_layer(const fm_checkpoint *ck, int layer, const fm_ckpt_load_opts *opts,
                                   fm_ckpt_layer **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_load_layer: out is NULL");
    *out = NULL;
    if (!ck) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_load_layer: checkpoint is NULL");
    if (layer < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_load_layer: layer %d < 0", layer);
    fm_load_ctx c = {.ck = ck, .layer = layer, .dry = opts && opts->validate_only,
                     .global_router = opts && opts->global_router};
    fm_cfgjson cj; /* first: an unreadable config.json or a quantization fp4moe does not read says so */
    FM_CHECK(fm_load_config(ck, &cj));
    fm_status ns = fm_ckpt_names_resolve(ck, opts ? opts->names : NULL, &c.nm);
    if (ns == FM_ERR_NOT_FOUND) /* expert-like tensors in no layout: a format, not an absence */
        for (size_t i = 0; i < fm_checkpoint_tensor_count(ck); i++) {
            const fm_st_tensor *t = fm_checkpoint_tensor_at(ck, i);
            if (strstr(t->name, ".experts.") || strstr(t->name, ".experts_"))
                return fm_fail(FM_ERR_UNSUPPORTED,
                               "unsupported format: expert tensors such as '%s' (%s) match none of the layouts fp4moe "
                               "reads (modelopt, compressed-tensors nvfp4-pack-quantized, gpt-oss mxfp4)",
                               t->name, fm_dtype_name(t->dtype));
        }
    if (ns != FM_OK) return ns;
    const fm_st_tensor *r;
    if (fm_load_find(&c, c.nm.router, -1, NULL, NULL, &r) != FM_OK)
        return fm_fail(FM_ERR_NOT_FOUND, "layer %d: no router weight (%s, layout %s): not a MoE layer of this checkpoint",
                       layer, c.nm.router, fm_ckpt_layout_name(c.nm.layout));
    if (r->ndim != 2 || r->shape[0] < 1 || r->shape[1] < 1 || r->shape[0] > (1 << 20) || r->shape[1] > (1 << 24))
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: router '%s' should be [n_experts][hidden]", r->file, r->name);
    if (r->dtype != FM_DTYPE_BF16 && r->dtype != FM_DTYPE_F32 && r->dtype != FM_DTYPE_F16)
        return fm_fail(FM_ERR_FORMAT, "%s: router '%s' has dtype %s, expected BF16, F16 or F32", r->file, r->name,
                       fm_dtype_name(r->dtype));
    c.n_total = (int)r->shape[0];
    c.hidden = (int)r->shape[1];
    /* 64-bit: first_expert and n_experts are any ints (INT_MIN, INT_MAX + 1 ...) */
    const int64_t first = opts ? opts->first_expert : 0;
    if (opts && opts->n_experts < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "layer %d: n_experts %d < 0 (0 = all from first_expert)", layer,
                       opts->n_experts);
    const int64_t n = opts && opts->n_experts ? opts->n_experts : c.n_total - first;
    if (first < 0 || n < 1 || first + n > c.n_total)
        return fm_fail(FM_ERR_OUT_OF_RANGE, "layer %d: experts [%lld, %lld) outside the layer's [0, %d)", layer,
                       (long long)first, (long long)(first + n), c.n_total);
    c.first = (int)first;
    c.n = (int)n;
    FM_CHECK(fm_ckpt_check_expert_indices(ck, &c.nm, layer, c.n_total));
    fm_ckpt_layer *l = calloc(1, sizeof *l);
    if (!l) return fm_fail(FM_ERR_OOM, "out of memory");
    fm_status s = load_into(&c, opts, &cj, l);
    if (s != FM_OK) {
        fm_ckpt_layer_free(l);
        return s;
    }
    *out = l;
    return FM_OK;
}
