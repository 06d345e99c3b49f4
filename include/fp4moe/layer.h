/* fp4moe/layer.h - running a MoE layer on a backend.
 *
 * Backends sit behind a small function table (check, load, run, destroy):
 *   cpu-ref : fm_moe_forward_ref, the oracle
 *   cpu     : the fast CPU path (OpenMP, vectorised), results within the
 *             bound stated in docs/accuracy.md of the reference
 *   cuda    : GPU kernels (present when the library was built with nvcc and a
 *             device is visible)
 * A layer is created once (weights prepacked / uploaded), then run many times.
 */
#ifndef FP4MOE_LAYER_H
#define FP4MOE_LAYER_H

#include <stdint.h>

#include "fp4moe/moe.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FM_BACKEND_AUTO = 0, /* cuda if compiled in and a device is visible, else cpu */
    FM_BACKEND_CPU_REF,
    FM_BACKEND_CPU,
    FM_BACKEND_CUDA,
    FM_BACKEND_COUNT
} fm_backend_kind;

/* "auto", "cpu-ref", "cpu", "cuda". */
const char *fm_backend_name(fm_backend_kind k);
fm_status   fm_backend_parse(const char *name, fm_backend_kind *out);

/* Whether backend k can run here: FM_OK, FM_ERR_NO_BACKEND (not compiled in),
 * FM_ERR_NO_DEVICE (cuda compiled in, no usable device). */
fm_status fm_backend_available(fm_backend_kind k);

typedef struct fm_layer fm_layer;

/* Timing of the last forward call, milliseconds (wall clock for CPU backends,
 * CUDA events around the kernels for cuda; transfers are not included). */
typedef struct {
    double ms;
} fm_run_stats;

/* Create a layer: checks cfg and weights, prepacks/uploads the weights for the
 * backend; `w` need not outlive the layer. max_tokens bounds T in forward.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_BAD_SHAPE, FM_ERR_FORMAT,
 * FM_ERR_NO_BACKEND, FM_ERR_NO_DEVICE, FM_ERR_UNSUPPORTED, FM_ERR_SMEM_EXCEEDED,
 * FM_ERR_OOM, FM_ERR_CUDA. FM_ERR_BAD_SHAPE also when max_tokens*top_k or
 * max_tokens*hidden exceeds 2^31-1. FM_ERR_NONFINITE: a NaN scale code, a weight
 * global scale that is not finite and positive or makes a decoded weight overflow
 * FP32 (tensor and expert named), an a1/a2 scale outside its range (moe.h).
 * On failure *out is NULL. */
fm_status fm_layer_create(fm_backend_kind kind, const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens,
                          fm_layer **out);

/* out[T][hidden] FP32 = layer(x[T][hidden] BF16), host pointers. 1 <= T <= max_tokens.
 * Returns FM_OK, FM_ERR_INVALID_ARG, FM_ERR_BAD_SHAPE, FM_ERR_NONFINITE (NaN/Inf in x),
 * FM_ERR_OOM (cpu-ref allocates its scratch per call), FM_ERR_CUDA.
 * `out` is untouched on failure. stats may be NULL. */
fm_status fm_layer_forward(fm_layer *layer, const uint16_t *x, int T, float *out, fm_run_stats *stats);

/* The backend actually used ("cpu", "cuda", ...). */
fm_backend_kind fm_layer_backend(const fm_layer *layer);

void fm_layer_destroy(fm_layer *layer);

#ifdef __cplusplus
}
#endif
#endif
