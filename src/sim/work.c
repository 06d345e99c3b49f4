/* work.c - what a simulation will cost before it runs, so an absurd setting is
 * refused with a message instead of running for hours in silence.
 *
 * Why: the exact model is cheap, but three parts grow with the settings:
 *  - router draws: --mc N samples N steps of T tokens x top_k draws each
 *    (--mc 100000 with 1M tokens a step is 8e11 draws, ~11 h), and under skew the
 *    pick probabilities are estimated once from FM_SIM_PI_TOKENS tokens; a draw
 *    that keeps hitting taken experts falls back to a walk over all experts
 *    (top-k close to the experts), so a token can cost O(E k);
 *  - binomial terms: about 20 sqrt(T p (1 - p)) per distinct expert and point
 *    (every expert is distinct under skew), each point of the crossing search
 *    1..--sweep-max included;
 *  - one planner ranking per point for the tile.
 * The estimate adds those up with per-unit costs measured on the development
 * machine (one x86 core, -O2; within a factor of ~2 of what the calls take) and
 * names the dominant part and the flags that shrink it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fm_internal.h"
#include "sim_internal.h"

/* per-unit costs, ns (measured: docs/simulate.md "Work bound") */
#define NS_DRAW 35.0      /* one rng draw + binary search of the popularity cdf (+ log2 E below) */
#define NS_DRAW_LOG 2.0   /* per level of the binary search */
#define NS_WALK 2.5       /* per expert of the fallback walk over the remaining mass */
#define NS_COUNT 2.0      /* per expert of one sampled step's moments */
#define NS_PI_LOOP 15.0   /* per expert: active-expert sum of a point (log1p, expm1) */
#define NS_BINOM 130.0    /* per distinct expert: the mode by lgamma */
#define NS_TERM 3.0       /* per binomial term */
#define NS_CURVE 1.2      /* per measured point scanned for one curve evaluation */
#define NS_PLAN 12000.0   /* one planner ranking for the tile */

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

double fm_sim_draw_ns(const double *cdf, int E, int k)
{
    double *w = malloc(sizeof(double) * (size_t)E);
    if (!w) return INFINITY;
    for (int i = 0; i < E; i++) w[i] = cdf[i] - (i ? cdf[i - 1] : 0.0);
    qsort(w, (size_t)E, sizeof *w, cmp_desc);
    /* pessimistic: the experts already taken are the most popular ones, so the
     * mass q a draw can hit in vain is the largest possible */
    double q = 0, ns = 0, draw = NS_DRAW + NS_DRAW_LOG * log2((double)E + 1);
    for (int j = 0; j < k; j++) {
        double tries = q < 1.0 - 1.0 / 64 ? 1.0 / (1.0 - q) : 64.0;
        ns += tries * draw + pow(fmin(q, 1.0), 64) * 2.0 * E * NS_WALK;
        q += w[j];
    }
    free(w);
    return ns;
}

/* Cost of one exact point of T tokens, ns. */
static double point_ns(const fm_sim_config *c, int T, int with_dist, double curve_pts)
{
    int E = c->model.n_experts, k = c->model.top_k;
    int groups = c->parallel == FM_PARALLEL_EP ? c->gpus : 1;
    int span = c->parallel == FM_PARALLEL_EP ? E / c->gpus : E;
    double p = (double)k / E;
    double terms = 20.0 * sqrt(T * p * (1.0 - p)) + 4.0;
    double term_ns = NS_TERM + (curve_pts > 0 ? 2.0 * NS_CURVE * curve_pts : 0.0);
    double distinct = c->skew > 0 ? span : 1;
    double ns = E * NS_PI_LOOP + NS_PLAN + groups * distinct * (NS_BINOM + terms * term_ns);
    if (with_dist) ns += span * (NS_BINOM + terms * term_ns) + 2.0 * T;
    return ns;
}

fm_status fm_sim_estimate_parts(const fm_sim_config *c, const int *mr, int n, int dense_hi, double part[4])
{
    /* part: [0] router draws (Monte-Carlo), [1] popularity estimate, [2] the
     * simulated points, [3] the crossing search */
    int E = c->model.n_experts, k = c->model.top_k;
    double *cdf = malloc(sizeof(double) * (size_t)E);
    if (!cdf) return fm_fail(FM_ERR_OOM, "simulate: no memory for %d experts", E);
    fm_status st = fm_sim_popularity_cdf(c, cdf);
    double draw = st == FM_OK ? fm_sim_draw_ns(cdf, E, k) : 0;
    free(cdf);
    FM_CHECK(st);
    int groups = c->parallel == FM_PARALLEL_EP ? c->gpus : 1;
    double curve_pts = c->measured ? fmin(fm_sim_measured_rows(c->measured), FM_SIM_CURVE_MAX) : 0;
    memset(part, 0, 4 * sizeof(double));
    int inits = (n > 0) + (dense_hi > 0); /* each call estimates pi once */
    if (c->skew > 0) part[1] = inits * (double)FM_SIM_PI_TOKENS * draw;
    for (int i = 0; i < n; i++) {
        int T = mr[i] * c->tokens_per_step;
        part[2] += point_ns(c, T, 1, curve_pts);
        part[0] += (double)c->mc_steps * ((double)T * draw + E * (NS_COUNT + 2.0 * NS_CURVE * curve_pts) +
                                          groups * 100.0);
    }
    for (int m = 1; m <= dense_hi; m++) part[3] += point_ns(c, m * c->tokens_per_step, 0, curve_pts);
    for (int i = 0; i < 4; i++) part[i] *= 1e-9;
    return FM_OK;
}

