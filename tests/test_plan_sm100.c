/* test_plan_sm100.c - the CUTLASS SM100 block-scaled (UMMA) model: exact bytes printed
 * by the CUTLASS 4.2 probes (tests/conformance, rows s100_*), the breakdown adding up,
 * the builder's automatic stage count being the largest that its own arithmetic allows,
 * and bad input getting specific statuses.  The conformance test re-derives these
 * numbers from compiled headers; this one keeps them checked where nvcc is absent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fp4moe/tools.h"

static fm_kernel_config sm100(fm_elem f, int m, int n, int k, int two, fm_epilogue e, int stages)
{
    fm_kernel_config c;
    fm_kernel_config_init(&c);
    c.cc = 100, c.a = c.b = f, c.tile_m = m, c.tile_n = n, c.tile_k = k;
    c.schedule = two ? FM_SCHED_2SM : FM_SCHED_1SM, c.cluster_m = two ? 2 : 1;
    c.epilogue = e, c.stages = stages;
    return c;
}

/* sizeof(SharedStorage), mainloop, epilogue, stages from the CUTLASS 4.2 probes. */
static void exact_bytes(void **s)
{
    (void)s;
    const struct {
        fm_elem     f;
        int         m, n, k, two;
        fm_epilogue e;
        fm_elem     c;
        int         stages;
        size_t      total, mainloop, epilogue;
        int         got_stages;
    } rows[] = {
        /* fmt          M    N    K  2sm  epilogue      C            stages total   mainloop epilogue S */
        {FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, FM_ELEM_BF16, 0, 219136, 184960, 33792, 5},
        {FM_ELEM_NVFP4, 128, 256, 256, 0, FM_EPI_TMA, FM_ELEM_BF16, 0, 211968, 111232, 100352, 2},
        {FM_ELEM_NVFP4, 256, 128, 256, 1, FM_EPI_TMA, FM_ELEM_BF16, 0, 206848, 172672, 33792, 6},
        {FM_ELEM_NVFP4, 256, 256, 256, 1, FM_EPI_TMA, FM_ELEM_BF16, 0, 218112, 117376, 100352, 3},
        {FM_ELEM_MXFP4, 128, 64, 256, 0, FM_EPI_TMA, FM_ELEM_BF16, 0, 212992, 187008, 25600, 7},
        {FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_NOSMEM, FM_ELEM_BF16, 0, 222464, 221824, 32, 6},
        {FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, FM_ELEM_VOID, 0, 202752, 184960, 17408, 5},
        {FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, FM_ELEM_BF16, 3, 145408, 111232, 33792, 3},
        {FM_ELEM_NVFP4, 256, 128, 128, 1, FM_EPI_TMA, FM_ELEM_BF16, 0, 221184, 187136, 33792, 13},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fm_kernel_config c = sm100(rows[i].f, rows[i].m, rows[i].n, rows[i].k, rows[i].two, rows[i].e, rows[i].stages);
        c.c = rows[i].c;
        fm_plan_result r;
        memset(&r, 0xA5, sizeof r);
        assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
        assert_int_equal(r.bytes.total, rows[i].total);
        assert_int_equal(r.bytes.mainloop, rows[i].mainloop);
        assert_int_equal(r.bytes.epilogue, rows[i].epilogue);
        assert_int_equal(r.bytes.stages, rows[i].got_stages);
        assert_int_equal(r.limit_bytes, 232448);
        assert_true(r.fits); /* the SM100 kernel static_asserts it fits: every compiled row does */
        /* the breakdown adds up to the total, padding included */
        const fm_smem_breakdown *b = &r.bytes;
        assert_int_equal(b->a + b->b + b->sf + b->barriers + b->epi_c + b->epi_d + b->epi_other + b->tensormaps +
                             b->scheduler + b->padding,
                         b->total);
        /* A per SM: (M / SMs) x K / 2 bytes a stage */
        assert_int_equal(b->a, (size_t)b->stages * (rows[i].m / (rows[i].two ? 2 : 1)) * rows[i].k / 2);
        if (!rows[i].stages) {
            /* auto: the builder's count; one more stage would not fit its own arithmetic, and
             * what it believes is within the capacity */
            assert_int_equal(r.auto_stages, rows[i].got_stages);
            assert_true(r.builder_fits);
            assert_true(r.builder_bytes <= 232448);
            assert_true(r.best_stages >= r.auto_stages); /* the real struct is no bigger than the builder thinks */
        }
    }
}

static void waves_two_sm(void **s)
{
    (void)s;
    fm_kernel_config one = sm100(FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, 0);
    fm_kernel_config two = sm100(FM_ELEM_NVFP4, 256, 128, 256, 1, FM_EPI_TMA, 0);
    fm_plan_result r1, r2;
    assert_int_equal(fm_plan_check(&one, 256, 4096, 6144, 32, 148, &r1), FM_OK);
    assert_int_equal(fm_plan_check(&two, 256, 4096, 6144, 32, 148, &r2), FM_OK);
    assert_int_equal(r1.tiles, 2 * r2.tiles);
    assert_true(r1.waves == r2.waves); /* a 2-SM tile takes two SMs */
}

