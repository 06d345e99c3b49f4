/* test_layer_fp8.c - FP8 activations (W4A8, fm_moe_config.act_fp8) on the CPU backends.
 *
 * Oracles, both written here without the library's codecs:
 *  - the round trip of a row: an E4M3 rounding in double (nearest even on the exponent's
 *    grid, 2^-9 steps below 2^-6, saturation at 448) of x / s, s = amax / 448 in FP32 per
 *    block of 128 or per row; must equal fm_moe_act_fp8_row bit for bit on random rows and
 *    on the edges (a zero block, ties, values at and past 448, a subnormal-range block, a
 *    short last block);
 *  - the layer: a float64 MoE from the formula with both GEMM inputs put through that
 *    rounding (x rows, then h computed in double). Bound 1e-4 NMSE: the layer's h is FP32,
 *    so an element of h within ~1e-7 of an E4M3 rounding boundary may round the other way
 *    (one step, 6-12 % of that element) in a few of the T * inter elements; measured 1e-14 ..
 *    1.3e-7 over 400 seeds but for two at ~4e-6 (a flip of a block's largest element on
 *    these small layers). The test first shows the oracle tells the two scale granularities
 *    and W4A16 apart (NMSE >= 4.5e-4 over 150 seeds; asserted > 2e-4).
 * Also: cpu against cpu-ref (the accuracy table's bound, fm_layer_accuracy), W4A8 against
 * W4A16 printed (docs/accuracy.md states it), and the refusals.
 */
#include "test_moe_fixture.h"
#include "testutil.h"

#include "moe/moe_internal.h" /* fm_moe_act_fp8_row */

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fm_backend_kind k_cpu[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};

/* E4M3 (float8_e4m3fn) rounding of v, nearest even, saturating at 448. */
static double e4m3_round(double v)
{
    const double a = fabs(v);
    if (a >= 448.0) return copysign(448.0, v);
    if (a == 0.0) return v;
    int e;
    (void)frexp(a, &e); /* a = m 2^e, m in [0.5, 1): the leading bit is 2^(e - 1) */
    int lead = e - 1;
    if (lead < -6) lead = -6; /* subnormals: the grid of 2^-6's exponent, steps of 2^-9 */
    const double step = ldexp(1.0, lead - 3), q = a / step, r = floor(q), f = q - r;
    double n = f > 0.5 ? r + 1 : f < 0.5 ? r : (fmod(r, 2.0) == 0.0 ? r : r + 1);
    return copysign(n * step, v);
}

/* The FP8 round trip of a row, as act_fp8 specifies it (FP32 scale and quotient). */
static void fp8_row(const float *src, int n, fm_act_fp8 mode, float *dst)
{
    const int blk = mode == FM_ACT_FP8_TOKEN ? n : 128;
    for (int b0 = 0; b0 < n; b0 += blk) {
        const int b1 = b0 + blk < n ? b0 + blk : n;
        float     amax = 0.0f;
        for (int i = b0; i < b1; i++)
            if (fabsf(src[i]) > amax) amax = fabsf(src[i]);
        float s = amax / 448.0f;
        if (!(s >= FLT_MIN)) s = 1.0f;
        for (int i = b0; i < b1; i++) {
            const float v = src[i] / s;
            dst[i] = (float)e4m3_round(v) * s;
        }
    }
}

