/* load_common.c - the tensor helpers of the layer loader (load_internal.h): find a
 * tensor by pattern, check its dtype and shape, read a scalar or a global scale,
 * read and check block scales, and the one allocation of a layer's experts. Used by
 * load.c and the layout files (load_modelopt.c, load_gptoss.c); calls none of them. */
#include "load_internal.h"

#include "format/format_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

fm_status fm_load_find(const fm_load_ctx *c, const char *pat, int expert, const char *proj, const char *suffix,
                       const fm_st_tensor **out)
{
    char name[512];
    if (!fm_pat_format(name, sizeof name, pat, c->layer, expert, proj, suffix))
        return fm_fail(FM_ERR_INVALID_ARG, "tensor name from pattern '%s' is too long", pat);
    if (fm_checkpoint_find(c->ck, name, out) == FM_OK) return FM_OK;
    if (expert >= 0)
        return fm_fail(FM_ERR_NOT_FOUND, "layer %d expert %d: no tensor '%s' in the checkpoint", c->layer, expert,
                       name);
    return fm_fail(FM_ERR_NOT_FOUND, "layer %d: no tensor '%s' in the checkpoint", c->layer, name);
}

fm_status fm_load_scalar(const fm_st_tensor *t, float *out)
{
    if (fm_st_numel(t->ndim, t->shape) != 1 || t->ndim > 1)
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s' should be a scalar ([] or [1])", t->file, t->name);
    FM_CHECK(fm_st_to_f32(t, 0, 1, out));
    if (!isfinite(*out) || *out <= 0.0f)
        return fm_fail(FM_ERR_NONFINITE, "%s: tensor '%s' = %g, must be finite and > 0", t->file, t->name,
                       (double)*out);
    return FM_OK;
}

const fm_nvfp4_suffixes *fm_nvfp4_suffixes_of(fm_ckpt_layout l)
{
    static const fm_nvfp4_suffixes mo = {".weight", ".weight_scale", ".weight_scale_2", ".input_scale", 0};
    static const fm_nvfp4_suffixes ct = {".weight_packed", ".weight_scale", ".weight_global_scale",
                                         ".input_global_scale", 1};
    return l == FM_LAYOUT_COMPRESSED_TENSORS ? &ct : l == FM_LAYOUT_MODELOPT || l == FM_LAYOUT_AUTO ? &mo : NULL;
}

fm_status fm_load_global(const fm_st_tensor *t, int reciprocal, float *out)
{
    float v;
    FM_CHECK(fm_load_scalar(t, &v));
    if (reciprocal) {
        float r = 1.0f / v; /* IEEE division: the correctly rounded reciprocal */
        if (!isfinite(r) || r <= 0.0f)
            return fm_fail(FM_ERR_NONFINITE, "%s: tensor '%s' = %g: its reciprocal %g is not a usable scale", t->file,
                           t->name, (double)v, (double)r);
        v = r;
    }
    *out = v;
    return FM_OK;
}

fm_status fm_load_expect(const fm_st_tensor *t, fm_dtype d, int d2, int ndim, const int64_t *shape)
{
    if (t->dtype != d && (d2 < 0 || t->dtype != (fm_dtype)d2))
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s%s%s", t->file, t->name,
                       fm_dtype_name(t->dtype), fm_dtype_name(d), d2 >= 0 ? " or " : "",
                       d2 >= 0 ? fm_dtype_name((fm_dtype)d2) : "");
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[160], want[160];
        fm_st_tensor w = {.ndim = ndim};
        memcpy(w.shape, shape, (size_t)ndim * sizeof *shape);
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s' has shape %s, expected %s", t->file, t->name,
                       fm_st_shape_str(t, got, sizeof got), fm_st_shape_str(&w, want, sizeof want));
    }
    return FM_OK;
}

fm_status fm_load_alloc_experts(const fm_load_ctx *c, fm_ckpt_layer *l, fm_format f, int64_t inter,
                                fm_load_expert_bytes *bytes)
{
    const int n = c->n;
    const int64_t H = c->hidden;
    fm_load_expert_bytes b;
    FM_CHECK(fm_qtensor_bytes(f, 2 * inter, H, &b.d13, &b.s13));
    FM_CHECK(fm_qtensor_bytes(f, H, inter, &b.d2, &b.s2));
    size_t per = b.d13 + b.s13 + b.d2 + b.s2;
    l->w13 = calloc((size_t)n, sizeof *l->w13);
    l->w2 = calloc((size_t)n, sizeof *l->w2);
    if (per > SIZE_MAX / (size_t)n || !l->w13 || !l->w2 || !(l->owned_ = malloc(per * (size_t)n)))
        return fm_fail(FM_ERR_OOM, "layer %d: out of memory for %d experts (%zu bytes each)", c->layer, n, per);
    for (int i = 0; i < n; i++) {
        uint8_t *p = (uint8_t *)l->owned_ + (size_t)i * per, *p2 = p + b.d13 + b.s13;
        l->w13[i] = (fm_qtensor){.fmt = f, .rows = 2 * inter, .cols = H, .data = p,
                                 .scales = b.s13 ? p + b.d13 : NULL, .global_scale = 1.0f};
        l->w2[i] = (fm_qtensor){.fmt = f, .rows = H, .cols = inter, .data = p2, .scales = b.s2 ? p2 + b.d2 : NULL,
                                .global_scale = 1.0f};
    }
    if (bytes) *bytes = b;
    return FM_OK;
}

fm_status fm_load_scales(const fm_st_tensor *t, int expert, uint64_t off, int64_t rows, int64_t cols, fm_scale_type st,
                         uint8_t *dst)
{
    size_t n = (size_t)rows * (size_t)cols;
    uint8_t *buf = dst ? dst : malloc(n + 1);
    if (!buf) return fm_fail(FM_ERR_OOM, "%s: tensor '%s': out of memory for %zu scale bytes", t->file, t->name, n);
    fm_status s = fm_st_read(t, off, n, buf);
    if (s == FM_OK) s = fm_load_check_scale_codes(t, expert, buf, rows, cols, st);
    if (!dst) free(buf);
    return s;
}

fm_status fm_load_check_scale_codes(const fm_st_tensor *t, int expert, const uint8_t *codes, int64_t rows,
                                     int64_t cols, fm_scale_type st)
{
    fm_status s = fm_scales_check_codes(NULL, st, codes, rows, cols);
    if (s == FM_OK) return FM_OK;
    if (expert < 0) return fm_fail(s, "%s: tensor '%s': %s", t->file, t->name, fm_last_error());
    return fm_fail(s, "%s: tensor '%s', expert %d: %s", t->file, t->name, expert, fm_last_error());
}
