/* dist.c - exact expectations over the rows each expert gets per step.
 *
 * An expert picked by each of T independent tokens with probability p gets
 * c ~ Binomial(T, p) rows.  What the GEMMs cost is a sum over experts of
 * functions of c (is it active, how many tiles of tile_m rows, the measured
 * time at c rows), so its expectation is a sum of E[f(c)] terms.  Those are
 * computed from the binomial terms around the mode: log-pmf at the mode by
 * lgamma, neighbours by the ratio recurrence, stopping once a term falls
 * below 1e-17 of the mode's (mass left out < 1e-15: far below the model's
 * own error).  Cost ~ 40 sqrt(T p) terms per expert, not T.
 */
#include <math.h>
#include <string.h>

#include "fm_internal.h"
#include "sim_internal.h"

void fm_sim_binom_each(int n, double p, fm_sim_pmf_fn fn, void *ctx)
{
    if (n <= 0 || p <= 0.0) {
        fn(0, 1.0, ctx);
        return;
    }
    if (p >= 1.0) {
        fn(n, 1.0, ctx);
        return;
    }
    int m = (int)floor((n + 1) * p);
    if (m > n) m = n;
    double lpm = lgamma(n + 1.0) - lgamma(m + 1.0) - lgamma(n - m + 1.0) + m * log(p) + (n - m) * log1p(-p);
    double pm = exp(lpm), odds = p / (1.0 - p), floor_ = pm * 1e-17;
    /* walk down to the low end first so fn sees increasing r */
    int lo = m;
    double plo = pm;
    while (lo > 0) {
        double q = plo * lo / (double)(n - lo + 1) / odds;
        if (q < floor_) break;
        plo = q;
        lo--;
    }
    double pr = plo;
    for (int r = lo; r <= n; r++) {
        if (r > m && pr < floor_) break;
        fn(r, pr, ctx);
        pr = pr * (double)(n - r) / (double)(r + 1) * odds;
    }
}

typedef struct {
    int                 tile_m;
    const fm_sim_curve *curve; /* [2] or NULL */
    double              tiles, meas[2];
    double             *pmf; /* mixture accumulator or NULL */
    double              weight;
} acc_ctx;

static void acc_term(int r, double prob, void *vp)
{
    acc_ctx *a = vp;
    a->tiles += prob * (double)((r + a->tile_m - 1) / a->tile_m);
    if (a->curve && r > 0) {
        a->meas[0] += prob * fm_sim_curve_eval(&a->curve[0], r);
        a->meas[1] += prob * fm_sim_curve_eval(&a->curve[1], r);
    }
    if (a->pmf) a->pmf[r] += a->weight * prob;
}

void fm_sim_exact_moments(const fm_sim_ctx *x, int e0, int e1, int T, int tile_m, fm_sim_moments *mo, double *pmf)
{
    memset(mo, 0, sizeof *mo);
    double last_p = -1, act = 0, tiles = 0, meas[2] = {0, 0};
    for (int e = e0; e < e1; e++) {
        double p = x->pi[e];
        if (p != last_p || pmf) { /* uniform routing: every expert alike, computed once */
            acc_ctx a = {tile_m, x->measured ? x->curve : NULL, 0, {0, 0}, pmf, 1.0 / (e1 - e0)};
            fm_sim_binom_each(T, p, acc_term, &a);
            act = p > 0 ? -expm1(T * log1p(-fmin(p, 1.0))) : 0.0;
            if (p >= 1.0) act = 1.0;
            tiles = a.tiles;
            meas[0] = a.meas[0];
            meas[1] = a.meas[1];
            last_p = p;
        }
        mo->active += act;
        mo->rows += T * p;
        mo->tiles += tiles;
        mo->meas_us[0] += meas[0];
        mo->meas_us[1] += meas[1];
    }
}

void fm_sim_count_moments(const fm_sim_ctx *x, const int32_t *counts, int e0, int e1, int tile_m, fm_sim_moments *mo)
{
    memset(mo, 0, sizeof *mo);
    for (int e = e0; e < e1; e++) {
        int c = counts[e];
        if (c <= 0) continue;
        mo->active += 1;
        mo->rows += c;
        mo->tiles += (c + tile_m - 1) / tile_m;
        if (x->measured) {
            mo->meas_us[0] += fm_sim_curve_eval(&x->curve[0], c);
            mo->meas_us[1] += fm_sim_curve_eval(&x->curve[1], c);
        }
    }
}
