/* test_layer_scales.c - fm_layer_create refuses scales that would make a
 * forward pass fail later (src/layer.c, fm_moe_weights_check): a1/a2 input
 * global scales outside [FLT_MIN, FLT_MAX / 2688] (1e-45 and FLT_MAX used to
 * pass create and then fail in forward with a different status per backend),
 * and a weight global scale (weight_scale_2) that makes a decoded weight
 * overflow FP32 (3e38 used to pass and be blamed on the input in forward).
 * One status for all of them, FM_ERR_NONFINITE, with the range or the tensor
 * and expert in the message; on failure *out is NULL. The bounds themselves
 * are accepted and a forward pass with them is finite.
 */
#include "test_moe_fixture.h"

#include <float.h>

enum { E = 4, TOPK = 2, H = 64, I = 32, T = 3 };

static int create_status(fm_backend_kind k, const fm_moe_config *c, const fm_moe_weights *w)
{
    fm_layer *l = (fm_layer *)(uintptr_t)1; /* must come back NULL on failure */
    fm_status s = fm_layer_create(k, c, w, T, &l);
    if (s == FM_OK)
        fm_layer_destroy(l);
    else
        assert_null(l);
    return s;
}

static void test_input_scales(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    fm_moe_config c = fx_config(E, TOPK, H, I, FM_FORMAT_NVFP4);
    c.act_nvfp4 = 1;
    fx_layer L;
    fx_build(&L, &c, &r, 0, 1);
    const fm_backend_kind kinds[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};
    const float bad[] = {1e-45f, 1e-39f, nextafterf(FLT_MIN, 0.0f), FLT_MAX, 3e38f,
                         nextafterf(FLT_MAX / 2688.0f, INFINITY), 0.0f, -1.0f, NAN, INFINITY};
    for (int j = 0; j < 2; j++) {
        float *a = j ? L.a2 : L.a1;
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            float keep = a[2];
            a[2] = bad[i];
            for (int k = 0; k < 2; k++) {
                assert_int_equal(create_status(kinds[k], &c, &L.w), FM_ERR_NONFINITE);
                char want[32];
                snprintf(want, sizeof want, "%s[2] = ", j ? "a2_scale" : "a1_scale");
                assert_non_null(strstr(fm_last_error(), want));
                assert_non_null(strstr(fm_last_error(), "in [1.17549e-38, 1.26593e+35]"));
            }
            a[2] = keep;
        }
    }
    /* the bounds are valid, and the layer runs finite with them */
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    float out[T * H];
    const float edge[2] = {FLT_MIN, FLT_MAX / 2688.0f};
    for (int b = 0; b < 2; b++) {
        for (int e = 0; e < E; e++) L.a1[e] = L.a2[e] = edge[b];
        for (int k = 0; k < 2; k++) {
            fm_layer *l = NULL;
            assert_int_equal(fm_layer_create(kinds[k], &c, &L.w, T, &l), FM_OK);
            fm_poison_f32(out, T * H);
            assert_int_equal(fm_layer_forward(l, x, T, out, NULL), FM_OK);
            assert_true(fm_first_nonfinite(out, T * H) < 0);
            fm_layer_destroy(l);
        }
    }
    free(x);
    fx_free(&L);
}

static void test_weight_global_scale(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x77);
    fm_moe_config c = fx_config(E, TOPK, H, I, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &c, &r, 0, 0);
    /* fm_quantize's derived global puts a block scale of 448 in every tensor:
     * 6 x 448 x 3e38 overflows, so does 6 x 448 x 1.3e35 */
    const float bad[] = {3e38f, FLT_MAX, 1.3e35f};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int j = 0; j < 2; j++) {
            fm_qtensor *t = j ? &L.w2[3] : &L.w13[1];
            float keep = t->global_scale;
            t->global_scale = bad[i];
            for (int k = FM_BACKEND_CPU_REF; k <= FM_BACKEND_CPU; k++) {
                assert_int_equal(create_status((fm_backend_kind)k, &c, &L.w), FM_ERR_NONFINITE);
                assert_non_null(strstr(fm_last_error(), j ? "w2[3] (expert 3): weight_scale_2 too large: element ["
                                                          : "w13[1] (expert 1): weight_scale_2 too large: element ["));
                assert_non_null(strstr(fm_last_error(), "overflows FP32"));
            }
            t->global_scale = keep;
        }
    /* MXFP4: a block scale of 2^127 over a 6 overflows too */
    fx_free(&L);
    c.wfmt = FM_FORMAT_MXFP4;
    fx_build(&L, &c, &r, 0, 0);
    L.w2[0].scales[7] = 254;
    ((uint8_t *)L.w2[0].data)[7 * 16] = 0x77;
    assert_int_equal(create_status(FM_BACKEND_CPU, &c, &L.w), FM_ERR_NONFINITE);
    assert_non_null(strstr(fm_last_error(), "w2[0] (expert 0): block scale too large: element ["));
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_input_scales),
        cmocka_unit_test(test_weight_global_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
