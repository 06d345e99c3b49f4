/* check.c - the truthful check and ranked candidates.
 *
 * cuBLASLt manner: the return value says whether the query worked; the result says
 * whether the kernel can run, the real bytes, what CUTLASS's own arithmetic believed
 * (which is what can_implement() implies), the largest stage count that really
 * fits, waves on the GPU, and one line of reason with the fix.
 * fp4moe's own kernels (swap-AB, wgmma) have no builder: their verdict is the
 * launcher's own (smem_fp4moe.c).  Candidates and their ranking live in candidates.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "plan_internal.h"

/* CUTLASS's grouped GEMMs take int problem shapes: an extent over INT32_MAX cannot be
 * launched, and the caps keep every product below in range (tiles are counted in
 * double and checked, see fm_plan_check). */
#define FM_PLAN_DIM_MAX INT32_MAX

fm_status fm_plan_problem_check(int64_t rows, int64_t n, int64_t k, int64_t experts)
{
    static const char *const names[4] = {"rows per expert", "N", "K", "experts"};
    const int64_t v[4] = {rows, n, k, experts};
    for (int i = 0; i < 4; i++)
        if (v[i] < 0 || v[i] > FM_PLAN_DIM_MAX)
            return fm_fail(FM_ERR_BAD_SHAPE, "%s=%lld is outside [0, %d] (CUTLASS problem shapes are int)", names[i],
                           (long long)v[i], FM_PLAN_DIM_MAX);
    return FM_OK;
}

fm_status fm_plan_check(const fm_kernel_config *cfg, int64_t rows, int64_t n, int64_t k, int64_t experts, int sms,
                        fm_plan_result *out)
{
    fm_clear_error();
    if (!cfg || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_check: NULL argument");
    FM_CHECK(fm_plan_problem_check(rows, n, k, experts));
    if (sms < 0) return fm_fail(FM_ERR_BAD_SHAPE, "sms=%d is negative", sms);
    if (k && cfg->tile_k > 0 && k % cfg->tile_k)
        return fm_fail(FM_ERR_BAD_SHAPE, "K=%lld is not a multiple of the tile's K=%d", (long long)k, cfg->tile_k);
    fm_kernel_config r;
    fm_model_out m;
    FM_CHECK(fm_plan_model_resolved(cfg, &r, &m));
    const fm_arch_info *arch = NULL;
    FM_CHECK(fm_arch_get(r.cc, &arch));

    int own = fm_family_is_fp4moe(r.family);
    if (own && fm_fp4moe_compiled(&r) < 0)
        return fm_fail(FM_ERR_UNSUPPORTED,
                       "%s %dx%dx%d, %d warps, %d stages is not compiled in, so it cannot launch (leave --stages auto "
                       "for the compiled count)",
                       fm_family_name(r.family), r.tile_m, r.tile_n, r.tile_k, r.warps, r.stages);
    fm_plan_result res;
    memset(&res, 0, sizeof res);
    res.bytes = m.bd;
    res.limit_bytes = arch->smem_block_optin;
    res.fits = m.bd.total <= res.limit_bytes;
    if (rows > 0 && n > 0) {
        int64_t e = experts > 0 ? experts : 1;
        /* swap-AB (mma.sync): one CTA per (expert, N block), looping over passes of
         * tile_m rows; wgmma: one CTA per (expert, pass, N block), as CUTLASS's M tiles;
         * a 2-SM UMMA tile occupies two SMs */
        int64_t mt = r.family == FM_FAMILY_FP4MOE_MMA ? 1 : (rows + r.tile_m - 1) / r.tile_m;
        double tiles = (double)e * (double)mt * (double)((n + r.tile_n - 1) / r.tile_n);
        if (tiles > 0x1p62) /* e.g. 2^31 experts x 2^24 M tiles x 2^26 N tiles */
            return fm_fail(FM_ERR_BAD_SHAPE, "the problem has %.3g CTA tiles, more than 2^62: not a launchable grid",
                           tiles);
        res.tiles = e * mt * ((n + r.tile_n - 1) / r.tile_n);
        int per = r.family == FM_FAMILY_CUTLASS_SM100 && r.schedule == FM_SCHED_2SM ? 2 : 1;
        if (sms > 0) res.waves = (double)res.tiles * per / sms;
    }
    if (own) {
        fm_check_fp4moe(&r, &m, res.limit_bytes, &res);
        *out = res;
        return FM_OK;
    }
    res.auto_stages = m.auto_stages;
    /* what the builder believes: its own kernel carve-out (capacity it subtracted before
     * dividing), the epilogue carve-out and its stages */
    size_t kcarve = m.capacity && m.capacity < res.limit_bytes ? res.limit_bytes - m.capacity : 0;
    res.builder_bytes = kcarve + m.carveout + (size_t)m.auto_stages * m.stage_bytes;
    res.builder_fits = m.auto_stages >= m.min_stages;
    for (int s = 32; s >= m.min_stages; s--) { /* the most stages that really fit */
        fm_kernel_config t = r;
        t.stages = s;
        fm_model_out mm;
        if (fm_plan_model_resolved(&t, &t, &mm) == FM_OK && mm.bd.total <= res.limit_bytes) {
            res.best_stages = s, res.best_bytes = mm.bd.total;
            break;
        }
    }
    fm_clear_error();

    int S = m.bd.stages;
    const char *how = cfg->stages ? "" : " auto";
    size_t lim = res.limit_bytes, tot = m.bd.total;
    if (res.fits) {
        snprintf(res.reason, sizeof res.reason, "fits: needs %zu B with %d%s stages <= %zu B opt-in (%zu B spare)",
                 tot, S, how, lim, lim - tot);
    } else {
        char fix[128];
        if (res.best_stages) snprintf(fix, sizeof fix, "fits with %d stages: %zu B", res.best_stages, res.best_bytes);
        else snprintf(fix, sizeof fix, "no stage count fits: use a smaller tile or the nosmem epilogue");
        if (!cfg->stages && res.builder_fits)
            snprintf(res.reason, sizeof res.reason,
                     "needs %zu B with %d auto stages > %zu B opt-in (%zu B over); the builder counted %zu B and left "
                     "out %zu B of padding, %zu B of tensor maps and %zu B of scheduler storage; %s",
                     tot, S, lim, tot - lim, res.builder_bytes, m.bd.padding, m.bd.tensormaps, m.bd.scheduler, fix);
        else
            snprintf(res.reason, sizeof res.reason, "needs %zu B with %d%s stages > %zu B opt-in (%zu B over); %s",
                     tot, S, how, lim, tot - lim, fix);
    }
    *out = res;
    return FM_OK;
}
