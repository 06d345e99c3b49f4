/* test_cuda_backend.c - the "cuda" backend's layer against the CPU reference
 * (fm_moe_forward_ref through the cpu-ref backend): random GLM-like layers
 * (sigmoid router with bias, renormalised top-k, routed scale), NVFP4 and MXFP4,
 * several token counts, with and without the BF16 shared expert; fresh inputs,
 * poisoned outputs, NaN/Inf first.
 * Bound 1e-4 NMSE: the GPU rounds the SwiGLU output h to BF16 before FC2 (the
 * reference keeps it FP32): relative 2^-9 per element, NMSE ~1e-6, and the
 * accumulation orders differ; a wrong expert, weight or row gives NMSE ~1. */
#include <math.h>

#include "gpu_common.h"

static void run_layer(fm_rng *r, fm_format f, int T, int shared_inter)
{
    fm_moe_config c;
    fm_moe_config_default(&c);
    c.n_experts = 8;
    c.top_k = 3;
    c.hidden = 256;
    c.inter = 96; /* FC1 N = 192: gate/up bands of 16 */
    c.wfmt = f;
    c.shared_inter = shared_inter;
    gpu_experts w13, w2;
    gpu_experts_make(&w13, r, f, c.n_experts, 2 * c.inter, c.hidden);
    gpu_experts_make(&w2, r, f, c.n_experts, c.hidden, c.inter);
    float *router = malloc(sizeof(float) * c.n_experts * c.hidden), bias[8];
    fm_rng_fill_normal(r, router, (size_t)c.n_experts * c.hidden, 0.05f);
    fm_rng_fill_normal(r, bias, 8, 0.1f);
    uint16_t *sw13 = NULL, *sw2 = NULL;
    if (shared_inter > 0) { /* BF16 shared expert */
        size_t n13 = (size_t)2 * shared_inter * c.hidden, n2 = (size_t)shared_inter * c.hidden;
        sw13 = malloc(sizeof(uint16_t) * n13);
        sw2 = malloc(sizeof(uint16_t) * n2);
        for (size_t i = 0; i < n13; i++) sw13[i] = fm_bf16_encode(0.05f * fm_rng_normal(r));
        for (size_t i = 0; i < n2; i++) sw2[i] = fm_bf16_encode(0.05f * fm_rng_normal(r));
    }
    fm_moe_weights w = {.router_w = router, .router_bias = bias, .w13 = w13.w, .w2 = w2.w, .shared_w13 = sw13,
                        .shared_w2 = sw2};
    uint16_t *x = malloc(sizeof(uint16_t) * T * c.hidden);
    for (int i = 0; i < T * c.hidden; i++) x[i] = fm_bf16_encode(fm_rng_normal(r));
    float *ref = malloc(sizeof(float) * T * c.hidden), *got = malloc(sizeof(float) * T * c.hidden);
    fm_layer *lr = NULL, *lg = NULL;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU_REF, &c, &w, T, &lr), FM_OK);
    assert_int_equal(fm_layer_create(FM_BACKEND_CUDA, &c, &w, T, &lg), FM_OK);
    assert_int_equal(fm_layer_forward(lr, x, T, ref, NULL), FM_OK);
    fm_poison_f32(got, (size_t)T * c.hidden);
    fm_run_stats st = {0};
    assert_int_equal(fm_layer_forward(lg, x, T, got, &st), FM_OK);
    char what[64];
    snprintf(what, sizeof what, "cuda layer %s T=%d shared_inter=%d", fm_format_traits_get(f)->name, T, shared_inter);
    fm_assert_close(got, ref, (size_t)T * c.hidden, 1e-4, what);
    fm_layer_destroy(lr);
    fm_layer_destroy(lg);
    free(router);
    free(sw13);
    free(sw2);
    free(x);
    free(ref);
    free(got);
    gpu_experts_free(&w13);
    gpu_experts_free(&w2);
}

static void test_layer_vs_reference(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    run_layer(&r, FM_FORMAT_NVFP4, 1, 0);
    run_layer(&r, FM_FORMAT_NVFP4, 7, 0);
    run_layer(&r, FM_FORMAT_NVFP4, 40, 0);
    run_layer(&r, FM_FORMAT_MXFP4, 13, 0);
    run_layer(&r, FM_FORMAT_NVFP4, 9, 64); /* with the BF16 shared expert */
}

static void test_unsupported(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 1);
    fm_moe_config c;
    fm_moe_config_default(&c);
    c.n_experts = 2;
    c.top_k = 1;
    c.hidden = 64;
    c.inter = 32;
    c.act_nvfp4 = 1;
    gpu_experts w13, w2;
    gpu_experts_make(&w13, &r, FM_FORMAT_NVFP4, 2, 64, 64);
    gpu_experts_make(&w2, &r, FM_FORMAT_NVFP4, 2, 64, 32);
    float          router[128] = {0};
    fm_moe_weights w = {.router_w = router, .w13 = w13.w, .w2 = w2.w};
    fm_layer      *l = NULL;
    assert_int_equal(fm_layer_create(FM_BACKEND_CUDA, &c, &w, 4, &l), FM_ERR_UNSUPPORTED);
    assert_null(l);
    gpu_experts_free(&w13);
    gpu_experts_free(&w2);
}

int main(void)
{
    fm_test_require_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_vs_reference),
        cmocka_unit_test(test_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
