/* routing.c - how tokens pick experts in the simulator: popularity, samplers and
 * the per-expert pick probabilities pi.
 *
 * Uniform routing (skew 0): each token picks top_k distinct experts uniformly,
 * so pi_i = top_k / E exactly.  Skewed routing: expert popularity is Zipf-like,
 * w = 1 / rank^skew, with ranks dealt to experts by a seeded permutation (so hot
 * experts land on random GPUs under EP, as load balancing leaves them), and a
 * token picks experts by successive weighted sampling without replacement -
 * the same law as "top-k of log w + Gumbel noise", i.e. a router whose logits
 * are popularity plus per-token noise.  Its pi_i has no closed form, so it is
 * estimated once from FM_SIM_PI_TOKENS seeded tokens (relative error about
 * 1/sqrt(65536 * pi_i): 2-4 % for typical pi).  Tokens are independent, so
 * given pi each expert's rows per step are exactly Binomial(T, pi_i).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fm_internal.h"
#include "sim_internal.h"

fm_status fm_sim_popularity_cdf(const fm_sim_config *c, double *cdf)
{
    int E = c->model.n_experts;
    if (c->skew == 0.0) {
        for (int i = 0; i < E; i++) cdf[i] = (double)(i + 1) / E;
        cdf[E - 1] = 1.0;
        return FM_OK;
    }
    int *perm = malloc(sizeof(int) * (size_t)E);
    double *w = malloc(sizeof(double) * (size_t)E);
    if (!perm || !w) {
        free(perm);
        free(w);
        return fm_fail(FM_ERR_OOM, "simulate: no memory for %d experts", E);
    }
    fm_rng rng;
    fm_rng_init(&rng, c->seed ^ 0x5eed0f9a11ab1e5ull);
    for (int i = 0; i < E; i++) perm[i] = i;
    for (int i = E - 1; i > 0; i--) { /* Fisher-Yates: rank -> expert */
        int j = (int)(fm_rng_uniform(&rng) * (i + 1));
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    double sum = 0;
    for (int r = 0; r < E; r++) {
        w[perm[r]] = pow((double)(r + 1), -c->skew);
        sum += w[perm[r]];
    }
    double acc = 0;
    for (int i = 0; i < E; i++) {
        acc += w[i] / sum;
        cdf[i] = acc;
    }
    cdf[E - 1] = 1.0;
    free(perm);
    free(w);
    return FM_OK;
}

/* Smallest i with cdf[i] > u. */
static int cdf_find(const double *cdf, int E, double u)
{
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

void fm_sim_pick_topk(fm_rng *r, const double *cdf, int E, int k, unsigned char *taken, int *ids)
{
    for (int j = 0; j < k; j++) {
        int got = -1;
        /* Rejecting an already-taken expert and drawing again gives exactly the
         * successive-sampling law; after 64 misses (hot experts taken under
         * strong skew) walk the remaining mass directly instead. */
        for (int t = 0; t < 64 && got < 0; t++) {
            int i = cdf_find(cdf, E, fm_rng_uniform(r));
            if (!taken[i]) got = i;
        }
        if (got < 0) {
            double rem = 0;
            for (int i = 0; i < E; i++)
                if (!taken[i]) rem += cdf[i] - (i ? cdf[i - 1] : 0.0);
            double u = fm_rng_uniform(r) * rem, acc = 0;
            for (int i = 0; i < E && got < 0; i++) {
                if (taken[i]) continue;
                acc += cdf[i] - (i ? cdf[i - 1] : 0.0);
                if (u < acc) got = i;
            }
            if (got < 0) /* rounding at the very top: the last free expert */
                for (int i = E - 1; i >= 0 && got < 0; i--)
                    if (!taken[i]) got = i;
        }
        taken[got] = 1;
        ids[j] = got;
    }
    for (int j = 0; j < k; j++) taken[ids[j]] = 0;
}

/* Pick probabilities from a cdf; skew 0 is exact, else estimated. */
static fm_status probs_from_cdf(const fm_sim_config *c, const double *cdf, double *pi)
{
    int E = c->model.n_experts, k = c->model.top_k;
    if (c->skew == 0.0) {
        for (int i = 0; i < E; i++) pi[i] = (double)k / E;
        return FM_OK;
    }
    /* top-k close to E under strong skew makes every draw a walk over E: refuse
     * what would run for hours (work.c) */
    double secs = fm_sim_draw_ns(cdf, E, k) * FM_SIM_PI_TOKENS * 1e-9;
    if (secs > FM_SIM_MAX_SECONDS)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "simulate: refusing about %.0f min of work (the limit is %.0f min): estimating expert "
                       "popularity under --skew %g with top-%d of %d experts; lower --topk or --skew",
                       secs / 60, FM_SIM_MAX_SECONDS / 60, c->skew, k, E);
    unsigned char *taken = calloc((size_t)E, 1);
    int *ids = malloc(sizeof(int) * (size_t)k);
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t));
    if (!taken || !ids || !cnt) {
        free(taken);
        free(ids);
        free(cnt);
        return fm_fail(FM_ERR_OOM, "simulate: no memory for %d experts", E);
    }
    fm_rng rng;
    fm_rng_init(&rng, c->seed ^ 0x9b1d0c0ffee5ull);
    for (int t = 0; t < FM_SIM_PI_TOKENS; t++) {
        if (t % 1024 == 0) fm_sim_progress(c, "routing", (double)t / FM_SIM_PI_TOKENS);
        fm_sim_pick_topk(&rng, cdf, E, k, taken, ids);
        for (int j = 0; j < k; j++) cnt[ids[j]]++;
    }
    for (int i = 0; i < E; i++) pi[i] = (double)cnt[i] / FM_SIM_PI_TOKENS;
    free(taken);
    free(ids);
    free(cnt);
    return FM_OK;
}

