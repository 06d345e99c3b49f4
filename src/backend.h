/* backend.h - the backend function table (ggml's backend interface, reduced).
 * Each backend defines one const fm_backend_ops; layer.c dispatches through it
 * and does every check the backends share, so a backend sees validated input. */
#ifndef FM_BACKEND_H
#define FM_BACKEND_H

#include "fm_internal.h"

/* What a backend is created with: the model's layer (cfg: n_experts is the
 * global count routing runs over) and the deployment (desc, normalised: n_local
 * >= 1, device set for cuda). */
typedef struct {
    fm_moe_config   cfg;
    int             max_tokens;
    int             first, n_local; /* the shard: local expert e = global first + e */
    fm_out_dtype    out_dtype;
    int             caller_workspace;
    int             decode_work_list; /* fm_layer_desc.decode_work_list */
    float           row_quantile;     /* fm_layer_desc.row_quantile */
    int             pdl_chain;        /* fm_layer_desc.pdl_chain */
    int             decode_path;      /* fm_layer_desc.decode_path */
    int             act_fp8_path;     /* fm_layer_desc.act_fp8_path */
    fm_cuda_device *device;         /* cuda only */
} fm_layer_params;

/* The tuner's inputs (src/layer/tune.c): host BF16 x[T][hidden] and n_routings external
 * routings ids / weights [n_routings][T][top_k] of global experts. */
typedef struct {
    const uint16_t *x;
    const int32_t  *ids;
    const float    *weights;
    int             n_routings, T;
} fm_tune_inputs;

/* What the bucket policy (src/layer/buckets.c) asks the planner for one GEMM: rows per
 * expert and active experts to rank for, X packed, K splits the planner's to choose. */
typedef struct {
    int rows, active, x_packed, k_splits_auto;
} fm_gemm_hint;

/* Batch-size buckets: bucket b holds T in (2^(b-1), 2^b] (src/layer/buckets.c). */
#define FM_LAYER_BUCKETS 32
int fm_layer_bucket_of(int T);
/* The largest T of bucket b: 2^b, at most max_tokens. */
int fm_layer_bucket_tokens(int max_tokens, int b);

