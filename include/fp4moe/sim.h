/* fp4moe/sim.h - the decode batching simulator: from server settings to rows per
 * expert, grouped-GEMM time, kernel efficiency and a tokens/s ceiling.
 *
 * Why: during decode each expert sees about batch * top_k / experts rows per
 * step, so a 128-row tile mostly multiplies padding.  Server settings (max
 * running requests, MTP/speculative tokens per step, continuous decode steps)
 * change that; this module says in advance what a setting buys.
 *
 * Model (docs/simulate.md has the derivations):
 *  - one decode step carries T = max_running * tokens_per_step tokens; each
 *    token picks top_k distinct experts.  Expert i is picked by a token with
 *    probability pi_i (top_k / E for uniform routing), independently across
 *    tokens, so its row count is exactly Binomial(T, pi_i).  With skew > 0 the
 *    popularity is Zipf-like (weight 1/rank^skew, ranks assigned to experts by a
 *    seeded permutation) and tokens pick experts by weighted sampling without
 *    replacement (top-k of popularity + Gumbel noise, as a noisy router does);
 *    pi_i is then estimated once by Monte-Carlo from the seed.
 *  - EP over G GPUs: GPU g holds experts [g*E/G, (g+1)*E/G) with full shapes;
 *    TP: every GPU holds all experts with FC1 N and FC2 K sliced by G (rounded
 *    up to the format's block, as servers pad).  The slowest GPU sets the time.
 *  - per GPU and GEMM: weight bytes of the active experts + activation bytes
 *    against the GPU's bandwidth, issued FLOPs (rows padded to the tile height)
 *    against its tensor rate (native FP4 where the GPU has it, else BF16: the
 *    weights are dequantized); or the measured table when one matches.
 * Nothing here needs a GPU.
 */
#ifndef FP4MOE_SIM_H
#define FP4MOE_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "fp4moe/arch.h"
#include "fp4moe/format.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FM_PARALLEL_EP = 0, FM_PARALLEL_TP = 1 } fm_parallel;

/* Which grouped GEMM pads the rows: the planner's pick among CUTLASS tiles (the
 * field's kernels), or fp4moe's own swap-AB kernel (8/16/32/64 rows per pass). */
typedef enum { FM_SIM_KERNEL_CUTLASS = 0, FM_SIM_KERNEL_FP4MOE = 1 } fm_sim_kernel;

/* The MoE part of a model. Figures of the presets and their sources: docs/simulate.md. */
typedef struct {
    char        name[32];
    int         n_experts;      /* routed experts per MoE layer (whole model, before sharding) */
    int         top_k;          /* routed experts per token */
    int         hidden;         /* model dimension: FC1 K, FC2 N */
    int         inter;          /* expert intermediate size: FC1 N = 2*inter, FC2 K = inter */
    int         moe_layers;     /* layers with a routed MoE block */
    int         shared_experts; /* always-on shared experts per MoE layer (BF16) */
    int         shared_inter;   /* intermediate size of each shared expert */
    fm_format   wfmt;           /* routed-expert weight format */
    const char *source;         /* where the figures come from; NULL for a custom model */
} fm_sim_model;

/* Presets: glm5, deepseek-v3, qwen3-235b, gpt-oss-120b. */
int                 fm_sim_model_count(void);
const fm_sim_model *fm_sim_model_at(int i); /* NULL when i is out of range */
/* Copy a preset by name (case-insensitive). FM_OK, FM_ERR_INVALID_ARG (NULL),
 * FM_ERR_NOT_FOUND (detail lists the presets). *out untouched on failure. */
fm_status fm_sim_model_find(const char *name, fm_sim_model *out);

/* Measured grouped-GEMM times (CSV, format in docs/simulate.md):
 *   gpu,format,gemm,experts,n,k,rows_per_expert,us
 * one row = one grouped GEMM over `experts` experts of shape N x K, each given
 * rows_per_expert rows, taking `us` microseconds. */
typedef struct fm_sim_measured fm_sim_measured;

/* Load a CSV. FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_IO (cannot open/read, or
 * not a regular file: a FIFO or device is refused at once, never waited on),
 * FM_ERR_FORMAT (bad header or row; the detail names file:line),
 * FM_ERR_OOM. *out untouched on failure. */
