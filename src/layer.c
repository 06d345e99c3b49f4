/* layer.c - the layer's façade: backend selection, the public calls, and the checks
 * every backend shares, so that a backend only sees validated input and the caller's
 * buffers are untouched on failure. Its parts in src/layer/: the weight checks, the
 * bucket policy (which kernels each batch size runs) and the tuner's search. */
#include "backend.h"
#include "layer/layer_internal.h"
#include "format/format_internal.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const k_backend_names[FM_BACKEND_COUNT] = {
    [FM_BACKEND_AUTO] = "auto", [FM_BACKEND_CPU_REF] = "cpu-ref", [FM_BACKEND_CPU] = "cpu", [FM_BACKEND_CUDA] = "cuda"};

/* FM_VERSION: CMake's project(VERSION), passed as a compile definition (CMakeLists.txt), the
 * same value as the .pc file's Version: the one place the version is written. */
const char *fm_version(void) { return FM_VERSION; }

const char *fm_backend_name(fm_backend_kind k)
{
    return ((int)k >= 0 && k < FM_BACKEND_COUNT) ? k_backend_names[k] : "unknown";
}

fm_status fm_backend_parse(const char *name, fm_backend_kind *out)
{
    fm_clear_error();
    if (!name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_backend_parse: NULL argument");
    for (int k = 0; k < FM_BACKEND_COUNT; k++)
        if (strcasecmp(name, k_backend_names[k]) == 0) {
            *out = (fm_backend_kind)k;
            return FM_OK;
        }
    return fm_fail(FM_ERR_INVALID_ARG, "unknown backend '%s' (expected auto, cpu-ref, cpu or cuda)", name);
}

static const fm_backend_ops *ops_of(fm_backend_kind k)
{
    switch (k) {
    case FM_BACKEND_CPU_REF: return &fm_cpu_ref_ops;
    case FM_BACKEND_CPU: return &fm_cpu_ops;
#ifdef FM_HAVE_CUDA
    case FM_BACKEND_CUDA: return &fm_cuda_ops;
#endif
    default: return NULL;
    }
}

fm_status fm_backend_available(fm_backend_kind k)
{
    fm_clear_error();
    if (k == FM_BACKEND_AUTO) return FM_OK;
    if ((int)k < 0 || k >= FM_BACKEND_COUNT)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_backend_available: unknown backend %d", (int)k);
    const fm_backend_ops *ops = ops_of(k);
    if (!ops)
        return fm_fail(FM_ERR_NO_BACKEND, "backend '%s' is not compiled into this build (built without nvcc)",
                       fm_backend_name(k));
    return ops->available();
}

void fm_layer_store_bf16(const float *in, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++) out[i] = fm_bf16_encode(in[i]);
}

struct fm_layer {
    const fm_backend_ops *ops;
    fm_backend_kind       kind;
    fm_layer_params       p;
    fm_cuda_device       *own_device; /* opened by the layer (desc.device NULL), closed with it */
    void                 *state;
    /* 1 while a call uses the layer's state: a backend's buffers (host scratch, device
     * buffers, the error record, plans) serve one call at a time, and a second call
     * that ran alongside wrote the same buffers (wrong outputs with FM_OK, then heap
     * corruption). Taken by atomic_exchange at entry, so the second call fails with
     * FM_ERR_BUSY at once and never waits; acquire / release hand the state from one
     * call to the next, whichever thread each runs on. */
    atomic_int busy;
    char       plans_note[768]; /* fm_layer_plans_note */
};

/* Take the layer for one call: 1 taken (release with layer_leave), 0 busy (FM_ERR_BUSY
 * recorded). */
static int layer_enter(const fm_layer *cl, const char *who)
{
    fm_layer *l = (fm_layer *)cl; /* the flag is the one mutable part of a const layer's calls */
    if (atomic_exchange_explicit(&l->busy, 1, memory_order_acquire) == 0) return 1;
    fm_fail(FM_ERR_BUSY, "%s: the layer is in use by another call (a layer runs one call at a time: give each thread "
                         "its own layer, or serialise the calls)", who);
    return 0;
}

static void layer_leave(const fm_layer *cl, int entered)
{
    if (entered == 1) atomic_store_explicit(&((fm_layer *)cl)->busy, 0, memory_order_release);
}

