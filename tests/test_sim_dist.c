/* test_sim_dist.c - the simulator's routing statistics: exact expectations
 * against closed forms, an independent binomial sum, and Monte-Carlo steps.
 *
 * Statistical bounds: a Monte-Carlo mean of S independent steps is compared to
 * the exact value within 6 standard errors (sample sd / sqrt(S)); the chance of
 * a false failure is below 1e-8 per comparison.  Fresh seed every run
 * (FM_SEED replays one).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static fm_rng g_rng;

static int rand_in(int lo, int hi) { return lo + (int)(fm_rng_uniform(&g_rng) * (hi - lo + 1)); }

/* A random valid config: E in {64, 128, 256}, G | E, small batches. */
static void random_config(fm_sim_config *c)
{
    fm_sim_config_default(c);
    assert_non_null(c->gpu.name); /* the planner's GPU table has the H200 */
    static const int k_e[] = {64, 128, 256};
    static const int k_g[] = {1, 2, 4, 8};
    c->model.n_experts = k_e[rand_in(0, 2)];
    c->model.top_k = rand_in(1, 8);
    c->gpus = k_g[rand_in(0, 3)];
    c->parallel = rand_in(0, 1) ? FM_PARALLEL_TP : FM_PARALLEL_EP;
    c->max_running = rand_in(1, 200);
    c->tokens_per_step = rand_in(1, 3);
    c->tile_m = 1 << rand_in(3, 7);
    c->seed = fm_rng_u64(&g_rng) & 0xffffffffu;
}

/* E[ceil(c / m)] for c ~ Binomial(T, p), summing every term (the library only
 * sums the terms near the mode). */
static double binom_tiles(int T, double p, int m)
{
    double s = 0;
    for (int r = 0; r <= T; r++) {
        double lp = lgamma(T + 1.0) - lgamma(r + 1.0) - lgamma(T - r + 1.0) + r * log(p) + (T - r) * log1p(-p);
        s += exp(lp) * ((r + m - 1) / m);
    }
    return s;
}

static void test_uniform_closed_form(void **state)
{
    (void)state;
    for (int it = 0; it < 20; it++) {
        fm_sim_config c;
        random_config(&c);
        fm_sim_result r;
        assert_int_equal(fm_sim_run(&c, &r), FM_OK);
        int E = c.model.n_experts, k = c.model.top_k, T = c.max_running * c.tokens_per_step;
        int loc = c.parallel == FM_PARALLEL_EP ? E / c.gpus : E;
        double p = (double)k / E;
        double act = loc * (1.0 - pow(1.0 - p, T));
        assert_int_equal(r.tokens, T);
        assert_int_equal(r.local_experts, loc);
        assert_true(fabs(r.active_experts - act) <= 1e-9 * act + 1e-12);
        assert_true(fabs(r.rows_per_expert - T * p) <= 1e-9 * T * p);
        assert_true(fabs(r.rows_per_active - loc * T * p / act) <= 1e-9 * r.rows_per_active);
        double tiles = loc * binom_tiles(T, p, r.tile_m);
        double waste = 1.0 - loc * T * p / (tiles * r.tile_m);
        if (fabs(r.waste - waste) > 1e-9) {
            print_error("E=%d k=%d T=%d m=%d: waste %.12f vs %.12f\n", E, k, T, r.tile_m, r.waste, waste);
            fail();
        }
        /* histogram is a distribution; percentiles ordered */
        double hs = 0;
        for (int i = 0; i < FM_SIM_HIST; i++) hs += r.hist[i];
        assert_true(fabs(hs - 1.0) < 1e-9);
        assert_true(fabs(r.hist[0] - pow(1.0 - p, T)) < 1e-9);
        assert_true(1 <= r.rows_p50 && r.rows_p50 <= r.rows_p90 && r.rows_p90 <= r.rows_p99 && r.rows_p99 <= T);
        assert_true(r.imbalance > 1.0 - 1e-9 && r.imbalance < 1.0 + 1e-9); /* uniform: every GPU alike */
        assert_true(r.layer_us > 0 && r.tokens_per_s > 0 && isfinite(r.tokens_per_s));
    }
}

