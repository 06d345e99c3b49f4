/* test_plan_wgmma.c - fp4moe's wgmma kernel family (src/cuda/gemm_wgmma.cu, sm_90a)
 * as a planner family, FM_FAMILY_FP4MOE_WGMMA.
 *
 * What must hold:
 *  - every compiled tile is modelled byte-exact: the planner (fm_plan_check,
 *    fm_smem_model) and the launcher's function (fm_smem_wgmma_check) give the bytes
 *    of this file's own formula, stages x (roundup(warps*mt*(kc/64) x (512 + 64) + 8*nt x 2*kc,
 *    1024) + 16) (each stage on a 1 KB swizzle atom, the rounding being the padding; two
 *    mbarriers a stage), no epilogue, and the CTA count of one CTA per (expert, pass, N block);
 *  - only sm_90 (FM_FEAT_WGMMA) takes it: sm_80, sm_86, sm_89, sm_100, sm_103, sm_110,
 *    sm_120, sm_121 answer FM_ERR_ARCH_MISMATCH saying "needs wgmma (sm_90a)", outputs
 *    untouched;
 *  - a tile over the limit gets the launcher's FM_ERR_SMEM_EXCEEDED verdict and, as
 *    the fix, the widest compiled tile with the same tokens a pass that fits (sm_90's
 *    232,448 B holds every compiled tile, so the verdict is driven with tighter limits
 *    through the planner's internal check, the one fm_plan_check calls);
 *  - tiles not compiled in, bad shapes and non-FP4 weights are refused with specific
 *    statuses; warps default to 8;
 *  - the candidates on H200 contain wgmma rows (and only wgmma rows when asked for that
 *    family alone), on SM120 / SM100 none, and a wgmma-only set there is an
 *    FM_ERR_ARCH_MISMATCH; the estimate gives mma.sync 2/3 of the BF16 rate on sm_90
 *    only;
 *  - the name "fp4moe-wgmma" parses back to the family (every family round-trips).
 */
#include <stdio.h>
#include <string.h>

#include "kernels/fm_kernels_smem.h"
#include "plan/plan_internal.h"
#include "testutil.h"

#define SM90_LIMIT 232448u

static fm_kernel_config wg_cfg(int cc, const fm_tile *t, int stages)
{
    fm_kernel_config c;
    fm_kernel_config_init(&c);
    c.cc = cc, c.family = FM_FAMILY_FP4MOE_WGMMA, c.a = c.b = FM_ELEM_NVFP4;
    c.tile_m = 8 * t->nt, c.tile_n = t->warps * t->mt * 16, c.tile_k = t->kc, c.warps = t->warps;
    c.stages = stages;
    c.persistent = t->persist;
    return c;
}

/* The test's own formula (fm_kernels_smem.h's comment), part by part. */
typedef struct {
    size_t a, sf, b, pad, bar, epi, total;
} want_bytes;

static want_bytes formula(const fm_tile *t)
{
    size_t chunks = (size_t)t->warps * (size_t)t->mt * (size_t)(t->kc / 64);
    want_bytes w;
    w.a = (size_t)t->stages * chunks * 512;
    w.sf = (size_t)t->stages * chunks * 64;
    w.b = (size_t)t->stages * 8 * (size_t)t->nt * 2 * (size_t)t->kc;
    size_t stage = (w.a + w.sf + w.b) / (size_t)t->stages;
    w.pad = (size_t)t->stages * ((stage + 1023) / 1024 * 1024 - stage);
    w.bar = (size_t)t->stages * 16;
    /* the persistent kernel's output tile: 8*nt token rows of warps*mt*16 BF16 + 16 B */
    w.epi = t->persist ? 8 * (size_t)t->nt * ((size_t)t->warps * t->mt * 16 * 2 + 16) : 0;
    w.total = w.a + w.sf + w.b + w.pad + w.bar + w.epi;
    return w;
}

