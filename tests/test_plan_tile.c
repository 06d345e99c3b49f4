/* test_plan_tile.c - fm_tile's name, parser and equality (fp4moe/plan.h).
 * Every compiled tile of both families (fm_tiles.def) round-trips through its name;
 * malformed names are refused with FM_ERR_NOT_FOUND and the output untouched;
 * equality compares the six fields and, where both tiles say one, the family. */
#include <string.h>

#include "fp4moe/plan.h"
#include "kernels/fm_kernels_smem.h"
#include "testutil.h"

static void test_round_trip(void **state)
{
    (void)state;
    for (int f = 0; f < 2; f++) {
        size_t         n = 0;
        const fm_tile *t = f ? fm_wgmma_tiles(&n) : fm_mma_tiles(&n);
        assert_true(n > 10);
        for (size_t i = 0; i < n; i++) {
            char name[64], old[64];
            fm_tile_name(&t[i], name, sizeof name);
            /* the family's own spelling is the same name */
            (f ? fm_wgmma_tile_name : fm_mma_tile_name)(&t[i], old, sizeof old);
            assert_string_equal(name, old);
            assert_true(!strncmp(name, f ? "wgmma_w" : "mma_w", f ? 7 : 5));
            fm_tile back;
            memset(&back, 0xA5, sizeof back);
            assert_int_equal(fm_tile_parse(name, &back), FM_OK);
            assert_memory_equal(&back, &t[i], sizeof back);
            assert_true(fm_tile_equal(&back, &t[i]));
            for (size_t j = 0; j < n; j++) assert_int_equal(fm_tile_equal(&t[i], &t[j]), i == j);
        }
    }
}

static void test_equal(void **state)
{
    (void)state;
    fm_tile a = {4, 1, 1, 256, 4, 0, FM_FAMILY_FP4MOE_MMA}, b = a, any = a;
    any.family = FM_FAMILY_AUTO;
    assert_true(fm_tile_equal(&a, &b) && fm_tile_equal(&a, &any) && fm_tile_equal(&any, &a));
    b.family = FM_FAMILY_FP4MOE_WGMMA;
    assert_false(fm_tile_equal(&a, &b));
    b = a, b.stages = 3;
    assert_false(fm_tile_equal(&a, &b));
    b = a, b.persist = 1;
    assert_false(fm_tile_equal(&a, &b));
    assert_false(fm_tile_equal(NULL, &a));
    char buf[64];
    assert_string_equal(fm_tile_name(&any, buf, sizeof buf), "w4m1n1k256s4");
    assert_string_equal(fm_tile_name(NULL, buf, sizeof buf), "(null)");
}

static void test_parse_errors(void **state)
{
    (void)state;
    const char *bad[] = {"",
                         "w4m1n1k256s4", /* no family */
                         "mmx_w4m1n1k256s4",
                         "swapab_w04m1n1k256s4", /* the former name: canonical spelling too */
                         "swapab_w4m1n1k256s4p",
                         "mma_w4m1n1k256",
                         "mma_w4m1n1k256s4p", /* persistent is wgmma's */
                         "mma_w4m1n1k256s4 ",
                         "mma_w04m1n1k256s4",
                         "mma_w+4m1n1k256s4",
                         "mma_w4m1n1k256s4x",
                         "wgmma_w8m1n32k64s4pp",
                         "wgmma_w0m1n32k64s4",
                         "wgmma_w-8m1n32k64s4",
                         "mma_w4294967300m1n1k256s4", /* past int's range: no undefined conversion */
                         "mma_w4m1n1k99999999999999999999s4",
                         "mma_w4m1n1k256s",
                         "mma_w4m1n1ks4",
                         "mma_w 4m1n1k256s4",
                         "mma_"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fm_tile out;
        memset(&out, 0x5A, sizeof out);
        fm_tile keep = out;
        assert_int_equal(fm_tile_parse(bad[i], &out), FM_ERR_NOT_FOUND);
        assert_non_null(strstr(fm_last_error(), "tile name"));
        assert_memory_equal(&out, &keep, sizeof out);
    }
    fm_tile out, now;
    /* the mma family's former name (plan files written before the rename) reads as the same tile */
    assert_int_equal(fm_tile_parse("swapab_w4m2n1k256s3", &out), FM_OK);
    assert_int_equal(fm_tile_parse("mma_w4m2n1k256s3", &now), FM_OK);
    assert_int_equal(out.family, FM_FAMILY_FP4MOE_MMA);
    assert_true(fm_tile_equal(&out, &now));
    fm_kernel_family f = FM_FAMILY_AUTO;
    assert_int_equal(fm_family_parse("fp4moe-swapab", &f), FM_OK);
    assert_int_equal(f, FM_FAMILY_FP4MOE_MMA);
    assert_int_equal(fm_tile_parse(NULL, &out), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_tile_parse("mma_w4m1n1k256s4", NULL), FM_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_equal),
        cmocka_unit_test(test_parse_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
