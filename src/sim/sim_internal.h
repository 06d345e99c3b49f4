/* sim_internal.h - what the simulator's files share (not installed).
 *
 * The pipeline: fm_sim_ctx_init() validates the settings once and fixes what does
 * not depend on the batch (shapes, per-expert pick probabilities pi, measured
 * curves); fm_sim_point() then evaluates one max_running value cheaply, so the
 * crossing search can afford every integer in 1..512.
 */
#ifndef FM_SIM_INTERNAL_H
#define FM_SIM_INTERNAL_H

#include <stdint.h>

#include "fp4moe.h"
#include "fp4moe/plan.h"
#include "fp4moe/sim.h"
#include "fm_rng.h"

#define FM_SIM_MAX_EXPERTS 4096
#define FM_SIM_MAX_GPUS 1024
#define FM_SIM_MAX_RUNNING 65536
#define FM_SIM_MAX_TOKENS FM_SIM_MAX_STEP_TOKENS
#define FM_SIM_MAX_SKEW 2.0
#define FM_SIM_PI_TOKENS (1 << 16) /* tokens drawn to estimate pi under skew */
#define FM_SIM_CURVE_MAX 256       /* measured points per shape */
#define FM_SIM_DEFAULT_TILE_M 128  /* without a planner: the field's CUTLASS tiles */

/* Per-GPU per-expert GEMM shapes; index 0 = FC1 (gate+up), 1 = FC2 (down). */
typedef struct {
    int local_experts;
    int n[2], k[2];
    int shared_n[2], shared_k[2]; /* dense BF16 shared experts, 0 when none */
} fm_sim_shape;

void fm_sim_shapes(const fm_sim_config *c, fm_sim_shape *s);

/* v against setting s's row of the range table (ranges.c): FM_OK, or the row's
 * status with a detail naming the setting, its flag and the range. */
fm_status fm_sim_range_check(fm_sim_setting s, double v);

/* Measured time per expert against rows, for one GPU/format/shape. */
typedef struct {
    int    n;
    double rows[FM_SIM_CURVE_MAX];
    double us[FM_SIM_CURVE_MAX]; /* per expert */
} fm_sim_curve;

fm_status fm_sim_measured_curve(const fm_sim_measured *m, const char *gpu, fm_format fmt, int n, int k,
                                fm_sim_curve *out);
double    fm_sim_curve_eval(const fm_sim_curve *cv, double rows);

/* Sums over one GPU's experts (expected values, or one sampled step). */
typedef struct {
    double active;     /* experts with >= 1 row */
    double rows;       /* routed rows */
    double tiles;      /* tiles of tile_m rows */
    double meas_us[2]; /* sum of measured per-expert times (FC1, FC2) */
} fm_sim_moments;

typedef struct {
    double gemm_us[2];     /* FC1, FC2 */
    double mem_us, compute_us;
    double wbytes, abytes; /* routed, both GEMMs */
    double flops_useful, flops_issued;
} fm_sim_cost;

typedef struct {
    fm_sim_config cfg;
    fm_sim_shape  shape;
    double       *pi;       /* [n_experts] per-token pick probability */
    double       *cdf;      /* [n_experts] cumulative popularity (samplers) */
    double        peak_tflops;
    int           measured; /* curves valid */
    fm_sim_curve  curve[2];
} fm_sim_ctx;

fm_status fm_sim_ctx_init(fm_sim_ctx *x, const fm_sim_config *c);
void      fm_sim_ctx_free(fm_sim_ctx *x);
/* One point; with_dist adds the histogram/percentiles, with_mc the Monte-Carlo. */
fm_status fm_sim_point(const fm_sim_ctx *x, int max_running, int with_dist, int with_mc, fm_sim_result *r);

/* Routing: Zipf popularity and samplers (routing.c). */
/* cdf[E]: inclusive cumulative popularity, cdf[E-1] = 1. */
fm_status fm_sim_popularity_cdf(const fm_sim_config *c, double *cdf);
/* k distinct experts into ids[k]; taken[E] is scratch, all 0 on entry and exit. */
void fm_sim_pick_topk(fm_rng *r, const double *cdf, int E, int k, unsigned char *taken, int *ids);

/* Binomial(n, p) terms of non-negligible mass, in increasing r. */
typedef void (*fm_sim_pmf_fn)(int r, double prob, void *ctx);
void fm_sim_binom_each(int n, double p, fm_sim_pmf_fn fn, void *ctx);

/* Expected moments of experts [e0, e1) for T tokens (dist.c); pmf[T+1], when
 * not NULL, accumulates the mixture pmf of one of those experts' rows. */
void fm_sim_exact_moments(const fm_sim_ctx *x, int e0, int e1, int T, int tile_m, fm_sim_moments *mo, double *pmf);
/* The same from one sampled step's counts[E]. */
void fm_sim_count_moments(const fm_sim_ctx *x, const int32_t *counts, int e0, int e1, int tile_m, fm_sim_moments *mo);

/* Cost of one GPU from its moments (cost.c). */
void fm_sim_cost_eval(const fm_sim_ctx *x, int tile_m, const fm_sim_moments *mo, fm_sim_cost *out);
/* Roofline of one grouped GEMM of per-expert shape n x k from its moments:
 * all terms of out for that GEMM alone, its time in out->gemm_us[0]. */
void fm_sim_gemm_roofline(const fm_sim_ctx *x, int n, int k, int tile_m, const fm_sim_moments *mo, fm_sim_cost *out);
/* Time of the dense shared experts for T tokens on one GPU. */
double fm_sim_shared_us(const fm_sim_ctx *x, int tokens);
/* Tile rows for an expected rows-per-active-expert (tile.c); n/k 0 when unknown. */
int fm_sim_pick_tile(const fm_sim_ctx *x, double rows_per_active, int *tile_n, int *tile_k, int *from_planner);

/* Work bound (work.c).  Expected ns of one token's top_k draws from cdf[E]. */
double fm_sim_draw_ns(const double *cdf, int E, int k);
/* Seconds of the calls fm_sim_estimate_seconds describes, by part: [0] Monte-
 * Carlo draws, [1] the popularity estimate, [2] the simulated points, [3] the
 * crossing search.  c is checked already. */
fm_status fm_sim_estimate_parts(const fm_sim_config *c, const int *mr, int n, int dense_hi, double part[4]);
/* FM_OK, or FM_ERR_INVALID_ARG naming the estimate and what to lower when it
 * exceeds FM_SIM_MAX_SECONDS. */
fm_status fm_sim_work_check(const fm_sim_config *c, const int *mr, int n, int dense_hi);
/* c->progress, when set. */
void fm_sim_progress(const fm_sim_config *c, const char *phase, double done);

#endif