/* The checks of create that need no weights: the description and the configuration;
 * *first / *nl the shard. fm_layer_supports runs them too (src/layer_supports.c). */
fm_status fm_layer_check_desc(const fm_layer_desc *d, const fm_moe_config *cfg, int64_t *first, int64_t *nl)
{
    if (!d) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: desc is NULL");
    if (!cfg) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: cfg is NULL");
    if (d->max_tokens < 1) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: max_tokens=%d < 1", d->max_tokens);
    if ((int)d->out_dtype != FM_OUT_F32 && (int)d->out_dtype != FM_OUT_BF16)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: out_dtype=%d (expected FM_OUT_F32 or FM_OUT_BF16)",
                       (int)d->out_dtype);
    if (d->decode_work_list < FM_WORK_LIST_OFF || d->decode_work_list > FM_WORK_LIST_ON)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_create: decode_work_list=%d (expected FM_WORK_LIST_OFF -1, _AUTO 0 or _ON 1)",
                       d->decode_work_list);
    if (!(d->row_quantile == FM_ROW_QUANTILE_AUTO || d->row_quantile == FM_ROW_QUANTILE_MEAN ||
          (d->row_quantile >= 0.5f && d->row_quantile < 1.0f)))
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_create: row_quantile=%g (expected FM_ROW_QUANTILE_AUTO 0, _MEAN -1, or a quantile in "
                       "[0.5, 1))",
                       (double)d->row_quantile);
    if (d->pdl_chain != FM_PDL_CHAIN_AUTO && d->pdl_chain != FM_PDL_CHAIN_OFF)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: pdl_chain=%d (expected FM_PDL_CHAIN_AUTO 0 or _OFF -1)",
                       d->pdl_chain);
    if (d->decode_path < FM_DECODE_PATH_OFF || d->decode_path > FM_DECODE_PATH_ON)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_create: decode_path=%d (expected FM_DECODE_PATH_OFF -1, _AUTO 0 or _ON 1)",
                       d->decode_path);
    if (d->act_fp8_path != FM_FP8_PATH_EVERY && d->act_fp8_path != FM_FP8_PATH_FASTER)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_create: act_fp8_path=%d (expected FM_FP8_PATH_EVERY 0 or _FASTER 1)", d->act_fp8_path);
    if (d->caller_workspace != 0 && d->caller_workspace != 1)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: caller_workspace=%d (expected 0 or 1)",
                       d->caller_workspace);
    FM_CHECK(fm_moe_config_check(cfg));
    /* Every backend indexes routed rows (token x slot) and token x hidden with
     * 32-bit ints on the device: bound both here, once, for all of them. */
    if ((int64_t)d->max_tokens * cfg->top_k > INT32_MAX || (int64_t)d->max_tokens * cfg->hidden > INT32_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fm_layer_create: max_tokens=%d x top_k=%d (or x hidden=%d) exceeds 2^31-1 elements",
                       d->max_tokens, cfg->top_k, cfg->hidden);
    *first = d->first_expert;
    *nl = d->n_local ? d->n_local : (int64_t)cfg->n_experts - *first;
    if (*first < 0 || *nl < 1 || *first + *nl > cfg->n_experts)
        return fm_fail(FM_ERR_INVALID_ARG,
                       "fm_layer_create: shard [%lld, %lld + %lld) is not a non-empty range of the %d experts",
                       (long long)*first, (long long)*first, (long long)*nl, cfg->n_experts);
    return FM_OK;
}

/* The backend create would use for d (AUTO resolved), present in this build and here. */
fm_status fm_layer_resolve_backend(const fm_layer_desc *d, fm_backend_kind *out)
{
    fm_backend_kind kind = d->backend;
    if ((int)kind < 0 || kind >= FM_BACKEND_COUNT)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: unknown backend %d", (int)kind);
    if (kind == FM_BACKEND_AUTO)
        kind = d->device || fm_backend_available(FM_BACKEND_CUDA) == FM_OK ? FM_BACKEND_CUDA : FM_BACKEND_CPU;
    if (d->device && kind != FM_BACKEND_CUDA)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: a CUDA device was given to the %s backend",
                       fm_backend_name(kind));
    FM_CHECK(fm_backend_available(kind));
    *out = kind;
    return FM_OK;
}

const fm_backend_ops *fm_layer_backend_ops(fm_backend_kind k) { return ops_of(k); }

