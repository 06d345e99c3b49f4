/* test_cpu_fast.c - the fast CPU backend ("cpu") against the reference
 * ("cpu-ref"), both through fm_layer_create / fm_layer_forward, on fresh random
 * layers: several shapes (1 token; M <= 4 rows per expert, the register path;
 * M > 4, the buffered / prefill paths: row counts that are and are not
 * multiples of the prefill tile, more rows than one row block, K blocks with a
 * short last one, a short last weight quad; K at block boundaries), all three
 * weight formats,
 * act_nvfp4 off and on, static and dynamic activation scales, the shared
 * expert, and every kernel ISA the CPU has (the native choice, then AVX2 and
 * the portable scalar path forced with FM_CPU_ISA=avx2 / scalar).
 * The caller's weights are scribbled over and freed right after create: both
 * backends must have taken a deep copy.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "test_moe_fixture.h"

#include <stdio.h>

/* Bounds, NMSE of "cpu" against "cpu-ref" (docs/accuracy.md):
 * - W4A16 / BF16: the two differ only in FP32 summation order (K <= 512 here:
 *   relative error ~1e-7 per dot, NMSE ~1e-13); 1e-9 leaves room and still
 *   catches any decode error (a wrong nibble or scale gives >= 1e-3).
 * - W4A4 (act_nvfp4): the FC2 input is re-quantized to E2M1 from an h that
 *   differs by a few ulps, so now and then an element on a rounding boundary
 *   lands one E2M1 step away (seen ~1e-4 at these small inter sizes, when it
 *   happens at all); 2e-3 still catches a wrong scale or a skipped quantization
 *   (>= 1e-2, checked in test_moe_ref.c). */
#define BOUND_W4A16 1e-9
#define BOUND_W4A4 2e-3

typedef struct {
    int E, top_k, H, I, S, T, n_group, topk_group;
    fm_score_func score;
} shape;

static const shape k_shapes[] = {
    /*  E  top_k   H    I   S   T  n_group topk_group score */
    {8, 2, 64, 32, 0, 1, 0, 0, FM_SCORE_SIGMOID},     /* one token: most experts have zero rows */
    {8, 2, 96, 64, 0, 5, 0, 0, FM_SCORE_SOFTMAX},     /* M <= 4 per expert: register path */
    {4, 2, 128, 64, 32, 24, 0, 0, FM_SCORE_SIGMOID},  /* M > 4: buffered path; shared expert */
    {16, 4, 32, 32, 0, 9, 4, 2, FM_SCORE_SIGMOID},    /* K = 32: one MXFP4 block; group-limited */
    {6, 6, 64, 96, 16, 3, 0, 0, FM_SCORE_SOFTMAX},    /* top_k = E: every expert active */
    /* The AVX-512 prefill kernel (kernels_prefill512.c, M > 3): */
    {2, 1, 576, 96, 0, 110, 0, 0, FM_SCORE_SOFTMAX},  /* > 48 rows on an expert: two row blocks; K = 576 = 512 + 64 */
    {4, 2, 64, 64, 32, 28, 0, 0, FM_SCORE_SIGMOID},   /* ~14 rows per expert: tiles of 5 + 5 + 4, not 6 + 6 + 2 */
};

