/* backend_ref.c - the "cpu-ref" backend: fm_moe_forward_ref behind the backend
 * table, over a deep copy of the weights (the caller's need not outlive
 * fm_layer_create). It is the oracle, so it adds nothing of its own. */
#include "cpu_internal.h"
#include "moe/moe_internal.h"

#include <omp.h>
#include <stdlib.h>

typedef struct {
    fm_layer_params p;
    fm_cpu_weights  cw;
    float          *out32; /* BF16 output: the FP32 result before rounding [max_tokens][hidden] */
} ref_state;

static fm_status ref_available(void) { return FM_OK; }

static fm_status ref_create(const fm_layer_params *p, const fm_moe_weights *w, void **state)
{
    fm_moe_config lcfg = p->cfg; /* the shard's experts */
    lcfg.n_experts = p->n_local;
    FM_CHECK(fm_moe_weights_check_scales(&lcfg, w));
    ref_state *s = calloc(1, sizeof *s);
    if (!s) return fm_fail(FM_ERR_OOM, "cpu-ref: out of memory");
    s->p = *p;
    if (p->out_dtype == FM_OUT_BF16 &&
        !(s->out32 = malloc(sizeof(float) * (size_t)p->max_tokens * p->cfg.hidden))) {
        free(s);
        return fm_fail(FM_ERR_OOM, "cpu-ref: out of memory");
    }
    fm_status st = fm_cpu_weights_copy(&p->cfg, p->n_local, w, &s->cw);
    if (st != FM_OK) {
        free(s->out32);
        free(s);
        return st;
    }
    *state = s;
    return FM_OK;
}

static fm_status ref_run(void *state, const fm_layer_run_args *a, fm_run_stats *stats)
{
    ref_state *s = state;
    double t0 = omp_get_wtime();
    float *o = s->p.out_dtype == FM_OUT_BF16 ? s->out32 : a->out;
    FM_CHECK(fm_moe_forward_ref_run(&s->p.cfg, &s->cw.w, a->x, a->T, a->topk_ids, a->topk_weights, s->p.first,
                                    s->p.n_local, o, a->routed_ids, a->routed_weights));
    if (s->p.out_dtype == FM_OUT_BF16) fm_layer_store_bf16(o, (size_t)a->T * s->p.cfg.hidden, a->out);
    if (stats) stats->ms = (omp_get_wtime() - t0) * 1e3;
    return FM_OK;
}

static void ref_destroy(void *state)
{
    ref_state *s = state;
    if (!s) return;
    fm_cpu_weights_free(&s->cw);
    free(s->out32);
    free(s);
}

const fm_backend_ops fm_cpu_ref_ops = {
    .name = "cpu-ref",
    .available = ref_available,
    .create = ref_create,
    .run = ref_run,
    .destroy = ref_destroy,
};
