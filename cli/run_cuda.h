/* run_cuda.h - `fp4moe run` on the cuda backend: the layer as a serving engine
 * calls it (fm_layer_run with device pointers on the caller's stream), timed
 * eagerly and as a replayed CUDA graph. */
#ifndef FM_RUN_CUDA_H
#define FM_RUN_CUDA_H

#include <stdint.h>

#include "fp4moe.h"

typedef struct {
    const uint16_t *x;     /* host BF16 [T][hidden]: uploaded once */
    int             T, hidden, top_k;
    const int32_t  *ids;   /* host [T][top_k] external routing, uploaded once; NULL with wts: internal */
    const float    *wts;
    int             iters; /* timed eager runs and timed graph replays, each (>= 1) */
} fm_run_cuda_in;

typedef struct {
    double eager_ms;       /* median over iters of CUDA events around one fm_layer_run (enqueue included) */
    double graph_ms;       /* median over iters of CUDA events around one replay of the captured run */
    int    graph_bitexact; /* 1: the replay's output equals the eager run's bit for bit */
} fm_run_cuda_times;

/* `layer` (FP32 output, created on CUDA ordinal `ordinal`): upload x (and ids/wts),
 * make a non-blocking stream, run once (warm-up) and fm_layer_errors, time iters
 * eager runs, capture one run into a graph, replay it once (warm-up) and time
 * iters replays, fm_layer_errors again; out (host FP32 [T][hidden]) gets the last
 * eager run's output. Returns FM_OK, fm_layer_run / fm_layer_errors statuses,
 * FM_ERR_CUDA (a runtime call failed; named in fm_last_error), FM_ERR_OOM,
 * FM_ERR_NO_BACKEND (built without CUDA). */
fm_status fm_run_cuda(fm_layer *layer, int ordinal, const fm_run_cuda_in *in, float *out, fm_run_cuda_times *t);

#endif
