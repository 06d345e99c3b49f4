/* gemm_plan.h - one grouped GEMM resolved for launch (not installed).
 *
 * Which kernel runs is decided once, not at every launch: fm_cuda_gemm_plan_make
 * resolves the problem, the tile choice and the planner's hints into an fm_gemm_plan
 * (the tile's catalogue row, the variant, the feature blocks, the shared memory; the
 * layer makes one per GEMM per batch-size bucket at create and at fm_layer_set_plan),
 * so that a run, which a serving engine replays at every step, pays for no catalogue
 * search and no planning; fm_cuda_gemm_launch only fills the kernel's parameters from
 * the plan and the operands (the buffers of one call) and launches. The public
 * fm_cuda_gemm is make + launch. Plain C: the layer holds plans without CUDA types. */
#ifndef FM_CUDA_GEMM_PLAN_H
#define FM_CUDA_GEMM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which kernel a plan launches: the one place that says it (the tile's family, its
 * persist field and its catalogue row's kernels all agree on it at make time). */
typedef enum {
    FM_GEMM_MMA = 0,          /* mma.sync, one feature block per CTA */
    FM_GEMM_MMA_MULTI,        /* mma.sync multi-block kernel: nb > 1 feature blocks per CTA */
    FM_GEMM_MMA_LIST,         /* mma.sync work-list kernel: split K and/or the experts' list */
    FM_GEMM_WGMMA,            /* wgmma; natural X (single-role) or packed X (warp-specialized) */
    FM_GEMM_WGMMA_PERSISTENT, /* wgmma persistent kernel (packed X only, at most one CTA per SM) */
} fm_gemm_variant;

/* What a plan is made for: the problem (weights, epilogue, layouts) and the caller's
 * choices and hints (fm_cuda_gemm_args's fields of the same names). */
typedef struct {
    const fm_cuda_weights *w;
    fm_cuda_epilogue       epi;
    int                    x_packed, y_packed;
    const fm_tile         *tile; /* NULL: the planner's first candidate */
    int                    expected_rows, active_experts;
    size_t                 smem_limit;
    int                    feature_blocks; /* 0: automatic */
    int                    k_splits;       /* FM_CUDA_K_SPLITS_AUTO, 0 / 1: none, 2..: that many */
    int                    work_list;      /* 1: the launches pass an experts' list (fm_gemm_operands.expert_list) */
    int                    expert_slots;
    int                    pdl, pdl_reduce;
} fm_gemm_request;

/* A resolved launch: nothing in it is looked up again at launch. */
typedef struct {
    fm_tile         tile; /* for messages and fm_layer_plan */
    int             idx;  /* the tile's row in its family's catalogue (fm_mma_tiles / fm_wgmma_tiles) */
    fm_gemm_variant variant;
    int             epi;
    int             x_packed, y_packed;
    int             nb;       /* feature blocks per CTA */
    int             k_splits; /* 1: none */
    int             expert_slots;
    size_t          smem;     /* dynamic shared memory, the planner's byte count */
    int             pdl;        /* resolved for the device: PDL launch (cc 9.0+) */
    int             pdl_reduce; /* FINALIZE_DET's reduce launched with PDL too */
    unsigned        sc_mul, sc_add; /* the weights' scale decode (fm_pack_format) */
    int             n_experts, n, k; /* the weights' shape the plan was made for */
} fm_gemm_plan;

/* The buffers of one call (fm_cuda_gemm_args's fields of the same names). The grid
 * follows max_rows, so it is the launcher's arithmetic, not the plan's. */
typedef struct {
    const fm_cuda_weights *w;
    const uint16_t        *x;
    const int32_t         *offsets;
    int                    max_rows;
    void                  *y;
    const float           *row_weight;
    const int32_t         *row_token;
    int                    n_tokens, top_k;
    const int32_t         *token_slots;
    float                 *scratch;
    int                    y_zero_init;
    uint16_t              *y_bf16;
    void                  *split_ws;
    size_t                 split_ws_bytes;
    const int32_t         *expert_list;
    /* fm_gemm_oss (cuda_internal.h): the layer's device copy of the experts' bias of this
     * GEMM (NULL: none) and FC1's activation with its limit; 0 / NULL: the plain kernels */
    const float           *bias;
    int                    act;
    float                  act_limit;
} fm_gemm_operands;

/* A CUDA error (a cudaError_t as int) as the library's status, with what failed. */
fm_status fm_cuda_status(int err, const char *what);

/* Whether a GEMM with K columns of X can read packed X on d: the wgmma kernels read it,
 * so the device needs their code (sm_90a in the build, a 9.0 device), and K % 64 == 0.
 * The one place that decides it. */
int fm_cuda_packed_x_ok(const struct fm_cuda_device *d, int k);

/* The planner's choice for r on d (r->tile ignored): fm_cuda_gemm_choose on a device. */
fm_status fm_cuda_gemm_plan_choose(const struct fm_cuda_device *d, const fm_gemm_request *r, fm_tile *tile,
                                   int *feature_blocks, int *k_splits, double *est_us);
/* Resolve r on d into *out: the planner's tile when r->tile is NULL, then every check
 * fm_cuda_gemm makes of a tile (compiled in, code on d, X / Y layouts, SwiGLU pairs,
 * feature blocks, K splits, shared memory). Statuses as fm_cuda_gemm's; *out written
 * only on FM_OK. */
fm_status fm_cuda_gemm_plan_make(const struct fm_cuda_device *d, const fm_gemm_request *r, fm_gemm_plan *out);
/* The same with the tile already resolved: chosen_nb the planner's feature blocks (0:
 * from r->feature_blocks), ks the K splits (>= 1). */
fm_status fm_cuda_gemm_plan_fill(const struct fm_cuda_device *d, const fm_gemm_request *r, const fm_tile *t,
                                 int chosen_nb, int ks, fm_gemm_plan *out);
/* Launch plan p with operands o on stream (d current, p made on d): the kernel's
 * parameters from p and o, then the kernel (and FINALIZE_DET's reduce). No planning, no
 * catalogue search, no device query. Returns FM_OK, FM_ERR_INVALID_ARG (o's weights are
 * not the shape p was made for; split_ws too small for p's splits), FM_ERR_UNSUPPORTED
 * (a wgmma grid over 2^31-1 CTAs), FM_ERR_CUDA. */
fm_status fm_cuda_gemm_launch(const struct fm_cuda_device *d, const fm_gemm_plan *p, const fm_gemm_operands *o,
                              void *stream);

#ifdef __cplusplus
}
#endif
#endif
