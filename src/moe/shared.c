/* shared.c - the pieces every CPU backend computes identically (see
 * moe_internal.h for why): router logits, the NVFP4 and FP8 activation round trips,
 * SwiGLU and the weight scale scan. */
#include "moe_internal.h"

#include "format/format_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void fm_moe_router_logits(const fm_moe_config *cfg, const float *router_w, const uint16_t *x, int T, float *logits)
{
    const int E = cfg->n_experts, H = cfg->hidden;
    /* One (token, expert) dot per iteration: each logit is summed by a single
     * thread in a fixed order, so threads never change the routing. */
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)T * E; i++) {
        const uint16_t *xt = x + (size_t)(i / E) * H;
        const float *we = router_w + (size_t)(i % E) * H;
        float part[8] = {0}; /* 8 interleaved partial sums: FMA latency, not order, is the limit */
        int k = 0;
        for (; k + 8 <= H; k += 8)
            for (int l = 0; l < 8; l++) part[l] += fm_bf16_decode(xt[k + l]) * we[k + l];
        for (; k < H; k++) part[k % 8] += fm_bf16_decode(xt[k]) * we[k];
        logits[i] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    }
}

size_t fm_moe_act_quant_scratch(int n) { return (size_t)n / 2 + (size_t)n / 16; }

fm_status fm_moe_act_quant_row(const float *src, int n, const float *gscale, void *scratch, float *dst)
{
    fm_qtensor q = {.fmt = FM_FORMAT_NVFP4,
                    .rows = 1,
                    .cols = n,
                    .data = scratch,
                    .scales = (uint8_t *)scratch + n / 2,
                    .global_scale = 1.0f};
    FM_CHECK(fm_quantize(src, gscale, &q)); /* nothing written on failure */
    return fm_dequantize(&q, dst);
}

fm_status fm_moe_act_fp8_row(const float *src, int n, fm_act_fp8 mode, float *dst)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(src[i])) return fm_fail(FM_ERR_NONFINITE, "FP8 activations: element %d is %g", i, (double)src[i]);
    const int blk = mode == FM_ACT_FP8_TOKEN ? n : 128;
    for (int b0 = 0; b0 < n; b0 += blk) {
        const int b1 = b0 + blk < n ? b0 + blk : n;
        float     amax = 0.0f;
        for (int i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(src[i]));
        float s = amax / 448.0f;
        if (!(s >= FLT_MIN)) s = 1.0f;
        for (int i = b0; i < b1; i++) dst[i] = fm_e4m3_decode(fm_e4m3_encode(src[i] / s)) * s;
    }
    return FM_OK;
}

fm_status fm_moe_weights_check_scales(const fm_moe_config *cfg, const fm_moe_weights *w)
{
    const fm_format_traits *tr = fm_format_traits_get(cfg->wfmt);
    if (!tr || tr->scale_type == FM_SCALE_NONE) return FM_OK;
    for (int e = 0; e < cfg->n_experts; e++) {
        const fm_qtensor *ts[2] = {&w->w13[e], &w->w2[e]};
        for (int j = 0; j < 2; j++) {
            char who[32];
            snprintf(who, sizeof who, "%s[%d]", j ? "w2" : "w13", e);
            FM_CHECK(fm_scales_check_codes(who, tr->scale_type, ts[j]->scales, ts[j]->rows, ts[j]->cols / tr->block));
        }
    }
    return FM_OK;
}

