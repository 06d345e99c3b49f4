/* sim.c - one operating point, a sweep, and the crossing search.
 *
 * Per point: T = max_running * tokens_per_step tokens; for each GPU the
 * expected moments of its experts' rows (dist.c) give its roofline or measured
 * time (cost.c); the slowest GPU sets the layer time (EP with skew is
 * unbalanced; TP and uniform EP are not).  Expectations are taken before the
 * max over GPUs, so the exact figure is a lower bound on the expected
 * straggler; --mc N samples N whole steps and takes the max per step instead.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fm_internal.h"
#include "sim_internal.h"

fm_status fm_sim_ctx_init(fm_sim_ctx *x, const fm_sim_config *c)
{
    memset(x, 0, sizeof *x);
    FM_CHECK(fm_sim_config_check(c));
    x->cfg = *c;
    fm_sim_shapes(c, &x->shape);
    int E = c->model.n_experts;
    x->pi = malloc(sizeof(double) * (size_t)E);
    x->cdf = malloc(sizeof(double) * (size_t)E);
    if (!x->pi || !x->cdf) {
        fm_sim_ctx_free(x);
        return fm_fail(FM_ERR_OOM, "simulate: no memory for %d experts", E);
    }
    fm_status st = fm_sim_popularity_cdf(c, x->cdf);
    if (st == FM_OK) st = fm_sim_expert_probs(c, x->pi);
    const fm_format_traits *tr = fm_format_traits_get(c->model.wfmt);
    int fp4 = tr && tr->elem_bits == 4;
    /* native FP4 MMA only for CUTLASS's block-scaled kernels; fp4moe's swap-AB
     * kernel dequantizes into BF16 mma.sync on every architecture */
    int native = fp4 && c->gpu.fp4_tflops > 0 && c->kernel == FM_SIM_KERNEL_CUTLASS;
    x->peak_tflops = native ? c->gpu.fp4_tflops : c->gpu.bf16_tflops;
    if (st == FM_OK && c->measured) {
        const char *g = c->gpu.name ? c->gpu.name : "";
        for (int j = 0; j < 2 && st == FM_OK; j++)
            st = fm_sim_measured_curve(c->measured, g, c->model.wfmt, x->shape.n[j], x->shape.k[j], &x->curve[j]);
        x->measured = st == FM_OK;
    }
    if (st != FM_OK) fm_sim_ctx_free(x);
    return st;
}

void fm_sim_ctx_free(fm_sim_ctx *x)
{
    free(x->pi);
    free(x->cdf);
    x->pi = x->cdf = NULL;
}

static int hist_bucket(int r)
{
    if (r <= 0) return 0;
    int b = 1;
    while (r > 1 && b < FM_SIM_HIST - 1) {
        r >>= 1;
        b++;
    }
    return b;
}

static void fill_dist(const double *pmf, int T, fm_sim_result *r)
{
    memset(r->hist, 0, sizeof r->hist);
    for (int i = 0; i <= T; i++) r->hist[hist_bucket(i)] += pmf[i];
    double act = 1.0 - pmf[0], acc = 0;
    const double q[3] = {0.5, 0.9, 0.99};
    int *out[3] = {&r->rows_p50, &r->rows_p90, &r->rows_p99}, qi = 0;
    r->rows_p50 = r->rows_p90 = r->rows_p99 = 0;
    if (act <= 0) return;
    for (int i = 1; i <= T && qi < 3; i++) {
        acc += pmf[i] / act;
        while (qi < 3 && acc >= q[qi] - 1e-12) *out[qi++] = i;
    }
    while (qi < 3) *out[qi++] = T;
}

/* Routed time of the slowest GPU in one sampled step. */
static double mc_step_max(const fm_sim_ctx *x, const int32_t *counts, int groups, int span, int tile_m)
{
    double worst = 0;
    for (int g = 0; g < groups; g++) {
        fm_sim_moments mo;
        fm_sim_cost co;
        fm_sim_count_moments(x, counts, g * span, (g + 1) * span, tile_m, &mo);
        fm_sim_cost_eval(x, tile_m, &mo, &co);
        worst = fmax(worst, co.gemm_us[0] + co.gemm_us[1]);
    }
    return worst;
}

