/* test_moe_ref.c - the reference forward pass (fm_moe_forward_ref) against an
 * independent float64 computation written here: its own E2M1 / E4M3 / UE8M0 /
 * BF16 decoding from the format definitions, its own router (softmax/sigmoid,
 * bias, group limit, top-k with ties to the lower id, renormalisation), double
 * GEMMs, SwiGLU and finalize. Only the activation quantization of W4A4 goes
 * through the public fm_quantize/fm_dequantize (the codec is tested bit-exact
 * against ml_dtypes elsewhere; what is tested here is WHERE it is applied and
 * with which scale).
 * Cases: every weight format with and without act_nvfp4, softmax and sigmoid,
 * bias, shared expert, group-limited routing, renormalisation off, one token,
 * all rows on one expert, K at block boundaries.
 */
#include "test_moe_fixture.h"

#include <stdio.h>

/* Bounds, NMSE of the reference against float64:
 * - weights-only quantization: the reference decodes exactly (every E2M1 x
 *   scale product is exact in FP32) and accumulates in FP32 over K <= 128:
 *   relative error ~1e-7 per dot, NMSE ~1e-14; 1e-10 catches any structural
 *   slip (a wrong weight, row, slot or scale gives >= 1e-4).
 * - act_nvfp4: the oracle re-quantizes an h computed in double, the reference
 *   one computed in FP32; an element within an ulp of an E2M1 rounding
 *   boundary can land one step away (rare; ~1e-4 when it happens). 2e-3 still
 *   separates "quantized as specified" from "not quantized" (checked below). */
#define BOUND_W 1e-10
#define BOUND_A 2e-3

static double o_e2m1(uint8_t c)
{
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

static double o_e4m3(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6); /* bias 7, subnormals 2^-6 * m/8 */
    return (c & 0x80) ? -v : v;
}

static double o_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f = 0.0f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element (n, k) of a weight tensor, from the bytes. */
static double o_weight(const fm_qtensor *q, int64_t n, int64_t k)
{
    int64_t K = q->cols;
    if (q->fmt == FM_FORMAT_BF16) return o_bf16(((const uint16_t *)q->data)[n * K + k]);
    uint8_t byte = ((const uint8_t *)q->data)[n * (K / 2) + k / 2];
    double e = o_e2m1((k & 1) ? byte >> 4 : byte & 15); /* low nibble = even column */
    if (q->fmt == FM_FORMAT_NVFP4) return e * o_e4m3(q->scales[n * (K / 16) + k / 16]) * q->global_scale;
    return e * ldexp(1.0, q->scales[n * (K / 32) + k / 32] - 127); /* UE8M0 */
}

/* NVFP4 round trip through the public codec (see the header comment). */
static void o_act_quant(double *v, int n, const float *g)
{
    float *f = calloc((size_t)n, sizeof(float));
    uint8_t *d = malloc(n / 2), *s = malloc(n / 16);
    for (int i = 0; i < n; i++) f[i] = (float)v[i];
    fm_qtensor q = {.fmt = FM_FORMAT_NVFP4, .rows = 1, .cols = n, .data = d, .scales = s};
    assert_int_equal(fm_quantize(f, g, &q), FM_OK);
    assert_int_equal(fm_dequantize(&q, f), FM_OK);
    for (int i = 0; i < n; i++) v[i] = f[i];
    free(f), free(d), free(s);
}

/* Own router for one token: fills ids/wts (top_k). Returns the routing
 * margin: how far the chosen set (and the kept groups) are from the best ones
 * left out, in biased score; below ~1e-6 an FP32 router may legitimately choose
 * otherwise, so check() re-draws such an input instead of comparing it. */