fm_status fm_sim_measured_load(const char *path, fm_sim_measured **out);
void      fm_sim_measured_free(fm_sim_measured *m);
/* Rows loaded (0 for NULL). */
int fm_sim_measured_rows(const fm_sim_measured *m);
/* Time per expert of one grouped GEMM with `rows` rows (>= 0) on `gpu`/`fmt`/N/K:
 * us / experts, linear in rows between measured points, extended beyond the
 * last point along the last two. FM_OK, FM_ERR_INVALID_ARG, FM_ERR_NOT_FOUND
 * (no rows for that gpu, format and shape). */
fm_status fm_sim_measured_us(const fm_sim_measured *m, const char *gpu, fm_format fmt, int n, int k, double rows,
                             double *us_per_expert);

/* One row of a measured table, as loaded. */
typedef struct {
    char      gpu[64];
    fm_format fmt;
    char      gemm[16];
    int       experts, n, k;
    double    rows; /* rows per expert */
    double    us;   /* whole grouped GEMM */
} fm_sim_measured_point;
/* Row i in [0, fm_sim_measured_rows(m)) in file order. FM_OK, FM_ERR_INVALID_ARG
 * (NULL, i out of range). *out untouched on failure. */
fm_status fm_sim_measured_get(const fm_sim_measured *m, int i, fm_sim_measured_point *out);

typedef struct {
    fm_sim_model model;
    fm_gpu_info  gpu;             /* a row of the planner's GPU table (fm_gpu_find), copied */
    int          gpus;            /* GPUs the MoE layer is spread over, >= 1 */
    fm_parallel  parallel;        /* FM_PARALLEL_EP or FM_PARALLEL_TP */
    int          max_running;     /* concurrent requests decoded each step, >= 1 */
    int          tokens_per_step; /* tokens per request per step: 1 + MTP/speculative draft tokens */
    double       accepted;        /* tokens a request keeps per step (<= tokens_per_step); 0 = all */
    int          decode_steps;    /* decode steps per scheduler round (continuous decode), >= 1 */
    double       round_us;        /* CPU/scheduler overhead per round, amortised over decode_steps */
    double       skew;            /* Zipf exponent of expert popularity, 0 (uniform) .. 2 */
    uint64_t     seed;            /* popularity permutation and Monte-Carlo */
    int          mc_steps;        /* Monte-Carlo decode steps for the straggler time; 0 = off */
    fm_sim_kernel kernel;         /* whose tiles pad the rows (FM_SIM_KERNEL_CUTLASS default) */
    int          tile_m;          /* tile rows; 0 = the planner's pick (128 without a planner) */
    double       bw_eff;          /* achieved / listed memory bandwidth, [0.001, 1] */
    double       compute_eff;     /* achieved / listed tensor rate, [0.001, 1] */
    double       launch_us;       /* fixed cost per grouped-GEMM launch */
    const fm_sim_measured *measured; /* measured times, or NULL for the roofline only */
    /* Progress of long calls, or NULL: called now and then with the phase
     * ("crossings", "sweep", "Monte-Carlo", "routing") and the share of that
     * phase done, in [0, 1].  Never changes a result. */
    void (*progress)(void *ctx, const char *phase, double done);
    void *progress_ctx;
} fm_sim_config;

/* ---- ranges of the numeric settings ---------------------------------------------
 * One row per setting: fm_sim_config_check, the CLI's parser, its messages and
 * its --help all read these rows (docs/simulate.md lists them), so they cannot
 * disagree.  Both ends are included.  Some settings have a further limit that
 * depends on another (top-k <= experts, accepted <= tokens per step, requests x
 * tokens per step <= FM_SIM_MAX_STEP_TOKENS); seed and sweep-max are the CLI's. */
typedef enum {
    FM_SIM_SET_EXPERTS, FM_SIM_SET_TOPK, FM_SIM_SET_HIDDEN, FM_SIM_SET_INTER, FM_SIM_SET_LAYERS,
    FM_SIM_SET_SHARED_EXPERTS, FM_SIM_SET_SHARED_INTER, FM_SIM_SET_GPUS, FM_SIM_SET_MAX_RUNNING,
    FM_SIM_SET_TOKENS_PER_STEP, FM_SIM_SET_ACCEPTED, FM_SIM_SET_DECODE_STEPS, FM_SIM_SET_ROUND_US,
    FM_SIM_SET_SKEW, FM_SIM_SET_SEED, FM_SIM_SET_MC, FM_SIM_SET_TILE_M, FM_SIM_SET_BW_EFF,
    FM_SIM_SET_COMPUTE_EFF, FM_SIM_SET_LAUNCH_US, FM_SIM_SET_SWEEP_MAX,
    FM_SIM_SET_COUNT
} fm_sim_setting;

