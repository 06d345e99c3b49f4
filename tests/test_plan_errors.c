/* test_plan_errors.c - the planner's answers to inputs it must refuse, each a
 * regression of a review finding:
 *   - a K that no catalogue tile divides is FM_ERR_BAD_SHAPE naming the tile Ks
 *     (it used to be FM_OK with zero candidates, an empty `plan` table);
 *   - problem sizes beyond CUTLASS's int extents, or a grid beyond 2^62 tiles, are
 *     FM_ERR_BAD_SHAPE (the tile count used to overflow int64 to a negative number);
 *   - operand formats that are not GEMM operands (void, fp32) are FM_ERR_INVALID_ARG;
 *   - CUTLASS versions with trailing junk ("4.2x", "4.7 junk") are refused;
 *   - the CUTLASS family of an architecture is chosen in one place, and the resolver
 *     and the candidates agree with it for every known architecture.
 * On every failure the caller's outputs are unchanged (poisoned before the call).
 */
#include <stdint.h>
#include <string.h>

#include "plan/plan_internal.h"
#include "testutil.h"

static fm_rng g_rng;

static const fm_elem k_formats[] = {FM_ELEM_NVFP4, FM_ELEM_MXFP4, FM_ELEM_FP8, FM_ELEM_BF16};

static const fm_gpu_info *random_gpu(void) { return fm_gpu_at(fm_rng_u64(&g_rng) % fm_gpu_count()); }

/* K not a multiple of any tile K: every tile K in the catalogues is even, so an odd K
 * fits none; the detail names K and the tile Ks. */
static void k_fits_no_tile(void **s)
{
    (void)s;
    fm_plan_candidate c[64];
    for (size_t gi = 0; gi < fm_gpu_count(); gi++) {
        const fm_gpu_info *g = fm_gpu_at(gi);
        for (size_t fi = 0; fi < FM_ARRAY_LEN(k_formats); fi++) {
            size_t cnt = 0;
            fm_status ok = fm_plan_candidates_in(0, g, k_formats[fi], FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &cnt, NULL);
            if (ok != FM_OK) continue; /* no family of this GPU takes the format: another error, tested elsewhere */
            long k = 2 * (long)(fm_rng_u64(&g_rng) % 5000) + 1;
            cnt = 12345;
            fm_poison_bytes(c, sizeof c);
            unsigned char ref[sizeof c];
            memcpy(ref, c, sizeof c);
            fm_status st = fm_plan_candidates_in(0, g, k_formats[fi], FM_EPI_TMA, 0, 8, 4096, k, 32, c, 64, &cnt, NULL);
            if (st != FM_ERR_BAD_SHAPE) {
                print_error("%s %s K=%ld: %s (%s), %zu candidates\n", g->name, fm_elem_name(k_formats[fi]), k,
                            fm_status_name(st), fm_last_error(), cnt);
                fail();
            }
            char want[32];
            snprintf(want, sizeof want, "K=%ld ", k);
            assert_non_null(strstr(fm_last_error(), want));
            assert_non_null(strstr(fm_last_error(), "not a multiple of any tile K"));
            assert_int_equal(cnt, 12345);
            assert_memory_equal(c, ref, sizeof c);
        }
    }
    /* the finding's case: h200, bf16, K=100 -> the SM90 catalogue's K 64 is named */
    const fm_gpu_info *h = NULL;
    assert_int_equal(fm_gpu_find("h200", &h), FM_OK);
    size_t cnt = 0;
    assert_int_equal(fm_plan_candidates_in(0, h, FM_ELEM_BF16, FM_EPI_TMA, 0, 8, 4096, 100, 32, c, 64, &cnt, NULL),
                     FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), ": 64"));
}

