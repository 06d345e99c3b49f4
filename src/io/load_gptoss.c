/* load_gptoss.c - experts in the gpt-oss MXFP4 layout (openai/gpt-oss-*,
 * transformers GptOssExperts): every projection is one tensor fused over the
 * layer's experts,
 *
 *   tensor                 dtype          shape             meaning
 *   gate_up_proj_blocks    U8             [E][2I][H/32][16] 32 E2M1 per 16 bytes, low nibble first
 *   gate_up_proj_scales    U8 / F8_E8M0   [E][2I][H/32]     UE8M0 block scales, 2^(code-127)
 *   gate_up_proj_bias      BF16/F32       [E][2I]           (optional)
 *   down_proj_blocks       U8             [E][H][I/32][16]
 *   down_proj_scales       U8 / F8_E8M0   [E][H][I/32]
 *   down_proj_bias         BF16/F32       [E][H]            (optional)
 *
 * Row n of an expert is output feature n and [K/32][16] bytes are exactly a
 * row-major [K/2] FP4 row, so data and scales copy straight into fm_qtensor.
 * gate_up rows INTERLEAVE gate and up (row 2i = gate i, row 2i+1 = up i: the
 * model splits its output as gate_up[..., ::2], gate_up[..., 1::2]); fp4moe's
 * w13 wants gate rows then up rows, so rows are de-interleaved here.
 * The biases (F32 / BF16 / F16) load into w13_bias (de-interleaved like the rows) and
 * w2_bias; the caller sets gpt-oss's clamped SwiGLU (FM_ACT_SWIGLU_GPTOSS).
 * E is the layer's expert count; with a global router (an expert-parallel rank)
 * it may instead be the shard's, since a rank holding only its experts holds
 * fused tensors of those only: they are then experts [first, first + n).
 */
#include "load_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const fm_st_tensor *b, *s, *bias; /* _blocks, _scales, _bias (optional: NULL) */
} fused_src;

static fm_status find_fused(const fm_load_ctx *c, const char *proj, int64_t E, int64_t N, int64_t K, fused_src *fs)
{
    FM_CHECK(fm_load_find(c, c->nm.expert, -1, proj, "_blocks", &fs->b));
    FM_CHECK(fm_load_find(c, c->nm.expert, -1, proj, "_scales", &fs->s));
    int64_t bs[4] = {E, N, K / 32, 16}, ss[3] = {E, N, K / 32};
    FM_CHECK(fm_load_expect(fs->b, FM_DTYPE_U8, -1, 4, bs));
    FM_CHECK(fm_load_expect(fs->s, FM_DTYPE_U8, FM_DTYPE_F8_E8M0, 3, ss));
    fs->bias = NULL;
    if (fm_load_find(c, c->nm.expert, -1, proj, "_bias", &fs->bias) != FM_OK) fs->bias = NULL;
    fm_clear_error();
    if (fs->bias) {
        const fm_st_tensor *t = fs->bias;
        if (t->dtype != FM_DTYPE_F32 && t->dtype != FM_DTYPE_BF16 && t->dtype != FM_DTYPE_F16)
            return fm_fail(FM_ERR_FORMAT, "%s: expert bias '%s' has dtype %s, expected F32, BF16 or F16", t->file,
                           t->name, fm_dtype_name(t->dtype));
        int64_t want[2] = {E, N};
        FM_CHECK(fm_load_expect(t, t->dtype, -1, 2, want));
    }
    return FM_OK;
}

/* The loaded experts' rows (from row e0) of an expert bias [E][N] as FP32 into dst[n][N],
 * each finite (FM_ERR_NONFINITE naming tensor, expert and index); with deinterleave, row
 * 2i -> i and 2i+1 -> N/2 + i (gate_up: gate then up, as w13's rows). */
static fm_status load_bias(const fm_load_ctx *c, const fm_st_tensor *t, int64_t e0, int64_t N, int deinterleave,
                           float *tmp, float *dst)
{
    for (int i = 0; i < c->n; i++) {
        const int64_t e = e0 + i;
        FM_CHECK(fm_st_to_f32(t, e * N, N, tmp));
        float *d = dst + (size_t)i * (size_t)N;
        for (int64_t r = 0; r < N; r++) {
            if (!isfinite(tmp[r]))
                return fm_fail(FM_ERR_NONFINITE, "%s: expert bias '%s'[%lld][%lld] is %g", t->file, t->name,
                               (long long)e, (long long)r, (double)tmp[r]);
            d[deinterleave ? ((r & 1) ? N / 2 + r / 2 : r / 2) : r] = tmp[r];
        }
    }
    return FM_OK;
}