static double o_route(const fm_moe_config *c, const float *bias, const double *logit, int *ids, double *wts)
{
    double margin = INFINITY;
    int E = c->n_experts;
    double sc[512], b[512];
    int keep[512];
    double mx = logit[0], sum = 0;
    for (int e = 0; e < E; e++) mx = fmax(mx, logit[e]);
    for (int e = 0; e < E; e++) sum += exp(logit[e] - mx);
    for (int e = 0; e < E; e++) {
        sc[e] = c->score == FM_SCORE_SOFTMAX ? exp(logit[e] - mx) / sum : 1.0 / (1.0 + exp(-logit[e]));
        b[e] = sc[e] + (bias ? bias[e] : 0.0);
        keep[e] = 1;
    }
    if (c->n_group > 1) {
        int G = c->n_group, gs = E / G, gk[64] = {0};
        double gsc[64];
        for (int g = 0; g < G; g++) { /* sum of the two largest: sort the group's scores */
            double best1 = -INFINITY, best2 = -INFINITY;
            for (int i = 0; i < gs; i++) {
                double v = b[g * gs + i];
                if (v > best1) best2 = best1, best1 = v;
                else if (v > best2) best2 = v;
            }
            gsc[g] = best1 + (gs > 1 ? best2 : 0.0);
        }
        for (int r = 0; r < c->topk_group; r++) {
            int bg = -1;
            for (int g = 0; g < G; g++)
                if (!gk[g] && (bg < 0 || gsc[g] > gsc[bg])) bg = g;
            gk[bg] = 1;
        }
        double kept_min = INFINITY, left_max = -INFINITY;
        for (int g = 0; g < G; g++) {
            if (gk[g]) kept_min = fmin(kept_min, gsc[g]);
            else left_max = fmax(left_max, gsc[g]);
        }
        margin = fmin(margin, kept_min - left_max);
        for (int e = 0; e < E; e++) keep[e] = gk[e / gs];
    }
    double tot = 0;
    for (int j = 0; j < c->top_k; j++) {
        int be = -1;
        for (int e = 0; e < E; e++)
            if (keep[e] && (be < 0 || b[e] > b[be])) be = e;
        keep[be] = 0;
        ids[j] = be;
        wts[j] = sc[be];
        tot += sc[be];
    }
    for (int e = 0; e < E; e++) /* keep[] now holds the kept experts left out */
        if (keep[e]) margin = fmin(margin, b[ids[c->top_k - 1]] - b[e]);
    for (int j = 0; j < c->top_k; j++) wts[j] = (c->renormalize ? wts[j] / tot : wts[j]) * c->routed_scale;
    return margin;
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* out[T][H] in double; act = apply the W4A4 round trips (may differ from cfg).
 * Returns the smallest routing margin over the tokens (see o_route). */
static double oracle(const fx_layer *L, const uint16_t *x, int T, int act, double *out)
{
    double margin = INFINITY;
    const fm_moe_config *c = &L->cfg;
    int E = c->n_experts, H = c->hidden, I = c->inter, S = c->shared_inter;
    double *xt = malloc(sizeof(double) * H), *a = malloc(sizeof(double) * H), *g = malloc(sizeof(double) * 2 * I),
           *h = malloc(sizeof(double) * (I > S ? I : S) + 8), *sg = malloc(sizeof(double) * (2 * S + 1)),
           logit[512] = {0}, wts[512] = {0};
    int ids[512] = {0};
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < H; k++) xt[k] = o_bf16(x[(size_t)t * H + k]);
        for (int e = 0; e < E; e++) {
            logit[e] = 0;
            for (int k = 0; k < H; k++) logit[e] += xt[k] * L->router_w[(size_t)e * H + k];
        }
        margin = fmin(margin, o_route(c, L->router_bias, logit, ids, wts));
        double *o = out + (size_t)t * H;
        for (int n = 0; n < H; n++) o[n] = 0;
        for (int j = 0; j < c->top_k; j++) {
            int e = ids[j];
            memcpy(a, xt, sizeof(double) * H);
            if (act) o_act_quant(a, H, L->a1 ? &L->a1[e] : NULL);
            for (int n = 0; n < 2 * I; n++) {
                g[n] = 0;
                for (int k = 0; k < H; k++) g[n] += o_weight(&L->w13[e], n, k) * a[k];
            }
            for (int i = 0; i < I; i++) h[i] = silu(g[i]) * g[I + i];
            if (act) o_act_quant(h, I, L->a2 ? &L->a2[e] : NULL);
            for (int n = 0; n < H; n++) {
                double y = 0;
                for (int i = 0; i < I; i++) y += o_weight(&L->w2[e], n, i) * h[i];
                o[n] += wts[j] * y;
            }
        }
        if (S > 0) {
            for (int n = 0; n < 2 * S; n++) {
                sg[n] = 0;
                for (int k = 0; k < H; k++) sg[n] += o_bf16(L->sw13[(size_t)n * H + k]) * xt[k];
            }
            for (int i = 0; i < S; i++) h[i] = silu(sg[i]) * sg[S + i];
            for (int n = 0; n < H; n++) {
                double y = 0;
                for (int i = 0; i < S; i++) y += o_bf16(L->sw2[(size_t)n * S + i]) * h[i];
                o[n] += y;
            }
        }
    }
    free(xt), free(a), free(g), free(h), free(sg);
    return margin;
}

