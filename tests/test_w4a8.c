/* test_w4a8.c - what W4A8 (fm_moe_config.act_fp8) costs against W4A16 on GLM-like layers, and
 * what the CPU backends do with inputs an FP8 scale cannot be made from.
 *
 * test_layer_fp8.c holds the oracle side (the round trip bit-equal to an independent E4M3
 * rounding, the layer within 1e-4 of a float64 model of the same quantization); here:
 *  - accuracy: W4A8 against the W4A16 layer (the same weights, inputs and routing, act_fp8
 *    off) on GLM-5-shaped layers scaled down (hidden : inter = 3 : 1, top-8 of 32, sigmoid
 *    with a router bias, routed_scale 2.5), NVFP4 and MXFP4, both granularities, on N(0, 1)
 *    rows and on rows with a few massive channels (what LLM activations carry). The NMSE is
 *    asserted within a band, [3e-4, 5e-3]: measured over 20 seeds (docs/accuracy.md) 1.8e-3 ..
 *    1.9e-3 per 128 and 1.95e-3 .. 2.2e-3 per token on N(0, 1) rows, 6.4e-4 .. 7.4e-4 per 128
 *    and 1.55e-3 .. 1.95e-3 per token on massive-channel rows, so 5e-3 is 2.3x the largest and
 *    3e-4 half the smallest (the floor catches a layer that applied no FP8 at all; a round trip
 *    missing on one of the two inputs, or done differently, is test_layer_fp8's float64 model's
 *    to catch); and per 128 at most per token's where channels are massive (an outlier costs
 *    only its block: 2x apart measured);
 *  - non-finite x (NaN, +Inf, -Inf) through fm_layer_run: FM_ERR_NONFINITE naming the element,
 *    out untouched, and fm_layer_errors then FM_OK with nothing recorded (the CPU backends
 *    return what the cuda backend records);
 *  - inputs too large for FP32 (finite BF16 x near its max): FC1's output overflows, so FC2's
 *    FP8 scale would be Inf: FM_ERR_NONFINITE naming the FC2 input, out untouched;
 *  - zero rows (every block's amax 0, scale 1 by definition): an exact zero output.
 */
#include "test_moe_fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fm_backend_kind k_cpu[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};

/* GLM-5's expert shape (hidden 6144, inter 2048) scaled down by 4, its routing. */
static fm_moe_config glm_like(fm_format f)
{
    fm_moe_config c = fx_asan() ? fx_config(8, 4, 384, 128, f) : fx_config(32, 8, 1536, 512, f);
    c.score = FM_SCORE_SIGMOID;
    c.renormalize = 1;
    c.routed_scale = 2.5f;
    return c;
}

static fm_layer *make(fm_backend_kind b, const fx_layer *L, fm_act_fp8 mode, int T)
{
    fm_moe_config c = L->cfg;
    c.act_fp8 = mode;
    fm_layer_desc d = {.backend = b, .max_tokens = T};
    fm_layer     *l = NULL;
    fm_status     s = fm_layer_create_desc(&d, &c, &L->w, &l);
    if (s != FM_OK) fail_msg("create %s, act_fp8 %s: %s: %s", fm_backend_name(b), fm_act_fp8_name(mode),
                             fm_status_name(s), fm_last_error());
    return l;
}

static void run_checked(fm_layer *l, const uint16_t *x, int T, int H, float *out, const char *what)
{
    fm_poison_f32(out, (size_t)T * H);
    fm_status s = fm_layer_forward(l, x, T, out, NULL);
    if (s != FM_OK) fail_msg("%s: %s: %s", what, fm_status_name(s), fm_last_error());
    long bad = fm_first_nonfinite(out, (size_t)T * H);
    if (bad >= 0) fail_msg("%s: out[%ld] = %g", what, bad, (double)out[bad]);
}

static void test_w4a8_vs_w4a16(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x4a8);
    const fm_format fmts[2] = {FM_FORMAT_NVFP4, FM_FORMAT_MXFP4};
    for (int f = 0; f < 2; f++) {
        fm_moe_config cfg = glm_like(fmts[f]);
        fx_layer      L;
        fx_build(&L, &cfg, &r, 1, 0);
        const int T = fx_asan() ? 4 : 32, H = cfg.hidden;
        uint16_t *x = fx_aligned(sizeof(uint16_t) * T * H);
        float    *o16 = fx_aligned(sizeof(float) * T * H), *o8 = fx_aligned(sizeof(float) * T * H);
        fm_layer *l16 = make(FM_BACKEND_CPU, &L, FM_ACT_FP8_OFF, T);
        fm_layer *l8[3] = {NULL, make(FM_BACKEND_CPU, &L, FM_ACT_FP8_BLOCK128, T),
                           make(FM_BACKEND_CPU, &L, FM_ACT_FP8_TOKEN, T)};
        for (int massive = 0; massive < 2; massive++) {
            uint16_t *xs = fx_bf16(&r, (size_t)T * H, 1.0f);
            memcpy(x, xs, sizeof(uint16_t) * T * H);
            free(xs);
            if (massive) /* 4 channels ~50x the rest in every token, as LLM hidden states have */
                for (int t = 0; t < T; t++)
                    for (int c = 0; c < 4; c++) {
                        const int k = (c * 389 + 17) % H;
                        x[(size_t)t * H + k] = fm_bf16_encode(50.0f * (1.0f + 0.2f * fm_rng_normal(&r)));
                    }
            run_checked(l16, x, T, H, o16, "W4A16");
            double e[3] = {0, 0, 0};
            for (int m = 1; m <= 2; m++) {
                char what[96];
                snprintf(what, sizeof what, "%s W4A8 %s", fm_format_traits_get(fmts[f])->name,
                         fm_act_fp8_name((fm_act_fp8)m));
                run_checked(l8[m], x, T, H, o8, what);
                e[m] = fm_nmse(o8, o16, (size_t)T * H);
                print_message("# %s, %s rows: NMSE %.3g against W4A16\n", what, massive ? "massive-channel" : "N(0,1)",
                              e[m]);
                if (!(e[m] <= 5e-3 && e[m] >= 3e-4))
                    fail_msg("%s, %s rows: NMSE %.3g against W4A16, outside [3e-4, 5e-3]", what,
                             massive ? "massive-channel" : "N(0,1)", e[m]);
            }
            /* the full size puts the 4 channels in 4 of 12 blocks (0, 3, 6, 9); the sanitizers'
             * hidden of 384 has 3 blocks, all holding one, so the ordering is not asserted there */
            if (massive && !fx_asan() && !(e[FM_ACT_FP8_BLOCK128] <= e[FM_ACT_FP8_TOKEN]))
                fail_msg("%s, massive channels: per 128 (%.3g) worse than per token (%.3g)",
                         fm_format_traits_get(fmts[f])->name, e[FM_ACT_FP8_BLOCK128], e[FM_ACT_FP8_TOKEN]);
        }
        fm_layer_destroy(l16), fm_layer_destroy(l8[1]), fm_layer_destroy(l8[2]);
        free(x), free(o16), free(o8);
        fx_free(&L);
    }
}