static void run_case(fm_rng *r, const shape *sh, fm_format f, int act, int ascale, int bias)
{
    fm_moe_config c = fx_config(sh->E, sh->top_k, sh->H, sh->I, f);
    c.shared_inter = sh->S;
    c.n_group = sh->n_group;
    c.topk_group = sh->topk_group;
    c.score = sh->score;
    c.act_nvfp4 = act;
    fx_layer L;
    fx_build(&L, &c, r, bias, ascale);
    fm_layer *ref = NULL, *fast = NULL;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU_REF, &c, &L.w, sh->T, &ref), FM_OK);
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &c, &L.w, sh->T, &fast), FM_OK);
    assert_int_equal(fm_layer_backend(fast), FM_BACKEND_CPU);
    /* In the native sweep, also an AVX2-capped layer: the AVX-512 kernels are
     * built to give the AVX2 kernels' results bit for bit (same products, same
     * lane folding), which this checks on AVX-512 machines. */
    fm_layer *avx2 = NULL;
    if (!getenv("FM_CPU_ISA")) {
        setenv("FM_CPU_ISA", "avx2", 1);
        assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &c, &L.w, sh->T, &avx2), FM_OK);
        unsetenv("FM_CPU_ISA");
    }
    fx_free(&L); /* every layer must own a copy now */

    size_t n = (size_t)sh->T * sh->H;
    uint16_t *x = fx_bf16(r, n, 1.0f);
    float *o_ref = malloc(sizeof(float) * n), *o_fast = malloc(sizeof(float) * n);
    fm_poison_f32(o_ref, n);
    fm_poison_f32(o_fast, n);
    fm_run_stats st = {-1.0};
    assert_int_equal(fm_layer_forward(ref, x, sh->T, o_ref, NULL), FM_OK);
    assert_int_equal(fm_layer_forward(fast, x, sh->T, o_fast, &st), FM_OK);
    assert_true(st.ms >= 0.0);
    assert_true(fm_first_nonfinite(o_ref, n) < 0);
    char what[160];
    snprintf(what, sizeof what, "cpu vs cpu-ref %s act=%d ascale=%d E=%d k=%d H=%d I=%d S=%d T=%d", 
             fm_format_traits_get(f)->name, act, ascale, sh->E, sh->top_k, sh->H, sh->I, sh->S, sh->T);
    fm_assert_close(o_fast, o_ref, n, act ? BOUND_W4A4 : BOUND_W4A16, what);

    /* A second run on the same layer (buffers reused) gives the same answer. */
    float *o2 = malloc(sizeof(float) * n);
    if (avx2) {
        fm_poison_f32(o2, n);
        assert_int_equal(fm_layer_forward(avx2, x, sh->T, o2, NULL), FM_OK);
        assert_memory_equal(o2, o_fast, sizeof(float) * n);
        fm_layer_destroy(avx2);
    }
    fm_poison_f32(o2, n);
    assert_int_equal(fm_layer_forward(fast, x, sh->T, o2, NULL), FM_OK);
    assert_memory_equal(o2, o_fast, sizeof(float) * n);
    /* Fewer tokens than max_tokens. */
    if (sh->T > 1) {
        fm_poison_f32(o2, n);
        assert_int_equal(fm_layer_forward(fast, x, 1, o2, NULL), FM_OK);
        float *o1 = malloc(sizeof(float) * sh->H);
        assert_int_equal(fm_layer_forward(ref, x, 1, o1, NULL), FM_OK);
        fm_assert_close(o2, o1, sh->H, act ? BOUND_W4A4 : BOUND_W4A16, "T=1 on a larger layer");
        for (size_t i = sh->H; i < n; i++) assert_true(isnan(o2[i])); /* rows past T untouched */
        free(o1);
    }
    free(o2), free(x), free(o_ref), free(o_fast);
    fm_layer_destroy(ref);
    fm_layer_destroy(fast);
}

static void sweep(void)
{
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    size_t ns = sizeof k_shapes / sizeof k_shapes[0];
    for (size_t i = 0; i < ns; i++) {
        if (fx_asan() && i != 0 && i != 2 && i < 5) continue; /* sanitizers: one token, and the many-rows paths */
        for (int f = 0; f < FM_FORMAT_COUNT; f++)
            for (int act = 0; act < 2; act++)
                run_case(&r, &k_shapes[i], (fm_format)f, act, act && (i & 1), (int)(i % 2 == 0));
    }
    /* BF16 weights with K not a multiple of 16 (hidden 40, inter 24): the
     * vector loops' scalar tails; 12 tokens on 3 experts put > 8 rows on some. */
    const shape odd = {3, 2, 40, 24, 16, 12, 0, 0, FM_SCORE_SIGMOID};
    run_case(&r, &odd, FM_FORMAT_BF16, 0, 0, 1);
    /* BF16 weights, K = 64 but 2 * I = 18 FC1 rows: the
     * prefill kernel's short last quad (rows 16, 17 of a 4-row quad). */
    const shape quad = {3, 2, 64, 9, 0, 20, 0, 0, FM_SCORE_SOFTMAX};
    run_case(&r, &quad, FM_FORMAT_BF16, 0, 0, 0);
}

static void test_fast_vs_ref_native(void **state)
{
    (void)state;
    unsetenv("FM_CPU_ISA");
    sweep();
}

static void test_fast_vs_ref_avx2(void **state)
{
    (void)state;
    setenv("FM_CPU_ISA", "avx2", 1); /* the AVX2 kernels where AVX-512 would be chosen */
    sweep();
    unsetenv("FM_CPU_ISA");
}

static void test_fast_vs_ref_scalar(void **state)
{
    (void)state;
    setenv("FM_CPU_ISA", "scalar", 1);
    sweep();
    unsetenv("FM_CPU_ISA");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_vs_ref_native),
        cmocka_unit_test(test_fast_vs_ref_avx2),
        cmocka_unit_test(test_fast_vs_ref_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