/* Build, run the reference, compare with the oracle; returns NMSE. */
static double check(fm_rng *r, fm_moe_config c, int T, int bias, int ascale, const char *what)
{
    fx_layer L;
    fx_build(&L, &c, r, bias, ascale);
    size_t n = (size_t)T * c.hidden;
    float *out = malloc(sizeof(float) * n);
    double *want = malloc(sizeof(double) * n);
    uint16_t *x = fx_bf16(r, n, 1.0f);
    for (int tries = 0; oracle(&L, x, T, c.act_nvfp4, want) < 1e-6; tries++) { /* a near-tie in routing */
        assert_true(tries < 10);
        printf("# %s: routing near-tie, drawing another input\n", what);
        free(x);
        x = fx_bf16(r, n, 1.0f);
    }
    fm_poison_f32(out, n);
    assert_int_equal(fm_moe_forward_ref(&c, &L.w, x, T, out), FM_OK);
    long bad = fm_first_nonfinite(out, n);
    if (bad >= 0) fail_msg("%s: non-finite output at %ld", what, bad);
    double e = fm_nmse64(out, want, n);
    double bound = c.act_nvfp4 ? BOUND_A : BOUND_W;
    printf("# %s [%s act=%d T=%d]: nmse %.3e (bound %.0e)\n", what, fm_format_traits_get(c.wfmt)->name,
           c.act_nvfp4, T, e, bound);
    if (!(e <= bound)) fail_msg("%s: nmse %.3e > %.0e", what, e, bound);
    if (c.act_nvfp4) { /* the bound must tell quantized activations from unquantized ones */
        (void)oracle(&L, x, T, 0, want);
        double e0 = fm_nmse64(out, want, n);
        printf("#   vs an oracle without activation quantization: nmse %.3e\n", e0);
        assert_true(e0 > bound);
    }
    free(x), free(out), free(want);
    fx_free(&L);
    return e;
}

static void test_formats_scores(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    for (int f = 0; f < FM_FORMAT_COUNT; f++)
        for (int act = 0; act < 2; act++)
            for (int sc = 0; sc < 2; sc++) {
                fm_moe_config c = fx_config(8, 2, 64, 32, (fm_format)f);
                c.act_nvfp4 = act;
                c.score = sc ? FM_SCORE_SOFTMAX : FM_SCORE_SIGMOID;
                c.shared_inter = sc ? 16 : 0;
                check(&r, c, fx_asan() ? 3 : 6, sc == 0, act && sc, "formats x scores");
            }
}

static void test_groups_renorm_off(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 1);
    fm_moe_config c = fx_config(16, 4, 32, 32, FM_FORMAT_NVFP4);
    c.n_group = 4;
    c.topk_group = 2;
    check(&r, c, 5, 1, 0, "group-limited top-k");
    c.renormalize = 0;
    c.routed_scale = 1.7f;
    c.n_group = 0;
    c.score = FM_SCORE_SOFTMAX;
    check(&r, c, 5, 0, 0, "renormalize off, routed_scale 1.7");
}

static void test_block_boundaries_one_token(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 2);
    for (int m = 1; m <= 3; m++) {
        check(&r, fx_config(4, 2, 16 * m, 16, FM_FORMAT_NVFP4), 1, 0, 0, "NVFP4 K = 16, 32, 48");
        check(&r, fx_config(4, 2, 32 * m, 32, FM_FORMAT_MXFP4), 1, 0, 0, "MXFP4 K = 32, 64, 96");
        fm_moe_config c = fx_config(4, 2, 16 * m, 16, FM_FORMAT_NVFP4);
        c.act_nvfp4 = 1;
        check(&r, c, 1, 0, 1, "W4A4 K = 16, 32, 48");
    }
    check(&r, fx_config(3, 1, 24, 8, FM_FORMAT_BF16), 2, 0, 0, "BF16, K not a multiple of 16");
}

/* A bias of +100 outranks every sigmoid score: with top_k = 1 every row goes
 * to expert 3 and the other experts get zero rows. */
static void test_all_rows_one_expert(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 3);
    fm_moe_config c = fx_config(6, 1, 32, 32, FM_FORMAT_MXFP4);
    fx_layer L;
    fx_build(&L, &c, &r, 1, 0);
    L.router_bias[3] = 100.0f;
    const int T = 7;
    uint16_t *x = fx_bf16(&r, (size_t)T * c.hidden, 1.0f);
    float logits[7 * 6], wts[7];
    int32_t ids[7], off[7], perm[7];
    for (int i = 0; i < T * 6; i++) logits[i] = fm_rng_normal(&r);
    assert_int_equal(fm_moe_route(&c, L.router_bias, logits, T, ids, wts), FM_OK);
    assert_int_equal(fm_moe_permute(ids, T, 1, 6, off, perm), FM_OK);
    for (int t = 0; t < T; t++) {
        assert_int_equal(ids[t], 3);
        assert_float_equal(wts[t], c.routed_scale, 1e-6); /* renormalised single weight */
    }
    assert_int_equal(off[3], 0);
    assert_int_equal(off[4], T);
    float *out = malloc(sizeof(float) * T * c.hidden);
    double *want = malloc(sizeof(double) * T * c.hidden);
    assert_int_equal(fm_moe_forward_ref(&c, &L.w, x, T, out), FM_OK);
    (void)oracle(&L, x, T, 0, want); /* the +100 bias leaves a margin of ~100 */
    double e = fm_nmse64(out, want, (size_t)T * c.hidden);
    printf("# all rows on expert 3: nmse %.3e\n", e);
    assert_true(e <= BOUND_W);
    free(x), free(out), free(want);
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_scores),
        cmocka_unit_test(test_groups_renorm_off),
        cmocka_unit_test(test_block_boundaries_one_token),
        cmocka_unit_test(test_all_rows_one_expert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
