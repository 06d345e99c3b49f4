/* test_format_codec.c - scalar codecs: exhaustive decode tables checked
 * against values computed from the format definitions, exhaustive
 * decode -> encode round trips, hand-picked rounding ties and the stated
 * overflow / NaN policies.  (The bit-exact comparison against ml_dtypes on
 * random floats and every rounding boundary is tests/py/codec_oracle.py.)
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* E2M1: all 16 codes against the table in the format definition. */
static void test_e2m1_exhaustive(void **state)
{
    (void)state;
    static const float k_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int c = 0; c < 16; c++) {
        float v = fm_e2m1_decode((uint8_t)c);
        float want = (c & 8) ? -k_mag[c & 7] : k_mag[c & 7];
        assert_true(bits(v) == bits(want)); /* also checks the sign of -0 */
        assert_int_equal(fm_e2m1_encode(v), c);
    }
    /* the high nibble is ignored by decode */
    assert_true(fm_e2m1_decode(0xF7) == 6.0f);
}

static void test_e2m1_ties_and_saturation(void **state)
{
    (void)state;
    /* midpoints go to the even code */
    assert_int_equal(fm_e2m1_encode(0.25f), 0x0);
    assert_int_equal(fm_e2m1_encode(0.75f), 0x2);
    assert_int_equal(fm_e2m1_encode(1.25f), 0x2);
    assert_int_equal(fm_e2m1_encode(1.75f), 0x4);
    assert_int_equal(fm_e2m1_encode(2.5f), 0x4);
    assert_int_equal(fm_e2m1_encode(3.5f), 0x6);
    assert_int_equal(fm_e2m1_encode(5.0f), 0x6);
    assert_int_equal(fm_e2m1_encode(-5.0f), 0xE);
    /* just off the midpoints */
    assert_int_equal(fm_e2m1_encode(nextafterf(0.25f, 1.0f)), 0x1);
    assert_int_equal(fm_e2m1_encode(nextafterf(5.0f, 9.0f)), 0x7);
    assert_int_equal(fm_e2m1_encode(nextafterf(0.75f, 0.0f)), 0x1);
    /* saturation */
    assert_int_equal(fm_e2m1_encode(7.0f), 0x7);
    assert_int_equal(fm_e2m1_encode(1e30f), 0x7);
    assert_int_equal(fm_e2m1_encode(-INFINITY), 0xF);
    assert_int_equal(fm_e2m1_encode(INFINITY), 0x7);
    /* NaN policy: +0 */
    assert_int_equal(fm_e2m1_encode(NAN), 0x0);
    assert_int_equal(fm_e2m1_encode(-NAN), 0x0);
    assert_int_equal(fm_e2m1_encode(-0.0f), 0x8);
    assert_int_equal(fm_e2m1_encode(1e-40f), 0x0);
}

/* E4M3: decode of all 256 codes from the definition, round trips. */
static void test_e4m3_exhaustive(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        float v = fm_e4m3_decode((uint8_t)c);
        int e = (c >> 3) & 0xF, m = c & 7;
        if (e == 15 && m == 7) {
            assert_true(isnan(v));
            assert_int_equal(fm_e4m3_encode(v), c); /* NaN keeps its sign */
            continue;
        }
        double want = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
        if (c & 0x80) want = -want;
        assert_true((double)v == want);
        assert_true((signbit(v) != 0) == ((c & 0x80) != 0));
        assert_int_equal(fm_e4m3_encode(v), c);
    }
    assert_true(fm_e4m3_decode(0x7E) == 448.0f);
    assert_true(fm_e4m3_decode(0x01) == 0x1p-9f);
}

static void test_e4m3_rounding_and_saturation(void **state)
{
    (void)state;
    assert_int_equal(fm_e4m3_encode(1.0f + 1.0f / 16), 0x38);  /* tie 1 / 1.125 -> even (1) */
    assert_int_equal(fm_e4m3_encode(1.0f + 3.0f / 16), 0x3A);  /* tie 1.125 / 1.25 -> 1.25 */
    assert_int_equal(fm_e4m3_encode(0x1p-10f), 0x00);          /* half the smallest subnormal -> 0 */
    assert_int_equal(fm_e4m3_encode(0x1.8p-9f), 0x02);         /* tie 1 / 2 subnormal units -> 2 */
    assert_int_equal(fm_e4m3_encode(nextafterf(0x1p-10f, 1)), 0x01);
    /* saturating: everything above 448, including the ml_dtypes-NaN range > 464 */
    assert_int_equal(fm_e4m3_encode(450.0f), 0x7E);
    assert_int_equal(fm_e4m3_encode(464.0f), 0x7E);
    assert_int_equal(fm_e4m3_encode(465.0f), 0x7E);
    assert_int_equal(fm_e4m3_encode(1e30f), 0x7E);
    assert_int_equal(fm_e4m3_encode(-1e30f), 0xFE);
    assert_int_equal(fm_e4m3_encode(INFINITY), 0x7E);
    assert_int_equal(fm_e4m3_encode(-INFINITY), 0xFE);
    assert_int_equal(fm_e4m3_encode(NAN), 0x7F);
    assert_int_equal(fm_e4m3_encode(-NAN), 0xFF);
}

