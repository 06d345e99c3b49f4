/* run_cuda.c - `fp4moe run` on the cuda backend, the way a serving engine calls
 * the layer: x (and the engine's top-k ids / weights) in device memory,
 * fm_layer_run on a non-blocking stream of the caller's, eager runs timed with
 * CUDA events, then one run captured into a CUDA graph and replayed (the
 * engines' decode path), fm_layer_errors after each phase. Built without CUDA:
 * a stub returning FM_ERR_NO_BACKEND (cmd_run.c never gets here then: the cuda
 * backend is not available). */
#include "run_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "fm_internal.h"

#ifdef FM_HAVE_CUDA
#include <cuda_runtime.h>

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define RC(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            s = fm_fail(FM_ERR_CUDA, "fp4moe run (cuda): %s: %s", #call, cudaGetErrorString(e_)); \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
#define RS(call)                      \
    do {                              \
        if ((s = (call)) != FM_OK) goto done; \
    } while (0)

/* The median of n event-timed intervals, ms. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return v[n / 2];
}

fm_status fm_run_cuda(fm_layer *layer, int ordinal, const fm_run_cuda_in *in, float *out, fm_run_cuda_times *t)
{
    if (!layer || !in || !out || !t || in->T < 1 || in->iters < 1 || !in->ids != !in->wts)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_run_cuda: bad arguments");
    memset(t, 0, sizeof *t);
    fm_status       s = FM_OK;
    const size_t    nx = (size_t)in->T * in->hidden, nk = (size_t)in->T * in->top_k;
    uint16_t       *dx = NULL;
    int32_t        *dids = NULL;
    float          *dwts = NULL, *dout = NULL, *gout = NULL;
    cudaStream_t    st = NULL;
    cudaEvent_t     ev[2] = {NULL, NULL};
    cudaGraph_t     g = NULL;
    cudaGraphExec_t ge = NULL;
    double         *ms = malloc(sizeof(double) * (size_t)in->iters);
    int             prev = -1, capturing = 0;
    if (!ms) return fm_fail(FM_ERR_OOM, "fp4moe run (cuda): out of host memory");
    /* the caller's device: the layer's; restored on the way out */
    RC(cudaGetDevice(&prev));
    RC(cudaSetDevice(ordinal));
    RC(cudaMalloc((void **)&dx, nx * sizeof *dx));
    RC(cudaMalloc((void **)&dout, nx * sizeof *dout));
    RC(cudaMemcpy(dx, in->x, nx * sizeof *dx, cudaMemcpyHostToDevice));
    if (in->ids) {
        RC(cudaMalloc((void **)&dids, nk * sizeof *dids));
        RC(cudaMalloc((void **)&dwts, nk * sizeof *dwts));
        RC(cudaMemcpy(dids, in->ids, nk * sizeof *dids, cudaMemcpyHostToDevice));
        RC(cudaMemcpy(dwts, in->wts, nk * sizeof *dwts, cudaMemcpyHostToDevice));
    }
    /* cudaMemcpy from pageable memory may return before its DMA lands, and the run's
     * non-blocking stream does not wait for the legacy stream */
    RC(cudaStreamSynchronize(cudaStreamLegacy));
    RC(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    RC(cudaEventCreate(&ev[0]));
    RC(cudaEventCreate(&ev[1]));
    fm_layer_run_args a = {.x = dx, .T = in->T, .topk_ids = dids, .topk_weights = dwts, .out = dout, .stream = st};

    /* eager: one warm-up run, its errors read (synchronises), then the timed runs */
    RS(fm_layer_run(layer, &a));
    RS(fm_layer_errors(layer, st, NULL));
    for (int i = 0; i < in->iters; i++) {
        float e;
        RC(cudaEventRecord(ev[0], st));
        RS(fm_layer_run(layer, &a));
        RC(cudaEventRecord(ev[1], st));
        RC(cudaEventSynchronize(ev[1]));
        RC(cudaEventElapsedTime(&e, ev[0], ev[1]));
        ms[i] = e;
    }
    RS(fm_layer_errors(layer, st, NULL));
    t->eager_ms = median(ms, in->iters);
    RC(cudaMemcpy(out, dout, nx * sizeof *out, cudaMemcpyDeviceToHost));

    /* graph: one run captured (into its own output buffer), replayed */
    RC(cudaMalloc((void **)&gout, nx * sizeof *gout));
    RC(cudaMemsetAsync(gout, 0xff, nx * sizeof *gout, st)); /* NaN: a replay that wrote nothing cannot match */
    a.out = gout;
    RC(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    capturing = 1;
    RS(fm_layer_run(layer, &a));
    capturing = 0;
    RC(cudaStreamEndCapture(st, &g));
    RC(cudaGraphInstantiate(&ge, g, 0));
    RC(cudaGraphLaunch(ge, st)); /* warm-up (uploads the graph) */
    RS(fm_layer_errors(layer, st, NULL));
    for (int i = 0; i < in->iters; i++) {
        float e;
        RC(cudaEventRecord(ev[0], st));
        RC(cudaGraphLaunch(ge, st));
        RC(cudaEventRecord(ev[1], st));
        RC(cudaEventSynchronize(ev[1]));
        RC(cudaEventElapsedTime(&e, ev[0], ev[1]));
        ms[i] = e;
    }
    RS(fm_layer_errors(layer, st, NULL));
    t->graph_ms = median(ms, in->iters);
    {
        float *h = malloc(nx * sizeof *h);
        if (!h) {
            s = fm_fail(FM_ERR_OOM, "fp4moe run (cuda): out of host memory");
            goto done;
        }
        cudaError_t e = cudaMemcpy(h, gout, nx * sizeof *h, cudaMemcpyDeviceToHost);
        t->graph_bitexact = e == cudaSuccess && !memcmp(h, out, nx * sizeof *h);
        free(h);
        if (e != cudaSuccess) {
            s = fm_fail(FM_ERR_CUDA, "fp4moe run (cuda): cudaMemcpy (graph output): %s", cudaGetErrorString(e));
            goto done;
        }
    }
done:
    if (capturing) { /* a run refused during capture: end it so the stream is usable again */
        cudaGraph_t junk = NULL;
        (void)cudaStreamEndCapture(st, &junk);
        if (junk) cudaGraphDestroy(junk);
        (void)cudaGetLastError();
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (st) cudaStreamSynchronize(st);
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    if (st) cudaStreamDestroy(st);
    cudaFree(dx), cudaFree(dids), cudaFree(dwts), cudaFree(dout), cudaFree(gout);
    if (prev >= 0) cudaSetDevice(prev);
    free(ms);
    return s;
}

#else /* built without CUDA */

fm_status fm_run_cuda(fm_layer *layer, int ordinal, const fm_run_cuda_in *in, float *out, fm_run_cuda_times *t)
{
    (void)layer, (void)ordinal, (void)in, (void)out, (void)t;
    return fm_fail(FM_ERR_NO_BACKEND, "fp4moe run: this build has no CUDA backend");
}

#endif
