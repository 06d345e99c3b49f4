/* test_plan_fp4moe.c - fp4moe's own swap-AB kernels as a planner family.
 *
 * What must hold: for every compiled tile the planner's bytes are the launcher's bytes
 * (fm_plan_check and fm_smem_mma_check, the function src/cuda/gemm_launch.c calls
 * before every launch, agree on the total and on accept/reject at the SM120 limit of
 * 101,376 B and the sm_90 limit of 232,448 B); a rejected tile's fix is a compiled tile
 * that fits; uncompiled tiles are refused (the launcher could not run them); and the
 * candidates of all families rank a swap-AB tile first at decode batch sizes, a CUTLASS
 * tile at prefill, and fm_plan_candidates (CUTLASS only) never lists a swap-AB tile.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fp4moe/tools.h"
#include "kernels/fm_kernels_smem.h"

static fm_kernel_config mma_cfg(int cc, const fm_tile *t, int stages)
{
    fm_kernel_config c;
    fm_kernel_config_init(&c);
    c.cc = cc, c.family = FM_FAMILY_FP4MOE_MMA, c.a = c.b = FM_ELEM_NVFP4;
    c.tile_m = 8 * t->nt, c.tile_n = t->warps * t->mt * 16, c.tile_k = t->kc, c.warps = t->warps;
    c.stages = stages;
    return c;
}

/* Planner == launcher for every compiled tile, on both limits; the SM120 split is the
 * one the launcher's own check gives, and both sides of it are populated. */
static void same_bytes_as_launcher(void **s)
{
    (void)s;
    size_t n = 0;
    const fm_tile *t = fm_mma_tiles(&n);
    assert_true(n >= 2);
    const struct {
        int    cc;
        size_t limit;
    } archs[] = {{120, 101376}, {121, 101376}, {90, 232448}, {100, 232448}, {80, 166912}};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        int accepted = 0, rejected = 0;
        for (size_t i = 0; i < n; i++) {
            for (int explicit_stages = 0; explicit_stages < 2; explicit_stages++) {
                /* auto = the stage count of the first compiled tile of that shape (the list's
                 * preferred order); explicit = that instantiation */
                size_t first = i;
                for (size_t j = 0; j < i; j++)
                    if (t[j].warps == t[i].warps && t[j].mt == t[i].mt && t[j].nt == t[i].nt && t[j].kc == t[i].kc) {
                        first = j;
                        break;
                    }
                if (!explicit_stages && first != i) continue;
                fm_kernel_config c = mma_cfg(archs[a].cc, &t[i], explicit_stages ? t[i].stages : 0);
                fm_plan_result r;
                memset(&r, 0xA5, sizeof r); /* poisoned */
                assert_int_equal(fm_plan_check(&c, 8, 4096, 6144, 32, 188, &r), FM_OK);
                fm_smem_breakdown launch;
                memset(&launch, 0x5A, sizeof launch);
                fm_status ls = fm_smem_mma_check(&t[i], archs[a].limit, &launch);
                assert_int_equal(r.bytes.total, launch.total);
                assert_int_equal(r.bytes.stages, t[i].stages);
                assert_int_equal(r.limit_bytes, archs[a].limit);
                assert_int_equal(r.bytes.a, launch.a);
                assert_int_equal(r.bytes.b, launch.b);
                assert_int_equal(r.bytes.sf, launch.sf);
                assert_int_equal(r.bytes.padding, launch.padding);
                assert_int_equal(r.fits, ls == FM_OK);
                assert_int_equal(ls, launch.total <= archs[a].limit ? FM_OK : FM_ERR_SMEM_EXCEEDED);
                assert_int_equal(r.fits, r.builder_fits); /* no builder: the launcher decides */
                if (explicit_stages) r.fits ? accepted++ : rejected++;
                if (r.fits) {
                    assert_non_null(strstr(r.reason, "fits: mma_"));
                    assert_int_equal(r.best_stages, t[i].stages);
                } else {
                    assert_non_null(strstr(r.reason, "FM_ERR_SMEM_EXCEEDED"));
                    const char *fix = strstr(r.reason, "use mma_");
                    assert_non_null(fix); /* every nt in the list has a tile that fits SM120 */
                    int fw, fm, fn, fk, fs;
                    assert_int_equal(sscanf(fix, "use mma_w%dm%dn%dk%ds%d", &fw, &fm, &fn, &fk, &fs), 5);
                    fm_tile ft = {fw, fm, fn, fk, fs, 0, FM_FAMILY_FP4MOE_MMA};
                    fm_kernel_config fc = mma_cfg(archs[a].cc, &ft, 0);
                    fm_plan_result fr;
                    assert_int_equal(fm_plan_check(&fc, 8, 4096, 6144, 32, 188, &fr), FM_OK);
                    assert_true(fr.fits);
                    assert_int_equal(fn, t[i].nt); /* same tokens a pass */
                }
                /* CTAs: one per expert and N block, passes loop inside */
                assert_int_equal(r.tiles, 32 * ((4096 + c.tile_n - 1) / c.tile_n));
            }
        }
        assert_int_equal(accepted + rejected, (int)n);
        if (archs[a].limit == 101376) {
            assert_true(accepted > 0); /* the list holds SM120 tiles ... */
            assert_true(rejected > 0); /* ... and Hopper/A100-only ones */
        }
        if (archs[a].limit == 232448) assert_int_equal(rejected, 0);
    }
}

