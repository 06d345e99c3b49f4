/* candidates.c - every tile that could serve a (GPU, format, epilogue, shape), checked
 * and ranked, across kernel families: the CUTLASS catalogue of the GPU's architecture
 * next to fp4moe's own compiled swap-AB tiles (and, on sm_90, its wgmma tiles), so
 * that small per-expert batches (decode) are seen to prefer the small-M kernels and
 * large ones (prefill) CUTLASS.
 *
 * The ranking is an estimate, not a measurement: per candidate
 *   t_mem = (weight bytes x times they are read + activation + output bytes) / bandwidth
 *   t_cmp = waves x (padded FLOPs of one CTA tile) / (tensor rate / SMs)
 *   est   = max(t_mem, t_cmp)
 * CUTLASS tiles read each expert's weights once per 128/256-row M tile and run at the
 * format's tensor rate; fp4moe's kernels re-read the weights once per pass of 8*nt
 * tokens and stage BF16 activations.  Their rate is the GPU's dense BF16 rate, which
 * on Hopper is the wgmma rate: fp4moe-wgmma gets it; fp4moe-mma's mma.sync gets
 * 2/3 of it on an architecture with wgmma (FM_MMA_SYNC_ON_WGMMA_ARCH: the
 * FlashAttention-3 paper, Shah et al. 2024, finds mma.sync reaches about 2/3 of the
 * H100's tensor-core peak; an assumption here, not a measurement of this kernel) and
 * all of it elsewhere (mma.sync is the BF16 tensor-core path of sm_80 and sm_120).
 * The swap-AB CTA loops over an expert's passes (its padded FLOPs are passes x tile),
 * the wgmma grid has one CTA per pass (waves count them).  Where two estimates
 * are within 2% (both memory-bound, typically), the roofline cannot tell them apart:
 * the one with less wasted (padded) rows ranks first, then the one with fewer bytes
 * of shared memory.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/fm_kernels_smem.h"
#include "plan_internal.h"

#define FM_CAND_MAX 64
#define FM_TIE 1.02 /* estimates within 2% of a group's best are a tie */
#define FM_MMA_SYNC_ON_WGMMA_ARCH (2.0 / 3.0) /* mma.sync's share of the BF16 rate where wgmma exists */

/* CUTLASS catalogues: M N K (K doubles for 8-bit operands on sm_90). */
static const int k_tiles_sm120[][3] = {
    /* M    N    K */
    {64, 128, 128},  {128, 64, 128},  {128, 128, 128}, {128, 128, 256},
    {128, 256, 128}, {256, 128, 128}, {128, 256, 256}, {256, 128, 256},
};
static const int k_tiles_sm90[][3] = {
    {64, 128, 64}, {128, 64, 64}, {128, 128, 64}, {128, 256, 64}, {256, 128, 64}, {64, 256, 64},
};
static const int k_tiles_sm100[][3] = { /* 128 rows: 1-SM; 256 rows: 2-SM pair, cluster 2x1 */
    {128, 64, 256}, {128, 128, 256}, {128, 256, 256}, {256, 64, 256}, {256, 128, 256}, {256, 256, 256},
};

static double tensor_tflops(const fm_gpu_info *g, fm_elem ab)
{
    double r = ab == FM_ELEM_FP8 ? g->fp8_tflops : (ab == FM_ELEM_NVFP4 || ab == FM_ELEM_MXFP4) ? g->fp4_tflops : 0;
    return r > 0 ? r : g->bf16_tflops;
}

static int by_fit_est(const void *pa, const void *pb)
{
    const fm_plan_candidate *a = pa, *b = pb;
    if (a->res.fits != b->res.fits) return b->res.fits - a->res.fits;
    return (a->est_us > b->est_us) - (a->est_us < b->est_us);
}

