/* test_format_sf.c - scale-factor layouts: the CUTLASS 128x4 swizzle checked
 * at hand-computed offsets, round trips on odd shapes (rows not a multiple of
 * 128, sf_cols not a multiple of 4), padding written as zero, bad arguments.
 * The whole layout is also compared with the reshape/transpose formulation
 * used on the host by vLLM/SGLang in tests/py/quant_oracle.py.
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static void test_sizes(void **state)
{
    (void)state;
    assert_int_equal(fm_sf_swizzled_bytes(128, 4), 512);
    assert_int_equal(fm_sf_swizzled_bytes(1, 1), 512);
    assert_int_equal(fm_sf_swizzled_bytes(129, 5), 256 * 8);
    assert_int_equal(fm_sf_swizzled_bytes(4096, 384), 4096 * 384); /* GLM-5 FC1, K = 6144 */
    assert_int_equal(fm_sf_swizzled_bytes(0, 4), 0);
    assert_int_equal(fm_sf_swizzled_bytes(128, 0), 0);
    assert_int_equal(fm_sf_swizzled_bytes(-1, 4), 0);
}

/* Put a single marker at (r, c) and find where it lands. */
static long where(int64_t rows, int64_t sf_cols, int64_t r, int64_t c)
{
    size_t n = fm_sf_swizzled_bytes(rows, sf_cols);
    uint8_t *rm = calloc((size_t)(rows * sf_cols), 1), *sw = malloc(n);
    assert_non_null(rm);
    assert_non_null(sw);
    rm[r * sf_cols + c] = 0xAB;
    assert_int_equal(fm_sf_swizzle(rm, rows, sf_cols, sw), FM_OK);
    long at = -1;
    for (size_t i = 0; i < n; i++) {
        if (sw[i] == 0xAB) {
            assert_int_equal(at, -1); /* exactly once */
            at = (long)i;
        } else {
            assert_int_equal(sw[i], 0);
        }
    }
    free(rm);
    free(sw);
    return at;
}

/* Offsets from the atom definition: (r%32)*16 + ((r%128)/32)*4 + c%4, atoms
 * along K contiguous within a 128-row band of ceil4(sf_cols)/4 atoms. */
static void test_hand_offsets(void **state)
{
    (void)state;
    assert_int_equal(where(128, 4, 0, 0), 0);
    assert_int_equal(where(128, 4, 0, 1), 1);
    assert_int_equal(where(128, 4, 1, 0), 16);
    assert_int_equal(where(128, 4, 32, 0), 4);
    assert_int_equal(where(128, 4, 33, 2), 16 + 4 + 2);
    assert_int_equal(where(128, 4, 127, 3), 31 * 16 + 3 * 4 + 3); /* 511: last byte of the atom */
    assert_int_equal(where(128, 8, 0, 4), 512);                    /* next atom along K */
    assert_int_equal(where(256, 5, 128, 0), 1024);                 /* band 1 after 2 atoms (kp = 8) */
    assert_int_equal(where(200, 6, 130, 5), 1024 + 512 + 2 * 16 + 1);
    assert_int_equal(where(200, 6, 199, 5), 1024 + 512 + 7 * 16 + 2 * 4 + 1); /* r%128 = 71 */
}

static void roundtrip(fm_rng *rng, int64_t rows, int64_t sf_cols)
{
    size_t n = fm_sf_swizzled_bytes(rows, sf_cols), m = (size_t)(rows * sf_cols);
    uint8_t *rm = malloc(m), *back = malloc(m), *sw = malloc(n);
    assert_non_null(rm);
    assert_non_null(back);
    assert_non_null(sw);
    for (size_t i = 0; i < m; i++) rm[i] = (uint8_t)(1 + fm_rng_u64(rng) % 255); /* never 0 */
    fm_poison_bytes(sw, n);
    assert_int_equal(fm_sf_swizzle(rm, rows, sf_cols, sw), FM_OK);
    /* every real scale is non-zero, so the zeros are exactly the padding */
    size_t zeros = 0;
    for (size_t i = 0; i < n; i++) zeros += sw[i] == 0;
    assert_int_equal(zeros, n - m);
    fm_poison_bytes(back, m);
    assert_int_equal(fm_sf_unswizzle(sw, rows, sf_cols, back), FM_OK);
    assert_memory_equal(rm, back, m);
    free(rm);
    free(back);
    free(sw);
}

static void test_roundtrips(void **state)
{
    (void)state;
    fm_rng rng;
    fm_rng_init(&rng, fm_test_seed());
    const int64_t shapes[][2] = {{1, 1},   {1, 3},    {127, 4}, {128, 4},  {129, 5},
                                 {255, 7}, {256, 12}, {300, 9}, {512, 384 / 16}, {33, 96}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) roundtrip(&rng, shapes[i][0], shapes[i][1]);
    for (int i = 0; i < 20; i++) /* random odd shapes */
        roundtrip(&rng, 1 + (int64_t)(fm_rng_u64(&rng) % 400), 1 + (int64_t)(fm_rng_u64(&rng) % 40));
}

static void test_bad_args(void **state)
{
    (void)state;
    uint8_t a[512], b[512], p[512];
    memset(a, 1, sizeof a);
    fm_poison_bytes(p, sizeof p);
    memcpy(b, p, sizeof b);
    assert_int_equal(fm_sf_swizzle(NULL, 4, 4, b), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sf_swizzle(a, 4, 4, NULL), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sf_swizzle(a, 0, 4, b), FM_ERR_BAD_SHAPE);
    assert_true(fm_last_error()[0] != '\0');
    assert_int_equal(fm_sf_swizzle(a, 4, -1, b), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_sf_unswizzle(a, -4, 4, b), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_sf_unswizzle(NULL, 4, 4, b), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_sf_unswizzle(a, (int64_t)1 << 40, 4, b), FM_ERR_BAD_SHAPE);
    assert_memory_equal(b, p, sizeof b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_hand_offsets),
        cmocka_unit_test(test_roundtrips),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
