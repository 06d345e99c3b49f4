/* backend.h - the backend function table (ggml's backend interface, reduced).
 * Each backend defines one const fm_backend_ops; layer.c dispatches through it. */
#ifndef FM_BACKEND_H
#define FM_BACKEND_H

#include "fm_internal.h"

typedef struct {
    const char *name;
    /* FM_OK when this backend can run here (device present, ...). */
    fm_status (*available)(void);
    /* cfg has passed fm_moe_config_check and w the shape checks in layer.c;
     * copy/prepack what is needed: w does not outlive this call. */
    fm_status (*create)(const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens, void **state);
    /* x has passed the finite check; must not write out on failure. */
    fm_status (*forward)(void *state, const uint16_t *x, int T, float *out, fm_run_stats *stats);
    void (*destroy)(void *state);
} fm_backend_ops;

extern const fm_backend_ops fm_cpu_ref_ops; /* src/cpu/backend_ref.c */
extern const fm_backend_ops fm_cpu_ops;     /* src/cpu/backend_fast.c */
#ifdef FM_HAVE_CUDA
extern const fm_backend_ops fm_cuda_ops; /* src/cuda/backend_cuda.c */
#endif

/* Shape/format check of every weight tensor against cfg (shared by all backends). */
fm_status fm_moe_weights_check(const fm_moe_config *cfg, const fm_moe_weights *w);

#endif