static int by_tie(const void *pa, const void *pb)
{
    const fm_plan_candidate *a = pa, *b = pb;
    if (a->wasted_rows != b->wasted_rows) return (a->wasted_rows > b->wasted_rows) - (a->wasted_rows < b->wasted_rows);
    if (a->res.bytes.total != b->res.bytes.total) return a->res.bytes.total > b->res.bytes.total ? 1 : -1;
    return by_fit_est(pa, pb);
}

static int by_int(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    return (a > b) - (a < b);
}

/* Estimate one checked candidate (see the top of the file). */
static void estimate(const fm_gpu_info *g, fm_elem ab, int64_t rows, int64_t n, int64_t k, int64_t experts,
                     fm_plan_candidate *c)
{
    fm_kernel_family fam = c->cfg.family;
    int own = fm_family_is_fp4moe(fam);
    int64_t mt = (rows + c->cfg.tile_m - 1) / c->cfg.tile_m; /* M tiles, or fp4moe passes */
    c->wasted_rows = 1.0 - (double)rows / (double)(mt * c->cfg.tile_m);
    int wbits = fm_elem_bits(ab);
    double sf = ab == FM_ELEM_NVFP4 ? 1.0 / 8 : ab == FM_ELEM_MXFP4 ? 1.0 / 16 : 0; /* scale bytes per weight byte */
    double wbytes = (double)n * (double)k * wbits / 8.0 * (1.0 + sf);
    double abits = own ? 16 : wbits; /* fp4moe's kernels stage BF16 activations */
    double bytes = (double)experts * ((double)mt * wbytes + (double)rows * k * abits / 8.0 + (double)rows * n * 2.0);
    double flops = 2.0 * (double)experts * (double)rows * n * k;
    c->bytes_per_flop = bytes / flops;
    double waves = ceil(c->res.waves > 0 ? c->res.waves : 1);
    double rate = own ? g->bf16_tflops : tensor_tflops(g, ab);
    if (fam == FM_FAMILY_FP4MOE_MMA) {
        const fm_arch_info *arch = NULL;
        if (fm_arch_get(g->cc, &arch) == FM_OK && (arch->features & FM_FEAT_WGMMA)) rate *= FM_MMA_SYNC_ON_WGMMA_ARCH;
        fm_clear_error();
    }
    /* a swap-AB CTA loops over all the passes of its expert */
    double per_cta_m = fam == FM_FAMILY_FP4MOE_MMA ? (double)mt * c->cfg.tile_m : c->cfg.tile_m;
    double cta_flops = 2.0 * per_cta_m * c->cfg.tile_n * (double)k;
    int per = fam == FM_FAMILY_CUTLASS_SM100 && c->cfg.schedule == FM_SCHED_2SM ? 2 : 1;
    double t_mem = bytes / (g->mem_gbs * 1e3); /* B / (GB/s) in us */
    double t_cmp = waves * cta_flops / (rate * 1e6 / g->sms * per);
    c->est_us = t_mem > t_cmp ? t_mem : t_cmp;
}

fm_status fm_plan_candidates_in(unsigned families, const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab,
                                int64_t rows, int64_t n, int64_t k, int64_t experts, fm_plan_candidate *out,
                                size_t cap, size_t *count, size_t *total)
{
    return fm_plan_candidates_ver(families, 0, gpu, ab, epi, swap_ab, rows, n, k, experts, out, cap, count, total);
}