static void test_ue8m0(void **state)
{
    (void)state;
    for (int c = 0; c < 255; c++) {
        float v = fm_ue8m0_decode((uint8_t)c);
        assert_true((double)v == ldexp(1.0, c - 127));
        assert_int_equal(fm_ue8m0_encode(v), c);
    }
    assert_true(isnan(fm_ue8m0_decode(0xFF)));
    /* ties (1.5 * 2^e) round up: the kept significand is the implicit, odd, 1 */
    assert_int_equal(fm_ue8m0_encode(1.5f), 128);
    assert_int_equal(fm_ue8m0_encode(3.0f), 129);
    assert_int_equal(fm_ue8m0_encode(nextafterf(3.0f, 0.0f)), 128);
    assert_int_equal(fm_ue8m0_encode(0.0f), 0xFF);
    assert_int_equal(fm_ue8m0_encode(-1.0f), 0xFF);
    assert_int_equal(fm_ue8m0_encode(NAN), 0xFF);
    assert_int_equal(fm_ue8m0_encode(INFINITY), 0xFF);
    assert_int_equal(fm_ue8m0_encode(0x1.8p127f), 0xFF); /* tie 2^127 / 2^128 rounds up: NaN */
    assert_int_equal(fm_ue8m0_encode(nextafterf(0x1.8p127f, 0.0f)), 0xFE);
    assert_int_equal(fm_ue8m0_encode(0x1p-127f), 0);   /* float32 subnormal, exact */
    assert_int_equal(fm_ue8m0_encode(0x1.8p-127f), 1);
    assert_int_equal(fm_ue8m0_encode(0x1p-149f), 0);
}

/* BF16 / FP16: every code decodes, finite codes round trip, NaN stays NaN. */
static void test_bf16_fp16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t c = 0; c < 65536; c++) {
        float v = fm_bf16_decode((uint16_t)c);
        assert_true(bits(v) == c << 16);
        if (isnan(v))
            assert_true(isnan(fm_bf16_decode(fm_bf16_encode(v))));
        else
            assert_int_equal(fm_bf16_encode(v), c);

        float h = fm_fp16_decode((uint16_t)c);
        if ((c & 0x7C00u) == 0x7C00u && (c & 0x3FFu)) {
            assert_true(isnan(h));
            assert_true(isnan(fm_fp16_decode(fm_fp16_encode(h))));
        } else {
            assert_int_equal(fm_fp16_encode(h), c);
        }
    }
    assert_int_equal(fm_fp16_encode(65504.0f), 0x7BFF);
    assert_int_equal(fm_fp16_encode(65519.99f), 0x7BFF);
    assert_int_equal(fm_fp16_encode(65520.0f), 0x7C00); /* tie to even: the Inf code */
    assert_int_equal(fm_fp16_encode(0x1p-25f), 0x0000);  /* tie 0 / smallest subnormal -> 0 */
    assert_int_equal(fm_fp16_encode(0x1.8p-24f), 0x0002);
    assert_int_equal(fm_bf16_encode(1.0f + 0x1p-8f), 0x3F80);    /* tie -> even */
    assert_int_equal(fm_bf16_encode(1.0f + 0x1.8p-7f), 0x3F82);  /* tie -> even (up) */
    assert_int_equal(fm_bf16_encode(3.4e38f), 0x7F80);           /* overflow -> Inf */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e2m1_exhaustive),      cmocka_unit_test(test_e2m1_ties_and_saturation),
        cmocka_unit_test(test_e4m3_exhaustive),      cmocka_unit_test(test_e4m3_rounding_and_saturation),
        cmocka_unit_test(test_ue8m0),                cmocka_unit_test(test_bf16_fp16_exhaustive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
