/* dispatch_check.c - fm_layer_run_dispatched's argument checks, shared by every backend:
 * the rows' encoding (BF16, or FP8 with its per-128-channel scales on a W4A8 layer), the
 * layout's counts / offsets, the workspace, alignment, and what dispatched rows cannot
 * carry (a shared expert). A failure names the argument and what would be accepted. */
#include <stdint.h>
#include <stdio.h>

#include "layer/layer_internal.h"

static int misaligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

fm_status fm_layer_check_dispatch_args(const fm_layer_params *p, const fm_backend_ops *ops,
                                       const fm_layer_dispatch_args *a, const char *who)
{
    if (!a->out) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL out", who);
    if (!a->x == !a->x_fp8)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: give the rows as x (BF16) or as x_fp8 (E4M3 with x_scales), %s", who,
                       a->x ? "not both" : "one of them");
    if (a->x_fp8 && !a->x_scales)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: x_fp8 needs x_scales (FP32, one per 128 channels of each row)", who);
    if (a->x_fp8 && p->cfg.act_fp8 != FM_ACT_FP8_BLOCK128 && ops->supports) {
        /* a backend that cannot run W4A8 at all refuses FP8 rows as unsupported, not as a wrong layer */
        fm_layer_params w4a8 = *p;
        w4a8.cfg.act_fp8 = FM_ACT_FP8_BLOCK128;
        if (ops->supports(&w4a8, 0) != FM_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", fm_last_error());
            return fm_fail(FM_ERR_UNSUPPORTED, "%s: FP8 rows (x_fp8) need a W4A8 layer (act_fp8 = "
                                               "FM_ACT_FP8_BLOCK128), which the %s backend does not run (%s): send "
                                               "BF16 rows (x)", who, ops->name, why);
        }
    }
    if (a->x_fp8 && p->cfg.act_fp8 != FM_ACT_FP8_BLOCK128)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: FP8 rows (x_fp8) carry scales per 128 channels: they need a W4A8 layer "
                                           "with act_fp8 = FM_ACT_FP8_BLOCK128 (this one has act_fp8 %s)",
                       who, fm_act_fp8_name(p->cfg.act_fp8));
    if (a->layout == FM_DISPATCH_EXPERT_MAJOR) {
        if (!a->counts) return fm_fail(FM_ERR_INVALID_ARG, "%s: the expert-major layout needs counts", who);
        if (a->capacity < 1)
            return fm_fail(FM_ERR_INVALID_ARG, "%s: capacity = %d, the expert-major layout needs >= 1 row per expert",
                           who, a->capacity);
    } else if (a->layout == FM_DISPATCH_EXPERT_ROWS) {
        if (!a->offsets) return fm_fail(FM_ERR_INVALID_ARG, "%s: the expert-rows layout needs offsets", who);
    } else {
        return fm_fail(FM_ERR_INVALID_ARG, "%s: layout %d is neither FM_DISPATCH_EXPERT_MAJOR (1) nor "
                                           "FM_DISPATCH_EXPERT_ROWS (2)", who, (int)a->layout);
    }
    if (a->max_rows < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: max_rows = %d: give the most rows the call can receive, or 0 for "
                                           "the layer's max_tokens x top_k", who, a->max_rows);
    if (!p->caller_workspace && a->workspace)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: workspace given to a layer that owns its workspace", who);
    const void *xin = a->x ? (const void *)a->x : (const void *)a->x_fp8;
    if (misaligned(xin, 16) || misaligned(a->out, 16))
        return fm_fail(FM_ERR_MISALIGNED, "%s: %s (%p) and out (%p) must be 16-byte aligned", who,
                       a->x ? "x" : "x_fp8", xin, a->out);
    if (misaligned(a->counts, 4) || misaligned(a->offsets, 4) || misaligned(a->weights, 4) ||
        misaligned(a->x_scales, 4))
        return fm_fail(FM_ERR_MISALIGNED, "%s: counts, offsets, weights and x_scales must be 4-byte aligned", who);
    if (misaligned(a->workspace, 256)) /* as fm_layer_run: the backends' buffers inside it start on 256 B */
        return fm_fail(FM_ERR_MISALIGNED, "%s: workspace (%p) must be 256-byte aligned", who, a->workspace);
    if (p->cfg.shared_inter > 0 && p->first == 0)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: the layer has a shared expert, which runs on the original tokens, not "
                                           "on dispatched rows: create the layer without it (shared_inter = 0) and "
                                           "run the shared expert apart", who);
    if (!ops->run_dispatched)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: the %s backend does not take dispatched rows (fm_layer_run takes "
                                           "tokens in their original order)", who, ops->name);
    return FM_OK;
}
