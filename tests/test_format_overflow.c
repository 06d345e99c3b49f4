/* test_format_overflow.c - no format entry point returns FM_OK with a
 * non-finite result: fm_dequantize rejects a tensor any element of which
 * decodes to +-Inf ((e2m1 x block scale) x global overflows FP32; it used to
 * return FM_OK with Inf for an NVFP4 global scale of FLT_MAX), and
 * fm_quantize rejects a caller's global scale whose largest representable
 * value 6 x 448 x g overflows (g = 1.28e35 used to give FM_OK and a tensor
 * that decoded to Inf). Failing calls leave the caller's buffers untouched.
 */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { ROWS = 3, COLS = 64 };

static void random_rows(fm_rng *r, float *x, int n, float scale)
{
    for (int i = 0; i < n; i++) x[i] = (float)fm_rng_normal(r) * scale;
}

static int all_finite(const float *y, int n) { return fm_first_nonfinite(y, (size_t)n) < 0; }

/* The case: a valid NVFP4 tensor with its global scale set to FLT_MAX
 * (or 3e38) decodes to Inf: FM_ERR_NONFINITE, dst untouched, the element named. */
static void test_dequantize_huge_global(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    float x[ROWS * COLS], y[ROWS * COLS], p[ROWS * COLS];
    uint8_t d[ROWS * COLS / 2], sc[ROWS * COLS / 16];
    random_rows(&r, x, ROWS * COLS, 1.0f);
    fm_qtensor t = {.fmt = FM_FORMAT_NVFP4, .rows = ROWS, .cols = COLS, .data = d, .scales = sc};
    assert_int_equal(fm_quantize(x, NULL, &t), FM_OK);
    const float huge[] = {FLT_MAX, 3e38f, 1e37f};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        t.global_scale = huge[i];
        fm_poison_f32(p, ROWS * COLS);
        memcpy(y, p, sizeof y);
        assert_int_equal(fm_dequantize(&t, y), FM_ERR_NONFINITE);
        assert_memory_equal(y, p, sizeof y);
        assert_non_null(strstr(fm_last_error(), "overflows FP32"));
        assert_non_null(strstr(fm_last_error(), "fm_dequantize: element ["));
    }
}

/* Exactly the elements that overflow are rejected: a huge global with tiny
 * block scales, or a huge block scale over zero codes, decodes fine. */
static void test_dequantize_exact_elements(void **state)
{
    (void)state;
    uint8_t d[1 * 32 / 2], sc[2];
    float y[32];
    fm_qtensor t = {.fmt = FM_FORMAT_NVFP4, .rows = 1, .cols = 32, .data = d, .scales = sc, .global_scale = FLT_MAX};
    memset(d, 0x77, 8);  /* block 0: every element +6 */
    memset(d + 8, 0, 8); /* block 1: every element 0 */
    sc[0] = 0x01;        /* 2^-9: 6 x 2^-9 x FLT_MAX = 4e36, finite */
    sc[1] = 0x7E;        /* 448, over zeros */
    assert_int_equal(fm_dequantize(&t, y), FM_OK);
    assert_true(all_finite(y, 32));
    assert_true(y[0] == (6.0f * 0x1p-9f) * FLT_MAX && y[16] == 0.0f);
    d[8 + 5] = 0x90; /* column 16 + 11 = 27: code 9 = -0.5; -0.5 x 448 x FLT_MAX = -Inf */
    fm_poison_f32(y, 32);
    float p[32];
    memcpy(p, y, sizeof p);
    assert_int_equal(fm_dequantize(&t, y), FM_ERR_NONFINITE);
    assert_memory_equal(y, p, sizeof p);
    assert_string_equal(fm_last_error(),
                        "fm_dequantize: element [0][27] = (-0.5 x block scale 448) x global scale 3.40282e+38 "
                        "overflows FP32");

    /* MXFP4 (global 1): 2^127 x 1.5 is finite, 2^127 x 2 is not; 2^125 x 6 is finite */
    uint8_t m[16], ms[1];
    float z[32];
    fm_qtensor u = {.fmt = FM_FORMAT_MXFP4, .rows = 1, .cols = 32, .data = m, .scales = ms, .global_scale = 1.0f};
    memset(m, 0x33, sizeof m); /* 1.5 */
    ms[0] = 254;
    assert_int_equal(fm_dequantize(&u, z), FM_OK);
    assert_true(z[31] == 0x1.8p127f);
    m[15] = 0x43; /* column 31: 2.0 x 2^127 */
    assert_int_equal(fm_dequantize(&u, z), FM_ERR_NONFINITE);
    assert_non_null(strstr(fm_last_error(), "element [0][31]"));
    memset(m, 0x77, sizeof m);
    ms[0] = 252;
    assert_int_equal(fm_dequantize(&u, z), FM_OK);
    assert_true(z[0] == 0x1.8p127f);
    ms[0] = 253; /* 6 x 2^126 */
    assert_int_equal(fm_dequantize(&u, z), FM_ERR_NONFINITE);
}