static void bad_input(void **s)
{
    (void)s;
    fm_plan_result r, before;
    memset(&r, 0x77, sizeof r);
    before = r;
    fm_kernel_config c = sm100(FM_ELEM_NVFP4, 256, 128, 256, 0, FM_EPI_TMA, 0); /* 256 rows on one SM */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = sm100(FM_ELEM_NVFP4, 256, 128, 256, 1, FM_EPI_TMA, 0);
    c.cluster_m = 1; /* a 2-SM pair needs an even cluster */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = sm100(FM_ELEM_NVFP4, 128, 128, 64, 0, FM_EPI_TMA, 0);
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = sm100(FM_ELEM_NVFP4, 128, 32, 256, 0, FM_EPI_TMA, 0);
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = sm100(FM_ELEM_BF16, 128, 128, 256, 0, FM_EPI_TMA, 0);
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c = sm100(FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, 0);
    c.b = FM_ELEM_MXFP4; /* mixed scale kinds */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c = sm100(FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, 0);
    c.schedule = FM_SCHED_COOP;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c = sm100(FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_TMA, 0);
    c.cc = 120, c.family = FM_FAMILY_CUTLASS_SM100;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c = sm100(FM_ELEM_NVFP4, 128, 128, 256, 0, FM_EPI_FINALIZE, 0);
    c.d = FM_ELEM_VOID; /* TensorRT-LLM's FINALIZE builds on SM100: modelled (truth-4.2.0.csv: 198,656 B, 4 stages) */
    fm_plan_result fin;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &fin), FM_OK);
    assert_int_equal(fin.bytes.total, 198656);
    assert_int_equal(fin.bytes.stages, 4);
    c.tile_n = 32; /* N < 64: CUTLASS's static_assert */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    assert_memory_equal(&r, &before, sizeof r);
    /* the automatic schedule follows the tile: 256 rows -> 2sm */
    c = sm100(FM_ELEM_MXFP4, 256, 256, 256, 1, FM_EPI_TMA, 0);
    c.schedule = FM_SCHED_AUTO;
    fm_smem_breakdown b;
    assert_int_equal(fm_smem_model(&c, &b), FM_OK);
    assert_int_equal(b.total, 208896); /* probe: 2-SM MXFP4 256x256x256 */
}

/* An explicit epilogue tile (SGLang's and vLLM's Shape<_128,_64>) against the automatic one (128x32),
 * 128x128x128 1-SM NVFP4 grouped: measured (tests/conformance/truth-epitile-*.csv and truth-*.csv) */
static void explicit_epilogue_tile(void **s)
{
    (void)s;
    const struct {
        int    cutlass, em, en;
        size_t total, epilogue;
        int    stages;
    } rows[] = {
        {420, 128, 64, 218112, 51200, 9},  {442, 128, 64, 221184, 51200, 9},
        {420, 0, 0, 219136, 33792, 10},    {443, 0, 0, 222720, 33792, 10},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fm_kernel_config c = sm100(FM_ELEM_NVFP4, 128, 128, 128, 0, FM_EPI_TMA, 0);
        c.cutlass = rows[i].cutlass, c.epi_tile_m = rows[i].em, c.epi_tile_n = rows[i].en;
        fm_smem_breakdown b;
        assert_int_equal(fm_smem_model(&c, &b), FM_OK);
        assert_int_equal(b.total, rows[i].total);
        assert_int_equal(b.epilogue, rows[i].epilogue);
        assert_int_equal(b.stages, rows[i].stages);
    }
    /* what the builder static_asserts, and what is not an epilogue tile */
    fm_kernel_config c = sm100(FM_ELEM_NVFP4, 128, 128, 128, 0, FM_EPI_TMA, 0);
    fm_smem_breakdown b;
    c.epi_tile_m = 128, c.epi_tile_n = 4; /* N % 8 */
    assert_int_equal(fm_smem_model(&c, &b), FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), "Unsupported tile shape"));
    c.epi_tile_m = 128, c.epi_tile_n = 0; /* half given */
    assert_int_equal(fm_smem_model(&c, &b), FM_ERR_BAD_SHAPE);
    c.epi_tile_m = 128, c.epi_tile_n = 64, c.epilogue = FM_EPI_NOSMEM; /* not measured: refused, not guessed */
    assert_int_equal(fm_smem_model(&c, &b), FM_ERR_UNSUPPORTED);
    c.epilogue = FM_EPI_TMA, c.family = FM_FAMILY_FP4MOE_MMA, c.cc = 90, c.tile_m = 8, c.tile_n = 64;
    assert_int_equal(fm_smem_model(&c, &b), FM_ERR_UNSUPPORTED); /* fp4moe's kernels have no epilogue tile */
    int m = -1, n = -1;
    assert_int_equal(fm_epi_tile_parse("128x64", &m, &n), FM_OK);
    assert_true(m == 128 && n == 64);
    assert_int_equal(fm_epi_tile_parse("auto", &m, &n), FM_OK);
    assert_true(m == 0 && n == 0);
    static const char *const bad[] = {"128x", "x64", "128x64x1", "0x64", "257x64", "128x-64", "12a8x64", "", "1280x6"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(fm_epi_tile_parse(bad[i], &m, &n), FM_ERR_BAD_SHAPE);
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(exact_bytes),
        cmocka_unit_test(waves_two_sm),
        cmocka_unit_test(bad_input),
        cmocka_unit_test(explicit_epilogue_tile),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
}