fm_status fm_sim_expert_probs(const fm_sim_config *c, double *pi)
{
    fm_clear_error();
    if (!pi) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_expert_probs: pi is NULL");
    FM_CHECK(fm_sim_config_check(c));
    double *cdf = malloc(sizeof(double) * (size_t)c->model.n_experts);
    if (!cdf) return fm_fail(FM_ERR_OOM, "simulate: no memory for %d experts", c->model.n_experts);
    fm_status st = fm_sim_popularity_cdf(c, cdf);
    if (st == FM_OK) st = probs_from_cdf(c, cdf, pi);
    free(cdf);
    return st;
}

fm_status fm_sim_sample_counts(const fm_sim_config *c, int steps, uint64_t seed, int32_t *counts)
{
    fm_clear_error();
    if (!counts || steps < 1)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_sample_counts: steps=%d must be >= 1 and counts non-NULL", steps);
    FM_CHECK(fm_sim_config_check(c));
    int E = c->model.n_experts, k = c->model.top_k, T = c->max_running * c->tokens_per_step;
    double *cdf = malloc(sizeof(double) * (size_t)E);
    unsigned char *taken = calloc((size_t)E, 1);
    int *ids = malloc(sizeof(int) * (size_t)k);
    fm_status st = FM_OK;
    if (!cdf || !taken || !ids) st = fm_fail(FM_ERR_OOM, "simulate: no memory for %d experts", E);
    if (st == FM_OK) st = fm_sim_popularity_cdf(c, cdf);
    double secs = st == FM_OK ? fm_sim_draw_ns(cdf, E, k) * T * steps * 1e-9 : 0;
    if (st == FM_OK && secs > FM_SIM_MAX_SECONDS)
        st = fm_fail(FM_ERR_INVALID_ARG,
                     "simulate: refusing about %.0f min of work (the limit is %.0f min): %d steps x %d tokens x "
                     "top-%d router draws; lower the steps, max_running or tokens_per_step",
                     secs / 60, FM_SIM_MAX_SECONDS / 60, steps, T, k);
    if (st == FM_OK) {
        fm_rng rng;
        fm_rng_init(&rng, seed);
        for (int s = 0; s < steps; s++) {
            int32_t *row = counts + (size_t)s * E;
            memset(row, 0, sizeof(int32_t) * (size_t)E);
            for (int t = 0; t < T; t++) {
                fm_sim_pick_topk(&rng, cdf, E, k, taken, ids);
                for (int j = 0; j < k; j++) row[ids[j]]++;
            }
        }
    }
    free(cdf);
    free(taken);
    free(ids);
    return st;
}