fm_status fm_layer_create_desc(const fm_layer_desc *d, const fm_moe_config *cfg, const fm_moe_weights *w,
                               fm_layer **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_create: out is NULL");
    *out = NULL;
    int64_t first = 0, nl = 0;
    FM_CHECK(fm_layer_check_desc(d, cfg, &first, &nl));
    fm_moe_config lcfg = *cfg; /* the shard's experts, for the weight checks */
    lcfg.n_experts = (int)nl;
    FM_CHECK(fm_moe_weights_check(&lcfg, w));
    FM_CHECK(fm_layer_check_dense_finite(cfg, w));
    fm_backend_kind kind = FM_BACKEND_AUTO;
    FM_CHECK(fm_layer_resolve_backend(d, &kind));
    fm_layer *l = calloc(1, sizeof *l);
    if (!l) return fm_fail(FM_ERR_OOM, "fm_layer_create: out of host memory");
    atomic_init(&l->busy, 0);
    l->ops = ops_of(kind);
    l->kind = kind;
    l->p = (fm_layer_params){.cfg = *cfg, .max_tokens = d->max_tokens, .first = (int)first, .n_local = (int)nl,
                             .out_dtype = d->out_dtype, .caller_workspace = d->caller_workspace, .device = d->device,
                             .decode_work_list = d->decode_work_list, .row_quantile = d->row_quantile,
                             .pdl_chain = d->pdl_chain, .decode_path = d->decode_path,
                             .act_fp8_path = d->act_fp8_path};
    fm_status s = FM_OK;
    if (kind == FM_BACKEND_CUDA && !l->p.device) {
        if ((s = fm_cuda_device_open(0, &l->own_device)) != FM_OK) {
            free(l);
            return s;
        }
        l->p.device = l->own_device;
    }
    if ((s = l->ops->create(&l->p, w, &l->state)) != FM_OK) {
        fm_cuda_device_close(l->own_device);
        free(l);
        return s;
    }
    if (l->ops->install && (s = fm_layer_plan_buckets(l->ops, l->state, &l->p)) != FM_OK) {
        fm_layer_destroy(l);
        return s;
    }
    if (d->plans && kind != FM_BACKEND_CUDA)
        snprintf(l->plans_note, sizeof l->plans_note, "plans in %s not used: the %s backend has no tile plan",
                 d->plans, fm_backend_name(kind));
    else if (d->plans && (s = fm_layer_plans_load(l, &l->p, d->plans, l->plans_note, sizeof l->plans_note)) != FM_OK) {
        fm_layer_destroy(l);
        return s;
    }
    *out = l;
    return FM_OK;
}

fm_status fm_layer_save_plans(fm_layer *l, const char *path)
{
    fm_clear_error();
    if (!l) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_save_plans: layer is NULL");
    if (l->kind != FM_BACKEND_CUDA)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_layer_save_plans: the %s backend has no tile plan",
                       fm_backend_name(l->kind));
    return fm_layer_plans_save(l, &l->p, path);
}

const char *fm_layer_plans_note(const fm_layer *l) { return l ? l->plans_note : ""; }

fm_status fm_layer_create(fm_backend_kind kind, const fm_moe_config *cfg, const fm_moe_weights *w, int max_tokens,
                          fm_layer **out)
{
    fm_layer_desc d = {.backend = kind, .max_tokens = max_tokens};
    return fm_layer_create_desc(&d, cfg, w, out);
}

static fm_status check_x_host(const fm_layer *l, const uint16_t *x, int T, const char *who)
{
    size_t n = (size_t)T * l->p.cfg.hidden;
    for (size_t i = 0; i < n; i++)
        if ((x[i] & 0x7f80u) == 0x7f80u) /* BF16 exponent all ones: Inf or NaN */
            return fm_fail(FM_ERR_NONFINITE, "%s: x[%zu][%zu] is NaN or Inf (policy: reject)", who,
                           i / l->p.cfg.hidden, i % l->p.cfg.hidden);
    return FM_OK;
}