static fm_status run_mc(const fm_sim_ctx *x, int T, int groups, int span, int tile_m, double *mean_max)
{
    const fm_sim_config *c = &x->cfg;
    int E = c->model.n_experts, k = c->model.top_k;
    int32_t *counts = malloc(sizeof(int32_t) * (size_t)E);
    unsigned char *taken = calloc((size_t)E, 1);
    int *ids = malloc(sizeof(int) * (size_t)k);
    if (!counts || !taken || !ids) {
        free(counts);
        free(taken);
        free(ids);
        return fm_fail(FM_ERR_OOM, "simulate: no memory for Monte-Carlo");
    }
    fm_rng rng;
    fm_rng_init(&rng, c->seed * 0x2545f4914f6cdd1dull + (uint64_t)T);
    double sum = 0;
    for (int s = 0; s < c->mc_steps; s++) {
        fm_sim_progress(c, "Monte-Carlo", (double)s / c->mc_steps);
        memset(counts, 0, sizeof(int32_t) * (size_t)E);
        for (int t = 0; t < T; t++) {
            fm_sim_pick_topk(&rng, x->cdf, E, k, taken, ids);
            for (int j = 0; j < k; j++) counts[ids[j]]++;
        }
        sum += mc_step_max(x, counts, groups, span, tile_m);
    }
    fm_sim_progress(c, "Monte-Carlo", 1.0);
    *mean_max = sum / c->mc_steps;
    free(counts);
    free(taken);
    free(ids);
    return FM_OK;
}

void fm_sim_progress(const fm_sim_config *c, const char *phase, double done)
{
    if (c->progress) c->progress(c->progress_ctx, phase, done);
}

/* Every figure a point reports must be a number: tiny GPU figures in a caller's
 * own fm_gpu_info (the check only asks for > 0) overflow the times to Inf. */
static fm_status result_finite(const fm_sim_config *c, const fm_sim_result *r)
{
    const struct {
        const char *name;
        double      v;
    } f[] = {
        {"rows per expert", r->rows_per_expert}, {"rows per active expert", r->rows_per_active},
        {"active experts", r->active_experts},   {"waste", r->waste},
        {"weight MB", r->weight_mb},             {"activation MB", r->act_mb},
        {"useful GFLOP", r->gflop_useful},       {"issued GFLOP", r->gflop_issued},
        {"memory time", r->mem_us},              {"compute time", r->compute_us},
        {"FC1 time", r->fc1_us},                 {"FC2 time", r->fc2_us},
        {"shared-expert time", r->shared_us},    {"layer time", r->layer_us},
        {"imbalance", r->imbalance},             {"TFLOP/s", r->tflops},
        {"efficiency", r->efficiency},           {"bandwidth use", r->bw_util},
        {"step time", r->step_us},               {"tokens/s", r->tokens_per_s},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i].v))
            return fm_fail(FM_ERR_NONFINITE,
                           "simulate: the %s at %d requests comes out %g: the GPU's figures (%g GB/s, %g TFLOP/s) "
                           "and efficiencies (%g, %g) are too small for the model's arithmetic",
                           f[i].name, r->max_running, f[i].v, c->gpu.mem_gbs, c->gpu.bf16_tflops, c->bw_eff,
                           c->compute_eff);
    return FM_OK;
}