typedef struct {
    const char *name;
    /* FM_OK when this backend can run here (device present, ...). */
    fm_status (*available)(void);
    /* p->cfg has passed fm_moe_config_check and w the shape checks in layer.c
     * (w->w13/w2/a1/a2 hold p->n_local experts); copy/prepack what is needed:
     * w does not outlive this call. */
    fm_status (*create)(const fm_layer_params *p, const fm_moe_weights *w, void **state);
    /* The refusals of create that depend on p and on which optional weights are given
     * (features: FM_FEATURE_* of the weights), not on their values; create calls it
     * itself, so fm_layer_supports and create answer alike. NULL: it refuses none. */
    fm_status (*supports)(const fm_layer_params *p, unsigned features);
    /* a has passed layer.c's argument checks (pointers, T, ids/weights paired,
     * workspace, alignment); CPU backends must not write a->out on failure. */
    fm_status (*run)(void *state, const fm_layer_run_args *a, fm_run_stats *stats);
    /* fm_layer_run_dispatched: a has passed fm_layer_check_dispatch_args (src/layer/dispatch_check.c) (pointers, layout, alignment,
     * workspace; no shared expert; x_fp8 only to a layer with act_fp8 = BLOCK128). CPU
     * backends read counts / offsets through fm_dispatch_rows (they live in host memory) and
     * must not write a->out on failure; the cuda backend leaves them on the device, checks
     * them there and records what is wrong for errors (layer_run.c). NULL: FM_ERR_UNSUPPORTED. */
    fm_status (*run_dispatched)(void *state, const fm_layer_dispatch_args *a, fm_run_stats *stats);
    /* fm_layer_forward with host x / FP32 out; NULL: run is called with the host
     * pointers (CPU backends). x has passed the finite check. */
    fm_status (*forward_host)(void *state, const uint16_t *x, int T, float *out, fm_run_stats *stats);
    /* fm_layer_errors; NULL: nothing is deferred (CPU backends). */
    fm_status (*errors)(void *state, void *stream, fm_layer_error_info *info);
    /* Tile plans, made by the layer's bucket policy at create (NULL: none). gemm_choose:
     * the planner's first choice for GEMM g (0: FC1 gate/up + SwiGLU, 1: FC2 down +
     * finalize) under h (feature_blocks, k_splits, est_us may be NULL). packed_x_ok:
     * whether GEMM g can read packed X on the backend's device. install: plans[0..n) of
     * buckets 0..n-1 (the policy's, unchecked) resolved for launch. */
    fm_status (*gemm_choose)(void *state, int g, const fm_gemm_hint *h, fm_tile *tile, int *feature_blocks,
                             int *k_splits, double *est_us);
    int (*packed_x_ok)(void *state, int g);
    fm_status (*install)(void *state, const fm_layer_plan_info *plans, int n);
    /* fm_layer_plan (T checked); NULL: the backend has none (FM_ERR_UNSUPPORTED). */
    fm_status (*plan)(void *state, int T, fm_layer_plan_info *info);
    /* fm_layer_set_plan (T and info's pointer checked); NULL: FM_ERR_UNSUPPORTED. */
    fm_status (*set_plan)(void *state, int T, const fm_layer_plan_info *info);
    /* fm_layer_tune's timing (src/layer/tune.c runs the search; NULL: FM_ERR_UNSUPPORTED).
     * tune_begin: after the work on stream, the inputs on the device and what timing
     * needs (*bench; on failure nothing is left). tune_time: the plan the backend holds
     * now for in->T, run warm + reps times rotating over the routings (run i on routing
     * (i + warm) % n_routings) as graph replays, the reps' times in us into t[reps].
     * tune_end: ok = 1 reads the error word (what the runs recorded is a failure), ok = 0
     * clears it; then frees bench. tune_tiles: the tiles with code on the device (mma
     * family first, catalogue order), at most cap, the count returned. */
    fm_status (*tune_begin)(void *state, const fm_tune_inputs *in, void *stream, void **bench);
    fm_status (*tune_time)(void *state, void *bench, int warm, int reps, double *t);
    fm_status (*tune_end)(void *state, void *bench, int ok);
    size_t (*tune_tiles)(void *state, fm_tile *out, size_t cap);
    /* bytes of caller workspace a run needs (p->caller_workspace); NULL: 0. */
    size_t (*workspace_bytes)(void *state);
    void (*destroy)(void *state);
} fm_backend_ops;

/* Plan files (src/layer_plans.c), through the public fm_layer_plan / fm_layer_set_plan.
 * load: the plans of path's matching section and shape, all or none; *note says what
 * happened when the file was not used (FM_OK then). */
fm_status fm_layer_plans_load(fm_layer *l, const fm_layer_params *p, const char *path, char *note, size_t nn);
fm_status fm_layer_plans_save(fm_layer *l, const fm_layer_params *p, const char *path);

extern const fm_backend_ops fm_cpu_ref_ops; /* src/cpu/backend_ref.c */
extern const fm_backend_ops fm_cpu_ops;     /* src/cpu/backend_fast.c */
#ifdef FM_HAVE_CUDA
extern const fm_backend_ops fm_cuda_ops; /* src/cuda/backend_cuda.c */
#endif

/* Dispatched rows (src/layer_dispatch.c), for backends that read counts / offsets on the
 * host: checks a's counts (each in [0, capacity]) or offsets (from 0, non-decreasing) for
 * n_local experts, their total against max_rows, and writes the packed row ranges:
 * local expert e's rows are [offsets[e], offsets[e + 1]) (n_local + 1 entries), *rows the
 * total. Statuses: FM_ERR_BAD_SHAPE, with `who` in the message. */
