/* check.c - the truthful check and ranked candidates.
 *
 * cuBLASLt manner: the return value says whether the query worked; the result says
 * whether the kernel can run, the real bytes, what CUTLASS's own arithmetic believed
 * (which is what can_implement() implies), the largest stage count that really
 * fits, waves on the GPU, and one line of reason with the fix.
 * Candidates are ranked by an estimate: max(weight+activation bytes / bandwidth,
 * padded FLOPs / tensor rate) per wave - a roofline, not a measurement.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "plan_internal.h"

fm_status fm_plan_check(const fm_kernel_config *cfg, int64_t rows, int64_t n, int64_t k, int64_t experts, int sms,
                        fm_plan_result *out)
{
    fm_clear_error();
    if (!cfg || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_check: NULL argument");
    if (rows < 0 || n < 0 || k < 0 || experts < 0 || sms < 0)
        return fm_fail(FM_ERR_BAD_SHAPE, "negative problem size");
    if (k && cfg->tile_k > 0 && k % cfg->tile_k)
        return fm_fail(FM_ERR_BAD_SHAPE, "K=%lld is not a multiple of the tile's K=%d", (long long)k, cfg->tile_k);
    fm_kernel_config r;
    fm_model_out m;
    FM_CHECK(fm_plan_model_resolved(cfg, &r, &m));
    const fm_arch_info *arch = NULL;
    FM_CHECK(fm_arch_get(r.cc, &arch));

    fm_plan_result res;
    memset(&res, 0, sizeof res);
    res.bytes = m.bd;
    res.limit_bytes = arch->smem_block_optin;
    res.fits = m.bd.total <= res.limit_bytes;
    res.auto_stages = m.auto_stages;
    res.builder_bytes = m.carveout + (size_t)m.auto_stages * m.stage_bytes;
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
    if (rows > 0 && n > 0) {
        int64_t e = experts > 0 ? experts : 1;
        res.tiles = e * ((rows + r.tile_m - 1) / r.tile_m) * ((n + r.tile_n - 1) / r.tile_n);
        if (sms > 0) res.waves = (double)res.tiles / sms;
    }

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

/* Catalogue of tiles per family: M N K (K doubles for 8-bit and 4-bit operands). */
static const int k_tiles_sm120[][3] = {
    /* M    N    K */
    {64, 128, 128},  {128, 64, 128},  {128, 128, 128}, {128, 128, 256},
    {128, 256, 128}, {256, 128, 128}, {128, 256, 256}, {256, 128, 256},
};
static const int k_tiles_sm90[][3] = {
    {64, 128, 64}, {128, 64, 64}, {128, 128, 64}, {128, 256, 64}, {256, 128, 64}, {64, 256, 64},
};

static double tensor_tflops(const fm_gpu_info *g, fm_elem ab)
{
    double r = ab == FM_ELEM_FP8 ? g->fp8_tflops : (ab == FM_ELEM_NVFP4 || ab == FM_ELEM_MXFP4) ? g->fp4_tflops : 0;
    return r > 0 ? r : g->bf16_tflops;
}

static int cand_cmp(const void *pa, const void *pb)
{
    const fm_plan_candidate *a = pa, *b = pb;
    if (a->res.fits != b->res.fits) return b->res.fits - a->res.fits;
    return (a->est_us > b->est_us) - (a->est_us < b->est_us);
}