/* Exact expectations of one GPU's experts against S sampled steps. */
static void check_vs_mc(const fm_sim_config *c, const fm_sim_result *r, int S)
{
    int E = c->model.n_experts, loc = r->local_experts, g0 = r->straggler * loc;
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)E * S);
    assert_non_null(cnt);
    fm_poison_bytes(cnt, sizeof(int32_t) * (size_t)E * S);
    assert_int_equal(fm_sim_sample_counts(c, S, fm_rng_u64(&g_rng), cnt), FM_OK);
    double sa = 0, sa2 = 0, st = 0, st2 = 0;
    int T = r->tokens;
    for (int s = 0; s < S; s++) {
        long tot = 0;
        double a = 0, t = 0;
        for (int e = 0; e < E; e++) tot += cnt[(size_t)s * E + e];
        assert_int_equal(tot, (long)T * c->model.top_k); /* every token picked k experts */
        for (int e = g0; e < g0 + loc; e++) {
            int v = cnt[(size_t)s * E + e];
            assert_true(v >= 0 && v <= T);
            a += v > 0;
            t += (v + r->tile_m - 1) / r->tile_m;
        }
        sa += a;
        sa2 += a * a;
        st += t;
        st2 += t * t;
    }
    double ma = sa / S, mt = st / S;
    double sea = sqrt(fmax(sa2 / S - ma * ma, 0) / S), set = sqrt(fmax(st2 / S - mt * mt, 0) / S);
    double tiles_exact = r->rows_per_expert * loc / (r->tile_m * (1.0 - r->waste));
    /* A step's active count has variance <= loc q (1 - q), q = active / loc (the
     * experts' indicators are at most independent; a fixed total makes them
     * negatively correlated): the floor when the sample shows no spread. */
    double q = r->active_experts / loc;
    sea = fmax(sea, sqrt(loc * q * (1 - q) / S));
    /* same floor for tiles: loc x Var(ceil(c / m)) at the GPU's mean pi */
    double pbar = r->rows_per_expert / T, m1 = 0, m2 = 0;
    for (int v = 0; v <= T; v++) {
        double pr = exp(lgamma(T + 1.0) - lgamma(v + 1.0) - lgamma(T - v + 1.0) + v * log(pbar) + (T - v) * log1p(-pbar));
        double tv = (v + r->tile_m - 1) / r->tile_m;
        m1 += pr * tv;
        m2 += pr * tv * tv;
    }
    set = fmax(set, sqrt(loc * fmax(m2 - m1 * m1, 0) / S));
    /* Under skew the exact side uses pi estimated from 65536 tokens: relative
     * sd of the GPU's summed pi <= 1 / sqrt(65536 * sum pi), carried to both. */
    double rel = 0;
    if (c->skew > 0) rel = 6.0 / sqrt(65536.0 * (r->rows_per_expert * loc / T));
    if (fabs(ma - r->active_experts) > 6 * sea + rel * r->active_experts + 1e-9 ||
        fabs(mt - tiles_exact) > 6 * set + rel * tiles_exact + 1e-9) {
        print_error("skew %g E=%d k=%d T=%d: active MC %.4f+-%.4f exact %.4f; tiles MC %.4f+-%.4f exact %.4f\n",
                    c->skew, E, c->model.top_k, T, ma, sea, r->active_experts, mt, set, tiles_exact);
        fail();
    }
    free(cnt);
}

static void test_uniform_vs_mc(void **state)
{
    (void)state;
    for (int it = 0; it < 6; it++) {
        fm_sim_config c;
        random_config(&c);
        fm_sim_result r;
        assert_int_equal(fm_sim_run(&c, &r), FM_OK);
        check_vs_mc(&c, &r, 300);
    }
}