static void duration(double s, char *buf, size_t n)
{
    if (s < 10) snprintf(buf, n, "%.1f s", s);
    else if (s < 120) snprintf(buf, n, "%.0f s", s);
    else if (s < 7200) snprintf(buf, n, "%.0f min", s / 60);
    else if (s < 2 * 86400) snprintf(buf, n, "%.1f h", s / 3600);
    else snprintf(buf, n, "%.0f days", s / 86400);
}

/* The dominant part and what lowers it. */
static void describe(const fm_sim_config *c, const int *mr, int n, int dense_hi, const double part[4], char *what,
                     size_t cap)
{
    int big = 0;
    for (int i = 1; i < 4; i++)
        if (part[i] > part[big]) big = i;
    int mx = 1;
    for (int i = 0; i < n; i++)
        if (mr[i] > mx) mx = mr[i];
    char d[32];
    duration(part[big], d, sizeof d);
    if (big == 0)
        snprintf(what, cap,
                 "%s of it Monte-Carlo: %d steps x up to %d tokens x top-%d router draws; lower --mc, "
                 "--max-running-requests or --tokens-per-step",
                 d, c->mc_steps, mx * c->tokens_per_step, c->model.top_k);
    else if (big == 1)
        snprintf(what, cap,
                 "%s of it estimating expert popularity under --skew %g with top-%d of %d experts (draws keep "
                 "hitting taken experts); lower --topk or --skew",
                 d, c->skew, c->model.top_k, c->model.n_experts);
    else if (big == 2)
        snprintf(what, cap, "%s of it the %d simulated point(s) at up to %d tokens a step; lower "
                            "--max-running-requests or --tokens-per-step",
                 d, n, mx * c->tokens_per_step);
    else
        snprintf(what, cap,
                 "%s of it the exact crossing search over 1..%d requests x %d tokens%s; lower --sweep-max or "
                 "--tokens-per-step",
                 d, dense_hi, c->tokens_per_step, c->skew > 0 ? " (every expert distinct under --skew)" : "");
}

fm_status fm_sim_estimate_seconds(const fm_sim_config *c, const int *mr, int n, int dense_hi, double *seconds,
                                  char *what, int cap)
{
    fm_clear_error();
    if (!seconds || n < 0 || (n > 0 && !mr) || dense_hi < 0 || dense_hi > FM_SIM_MAX_RUNNING || (what && cap < 1))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_estimate_seconds: NULL argument or n=%d / dense_hi=%d out of range",
                       n, dense_hi);
    if (!c) return fm_fail(FM_ERR_INVALID_ARG, "simulate: config is NULL");
    fm_sim_config cc = *c;
    cc.max_running = dense_hi > 0 ? dense_hi : 1;
    for (int i = 0; i < n; i++) {
        if (mr[i] < 1 || mr[i] > FM_SIM_MAX_RUNNING)
            return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_estimate_seconds: max_running[%d]=%d must be in [1, %d]", i,
                           mr[i], FM_SIM_MAX_RUNNING);
        if (mr[i] > cc.max_running) cc.max_running = mr[i];
    }
    if (n == 0 && dense_hi == 0) cc.max_running = c->max_running;
    FM_CHECK(fm_sim_config_check(&cc));
    double part[4];
    FM_CHECK(fm_sim_estimate_parts(&cc, mr, n, dense_hi, part));
    *seconds = part[0] + part[1] + part[2] + part[3];
    if (what) describe(&cc, mr, n, dense_hi, part, what, (size_t)cap);
    return FM_OK;
}

fm_status fm_sim_work_check(const fm_sim_config *c, const int *mr, int n, int dense_hi)
{
    double part[4];
    FM_CHECK(fm_sim_estimate_parts(c, mr, n, dense_hi, part));
    double s = part[0] + part[1] + part[2] + part[3];
    if (s <= FM_SIM_MAX_SECONDS) return FM_OK;
    char what[320], d[32], lim[32];
    describe(c, mr, n, dense_hi, part, what, sizeof what);
    duration(s, d, sizeof d);
    duration(FM_SIM_MAX_SECONDS, lim, sizeof lim);
    return fm_fail(FM_ERR_INVALID_ARG, "simulate: refusing about %s of work (the limit is %s): %s", d, lim, what);
}