fm_status fm_plan_candidates(const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab, int64_t rows, int64_t n,
                             int64_t k, int64_t experts, fm_plan_candidate *out, size_t cap, size_t *count,
                             size_t *total)
{
    fm_clear_error();
    if (!gpu || !count || (!out && cap)) return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_candidates: NULL argument");
    if (rows <= 0 || n <= 0 || k <= 0 || experts <= 0)
        return fm_fail(FM_ERR_BAD_SHAPE, "rows per expert, N, K and experts must be positive");
    int sm120 = gpu->cc == 120 || gpu->cc == 121;
    if (!sm120 && gpu->cc != 90)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s (sm_%d): no modelled grouped-GEMM family (sm_90 and sm_120/121 are)",
                       gpu->name, gpu->cc);
    size_t nt = sm120 ? FM_ARRAY_LEN(k_tiles_sm120) : FM_ARRAY_LEN(k_tiles_sm90);
    fm_plan_candidate all[2 * 8];
    size_t got = 0;
    fm_status first_err = FM_OK;
    for (size_t i = 0; i < nt; i++) {
        const int *t = sm120 ? k_tiles_sm120[i] : k_tiles_sm90[i];
        fm_plan_candidate c;
        memset(&c, 0, sizeof c);
        fm_kernel_config_init(&c.cfg);
        c.cfg.cc = gpu->cc;
        c.cfg.a = c.cfg.b = ab;
        c.cfg.tile_m = t[0], c.cfg.tile_n = t[1];
        c.cfg.tile_k = (!sm120 && ab == FM_ELEM_FP8) ? 2 * t[2] : t[2];
        c.cfg.schedule = t[0] < 128 ? FM_SCHED_PINGPONG : FM_SCHED_COOP;
        c.cfg.epilogue = epi;
        c.cfg.swap_ab = swap_ab;
        if (epi == FM_EPI_FINALIZE) c.cfg.d = FM_ELEM_VOID;
        if (k % c.cfg.tile_k) continue; /* K must tile exactly */
        fm_status st = fm_plan_check(&c.cfg, rows, n, k, experts, gpu->sms, &c.res);
        if (st != FM_OK) {
            if (first_err == FM_OK) first_err = st;
            continue;
        }
        int64_t mt = (rows + c.cfg.tile_m - 1) / c.cfg.tile_m;
        c.wasted_rows = 1.0 - (double)rows / (double)(mt * c.cfg.tile_m);
        double wbytes = (double)n * (double)k * fm_elem_bits(ab) / 8.0 * (1.0 + (ab == FM_ELEM_NVFP4 ? 1.0 / 8 : ab == FM_ELEM_MXFP4 ? 1.0 / 16 : 0));
        double bytes = (double)experts * ((double)mt * wbytes + (double)rows * k * fm_elem_bits(ab) / 8.0 + (double)rows * n * 2.0);
        double flops = 2.0 * (double)experts * (double)rows * n * k;
        c.bytes_per_flop = bytes / flops;
        /* each wave: every SM runs one CTA tile of 2*tm*tn*K FLOPs at 1/SMs of the peak rate */
        double waves = ceil(c.res.waves > 0 ? c.res.waves : 1);
        double t_mem = bytes / (gpu->mem_gbs * 1e3); /* B / (GB/s) in us */
        double t_cmp = waves * 2.0 * c.cfg.tile_m * c.cfg.tile_n * (double)k / (tensor_tflops(gpu, ab) * 1e6 / gpu->sms);
        c.est_us = t_mem > t_cmp ? t_mem : t_cmp;
        all[got++] = c;
        if (!c.res.fits && c.res.best_stages >= 2 && !c.cfg.stages) { /* the fix, as its own row */
            fm_plan_candidate f = c;
            f.cfg.stages = c.res.best_stages;
            if (fm_plan_check(&f.cfg, rows, n, k, experts, gpu->sms, &f.res) == FM_OK) all[got++] = f;
        }
    }
    fm_clear_error();
    if (!got && first_err != FM_OK)
        return fm_fail(first_err, "no tile of the catalogue is valid for %s with %s operands", gpu->name,
                       fm_elem_name(ab));
    qsort(all, got, sizeof all[0], cand_cmp);
    size_t w = got < cap ? got : cap;
    if (w) memcpy(out, all, w * sizeof all[0]);
    *count = w;
    if (total) *total = got;
    return FM_OK;
}