typedef struct {
    const char *flag;    /* the CLI flag, "--launch-us" */
    const char *name;    /* in messages, "launch us" */
    double      lo, hi;  /* accepted values, both included */
    int         integer; /* 1: whole numbers only */
    fm_status   status;  /* what fm_sim_config_check returns for a value outside */
} fm_sim_range;
/* The row of setting s, or NULL for an unknown s. */
const fm_sim_range *fm_sim_range_get(fm_sim_setting s);

#define FM_SIM_MAX_STEP_TOKENS (1 << 20) /* max running requests x tokens per step */

/* The simulator refuses a call whose estimated CPU time exceeds this (seconds,
 * on one core of a 2026 x86 server): the error names the estimate and the
 * settings to lower.  See fm_sim_estimate_seconds. */
#define FM_SIM_MAX_SECONDS 600.0

/* glm5 on 8x H200 (when the GPU table has it), EP, 64 requests, 1 token/step,
 * 1 decode step, uniform routing, seed 1, no Monte-Carlo, planner tile,
 * CUTLASS kernel, bw_eff 0.85, compute_eff 0.75, launch 5 us (docs/simulate.md says why). */
void fm_sim_config_default(fm_sim_config *c);

/* Validate settings against the range table (fm_sim_range_get) and each other.
 * FM_OK, FM_ERR_INVALID_ARG (NULL; a setting outside its range, the detail
 * naming it, its flag and the range; top_k > experts; EP degree not dividing the
 * experts; accepted > tokens_per_step; more than FM_SIM_MAX_STEP_TOKENS tokens a
 * step; unknown kernel or parallel mode; a GPU with no bandwidth or rate, or
 * non-finite figures), FM_ERR_BAD_SHAPE (hidden/inter/layers/shared experts out
 * of range, hidden not a multiple of the format's block), FM_ERR_FORMAT
 * (unknown weight format). */
fm_status fm_sim_config_check(const fm_sim_config *c);

/* Estimated CPU seconds of fm_sim_sweep(c, max_running, n) (n = 1: fm_sim_run)
 * plus, when dense_hi > 0, of fm_sim_find_crossings(c, dense_hi) with c's
 * Monte-Carlo off.  The model counts router draws (Monte-Carlo, and the pi
 * estimate under skew), binomial terms and planner calls at per-unit costs
 * measured on the development machine; it is meant to be right within a
 * small factor.  `what`, when not NULL, gets the dominant term and the flags
 * that lower it (cap bytes).  FM_OK, fm_sim_config_check's statuses,
 * FM_ERR_INVALID_ARG (NULL, n < 1 with a NULL array, a value out of range). */
fm_status fm_sim_estimate_seconds(const fm_sim_config *c, const int *max_running, int n, int dense_hi,
                                  double *seconds, char *what, int cap);

#define FM_SIM_HIST 9 /* rows-per-expert buckets: 0, 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+ */

typedef enum { FM_SIM_BW_BOUND = 0, FM_SIM_COMPUTE_BOUND = 1 } fm_sim_bound;

/* One operating point; per MoE layer on the slowest GPU unless said otherwise. */
typedef struct {
    int    max_running, tokens;          /* requests, tokens in the step (T) */
    int    local_experts;                /* experts held per GPU */
    int    fc1_n, fc1_k, fc2_n, fc2_k;   /* per-GPU per-expert GEMM shapes */
    int    tile_m, tile_n, tile_k;       /* tile used for padding (n, k: 0 when not from the planner) */
    int    tile_from_planner;            /* 1: the planner picked tile_m */
    int    straggler;                    /* index of the slowest GPU (EP) */
    double rows_per_expert;              /* expected rows per local expert, idle ones included */
    double rows_per_active;              /* expected rows per active expert */
    double active_experts;               /* expected active experts on the slowest GPU */
    int    rows_p50, rows_p90, rows_p99; /* percentiles of an active expert's rows */
    double hist[FM_SIM_HIST];            /* share of local experts per rows bucket */
    double waste;                        /* share of issued tile rows that are padding */
    double weight_mb, act_mb;            /* bytes moved by the routed GEMMs, MB (1e6) */
    double gflop_useful, gflop_issued;   /* routed GEMM work, GFLOP */
    double mem_us, compute_us;           /* roofline terms of the routed GEMMs (FC1 + FC2) */
    fm_sim_bound bound;                  /* which roofline term is larger */
    double peak_tflops;                  /* tensor rate used (FP4 native, else BF16) */
    double fc1_us, fc2_us, shared_us;    /* predicted times */
    double layer_us;                     /* fc1 + fc2 + shared on the slowest GPU */
    double imbalance;                    /* slowest / mean GPU routed time (1 = balanced) */
    int    measured;                     /* 1: FC1/FC2 from the measured table */
    int    mc;                           /* 1: layer time is the Monte-Carlo expected max over GPUs */
    double tflops;                       /* useful routed FLOPs / routed time */
    double efficiency;                   /* tflops / peak_tflops */
    double bw_util;                      /* routed bytes / routed time / listed bandwidth */
    double step_us;                      /* MoE part of one decode step (all layers + overhead) */
    double tokens_per_s;                 /* ceiling: requests * accepted tokens / step */
} fm_sim_result;

