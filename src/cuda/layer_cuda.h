/* layer_cuda.h - the cuda backend's layer state, shared by its parts (not installed):
 * backend_cuda.c (create, destroy, the ops table), layer_plan.c (the plans), layer_run.c
 * (the run), tune.c (the timing ops fm_layer_tune calls). */
#ifndef FM_CUDA_LAYER_CUDA_H
#define FM_CUDA_LAYER_CUDA_H

#include <cuda_runtime.h>

#include "backend.h"
#include "cuda/cuda_internal.h"
#include "cuda/gemm_plan.h"
#include "cuda/moe_kernels.h"

#define FM_WS_ALIGN 256

typedef struct {
    fm_tile      t1, t2;   /* FC1, FC2 tiles */
    int          nb1, nb2; /* feature blocks per CTA */
    int          ks1, ks2; /* K splits (1: none) */
    int          slots;    /* experts the mma grids are sized for (the bucket's expected active experts) */
    int          pk1, pk2; /* packed X of FC1 / FC2 */
    int          rows, act; /* rows per expert and active experts the tiles were chosen for */
    fm_gemm_plan g[2];      /* FC1, FC2 resolved for launch (make_gemm_plan) */
    /* the one-launch decode kernel (decode.cu) instead of the chain above: its K splits and
     * grid resolved, dcounter its fm_decode_params.dynamic; note: why the bucket cannot run it
     * ("" if it can) */
    int          decode, dks1, dks2, dgrid, dcounter;
    char         dnote[96];
    int          fp8; /* 1: the W4A8 chain (enqueue_w4a8) runs the bucket instead of the above */
} fm_bucket_plan;

/* Byte offsets of the per-run buffers inside the workspace. */
typedef struct {
    size_t xp, h, logits, out32, scratch, rw, off, perm, slots, ids, wts, rscratch, pscratch, hs, badlogit, active;
    /* W4A8 (act_fp8) only, 0 otherwise: x's E4M3 codes and scales, FC1's FP32 output, the
     * activation's E4M3 codes and scales (FC2's input; h itself is never stored in FP32) */
    size_t xq, xsc, y1, hq, hsc;
    size_t total;
} fm_ws_layout;

/* A W4A8 layer's weights (act_fp8): the FP4 codes in the W4A8 GEMM's layout
 * (fm_fp8mma_pack), the checkpoint's block scales and the same packed by 128-K group, per local
 * expert back to back */
typedef struct {
    uint8_t *q13, *sc13, *q2, *sc2;
    uint8_t *sp13, *sp2;         /* the block scales packed for the staged kernels (fm_fp8mma_pack_scales) */
    float   *gs13, *us13, *osc2; /* [n_local]: FC1's gate / up global scales, FC2's (1 for MXFP4) */
    int      kernel;             /* FM_FP8MMA_*: FM_FP8MMA_AUTO unless $FM_W4A8_KERNEL names one (an A/B knob) */
} fm_w4a8_weights;

