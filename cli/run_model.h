/* run_model.h - the layer `fp4moe run` executes: random quantized weights of a
 * given shape, or a real layer loaded from a checkpoint. */
#ifndef FM_RUN_MODEL_H
#define FM_RUN_MODEL_H

#include <stdint.h>

#include "fp4moe.h"

typedef struct {
    fm_moe_config   cfg;
    fm_backend_kind backend;
    int             tokens, iters, check, json, layer;
    uint64_t        seed;
    const char     *weights_path;
} fm_run_opts;

typedef struct {
    fm_moe_config  cfg;
    fm_moe_weights w;
    uint16_t      *x;              /* [tokens][hidden] BF16 input */
    int            active_experts; /* experts with >= 1 routed row for x */
    /* owned storage */
    fm_qtensor *w13, *w2;
    void       *blob;     /* one allocation for all expert data and scales */
    float      *router_w, *router_bias;
    uint16_t   *shared_w13, *shared_w2;
    fm_ckpt_layer *ckpt;  /* the loaded layer with --weights (owns its buffers) */
} fm_run_model;

void      fm_run_opts_default(fm_run_opts *o);
fm_status fm_run_model_build(const fm_run_opts *o, fm_run_model *m);
void      fm_run_model_free(fm_run_model *m);
/* Bytes the layer must read at least once for T tokens: weights + scales of the
 * active experts, the router, the shared expert, input x and output. */
double fm_run_model_bytes(const fm_run_model *m, int T);
/* 2 * multiply-adds of the routed and shared GEMMs. */
double fm_run_model_flops(const fm_run_model *m, int T);

#endif