static void expect_bytes(const fm_smem_breakdown *b, const fm_tile *t)
{
    want_bytes w = formula(t);
    assert_int_equal(b->total, w.total);
    assert_int_equal(b->a, w.a);
    assert_int_equal(b->sf, w.sf);
    assert_int_equal(b->b, w.b);
    assert_int_equal(b->mainloop, w.total - w.epi);
    assert_int_equal(b->stages, t->stages);
    assert_int_equal(b->padding, w.pad);
    assert_int_equal(b->epilogue, w.epi);
    assert_int_equal(b->epi_d, w.epi);
    assert_int_equal(b->barriers, w.bar);
    assert_int_equal(b->tensormaps, 0);
    assert_int_equal(b->scheduler, 0);
}

/* Index of the first compiled tile of t's shape (what stages = 0 resolves to). */
static size_t first_of_shape(const fm_tile *l, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (l[j].warps == l[i].warps && l[j].mt == l[i].mt && l[j].nt == l[i].nt && l[j].kc == l[i].kc &&
            l[j].persist == l[i].persist)
            return j;
    return i;
}

static void every_tile_byte_exact(void **s)
{
    (void)s;
    size_t n = 0;
    const fm_tile *t = fm_wgmma_tiles(&n);
    assert_true(n >= 2);
    const int64_t experts = 32, N = 4096, K = 6144, rows_set[] = {8, 300};
    for (size_t ri = 0; ri < 2; ri++) {
        const int64_t rows = rows_set[ri];
        for (size_t i = 0; i < n; i++) {
            for (int explicit_stages = 0; explicit_stages < 2; explicit_stages++) {
                if (!explicit_stages && first_of_shape(t, i) != i) continue; /* auto = the first of the shape */
                fm_kernel_config c = wg_cfg(90, &t[i], explicit_stages ? t[i].stages : 0);
                fm_plan_result r;
                memset(&r, 0xA5, sizeof r);
                assert_int_equal(fm_plan_check(&c, rows, N, K, experts, 132, &r), FM_OK);
                expect_bytes(&r.bytes, &t[i]);
                assert_int_equal(r.limit_bytes, SM90_LIMIT);
                assert_true(r.fits);
                assert_true(r.builder_fits);
                assert_int_equal(r.auto_stages, t[i].stages); /* the compiled count (auto: the first's) */
                assert_int_equal(r.best_stages, t[i].stages);
                assert_int_equal(r.best_bytes, formula(&t[i]).total);
                assert_non_null(strstr(r.reason, "fits: wgmma_"));
                /* one CTA per (expert, pass of 8*nt rows, N block) */
                int64_t passes = (rows + 8 * t[i].nt - 1) / (8 * t[i].nt);
                assert_true(r.tiles == experts * passes * ((N + c.tile_n - 1) / c.tile_n));
                /* the launcher's own check agrees */
                fm_smem_breakdown l;
                memset(&l, 0x5A, sizeof l);
                assert_int_equal(fm_smem_wgmma_check(&t[i], SM90_LIMIT, &l), FM_OK);
                expect_bytes(&l, &t[i]);
                /* and fm_smem_model */
                fm_smem_breakdown m;
                assert_int_equal(fm_smem_model(&c, &m), FM_OK);
                expect_bytes(&m, &t[i]);
            }
        }
    }
    /* two literals from the header's table, sized on request (compiled or not) */
    const fm_tile lit[] = {{8, 2, 16, 64, 4, 0, FM_FAMILY_FP4MOE_WGMMA}, {4, 2, 1, 256, 4, 0, FM_FAMILY_FP4MOE_WGMMA}};
    const size_t lit_bytes[] = {102400 + 64, 90112 + 64}; /* + 4 stages x two 8-byte mbarriers */
    for (size_t i = 0; i < 2; i++) {
        fm_kernel_config c = wg_cfg(90, &lit[i], lit[i].stages);
        fm_smem_breakdown m;
        assert_int_equal(fm_smem_model(&c, &m), FM_OK);
        assert_int_equal(m.total, lit_bytes[i]);
    }
}