/* fm_quantize never hands back a tensor that decodes to Inf: a caller's
 * global above FLT_MAX / 2688 is refused (the class of defect: with
 * g = 1.28e35 and |x| = 3.31e38 it returned FM_OK), and every accepted one,
 * with data up to FLT_MAX, round-trips to finite values. Same for the
 * derived global and for MXFP4. */
static void test_quantize_extreme_scales(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x5eed);
    float x[ROWS * COLS], y[ROWS * COLS];
    uint8_t d[ROWS * COLS / 2], sc[ROWS * COLS / 16];
    fm_qtensor t = {.fmt = FM_FORMAT_NVFP4, .rows = ROWS, .cols = COLS, .data = d, .scales = sc};

    /* the case found by a sweep: refused now, nothing written */
    for (int i = 0; i < ROWS * COLS; i++) x[i] = 0.0f;
    x[0] = 3.31158e38f;
    const float g_found = 1.27753e35f;
    fm_poison_bytes(d, sizeof d);
    fm_poison_bytes(sc, sizeof sc);
    uint8_t pd[sizeof d], ps[sizeof sc];
    memcpy(pd, d, sizeof d);
    memcpy(ps, sc, sizeof sc);
    t.global_scale = 7.0f;
    assert_int_equal(fm_quantize(x, &g_found, &t), FM_ERR_INVALID_ARG);
    assert_memory_equal(d, pd, sizeof d);
    assert_memory_equal(sc, ps, sizeof sc);
    assert_true(t.global_scale == 7.0f);
    assert_non_null(strstr(fm_last_error(), "6 x 448 x scale"));

    /* accepted globals up to the bound, data up to FLT_MAX: finite round trip */
    const float gmax = FLT_MAX / 2688.0f;
    for (int trial = 0; trial < 200; trial++) {
        float g = trial == 0 ? gmax : gmax * (float)fm_rng_uniform(&r);
        if (!(g >= FLT_MIN)) g = FLT_MIN;
        for (int i = 0; i < ROWS * COLS; i++)
            x[i] = FLT_MAX * (float)(2.0 * fm_rng_uniform(&r) - 1.0) * (trial % 2 ? 1.0f : 0.999f);
        x[trial % (ROWS * COLS)] = trial % 4 < 2 ? FLT_MAX : -FLT_MAX;
        assert_int_equal(fm_quantize(x, &g, &t), FM_OK);
        fm_poison_f32(y, ROWS * COLS);
        assert_int_equal(fm_dequantize(&t, y), FM_OK);
        assert_true(all_finite(y, ROWS * COLS));
    }
    /* derived global and MXFP4 on data at +-FLT_MAX */
    for (int f = FM_FORMAT_NVFP4; f <= FM_FORMAT_MXFP4; f++) {
        fm_qtensor q = {.fmt = (fm_format)f, .rows = ROWS, .cols = COLS, .data = d, .scales = sc};
        for (int i = 0; i < ROWS * COLS; i++) x[i] = (i % 3 ? FLT_MAX : -FLT_MAX) * (float)fm_rng_uniform(&r);
        x[5] = FLT_MAX;
        assert_int_equal(fm_quantize(x, NULL, &q), FM_OK);
        fm_poison_f32(y, ROWS * COLS);
        assert_int_equal(fm_dequantize(&q, y), FM_OK);
        assert_true(all_finite(y, ROWS * COLS));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequantize_huge_global),
        cmocka_unit_test(test_dequantize_exact_elements),
        cmocka_unit_test(test_quantize_extreme_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