/* Sizes past int32 (CUTLASS's problem shape) and grids past 2^62 tiles. */
static void huge_problems(void **s)
{
    (void)s;
    fm_kernel_config cfg;
    fm_kernel_config_init(&cfg);
    cfg.cc = 120, cfg.a = cfg.b = FM_ELEM_NVFP4, cfg.tile_m = cfg.tile_n = cfg.tile_k = 128;
    fm_plan_result r, ref;
    fm_poison_bytes(&r, sizeof r);
    memcpy(&ref, &r, sizeof r);
    /* the finding's call: tiles came back as -9079256848778919937 */
    assert_int_equal(fm_plan_check(&cfg, INT64_MAX, INT64_MAX, 0, INT64_MAX, 132, &r), FM_ERR_BAD_SHAPE);
    assert_memory_equal(&r, &ref, sizeof r);
    const int64_t big = INT32_MAX + (int64_t)(fm_rng_u64(&g_rng) % 1000000) + 1;
    for (int which = 0; which < 4; which++) {
        int64_t v[4] = {8, 4096, 0, 32};
        v[which] = big;
        assert_int_equal(fm_plan_check(&cfg, v[0], v[1], v[2], v[3], 132, &r), FM_ERR_BAD_SHAPE);
        assert_memory_equal(&r, &ref, sizeof r);
    }
    /* each size within int32, yet 2^31 experts x 2^24 M tiles x 2^24 N tiles > 2^62 */
    assert_int_equal(fm_plan_check(&cfg, INT32_MAX, INT32_MAX, 0, INT32_MAX, 132, &r), FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), "CTA tiles"));
    assert_memory_equal(&r, &ref, sizeof r);
    /* the largest valid extents still give the exact tile count */
    int64_t rows = INT32_MAX - (int64_t)(fm_rng_u64(&g_rng) % 1000), e = 1 + (int64_t)(fm_rng_u64(&g_rng) % 256);
    assert_int_equal(fm_plan_check(&cfg, rows, 4096, 0, e, 188, &r), FM_OK);
    assert_true(r.tiles == e * ((rows + 127) / 128) * 32);
    /* the same caps through the candidates */
    const fm_gpu_info *g = random_gpu();
    fm_plan_candidate c[8];
    size_t cnt = 7;
    assert_int_equal(fm_plan_candidates_in(0, g, FM_ELEM_NVFP4, FM_EPI_TMA, 0, big, 4096, 6144, 32, c, 8, &cnt, NULL),
                     FM_ERR_BAD_SHAPE);
    assert_int_equal(cnt, 7);
}

/* void and fp32 are epilogue types, never GEMM operands. */
static void non_operand_formats(void **s)
{
    (void)s;
    const fm_elem bad[] = {FM_ELEM_VOID, FM_ELEM_FP32, (fm_elem)FM_ELEM_COUNT};
    fm_plan_candidate c[4];
    for (size_t i = 0; i < FM_ARRAY_LEN(bad); i++) {
        size_t cnt = 3;
        assert_int_equal(fm_plan_candidates_in(0, random_gpu(), bad[i], FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 4, &cnt,
                                               NULL),
                         FM_ERR_INVALID_ARG);
        assert_non_null(strstr(fm_last_error(), "nvfp4"));
        assert_int_equal(cnt, 3);
    }
}

static void cutlass_versions(void **s)
{
    (void)s;
    static const char *const bad[] = {"4.2x", "4.7 junk", "4.2.0x", " 4.2", "4.", "4..2", "4.2.", "4.2.0.1",
                                      "4.10", "5.0",  "4",        "",       "x",   "4.2 ", "+4.2", "4.-2"};
    for (size_t i = 0; i < FM_ARRAY_LEN(bad); i++) {
        int v = -7;
        if (fm_cutlass_version_parse(bad[i], &v) != FM_ERR_NOT_FOUND || v != -7) {
            print_error("'%s' accepted as %d\n", bad[i], v);
            fail();
        }
    }
    static const struct { const char *s; int v; } good[] = {{"4.2", 420}, {"4.7", 470}, {"4.2.1", 421}, {"4.9.9", 499}};
    for (size_t i = 0; i < FM_ARRAY_LEN(good); i++) {
        int v = 0;
        assert_int_equal(fm_cutlass_version_parse(good[i].s, &v), FM_OK);
        assert_int_equal(v, good[i].v);
    }
}

/* One family per arch: the resolver's AUTO and the candidates' CUTLASS rows agree with
 * fm_family_for_cc for every architecture the tables know. */