/* Only an architecture with FM_FEAT_WGMMA takes the family. */
static void arch_gate(void **s)
{
    (void)s;
    const fm_tile t0 = fm_wgmma_tiles(NULL)[0];
    int accepted = 0, refused = 0;
    for (size_t a = 0; a < fm_arch_count(); a++) {
        const fm_arch_info *arch = fm_arch_at(a);
        fm_kernel_config c = wg_cfg(arch->cc, &t0, 0);
        fm_plan_result r, before;
        fm_poison_bytes(&r, sizeof r);
        before = r;
        fm_smem_breakdown m, mb;
        fm_poison_bytes(&m, sizeof m);
        mb = m;
        fm_status st = fm_plan_check(&c, 8, 4096, 6144, 32, 0, &r);
        fm_status sm = fm_smem_model(&c, &m);
        if (arch->features & FM_FEAT_WGMMA) {
            assert_int_equal(st, FM_OK);
            assert_int_equal(sm, FM_OK);
            accepted++;
            continue;
        }
        if (st != FM_ERR_ARCH_MISMATCH || sm != FM_ERR_ARCH_MISMATCH) {
            print_error("%s: check %s, model %s (want FM_ERR_ARCH_MISMATCH)\n", arch->name, fm_status_name(st),
                        fm_status_name(sm));
            fail();
        }
        assert_non_null(strstr(fm_last_error(), "needs wgmma (sm_90a)"));
        assert_non_null(strstr(fm_last_error(), arch->name));
        assert_memory_equal(&r, &before, sizeof r);
        assert_memory_equal(&m, &mb, sizeof m);
        refused++;
    }
    assert_int_equal(accepted, 1); /* sm_90 */
    assert_true(refused >= 4);
    /* the ones the brief names, by number */
    const int cc[] = {80, 100, 120, 121, 103, 110};
    for (size_t i = 0; i < sizeof cc / sizeof cc[0]; i++) {
        fm_kernel_config c = wg_cfg(cc[i], &t0, 0);
        fm_plan_result r;
        assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    }
    fm_kernel_config c = wg_cfg(90, &t0, 0);
    fm_plan_result r;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
}

/* Over the limit: the launcher's FM_ERR_SMEM_EXCEEDED, and the fix. */
static void over_limit_and_fix(void **s)
{
    (void)s;
    size_t n = 0;
    const fm_tile *t = fm_wgmma_tiles(&n);
    const size_t limits[] = {60000, 101376, 120000, 150000, SM90_LIMIT};
    int with_fix = 0, without_fix = 0, fits = 0;
    for (size_t li = 0; li < sizeof limits / sizeof limits[0]; li++) {
        size_t limit = limits[li];
        for (size_t i = 0; i < n; i++) {
            fm_kernel_config c = wg_cfg(90, &t[i], t[i].stages), rc;
            fm_model_out m;
            assert_int_equal(fm_plan_model_resolved(&c, &rc, &m), FM_OK);
            fm_plan_result res;
            memset(&res, 0, sizeof res);
            res.limit_bytes = limit;
            res.fits = m.bd.total <= limit;
            fm_check_fp4moe(&rc, &m, limit, &res);
            fm_smem_breakdown l;
            fm_status ls = fm_smem_wgmma_check(&t[i], limit, &l);
            assert_int_equal(res.fits, ls == FM_OK);
            assert_int_equal(res.fits, formula(&t[i]).total <= limit);
            if (res.fits) {
                fits++;
                assert_non_null(strstr(res.reason, "fits: wgmma_"));
                continue;
            }
            assert_int_equal(ls, FM_ERR_SMEM_EXCEEDED);
            assert_int_equal(res.best_stages, 0);
            assert_non_null(strstr(res.reason, "FM_ERR_SMEM_EXCEEDED"));
            char over[64];
            snprintf(over, sizeof over, "(%zu B over)", formula(&t[i]).total - limit);
            assert_non_null(strstr(res.reason, over));
            /* the widest compiled tile of the same kind with the same tokens a pass that fits, found here */
            int best = -1;
            for (size_t j = 0; j < n; j++)
                if (t[j].nt == t[i].nt && t[j].persist == t[i].persist && formula(&t[j]).total <= limit &&
                    (best < 0 || t[j].warps * t[j].mt > t[best].warps * t[best].mt))
                    best = (int)j;
            const char *fix = strstr(res.reason, "use wgmma_");
            if (best < 0) {
                assert_null(fix);
                assert_non_null(strstr(res.reason, "no compiled fp4moe-wgmma tile with"));
                without_fix++;
                continue;
            }
            assert_non_null(fix);
            int fw, fm, fn, fk, fs;
            assert_int_equal(sscanf(fix, "use wgmma_w%dm%dn%dk%ds%d", &fw, &fm, &fn, &fk, &fs), 5);
            fm_tile ft = {fw, fm, fn, fk, fs, t[i].persist, FM_FAMILY_FP4MOE_WGMMA}; /* a fix of the same kind */
            assert_int_equal(fix[strlen("use ") + strcspn(fix + strlen("use "), " ") - 1] == 'p', t[i].persist != 0);
            assert_int_equal(fn, t[i].nt);
            assert_int_equal(fw * fm, t[best].warps * t[best].mt);
            assert_true(formula(&ft).total <= limit);
            fm_kernel_config fc = wg_cfg(90, &ft, fs);
            fm_plan_result fr;
            assert_int_equal(fm_plan_check(&fc, 0, 0, 0, 0, 0, &fr), FM_OK); /* a compiled tile */
            with_fix++;
        }
    }
    assert_true(with_fix > 0);
    assert_true(without_fix > 0);
    assert_true(fits > 0);
    fm_clear_error();
    /* through the public API: a deeper, uncompiled instantiation is sized (over the
     * limit) but never accepted - the launcher could not run it */
    fm_tile big = {8, 1, 32, 64, 8, 0, FM_FAMILY_FP4MOE_WGMMA};
    assert_true(formula(&big).total > SM90_LIMIT);
    fm_kernel_config c = wg_cfg(90, &big, 8);
    fm_smem_breakdown b;
    assert_int_equal(fm_smem_model(&c, &b), FM_OK);
    assert_int_equal(b.total, formula(&big).total);
    fm_plan_result r;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(fm_last_error(), "not compiled in"));
}

