/* tune.c - the cuda backend's timing for fm_layer_tune (the search is the layer's:
 * src/layer/tune.c). A plan's time: each routing's run captured into a graph, the
 * replays rotating over the routings timed with events on a stream of the tuner's
 * own (graphs cannot be captured from the legacy default stream). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/layer_cuda.h"
#include "fm_internal.h"
#include "fm_rng.h"
#include "kernels/fm_kernels_smem.h"

typedef struct {
    cudaStream_t st;
    cudaEvent_t  ev[2];
    uint16_t    *x;
    void        *out, *ws;
    int32_t     *ids; /* [n_routings][T][top_k] */
    float       *w;   /* [n_routings][T][top_k] */
    int          T, slots, n_routings;
} tune_bench;

static fm_status tune_cu(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return fm_fail(e == cudaErrorMemoryAllocation ? FM_ERR_OOM : FM_ERR_CUDA, "fm_layer_tune: %s: %s", what,
                   cudaGetErrorString(e));
}

static void bench_free(tune_bench *b)
{
    if (!b) return;
    cudaFree(b->x), cudaFree(b->out), cudaFree(b->ids), cudaFree(b->w), cudaFree(b->ws);
    if (b->ev[0]) cudaEventDestroy(b->ev[0]);
    if (b->ev[1]) cudaEventDestroy(b->ev[1]);
    if (b->st) cudaStreamDestroy(b->st);
    free(b);
}

static fm_status begin_on(fm_cuda_layer *s, const fm_tune_inputs *in, void *stream, tune_bench *b)
{
    const size_t xs = sizeof(uint16_t) * (size_t)in->T * s->p.cfg.hidden,
                 rs = (size_t)in->n_routings * (size_t)b->slots;
    const size_t wsb = s->p.caller_workspace ? s->ws.total : 0;
    /* after the caller's work on `stream`, on a stream of its own */
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking);
    if (e != cudaSuccess) return tune_cu(e, "the caller's stream / a stream of its own");
    if ((e = cudaMalloc((void **)&b->x, xs)) != cudaSuccess ||
        (e = cudaMalloc(&b->out, sizeof(float) * (size_t)in->T * s->p.cfg.hidden)) != cudaSuccess ||
        (e = cudaMalloc((void **)&b->ids, sizeof(int32_t) * rs)) != cudaSuccess ||
        (e = cudaMalloc((void **)&b->w, sizeof(float) * rs)) != cudaSuccess ||
        (wsb && (e = cudaMalloc(&b->ws, wsb)) != cudaSuccess) || (e = cudaEventCreate(&b->ev[0])) != cudaSuccess ||
        (e = cudaEventCreate(&b->ev[1])) != cudaSuccess ||
        (e = cudaMemcpy(b->x, in->x, xs, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(b->ids, in->ids, sizeof(int32_t) * rs, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(b->w, in->weights, sizeof(float) * rs, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaStreamSynchronize(cudaStreamLegacy)) != cudaSuccess) /* the DMAs landed before b->st reads */
        return tune_cu(e, "buffers");
    return FM_OK;
}

fm_status fm_cuda_tune_begin(void *state, const fm_tune_inputs *in, void *stream, void **bench)
{
    fm_cuda_layer *s = state;
    *bench = NULL;
    tune_bench *b = calloc(1, sizeof *b);
    if (!b) return fm_fail(FM_ERR_OOM, "fm_layer_tune: out of host memory");
    b->T = in->T, b->slots = in->T * s->p.cfg.top_k, b->n_routings = in->n_routings;
    int       prev = -1;
    fm_status st = fm_cuda_device_enter(s->dev, &prev);
    if (st == FM_OK) {
        st = begin_on(s, in, stream, b);
        if (st != FM_OK) bench_free(b), b = NULL;
        fm_cuda_device_leave(s->dev, prev);
    } else {
        free(b), b = NULL;
    }
    *bench = b;
    return st;
}

static fm_status time_on(fm_cuda_layer *s, tune_bench *c, int warm, int reps, double *t)
{
    enum { MAX_ROUTINGS = 64 };
    cudaGraphExec_t ex[MAX_ROUTINGS] = {0};
    const int       nx = c->n_routings;
    if (nx < 1 || nx > MAX_ROUTINGS) return fm_fail(FM_ERR_INVALID_ARG, "fm_layer_tune: %d routings", nx);
    fm_status st = FM_OK;
    for (int r = 0; r < nx && st == FM_OK; r++) {
        fm_layer_run_args a = {.x = c->x, .T = c->T, .topk_ids = c->ids + (size_t)r * c->slots,
                               .topk_weights = c->w + (size_t)r * c->slots, .out = c->out, .workspace = c->ws,
                               .stream = c->st};
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) {
            st = tune_cu(e, "begin capture");
            break;
        }
        fm_status rs = fm_cuda_layer_enqueue(s, &a, c->st);
        e = cudaStreamEndCapture(c->st, &g);
        if (rs != FM_OK) st = rs;
        else if (e != cudaSuccess) st = tune_cu(e, "end capture");
        else if ((e = cudaGraphInstantiate(&ex[r], g, 0)) != cudaSuccess) st = tune_cu(e, "graph instantiate");
        if (g) cudaGraphDestroy(g);
    }
    for (int it = -warm; st == FM_OK && it < reps; it++) {
        const int   r = (it + warm) % nx;
        cudaError_t e = cudaEventRecord(c->ev[0], c->st);
        if (e == cudaSuccess) e = cudaGraphLaunch(ex[r], c->st);
        if (e == cudaSuccess) e = cudaEventRecord(c->ev[1], c->st);
        if (e == cudaSuccess) e = cudaEventSynchronize(c->ev[1]);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, c->ev[0], c->ev[1]);
        if (e != cudaSuccess) st = tune_cu(e, "replay");
        else if (it >= 0) t[it] = ms * 1e3;
    }
    for (int r = 0; r < nx; r++)
        if (ex[r]) cudaGraphExecDestroy(ex[r]);
    return st;
}