static void family_from_cc(void **s)
{
    (void)s;
    for (size_t i = 0; i < fm_arch_count(); i++) {
        const fm_arch_info *a = fm_arch_at(i);
        fm_kernel_family f = fm_family_for_cc(a->cc);
        fm_kernel_config cfg, r;
        fm_kernel_config_init(&cfg);
        cfg.cc = a->cc, cfg.a = cfg.b = FM_ELEM_NVFP4, cfg.tile_m = cfg.tile_n = cfg.tile_k = 128;
        fm_status st = fm_plan_resolve(&cfg, &r);
        if (f == FM_FAMILY_AUTO) {
            assert_int_equal(st, FM_ERR_ARCH_MISMATCH);
            continue;
        }
        if (st == FM_OK) assert_int_equal(r.family, f);
        else assert_int_not_equal(st, FM_ERR_INVALID_ARG); /* a format or tile rule of f, not a family error */
    }
    fm_plan_candidate c[64];
    for (size_t gi = 0; gi < fm_gpu_count(); gi++) {
        const fm_gpu_info *g = fm_gpu_at(gi);
        fm_elem ab = g->cc == 90 ? FM_ELEM_BF16 : FM_ELEM_NVFP4;
        size_t cnt = 0;
        if (fm_plan_candidates(g, ab, FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &cnt, NULL) != FM_OK) {
            assert_int_equal(fm_family_for_cc(g->cc), FM_FAMILY_AUTO);
            continue;
        }
        assert_true(cnt > 0);
        for (size_t j = 0; j < cnt; j++) assert_int_equal(c[j].cfg.family, fm_family_for_cc(g->cc));
    }
}

/* Cluster sides whose product overflows int (65536 x 65536, 2^30 x 4): FM_ERR_BAD_SHAPE
 * from the CUTLASS families' check and from fp4moe's own (1x1 only). Both multiplied the
 * sides first (signed overflow, undefined behaviour; 65536 x 65536 wrapped to 0 and the
 * CUTLASS check read it as <= 16). */
static void cluster_overflow(void **s)
{
    (void)s;
    static const int sides[][2] = {{1 << 16, 1 << 16}, {1 << 30, 4}, {4, 1 << 30}, {32, 1}, {1, 1 << 30}};
    fm_kernel_config cfg;
    fm_smem_breakdown b, ref;
    fm_poison_bytes(&b, sizeof b);
    memcpy(&ref, &b, sizeof b);
    for (size_t i = 0; i < FM_ARRAY_LEN(sides); i++) {
        for (int own = 0; own < 2; own++) {
            fm_kernel_config_init(&cfg);
            cfg.cc = own ? 120 : 90, cfg.a = cfg.b = own ? FM_ELEM_NVFP4 : FM_ELEM_BF16;
            cfg.tile_m = 128, cfg.tile_n = 128, cfg.tile_k = 64;
            if (own) {
                const fm_tile *t = &fm_mma_tiles(NULL)[0];
                cfg.family = FM_FAMILY_FP4MOE_MMA, cfg.warps = t->warps;
                cfg.tile_m = 8 * t->nt, cfg.tile_n = t->warps * t->mt * 16, cfg.tile_k = t->kc;
            }
            assert_int_equal(fm_smem_model(&cfg, &b), FM_OK); /* the same config at 1x1 is valid */
            memcpy(&b, &ref, sizeof b);
            cfg.cluster_m = sides[i][0], cfg.cluster_n = sides[i][1];
            fm_status st = fm_smem_model(&cfg, &b);
            if (st != FM_ERR_BAD_SHAPE) {
                print_error("cluster %dx%d (%s): %s (%s)\n", cfg.cluster_m, cfg.cluster_n, own ? "fp4moe" : "cutlass",
                            fm_status_name(st), fm_last_error());
                fail();
            }
            assert_non_null(strstr(fm_last_error(), "cluster"));
            assert_memory_equal(&b, &ref, sizeof b);
        }
    }
}

int main(void)
{
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(k_fits_no_tile),   cmocka_unit_test(huge_problems),  cmocka_unit_test(non_operand_formats),
        cmocka_unit_test(cutlass_versions), cmocka_unit_test(family_from_cc),   cmocka_unit_test(cluster_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
