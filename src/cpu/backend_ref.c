/* backend_ref.c - the "cpu-ref" backend: fm_moe_forward_ref behind the backend
 * table, over a deep copy of the weights (the caller's need not outlive
 * fm_layer_create). It is the oracle, so it adds nothing of its own. */
#include "cpu_internal.h"
#include "moe/moe_internal.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

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

/* Dispatched rows: computed into a private buffer, the caller's rows written when every
 * row succeeded. */
static fm_status ref_run_dispatched(void *state, const fm_layer_dispatch_args *a, fm_run_stats *stats)
{
    ref_state     *s = state;
    const int      H = s->p.cfg.hidden, E = s->p.n_local;
    const int64_t  max_rows = (int64_t)s->p.max_tokens * s->p.cfg.top_k;
    double         t0 = omp_get_wtime();
    float         *y = malloc(sizeof(float) * (size_t)max_rows * H);
    int32_t       *off = malloc(sizeof(int32_t) * ((size_t)E + 1));
    int            rows = 0;
    fm_status      st = y && off ? fm_moe_dispatched_ref(&s->p.cfg, &s->cw.w, a, E, max_rows, y, off, &rows)
                                 : fm_fail(FM_ERR_OOM, "cpu-ref: out of memory for %lld dispatched rows",
                                           (long long)max_rows);
    for (int e = 0; st == FM_OK && e < E; e++)
        for (int32_t p = off[e]; p < off[e + 1]; p++) {
            const size_t r = fm_dispatch_slot(a, off, e, p);
            if (s->p.out_dtype == FM_OUT_BF16) fm_layer_store_bf16(y + (size_t)p * H, (size_t)H, (uint16_t *)a->out + r * H);
            else memcpy((float *)a->out + r * H, y + (size_t)p * H, sizeof(float) * (size_t)H);
        }
    free(y);
    free(off);
    if (st == FM_OK && stats) stats->ms = (omp_get_wtime() - t0) * 1e3;
    return st;
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
    .run_dispatched = ref_run_dispatched,
    .destroy = ref_destroy,
};
