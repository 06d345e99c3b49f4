/* test_format_errors.c - the trait table, size helpers and every failure path
 * of the format API: a specific status, a detail message, and no byte of the
 * caller's buffers changed (checked against poisoned copies); and the
 * library-internal NaN block-scale scan every scale consumer shares.
 */
#include "testutil.h"

#include "format/format_internal.h" /* fm_scales_check_codes */

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_traits(void **state)
{
    (void)state;
    const fm_format_traits *t = fm_format_traits_get(FM_FORMAT_NVFP4);
    assert_string_equal(t->name, "nvfp4");
    assert_int_equal(t->elem_bits, 4);
    assert_int_equal(t->scale_type, FM_SCALE_E4M3);
    assert_int_equal(t->block, 16);
    assert_int_equal(t->has_global, 1);
    t = fm_format_traits_get(FM_FORMAT_MXFP4);
    assert_int_equal(t->scale_type, FM_SCALE_UE8M0);
    assert_int_equal(t->block, 32);
    assert_int_equal(t->has_global, 0);
    t = fm_format_traits_get(FM_FORMAT_BF16);
    assert_int_equal(t->elem_bits, 16);
    assert_int_equal(t->block, 0);
    assert_null(fm_format_traits_get(FM_FORMAT_COUNT));
    assert_null(fm_format_traits_get((fm_format)-1));

    fm_format f = FM_FORMAT_BF16;
    assert_int_equal(fm_format_parse("NVFP4", &f), FM_OK);
    assert_int_equal(f, FM_FORMAT_NVFP4);
    assert_int_equal(fm_format_parse("mxFP4", &f), FM_OK);
    assert_int_equal(f, FM_FORMAT_MXFP4);
    assert_int_equal(fm_format_parse("bf16", &f), FM_OK);
    assert_int_equal(f, FM_FORMAT_BF16);
    f = FM_FORMAT_MXFP4;
    assert_int_equal(fm_format_parse("nvfp", &f), FM_ERR_FORMAT);
    assert_int_equal(fm_format_parse("nvfp44", &f), FM_ERR_FORMAT);
    assert_int_equal(fm_format_parse("", &f), FM_ERR_FORMAT);
    assert_true(strstr(fm_last_error(), "unknown format") != NULL);
    assert_int_equal(f, FM_FORMAT_MXFP4); /* untouched on failure */
    assert_int_equal(fm_format_parse(NULL, &f), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_format_parse("bf16", NULL), FM_ERR_INVALID_ARG);

    /* GLM-5 FC1 row: K = 6144 */
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_NVFP4, 6144), 3072);
    assert_int_equal(fm_format_row_scale_bytes(FM_FORMAT_NVFP4, 6144), 384);
    assert_int_equal(fm_format_row_scale_bytes(FM_FORMAT_MXFP4, 6144), 192);
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_BF16, 6144), 12288);
    assert_int_equal(fm_format_row_scale_bytes(FM_FORMAT_BF16, 6144), 0);
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_NVFP4, 24), 0);  /* not a block multiple */
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_MXFP4, 16), 0);
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_BF16, 3), 6);
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_NVFP4, 0), 0);
    assert_int_equal(fm_format_row_bytes(FM_FORMAT_COUNT, 64), 0);
}

static void test_qtensor_bytes(void **state)
{
    (void)state;
    size_t d = 1, s = 1;
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_NVFP4, 4096, 6144, &d, &s), FM_OK);
    assert_int_equal(d, 4096u * 3072u);
    assert_int_equal(s, 4096u * 384u);
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_MXFP4, 3, 64, &d, &s), FM_OK);
    assert_int_equal(d, 96);
    assert_int_equal(s, 6);
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_BF16, 3, 5, &d, &s), FM_OK);
    assert_int_equal(d, 30);
    assert_int_equal(s, 0);
    d = s = 77;
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_NVFP4, 4, 40, &d, &s), FM_ERR_BAD_SHAPE);
    assert_true(strstr(fm_last_error(), "40") != NULL);
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_MXFP4, 4, 48, &d, &s), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_NVFP4, 0, 16, &d, &s), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_NVFP4, 4, -16, &d, &s), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_NVFP4, INT64_MAX / 2, INT64_MAX / 32 * 16, &d, &s),
                     FM_ERR_BAD_SHAPE); /* overflows size_t */
    assert_int_equal(fm_qtensor_bytes((fm_format)9, 4, 16, &d, &s), FM_ERR_FORMAT);
    assert_int_equal(d, 77); /* outputs untouched */
    assert_int_equal(s, 77);
}