/* A run expected to fail with FM_ERR_NONFINITE and a message holding `needle`, out untouched
 * and nothing left for fm_layer_errors. */
static void expect_nonfinite(fm_layer *l, const fm_layer_run_args *a, int H, const char *needle, const char *what)
{
    const size_t n = (size_t)a->T * H;
    float       *keep = malloc(sizeof(float) * n);
    assert_non_null(keep);
    fm_poison_bytes(a->out, sizeof(float) * n);
    memcpy(keep, a->out, sizeof(float) * n);
    fm_status s = fm_layer_run(l, a);
    if (s != FM_ERR_NONFINITE) fail_msg("%s: %s (%s), expected FM_ERR_NONFINITE", what, fm_status_name(s), fm_last_error());
    if (!strstr(fm_last_error(), needle)) fail_msg("%s: message '%s' lacks '%s'", what, fm_last_error(), needle);
    assert_memory_equal(a->out, keep, sizeof(float) * n);
    fm_layer_error_info info;
    memset(&info, 0x5a, sizeof info);
    assert_int_equal(fm_layer_errors(l, NULL, &info), FM_OK);
    assert_int_equal(info.nonfinite_x, 0);
    assert_true(info.bad_ids == 0 && info.nonfinite_weights == 0 && info.first_nonfinite == -1);
    free(keep);
}

static void test_bad_inputs(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xbad8);
    const int     E = 8, K = 2, H = 256, I = 128, T = 5;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    fx_layer      L;
    fx_build(&L, &cfg, &r, 0, 0);
    uint16_t *x = fx_aligned(sizeof(uint16_t) * T * H), *xs = fx_bf16(&r, (size_t)T * H, 1.0f);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K), *out = fx_aligned(sizeof(float) * T * H);
    fx_random_routing(&r, T, K, E, 0.0, ids, wts);
    fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = out};
    for (int b = 0; b < 2; b++)
        for (int m = 1; m <= 2; m++) {
            fm_layer *l = make(k_cpu[b], &L, (fm_act_fp8)m, T);
            char      what[96];
            /* NaN, +Inf, -Inf in x: refused on entry, the element named */
            const uint16_t bad[3] = {0x7fc0, 0x7f80, 0xff80};
            for (int k = 0; k < 3; k++) {
                memcpy(x, xs, sizeof(uint16_t) * T * H);
                x[3 * H + 131] = bad[k]; /* token 3, second FP8 block */
                snprintf(what, sizeof what, "%s %s, x = %s", fm_backend_name(k_cpu[b]), fm_act_fp8_name((fm_act_fp8)m),
                         k == 0 ? "NaN" : k == 1 ? "+Inf" : "-Inf");
                expect_nonfinite(l, &a, H, "x[3][131]", what);
            }
            /* finite x near BF16's max: FC1's output overflows FP32, FC2's scale would be Inf */
            for (int i = 0; i < T * H; i++) x[i] = fm_bf16_encode(3.0e38f * (i % 2 ? 1.0f : -0.75f));
            snprintf(what, sizeof what, "%s %s, x near 3e38", fm_backend_name(k_cpu[b]), fm_act_fp8_name((fm_act_fp8)m));
            expect_nonfinite(l, &a, H, "FC2 input", what);
            /* zero rows: scale 1 per block, zero codes, an exact zero out (no biases here) */
            memcpy(x, xs, sizeof(uint16_t) * T * H);
            memset(x + H, 0, sizeof(uint16_t) * H);
            for (int i = 0; i < H; i++) x[4 * H + i] = 0x8000; /* -0 */
            fm_poison_f32(out, (size_t)T * H);
            assert_int_equal(fm_layer_run(l, &a), FM_OK);
            assert_int_equal(fm_first_nonfinite(out, (size_t)T * H), -1);
            for (int i = 0; i < H; i++)
                if (out[H + i] != 0.0f || out[4 * H + i] != 0.0f)
                    fail_msg("%s %s: a zero row gives out %g / %g at %d", fm_backend_name(k_cpu[b]),
                             fm_act_fp8_name((fm_act_fp8)m), (double)out[H + i], (double)out[4 * H + i], i);
            fm_layer_destroy(l);
        }
    free(x), free(xs), free(ids), free(wts), free(out);
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_w4a8_vs_w4a16),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