/* Simulate one operating point. FM_OK, the statuses of fm_sim_config_check,
 * FM_ERR_INVALID_ARG (the estimated work exceeds FM_SIM_MAX_SECONDS: the detail
 * gives the estimate and what to lower), FM_ERR_NONFINITE (a computed time or
 * rate is not finite: GPU figures too small for a double; the detail names it),
 * FM_ERR_NOT_FOUND (the measured table lacks the GPU's shapes: the detail says
 * which; use no table or measure them), FM_ERR_OOM. *out untouched on failure. */
fm_status fm_sim_run(const fm_sim_config *c, fm_sim_result *out);

/* The same at each of n values of max_running (each >= 1): out[n].
 * Statuses as fm_sim_run (FM_ERR_INVALID_ARG for a NULL array or bad value). */
fm_status fm_sim_sweep(const fm_sim_config *c, const int *max_running, int n, fm_sim_result *out);

/* Smallest max_running in [1, hi] where the expected rows per active expert
 * reach 8, 16, 32, 64 and where the routed GEMMs turn compute-bound; 0 = not
 * reached. */
typedef struct {
    int rows_at[4];       /* for 8, 16, 32, 64 rows per active expert */
    int compute_bound_at; /* first max_running with compute_us > mem_us */
} fm_sim_crossings;
/* Statuses as fm_sim_run (with c's Monte-Carlo ignored: the search is exact);
 * FM_ERR_INVALID_ARG for hi < 1. */
fm_status fm_sim_find_crossings(const fm_sim_config *c, int hi, fm_sim_crossings *out);

/* Per-token probability that each expert is picked: pi[n_experts], summing to
 * top_k (exact k/E when skew = 0; seeded Monte-Carlo estimate otherwise).
 * FM_OK, fm_sim_config_check's statuses, FM_ERR_INVALID_ARG (the estimate
 * would exceed FM_SIM_MAX_SECONDS: top-k close to the experts under strong
 * skew), FM_ERR_OOM. */
fm_status fm_sim_expert_probs(const fm_sim_config *c, double *pi);

/* Sample `steps` decode steps of routing (T tokens each, top_k distinct experts
 * per token) from `seed`: counts[steps][n_experts] rows per expert.
 * FM_OK, fm_sim_config_check's statuses, FM_ERR_INVALID_ARG (steps < 1, NULL,
 * or more than FM_SIM_MAX_SECONDS of estimated work), FM_ERR_OOM. counts
 * untouched on failure. */
fm_status fm_sim_sample_counts(const fm_sim_config *c, int steps, uint64_t seed, int32_t *counts);

/* ---- validation against measured times ----------------------------------------
 * The roofline's prediction for exactly what a measured row timed: `experts`
 * experts of shape N x K, every one given `rows` rows (so all are active, no
 * binomial), padded to the tile c's kernel picks for that many rows, on c's GPU
 * with c's efficiencies and launch cost.  docs/simulate.md reports the result
 * for bench/h200_fp4moe_gemm.csv. */
typedef struct {
    fm_sim_measured_point meas;
    int          tile_m;               /* rows per tile used for padding */
    double       mem_us, compute_us;   /* roofline terms */
    double       pred_us;              /* max(mem, compute) + launch */
    fm_sim_bound bound;
    double       rel_err;              /* (pred - measured) / measured */
} fm_sim_check_point;

/* Regimes of the summary, by rows per expert: decode (1-32), mid (33-256), large (257+). */
#define FM_SIM_REGIMES 3
typedef struct {
    int    n[FM_SIM_REGIMES + 1];          /* points per regime; [FM_SIM_REGIMES] = all */
    double median_abs[FM_SIM_REGIMES + 1]; /* median |rel_err| */
    double max_abs[FM_SIM_REGIMES + 1];    /* max |rel_err| */
    double mean_bias[FM_SIM_REGIMES + 1];  /* mean rel_err (< 0: the model is optimistic) */
} fm_sim_check_summary;