static void refused_shapes(void **s)
{
    (void)s;
    const fm_tile t0 = fm_wgmma_tiles(NULL)[0];
    fm_plan_result r;
    fm_kernel_config c = wg_cfg(90, &t0, 0), rc;
    /* warps 0 = 8 */
    c.warps = 0;
    c.tile_n = 8 * 16 * t0.mt;
    assert_int_equal(fm_plan_resolve(&c, &rc), FM_OK);
    assert_int_equal(rc.warps, 8);
    /* not compiled: listed.  A valid shape the list lacks, found here. */
    size_t n = 0;
    const fm_tile *l = fm_wgmma_tiles(&n);
    fm_tile un = {0, 0, 0, 0, 0, 0, FM_FAMILY_AUTO};
    for (int w = 4; w <= 8 && !un.warps; w += 4)
        for (int mt = 1; mt <= 2 && !un.warps; mt *= 2)
            for (int nt = 1; nt <= 32 && !un.warps; nt *= 2)
                for (int kc = 64; kc <= 256 && !un.warps; kc += 64) {
                    int listed = 0;
                    for (size_t i = 0; i < n; i++)
                        listed |= l[i].warps == w && l[i].mt == mt && l[i].nt == nt && l[i].kc == kc;
                    if (!listed) un = (fm_tile){w, mt, nt, kc, 4, 0, FM_FAMILY_FP4MOE_WGMMA};
                }
    assert_true(un.warps != 0);
    c = wg_cfg(90, &un, 0);
    fm_status st = fm_plan_check(&c, 0, 0, 0, 0, 0, &r);
    assert_int_equal(st, FM_ERR_UNSUPPORTED);
    assert_non_null(strstr(fm_last_error(), "compiled MxNxK/warps/stages"));
    char first[48];
    snprintf(first, sizeof first, "%dx%dx%d/w%d/s%d", 8 * t0.nt, t0.warps * t0.mt * 16, t0.kc, t0.warps, t0.stages);
    assert_non_null(strstr(fm_last_error(), first));
    /* bad shapes and fields */
    struct {
        int warps, m, n, k, stages;
        fm_status want;
    } bad[] = {
        {6, 64, 192, 64, 0, FM_ERR_BAD_SHAPE},  /* 6 warps: not 1 or 2 warpgroups */
        {2, 64, 64, 64, 0, FM_ERR_BAD_SHAPE},   /* 2 warps */
        {8, 24, 256, 64, 0, FM_ERR_BAD_SHAPE},  /* 3 fragments */
        {8, 512, 256, 64, 0, FM_ERR_BAD_SHAPE}, /* wgmma N > 256 */
        {8, 64, 512, 64, 0, FM_ERR_BAD_SHAPE},  /* mt = 4 */
        {8, 64, 384, 64, 0, FM_ERR_BAD_SHAPE},  /* mt = 3 */
        {8, 64, 256, 512, 0, FM_ERR_BAD_SHAPE}, /* kc > 256 */
        {8, 64, 256, 96, 0, FM_ERR_BAD_SHAPE},  /* kc not a multiple of 64 */
        {8, 64, 256, 64, 1, FM_ERR_BAD_SHAPE},  /* stages < 2 */
        {8, 64, 256, 64, 9, FM_ERR_BAD_SHAPE},  /* stages > 8 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fm_kernel_config_init(&c);
        c.cc = 90, c.family = FM_FAMILY_FP4MOE_WGMMA, c.a = c.b = FM_ELEM_MXFP4;
        c.warps = bad[i].warps, c.tile_m = bad[i].m, c.tile_n = bad[i].n, c.tile_k = bad[i].k, c.stages = bad[i].stages;
        st = fm_plan_check(&c, 0, 0, 0, 0, 0, &r);
        if (st != bad[i].want) {
            print_error("case %zu: %s (%s)\n", i, fm_status_name(st), fm_last_error());
            fail();
        }
    }
    c = wg_cfg(90, &t0, 0);
    c.a = c.b = FM_ELEM_FP8; /* an FP4-weight kernel */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_ARCH_MISMATCH);
    c = wg_cfg(90, &t0, 0);
    c.b = FM_ELEM_BF16; /* nvfp4 weights x bf16 activations: what it runs */
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_OK);
    c = wg_cfg(90, &t0, 0);
    c.cluster_m = 2;
    assert_int_equal(fm_plan_check(&c, 0, 0, 0, 0, 0, &r), FM_ERR_BAD_SHAPE);
    c = wg_cfg(90, &t0, 0);
    assert_int_equal(fm_plan_check(&c, 8, 4096, 6144 + 32, 32, 132, &r), FM_ERR_BAD_SHAPE); /* K % tile K */
}

