/* layer.c - backend selection and the checks every backend shares, so that a
 * backend only sees validated input and the caller's buffers are untouched on
 * failure. */
#include "backend.h"
#include "format/format_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct fm_layer {
    const fm_backend_ops *ops;
    fm_backend_kind       kind;
    fm_moe_config         cfg;
    int                   max_tokens;
    void                 *state;
};

static const char *const k_backend_names[FM_BACKEND_COUNT] = {
    [FM_BACKEND_AUTO] = "auto", [FM_BACKEND_CPU_REF] = "cpu-ref", [FM_BACKEND_CPU] = "cpu", [FM_BACKEND_CUDA] = "cuda"};

const char *fm_version(void) { return "0.1.0"; }

const char *fm_backend_name(fm_backend_kind k)
{
    return ((int)k >= 0 && k < FM_BACKEND_COUNT) ? k_backend_names[k] : "unknown";
}

fm_status fm_backend_parse(const char *name, fm_backend_kind *out)
{
    fm_clear_error();
    if (!name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_backend_parse: NULL argument");
    for (int k = 0; k < FM_BACKEND_COUNT; k++)
        if (strcasecmp(name, k_backend_names[k]) == 0) {
            *out = (fm_backend_kind)k;
            return FM_OK;
        }
    return fm_fail(FM_ERR_INVALID_ARG, "unknown backend '%s' (expected auto, cpu-ref, cpu or cuda)", name);
}

static const fm_backend_ops *ops_of(fm_backend_kind k)
{
    switch (k) {
    case FM_BACKEND_CPU_REF: return &fm_cpu_ref_ops;
    case FM_BACKEND_CPU: return &fm_cpu_ops;
#ifdef FM_HAVE_CUDA
    case FM_BACKEND_CUDA: return &fm_cuda_ops;
#endif
    default: return NULL;
    }
}

fm_status fm_backend_available(fm_backend_kind k)
{
    fm_clear_error();
    if (k == FM_BACKEND_AUTO) return FM_OK;
    if ((int)k < 0 || k >= FM_BACKEND_COUNT)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_backend_available: unknown backend %d", (int)k);
    const fm_backend_ops *ops = ops_of(k);
    if (!ops)
        return fm_fail(FM_ERR_NO_BACKEND, "backend '%s' is not compiled into this build (built without nvcc)",
                       fm_backend_name(k));
    return ops->available();
}

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
    for (int e = 0; e < cfg->n_experts; e++) {
        FM_CHECK(check_tensor(&w->w13[e], cfg->wfmt, 2LL * cfg->inter, cfg->hidden, "w13", e));
        FM_CHECK(check_tensor(&w->w2[e], cfg->wfmt, cfg->hidden, cfg->inter, "w2", e));
        /* Every decoded weight ((e2m1 x block scale) x weight_scale_2) must be
         * finite: a global of 3e38 over a block scale of 448 decodes to Inf,
         * which the backends then blamed on the input ("out overflowed"). */
        const char *too_big = cfg->wfmt == FM_FORMAT_NVFP4 ? "weight_scale_2" : "block scale";
        for (int j = 0; j < 2; j++) {
            char who[96];
            snprintf(who, sizeof who, "%s[%d] (expert %d): %s too large", j ? "w2" : "w13", e, e, too_big);
            FM_CHECK(fm_qtensor_check_finite(who, j ? &w->w2[e] : &w->w13[e]));
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

fm_status fm_layer_create(fm_backend_kind kind, const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens,
                          fm_layer **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: out is NULL");
    *out = NULL;
    if (!cfg) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: cfg is NULL");
    if (max_tokens < 1) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: max_tokens=%d < 1", max_tokens);
    FM_CHECK(fm_moe_config_check(cfg));
    /* Every backend indexes routed rows (token x slot) and token x hidden with
     * 32-bit ints on the device: bound both here, once, for all of them. */
    if ((int64_t)max_tokens * cfg->top_k > INT32_MAX || (int64_t)max_tokens * cfg->hidden > INT32_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fm_layer_create: max_tokens=%d x top_k=%d (or x hidden=%d) exceeds 2^31-1 elements",
                       max_tokens, cfg->top_k, cfg->hidden);
    FM_CHECK(fm_moe_weights_check(cfg, w));
    if (kind == FM_BACKEND_AUTO) kind = fm_backend_available(FM_BACKEND_CUDA) == FM_OK ? FM_BACKEND_CUDA : FM_BACKEND_CPU;
    FM_CHECK(fm_backend_available(kind));
    fm_layer *l = calloc(1, sizeof *l);
    if (!l) return fm_fail(FM_ERR_OOM, "fm_layer_create: out of host memory");
    l->ops = ops_of(kind);
    l->kind = kind;
    l->cfg = *cfg;
    l->max_tokens = max_tokens;
    fm_status s = l->ops->create(cfg, w, max_tokens, &l->state);
    if (s != FM_OK) {
        free(l);
        return s;
    }
    *out = l;
    return FM_OK;
}

fm_status fm_layer_forward(fm_layer *l, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    fm_clear_error();
    if (!l || !x || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_forward: NULL layer, x or out");
    if (T < 1 || T > l->max_tokens)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_layer_forward: T=%d outside [1, max_tokens=%d]", T, l->max_tokens);
    size_t n = (size_t)T * l->cfg.hidden;
    for (size_t i = 0; i < n; i++)
        if ((x[i] & 0x7f80u) == 0x7f80u) /* BF16 exponent all ones: Inf or NaN */
            return fm_fail(FM_ERR_NONFINITE, "fm_layer_forward: x[%zu][%zu] is NaN or Inf (policy: reject)",
                           i / l->cfg.hidden, i % l->cfg.hidden);
    return l->ops->forward(l->state, x, T, out, stats);
}

fm_backend_kind fm_layer_backend(const fm_layer *l) { return l ? l->kind : FM_BACKEND_AUTO; }

void fm_layer_destroy(fm_layer *l)
{
    if (!l) return;
    l->ops->destroy(l->state);
    free(l);
}
