/* test_plan_field.c - the SM120 field case, exact numbers (measured from CUTLASS 4.2
 * by tests/conformance), the verdicts both ways, and bad input -> specific statuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fp4moe/tools.h"

static fm_kernel_config sm120(int m, int n, int k, fm_epilogue e, int stages, int swap)
{
    fm_kernel_config c;
    fm_kernel_config_init(&c);
    c.cc = 120, c.a = c.b = FM_ELEM_NVFP4, c.tile_m = m, c.tile_n = n, c.tile_k = k;
    c.epilogue = e, c.stages = stages, c.swap_ab = swap;
    if (e == FM_EPI_FINALIZE) c.d = FM_ELEM_VOID;
    return c;
}

static void field_case_rejected(void **s)
{
    (void)s;
    const int tiles[2][3] = {{128, 256, 128}, {256, 128, 128}};
    for (int i = 0; i < 2; i++) {
        fm_kernel_config c = sm120(tiles[i][0], tiles[i][1], tiles[i][2], FM_EPI_FINALIZE, 0, 0);
        fm_plan_result r;
        memset(&r, 0xA5, sizeof r); /* poisoned */
        assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
        assert_int_equal(r.bytes.total, 102400); /* sizeof(SharedStorage) printed by the CUTLASS 4.2 probe */
        assert_int_equal(r.bytes.stages, 3);
        assert_int_equal(r.bytes.mainloop, 83968);
        assert_int_equal(r.bytes.epilogue, 17408);
        assert_int_equal(r.limit_bytes, 101376);
        assert_false(r.fits);
        assert_true(r.builder_fits); /* the builder's own arithmetic says it fits */
        assert_true(r.builder_bytes <= 101376);
        assert_int_equal(r.bytes.total - r.limit_bytes, 1024); /* about 1 KB over */
        assert_int_equal(r.best_stages, 2);
        assert_int_equal(r.best_bytes, 74752);
        assert_non_null(strstr(r.reason, "3 auto stages > 101376 B opt-in"));
        assert_non_null(strstr(r.reason, "fits with 2 stages: 74752 B"));
    }
}

static void field_case_fixes_accepted(void **s)
{
    (void)s;
    fm_plan_result r;
    fm_kernel_config c = sm120(128, 256, 128, FM_EPI_FINALIZE, 2, 0); /* explicit 2 stages */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
    assert_true(r.fits);
    assert_int_equal(r.bytes.total, 74752);
    c = sm120(256, 128, 128, FM_EPI_FINALIZE, 0, 1); /* swap-AB: bigger epilogue -> the builder picks 2 */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
    assert_true(r.fits);
    assert_int_equal(r.bytes.stages, 2);
    assert_int_equal(r.bytes.epilogue, 18432);
    assert_int_equal(r.bytes.total, 74752);
    const int ok[2][3] = {{128, 128, 128}, {128, 128, 256}};
    for (int i = 0; i < 2; i++) {
        c = sm120(ok[i][0], ok[i][1], ok[i][2], FM_EPI_FINALIZE, 0, 0);
        assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
        assert_true(r.fits);
        assert_int_equal(r.bytes.total, 93184);
    }
}

static void sm90_exact(void **s)
{
    (void)s;
    fm_kernel_config c;
    fm_kernel_config_init(&c);
    c.cc = 90, c.a = c.b = FM_ELEM_BF16, c.tile_m = 64, c.tile_n = 128, c.tile_k = 64, c.schedule = FM_SCHED_PINGPONG;
    fm_smem_breakdown b;
    assert_int_equal(fm_smem_model(&c, &b), FM_OK);
    assert_int_equal(b.total, 215040);
    assert_int_equal(b.stages, 8);
}

static void bad_input(void **s)
{
    (void)s;
    const fm_arch_info *a = NULL;
    const fm_gpu_info *g = NULL;
    assert_int_equal(fm_arch_find("sm_77", &a), FM_ERR_NOT_FOUND);
    assert_null(a);
    assert_int_equal(fm_gpu_find("gtx-480", &g), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "rtx-pro-6000"));
    int m = 7, n = 7, k = 7;
    assert_int_equal(fm_tile_shape_parse("128x256", &m, &n, &k), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_tile_shape_parse("128x256x128x1", &m, &n, &k), FM_ERR_BAD_SHAPE);
    assert_int_equal(m, 7); /* untouched on failure */
    fm_plan_result r;
    memset(&r, 0x5A, sizeof r);
    fm_plan_result before = r;
    fm_kernel_config c = sm120(128, 128, 128, FM_EPI_TMA, 0, 0);
    assert_int_equal(fm_plan_check(&c, 8, 4096, 6144 + 64, 32, 188, &r), FM_ERR_BAD_SHAPE); /* K % tile K */
    assert_memory_equal(&r, &before, sizeof r);
    c.tile_m = 96;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = sm120(128, 128, 128, FM_EPI_TMA, 0, 0);
    c.cc = 90; /* NVFP4 on sm_90 */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c.cc = 77;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_NOT_FOUND);
    c = sm120(128, 128, 128, FM_EPI_TMA, 0, 0);
    c.cluster_m = 2;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c.cluster_m = 1, c.stages = 1;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c.stages = 0, c.cc = 100, c.epilogue = FM_EPI_FINALIZE, c.d = FM_ELEM_VOID, c.tile_n = 16; /* SM100 N < 64 */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    assert_memory_equal(&r, &before, sizeof r);
}

static void candidates_ranked(void **s)
{
    (void)s;
    const fm_gpu_info *g = NULL;
    assert_int_equal(fm_gpu_find("rtx-pro-6000", &g), FM_OK);
    fm_plan_candidate c[32];
    size_t n = 0, total = 0;
    assert_int_equal(fm_plan_candidates(g, FM_ELEM_NVFP4, FM_EPI_FINALIZE, 0, 8, 6144, 2048, 32, c, 32, &n, &total),
                     FM_OK);
    assert_true(n >= 8);
    int seen_reject = 0;
    for (size_t i = 0; i < n; i++) {
        if (!c[i].res.fits) seen_reject = 1;
        else assert_false(seen_reject); /* fitting ones first */
        assert_true(c[i].res.fits == (c[i].res.bytes.total <= 101376));
        assert_true(c[i].est_us > 0);
    }
    assert_true(seen_reject);
    assert_int_equal(fm_plan_candidates(g, FM_ELEM_NVFP4, FM_EPI_TMA, 0, 0, 6144, 2048, 32, c, 32, &n, NULL),
                     FM_ERR_BAD_SHAPE);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(field_case_rejected), cmocka_unit_test(field_case_fixes_accepted),
        cmocka_unit_test(sm90_exact),          cmocka_unit_test(bad_input),
        cmocka_unit_test(candidates_ranked),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
}