static int count_family(const fm_plan_candidate *c, size_t n, fm_kernel_family f)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += c[i].cfg.family == f;
    return k;
}

static void candidates(void **s)
{
    (void)s;
    const fm_gpu_info *h = NULL, *rtx = NULL, *b200 = NULL;
    assert_int_equal(fm_gpu_find("h200", &h), FM_OK);
    assert_int_equal(fm_gpu_find("rtx-pro-6000", &rtx), FM_OK);
    assert_int_equal(fm_gpu_find("b200", &b200), FM_OK);
    size_t nw = 0;
    const fm_tile *wt = fm_wgmma_tiles(&nw);
    fm_plan_candidate c[64];
    size_t n = 0, total = 0;
    const int64_t rows[] = {1, 8, 64, 256, 2048};
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
        assert_int_equal(fm_plan_candidates_in(0, h, FM_ELEM_NVFP4, FM_EPI_TMA, 0, rows[ri], 4096, 6144, 32, c, 64, &n,
                                               &total),
                         FM_OK);
        assert_true(n == total);
        assert_int_equal(count_family(c, n, FM_FAMILY_FP4MOE_WGMMA), (int)nw); /* K = 6144: every kc divides */
        assert_true(count_family(c, n, FM_FAMILY_FP4MOE_MMA) > 0);
        for (size_t i = 0; i < n; i++) {
            if (c[i].cfg.family != FM_FAMILY_FP4MOE_WGMMA) continue;
            assert_true(c[i].res.fits);
            assert_true(c[i].est_us > 0);
            int w = c[i].cfg.warps;
            fm_tile tt = {w, c[i].cfg.tile_n / (16 * w), c[i].cfg.tile_m / 8, c[i].cfg.tile_k, c[i].cfg.stages, c[i].cfg.persistent, FM_FAMILY_FP4MOE_WGMMA};
            assert_int_equal(c[i].res.bytes.total, formula(&tt).total);
        }
        for (size_t j = 0; j < nw; j++) { /* each compiled tile exactly once */
            int seen = 0;
            for (size_t i = 0; i < n; i++)
                seen += c[i].cfg.family == FM_FAMILY_FP4MOE_WGMMA && c[i].cfg.tile_m == 8 * wt[j].nt &&
                        c[i].cfg.tile_n == wt[j].warps * wt[j].mt * 16 && c[i].cfg.tile_k == wt[j].kc &&
                        c[i].cfg.warps == wt[j].warps && c[i].cfg.stages == wt[j].stages &&
                        c[i].cfg.persistent == wt[j].persist;
            assert_int_equal(seen, 1);
        }
        /* from 256 rows a pass of up to 256 tokens on wgmma beats mma.sync's 64 */
        if (rows[ri] >= 256) assert_int_equal(c[0].cfg.family, FM_FAMILY_FP4MOE_WGMMA);
    }
    /* the family alone */
    assert_int_equal(fm_plan_candidates_in(FM_FAMILY_BIT(FM_FAMILY_FP4MOE_WGMMA), h, FM_ELEM_MXFP4, FM_EPI_NOSMEM, 0, 4,
                                           2048, 4096, 8, c, 64, &n, NULL),
                     FM_OK);
    assert_int_equal(count_family(c, n, FM_FAMILY_FP4MOE_WGMMA), (int)n);
    assert_true(n == nw);
    /* nor in the CUTLASS-only set, nor for non-FP4 weights */
    assert_int_equal(fm_plan_candidates_in(0, h, FM_ELEM_BF16, FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &n, NULL), FM_OK);
    assert_int_equal(count_family(c, n, FM_FAMILY_FP4MOE_WGMMA), 0);
    assert_int_equal(fm_plan_candidates(h, FM_ELEM_BF16, FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &n, NULL), FM_OK);
    assert_int_equal(count_family(c, n, FM_FAMILY_FP4MOE_WGMMA), 0);
    /* SM120, SM100: none; the family alone is an arch mismatch with the reason */
    const fm_gpu_info *others[] = {rtx, b200};
    for (size_t g = 0; g < 2; g++) {
        assert_int_equal(fm_plan_candidates_in(0, others[g], FM_ELEM_NVFP4, FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &n,
                                               NULL),
                         FM_OK);
        assert_true(n > 0);
        assert_int_equal(count_family(c, n, FM_FAMILY_FP4MOE_WGMMA), 0);
        size_t keep = 77;
        assert_int_equal(fm_plan_candidates_in(FM_FAMILY_BIT(FM_FAMILY_FP4MOE_WGMMA), others[g], FM_ELEM_NVFP4,
                                               FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &keep, NULL),
                         FM_ERR_ARCH_MISMATCH);
        assert_non_null(strstr(fm_last_error(), "needs wgmma (sm_90a)"));
        assert_int_equal(keep, 77);
        /* with swap-AB in the set it answers swap-AB */
        assert_int_equal(fm_plan_candidates_in(FM_FAMILY_BIT(FM_FAMILY_FP4MOE_WGMMA) |
                                                   FM_FAMILY_BIT(FM_FAMILY_FP4MOE_MMA),
                                               others[g], FM_ELEM_NVFP4, FM_EPI_TMA, 0, 8, 4096, 6144, 32, c, 64, &n,
                                               NULL),
                         FM_OK);
        assert_int_equal(count_family(c, n, FM_FAMILY_FP4MOE_MMA), (int)n);
    }
}

