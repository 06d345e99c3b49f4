/* layer_supports.c - fm_layer_supports: create's answer without the weights.
 * An engine picks its MoE kernel per layer before loading anything, so the
 * question has to be answerable from the configuration; answering it from the
 * same functions create calls (src/layer.c's fm_layer_check_desc and
 * fm_layer_resolve_backend, each backend's supports op, which its create calls
 * too) keeps the answer and create from drifting apart. */
#include <stdio.h>
#include <string.h>

#include "backend.h"

unsigned fm_weights_features(const fm_moe_weights *w)
{
    return (w->w13_bias || w->w2_bias ? FM_FEATURE_EXPERT_BIAS : 0u) | (w->router_bias ? FM_FEATURE_ROUTER_BIAS : 0u) |
           (w->a1_scale || w->a2_scale ? FM_FEATURE_A_SCALE : 0u);
}

static fm_status answer(fm_layer_params *p, fm_backend_kind kind, unsigned features)
{
    const fm_backend_ops *ops = fm_layer_backend_ops(kind);
    if (!ops || !ops->supports) return FM_OK;
    fm_cuda_device *own = NULL;
    if (kind == FM_BACKEND_CUDA && !p->device) {
        /* create opens ordinal 0 here, and that open can refuse (a build without code
         * for the GPU): the answer includes it */
        FM_CHECK(fm_cuda_device_open(0, &own));
        p->device = own;
    }
    fm_status s = ops->supports(p, features);
    fm_cuda_device_close(own);
    return s;
}

fm_status fm_layer_supports(const fm_layer_desc *d, const fm_moe_config *cfg, unsigned features, char *why,
                            size_t why_len)
{
    fm_clear_error();
    if (why && why_len) why[0] = '\0';
    fm_status s = FM_OK;
    int64_t   first = 0, nl = 0;
    fm_backend_kind kind = FM_BACKEND_AUTO;
    if (features & ~FM_FEATURE_ALL)
        s = fm_fail(FM_ERR_INVALID_ARG, "fm_layer_supports: features=0x%x has bits outside FM_FEATURE_ALL (0x%x)",
                    features, FM_FEATURE_ALL);
    else if ((s = fm_layer_check_desc(d, cfg, &first, &nl)) == FM_OK &&
             (s = fm_layer_resolve_backend(d, &kind)) == FM_OK) {
        fm_layer_params p = {.cfg = *cfg, .max_tokens = d->max_tokens, .first = (int)first, .n_local = (int)nl,
                             .out_dtype = d->out_dtype, .caller_workspace = d->caller_workspace,
                             .device = d->device, .decode_work_list = d->decode_work_list,
                             .row_quantile = d->row_quantile, .pdl_chain = d->pdl_chain,
                             .decode_path = d->decode_path, .act_fp8_path = d->act_fp8_path};
        s = answer(&p, kind, features);
    }
    if (s != FM_OK && why && why_len) snprintf(why, why_len, "%s", fm_last_error());
    return s;
}
