/* load_routing.c - a loaded layer's routing settings: from the caller, from
 * config.json, or from the defaults of the model's family, and where each one
 * came from (fm_ckpt_layer.route_from, shown by `fp4moe inspect`).
 *
 * Why no fallback: the GLM-5 defaults (sigmoid, x2.5) applied to a Qwen3-MoE
 * checkpoint made a layer that ran, passed `--check` against a reference using
 * the same wrong settings, and was wrong (issue 19). A setting nobody gave is
 * an error naming it.
 */
#include "load_internal.h"

#include <stdio.h>
#include <string.h>

const char *fm_route_setting_name(int setting)
{
    static const char *const k[FM_ROUTE_N] = {"top_k", "score", "renormalize", "routed_scale", "groups"};
    return setting >= 0 && setting < FM_ROUTE_N ? k[setting] : NULL;
}

fm_status fm_load_config(const fm_checkpoint *ck, fm_cfgjson *cj)
{
    if (!fm_checkpoint_dir(ck)) { /* tensors in memory: no config.json, the caller gives the routing */
        *cj = (fm_cfgjson){0};
        return FM_OK;
    }
    FM_CHECK(fm_cfgjson_read(fm_checkpoint_dir(ck), cj));
    if (!cj->has_quant) return FM_OK;
    const char *m = cj->quant_method, *f = cj->quant_format;
    const char *a = cj->quant_algo;
    if (!strcmp(m, "modelopt") && *a && strcmp(a, "NVFP4") && strcmp(a, "MIXED_PRECISION"))
        return fm_fail(FM_ERR_UNSUPPORTED, "unsupported format: config.json quantization_config quant_method \"modelopt\" "
                                           "quant_algo \"%s\" (fp4moe reads ModelOpt NVFP4)", a);
    if (!*m || !strcmp(m, "modelopt") || !strcmp(m, "mxfp4")) return FM_OK;
    if (!strcmp(m, "compressed-tensors") && !strcmp(f, "nvfp4-pack-quantized")) return FM_OK;
    return fm_fail(FM_ERR_UNSUPPORTED,
                   "unsupported format: config.json quantization_config quant_method \"%s\"%s%s%s (fp4moe reads "
                   "modelopt NVFP4, compressed-tensors nvfp4-pack-quantized and gpt-oss mxfp4)",
                   m, *f ? " format \"" : "", f, *f ? "\"" : "");
}

