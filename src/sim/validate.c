/* validate.c - the roofline against measured grouped-GEMM times.
 *
 * Why: the simulator's tokens/s figures are only as good as its per-GEMM time.
 * A measured row (bench/h200_fp4moe_gemm.csv, from bench/RESULTS.md) timed
 * `experts` experts of shape N x K with exactly `rows` rows each, so the
 * roofline is asked the same question with no routing in between: every expert
 * active, rows x experts routed rows, experts x ceil(rows / tile_m) tiles of the
 * tile the configured kernel picks for that many rows.  The same cost function
 * as a simulated step (fm_sim_gemm_roofline) gives the prediction, so what is
 * validated is what the simulator uses.
 *
 * Errors are ratios, (pred - measured) / measured, summarised per regime of
 * rows per expert (decode 1-32, mid 33-256, large 257+) because the kernel is
 * limited by different things there (weight streaming; mma.sync issue).
 * fm_sim_fit_eff fits the two efficiencies on a grid; the fit minimises the
 * mean |log ratio| so a 2x miss counts the same whichever way it goes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fm_internal.h"
#include "sim_internal.h"

static int regime_of(double rows) { return rows <= 32 ? 0 : rows <= 256 ? 1 : 2; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One measured row through the roofline of ctx x (x->cfg's GPU/effs/kernel). */
static void predict(fm_sim_ctx *x, const fm_sim_measured_point *mp, fm_sim_check_point *cp)
{
    /* the tile pick reads FC1's shape and the local experts: make them this row's */
    x->shape.n[0] = mp->n;
    x->shape.k[0] = mp->k;
    x->shape.local_experts = mp->experts;
    int tn, tk, fp;
    int tile_m = fm_sim_pick_tile(x, mp->rows, &tn, &tk, &fp);
    fm_sim_moments mo = {0};
    mo.active = mp->experts;
    mo.rows = mp->rows * mp->experts;
    mo.tiles = (double)mp->experts * ceil(mp->rows / tile_m);
    fm_sim_cost co;
    fm_sim_gemm_roofline(x, mp->n, mp->k, tile_m, &mo, &co);
    memset(cp, 0, sizeof *cp);
    cp->meas = *mp;
    cp->tile_m = tile_m;
    cp->mem_us = co.mem_us;
    cp->compute_us = co.compute_us;
    cp->pred_us = co.gemm_us[0];
    cp->bound = co.compute_us > co.mem_us ? FM_SIM_COMPUTE_BOUND : FM_SIM_BW_BOUND;
    cp->rel_err = (cp->pred_us - mp->us) / mp->us;
}

static fm_status summarise(const fm_sim_check_point *p, int n, fm_sim_check_summary *s)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!v) return fm_fail(FM_ERR_OOM, "fm_sim_validate: no memory");
    memset(s, 0, sizeof *s);
    for (int g = 0; g <= FM_SIM_REGIMES; g++) {
        int m = 0;
        double bias = 0;
        for (int i = 0; i < n; i++) {
            if (g < FM_SIM_REGIMES && regime_of(p[i].meas.rows) != g) continue;
            v[m++] = fabs(p[i].rel_err);
            bias += p[i].rel_err;
        }
        s->n[g] = m;
        if (!m) continue;
        qsort(v, (size_t)m, sizeof *v, cmp_double);
        s->median_abs[g] = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
        s->max_abs[g] = v[m - 1];
        s->mean_bias[g] = bias / m;
    }
    free(v);
    return FM_OK;
}

/* Validate with an initialised ctx; out has room for every row of m. */
static int run_rows(fm_sim_ctx *x, const fm_sim_measured *m, fm_sim_check_point *out)
{
    const char *gpu = x->cfg.gpu.name ? x->cfg.gpu.name : "";
    int n = 0;
    for (int i = 0; i < fm_sim_measured_rows(m); i++) {
        fm_sim_measured_point mp;
        if (fm_sim_measured_get(m, i, &mp) != FM_OK) continue; /* cannot happen: i in range */
        if (strcasecmp(mp.gpu, gpu) || mp.fmt != x->cfg.model.wfmt) continue;
        predict(x, &mp, &out[n++]);
    }
    return n;
}