/* Snapshot of a tensor's buffers, compared after a failing call. */
typedef struct {
    uint8_t data[256], scales[32];
    fm_qtensor t;
} snap;

static void snap_init(snap *s, fm_format f, int64_t rows, int64_t cols)
{
    fm_poison_bytes(s->data, sizeof s->data);
    fm_poison_bytes(s->scales, sizeof s->scales);
    s->t = (fm_qtensor){.fmt = f, .rows = rows, .cols = cols, .data = s->data, .scales = s->scales,
                        .global_scale = 123.0f};
}

static void assert_untouched(const snap *s)
{
    snap p;
    snap_init(&p, s->t.fmt, s->t.rows, s->t.cols);
    assert_memory_equal(s->data, p.data, sizeof p.data);
    assert_memory_equal(s->scales, p.scales, sizeof p.scales);
    assert_true(s->t.global_scale == 123.0f);
    assert_true(fm_last_error()[0] != '\0');
}

static void test_quantize_errors(void **state)
{
    (void)state;
    float x[4 * 32];
    for (int i = 0; i < 128; i++) x[i] = (float)(i % 13) - 6.0f;
    snap s;
    /* non-finite anywhere -> FM_ERR_NONFINITE, nothing written */
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int f = 0; f < FM_FORMAT_COUNT; f++) {
        for (int b = 0; b < 3; b++) {
            float y[4 * 32];
            memcpy(y, x, sizeof y);
            y[127 - b * 40] = bad[b]; /* also in the last element */
            snap_init(&s, (fm_format)f, 4, 32);
            assert_int_equal(fm_quantize(y, NULL, &s.t), FM_ERR_NONFINITE);
            assert_untouched(&s);
        }
    }
    /* BF16 overflow of a finite value */
    float big[16] = {3.4e38f};
    snap_init(&s, FM_FORMAT_BF16, 1, 16);
    assert_int_equal(fm_quantize(big, NULL, &s.t), FM_ERR_NONFINITE);
    assert_untouched(&s);
    big[0] = 0x1.ffp127f; /* the tie above the BF16 max rounds (to even) to Inf */
    assert_int_equal(fm_quantize(big, NULL, &s.t), FM_ERR_NONFINITE);
    assert_untouched(&s);
    big[0] = nextafterf(0x1.ffp127f, 0.0f); /* just below: rounds to the BF16 max */
    assert_int_equal(fm_quantize(big, NULL, &s.t), FM_OK);
    assert_int_equal(((uint16_t *)s.t.data)[0], 0x7F7F);
    /* shapes: K not a multiple of the block, zero rows, negative cols */
    const struct { fm_format f; int64_t rows, cols; } shapes[] = {
        {FM_FORMAT_NVFP4, 4, 24}, {FM_FORMAT_NVFP4, 4, 8},  {FM_FORMAT_MXFP4, 4, 16},
        {FM_FORMAT_MXFP4, 4, 48}, {FM_FORMAT_NVFP4, 0, 16}, {FM_FORMAT_BF16, 2, -1},
    };
    for (size_t i = 0; i < (sizeof(shapes) / sizeof(shapes[0])); i++) {
        snap_init(&s, shapes[i].f, shapes[i].rows, shapes[i].cols);
        assert_int_equal(fm_quantize(x, NULL, &s.t), FM_ERR_BAD_SHAPE);
        assert_untouched(&s);
    }
    /* NULL pointers and a bad format */
    assert_int_equal(fm_quantize(x, NULL, NULL), FM_ERR_INVALID_ARG);
    snap_init(&s, FM_FORMAT_NVFP4, 4, 32);
    assert_int_equal(fm_quantize(NULL, NULL, &s.t), FM_ERR_INVALID_ARG);
    assert_untouched(&s);
    s.t.scales = NULL;
    assert_int_equal(fm_quantize(x, NULL, &s.t), FM_ERR_INVALID_ARG);
    snap_init(&s, FM_FORMAT_MXFP4, 4, 32);
    s.t.data = NULL;
    assert_int_equal(fm_quantize(x, NULL, &s.t), FM_ERR_INVALID_ARG);
    snap_init(&s, (fm_format)7, 4, 32);
    assert_int_equal(fm_quantize(x, NULL, &s.t), FM_ERR_FORMAT);
    assert_untouched(&s);
    /* BF16 needs no scales buffer */
    snap_init(&s, FM_FORMAT_BF16, 2, 8);
    s.t.scales = NULL;
    assert_int_equal(fm_quantize(x, NULL, &s.t), FM_OK);
    /* caller's NVFP4 global scale must be finite, normal, positive and have
     * 6 x 448 x g finite (<= FLT_MAX/2688): above FLT_MAX/6, 6*g is Inf, every
     * block scale 0 and the tensor would quantize to zeros with FM_OK (review
     * finding 10: 1e38 did); in between, a block can decode to Inf
     * (test_format_overflow) */
    const float bad_g[] = {0.0f,    -1.0f,          NAN,        INFINITY, 1e-40f, 1e38f, FLT_MAX,
                           1.28e35f, FLT_MAX / 6.0f, nextafterf(FLT_MAX / 2688.0f, INFINITY)};
    for (size_t i = 0; i < (sizeof(bad_g) / sizeof(bad_g[0])); i++) {
        snap_init(&s, FM_FORMAT_NVFP4, 4, 32);
        assert_int_equal(fm_quantize(x, &bad_g[i], &s.t), FM_ERR_INVALID_ARG);
        assert_untouched(&s);
        assert_non_null(strstr(fm_last_error(), "global scale"));
    }
    /* the largest accepted global: finite scales, nothing NaN/Inf */
    const float gmax = FLT_MAX / 2688.0f;
    snap_init(&s, FM_FORMAT_NVFP4, 4, 32);
    assert_int_equal(fm_quantize(x, &gmax, &s.t), FM_OK);
    assert_true(s.t.global_scale == gmax);
}

