/* backend_ref.c - the "cpu-ref" backend: fm_moe_forward_ref behind the backend
 * table, over a deep copy of the weights (the caller's need not outlive
 * fm_layer_create). It is the oracle, so it adds nothing of its own. */
#include "cpu_internal.h"
#include "moe/moe_internal.h"

#include <omp.h>
#include <stdlib.h>

typedef struct {
    fm_moe_config  cfg;
    fm_cpu_weights cw;
} ref_state;

static fm_status ref_available(void) { return FM_OK; }

static fm_status ref_create(const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens, void **state)
{
    (void)max_tokens; /* the reference allocates per call */
    FM_CHECK(fm_moe_weights_check_scales(cfg, w));
    ref_state *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(FM_ERR_OOM, "cpu-ref: out of memory");
    s->cfg = *cfg;
    fm_status st = fm_cpu_weights_copy(cfg, w, &s->cw);
    if (st != FM_OK) {
        free(s);
        return st;
    }
    *state = s;
    return FM_OK;
}

static fm_status ref_forward(void *state, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    ref_state *s = state;
    double t0 = omp_get_wtime();
    FM_CHECK(fm_moe_forward_ref(&s->cfg, &s->cw.w, x, T, out));
    if (stats) stats->ms = (omp_get_wtime() - t0) * 1e3;
    return FM_OK;
}

static void ref_destroy(void *state)
{
    ref_state *s = state;
    if (!s) return;
    fm_cpu_weights_free(&s->cw);
    free(s);
}

const fm_backend_ops fm_cpu_ref_ops = {
    .name = "cpu-ref",
    .available = ref_available,
    .create = ref_create,
    .forward = ref_forward,
    .destroy = ref_destroy,
};
