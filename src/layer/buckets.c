/* buckets.c - the bucket policy: which kernels a layer runs for each batch-size bucket
 * (T a power of two up to max_tokens), decided once at create for every backend with
 * tile plans (fm_backend_ops.gemm_choose / install): the rows per expert and active
 * experts a bucket is planned for (row_quantile), the X layout of each GEMM, the K
 * splits and the experts' work list (decode_work_list), and whether the one-launch decode
 * kernel replaces the chain (decode_path), and whether a W4A8 layer's bucket runs the W4A8
 * chain (act_fp8_path). The backend resolves the
 * result into launches; its runs only look their bucket up. */
#include <math.h>

#include "layer/layer_internal.h"

int fm_layer_bucket_of(int T)
{
    int b = 0;
    while ((1LL << b) < T) b++;
    return b;
}

int fm_layer_bucket_tokens(int max_tokens, int b)
{
    long long Tb = 1LL << b;
    return Tb < max_tokens ? (int)Tb : max_tokens;
}

/* The smallest r with P(X <= r) >= q, X ~ Binomial(n, pr): an expert's rows when each of
 * n tokens picks it with probability pr (log-space terms: no underflow at large n). */
static int binomial_quantile(int n, double pr, double q)
{
    if (pr <= 0) return 0;
    if (pr >= 1) return n;
    const double lg = lgamma(n + 1.0), l1 = log(pr), l0 = log1p(-pr);
    double       cdf = 0;
    for (int r = 0; r < n; r++) {
        cdf += exp(lg - lgamma(r + 1.0) - lgamma(n - r + 1.0) + r * l1 + (n - r) * l0);
        if (cdf >= q) return r;
    }
    return n;
}

void fm_layer_bucket_rows(const fm_layer_params *p, int T, int *avg, int *act)
{
    const double R = (double)T * p->cfg.top_k, local = R * p->n_local / p->cfg.n_experts;
    int          rows = (int)ceil(local), a = rows < p->n_local ? (rows > 0 ? rows : 1) : p->n_local;
    *act = a;
    *avg = (int)(((int64_t)rows + a - 1) / a); /* rows may be near INT32_MAX (max_tokens x top_k) */
    if (*avg < 1) *avg = 1;
    const float q = p->row_quantile == FM_ROW_QUANTILE_AUTO
                        ? (T >= FM_ROW_QUANTILE_AUTO_MIN_T ? FM_ROW_QUANTILE_AUTO_Q : 0.0f)
                        : p->row_quantile;
    if (q > 0) {
        int qr = binomial_quantile(T, (double)p->cfg.top_k / p->cfg.n_experts, q);
        if (qr > *avg) *avg = qr;
    }
}

/* 1 if the planner estimates GEMM g faster with packed X than with natural X. */
static int prefer_packed(const fm_backend_ops *ops, void *state, int g, fm_gemm_hint h)
{
    fm_tile t;
    double  nat = 0, pk = 0;
    h.x_packed = 0;
    int ok = ops->gemm_choose(state, g, &h, &t, NULL, NULL, &nat) == FM_OK;
    h.x_packed = 1;
    ok = ok && ops->gemm_choose(state, g, &h, &t, NULL, NULL, &pk) == FM_OK;
    fm_clear_error();
    return ok && pk < nat;
}

/* Whether a bucket runs the W4A8 chain (the same answer for every bucket until a W4A8 kernel
 * measures faster somewhere): every bucket of a W4A8 layer under
 * FM_FP8_PATH_EVERY; under FM_FP8_PATH_FASTER where W4A8 is expected faster than W4A16.
 * That expectation is the measured one, and no measurement has found W4A8 faster yet: on
 * the H100 and the H200 (GLM-5 EP8 and all-local, T = 16-4,096; bench/RESULTS.md, issue
 * 34) the W4A8 layer took 3.1-10.5x the W4A16 layer's time, so no bucket. fm_layer_tune
 * times both per bucket, so a device or kernel where W4A8 wins gets it there. */
static int fp8_bucket(const fm_layer_params *p)
{
    if (p->cfg.act_fp8 == FM_ACT_FP8_OFF) return 0;
    return p->act_fp8_path == FM_FP8_PATH_EVERY;
}

/* The plan of the bucket of T tokens. */
static fm_status plan_bucket(const fm_backend_ops *ops, void *state, const fm_layer_params *p, int T,
                             fm_layer_plan_info *pl)
{
    int avg, act;
    fm_layer_bucket_rows(p, T, &avg, &act);
    /* decode_work_list: 1 every bucket, -1 none, 0 (auto) the buckets where the planner
     * splits FC1's K at least FM_WORK_LIST_MIN_SPLITS ways: there the work list won on the
     * H200 (GLM-5 EP8, T = 1/2/4: 16/8/4 splits, graph replay -22/-7/-9 %); at 2 splits
     * or none it lost (T = 8: +7 %, all-local T = 1: +16 %; bench/RESULTS.md 2026-12-03) */
    const int    mode = p->decode_work_list;
    int          wl = mode != FM_WORK_LIST_OFF;
    fm_gemm_hint h1 = {.rows = avg, .active = act, .k_splits_auto = wl}, h2 = h1;
    *pl = (fm_layer_plan_info){.bucket_tokens = T, .expected_rows = avg, .active_experts = act};
    pl->x_packed[0] = h1.x_packed = ops->packed_x_ok(state, 0) && prefer_packed(ops, state, 0, h1);
    pl->x_packed[1] = h2.x_packed = ops->packed_x_ok(state, 1) && prefer_packed(ops, state, 1, h2);
    FM_CHECK(ops->gemm_choose(state, 0, &h1, &pl->tile[0], &pl->feature_blocks[0], &pl->k_splits[0], NULL));
    if (mode == FM_WORK_LIST_AUTO && pl->k_splits[0] < FM_WORK_LIST_MIN_SPLITS) { /* the plain grids */
        wl = 0;
        h1.k_splits_auto = h2.k_splits_auto = 0;
        FM_CHECK(ops->gemm_choose(state, 0, &h1, &pl->tile[0], &pl->feature_blocks[0], &pl->k_splits[0], NULL));
    }
    pl->work_list = wl;
    /* decode_path ON: the one-launch kernel wherever the backend can run it (install keeps
     * the chain, with a note, where it cannot); AUTO: the backend's measured rule at install
     * (cuda: layer_plan.c decode_auto, <= 1 expected local routed slot on sm_90) */
    pl->decode = p->decode_path == FM_DECODE_PATH_ON;
    pl->act_fp8 = fp8_bucket(p);
    return ops->gemm_choose(state, 1, &h2, &pl->tile[1], &pl->feature_blocks[1], &pl->k_splits[1], NULL);
}

fm_status fm_layer_plan_buckets(const fm_backend_ops *ops, void *state, const fm_layer_params *p)
{
    fm_layer_plan_info plans[FM_LAYER_BUCKETS];
    int                n = 0;
    for (int b = 0; b < FM_LAYER_BUCKETS; b++) {
        const int T = fm_layer_bucket_tokens(p->max_tokens, b);
        FM_CHECK(plan_bucket(ops, state, p, T, &plans[b]));
        n = b + 1;
        if (T >= p->max_tokens) break;
    }
    return ops->install(state, plans, n);
}