fm_status fm_sim_point(const fm_sim_ctx *x, int max_running, int with_dist, int with_mc, fm_sim_result *r)
{
    const fm_sim_config *c = &x->cfg;
    int T = max_running * c->tokens_per_step, E = c->model.n_experts;
    int ep = c->parallel == FM_PARALLEL_EP;
    int groups = ep ? c->gpus : 1, span = x->shape.local_experts;

    double act_all = 0, rows_all = 0; /* rows per active expert decides the tile */
    for (int e = 0; e < E; e++) {
        double p = fmin(x->pi[e], 1.0);
        act_all += p >= 1.0 ? 1.0 : -expm1(T * log1p(-p));
        rows_all += T * p;
    }
    memset(r, 0, sizeof *r);
    r->tile_m = fm_sim_pick_tile(x, act_all > 0 ? rows_all / act_all : 0, &r->tile_n, &r->tile_k,
                                 &r->tile_from_planner);

    double worst = -1, sum = 0;
    fm_sim_moments mo_w = {0};
    fm_sim_cost co_w = {{0, 0}, 0, 0, 0, 0, 0, 0};
    for (int g = 0; g < groups; g++) {
        fm_sim_moments mo;
        fm_sim_cost co;
        fm_sim_exact_moments(x, g * span, (g + 1) * span, T, r->tile_m, &mo, NULL);
        fm_sim_cost_eval(x, r->tile_m, &mo, &co);
        double t = co.gemm_us[0] + co.gemm_us[1];
        sum += t;
        if (t > worst) {
            worst = t;
            mo_w = mo;
            co_w = co;
            r->straggler = g;
        }
    }
    if (with_dist) {
        double *pmf = calloc((size_t)T + 1, sizeof(double));
        if (!pmf) return fm_fail(FM_ERR_OOM, "simulate: no memory for %d tokens", T);
        fm_sim_moments tmp;
        fm_sim_exact_moments(x, r->straggler * span, (r->straggler + 1) * span, T, r->tile_m, &tmp, pmf);
        fill_dist(pmf, T, r);
        free(pmf);
    }
    r->max_running = max_running;
    r->tokens = T;
    r->local_experts = span;
    r->fc1_n = x->shape.n[0];
    r->fc1_k = x->shape.k[0];
    r->fc2_n = x->shape.n[1];
    r->fc2_k = x->shape.k[1];
    r->rows_per_expert = mo_w.rows / span;
    r->rows_per_active = mo_w.active > 0 ? mo_w.rows / mo_w.active : 0;
    r->active_experts = mo_w.active;
    r->waste = mo_w.tiles > 0 ? 1.0 - mo_w.rows / (mo_w.tiles * r->tile_m) : 0;
    r->weight_mb = co_w.wbytes / 1e6;
    r->act_mb = co_w.abytes / 1e6;
    r->gflop_useful = co_w.flops_useful / 1e9;
    r->gflop_issued = co_w.flops_issued / 1e9;
    r->mem_us = co_w.mem_us;
    r->compute_us = co_w.compute_us;
    r->bound = co_w.compute_us > co_w.mem_us ? FM_SIM_COMPUTE_BOUND : FM_SIM_BW_BOUND;
    r->peak_tflops = x->peak_tflops;
    r->fc1_us = co_w.gemm_us[0];
    r->fc2_us = co_w.gemm_us[1];
    r->shared_us = fm_sim_shared_us(x, T);
    r->measured = x->measured;
    double routed = worst;
    r->imbalance = sum > 0 ? worst / (sum / groups) : 1.0;
    if (with_mc && c->mc_steps > 0) {
        FM_CHECK(run_mc(x, T, groups, span, r->tile_m, &routed));
        r->mc = 1;
    }
    r->layer_us = routed + r->shared_us;
    r->tflops = routed > 0 ? co_w.flops_useful / routed / 1e6 : 0;
    r->efficiency = r->peak_tflops > 0 ? r->tflops / r->peak_tflops : 0;
    r->bw_util = routed > 0 ? (co_w.wbytes + co_w.abytes) / routed / 1e3 / c->gpu.mem_gbs : 0;
    r->step_us = c->model.moe_layers * r->layer_us + c->round_us / c->decode_steps;
    double acc = c->accepted > 0 ? c->accepted : c->tokens_per_step;
    r->tokens_per_s = r->step_us > 0 ? max_running * acc / r->step_us * 1e6 : 0;
    return result_finite(c, r);
}

