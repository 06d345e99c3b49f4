/* weights_copy.c - an owned deep copy of a layer's weights.
 *
 * Why: fm_layer_create's caller may free its weights as soon as create returns,
 * so each CPU backend keeps its own copy. One allocation holds everything, each
 * piece on a 64-byte (cache-line) boundary so the fast kernels stream aligned
 * rows; layouts are unchanged (row-major data, row-major scales).
 */
#include "cpu_internal.h"

#include <stdlib.h>
#include <string.h>

#define FM_ALIGN 64 /* cache line */

static size_t round_up(size_t n) { return (n + FM_ALIGN - 1) / FM_ALIGN * FM_ALIGN; }

/* Bump allocator over the blob; with base == NULL it only measures. */
typedef struct {
    unsigned char *base;
    size_t         used;
} arena;

static void *take(arena *a, const void *src, size_t n)
{
    void *p = a->base ? a->base + a->used : NULL;
    if (p && src) memcpy(p, src, n);
    a->used += round_up(n);
    return p;
}

static void lay_out(const fm_moe_config *c, int L, const fm_moe_weights *w, arena *a, fm_cpu_weights *o)
{
    int E = c->n_experts, H = c->hidden, S = c->shared_inter; /* router: E global experts; weights: L local */
    o->w13 = take(a, NULL, sizeof(fm_qtensor) * L);
    o->w2 = take(a, NULL, sizeof(fm_qtensor) * L);
    o->w.w13 = o->w13;
    o->w.w2 = o->w2;
    o->w.router_w = take(a, w->router_w, sizeof(float) * E * (size_t)H);
    o->w.router_bias = w->router_bias ? take(a, w->router_bias, sizeof(float) * E) : NULL;
    o->w.a1_scale = w->a1_scale ? take(a, w->a1_scale, sizeof(float) * L) : NULL;
    o->w.a2_scale = w->a2_scale ? take(a, w->a2_scale, sizeof(float) * L) : NULL;
    o->w.w13_up_global = w->w13_up_global ? take(a, w->w13_up_global, sizeof(float) * L) : NULL;
    o->w.shared_w13 = S > 0 ? take(a, w->shared_w13, sizeof(uint16_t) * 2 * (size_t)S * H) : NULL;
    o->w.shared_w2 = S > 0 ? take(a, w->shared_w2, sizeof(uint16_t) * (size_t)H * S) : NULL;
    o->w.w13_bias = w->w13_bias ? take(a, w->w13_bias, sizeof(float) * L * 2 * (size_t)c->inter) : NULL;
    o->w.w2_bias = w->w2_bias ? take(a, w->w2_bias, sizeof(float) * L * (size_t)H) : NULL;
    for (int e = 0; e < L; e++) {
        const fm_qtensor *src[2] = {&w->w13[e], &w->w2[e]};
        fm_qtensor *dst[2] = {a->base ? &o->w13[e] : NULL, a->base ? &o->w2[e] : NULL};
        for (int j = 0; j < 2; j++) {
            size_t db = 0, sb = 0;
            (void)fm_qtensor_bytes(src[j]->fmt, src[j]->rows, src[j]->cols, &db, &sb); /* shapes checked */
            void *d = take(a, src[j]->data, db);
            void *s = sb ? take(a, src[j]->scales, sb) : NULL;
            if (dst[j]) {
                *dst[j] = *src[j];
                dst[j]->data = d;
                dst[j]->scales = s;
            }
        }
    }
}

fm_status fm_cpu_weights_copy(const fm_moe_config *cfg, int n_local, const fm_moe_weights *w, fm_cpu_weights *out)
{
    memset(out, 0, sizeof *out);
    arena a = {NULL, 0};
    fm_cpu_weights probe;
    memset(&probe, 0, sizeof probe);
    lay_out(cfg, n_local, w, &a, &probe);
    out->bytes = a.used;
    out->blob = aligned_alloc(FM_ALIGN, a.used);
    if (!out->blob) return fm_fail(FM_ERR_OOM, "cpu backend: cannot allocate %zu bytes for the weight copy", a.used);
    a = (arena){out->blob, 0};
    lay_out(cfg, n_local, w, &a, out);
    return FM_OK;
}

void fm_cpu_weights_free(fm_cpu_weights *cw)
{
    if (!cw) return;
    free(cw->blob);
    memset(cw, 0, sizeof *cw);
}
