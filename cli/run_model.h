/* run_model.h - the layer `fp4moe run` executes: random quantized weights of a
 * given shape, or a real layer loaded from a checkpoint. */
#ifndef FM_RUN_MODEL_H
#define FM_RUN_MODEL_H

#include <stdint.h>

#include "fp4moe/tools.h"

typedef struct {
    fm_moe_config   cfg;
    fm_backend_kind backend;
    int             tokens, iters, check, json, layer;
    int             tokens_set;   /* --tokens was given (it must then agree with --input) */
    uint64_t        seed;
    const char     *weights_path;
    unsigned        route_set;    /* routing flags given: bits (1u << FM_ROUTE_x) of cfg */
    const char     *input_path;   /* --input x.npy: [T][hidden] BF16 ('<u2', '<V2') or FP32 ('<f4') */
    const char     *output_path;  /* --output y.npy: FP32 [T][hidden] */
    /* --shard FIRST:COUNT (shard_count 0: all experts) and --global-experts N (0: not
     * given). With global_experts, cfg.n_experts is N (the router and the routing
     * are over N), and the random weights are made for the held experts only, each
     * from the same seed as expert FIRST+i of the whole model (so a layer built with
     * --global-experts N --shard F:C equals --experts N --shard F:C bit for bit). */
    int             shard_first, shard_count, global_experts;
} fm_run_opts;

typedef struct {
    fm_moe_config  cfg;
    fm_moe_weights w;
    uint16_t      *x;              /* [tokens][hidden] BF16 input */
    int            tokens;         /* T: --tokens, or the rows of --input */
    int            active_experts; /* experts of the shard (all, without one) with >= 1 routed row for x */
    long long      local_rows;     /* routed (token, expert) slots of x on the shard's experts */
    /* w.w13/w2/a1/a2 hold experts [first_held, first_held + n_held) of cfg.n_experts:
     * all of them (first_held 0), or with --global-experts the shard's only */
    int            first_held, n_held;
    int            shard_first, shard_n; /* the experts run: [shard_first, shard_first + shard_n) */
    /* owned storage */
    fm_qtensor *w13, *w2;
    void       *blob;     /* one allocation for all expert data and scales */
    float      *router_w, *router_bias;
    uint16_t   *shared_w13, *shared_w2;
    fm_ckpt_layer *ckpt;  /* the loaded layer with --weights (owns its buffers) */
    /* set when fm_run_model_build fails: 1 when the --input file was at fault (unreadable,
     * malformed, a shape that does not fit the layer or --tokens): exit 1 like any bad file,
     * not the usage code 2 of a bad flag */
    int bad_input;
} fm_run_model;

void      fm_run_opts_default(fm_run_opts *o);
/* Build the layer and its input: random weights of cfg's shape, or the layer
 * of a checkpoint (routing flags in route_set override the model's, each said
 * on stderr); x from --input or seeded N(0, 1). Refuses up front (FM_ERR_INVALID_ARG)
 * a run whose host memory estimate (fm_run_host_bytes) exceeds the host's
 * physical memory, or whose T x hidden / T x top_k exceed what a layer takes
 * (2^31-1). m->cfg/T on return: the layer run and the token count used. */
fm_status fm_run_model_build(const fm_run_opts *o, fm_run_model *m);
/* Host bytes a run of T tokens allocates beyond the weights: x, out, the --check
 * reference, routing buffers, and (cpu_ws) the CPU backends' per-row workspace. */
double fm_run_host_bytes(const fm_moe_config *c, int T, int check, int cpu_ws);
/* Write out[T][hidden] to --output (FP32 .npy). */
fm_status fm_run_write_output(const fm_run_opts *o, const fm_run_model *m, const float *out);
void      fm_run_model_free(fm_run_model *m);
/* Bytes the layer must read at least once for T tokens: weights + scales of the
 * active experts (of the shard), the router, the shared expert (the shard holding
 * expert 0), input x and output. */
double fm_run_model_bytes(const fm_run_model *m, int T);
/* 2 * multiply-adds of the routed GEMMs (the shard's rows), the shared expert and the router. */
double fm_run_model_flops(const fm_run_model *m, int T);

#endif
