/* load_modelopt.c - experts in the NVIDIA Model Optimizer (ModelOpt) layout:
 * one tensor set per expert E and projection P (gate_proj, up_proj, down_proj):
 *
 *   tensor          dtype    shape        meaning
 *   weight          U8       [N][K/2]     two E2M1 codes per byte, low nibble = even k
 *   weight_scale    F8_E4M3  [N][K/16]    block scales (U8 accepted: same bytes)
 *   weight_scale_2  F32      [] or [1]    per-tensor global scale
 *   input_scale     F32      [] or [1]    activation global scale (optional)
 * or, unquantized, a BF16 weight [N][K] alone.
 *
 * fp4moe fuses gate and up into w13 = [gate rows; up rows]; w13's global is
 * the gate's weight_scale_2. ModelOpt exports gate and up with the same
 * weight_scale_2 when it knows they are fused; when they differ (in any expert
 * of the layer), the up globals are held as they are stored in w13_up_global
 * (fm_moe_weights.w13_up_global: no block scale is re-encoded), and the
 * experts whose two differ are counted in w13_split_globals.
 * a1_scale = max(gate, up) input_scale, a2_scale = down's.
 * Everything is validated before anything is allocated.
 *
 * compressed-tensors "nvfp4-pack-quantized" (llmcompressor) holds the same
 * bytes under other names (weight_packed, weight_scale, weight_global_scale,
 * input_global_scale) with the global scales stored as reciprocals; they are
 * converted here, once, to ModelOpt's multiply form, as vLLM does
 * (weight_scale_2 = 1 / weight_global_scale): see docs/checkpoints.md for how
 * exact that is.
 */
#include "load_internal.h"

#include <stdlib.h>
#include <string.h>

enum { P_GATE, P_UP, P_DOWN, P_COUNT };

typedef struct {
    const fm_st_tensor *w, *s; /* weight, weight_scale (NULL for BF16) */
    float               g, in; /* weight_scale_2 (1 for BF16), input_scale (0 if absent) */
} proj_src;

static fm_status find_proj(const fm_load_ctx *c, int e, const char *proj, fm_format f, int has_in, int64_t N,
                           int64_t K, proj_src *ps)
{
    const char *pat = c->nm.expert;
    const fm_nvfp4_suffixes *sx = fm_nvfp4_suffixes_of(c->nm.layout);
    FM_CHECK(fm_load_find(c, pat, e, proj, sx->weight, &ps->w));
    int64_t ws[2] = {N, f == FM_FORMAT_NVFP4 ? K / 2 : K};
    FM_CHECK(fm_load_expect(ps->w, f == FM_FORMAT_NVFP4 ? FM_DTYPE_U8 : FM_DTYPE_BF16, -1, 2, ws));
    ps->g = 1.0f;
    ps->in = 0.0f;
    if (f == FM_FORMAT_NVFP4) {
        const fm_st_tensor *g;
        int64_t ss[2] = {N, K / 16};
        FM_CHECK(fm_load_find(c, pat, e, proj, sx->scale, &ps->s));
        FM_CHECK(fm_load_expect(ps->s, FM_DTYPE_F8_E4M3, FM_DTYPE_U8, 2, ss));
        FM_CHECK(fm_load_find(c, pat, e, proj, sx->global, &g));
        FM_CHECK(fm_load_global(g, sx->reciprocal, &ps->g));
    }
    if (has_in) {
        const fm_st_tensor *in;
        FM_CHECK(fm_load_find(c, pat, e, proj, sx->input, &in));
        FM_CHECK(fm_load_global(in, sx->reciprocal, &ps->in));
    }
    return FM_OK;
}

/* Copy rows of one projection (data + scales, as stored) into a qtensor at row offset r0. */
static fm_status copy_proj(const proj_src *ps, fm_qtensor *q, int64_t r0)
{
    size_t rb = fm_format_row_bytes(q->fmt, q->cols), sb = fm_format_row_scale_bytes(q->fmt, q->cols);
    size_t rows = (size_t)ps->w->shape[0];
    FM_CHECK(fm_st_read(ps->w, 0, rows * rb, (uint8_t *)q->data + (size_t)r0 * rb));
    if (!ps->s) return FM_OK;
    return fm_load_scales(ps->s, -1, 0, (int64_t)rows, (int64_t)sb, FM_SCALE_E4M3, q->scales + (size_t)r0 * sb);
}