/* fm_scales_check_codes: exactly the NaN codes of each scale type, the first
 * one's position, the caller's prefix. */
static void test_scale_codes(void **state)
{
    (void)state;
    uint8_t sc[3 * 5];
    for (int t = FM_SCALE_NONE; t <= FM_SCALE_UE8M0; t++) {
        int nan_codes = 0;
        for (int c = 0; c < 256; c++) {
            memset(sc, 0x38, sizeof sc); /* 1.0 in E4M3, 2^-71 in UE8M0: valid either way */
            sc[2 * 5 + 3] = (uint8_t)c;
            fm_clear_error();
            fm_status st = fm_scales_check_codes("w", (fm_scale_type)t, sc, 3, 5);
            /* the codecs are the reference: a code is NaN iff it decodes to NaN */
            int want = t == FM_SCALE_E4M3 ? isnan(fm_e4m3_decode((uint8_t)c))
                     : t == FM_SCALE_UE8M0 ? isnan(fm_ue8m0_decode((uint8_t)c)) : 0;
            assert_int_equal(fm_scale_code_is_nan((fm_scale_type)t, (uint8_t)c), want);
            nan_codes += want;
            if (!want) {
                assert_int_equal(st, FM_OK);
                continue;
            }
            assert_int_equal(st, FM_ERR_NONFINITE);
            char msg[64];
            snprintf(msg, sizeof msg, "w: block scale [2][3] = 0x%02X decodes to NaN", c);
            assert_string_equal(fm_last_error(), msg);
        }
        assert_int_equal(nan_codes, t == FM_SCALE_E4M3 ? 2 : t == FM_SCALE_UE8M0 ? 1 : 0);
    }
    /* the first of two, row-major; no prefix; empty and NONE need no buffer */
    memset(sc, 0, sizeof sc);
    sc[1 * 5 + 4] = 0xFF;
    sc[2 * 5 + 0] = 0xFF;
    assert_int_equal(fm_scales_check_codes(NULL, FM_SCALE_UE8M0, sc, 3, 5), FM_ERR_NONFINITE);
    assert_string_equal(fm_last_error(), "block scale [1][4] = 0xFF decodes to NaN");
    assert_int_equal(fm_scales_check_codes(NULL, FM_SCALE_UE8M0, sc, 1, 5), FM_OK); /* row 0 only */
    assert_int_equal(fm_scales_check_codes("x", FM_SCALE_E4M3, NULL, 0, 5), FM_OK);
    assert_int_equal(fm_scales_check_codes("x", FM_SCALE_NONE, NULL, 3, 5), FM_OK);
}