/* The estimate's rates: wgmma runs at the GPU's BF16 (wgmma) rate, mma.sync at 2/3 of
 * it on sm_90 and at all of it where mma.sync is the BF16 path (sm_120).  At 2048 rows
 * these kernels are compute-bound on the H200 and the RTX 5090 (whose bandwidth per
 * BF16 FLOP is high enough; the RTX PRO 6000's is not), so est >= useful FLOPs / rate,
 * with equality up to the padding of the last wave. */
static void rates(void **s)
{
    (void)s;
    const char *names[] = {"h200", "rtx-5090"};
    for (size_t g = 0; g < 2; g++) {
        const fm_gpu_info *gpu = NULL;
        assert_int_equal(fm_gpu_find(names[g], &gpu), FM_OK);
        fm_plan_candidate c[64];
        size_t n = 0;
        const int64_t rows = 2048, N = 4096, K = 6144, E = 32;
        assert_int_equal(fm_plan_candidates_in(FM_FAMILY_BIT(FM_FAMILY_FP4MOE_MMA) |
                                                   FM_FAMILY_BIT(FM_FAMILY_FP4MOE_WGMMA),
                                               gpu, FM_ELEM_NVFP4, FM_EPI_TMA, 0, rows, N, K, E, c, 64, &n, NULL),
                         FM_OK);
        double flops = 2.0 * (double)E * (double)rows * (double)N * (double)K;
        double full_us = flops / (gpu->bf16_tflops * 1e6); /* at the whole BF16 rate */
        double best_sw = 1e300, best_wg = 1e300;
        for (size_t i = 0; i < n; i++) {
            if (!c[i].res.fits) continue;
            double *b = c[i].cfg.family == FM_FAMILY_FP4MOE_MMA ? &best_sw : &best_wg;
            if (c[i].est_us < *b) *b = c[i].est_us;
        }
        if (gpu->cc == 90) {
            assert_true(best_wg < 1e300);
            assert_true(best_wg >= full_us * (1 - 1e-9));
            assert_true(best_wg < full_us * 1.2);
            assert_true(best_sw >= full_us * 1.5 * (1 - 1e-9)); /* 2/3 of the rate */
        } else {
            assert_true(best_wg == 1e300); /* none on SM120 */
            assert_true(best_sw >= full_us * (1 - 1e-9));
            assert_true(best_sw < full_us * 1.2); /* mma.sync at the whole rate */
        }
    }
}