fm_status fm_checkpoint_model_info(const fm_checkpoint *ck, fm_ckpt_model_info *out)
{
    fm_clear_error();
    if (!ck || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_model_info: NULL argument");
    fm_cfgjson cj;
    FM_CHECK(fm_load_config(ck, &cj));
    fm_ckpt_model_info r = {.has_config = cj.present};
    memcpy(r.model_type, cj.model_type, sizeof r.model_type);
    memcpy(r.architecture, cj.arch, sizeof r.architecture);
    memcpy(r.quant_method, cj.quant_method, sizeof r.quant_method);
    memcpy(r.quant_format, cj.quant_format, sizeof r.quant_format);
    *out = r;
    return FM_OK;
}

static void set_from(fm_ckpt_layer *l, int which, fm_route_from from, const char *key)
{
    l->route_from[which] = (fm_route_origin){from, key};
}

fm_status fm_load_routing(const fm_load_ctx *c, const fm_ckpt_load_opts *o, const fm_cfgjson *cj, fm_ckpt_layer *l)
{
    const fm_moe_config *given = o ? o->routing : NULL;
    unsigned mask = given ? (o->routing_fields ? o->routing_fields : FM_ROUTE_ALL) : 0u;
    if (mask & ~FM_ROUTE_ALL)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_load_layer: routing_fields 0x%x has bits beyond 0x%x", mask,
                       FM_ROUTE_ALL);
    const fm_route_family *fam = cj->present ? fm_route_family_find(cj->model_type, cj->arch) : NULL;
    memcpy(l->model_type, cj->model_type, sizeof l->model_type);
    fm_moe_config r = {0};
    unsigned known = 0; /* settings decided so far */
    if (given) {
        if (mask & (1u << FM_ROUTE_TOP_K)) r.top_k = given->top_k;
        if (mask & (1u << FM_ROUTE_SCORE)) r.score = given->score;
        if (mask & (1u << FM_ROUTE_RENORMALIZE)) r.renormalize = given->renormalize;
        if (mask & (1u << FM_ROUTE_SCALE)) r.routed_scale = given->routed_scale;
        if (mask & (1u << FM_ROUTE_GROUPS)) r.n_group = given->n_group, r.topk_group = given->topk_group;
        for (int i = 0; i < FM_ROUTE_N; i++)
            if (mask & (1u << i)) set_from(l, i, FM_ROUTE_FROM_CALLER, NULL);
        known = mask;
    }
    /* config.json keys, those the family's code reads (all of them for an unknown type) */
    int rd_score = !fam || fam->reads_score, rd_renorm = !fam || fam->reads_renorm;
    int rd_scale = !fam || fam->reads_scale, rd_groups = !fam || fam->reads_groups;
#define TAKE(bit, cond, assign, key)                                   \
    if (!(known & (1u << (bit))) && (cond)) {                          \
        assign;                                                        \
        set_from(l, (bit), FM_ROUTE_FROM_CONFIG, (key));               \
        known |= 1u << (bit);                                          \
    }
    TAKE(FM_ROUTE_TOP_K, cj->has_top_k, r.top_k = cj->top_k, cj->top_k_key)
    TAKE(FM_ROUTE_SCORE, rd_score && cj->has_score, r.score = cj->score, "scoring_func")
    TAKE(FM_ROUTE_RENORMALIZE, rd_renorm && cj->has_renorm, r.renormalize = cj->renorm, "norm_topk_prob")
    TAKE(FM_ROUTE_SCALE, rd_scale && cj->has_scale, r.routed_scale = cj->scale, "routed_scaling_factor")
    TAKE(FM_ROUTE_GROUPS, rd_groups && cj->greedy, (r.n_group = 0, r.topk_group = 0), "topk_method")
    TAKE(FM_ROUTE_GROUPS, rd_groups && (cj->has_n_group || cj->has_topk_group),
         (r.n_group = cj->has_n_group ? cj->n_group : fam ? fam->n_group : 0,
          r.topk_group = cj->has_topk_group ? cj->topk_group : fam ? fam->topk_group : 1),
         cj->has_n_group ? "n_group" : "topk_group")
#undef TAKE
    if (fam) { /* the rest from the family */
        const fm_moe_config d = {.top_k = fam->top_k, .score = fam->score, .renormalize = fam->renorm,
                                 .routed_scale = fam->scale, .n_group = fam->n_group, .topk_group = fam->topk_group};
        if (!(known & (1u << FM_ROUTE_TOP_K))) r.top_k = d.top_k;
        if (!(known & (1u << FM_ROUTE_SCORE))) r.score = d.score;
        if (!(known & (1u << FM_ROUTE_RENORMALIZE))) r.renormalize = d.renormalize;
        if (!(known & (1u << FM_ROUTE_SCALE))) r.routed_scale = d.routed_scale;
        if (!(known & (1u << FM_ROUTE_GROUPS))) r.n_group = d.n_group, r.topk_group = d.topk_group;
        for (int i = 0; i < FM_ROUTE_N; i++)
            if (!(known & (1u << i))) set_from(l, i, FM_ROUTE_FROM_MODEL_DEFAULT, NULL);
        known = FM_ROUTE_ALL;
    } else if (cj->present && !(known & (1u << FM_ROUTE_GROUPS))) { /* no n_group key: no groups */
        set_from(l, FM_ROUTE_GROUPS, FM_ROUTE_FROM_ABSENT, NULL);
        known |= 1u << FM_ROUTE_GROUPS;
    }
    if (known != FM_ROUTE_ALL) {
        static const char *const keys[FM_ROUTE_N] = {"num_experts_per_tok", "scoring_func", "norm_topk_prob",
                                                     "routed_scaling_factor", "n_group"};
        char miss[200] = "";
        for (int i = 0; i < FM_ROUTE_N; i++)
            if (!(known & (1u << i)))
                snprintf(miss + strlen(miss), sizeof miss - strlen(miss), "%s%s (%s)", miss[0] ? ", " : "",
                         fm_route_setting_name(i), keys[i]);
        if (!cj->present)
            return fm_fail(FM_ERR_NOT_FOUND,
                           "layer %d: no config.json in '%s', so the routing is unknown; give it explicitly "
                           "(missing: %s)", c->layer, *fm_checkpoint_label(c->ck) ? fm_checkpoint_label(c->ck) : ".", miss);
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "layer %d: config.json model_type \"%s\"%s%s is not a MoE family fp4moe knows (%s) and "
                       "does not give %s; give them explicitly", c->layer, cj->model_type,
                       cj->arch[0] ? ", architecture " : "", cj->arch, fm_route_family_list(), miss);
    }
    /* A global router routes over every expert of the layer (fm_ckpt_load_opts.global_router) */
    const int routed = c->global_router ? c->n_total : c->n;
    l->cfg.top_k = r.top_k < routed ? r.top_k : routed;
    l->cfg.score = r.score;
    l->cfg.renormalize = r.renormalize;
    l->cfg.routed_scale = r.routed_scale;
    l->cfg.act_nvfp4 = given ? given->act_nvfp4 : 0;
    l->cfg.act_fp8 = given ? given->act_fp8 : FM_ACT_FP8_OFF;
    /* Group-limited routing is defined over all experts; a standalone EP shard
     * routes among its own experts only, so groups are dropped there. */
    int full = c->n == c->n_total || c->global_router;
    l->cfg.n_group = full && r.n_group > 1 ? r.n_group : 0;
    l->cfg.topk_group = l->cfg.n_group ? r.topk_group : 0;
    return FM_OK;
}