static void test_skew(void **state)
{
    (void)state;
    for (int it = 0; it < 4; it++) {
        fm_sim_config c;
        random_config(&c);
        c.parallel = FM_PARALLEL_EP;
        c.gpus = 8;
        c.model.top_k = rand_in(2, 8);
        c.skew = 0.5 + fm_rng_uniform(&g_rng);
        int E = c.model.n_experts;
        double *pi = malloc(sizeof(double) * (size_t)E);
        assert_int_equal(fm_sim_expert_probs(&c, pi), FM_OK);
        double sum = 0, mx = 0, mn = 1;
        for (int e = 0; e < E; e++) {
            assert_true(pi[e] >= 0 && pi[e] <= 1);
            sum += pi[e];
            mx = fmax(mx, pi[e]);
            mn = fmin(mn, pi[e]);
        }
        assert_true(fabs(sum - c.model.top_k) < 1e-9); /* each token picks exactly k */
        assert_true(mx > 2 * mn);                      /* skewed: some experts much hotter */
        fm_sim_result r;
        assert_int_equal(fm_sim_run(&c, &r), FM_OK);
        assert_true(r.imbalance >= 1.0);
        check_vs_mc(&c, &r, 300);
        free(pi);
    }
}

/* Monte-Carlo straggler time >= max over GPUs of the expected time (Jensen); a
 * 2 % margin covers the Monte-Carlo noise of 200 steps (well under 1 %). */
static void test_mc_straggler(void **state)
{
    (void)state;
    fm_sim_config c;
    random_config(&c);
    c.parallel = FM_PARALLEL_EP;
    c.gpus = 8;
    c.mc_steps = 200;
    fm_sim_result mc, ex;
    assert_int_equal(fm_sim_run(&c, &mc), FM_OK);
    c.mc_steps = 0;
    assert_int_equal(fm_sim_run(&c, &ex), FM_OK);
    assert_int_equal(mc.mc, 1);
    assert_int_equal(ex.mc, 0);
    assert_true(mc.layer_us >= 0.98 * ex.layer_us);
}

/* More requests never mean fewer rows per active expert or fewer active experts. */
static void test_sweep_monotone(void **state)
{
    (void)state;
    fm_sim_config c;
    random_config(&c);
    int mr[64];
    for (int i = 0; i < 64; i++) mr[i] = (i ? mr[i - 1] : 0) + rand_in(1, 8);
    fm_sim_result *r = malloc(sizeof(fm_sim_result) * 64);
    assert_int_equal(fm_sim_sweep(&c, mr, 64, r), FM_OK);
    for (int i = 1; i < 64; i++) {
        assert_int_equal(r[i].max_running, mr[i]);
        assert_true(r[i].rows_per_active >= r[i - 1].rows_per_active - 1e-12);
        assert_true(r[i].active_experts >= r[i - 1].active_experts - 1e-12);
    }
    fm_sim_crossings x;
    assert_int_equal(fm_sim_find_crossings(&c, 512, &x), FM_OK);
    for (int i = 0; i < 4; i++) {
        if (!x.rows_at[i]) continue;
        c.max_running = x.rows_at[i];
        fm_sim_result a;
        assert_int_equal(fm_sim_run(&c, &a), FM_OK);
        assert_true(a.rows_per_active >= 8 << i);
        if (x.rows_at[i] > 1) {
            c.max_running = x.rows_at[i] - 1;
            assert_int_equal(fm_sim_run(&c, &a), FM_OK);
            assert_true(a.rows_per_active < 8 << i);
        }
    }
    free(r);
}

int main(void)
{
    fm_rng_init(&g_rng, fm_test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_closed_form), cmocka_unit_test(test_uniform_vs_mc),
        cmocka_unit_test(test_skew),                cmocka_unit_test(test_mc_straggler),
        cmocka_unit_test(test_sweep_monotone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