/* Predict every row of m whose gpu is c->gpu.name and whose format is
 * c->model.wfmt, in file order, into out[cap]; *n = rows compared; summary
 * (may be NULL) gets the errors by regime.  The model's shapes are ignored:
 * each row brings its own.  FM_OK, fm_sim_config_check's statuses,
 * FM_ERR_INVALID_ARG (NULL out/m/n, cap too small: *n then says how many),
 * FM_ERR_NONFINITE (a prediction is not finite), FM_ERR_NOT_FOUND (no row for
 * that GPU and format), FM_ERR_OOM. out and
 * summary untouched on failure. */
fm_status fm_sim_validate(const fm_sim_config *c, const fm_sim_measured *m, fm_sim_check_point *out, int cap, int *n,
                          fm_sim_check_summary *summary);

/* Efficiencies fitted to a measured table: the (bw_eff, compute_eff) pair on
 * a 0.005 grid over (0, 1] that minimises the mean |log(pred / measured)| of
 * fm_sim_validate's points (a ratio error, so fast and slow points weigh the
 * same). Exact over the grid in O(points x 400 + 40,000 log points): the
 * points are ordered by compute/memory ratio, so at every grid pair the
 * memory-bound ones are a prefix.  FM_OK and fm_sim_validate's statuses;
 * outputs untouched on failure. */
fm_status fm_sim_fit_eff(const fm_sim_config *c, const fm_sim_measured *m, double *bw_eff, double *compute_eff);

/* Efficiencies of fp4moe's kernels on the H200, fitted by fm_sim_fit_eff to
 * bench/h200_fp4moe_gemm.csv (bench/HISTORY.md, "GPU, 2026-11-30 sixth session": launches
 * timed queued back to back): `fp4moe simulate --calibrated-h200`.  Not the defaults:
 * those describe a kernel at the measured copy/GEMM ceilings (docs/simulate.md says
 * why). Timed one launch at a time instead, the same kernels fit lower (the launch gap
 * counted in): refit from that CSV whenever the kernels or the timing method change. */
#define FM_SIM_H200_FP4MOE_BW_EFF 0.725      /* 3.48 TB/s: 82 % of the 4.234 TB/s copy ceiling */
#define FM_SIM_H200_FP4MOE_COMPUTE_EFF 0.67  /* 663 TFLOP/s: the wgmma kernels at 128+ rows (591-744) */

/* Per-point table and the summary by regime. FM_OK, FM_ERR_INVALID_ARG, FM_ERR_IO. */
fm_status fm_sim_write_validation(FILE *f, const fm_sim_config *c, const fm_sim_check_point *p, int n,
                                  const fm_sim_check_summary *s);
/* The same points as CSV (header + one line each). Same statuses. */
fm_status fm_sim_write_validation_csv(FILE *f, const fm_sim_check_point *p, int n);

/* ---- reports ---------------------------------------------------------------- */

/* Human-readable description of the settings and one point (with crossings when
 * x != NULL). FM_OK, FM_ERR_INVALID_ARG, FM_ERR_IO (write failed). */
fm_status fm_sim_write_text(FILE *f, const fm_sim_config *c, const fm_sim_result *r, const fm_sim_crossings *x);
/* A table of sweep points. Same statuses. */
fm_status fm_sim_write_sweep_text(FILE *f, const fm_sim_result *r, int n);
/* CSV: a header, then one line per point. Same statuses. */
fm_status fm_sim_write_csv(FILE *f, const fm_sim_result *r, int n);
/* JSON: {"config":{...}, "points":[...], "crossings":{...}} (x may be NULL).
 * Same statuses plus FM_ERR_OOM. */
fm_status fm_sim_write_json(FILE *f, const fm_sim_config *c, const fm_sim_result *r, int n,
                            const fm_sim_crossings *x);
/* Plot rows per active expert, efficiency and waste against max_running with
 * gnuplot into a PNG (any path: quotes and backslashes are quoted into the
 * script). FM_OK, FM_ERR_INVALID_ARG (NULL, no points, a path holding a
 * newline or longer than 4000 bytes), FM_ERR_NOT_FOUND (gnuplot is
 * not installed: the detail says how to get it), FM_ERR_IO (gnuplot failed or
 * wrote nothing). */
fm_status fm_sim_plot(const char *png_path, const fm_sim_config *c, const fm_sim_result *r, int n,
                      const fm_sim_crossings *x);

#ifdef __cplusplus
}
#endif
#endif
