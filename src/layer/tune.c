/* tune.c - fm_layer_tune: other plans of T's bucket timed on the device, the fastest
 * kept (include/fp4moe/layer.h). The search is the layer's; the backend times the
 * plan it holds (fm_backend_ops tune_begin / tune_time / tune_end) and lists its
 * tiles, so the loop edits plans through the backend's plan / set_plan and never
 * calls the public layer API from below.
 *
 * Inputs: TUNE_NX synthetic routings of T tokens (top_k distinct global ids per token,
 * uniform over the layer's experts, as the EP / all-local benchmarks route; fixed
 * seed) passed as external routing, x BF16 normal. Rotating the routings spreads the
 * replays over different experts, so most replays read their weights from DRAM (one
 * routing's experts fit the 50-60 MB L2 of a data-center part at 1-2 tokens; eight do
 * not).
 * Time of a plan: TUNE_REPS replays rotating over the routings after TUNE_WARM; the
 * mean over routings of each routing's median (fm_rot_time).
 * Search: coordinate descent from the current plan: FC1 over the tiles that fit the
 * bucket's rows x K splits {1, 2, 4, 8, 16} x work list off / on (FC2 as it is), then
 * FC2 over the tiles x K splits {1, 2, 4, 8} (FC1 the best so far), then the one-launch
 * decode kernel on that plan (automatic K splits, then FC1's and FC2's over 1..32), then, in a W4A8
 * layer that allows W4A16 (FM_FP8_PATH_FASTER), the W4A8 chain against the best of those (a W4A8
 * layer under FM_FP8_PATH_EVERY has nothing to search: its GEMM picks its kernel per launch).
 * Plans set_plan refuses are counted, not timed. The best is re-timed against the current plan
 * interleaved three times and kept only if it is at least TUNE_GAIN faster (the
 * run-to-run spread of a replay is a few percent); otherwise the current plan is set
 * back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fm_internal.h"
#include "fm_rng.h"
#include "layer/layer_internal.h"

#define TUNE_NX 8
#define TUNE_REPS 32 /* 4 replays a routing */
#define TUNE_WARM 8
#define TUNE_GAIN 0.03

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double fm_rot_time(double *t, int n_sets, int reps)
{
    const int n = reps / n_sets;
    double    sum = 0, *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!v || n < 1) {
        free(v);
        return -1;
    }
    for (int r = 0; r < n_sets; r++) {
        for (int i = 0; i < n; i++) v[i] = t[(size_t)i * n_sets + r];
        qsort(v, (size_t)n, sizeof(double), cmp_d);
        sum += n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    free(v);
    return sum / n_sets;
}

typedef struct {
    const fm_backend_ops *ops;
    void                 *state, *bench;
    int                   T;
    /* a W4A8 layer's buckets: 1 each bucket may run W4A8 or W4A16 (FM_FP8_PATH_FASTER),
     * 2 W4A8 only (FM_FP8_PATH_EVERY: the chain has no tiles to choose), 0 W4A16 only */
    int                   fp8;
} tune_ctx;

/* The current plan's time (us) into *us. */
static fm_status time_current(tune_ctx *c, double *us)
{
    double t[TUNE_REPS];
    FM_CHECK(c->ops->tune_time(c->state, c->bench, TUNE_WARM, TUNE_REPS, t));
    *us = fm_rot_time(t, TUNE_NX, TUNE_REPS);
    return *us >= 0 ? FM_OK : fm_fail(FM_ERR_OOM, "fm_layer_tune: out of host memory");
}

/* Plan p: set and timed (*us), or *us = -1 when set_plan refuses it. */
static fm_status time_plan(tune_ctx *c, const fm_layer_plan_info *p, double *us)
{
    *us = -1;
    fm_clear_error();
    fm_status s = c->ops->set_plan(c->state, c->T, p);
    if (s == FM_ERR_UNSUPPORTED || s == FM_ERR_INVALID_ARG || s == FM_ERR_SMEM_EXCEEDED) return FM_OK;
    if (s != FM_OK) return s;
    return time_current(c, us);
}

/* Whether a tile of 8 x nt tokens a pass is a candidate for `need` rows per expert: at
 * most two passes (each pass streams the weights again) and at most a quarter of a pass
 * used (padding rows cost the tile's work). */