static void test_round_trip_vs_oracle(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xf8);
    const int n = 400; /* 3 blocks of 128 and a short one of 16 */
    float    *src = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    assert_true(src && got && want);
    for (int round = 0; round < 60; round++) {
        const float sig = round < 20 ? 1.0f : round < 40 ? 1e-3f : 300.0f;
        for (int i = 0; i < n; i++) src[i] = sig * fm_rng_normal(&r);
        if (round % 5 == 1)
            for (int i = 128; i < 256; i++) src[i] = 0.0f; /* a zero block: s = 1, zeros out */
        if (round % 5 == 2) src[7] = 1e4f * sig; /* an outlier: costs its block only (block128) */
        if (round % 5 == 3)
            for (int i = 256; i < 384; i++) src[i] = 1e-37f * fm_rng_normal(&r); /* amax / 448 < FLT_MIN */
        if (round % 5 == 4) { /* ties of the E4M3 grid once scaled: amax 448 makes s = 1 */
            src[0] = 448.0f, src[1] = 1.0625f, src[2] = 1.1875f, src[3] = -3.25f * 0.5f * 1.0625f, src[4] = 0.0f;
            src[5] = 0.00390625f * 1.5f; /* 2^-8 * 1.5: subnormal grid tie */
        }
        for (int m = 1; m <= 2; m++) {
            fm_poison_f32(got, (size_t)n);
            assert_int_equal(fm_moe_act_fp8_row(src, n, (fm_act_fp8)m, got), FM_OK);
            fp8_row(src, n, (fm_act_fp8)m, want);
            for (int i = 0; i < n; i++)
                if (memcmp(&got[i], &want[i], sizeof(float)))
                    fail_msg("round %d, %s: element %d of %g: got %.9g, the oracle %.9g", round,
                             fm_act_fp8_name((fm_act_fp8)m), i, (double)src[i], (double)got[i], (double)want[i]);
        }
    }
    /* in place, and NaN refused with dst untouched */
    for (int i = 0; i < n; i++) src[i] = fm_rng_normal(&r);
    fp8_row(src, n, FM_ACT_FP8_BLOCK128, want);
    memcpy(got, src, sizeof(float) * n);
    assert_int_equal(fm_moe_act_fp8_row(got, n, FM_ACT_FP8_BLOCK128, got), FM_OK);
    assert_memory_equal(got, want, sizeof(float) * n);
    src[200] = NAN;
    fm_poison_f32(got, (size_t)n);
    memcpy(want, got, sizeof(float) * n);
    assert_int_equal(fm_moe_act_fp8_row(src, n, FM_ACT_FP8_TOKEN, got), FM_ERR_NONFINITE);
    assert_memory_equal(got, want, sizeof(float) * n);
    free(src), free(got), free(want);
}

/* float64 MoE from the formula with act_fp8's two round trips (SwiGLU), external routing. */
static void oracle(const fx_layer *L, fm_act_fp8 mode, const uint16_t *x, int T, const int32_t *ids, const float *wts,
                   double *out)
{
    const fm_moe_config *c = &L->cfg;
    const int            H = c->hidden, I = c->inter, K = c->top_k;
    float  *w13 = malloc(sizeof(float) * 2 * I * H), *w2 = malloc(sizeof(float) * H * I);
    float  *a = malloc(sizeof(float) * H), *hf = malloc(sizeof(float) * I);
    double *g = malloc(sizeof(double) * 2 * I);
    assert_true(w13 && w2 && a && hf && g);
    memset(out, 0, sizeof(double) * T * H);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j];
            if (e < 0) continue;
            assert_int_equal(fm_dequantize(&L->w13[e], w13), FM_OK);
            assert_int_equal(fm_dequantize(&L->w2[e], w2), FM_OK);
            for (int k = 0; k < H; k++) a[k] = fm_bf16_decode(x[(size_t)t * H + k]);
            if (mode) fp8_row(a, H, mode, a);
            for (int n = 0; n < 2 * I; n++) {
                double s = 0;
                for (int k = 0; k < H; k++) s += (double)w13[(size_t)n * H + k] * a[k];
                g[n] = s;
            }
            for (int i = 0; i < I; i++) hf[i] = (float)(g[i] / (1.0 + exp(-g[i])) * g[I + i]);
            if (mode) fp8_row(hf, I, mode, hf);
            for (int n = 0; n < H; n++) {
                double s = 0;
                for (int i = 0; i < I; i++) s += (double)w2[(size_t)n * I + i] * hf[i];
                out[(size_t)t * H + n] += wts[t * K + j] * s;
            }
        }
    free(w13), free(w2), free(a), free(hf), free(g);
}

static double nmse64d(const double *a, const double *ref, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - ref[i]) * (a[i] - ref[i]), r += ref[i] * ref[i];
    return r > 0 ? d / r : d;
}