fm_status fm_load_modelopt(const fm_load_ctx *c, fm_ckpt_layer *l)
{
    const char *pn[P_COUNT] = {c->nm.proj_gate, c->nm.proj_up, c->nm.proj_down};
    const fm_st_tensor *g0;
    const fm_nvfp4_suffixes *sx = fm_nvfp4_suffixes_of(c->nm.layout);
    if (!sx) return fm_fail(FM_ERR_INVALID_ARG, "layout %s has no NVFP4 suffixes", fm_ckpt_layout_name(c->nm.layout));
    FM_CHECK(fm_load_find(c, c->nm.expert, c->first, pn[P_GATE], sx->weight, &g0));
    fm_format f;
    if (g0->dtype == FM_DTYPE_U8) f = FM_FORMAT_NVFP4;
    else if (g0->dtype == FM_DTYPE_BF16 && !sx->reciprocal) f = FM_FORMAT_BF16; /* weight_packed is never BF16 */
    else
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected U8 (NVFP4) or BF16", g0->file, g0->name,
                       fm_dtype_name(g0->dtype));
    if (g0->ndim != 2 || g0->shape[0] < 1 || g0->shape[0] > (1 << 24))
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s' should be 2-D [inter][hidden%s]", g0->file, g0->name,
                       f == FM_FORMAT_NVFP4 ? "/2" : "");
    const int64_t I = g0->shape[0], H = c->hidden;
    if (f == FM_FORMAT_NVFP4 && (H % 16 || I % 16))
        return fm_fail(FM_ERR_BAD_SHAPE, "layer %d: hidden=%lld and inter=%lld must be multiples of the NVFP4 block (16)",
                       c->layer, (long long)H, (long long)I);
    const fm_st_tensor *probe;
    int has_in = f == FM_FORMAT_NVFP4 &&
                 fm_load_find(c, c->nm.expert, c->first, pn[P_GATE], sx->input, &probe) == FM_OK;
    fm_clear_error();

    const int n = c->n;
    proj_src *src = calloc((size_t)n * P_COUNT, sizeof *src);
    if (!src) return fm_fail(FM_ERR_OOM, "out of memory");
    fm_status s = FM_OK;
    for (int i = 0; i < n && s == FM_OK; i++)
        for (int p = 0; p < P_COUNT && s == FM_OK; p++)
            s = find_proj(c, c->first + i, pn[p], f, has_in, p == P_DOWN ? H : I, p == P_DOWN ? I : H,
                          &src[i * P_COUNT + p]);
    l->cfg.inter = (int)I;
    l->cfg.wfmt = f;
    l->has_input_scales = has_in;
    for (int i = 0; s == FM_OK && i < n; i++)
        l->w13_split_globals += src[i * P_COUNT + P_GATE].g != src[i * P_COUNT + P_UP].g;
    /* Validate only: still read the block scales (not the weights), so that a
     * NaN scale code, which the full load rejects, is rejected here too. */
    for (int i = 0; s == FM_OK && c->dry && f == FM_FORMAT_NVFP4 && i < n * P_COUNT; i++)
        s = fm_load_scales(src[i].s, -1, 0, src[i].s->shape[0], src[i].s->shape[1], FM_SCALE_E4M3, NULL);
    if (s != FM_OK || c->dry) {
        free(src);
        return s;
    }

    /* Everything is valid: one allocation for all experts' data and scales. */
    s = fm_load_alloc_experts(c, l, f, I, NULL);
    if (s == FM_OK && l->w13_split_globals && !(l->w13_up_global = malloc((size_t)n * sizeof *l->w13_up_global)))
        s = fm_fail(FM_ERR_OOM, "layer %d: out of memory for %d up global scales", c->layer, n);
    if (s == FM_OK && has_in) {
        l->a1_scale = malloc((size_t)n * sizeof *l->a1_scale);
        l->a2_scale = malloc((size_t)n * sizeof *l->a2_scale);
        if (!l->a1_scale || !l->a2_scale)
            s = fm_fail(FM_ERR_OOM, "layer %d: out of memory for %d input scales", c->layer, n);
    }
    for (int i = 0; i < n && s == FM_OK; i++) {
        const proj_src *ps = &src[i * P_COUNT];
        l->w13[i].global_scale = ps[P_GATE].g;
        if (l->w13_up_global) l->w13_up_global[i] = ps[P_UP].g;
        l->w2[i].global_scale = ps[P_DOWN].g;
        s = copy_proj(&ps[P_GATE], &l->w13[i], 0);
        if (s == FM_OK) s = copy_proj(&ps[P_UP], &l->w13[i], I);
        if (s == FM_OK) s = copy_proj(&ps[P_DOWN], &l->w2[i], 0);
        if (has_in) {
            l->a1_scale[i] = ps[P_GATE].in > ps[P_UP].in ? ps[P_GATE].in : ps[P_UP].in;
            l->a2_scale[i] = ps[P_DOWN].in;
        }
    }
    free(src);
    return s;
}