fm_status fm_layer_forward(fm_layer *l, const uint16_t *x, int T, float *out, fm_run_stats *stats)
{
    fm_clear_error();
    if (!l || !x || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_forward: NULL layer, x or out");
    if (T < 1 || T > l->p.max_tokens)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_layer_forward: T=%d outside [1, max_tokens=%d]", T, l->p.max_tokens);
    if (l->p.out_dtype != FM_OUT_F32)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_forward: the layer was created with BF16 output; use fm_layer_run");
    if (l->p.caller_workspace)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_forward: the layer takes caller workspace; use fm_layer_run");
    FM_CHECK(check_x_host(l, x, T, "fm_layer_forward"));
    const int in = layer_enter(l, "fm_layer_forward");
    if (!in) return FM_ERR_BUSY;
    fm_status s;
    if (l->ops->forward_host) s = l->ops->forward_host(l->state, x, T, out, stats);
    else {
        fm_layer_run_args a = {.x = x, .T = T, .out = out};
        s = l->ops->run(l->state, &a, stats);
    }
    layer_leave(l, in);
    return s;
}

static int misaligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

fm_status fm_layer_run(fm_layer *l, const fm_layer_run_args *a)
{
    fm_clear_error();
    if (!l || !a) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: NULL layer or args");
    if (!a->x || !a->out) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: NULL x or out");
    if (!a->topk_ids != !a->topk_weights)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: topk_ids and topk_weights must be given together (external "
                                           "routing) or both NULL (internal routing)");
    if (!a->routed_ids != !a->routed_weights)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: routed_ids and routed_weights must be given together or both NULL");
    if (a->routed_ids && a->topk_ids)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: routed_ids/routed_weights are the internal router's output; "
                                           "with external routing (topk_ids given) they must be NULL");
    if (a->T < 1 || a->T > l->p.max_tokens)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_layer_run: T=%d outside [1, max_tokens=%d]", a->T, l->p.max_tokens);
    if (!l->p.caller_workspace && a->workspace)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: workspace given to a layer that owns its workspace");
    if (misaligned(a->x, 16) || misaligned(a->out, 16))
        return fm_fail(FM_ERR_MISALIGNED, "fm_layer_run: x (%p) and out (%p) must be 16-byte aligned", (const void *)a->x, a->out);
    if (a->workspace && misaligned(a->workspace, 256))
        return fm_fail(FM_ERR_MISALIGNED, "fm_layer_run: workspace (%p) must be 256-byte aligned", a->workspace);
    if (a->topk_ids && (misaligned(a->topk_ids, 4) || misaligned(a->topk_weights, 4)))
        return fm_fail(FM_ERR_MISALIGNED, "fm_layer_run: topk_ids and topk_weights must be 4-byte aligned");
    if (a->routed_ids && (misaligned(a->routed_ids, 4) || misaligned(a->routed_weights, 4)))
        return fm_fail(FM_ERR_MISALIGNED, "fm_layer_run: routed_ids and routed_weights must be 4-byte aligned");
    const int in = layer_enter(l, "fm_layer_run");
    if (!in) return FM_ERR_BUSY;
    /* under the flag: the size follows the plans, which set_plan may grow */
    size_t    ws_need = l->p.caller_workspace && l->ops->workspace_bytes ? l->ops->workspace_bytes(l->state) : 0;
    fm_status s = ws_need > 0 && !a->workspace
                      ? fm_fail(FM_ERR_INVALID_ARG, "fm_layer_run: the layer takes caller workspace "
                                                    "(fm_layer_workspace_size) and none was given")
                      : l->ops->run(l->state, a, NULL);
    layer_leave(l, in);
    return s;
}

fm_status fm_layer_run_dispatched(fm_layer *l, const fm_layer_dispatch_args *a)
{
    fm_clear_error();
    static const char who[] = "fm_layer_run_dispatched";
    if (!l || !a) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL layer or args", who);
    FM_CHECK(fm_layer_check_dispatch_args(&l->p, l->ops, a, who));
    const int in = layer_enter(l, who);
    if (!in) return FM_ERR_BUSY;
    size_t    ws_need = l->p.caller_workspace && l->ops->workspace_bytes ? l->ops->workspace_bytes(l->state) : 0;
    fm_status s = ws_need > 0 && !a->workspace
                      ? fm_fail(FM_ERR_INVALID_ARG, "%s: the layer takes caller workspace (fm_layer_workspace_size) "
                                                    "and none was given", who)
                      : l->ops->run_dispatched(l->state, a, NULL);
    layer_leave(l, in);
    return s;
}