static int tile_fits(const fm_tile *t, int need)
{
    const int tok = 8 * t->nt;
    return 2 * tok >= need && tok <= (need > 2 ? 4 * need : 8);
}

/* The candidate tiles among the backend's (those with code on its device) for `rows`
 * rows per expert (capped at the largest pass of those tiles); out keeps their order. */
static size_t candidates(fm_tile *out, const fm_tile *all, size_t n_all, int rows)
{
    int max_tok = 8;
    for (size_t i = 0; i < n_all; i++) max_tok = 8 * all[i].nt > max_tok ? 8 * all[i].nt : max_tok;
    const int need = rows < max_tok ? rows : max_tok;
    size_t    n = 0;
    for (size_t i = 0; i < n_all; i++)
        if (tile_fits(&all[i], need)) out[n++] = all[i];
    return n;
}

static fm_status search(tune_ctx *c, fm_layer_tune_info *ti)
{
    fm_layer_plan_info cur, best, q;
    FM_CHECK(c->ops->plan(c->state, c->T, &cur));
    double cur_us, best_us;
    FM_CHECK(time_current(c, &cur_us));
    best = cur, best_us = cur_us;
    if (c->fp8 == 2) { /* every bucket W4A8: its GEMM picks its kernel per launch, no plan to search */
        ti->before_us = ti->after_us = cur_us;
        return FM_OK;
    }
    if (c->fp8 == 1 && best.act_fp8) best.act_fp8 = 0, best_us = 1e300; /* the W4A16 search below starts from its plan */
    fm_tile      all[128], tl[128];
    const size_t nt = candidates(tl, all, c->ops->tune_tiles(c->state, all, 128), cur.expected_rows);
    static const int ks1[] = {1, 2, 4, 8, 16}, ks2[] = {1, 2, 4, 8};
    for (int phase = 0; phase < 2; phase++) {
        const fm_layer_plan_info base = best;
        const int               *ks = phase ? ks2 : ks1, nks = phase ? 4 : 5;
        for (size_t i = 0; i < nt; i++)
            for (int wl = 0; wl < 2; wl++)
                for (int k = 0; k < nks; k++) {
                    if (phase && wl) continue; /* FC2 keeps the work list FC1's pass chose */
                    const int wg = tl[i].family == FM_FAMILY_FP4MOE_WGMMA;
                    if (wg && (ks[k] > 1 || (!phase && wl))) continue; /* what set_plan refuses anyway */
                    q = base;
                    q.decode = 0; /* the chain's plans: the decode kernel is tried on the best below */
                    q.tile[phase] = tl[i], q.k_splits[phase] = ks[k], q.feature_blocks[phase] = 1;
                    q.x_packed[phase] = wg;
                    if (!phase) q.work_list = wl;
                    if (q.work_list) q.feature_blocks[1 - phase] = 1;
                    double us;
                    FM_CHECK(time_plan(c, &q, &us));
                    ti->plans_tried++;
                    if (us < 0) ti->plans_refused++;
                    else if (us < best_us) best_us = us, best = q;
                }
    }
    /* the one-launch decode kernel on the best chain plan (refused where the bucket cannot run
     * it): its automatic K splits, then each GEMM's splits 1..32 around the best so far */
    {
        fm_layer_plan_info dbest;
        double             dbest_us = -1, us;
        q = best, q.decode = 1, q.decode_k_splits[0] = q.decode_k_splits[1] = 0;
        FM_CHECK(time_plan(c, &q, &us));
        ti->plans_tried++;
        if (us < 0) ti->plans_refused++;
        else {
            FM_CHECK(c->ops->plan(c->state, c->T, &dbest)); /* the splits it resolved */
            dbest_us = us;
        }
        static const int kd[] = {1, 2, 4, 8, 16, 32};
        for (int g = 0; dbest_us >= 0 && g < 2; g++) {
            const fm_layer_plan_info base = dbest;
            for (int k = 0; k < 6; k++) {
                if (kd[k] == base.decode_k_splits[g]) continue;
                q = base, q.decode_k_splits[g] = kd[k];
                FM_CHECK(time_plan(c, &q, &us));
                ti->plans_tried++;
                if (us < 0) ti->plans_refused++;
                else if (us < dbest_us) dbest_us = us, dbest = q;
            }
        }
        if (dbest_us >= 0 && dbest_us < best_us) best_us = dbest_us, best = dbest;
    }
    if (c->fp8 == 1) { /* the W4A8 chain (the same plan, its act_fp8 set) against the best W4A16 plan */
        q = best, q.act_fp8 = 1, q.decode = 0;
        double us;
        FM_CHECK(time_plan(c, &q, &us));
        ti->plans_tried++;
        if (us < 0) ti->plans_refused++;
        else if (us < best_us) best_us = us, best = q;
    }
    /* the best against the current plan, interleaved: keep it only if clearly faster */
    double a = 0, b = 0, us;
    for (int r = 0; r < 3; r++) {
        FM_CHECK(c->ops->set_plan(c->state, c->T, &cur));
        FM_CHECK(time_current(c, &us));
        a += us / 3;
        FM_CHECK(c->ops->set_plan(c->state, c->T, &best));
        FM_CHECK(time_current(c, &us));
        b += us / 3;
    }
    ti->before_us = a;
    ti->changed = b <= (1.0 - TUNE_GAIN) * a;
    ti->after_us = ti->changed ? b : a;
    return c->ops->set_plan(c->state, c->T, ti->changed ? &best : &cur);
}