fm_status fm_sim_run(const fm_sim_config *c, fm_sim_result *out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_run: out is NULL");
    FM_CHECK(fm_sim_config_check(c));
    FM_CHECK(fm_sim_work_check(c, &c->max_running, 1, 0));
    fm_sim_ctx x;
    FM_CHECK(fm_sim_ctx_init(&x, c));
    fm_sim_result r;
    fm_status st = fm_sim_point(&x, c->max_running, 1, 1, &r);
    fm_sim_ctx_free(&x);
    if (st == FM_OK) *out = r;
    return st;
}

fm_status fm_sim_sweep(const fm_sim_config *c, const int *mr, int n, fm_sim_result *out)
{
    fm_clear_error();
    if (!mr || !out || n < 1) return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_sweep: NULL array or n=%d < 1", n);
    for (int i = 0; i < n; i++)
        if (mr[i] < 1 || mr[i] > FM_SIM_MAX_RUNNING)
            return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_sweep: max_running[%d]=%d must be in [1, %d]", i, mr[i],
                           FM_SIM_MAX_RUNNING);
    if (!c) return fm_sim_config_check(c);
    fm_sim_config cc = *c;
    cc.max_running = mr[n - 1]; /* the largest must pass the token limit too */
    for (int i = 0; i < n; i++)
        if (mr[i] > cc.max_running) cc.max_running = mr[i];
    FM_CHECK(fm_sim_config_check(&cc));
    FM_CHECK(fm_sim_work_check(&cc, mr, n, 0));
    fm_sim_ctx x;
    FM_CHECK(fm_sim_ctx_init(&x, &cc));
    fm_sim_result *tmp = malloc(sizeof(fm_sim_result) * (size_t)n);
    fm_status st = tmp ? FM_OK : fm_fail(FM_ERR_OOM, "fm_sim_sweep: no memory");
    for (int i = 0; i < n && st == FM_OK; i++) {
        fm_sim_progress(&cc, "sweep", (double)i / n);
        st = fm_sim_point(&x, mr[i], 1, 1, &tmp[i]);
    }
    if (st == FM_OK) memcpy(out, tmp, sizeof(fm_sim_result) * (size_t)n);
    free(tmp);
    fm_sim_ctx_free(&x);
    return st;
}

fm_status fm_sim_find_crossings(const fm_sim_config *c, int hi, fm_sim_crossings *out)
{
    fm_clear_error();
    if (!out || hi < 1 || hi > FM_SIM_MAX_RUNNING)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_sim_find_crossings: NULL out or hi=%d not in [1, %d]", hi,
                       FM_SIM_MAX_RUNNING);
    if (!c) return fm_sim_config_check(c);
    fm_sim_config cc = *c;
    cc.max_running = hi;
    cc.mc_steps = 0; /* the search is exact */
    FM_CHECK(fm_sim_config_check(&cc));
    FM_CHECK(fm_sim_work_check(&cc, NULL, 0, hi));
    fm_sim_ctx x;
    FM_CHECK(fm_sim_ctx_init(&x, &cc));
    fm_sim_crossings o = {{0, 0, 0, 0}, 0};
    static const double k_rows[4] = {8, 16, 32, 64};
    fm_status st = FM_OK;
    for (int m = 1; m <= hi && st == FM_OK; m++) {
        if (m % 64 == 1) fm_sim_progress(&cc, "crossings", (double)(m - 1) / hi);
        fm_sim_result r;
        st = fm_sim_point(&x, m, 0, 0, &r);
        for (int i = 0; i < 4 && st == FM_OK; i++)
            if (!o.rows_at[i] && r.rows_per_active >= k_rows[i]) o.rows_at[i] = m;
        if (st == FM_OK && !o.compute_bound_at && r.bound == FM_SIM_COMPUTE_BOUND) o.compute_bound_at = m;
        if (o.rows_at[3] && o.compute_bound_at) break;
    }
    fm_sim_ctx_free(&x);
    if (st == FM_OK) *out = o;
    return st;
}