fm_status fm_layer_errors(fm_layer *l, void *stream, fm_layer_error_info *info)
{
    fm_clear_error();
    if (!l) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_errors: NULL layer");
    const int in = layer_enter(l, "fm_layer_errors");
    if (!in) return FM_ERR_BUSY;
    if (info) *info = (fm_layer_error_info){.first_bad_slot = -1, .first_nonfinite = -1, .first_bad_expert = -1};
    fm_status s = l->ops->errors ? l->ops->errors(l->state, stream, info) : FM_OK;
    layer_leave(l, in);
    return s;
}

fm_status fm_layer_workspace_size(const fm_layer *l, size_t *bytes)
{
    fm_clear_error();
    if (!l || !bytes) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_workspace_size: NULL argument");
    const int in = layer_enter(l, "fm_layer_workspace_size"); /* set_plan may change it */
    if (!in) return FM_ERR_BUSY;
    *bytes = l->p.caller_workspace && l->ops->workspace_bytes ? l->ops->workspace_bytes(l->state) : 0;
    layer_leave(l, in);
    return FM_OK;
}

fm_status fm_layer_plan(const fm_layer *l, int T, fm_layer_plan_info *info)
{
    fm_clear_error();
    if (!l || !info) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_plan: NULL argument");
    if (T < 1 || T > l->p.max_tokens)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_layer_plan: T=%d outside [1, max_tokens=%d]", T, l->p.max_tokens);
    if (!l->ops->plan)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_layer_plan: the %s backend has no tile plan (only cuda layers do)",
                       l->ops->name);
    const int in = layer_enter(l, "fm_layer_plan");
    if (!in) return FM_ERR_BUSY;
    fm_status s = l->ops->plan(l->state, T, info);
    layer_leave(l, in);
    return s;
}

fm_status fm_layer_set_plan(fm_layer *l, int T, const fm_layer_plan_info *info)
{
    fm_clear_error();
    if (!l || !info) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_set_plan: NULL argument");
    if (T < 1 || T > l->p.max_tokens)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_layer_set_plan: T=%d outside [1, max_tokens=%d]", T, l->p.max_tokens);
    if (!l->ops->set_plan)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_layer_set_plan: the %s backend has no tile plan (only cuda layers do)",
                       l->ops->name);
    const int in = layer_enter(l, "fm_layer_set_plan");
    if (!in) return FM_ERR_BUSY;
    fm_status s = l->ops->set_plan(l->state, T, info);
    layer_leave(l, in);
    return s;
}

fm_status fm_layer_tune(fm_layer *l, int T, void *stream, fm_layer_tune_info *info)
{
    fm_clear_error();
    if (!l) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_tune: NULL layer");
    if (T < 1 || T > l->p.max_tokens)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_layer_tune: T=%d outside [1, max_tokens=%d]", T, l->p.max_tokens);
    if (!l->ops->tune_begin)
        return fm_fail(FM_ERR_UNSUPPORTED, "fm_layer_tune: the %s backend has no tile plan (only cuda layers do)",
                       l->ops->name);
    const int in = layer_enter(l, "fm_layer_tune");
    if (!in) return FM_ERR_BUSY;
    fm_status s = fm_layer_tune_bucket(l->ops, l->state, &l->p, T, stream, info);
    layer_leave(l, in);
    return s;
}

fm_status fm_layer_test_hold(fm_layer *l, int hold)
{
    if (!l) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_test_hold: NULL layer");
    if (!hold) {
        layer_leave(l, 1);
        return FM_OK;
    }
    return layer_enter(l, "fm_layer_test_hold") == 1 ? FM_OK : FM_ERR_BUSY;
}

fm_backend_kind fm_layer_backend(const fm_layer *l) { return l ? l->kind : FM_BACKEND_AUTO; }

void fm_layer_destroy(fm_layer *l)
{
    if (!l) return;
    /* A call in flight on another thread (a caller bug, layer.h): freeing the state under
     * it would corrupt the heap; leave the layer allocated (a leak) and say so instead.
     * Nothing can catch a call made after the free. */
    if (atomic_exchange_explicit(&l->busy, 1, memory_order_acquire) != 0) {
        fprintf(stderr, "fp4moe: fm_layer_destroy: the layer is in use by another call; not destroyed (leaked)\n");
        return;
    }
    l->ops->destroy(l->state);
    fm_cuda_device_close(l->own_device);
    free(l);
}