typedef struct {
    fm_layer_params     p;
    const fm_cuda_device *dev;
    fm_cuda_weights    *w13, *w2;
    int                 bad_bias; /* index of a NaN/Inf router bias (run refuses internal routing), or -1 */
    float               bad_bias_value;
    float              *d_router, *d_bias; /* d_bias NULL without a bias */
    float              *d_b13, *d_b2;      /* the local experts' FC1 / FC2 biases (gpt-oss), NULL without */
    uint16_t           *d_sw13, *d_sw2;    /* shared expert, BF16 */
    fm_moe_dev_errors  *d_err;
    unsigned           *d_ticket;          /* internal routing's fused launch (fm_moe_route_fused_launch): 0 at rest */
    fm_ws_layout        ws;
    void               *ws_own;            /* the layer's workspace (NULL with caller workspace) */
    void               *d_split;           /* split-K counters + partials of both GEMMs (NULL: no bucket splits) */
    size_t              split_bytes;
    uint16_t           *d_xstage;          /* fm_layer_forward: x uploaded here */
    float              *d_ostage;          /* fm_layer_forward: FP32 out before download */
    cudaStream_t        own_stream;        /* fm_layer_forward's stream */
    cudaEvent_t         ev0, ev1;
    int                 n_buckets;
    fm_bucket_plan      plan[FM_LAYER_BUCKETS];
    int                 pdl_chain; /* cc 9.0+ unless desc.pdl_chain is OFF: gather and reduce launched with PDL too */
    int                 decode_occ;  /* decode kernel CTAs per SM (0: it cannot run here), -1: not asked yet */
    void               *d_decode;    /* the decode kernel's counters + partials, zero at rest (NULL: no decode bucket) */
    size_t              decode_bytes;
    int                 decode_counter_min_t; /* the decode buckets whose runs have at least this many tokens take
                                                 the kernel's units from its counter (dcounter):
                                                 FM_DECODE_COUNTER_MIN_T unless $FM_DECODE_UNITS says otherwise */
    int                 w4a8;        /* act_fp8: the W4A8 weights are held; the buckets whose plan says fp8 run
                                        the W4A8 chain (layer_run.c, enqueue_w4a8), the others W4A16 */
    fm_w4a8_weights     q8;
} fm_cuda_layer;

/* The run's workspace: the caller's (workspace != NULL) or the layer's own. */
static inline unsigned char *fm_cuda_layer_ws(const fm_cuda_layer *s, void *workspace)
{
    return workspace ? (unsigned char *)workspace : (unsigned char *)s->ws_own;
}

/* A CUDA error (a cudaError_t as int) as the backend's status, the sticky error cleared. */
fm_status fm_cuda_layer_fail(int err, const char *what);
/* Enqueue one run on stream (the layer's device current). */
fm_status fm_cuda_layer_enqueue(fm_cuda_layer *s, const fm_layer_run_args *a, void *stream);
/* Read and clear the error word (stream already synchronised by the caller); info may be NULL. */
fm_status fm_cuda_layer_read_errors(fm_cuda_layer *s, cudaStream_t stream, fm_layer_error_info *info);

/* T's bucket among the installed ones (the last holds every T up to max_tokens). */
int fm_cuda_layer_bucket(const fm_cuda_layer *s, int T);

/* fm_backend_ops' entries (backend.h says what each does): run, run_dispatched and errors (layer_run.c),
 * plans (layer_plan.c) */
fm_status fm_cuda_layer_run(void *state, const fm_layer_run_args *a, fm_run_stats *stats);
fm_status fm_cuda_layer_run_dispatched(void *state, const fm_layer_dispatch_args *a, fm_run_stats *stats);
fm_status fm_cuda_layer_forward_host(void *state, const uint16_t *x, int T, float *out, fm_run_stats *stats);
fm_status fm_cuda_layer_errors(void *state, void *stream, fm_layer_error_info *info);
fm_status fm_cuda_layer_gemm_choose(void *state, int g, const fm_gemm_hint *h, fm_tile *tile, int *feature_blocks,
                                    int *k_splits, double *est_us);
int       fm_cuda_layer_packed_x_ok(void *state, int g);
fm_status fm_cuda_layer_install(void *state, const fm_layer_plan_info *plans, int n);
fm_status fm_cuda_layer_plan(void *state, int T, fm_layer_plan_info *info);
fm_status fm_cuda_layer_set_plan(void *state, int T, const fm_layer_plan_info *info);

/* fm_backend_ops' tune ops (tune.c; backend.h says what each does) */
fm_status fm_cuda_tune_begin(void *state, const fm_tune_inputs *in, void *stream, void **bench);
fm_status fm_cuda_tune_time(void *state, void *bench, int warm, int reps, double *t);
fm_status fm_cuda_tune_end(void *state, void *bench, int ok);
size_t    fm_cuda_tune_tiles(void *state, fm_tile *out, size_t cap);

#endif