static void names(void **s)
{
    (void)s;
    assert_int_equal(FM_FAMILY_FP4MOE_MMA, 4); /* existing values kept */
    assert_int_equal(FM_FAMILY_FP4MOE_WGMMA, 5);
    assert_int_equal(FM_FAMILY_COUNT, 6);
    assert_string_equal(fm_family_name(FM_FAMILY_FP4MOE_WGMMA), "fp4moe-wgmma");
    for (int f = 0; f < FM_FAMILY_COUNT; f++) {
        fm_kernel_family got = (fm_kernel_family)-1;
        assert_int_equal(fm_family_parse(fm_family_name((fm_kernel_family)f), &got), FM_OK);
        assert_int_equal(got, f);
    }
    fm_kernel_family got = FM_FAMILY_AUTO;
    assert_int_equal(fm_family_parse("FP4MOE-WGMMA", &got), FM_OK);
    assert_int_equal(got, FM_FAMILY_FP4MOE_WGMMA);
    assert_int_equal(fm_family_parse("fp4moe-wgmma2", &got), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "fp4moe-wgmma"));
    assert_int_equal(got, FM_FAMILY_FP4MOE_WGMMA);
    assert_string_equal(fm_family_name(FM_FAMILY_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest t[] = {
        cmocka_unit_test(every_tile_byte_exact),
        cmocka_unit_test(arch_gate),
        cmocka_unit_test(over_limit_and_fix),
        cmocka_unit_test(refused_shapes),
        cmocka_unit_test(candidates),
        cmocka_unit_test(rates),
        cmocka_unit_test(names),
    };
    return cmocka_run_group_tests(t, NULL, NULL);
}