static void test_layer_vs_formula(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xa8);
    const int E = 8, K = 3, H = 256, I = 192, T = fx_asan() ? 3 : 8; /* K of FC1: 2 blocks; of FC2: 1.5 */
    const fm_format fmts[2] = {FM_FORMAT_NVFP4, FM_FORMAT_MXFP4};
    for (int f = 0; f < 2; f++) {
        fm_moe_config cfg = fx_config(E, K, H, I, fmts[f]);
        fx_layer      L;
        fx_build(&L, &cfg, &r, 1, 0);
        uint16_t *x = fx_aligned(sizeof(uint16_t) * T * H), *xs = fx_bf16(&r, (size_t)T * H, 1.0f);
        memcpy(x, xs, sizeof(uint16_t) * T * H);
        free(xs);
        x[5] = fm_bf16_encode(40.0f); /* an outlier in token 0's first block */
        int32_t *ids = fx_aligned(sizeof(int32_t) * T * K);
        float   *wts = fx_aligned(sizeof(float) * T * K), *out = fx_aligned(sizeof(float) * T * H);
        float   *o16 = malloc(sizeof(float) * T * H), *oref = malloc(sizeof(float) * T * H);
        double  *ref[3];
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) ids[t * K + j] = (t + 3 * j) % E, wts[t * K + j] = 0.2f + 0.1f * j;
        for (int m = 0; m < 3; m++) {
            ref[m] = malloc(sizeof(double) * T * H);
            oracle(&L, (fm_act_fp8)m, x, T, ids, wts, ref[m]);
        }
        const double apart_tok = nmse64d(ref[FM_ACT_FP8_TOKEN], ref[FM_ACT_FP8_BLOCK128], (size_t)T * H);
        const double apart_16 = nmse64d(ref[0], ref[FM_ACT_FP8_BLOCK128], (size_t)T * H);
        print_message("# %s: oracle W4A8 block128 vs token NMSE %.3g, vs W4A16 %.3g\n", fm_format_traits_get(fmts[f])->name,
                      apart_tok, apart_16);
        assert_true(apart_tok > 2e-4 && apart_16 > 2e-4); /* the oracle tells them apart (bound: 1e-4) */
        for (int m = 1; m <= 2; m++) {
            L.cfg.act_fp8 = (fm_act_fp8)m;
            for (int b = 0; b < 2; b++) {
                fm_layer_desc d = {.backend = k_cpu[b], .max_tokens = T};
                fm_layer     *l = NULL;
                assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &L.w, &l), FM_OK);
                fm_poison_f32(out, (size_t)T * H);
                fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = out};
                assert_int_equal(fm_layer_run(l, &a), FM_OK);
                assert_int_equal(fm_first_nonfinite(out, (size_t)T * H), -1);
                const double e = fm_nmse64(out, ref[m], (size_t)T * H);
                print_message("# %s %s %s: NMSE %.3g vs the float64 formula\n", fm_backend_name(k_cpu[b]),
                              fm_format_traits_get(fmts[f])->name, fm_act_fp8_name((fm_act_fp8)m), e);
                if (!(e <= 1e-4))
                    fail_msg("%s, %s: NMSE %.3g vs the float64 formula (bound 1e-4)", fm_backend_name(k_cpu[b]),
                             fm_act_fp8_name((fm_act_fp8)m), e);
                if (b == 0) memcpy(oref, out, sizeof(float) * T * H);
                fm_layer_destroy(l);
            }
            double bound = -1; /* cpu against cpu-ref: the accuracy table */
            assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU, &L.cfg, &bound), FM_OK);
            fm_assert_close(out, oref, (size_t)T * H, bound, "cpu vs cpu-ref, W4A8");
            /* W4A8 against W4A16 on the same layer: what docs/accuracy.md states */
            fm_moe_config c16 = L.cfg;
            c16.act_fp8 = FM_ACT_FP8_OFF;
            fm_layer *l16 = NULL;
            assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &c16, &L.w, T, &l16), FM_OK);
            fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = o16};
            assert_int_equal(fm_layer_run(l16, &a), FM_OK);
            print_message("# %s %s: W4A8 vs W4A16 NMSE %.3g\n", fm_format_traits_get(fmts[f])->name,
                          fm_act_fp8_name((fm_act_fp8)m), fm_nmse(out, o16, (size_t)T * H));
            fm_layer_destroy(l16);
        }
        for (int m = 0; m < 3; m++) free(ref[m]);
        free(x), free(ids), free(wts), free(out), free(o16), free(oref);
        fx_free(&L);
    }
}

static void test_refusals(void **st)
{
    (void)st;
    fm_moe_config c = fx_config(4, 2, 64, 32, FM_FORMAT_NVFP4);
    c.act_fp8 = (fm_act_fp8)3;
    assert_int_equal(fm_moe_config_check(&c), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "act_fp8"));
    c.act_fp8 = FM_ACT_FP8_TOKEN;
    c.act_nvfp4 = 1;
    assert_int_equal(fm_moe_config_check(&c), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "choose one"));
    c.act_nvfp4 = 0;
    assert_int_equal(fm_moe_config_check(&c), FM_OK);
    assert_string_equal(fm_act_fp8_name(FM_ACT_FP8_BLOCK128), "block128");
    assert_string_equal(fm_act_fp8_name((fm_act_fp8)9), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_vs_oracle),
        cmocka_unit_test(test_layer_vs_formula),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
