/* weights_check.c - the weight checks every backend shares (fm_layer_create runs them
 * before a backend sees the weights): each expert tensor's format, shape and scales,
 * and the dense tensors finite. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "format/format_internal.h"
#include "layer/layer_internal.h"

static fm_status check_tensor(const fm_qtensor *t, fm_format f, int64_t rows, int64_t cols, const char *what, int e)
{
    if (!t->data || (f != FM_FORMAT_BF16 && !t->scales))
        return fm_fail(FM_ERR_INVALID_ARG, "%s[%d]: NULL data or scales", what, e);
    if (t->fmt != f)
        return fm_fail(FM_ERR_FORMAT, "%s[%d]: format %d differs from the layer's %d", what, e, (int)t->fmt, (int)f);
    if (t->rows != rows || t->cols != cols)
        return fm_fail(FM_ERR_BAD_SHAPE, "%s[%d]: shape [%lld x %lld], expected [%lld x %lld]", what, e,
                       (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    if (!isfinite(t->global_scale) || t->global_scale <= 0.0f)
        return fm_fail(FM_ERR_NONFINITE, "%s[%d]: global scale %g is not finite and positive", what, e,
                       (double)t->global_scale);
    return FM_OK;
}

fm_status fm_moe_weights_check(const fm_moe_config *cfg, const fm_moe_weights *w)
{
    if (!w || !w->router_w || !w->w13 || !w->w2)
        return fm_fail(FM_ERR_INVALID_ARG, "weights: NULL router_w, w13 or w2");
    if (cfg->shared_inter > 0 && (!w->shared_w13 || !w->shared_w2))
        return fm_fail(FM_ERR_INVALID_ARG, "weights: shared_inter=%d but shared expert weights are NULL",
                       cfg->shared_inter);
    if (w->w13_up_global && cfg->wfmt != FM_FORMAT_NVFP4)
        return fm_fail(FM_ERR_FORMAT, "weights: w13_up_global is given but %s weights have no global scales "
                                      "(only NVFP4's do)",
                       fm_format_traits_get(cfg->wfmt) ? fm_format_traits_get(cfg->wfmt)->name : "these");
    for (int e = 0; e < cfg->n_experts; e++) {
        FM_CHECK(check_tensor(&w->w13[e], cfg->wfmt, 2LL * cfg->inter, cfg->hidden, "w13", e));
        /* The up rows' own global (a checkpoint's up weight_scale_2): finite, normal and
         * positive, like w13's; the up rows' decoded values are checked below with it. */
        if (w->w13_up_global && !(isfinite(w->w13_up_global[e]) && w->w13_up_global[e] >= FLT_MIN))
            return fm_fail(FM_ERR_NONFINITE,
                           "w13_up_global[%d] = %g: the global scale of w13[%d]'s up rows must be a finite, "
                           "normal, positive float (>= %g)",
                           e, (double)w->w13_up_global[e], e, (double)FLT_MIN);
        FM_CHECK(check_tensor(&w->w2[e], cfg->wfmt, cfg->hidden, cfg->inter, "w2", e));
        /* Every decoded weight ((e2m1 x block scale) x weight_scale_2) must be
         * finite: a global of 3e38 over a block scale of 448 decodes to Inf,
         * which the backends then blamed on the input ("out overflowed"). */
        const char *too_big = cfg->wfmt == FM_FORMAT_NVFP4 ? "weight_scale_2" : "block scale";
        for (int j = 0; j < 2; j++) {
            char who[96];
            snprintf(who, sizeof who, "%s[%d] (expert %d): %s too large", j ? "w2" : "w13", e, e, too_big);
            if (j == 0 && w->w13_up_global) { /* each half with its own global */
                for (int half = 0; half < 2; half++) {
                    const fm_qtensor t = fm_moe_w13_half(w, e, cfg->inter, half);
                    snprintf(who, sizeof who, "w13[%d] (expert %d) %s rows: %s too large", e, e,
                             half ? "up" : "gate", half ? "w13_up_global" : "weight_scale_2");
                    FM_CHECK(fm_qtensor_check_finite(who, &t));
                }
                continue;
            }
            FM_CHECK(fm_qtensor_check_finite(who, j ? &w->w2[e] : &w->w13[e]));
        }
        /* Expert biases (gpt-oss): finite, so that a NaN in the checkpoint is named here, not
         * reported later as an output that overflowed */
        for (int j = 0; j < 2; j++) {
            const float *b = j ? w->w2_bias : w->w13_bias;
            const int    nb = j ? cfg->hidden : 2 * cfg->inter;
            for (int i = 0; b && i < nb; i++)
                if (!isfinite(b[(size_t)e * nb + i]))
                    return fm_fail(FM_ERR_NONFINITE, "%s[%d][%d] = %g: an expert bias must be finite",
                                   j ? "w2_bias" : "w13_bias", e, i, (double)b[(size_t)e * nb + i]);
        }
        /* Input global scales: fm_quantize's rule for a static NVFP4 global
         * (normal, and the largest value of its grid, 6 x 448 x scale, finite),
         * checked here so that every backend refuses them at create, not each
         * differently in forward. */
        for (int j = 0; j < 2; j++) {
            const float *a = j ? w->a2_scale : w->a1_scale;
            if (a && !(a[e] >= FLT_MIN && isfinite((6.0f * 448.0f) * a[e])))
                return fm_fail(FM_ERR_NONFINITE,
                               "%s[%d] = %g: an NVFP4 input global scale must be a normal float with 6 x 448 x "
                               "scale finite, i.e. in [%g, %g]",
                               j ? "a2_scale" : "a1_scale", e, (double)a[e], (double)FLT_MIN,
                               (double)(FLT_MAX / 2688.0f));
        }
    }
    return FM_OK;
}

/* The router and the shared expert (BF16): finite, so that a NaN in a checkpoint is named
 * here, at create, like a NaN scale; at a run it made every logit of an expert (or every
 * output of the shared expert) NaN, which the backends then blamed on the input ("inputs
 * too large"). cfg->n_experts is the global count: the router spans every expert. */
fm_status fm_layer_check_dense_finite(const fm_moe_config *cfg, const fm_moe_weights *w)
{
    const size_t E = (size_t)cfg->n_experts, H = (size_t)cfg->hidden, S = (size_t)cfg->shared_inter;
    for (size_t i = 0; i < E * H; i++)
        if (!isfinite(w->router_w[i]))
            return fm_fail(FM_ERR_NONFINITE, "router_w[%zu][%zu] = %g: the router weight must be finite", i / H, i % H,
                           (double)w->router_w[i]);
    for (size_t e = 0; w->router_bias && e < E; e++)
        if (!isfinite(w->router_bias[e]))
            return fm_fail(FM_ERR_NONFINITE, "router_bias[%zu] = %g: the router bias must be finite", e,
                           (double)w->router_bias[e]);
    if (S == 0) return FM_OK;
    for (int j = 0; j < 2; j++) {
        const uint16_t *t = j ? w->shared_w2 : w->shared_w13;
        const size_t    rows = j ? H : 2 * S, cols = j ? S : H;
        for (size_t i = 0; i < rows * cols; i++)
            if ((t[i] & 0x7f80u) == 0x7f80u) /* BF16 exponent all ones: Inf or NaN */
                return fm_fail(FM_ERR_NONFINITE, "%s[%zu][%zu] is %s: a shared-expert weight must be finite",
                               j ? "shared_w2" : "shared_w13", i / cols, i % cols, (t[i] & 0x7fu) ? "NaN" : "Inf");
    }
    return FM_OK;
}