fm_status fm_load_gptoss(const fm_load_ctx *c, fm_ckpt_layer *l)
{
    if (c->nm.proj_up)
        return fm_fail(FM_ERR_INVALID_ARG, "gpt-oss layout: gate and up are fused in proj_gate; proj_up must be NULL");
    const fm_st_tensor *gb;
    FM_CHECK(fm_load_find(c, c->nm.expert, -1, c->nm.proj_gate, "_blocks", &gb));
    if (gb->ndim != 4 || gb->shape[1] < 2 || gb->shape[1] % 2 || gb->shape[1] > (1 << 24))
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s' should be [E][2*inter][hidden/32][16]", gb->file, gb->name);
    const int64_t I = gb->shape[1] / 2, H = c->hidden, E = gb->shape[0];
    if (E != c->n_total && !(c->global_router && E == c->n))
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s' holds %lld experts: expected the router's %d%s", gb->file,
                       gb->name, (long long)E, c->n_total,
                       c->global_router ? " (or the shard's, with a global router)" : "");
    const size_t e0 = E == c->n_total ? (size_t)c->first : 0; /* the first loaded expert's index in the tensors */
    if (H % 32 || I % 32)
        return fm_fail(FM_ERR_BAD_SHAPE, "layer %d: hidden=%lld and inter=%lld must be multiples of the MXFP4 block (32)",
                       c->layer, (long long)H, (long long)I);
    fused_src gu, dn;
    FM_CHECK(find_fused(c, c->nm.proj_gate, E, 2 * I, H, &gu));
    FM_CHECK(find_fused(c, c->nm.proj_down, E, H, I, &dn));
    /* gpt-oss's router has an additive logit bias: not a ranking-only bias. */
    char rb[512];
    const fm_st_tensor *t;
    size_t rl = strlen(c->nm.router);
    if (rl > 7 && !strcmp(c->nm.router + rl - 7, ".weight") && rl < sizeof rb) {
        memcpy(rb, c->nm.router, rl - 7);
        strcpy(rb + rl - 7, ".bias");
        if (fm_load_find(c, rb, -1, NULL, NULL, &t) == FM_OK) l->ignored_router_bias = 1;
        fm_clear_error();
    }
    l->ignored_bias = 0; /* loaded below */
    l->has_expert_bias = gu.bias || dn.bias;
    l->cfg.inter = (int)I;
    l->cfg.wfmt = FM_FORMAT_MXFP4;
    const size_t s13 = (size_t)(2 * I) * (size_t)(H / 32), s2 = (size_t)H * (size_t)(I / 32); /* scale bytes/expert */
    if (c->dry) { /* validate only: the loaded experts' scales, not their weights (as a load would reject) */
        for (int i = 0; i < c->n; i++) {
            const size_t e = e0 + (size_t)i;
            FM_CHECK(fm_load_scales(gu.s, (int)e, e * s13, 2 * I, H / 32, FM_SCALE_UE8M0, NULL));
            FM_CHECK(fm_load_scales(dn.s, (int)e, e * s2, H, I / 32, FM_SCALE_UE8M0, NULL));
        }
        return FM_OK;
    }

    fm_load_expert_bytes sz;
    FM_CHECK(fm_load_alloc_experts(c, l, FM_FORMAT_MXFP4, I, &sz));
    const size_t d13 = sz.d13, d2 = sz.d2; /* the source's per-expert strides too (as s13, s2) */
    const size_t rb13 = (size_t)H / 2, sb13 = (size_t)H / 32; /* bytes per w13 row: data, scales */
    uint8_t *tmp = malloc(d13 + s13); /* one expert's fused rows, read then de-interleaved */
    if (!tmp) return fm_fail(FM_ERR_OOM, "layer %d: out of memory for %zu bytes", c->layer, d13 + s13);
    fm_status s = FM_OK;
    for (int i = 0; s == FM_OK && i < c->n; i++) {
        const size_t e = e0 + (size_t)i;
        uint8_t *gd = tmp, *gs = tmp + d13;
        s = fm_st_read(gu.b, e * d13, d13, gd);
        if (s == FM_OK) s = fm_load_scales(gu.s, (int)e, e * s13, 2 * I, H / 32, FM_SCALE_UE8M0, gs); /* source rows */
        for (int64_t r = 0; s == FM_OK && r < 2 * I; r++) { /* source row r -> gate row r/2 or up row I + r/2 */
            int64_t dst = (r & 1) ? I + r / 2 : r / 2;
            memcpy((uint8_t *)l->w13[i].data + (size_t)dst * rb13, gd + (size_t)r * rb13, rb13);
            memcpy(l->w13[i].scales + (size_t)dst * sb13, gs + (size_t)r * sb13, sb13);
        }
        if (s == FM_OK) s = fm_st_read(dn.b, e * d2, d2, l->w2[i].data);
        if (s == FM_OK) s = fm_load_scales(dn.s, (int)e, e * s2, H, I / 32, FM_SCALE_UE8M0, l->w2[i].scales);
    }
    free(tmp);
    if (s != FM_OK || (!gu.bias && !dn.bias)) return s;
    const size_t nb = (size_t)(H > 2 * I ? H : 2 * I);
    float *ftmp = malloc(sizeof(float) * nb);
    if (gu.bias) l->w13_bias = malloc(sizeof(float) * (size_t)c->n * 2 * (size_t)I);
    if (dn.bias) l->w2_bias = malloc(sizeof(float) * (size_t)c->n * (size_t)H);
    if (!ftmp || (gu.bias && !l->w13_bias) || (dn.bias && !l->w2_bias)) {
        free(ftmp);
        return fm_fail(FM_ERR_OOM, "layer %d: out of memory for the expert biases", c->layer);
    }
    if (gu.bias) s = load_bias(c, gu.bias, (int64_t)e0, 2 * I, 1, ftmp, l->w13_bias);
    if (s == FM_OK && dn.bias) s = load_bias(c, dn.bias, (int64_t)e0, H, 0, ftmp, l->w2_bias);
    free(ftmp);
    return s;
}