static fm_status ctx_for(const fm_sim_config *c, const fm_sim_measured *m, fm_sim_ctx *x)
{
    if (!m) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_validate: measured table is NULL");
    fm_sim_config cc;
    if (c) {
        cc = *c;
        cc.measured = NULL; /* the roofline is what is validated; shapes come from each row */
    }
    return fm_sim_ctx_init(x, c ? &cc : NULL);
}

fm_status fm_sim_validate(const fm_sim_config *c, const fm_sim_measured *m, fm_sim_check_point *out, int cap, int *n,
                          fm_sim_check_summary *summary)
{
    fm_clear_error();
    if (!out || !n || cap < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_validate: NULL out/n or cap < 0");
    fm_sim_ctx x;
    FM_CHECK(ctx_for(c, m, &x));
    int rows = fm_sim_measured_rows(m);
    fm_sim_check_point *tmp = malloc(sizeof *tmp * (size_t)(rows > 0 ? rows : 1));
    fm_status st = tmp ? FM_OK : fm_fail(FM_ERR_OOM, "fm_sim_validate: no memory");
    int got = tmp ? run_rows(&x, m, tmp) : 0;
    fm_sim_check_summary s;
    if (st == FM_OK && got == 0)
        st = fm_fail(FM_ERR_NOT_FOUND, "measured table has no %s rows for gpu '%s'",
                     fm_format_traits_get(c->model.wfmt) ? fm_format_traits_get(c->model.wfmt)->name : "?",
                     c->gpu.name ? c->gpu.name : "?");
    for (int i = 0; st == FM_OK && i < got; i++)
        if (!isfinite(tmp[i].pred_us) || !isfinite(tmp[i].rel_err) || !isfinite(tmp[i].mem_us) ||
            !isfinite(tmp[i].compute_us))
            st = fm_fail(FM_ERR_NONFINITE,
                         "fm_sim_validate: the prediction for %s %d x %dx%d at %g rows comes out %g us: the GPU's "
                         "figures (%g GB/s, %g TFLOP/s) are too small for the model's arithmetic",
                         tmp[i].meas.gemm, tmp[i].meas.experts, tmp[i].meas.n, tmp[i].meas.k, tmp[i].meas.rows,
                         tmp[i].pred_us, c->gpu.mem_gbs, c->gpu.bf16_tflops);
    if (st == FM_OK && got > cap) {
        *n = got;
        st = fm_fail(FM_ERR_INVALID_ARG, "fm_sim_validate: %d points, room for %d", got, cap);
    }
    if (st == FM_OK) st = summarise(tmp, got, &s);
    if (st == FM_OK) {
        memcpy(out, tmp, sizeof *tmp * (size_t)got);
        *n = got;
        if (summary) *summary = s;
    }
    free(tmp);
    fm_sim_ctx_free(&x);
    return st;
}

/* The fit's grid: efficiency i * 0.005 for i in 1..FIT_N. */
#define FIT_N 200
#define FIT_STEP 0.005

typedef struct {
    double ratio; /* compute_us / mem_us at efficiency 1: memory-bound where ce >= ratio * be */
    double mem, cmp, meas;
} fit_pt;

static int cmp_ratio(const void *a, const void *b)
{
    double x = ((const fit_pt *)a)->ratio, y = ((const fit_pt *)b)->ratio;
    return (x > y) - (x < y);
}

/* Why not the plain scan: it evaluated a log per point at each of the 40,000
 * grid pairs (0.44 ms a CSV row).  A point is memory-bound at (be, ce) iff
 * ratio <= ce / be, so with the points sorted by ratio the memory-bound ones are
 * a prefix of p(i, j) points at every pair, and
 *   err(i, j) = sum_{q < p} |log((mem_q / be_i + L) / meas_q)|     (prefix sums per i)
 *             + sum_{q >= p} |log((cmp_q / ce_j + L) / meas_q)|    (suffix sums per j)
 * Pass one walks i computing its prefix sums (one log per point) and reads them
 * at the 200 counts p(i, .); pass two does the same for j's suffix sums.  The
 * grid minimum (first of equals, as the scan found it) is then exact in
 * O(400 points + 40,000 log points) time and O(points + 40,000) memory. */
static fm_status fit_grid(fit_pt *pt, int n, double launch, double *bw_eff, double *compute_eff)
{
    qsort(pt, (size_t)n, sizeof *pt, cmp_ratio);
    int *cnt = malloc(sizeof(int) * FIT_N * FIT_N);
    double *errm = malloc(sizeof(double) * FIT_N * FIT_N), *acc = malloc(sizeof(double) * ((size_t)n + 1));
    if (!cnt || !errm || !acc) {
        free(cnt);
        free(errm);
        free(acc);
        return fm_fail(FM_ERR_OOM, "fm_sim_fit_eff: no memory");
    }
    for (int i = 1; i <= FIT_N; i++) /* p(i, j): points with ratio <= ce_j / be_i */
        for (int j = 1, q = 0; j <= FIT_N; j++) {
            double lim = (double)j / i; /* ce / be on the grid */
            while (q < n && pt[q].ratio <= lim) q++;
            cnt[(i - 1) * FIT_N + (j - 1)] = q;
        }
    for (int i = 1; i <= FIT_N; i++) {
        double be = FIT_STEP * i;
        acc[0] = 0;
        for (int q = 0; q < n; q++) acc[q + 1] = acc[q] + fabs(log((pt[q].mem / be + launch) / pt[q].meas));
        for (int j = 0; j < FIT_N; j++) errm[(i - 1) * FIT_N + j] = acc[cnt[(i - 1) * FIT_N + j]];
    }
    for (int j = 1; j <= FIT_N; j++) {
        double ce = FIT_STEP * j;
        acc[n] = 0;
        for (int q = n - 1; q >= 0; q--) acc[q] = acc[q + 1] + fabs(log((pt[q].cmp / ce + launch) / pt[q].meas));
        for (int i = 0; i < FIT_N; i++) errm[i * FIT_N + (j - 1)] += acc[cnt[i * FIT_N + (j - 1)]];
    }
    double best = INFINITY;
    int bi = -1;
    for (int g = 0; g < FIT_N * FIT_N; g++)
        if (errm[g] < best - 1e-12) {
            best = errm[g];
            bi = g;
        }
    free(cnt);
    free(errm);
    free(acc);
    if (bi < 0 || !isfinite(best))
        return fm_fail(FM_ERR_NONFINITE, "fm_sim_fit_eff: the fit's error is not finite (%g) at every grid point",
                       best);
    *bw_eff = FIT_STEP * (bi / FIT_N + 1);
    *compute_eff = FIT_STEP * (bi % FIT_N + 1);
    return FM_OK;
}

fm_status fm_sim_fit_eff(const fm_sim_config *c, const fm_sim_measured *m, double *bw_eff, double *compute_eff)
{
    fm_clear_error();
    if (!bw_eff || !compute_eff) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_fit_eff: NULL output");
    fm_sim_ctx x;
    FM_CHECK(ctx_for(c, m, &x));
    int rows = fm_sim_measured_rows(m);
    fm_sim_check_point *p = malloc(sizeof *p * (size_t)(rows > 0 ? rows : 1));
    fit_pt *pt = malloc(sizeof *pt * (size_t)(rows > 0 ? rows : 1));
    if (!p || !pt) {
        free(p);
        free(pt);
        fm_sim_ctx_free(&x);
        return fm_fail(FM_ERR_OOM, "fm_sim_fit_eff: no memory");
    }
    /* the roofline is max(a / bw_eff, b / compute_eff) + launch: evaluate the
     * terms once at efficiency 1, then search the grid without re-picking tiles */
    x.cfg.bw_eff = x.cfg.compute_eff = 1.0;
    int n = run_rows(&x, m, p);
    fm_status st = FM_OK;
    for (int q = 0; q < n && st == FM_OK; q++) {
        pt[q] = (fit_pt){p[q].compute_us / p[q].mem_us, p[q].mem_us, p[q].compute_us, p[q].meas.us};
        if (!isfinite(p[q].mem_us) || !isfinite(p[q].compute_us) || !isfinite(pt[q].ratio) || !(p[q].mem_us > 0))
            st = fm_fail(FM_ERR_NONFINITE, "fm_sim_fit_eff: row %d's roofline terms (%g, %g us) are not finite", q,
                         p[q].mem_us, p[q].compute_us);
    }
    double bb = 0, bc = 0;
    if (st == FM_OK && n == 0)
        st = fm_fail(FM_ERR_NOT_FOUND, "measured table has no rows for gpu '%s' and the model's format",
                     c->gpu.name ? c->gpu.name : "?");
    if (st == FM_OK) st = fit_grid(pt, n, x.cfg.launch_us, &bb, &bc);
    free(p);
    free(pt);
    fm_sim_ctx_free(&x);
    if (st != FM_OK) return st;
    *bw_eff = bb;
    *compute_eff = bc;
    return FM_OK;
}

static const char *k_regime_names[FM_SIM_REGIMES + 1] = {"1-32 rows", "33-256 rows", "257+ rows", "all"};

fm_status fm_sim_write_validation(FILE *f, const fm_sim_config *c, const fm_sim_check_point *p, int n,
                                  const fm_sim_check_summary *s)
{
    fm_clear_error();
    if (!f || !c || (!p && n > 0) || n < 0 || !s)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_write_validation: NULL argument or n < 0");
    fprintf(f, "roofline vs measured: gpu %s (%.0f GB/s, %.0f TFLOP/s listed), %s kernel, bw_eff %.3f, "
               "compute_eff %.3f, launch %.1f us\n",
            c->gpu.name ? c->gpu.name : "?", c->gpu.mem_gbs, c->gpu.bf16_tflops,
            c->kernel == FM_SIM_KERNEL_FP4MOE ? "fp4moe swap-AB" : "CUTLASS", c->bw_eff, c->compute_eff,
            c->launch_us);
    /* legend: experts x N x K per expert; tile = rows per tile; mem/cmp = roofline terms */
    fprintf(f, "%-6s %7s %5s %5s %6s %5s %10s %10s %8s %8s %5s %8s\n", "gemm", "experts", "n", "k", "rows", "tile",
            "meas_us", "pred_us", "mem_us", "cmp_us", "bound", "err%");
    for (int i = 0; i < n; i++)
        fprintf(f, "%-6s %7d %5d %5d %6g %5d %10.1f %10.1f %8.1f %8.1f %5s %+8.1f\n", p[i].meas.gemm,
                p[i].meas.experts, p[i].meas.n, p[i].meas.k, p[i].meas.rows, p[i].tile_m, p[i].meas.us, p[i].pred_us,
                p[i].mem_us, p[i].compute_us, p[i].bound == FM_SIM_COMPUTE_BOUND ? "cmp" : "bw", 100 * p[i].rel_err);
    fprintf(f, "\nsummary (|err| = |pred - meas| / meas; bias < 0: the model is optimistic)\n");
    for (int g = 0; g <= FM_SIM_REGIMES; g++)
        fprintf(f, "regime %-12s points %3d  median |err| %6.1f %%  max |err| %6.1f %%  bias %+6.1f %%\n",
                k_regime_names[g], s->n[g], 100 * s->median_abs[g], 100 * s->max_abs[g], 100 * s->mean_bias[g]);
    return ferror(f) ? fm_fail(FM_ERR_IO, "simulate: writing the validation failed") : FM_OK;
}

fm_status fm_sim_write_validation_csv(FILE *f, const fm_sim_check_point *p, int n)
{
    fm_clear_error();
    if (!f || (!p && n > 0) || n < 0)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_write_validation_csv: NULL argument or n < 0");
    fprintf(f, "gpu,format,gemm,experts,n,k,rows_per_expert,measured_us,tile_m,mem_us,compute_us,pred_us,bound,"
               "rel_err\n");
    for (int i = 0; i < n; i++) {
        const fm_format_traits *t = fm_format_traits_get(p[i].meas.fmt);
        fprintf(f, "%s,%s,%s,%d,%d,%d,%g,%g,%d,%.3f,%.3f,%.3f,%s,%.5f\n", p[i].meas.gpu, t ? t->name : "?",
                p[i].meas.gemm, p[i].meas.experts, p[i].meas.n, p[i].meas.k, p[i].meas.rows, p[i].meas.us,
                p[i].tile_m, p[i].mem_us, p[i].compute_us, p[i].pred_us,
                p[i].bound == FM_SIM_COMPUTE_BOUND ? "compute" : "bw", p[i].rel_err);
    }
    return ferror(f) ? fm_fail(FM_ERR_IO, "simulate: writing the validation failed") : FM_OK;
}