fm_status fm_dispatch_rows(const fm_layer_dispatch_args *a, int n_local, int64_t max_rows, const char *who,
                           int32_t *offsets, int *rows);

/* Row r of a's input (x BF16, or x_fp8 times its x_scales) as FP32 into dst[hidden]: FM_OK, or
 * FM_ERR_NONFINITE naming the row r (local expert e) and element or scale (NaN/Inf in a BF16
 * row, an E4M3 NaN code, a scale not finite and > 0); `who` starts the message. */
fm_status fm_dispatch_row_f32(const fm_layer_dispatch_args *a, size_t r, int hidden, int e, const char *who,
                              float *dst);

/* The row of a's x / out / weights that holds packed row p of local expert e. */
static inline size_t fm_dispatch_slot(const fm_layer_dispatch_args *a, const int32_t *offsets, int e, int32_t p)
{
    return a->layout == FM_DISPATCH_EXPERT_MAJOR ? (size_t)e * (size_t)a->capacity + (size_t)(p - offsets[e])
                                                 : (size_t)p;
}

/* create's checks that need no weights (src/layer.c), shared with fm_layer_supports:
 * the description and configuration (*first / *n_local: the shard), then the backend
 * (AUTO resolved, compiled in, a device present). ops: the table of a resolved kind. */
fm_status             fm_layer_check_desc(const fm_layer_desc *d, const fm_moe_config *cfg, int64_t *first,
                                          int64_t *n_local);
fm_status             fm_layer_resolve_backend(const fm_layer_desc *d, fm_backend_kind *kind);
const fm_backend_ops *fm_layer_backend_ops(fm_backend_kind kind);
/* The FM_FEATURE_* bits that w gives (w not NULL). */
unsigned fm_weights_features(const fm_moe_weights *w);

/* Shape/format check of every weight tensor against cfg (shared by all backends);
 * it checks cfg->n_experts experts (layer.c passes the shard's count). */
fm_status fm_moe_weights_check(const fm_moe_config *cfg, const fm_moe_weights *w);

/* w13 of local expert e as its two halves: half 0 = the gate rows [0, inter) under
 * w13[e].global_scale, half 1 = the up rows [inter, 2*inter) under w->w13_up_global[e] when
 * given (else the same global). Views into w13[e]'s buffers (shapes checked). */
static inline fm_qtensor fm_moe_w13_half(const fm_moe_weights *w, int e, int inter, int half)
{
    fm_qtensor t = w->w13[e];
    const fm_format_traits *tr = fm_format_traits_get(t.fmt);
    t.rows = inter;
    if (half) {
        const size_t r0 = (size_t)inter;
        t.data = (uint8_t *)t.data + r0 * fm_format_row_bytes(t.fmt, t.cols);
        if (t.scales && tr && tr->block) t.scales += r0 * (size_t)(t.cols / tr->block);
        if (w->w13_up_global) t.global_scale = w->w13_up_global[e];
    }
    return t;
}

/* Does local expert e's w13 have an up global that differs from its gate global? */
static inline int fm_moe_w13_split(const fm_moe_weights *w, int e)
{
    return w->w13_up_global && w->w13_up_global[e] != w->w13[e].global_scale;
}

/* Tests only (tests/test_layer_threads.c): take (hold 1) or give back (hold 0) the
 * layer's in-use flag as a call running on another thread holds it, so that every
 * entry point's FM_ERR_BUSY can be checked without a race. Taking a held flag is
 * FM_ERR_BUSY; giving back is FM_OK. */
fm_status fm_layer_test_hold(fm_layer *l, int hold);

/* out[i] = BF16(in[i]) (round to nearest even), n elements (CPU backends' BF16 output). */
void fm_layer_store_bf16(const float *in, size_t n, uint16_t *out);

#endif