fm_status fm_plan_candidates_ver(unsigned families, int cutlass, const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi,
                                 int swap_ab, int64_t rows, int64_t n, int64_t k, int64_t experts,
                                 fm_plan_candidate *out, size_t cap, size_t *count, size_t *total)
{
    fm_clear_error();
    if (!gpu || !count || (!out && cap)) return fm_fail(FM_ERR_INVALID_ARG, "fm_plan_candidates: NULL argument");
    if (rows <= 0 || n <= 0 || k <= 0 || experts <= 0)
        return fm_fail(FM_ERR_BAD_SHAPE, "rows per expert, N, K and experts must be positive");
    FM_CHECK(fm_plan_problem_check(rows, n, k, experts));
    if (ab == FM_ELEM_VOID || ab == FM_ELEM_FP32 || (unsigned)ab >= FM_ELEM_COUNT)
        return fm_fail(FM_ERR_INVALID_ARG, "operand format %s is not a GEMM operand type (nvfp4 mxfp4 fp8 bf16 fp16)",
                       fm_elem_name(ab));
    if (!families) families = ~0u;
    fm_kernel_family cf = fm_family_for_cc(gpu->cc);
    const int(*tiles)[3] = NULL;
    size_t nt = 0;
    if (cf == FM_FAMILY_CUTLASS_SM90) tiles = k_tiles_sm90, nt = FM_ARRAY_LEN(k_tiles_sm90);
    if (cf == FM_FAMILY_CUTLASS_SM120) tiles = k_tiles_sm120, nt = FM_ARRAY_LEN(k_tiles_sm120);
    if (cf == FM_FAMILY_CUTLASS_SM100) tiles = k_tiles_sm100, nt = FM_ARRAY_LEN(k_tiles_sm100);
    if (!(families & FM_FAMILY_BIT(cf))) nt = 0;
    /* fp4moe's own families (FP4 weights only): swap-AB, then wgmma where the arch has it */
    int fp4 = ab == FM_ELEM_NVFP4 || ab == FM_ELEM_MXFP4;
    size_t ns = 0, nw = 0;
    const fm_tile *sw = fm_fp4moe_tiles(FM_FAMILY_FP4MOE_MMA, &ns);
    const fm_tile *wg = fm_fp4moe_tiles(FM_FAMILY_FP4MOE_WGMMA, &nw);
    if (!(families & FM_FAMILY_BIT(FM_FAMILY_FP4MOE_MMA)) || !fp4) ns = 0;
    if (!(families & FM_FAMILY_BIT(FM_FAMILY_FP4MOE_WGMMA)) || !fp4) nw = 0;
    fm_status wg_arch = FM_OK;
    if (nw) {
        const fm_arch_info *arch = NULL;
        FM_CHECK(fm_arch_get(gpu->cc, &arch));
        if ((wg_arch = fm_fp4moe_arch_check(FM_FAMILY_FP4MOE_WGMMA, arch)) != FM_OK) nw = 0; /* not on this arch */
    }
    if (!nt && !ns && !nw) {
        if (wg_arch != FM_OK) /* only wgmma asked for (with FP4), on an arch without it: say why */
            return fm_fail(FM_ERR_ARCH_MISMATCH, "%s (sm_%d): %s", gpu->name, gpu->cc, fm_last_error());
        return fm_fail(FM_ERR_UNSUPPORTED, "%s (sm_%d): no modelled kernel family in the set for %s operands",
                       gpu->name, gpu->cc, fm_elem_name(ab));
    }
    fm_clear_error();

    fm_plan_candidate all[FM_CAND_MAX];
    size_t got = 0;
    fm_status first_err = FM_OK;
    int tks[16];
    size_t nks = 0, tried = 0;
    for (size_t i = 0; i < nt + ns + nw && got + 2 <= FM_CAND_MAX; i++) {
        fm_plan_candidate c;
        memset(&c, 0, sizeof c);
        fm_kernel_config_init(&c.cfg);
        if (cutlass) c.cfg.cutlass = cutlass; /* the CUTLASS rows' version (fp4moe's own rows ignore it) */
        c.cfg.cc = gpu->cc;
        c.cfg.a = c.cfg.b = ab;
        c.cfg.epilogue = epi;
        c.cfg.swap_ab = swap_ab;
        if (epi == FM_EPI_FINALIZE) c.cfg.d = FM_ELEM_VOID;
        if (i < nt) {
            const int *t = tiles[i];
            c.cfg.family = cf;
            c.cfg.tile_m = t[0], c.cfg.tile_n = t[1];
            c.cfg.tile_k = (cf == FM_FAMILY_CUTLASS_SM90 && ab == FM_ELEM_FP8) ? 2 * t[2] : t[2];
            if (cf == FM_FAMILY_CUTLASS_SM100) {
                c.cfg.schedule = t[0] == 256 ? FM_SCHED_2SM : FM_SCHED_1SM;
                c.cfg.cluster_m = t[0] == 256 ? 2 : 1;
            } else c.cfg.schedule = t[0] < 128 ? FM_SCHED_PINGPONG : FM_SCHED_COOP;
        } else {
            int is_sw = i < nt + ns;
            const fm_tile *t = is_sw ? &sw[i - nt] : &wg[i - nt - ns];
            c.cfg.family = is_sw ? FM_FAMILY_FP4MOE_MMA : FM_FAMILY_FP4MOE_WGMMA;
            c.cfg.tile_m = 8 * t->nt, c.cfg.tile_n = t->warps * t->mt * 16, c.cfg.tile_k = t->kc;
            c.cfg.warps = t->warps, c.cfg.stages = t->stages, c.cfg.persistent = t->persist;
        }
        int seen = 0; /* the distinct tile Ks, for the error when K fits none */
        for (size_t q = 0; q < nks; q++) seen |= tks[q] == c.cfg.tile_k;
        if (!seen && nks < FM_ARRAY_LEN(tks)) tks[nks++] = c.cfg.tile_k;
        if (k % c.cfg.tile_k) continue; /* K must tile exactly */
        tried++;
        fm_status st = fm_plan_check(&c.cfg, rows, n, k, experts, gpu->sms, &c.res);
        if (st != FM_OK) {
            if (first_err == FM_OK) first_err = st;
            continue;
        }
        estimate(gpu, ab, rows, n, k, experts, &c);
        all[got++] = c;
        if (!fm_family_is_fp4moe(c.cfg.family) && !c.res.fits && c.res.best_stages >= 1 && !c.cfg.stages) {
            fm_plan_candidate f = c; /* the fix, as its own row */
            f.cfg.stages = c.res.best_stages;
            if (fm_plan_check(&f.cfg, rows, n, k, experts, gpu->sms, &f.res) == FM_OK) all[got++] = f;
        }
    }
    fm_clear_error();
    if (!tried) { /* every tile skipped: K is a multiple of none of them */
        qsort(tks, nks, sizeof tks[0], by_int);
        char list[128] = "";
        for (size_t q = 0; q < nks; q++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", q ? "/" : "", tks[q]);
        return fm_fail(FM_ERR_BAD_SHAPE, "K=%lld is not a multiple of any tile K of %s for %s operands: %s",
                       (long long)k, gpu->name, fm_elem_name(ab), list);
    }
    if (!got && first_err != FM_OK)
        return fm_fail(first_err, "no tile of the catalogue is valid for %s with %s operands", gpu->name,
                       fm_elem_name(ab));
    qsort(all, got, sizeof all[0], by_fit_est);
    for (size_t i = 0; i < got;) { /* ties: groups within FM_TIE of their best */
        size_t j = i + 1;
        while (j < got && all[j].res.fits == all[i].res.fits && all[j].est_us <= all[i].est_us * FM_TIE) j++;
        qsort(all + i, j - i, sizeof all[0], by_tie);
        i = j;
    }
    size_t w = got < cap ? got : cap;
    if (w) memcpy(out, all, w * sizeof all[0]);
    *count = w;
    if (total) *total = got;
    return FM_OK;
}

fm_status fm_plan_candidates(const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab, int64_t rows, int64_t n,
                             int64_t k, int64_t experts, fm_plan_candidate *out, size_t cap, size_t *count,
                             size_t *total)
{
    return fm_plan_candidates_in(FM_FAMILIES_CUTLASS, gpu, ab, epi, swap_ab, rows, n, k, experts, out, cap, count,
                                 total);
}
