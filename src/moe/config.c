/* config.c - MoE layer configuration: GLM-5 defaults and validation. */
#include "fm_internal.h"

#include <float.h>

void fm_moe_config_default(fm_moe_config *cfg)
{
    if (!cfg) return;
    *cfg = (fm_moe_config){
        .n_experts = 32, /* GLM-5 EP8 shard: 256 routed experts / 8 GPUs */
        .top_k = 8,
        .hidden = 6144,
        .inter = 2048,
        .score = FM_SCORE_SIGMOID,
        .n_group = 0,
        .topk_group = 0,
        .renormalize = 1,
        .routed_scale = 2.5f,
        .shared_inter = 0,
        .wfmt = FM_FORMAT_NVFP4,
        .act_nvfp4 = 0,
        .activation = FM_ACT_SWIGLU,
        .swiglu_limit = 0.0f,
        .act_fp8 = FM_ACT_FP8_OFF,
    };
}

const char *fm_score_name(fm_score_func s)
{
    switch (s) {
    case FM_SCORE_SOFTMAX: return "softmax";
    case FM_SCORE_SIGMOID: return "sigmoid";
    case FM_SCORE_SOFTMAX_TOPK: return "softmax-topk";
    }
    return "?";
}

const char *fm_activation_name(fm_activation a)
{
    switch (a) {
    case FM_ACT_SWIGLU: return "swiglu";
    case FM_ACT_SWIGLU_GPTOSS: return "swiglu-gptoss";
    }
    return "?";
}

const char *fm_act_fp8_name(fm_act_fp8 a)
{
    switch (a) {
    case FM_ACT_FP8_OFF: return "off";
    case FM_ACT_FP8_BLOCK128: return "block128";
    case FM_ACT_FP8_TOKEN: return "token";
    }
    return "?";
}

fm_status fm_moe_config_check(const fm_moe_config *c)
{
    if (!c) return fm_fail(FM_ERR_INVALID_ARG, "config is NULL");
    const fm_format_traits *tr = fm_format_traits_get(c->wfmt);
    if (!tr) return fm_fail(FM_ERR_FORMAT, "config: unknown weight format %d", (int)c->wfmt);
    if (c->n_experts < 1 || c->hidden < 1 || c->inter < 1)
        return fm_fail(FM_ERR_BAD_SHAPE, "config: n_experts=%d hidden=%d inter=%d must all be >= 1", c->n_experts,
                       c->hidden, c->inter);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return fm_fail(FM_ERR_INVALID_ARG, "config: top_k=%d must be in [1, n_experts=%d]", c->top_k, c->n_experts);
    if (c->score != FM_SCORE_SOFTMAX && c->score != FM_SCORE_SIGMOID && c->score != FM_SCORE_SOFTMAX_TOPK)
        return fm_fail(FM_ERR_INVALID_ARG, "config: unknown score function %d", (int)c->score);
    if (!(c->routed_scale > 0.0f && c->routed_scale < 1e30f))
        return fm_fail(FM_ERR_INVALID_ARG, "config: routed_scale=%g must be in (0, 1e30)", (double)c->routed_scale);
    if (c->shared_inter < 0) return fm_fail(FM_ERR_BAD_SHAPE, "config: shared_inter=%d < 0", c->shared_inter);
    if (c->n_group > 1) {
        if (c->n_experts % c->n_group)
            return fm_fail(FM_ERR_INVALID_ARG, "config: n_group=%d does not divide n_experts=%d", c->n_group,
                           c->n_experts);
        if (c->topk_group < 1 || c->topk_group > c->n_group)
            return fm_fail(FM_ERR_INVALID_ARG, "config: topk_group=%d must be in [1, n_group=%d]", c->topk_group,
                           c->n_group);
        if (c->top_k > c->topk_group * (c->n_experts / c->n_group))
            return fm_fail(FM_ERR_INVALID_ARG, "config: top_k=%d exceeds the %d experts in the %d kept groups",
                           c->top_k, c->topk_group * (c->n_experts / c->n_group), c->topk_group);
    } else if (c->n_group < 0) {
        return fm_fail(FM_ERR_INVALID_ARG, "config: n_group=%d < 0", c->n_group);
    }
    /* K of FC1 is hidden, K of FC2 is inter: both must be whole blocks. */
    int blk = tr->block ? tr->block : 1;
    if (c->hidden % blk || c->inter % blk)
        return fm_fail(FM_ERR_BAD_SHAPE, "config: hidden=%d and inter=%d must be multiples of the %s block (%d)",
                       c->hidden, c->inter, tr->name, blk);
    if (c->act_nvfp4 && (c->hidden % 16 || c->inter % 16))
        return fm_fail(FM_ERR_BAD_SHAPE, "config: act_nvfp4 needs hidden and inter multiples of 16");
    if (c->activation != FM_ACT_SWIGLU && c->activation != FM_ACT_SWIGLU_GPTOSS)
        return fm_fail(FM_ERR_INVALID_ARG, "config: unknown activation %d (expected FM_ACT_SWIGLU 0 or "
                       "FM_ACT_SWIGLU_GPTOSS 1)", (int)c->activation);
    if (c->activation == FM_ACT_SWIGLU_GPTOSS && !(c->swiglu_limit > 0.0f && c->swiglu_limit <= FLT_MAX))
        return fm_fail(FM_ERR_INVALID_ARG, "config: swiglu_limit=%g: gpt-oss's clamped SwiGLU needs a finite limit > 0",
                       (double)c->swiglu_limit);
    if (c->activation == FM_ACT_SWIGLU && c->swiglu_limit != 0.0f)
        return fm_fail(FM_ERR_INVALID_ARG, "config: swiglu_limit=%g is gpt-oss's clamp (FM_ACT_SWIGLU_GPTOSS); plain "
                       "SwiGLU takes 0", (double)c->swiglu_limit);
    if (c->act_fp8 != FM_ACT_FP8_OFF && c->act_fp8 != FM_ACT_FP8_BLOCK128 && c->act_fp8 != FM_ACT_FP8_TOKEN)
        return fm_fail(FM_ERR_INVALID_ARG, "config: unknown act_fp8 %d (expected FM_ACT_FP8_OFF 0, _BLOCK128 1 or "
                       "_TOKEN 2)", (int)c->act_fp8);
    if (c->act_fp8 && c->act_nvfp4)
        return fm_fail(FM_ERR_INVALID_ARG, "config: act_fp8 (W4A8) and act_nvfp4 (W4A4) are two activation formats: "
                       "choose one");
    if (c->shared_inter % 16 && c->shared_inter)
        return fm_fail(FM_ERR_BAD_SHAPE, "config: shared_inter=%d must be a multiple of 16", c->shared_inter);
    return FM_OK;
}