static void test_dequantize_errors(void **state)
{
    (void)state;
    float x[2 * 32], y[2 * 32], p[2 * 32];
    for (int i = 0; i < 64; i++) x[i] = (float)i * 0.25f - 3.0f;
    fm_poison_f32(p, 64);
    snap s;
    for (int f = FM_FORMAT_NVFP4; f <= FM_FORMAT_MXFP4; f++) {
        snap_init(&s, (fm_format)f, 2, 32);
        assert_int_equal(fm_quantize(x, NULL, &s.t), FM_OK);
        /* a NaN scale in the last block: reject before writing anything */
        uint8_t keep = s.scales[f == FM_FORMAT_NVFP4 ? 3 : 1];
        s.scales[f == FM_FORMAT_NVFP4 ? 3 : 1] = f == FM_FORMAT_NVFP4 ? 0xFF : 0xFF;
        memcpy(y, p, sizeof y);
        assert_int_equal(fm_dequantize(&s.t, y), FM_ERR_NONFINITE);
        assert_memory_equal(y, p, sizeof y);
        if (f == FM_FORMAT_NVFP4) {
            s.scales[3] = 0x7F; /* +NaN too */
            assert_int_equal(fm_dequantize(&s.t, y), FM_ERR_NONFINITE);
            s.scales[3] = keep;
            s.t.global_scale = INFINITY;
            assert_int_equal(fm_dequantize(&s.t, y), FM_ERR_NONFINITE);
            assert_memory_equal(y, p, sizeof y);
        } else {
            s.scales[1] = keep;
        }
        s.t.cols = 24;
        assert_int_equal(fm_dequantize(&s.t, y), FM_ERR_BAD_SHAPE);
        s.t.cols = 32;
        assert_int_equal(fm_dequantize(&s.t, NULL), FM_ERR_INVALID_ARG);
        assert_memory_equal(y, p, sizeof y);
    }
    assert_int_equal(fm_dequantize(NULL, y), FM_ERR_INVALID_ARG);
}

/* A shape whose bytes fit size_t but whose element count rows x cols does not fit
 * int64 (FP4 stores half a byte an element): FM_ERR_BAD_SHAPE from the size helper,
 * fm_quantize and fm_dequantize, nothing written. fm_quantize used to compute
 * rows * cols in int64 first (signed overflow, undefined behaviour: UBSan stopped the
 * run; without it the negative count skipped the input check and the quantizer wrote
 * through the caller's small buffers). */
static void test_element_count_overflow(void **state)
{
    (void)state;
    const struct { fm_format f; int64_t rows, cols; } shapes[] = {
        {FM_FORMAT_NVFP4, ((int64_t)1 << 32) - 1, (int64_t)1 << 32},
        {FM_FORMAT_MXFP4, ((int64_t)1 << 32) - 1, (int64_t)1 << 32},
        {FM_FORMAT_NVFP4, INT64_MAX / 16, 32},
    };
    float x[64] = {0}, y[64], p[64];
    fm_poison_f32(p, 64);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        size_t d = 77, sb = 77;
        assert_int_equal(fm_qtensor_bytes(shapes[i].f, shapes[i].rows, shapes[i].cols, &d, &sb), FM_ERR_BAD_SHAPE);
        assert_non_null(strstr(fm_last_error(), "elements overflow int64"));
        assert_int_equal(d, 77);
        assert_int_equal(sb, 77);
        snap s;
        snap_init(&s, shapes[i].f, shapes[i].rows, shapes[i].cols);
        assert_int_equal(fm_quantize(x, NULL, &s.t), FM_ERR_BAD_SHAPE);
        assert_untouched(&s);
        assert_non_null(strstr(fm_last_error(), "fm_quantize: "));
        assert_non_null(strstr(fm_last_error(), "elements overflow int64"));
        memcpy(y, p, sizeof y);
        assert_int_equal(fm_dequantize(&s.t, y), FM_ERR_BAD_SHAPE);
        assert_memory_equal(y, p, sizeof y);
    }
    /* the largest element count that fits is still a size */
    size_t d = 0;
    assert_int_equal(fm_qtensor_bytes(FM_FORMAT_NVFP4, INT64_MAX / 32, 32, &d, NULL), FM_OK);
    assert_true(d == (size_t)(INT64_MAX / 32) * 16u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_qtensor_bytes),
        cmocka_unit_test(test_quantize_errors),
        cmocka_unit_test(test_dequantize_errors),
        cmocka_unit_test(test_element_count_overflow),
        cmocka_unit_test(test_scale_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