static void fm_smem_model_matches(void **s)
{
    (void)s;
    size_t n = 0;
    const fm_tile *t = fm_mma_tiles(&n);
    for (size_t i = 0; i < n; i++) {
        fm_kernel_config c = mma_cfg(120, &t[i], t[i].stages);
        fm_smem_breakdown m, l;
        assert_int_equal(fm_smem_model(&c, &m), FM_OK);
        assert_int_equal(fm_smem_mma(&t[i], &l), FM_OK);
        assert_int_equal(m.total, l.total); /* field by field: the struct has padding */
        assert_int_equal(m.stages, l.stages);
        assert_int_equal(m.a, l.a);
        assert_int_equal(m.b, l.b);
        assert_int_equal(m.sf, l.sf);
        assert_int_equal(m.padding, l.padding);
        assert_int_equal(m.mainloop, l.mainloop);
        assert_int_equal(m.epilogue, l.epilogue);
    }
}

static void refused_and_bad(void **s)
{
    (void)s;
    fm_tile t0 = fm_mma_tiles(NULL)[0];
    fm_plan_result r, before;
    memset(&r, 0x33, sizeof r);
    before = r;
    /* a shape the launcher has not compiled: sized on request, never accepted */
    fm_kernel_config c = mma_cfg(120, &t0, t0.stages == 8 ? 7 : t0.stages + 1);
    fm_smem_breakdown b;
    assert_int_equal(fm_smem_model(&c, &b), FM_OK);
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(fm_last_error(), "not compiled in"));
    c.stages = 0, c.tile_k = 1024; /* no compiled tile of this K: no stage count to take */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_UNSUPPORTED);
    c = mma_cfg(120, &t0, 0);
    c.tile_m = 24; /* 3 fragments */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = mma_cfg(120, &t0, 0);
    c.tile_n = 16 * c.warps * 3;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = mma_cfg(120, &t0, 0);
    c.a = c.b = FM_ELEM_FP8; /* an FP4-weight kernel */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c = mma_cfg(75, &t0, 0); /* unknown arch */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_NOT_FOUND);
    c = mma_cfg(120, &t0, 0);
    c.cluster_m = 2;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = mma_cfg(120, &t0, 0);
    assert_int_equal(fm_plan_check(&c, 8, 4096, 6144 + 32, 32, 188, &r), FM_ERR_BAD_SHAPE); /* K % tile K */
    assert_memory_equal(&r, &before, sizeof r); /* nothing written on failure */
    fm_kernel_family f = FM_FAMILY_AUTO;
    assert_int_equal(fm_family_parse("fp4moe-mma", &f), FM_OK);
    assert_int_equal(f, FM_FAMILY_FP4MOE_MMA);
    assert_int_equal(fm_family_parse("cutlass-sm100", &f), FM_OK);
    assert_int_equal(f, FM_FAMILY_CUTLASS_SM100);
    assert_int_equal(fm_family_parse("cublas", &f), FM_ERR_NOT_FOUND);
    assert_int_equal(f, FM_FAMILY_CUTLASS_SM100);
}

/* Decode (a few rows per expert) ranks a swap-AB tile first, prefill a CUTLASS tile;
 * the CUTLASS-only set never lists a swap-AB tile. */
static void ranked_with_cutlass(void **s)
{
    (void)s;
    const char *gpus[] = {"rtx-pro-6000", "b200", "h200"};
    for (size_t g = 0; g < 3; g++) {
        const fm_gpu_info *gpu = NULL;
        assert_int_equal(fm_gpu_find(gpus[g], &gpu), FM_OK);
        fm_plan_candidate c[64];
        size_t n = 0, total = 0;
        const int64_t rows[] = {1, 2, 8};
        for (size_t r = 0; r < 3; r++) {
            assert_int_equal(fm_plan_candidates_in(0, gpu, FM_ELEM_NVFP4, FM_EPI_TMA, 0, rows[r], 4096, 6144, 32, c,
                                                   64, &n, &total),
                             FM_OK);
            assert_true(n > 0 && n == total);
            assert_true(c[0].res.fits);
            assert_int_equal(c[0].cfg.family, FM_FAMILY_FP4MOE_MMA);
            int seen_cutlass = gpu->cc == 90; /* sm_90 has no FP4 MMA: swap-AB only */
            for (size_t i = 0; i < n; i++) seen_cutlass |= c[i].cfg.family != FM_FAMILY_FP4MOE_MMA;
            assert_true(seen_cutlass);
        }
        if (gpu->cc == 90) {
            assert_int_equal(fm_plan_candidates_in(FM_FAMILIES_CUTLASS, gpu, FM_ELEM_NVFP4, FM_EPI_TMA, 0, 8, 4096,
                                                   6144, 32, c, 64, &n, NULL),
                             FM_ERR_ARCH_MISMATCH); /* no FP4 tensor cores */
            continue;
        }
        assert_int_equal(fm_plan_candidates_in(0, gpu, FM_ELEM_NVFP4, FM_EPI_TMA, 0, 2048, 4096, 6144, 32, c, 64, &n,
                                               NULL),
                         FM_OK);
        assert_int_not_equal(c[0].cfg.family, FM_FAMILY_FP4MOE_MMA);
        assert_int_equal(fm_plan_candidates(gpu, FM_ELEM_NVFP4, FM_EPI_TMA, 0, 2, 4096, 6144, 32, c, 64, &n, NULL),
                         FM_OK); /* CUTLASS only, as it always answered */
        for (size_t i = 0; i < n; i++) assert_int_not_equal(c[i].cfg.family, FM_FAMILY_FP4MOE_MMA);
    }
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(same_bytes_as_launcher),
        cmocka_unit_test(fm_smem_model_matches),
        cmocka_unit_test(refused_and_bad),
        cmocka_unit_test(ranked_with_cutlass),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
}
