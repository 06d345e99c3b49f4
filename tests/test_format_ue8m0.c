/* test_format_ue8m0.c - fm_ue8m0_encode against the rule of docs/formats.md,
 * for every float32 bit pattern (2^32 of them) in an optimised build.
 *
 * The rule, as this test formulates it (independently of the encoder's
 * integer trick: here it is distances between real numbers, in double, where
 * every value involved is exact):
 *   - NaN, +-Inf, +-0 and every negative number give 0xFF (the NaN code);
 *   - a positive finite x gives the code c in [0, 254] whose value 2^(c-127)
 *     is nearest to x; when x lies exactly halfway between two neighbouring
 *     values the larger one wins (ties up);
 *   - if the nearest power of two (ties up) is 2^128, which the format does
 *     not have, the result is 0xFF: x >= 1.5 * 2^127;
 *   - below the smallest value, every x in (0, 2^-127) gives code 0.
 *
 * Why exhaustive: the bug this replaces (float32 subnormals in (2^-127,
 * 1.5 * 2^-127) encoded to 2^-126) hid in one binade that no random sample of
 * bit patterns was likely to hit densely; 2^32 calls take a few seconds.
 * Under a sanitizer or without optimisation (10-50x slower) the test walks
 * every exponent with every mantissa near the rounding points (0, the
 * midpoint 0x400000, and for the subnormal binade 0x200000 / 0x600000) plus a
 * dense stride elsewhere, so the ASan run stays short.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || !defined(__OPTIMIZE__)
#define FM_UE8_EXHAUSTIVE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FM_UE8_EXHAUSTIVE 0
#endif
#endif
#ifndef FM_UE8_EXHAUSTIVE
#define FM_UE8_EXHAUSTIVE 1
#endif

/* The rule for the positive floats of one float32 exponent field `ef`: they
 * lie in [lo, hi) = [2^(ef-127), 2^(ef-126)) for ef >= 1, and in (0, 2^-126)
 * for ef = 0, where the candidates are 2^-127 and 2^-126 and everything below
 * 2^-127 has nothing smaller to round to. */
typedef struct {
    double   lo, hi; /* neighbouring representable values around the binade */
    unsigned c_lo;   /* code of lo; c_lo + 1 is the code of hi (255: none, NaN code) */
} binade;

static binade binade_of(int ef)
{
    int k = ef >= 1 ? ef - 127 : -127;
    return (binade){ldexp(1.0, k), ldexp(1.0, k + 1), (unsigned)(k + 127)};
}

static unsigned rule_positive(double x, const binade *b)
{
    if (x < b->lo) return 0; /* only in the subnormal binade: (0, 2^-127) */
    unsigned c = b->c_lo + (b->hi - x <= x - b->lo); /* nearer to hi, or a tie: up */
    return c >= 255 ? 0xFFu : c;
}

static void check_range(int ef, uint32_t m_lo, uint32_t m_hi, uint32_t step, long *n, long *bad)
{
    const binade b = binade_of(ef);
    long nbad = 0, cnt = 0;
    for (uint32_t m = m_lo; m <= m_hi && m < 0x800000u; m += step) {
        uint32_t u = ((uint32_t)ef << 23) | m;
        float x, nx;
        uint32_t nu = u | 0x80000000u;
        memcpy(&x, &u, sizeof x);
        memcpy(&nx, &nu, sizeof nx);
        unsigned want = (ef == 255 || u == 0) ? 0xFFu : rule_positive((double)x, &b); /* Inf, NaN, +0: NaN code */
        unsigned got = fm_ue8m0_encode(x);
        unsigned got_neg = fm_ue8m0_encode(nx); /* every negative (-0, -Inf, -NaN too): 0xFF */
        cnt += 2;
        if (got != want || got_neg != 0xFFu) {
            if (nbad < 4)
#pragma omp critical(fm_ue8_print)
                printf("  0x%08X (%a): got 0x%02X want 0x%02X; negative: got 0x%02X want 0xFF\n", u, (double)x, got,
                       want, got_neg);
            nbad++;
        }
    }
    *n += cnt;
    *bad += nbad;
}

static void test_ue8m0_rule_all_patterns(void **state)
{
    (void)state;
    long n = 0, bad = 0;
    /* exponent fields are independent: spread them over the cores */
#pragma omp parallel for schedule(dynamic) reduction(+ : n, bad)
    for (int ef = 0; ef < 256; ef++) {
        if (FM_UE8_EXHAUSTIVE) {
            check_range(ef, 0, 0x7FFFFFu, 1, &n, &bad);
            continue;
        }
        static const uint32_t k_points[] = {0, 0x200000u, 0x400000u, 0x600000u, 0x7FFFFFu};
        for (size_t i = 0; i < sizeof k_points / sizeof k_points[0]; i++) {
            uint32_t p = k_points[i];
            check_range(ef, p > 512 ? p - 512 : 0, p + 512, 1, &n, &bad);
        }
        check_range(ef, 0, 0x7FFFFFu, 4099, &n, &bad); /* a prime stride: every bit position varies */
    }
    printf("# ue8m0: %ld float32 patterns checked against the rule (%s), %ld differ\n", n,
           FM_UE8_EXHAUSTIVE ? "all 2^32" : "sampled: sanitizer or unoptimised build", bad);
    if (FM_UE8_EXHAUSTIVE) assert_true(n == 4294967296L);
    assert_int_equal(bad, 0);
}

/* The values where the old encoder and ml_dtypes < 0.7 went wrong, by name. */
static void test_ue8m0_subnormal_inputs(void **state)
{
    (void)state;
    const uint32_t just_above = 0x00400001u, below_mid = 0x005FFFFFu, mid = 0x00600000u;
    float x;
    memcpy(&x, &just_above, 4);
    assert_int_equal(fm_ue8m0_encode(x), 0x00); /* nearer 2^-127 than 2^-126 */
    memcpy(&x, &below_mid, 4);
    assert_int_equal(fm_ue8m0_encode(x), 0x00);
    memcpy(&x, &mid, 4);
    assert_int_equal(fm_ue8m0_encode(x), 0x01); /* 1.5 * 2^-127: the tie goes up */
    assert_int_equal(fm_ue8m0_encode(0x1p-149f), 0x00);
    assert_int_equal(fm_ue8m0_encode(0x1.fffffcp-127f), 0x01);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ue8m0_subnormal_inputs),
        cmocka_unit_test(test_ue8m0_rule_all_patterns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