void fm_moe_swiglu(const float *gate, const float *up, int n, float *h)
{
    for (int i = 0; i < n; i++) h[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void fm_moe_expert_act(const fm_moe_config *c, const float *bias, float *g, float *h)
{
    const int I = c->inter;
    if (bias)
        for (int i = 0; i < 2 * I; i++) g[i] += bias[i];
    if (c->activation != FM_ACT_SWIGLU_GPTOSS) {
        fm_moe_swiglu(g, g + I, I, h);
        return;
    }
    const float L = c->swiglu_limit, alpha = 1.702f;
    for (int i = 0; i < I; i++) {
        float gt = g[i], up = g[I + i];
        gt = gt > L ? L : gt; /* comparisons, not fminf: a NaN stays NaN, as torch.clamp */
        up = up > L ? L : up < -L ? -L : up;
        h[i] = (up + 1.0f) * (gt / (1.0f + expf(-alpha * gt)));
    }
}

long fm_moe_first_nonfinite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (long)i;
    return -1;
}

fm_status fm_moe_route_tokens(const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T,
                              const char *who, float *logits, int32_t *ids, float *wts, int32_t *offsets,
                              int32_t *perm)
{
    const long E = c->n_experts;
    fm_moe_router_logits(c, w->router_w, x, T, logits);
    long bad = fm_moe_first_nonfinite(logits, (size_t)T * (size_t)E);
    if (bad >= 0)
        return fm_fail(FM_ERR_NONFINITE, "%s: router logit [%ld][%ld] overflowed (inputs too large)", who, bad / E,
                       bad % E);
    FM_CHECK(fm_moe_route(c, w->router_bias, logits, T, ids, wts));
    return fm_moe_permute(ids, T, c->top_k, c->n_experts, offsets, perm);
}

fm_status fm_moe_plan_rows(const fm_moe_config *c, const fm_moe_weights *w, const uint16_t *x, int T,
                           const int32_t *ext_ids, const float *ext_wts, int first, int n_local, const char *who,
                           float *logits, int32_t *ids, float *wts, int32_t *offsets, int32_t *perm, int32_t *pos,
                           int *rows)
{
    const long E = c->n_experts, K = c->top_k, n = (long)T * K;
    if (ext_ids) {
        /* validate everything before writing anything */
        for (long s = 0; s < n; s++) {
            if (ext_ids[s] < -1 || ext_ids[s] >= E)
                return fm_fail(FM_ERR_OUT_OF_RANGE, "%s: topk_ids[%ld][%ld] = %d outside [-1, %ld)", who, s / K, s % K,
                               (int)ext_ids[s], E);
            if (ext_ids[s] >= 0 && !isfinite(ext_wts[s]))
                return fm_fail(FM_ERR_NONFINITE, "%s: topk_weights[%ld][%ld] = %g is not finite", who, s / K, s % K,
                               (double)ext_wts[s]);
        }
        memcpy(ids, ext_ids, sizeof(int32_t) * (size_t)n);
        memcpy(wts, ext_wts, sizeof(float) * (size_t)n);
    } else {
        fm_moe_router_logits(c, w->router_w, x, T, logits);
        long bad = fm_moe_first_nonfinite(logits, (size_t)T * (size_t)E);
        if (bad >= 0)
            return fm_fail(FM_ERR_NONFINITE, "%s: router logit [%ld][%ld] overflowed (inputs too large)", who,
                           bad / E, bad % E);
        FM_CHECK(fm_moe_route(c, w->router_bias, logits, T, ids, wts));
    }
    /* counting sort of the local slots: stable, experts ascending (fm_moe_permute's order) */
    for (int e = 0; e <= n_local; e++) offsets[e] = 0;
    for (long s = 0; s < n; s++) {
        int l = ids[s] - first;
        if (ids[s] >= 0 && l >= 0 && l < n_local) offsets[l + 1]++;
    }
    for (int e = 0; e < n_local; e++) offsets[e + 1] += offsets[e];
    for (long s = 0; s < n; s++) {
        int l = ids[s] - first;
        if (ids[s] >= 0 && l >= 0 && l < n_local) {
            pos[s] = offsets[l];
            perm[offsets[l]++] = (int32_t)s;
        } else {
            pos[s] = -1;
        }
    }
    for (int e = n_local; e > 0; e--) offsets[e] = offsets[e - 1];
    offsets[0] = 0;
    *rows = offsets[n_local];
    return FM_OK;
}