fm_status fm_cuda_tune_time(void *state, void *bench, int warm, int reps, double *t)
{
    fm_cuda_layer *s = state;
    int            prev = -1;
    FM_CHECK(fm_cuda_device_enter(s->dev, &prev));
    fm_status st = time_on(s, bench, warm, reps, t);
    fm_cuda_device_leave(s->dev, prev);
    return st;
}

fm_status fm_cuda_tune_end(void *state, void *bench, int ok)
{
    fm_cuda_layer *s = state;
    tune_bench    *b = bench;
    int            prev = -1;
    fm_status      st = fm_cuda_device_enter(s->dev, &prev);
    if (st == FM_OK) {
        /* ok: what the synthetic runs recorded is a failure (they record nothing);
         * else only cleared, for the runs that follow */
        cudaError_t e = cudaStreamSynchronize(b->st);
        fm_status   es = e != cudaSuccess ? fm_cuda_layer_fail(e, "an earlier run failed")
                                          : fm_cuda_layer_read_errors(s, b->st, NULL);
        if (ok) st = es;
    }
    bench_free(b);
    fm_cuda_device_leave(s->dev, prev); /* nothing when the enter failed (prev -1) */
    return st;
}

size_t fm_cuda_tune_tiles(void *state, fm_tile *out, size_t cap)
{
    const fm_cuda_layer *s = state;
    size_t               n = 0, ns = 0, nw = 0;
    const fm_tile       *sw = fm_mma_tiles(&ns), *wg = fm_wgmma_tiles(&nw);
    for (size_t i = 0; i < ns && n < cap; i++)
        if (fm_cuda_device_has_tile(s->dev, 0, (int)i)) out[n++] = sw[i];
    for (size_t i = 0; i < nw && n < cap; i++)
        if (fm_cuda_device_has_tile(s->dev, 1, (int)i)) out[n++] = wg[i];
    return n;
}