/* The synthetic inputs (fixed seed, distinct ids per token) into in's buffers. */
static void make_inputs(const fm_moe_config *cfg, int T, uint16_t *x, int32_t *ids, float *w)
{
    const int K = cfg->top_k, H = cfg->hidden, E = cfg->n_experts;
    fm_rng    r;
    fm_rng_init(&r, 0x7475u + (uint64_t)T);
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
    for (int s = 0; s < TUNE_NX * T; s++)
        for (int j = 0; j < K; j++) {
            int id, dup;
            do {
                id = (int)(fm_rng_uniform(&r) * E);
                dup = 0;
                for (int u = 0; u < j; u++) dup |= ids[(size_t)s * K + u] == id;
            } while (dup);
            ids[(size_t)s * K + j] = id;
            w[(size_t)s * K + j] = 1.0f / (float)K;
        }
}

fm_status fm_layer_tune_bucket(const fm_backend_ops *ops, void *state, const fm_layer_params *p, int T, void *stream,
                               fm_layer_tune_info *info)
{
    const fm_moe_config *cfg = &p->cfg;
    const size_t         slots = (size_t)T * cfg->top_k;
    fm_layer_tune_info   ti = {0};
    fm_layer_plan_info   keep;
    FM_CHECK(ops->plan(state, T, &keep)); /* set back if anything below fails */
    tune_ctx  c = {.ops = ops, .state = state, .T = T,
                   .fp8 = cfg->act_fp8 == FM_ACT_FP8_OFF ? 0 : p->act_fp8_path == FM_FP8_PATH_FASTER ? 1 : 2};
    fm_status st = FM_OK;
    uint16_t *hx = malloc(sizeof(uint16_t) * (size_t)T * cfg->hidden);
    int32_t  *hid = malloc(sizeof(int32_t) * TUNE_NX * slots);
    float    *hw = malloc(sizeof(float) * TUNE_NX * slots);
    if (!hx || !hid || !hw) st = fm_fail(FM_ERR_OOM, "fm_layer_tune: out of host memory");
    if (st == FM_OK) {
        make_inputs(cfg, T, hx, hid, hw);
        const fm_tune_inputs in = {.x = hx, .ids = hid, .weights = hw, .n_routings = TUNE_NX, .T = T};
        st = ops->tune_begin(state, &in, stream, &c.bench);
    }
    free(hx), free(hid), free(hw);
    if (st == FM_OK) st = search(&c, &ti);
    char why[512] = "";
    if (st != FM_OK) snprintf(why, sizeof why, "%s", fm_last_error()); /* before the clean-up's calls */
    if (c.bench) { /* ok: the synthetic runs recorded nothing (the error word read); else cleared */
        fm_status e = ops->tune_end(state, c.bench, st == FM_OK);
        if (st == FM_OK && e != FM_OK) st = e, snprintf(why, sizeof why, "%s", fm_last_error());
    }
    if (st != FM_OK) {
        (void)ops->set_plan(state, T, &keep);
        fm_fail(st, "%s", why);
    }
    if (st == FM_OK && info) *info = ti;
    return st;
}
