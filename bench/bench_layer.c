/* bench_layer.c - the whole MoE layer on the GPU as an engine calls it
 * (fm_layer_run: device x/out, the caller's stream), GLM-5 EP8 shapes, or with
 * --model gpt-oss-120b gpt-oss-120b's layer (hidden = inter = 2,880, 128 experts, top-4,
 * MXFP4, router and expert biases, softmax-topk, the clamped SwiGLU of limit 7): "ep8" is
 * then its EP8 shard (16 local experts of 128), "local" all 128 on one GPU. --model
 * deepseek-v3 (hidden 7,168, inter 2,048, 256 experts, top-8, sigmoid, 8 groups keep 4,
 * routed_scale 2.5; NVFP4) "ep8": 32 of 256, "local": 32; --model qwen3-235b (hidden 4,096,
 * inter 1,536, 128 experts, top-8, softmax renormalized; NVFP4) "ep4": 32 of 128, "local": 128
 * (issue 31's tables for those shards; the routed-expert shapes of src/sim/model.c).
 *
 * Two routings: (a) "ep8": the EP8 shard as it really is: 32 local experts of
 * 256 global, top-8 over 256 (about T local rows); (b) "local": all experts
 * local, top-8 of 32 (today's `fp4moe run` defaults). Routing is external
 * (random distinct top-8 ids and weights per token, drawn here, so the experts
 * that really receive rows are known exactly) and internal (the router GEMM +
 * routing on the device; rows then follow the random router, the byte count
 * of the external draw is used for its floor, plus the router's bytes).
 * Per T: graph-replay time (the run captured once, replays timed with events,
 * two weight sets and four inputs rotated so nothing is served from L2),
 * eager time (launches queued back to back), and fp4moe's two GEMMs alone at
 * the same rows (fm_cuda_gemm FC1 SwiGLU + FC2 FINALIZE_DET, the tiles the
 * layer uses): the layer's overhead is the difference.
 * Floor = max(bytes / copy bandwidth, FLOPs / BF16 rate): bytes = FP4 data +
 * scales of the experts with rows + x + out (+ router weights, internal), FLOPs
 * = 2 * rows * (2*inter*hidden + hidden*inter). Ceilings: --bw GB/s (default
 * 4200, the H200's measured copy) and --tflops (default 740, measured BF16).
 * Per routing, the median of its share of --reps timings (after --warm warm-ups), averaged
 * over the rotated routings, as the floor is (rot_time; --reps >= 16). Output: one table row per
 * (routing, T), then a csv line each. --breakdown: per graph node, what the graph cut
 * after that node adds (external, then internal routing; a one-memset graph first as the
 * launch baseline). --sweep: fm_layer_tune on each T's bucket, the tuned plan against
 * the planner's timed here (sweep_plans). --decode: per T, the chain against the one-launch
 * decode kernel (fm_layer_plan_info.decode; --decode-splits auto,6/4,...: at each of those K
 * splits, auto = the kernel's own) on the same layers, graph replay with external and
 * internal routing, interleaved, and the outputs compared (decode_vs_chain). --dispatched: per T,
 * the layer on the rows an EP dispatch hands it (expert-major and expert-rows layouts, the latter
 * with and without max_rows) against fm_layer_run of the same tokens (dispatched_vs_run).
 * --act-fp8 block128|token: the layer W4A8 (fm_moe_config.act_fp8, its own chain on the cuda
 * backend; run the plain and the W4A8 benchmark in one call for the comparison).
 * --no-pdl-chain: fm_layer_desc.pdl_chain OFF. --work-list /
 * --no-work-list, --row-quantile auto|mean|Q:
 * fm_layer_desc's decode_work_list ON / OFF and row_quantile (default AUTO and AUTO).
 * In a probe build of the decode kernel (cmake -DFM_DECODE_DEFS="FM_DECODE_TL=1") --decode
 * also prints each decode run's phase timeline ("decode-tl": entry, routed, FC1 done, FC2 done,
 * exit, FC2's flag waits; median / max over the CTAs, us from the first CTA's entry).
 * --timeline FILE (a probe build, -DFM_PROBE_TIMELINE=ON; bench/probe/probe.sh
 * layer-timeline): at the first T of the ep8 routing, two eager forwards with every
 * mma CTA's SM, start (before its PDL wait) and end to FILE (launches 0-3: FC1, FC2,
 * FC1, FC2), for bench/probe/timeline.py.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h" /* fm_mma_probe_timeline (--timeline, probe builds) */
#include "cuda/decode.h"        /* fm_decode_timeline (--decode in a FM_DECODE_TL probe build) */
#include "fm_rng.h"
#include "probe_tl.h"
#include "fp4moe.h"

#include "bench_ck.h"
#define FK(x)                                                                                     \
    do {                                                                                          \
        fm_status s_ = (x);                                                                       \
        if (s_ != FM_OK) {                                                                        \
            fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #x, fm_status_name(s_), fm_last_error()); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

enum { NSETS = 2, NX = 4 };

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The time of a rotation: per input (routing) x, the median of its replays, averaged over
 * the NX inputs, as the floor is (replay it of the rotation used input
 * ((it + warm) / NSETS) % NX). The NX routings give different experts rows (at T = 1 on the
 * EP8 shard a third of the draws give the shard none), so one median over the mixture jumped
 * between the modes from run to run (T = 1: 17.9 and 31.9 us with the same kernels, H200,
 * 2026-12-03). */
static double g_rx[NX]; /* the last rot_time's per-input medians (0: none), for --decode's per-input line */
static double rot_time(const double *t, int reps, int warm)
{
    double sum = 0, *v = malloc(sizeof(double) * (size_t)reps);
    int    nx = 0;
    for (int x = 0; x < NX; x++) {
        int n = 0;
        for (int it = 0; it < reps; it++)
            if (((it + warm) / NSETS) % NX == x) v[n++] = t[it];
        g_rx[x] = n ? median(v, n) : 0;
        if (n) sum += g_rx[x], nx++;
    }
    free(v);
    return nx ? sum / nx : 0;
}

/* The time of `reps` replays (after `warm`) rotating over the NSETS x NX graphs (rot_time):
 * weight set fastest, so consecutive replays never read the same weights. */
static double time_graphs(cudaGraphExec_t ex[NSETS][NX], cudaStream_t st, cudaEvent_t *ev, int reps, int warm,
                          double *t)
{
    for (int it = -warm; it < reps; it++) {
        int s = (it + warm) % NSETS, x = ((it + warm) / NSETS) % NX;
        CK(cudaEventRecord(ev[0], st));
        CK(cudaGraphLaunch(ex[s][x], st));
        CK(cudaEventRecord(ev[1], st));
        CK(cudaEventSynchronize(ev[1]));
        float ms;
        CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (it >= 0) t[it] = ms * 1e3;
    }
    return rot_time(t, reps, warm);
}

typedef struct {
    fm_qtensor *w13, *w2;
    float      *router;
    float      *rbias, *b13, *b2; /* gpt-oss: router and expert biases (NULL for GLM-5) */
} wset;

/* E experts of random NVFP4 weights: NDISTINCT are drawn and quantized, the others are
 * byte copies of them in their own buffers (the GPU reads every expert from its own
 * addresses, so the timings are those of E distinct experts; quantizing all 32 x 2 sets
 * on the host took ~100 s of a device call). */
#define NDISTINCT 4
static void make_experts(fm_rng *r, fm_format f, fm_qtensor *q, int E, int N, int K)
{
    size_t db, sb;
    FK(fm_qtensor_bytes(f, N, K, &db, &sb));
    float *src = malloc(sizeof(float) * (size_t)N * K);
    for (int e = 0; e < E; e++) {
        q[e] = (fm_qtensor){.fmt = f, .rows = N, .cols = K, .data = malloc(db), .scales = malloc(sb)};
        if (e < NDISTINCT) {
            fm_rng_fill_normal(r, src, (size_t)N * K, 1.0f / sqrtf((float)K));
            FK(fm_quantize(src, NULL, &q[e]));
        } else {
            memcpy(q[e].data, q[e % NDISTINCT].data, db);
            memcpy(q[e].scales, q[e % NDISTINCT].scales, sb);
            q[e].global_scale = q[e % NDISTINCT].global_scale;
        }
    }
    free(src);
}

/* Where a graph replay's time goes: the run captured per (weight set, input), then for
 * k = 1..n nodes the graph cut to its first k nodes (capture order: a chain), replayed
 * with the same rotation as the full graph; the difference of successive medians is
 * what node k adds (its own time less what PDL overlaps, plus its launch gap). */
static void graph_breakdown(fm_layer **L, uint16_t **dx, int32_t **dids, float **dw, float *dout, int T,
                            cudaStream_t st, cudaEvent_t *ev, int reps, int warm, const char *route, int internal)
{
    cudaGraph_t g[NSETS][NX];
    size_t      n = 0;
    for (int s = 0; s < NSETS; s++)
        for (int x = 0; x < NX; x++) {
            fm_layer_run_args a = {.x = dx[x], .T = T, .out = dout, .stream = st,
                                   .topk_ids = internal ? NULL : dids[x], .topk_weights = internal ? NULL : dw[x]};
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            FK(fm_layer_run(L[s], &a));
            CK(cudaStreamEndCapture(st, &g[s][x]));
        }
    CK(cudaGraphGetNodes(g[0][0], NULL, &n));
    double *t = malloc(sizeof(double) * reps), prev = 0;
    { /* baseline: a graph of one 4-byte memset, timed the same way (launch + event overhead) */
        cudaGraphExec_t ex[NSETS][NX];
        for (int s = 0; s < NSETS; s++)
            for (int x = 0; x < NX; x++) {
                cudaGraph_t c;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                CK(cudaMemsetAsync(dout, 0, 4, st));
                CK(cudaStreamEndCapture(st, &c));
                CK(cudaGraphInstantiate(&ex[s][x], c, 0));
                CK(cudaGraphDestroy(c));
            }
        printf("breakdown %-5s T=%-5d %s baseline %8.1f us  (a graph of one 4-byte memset)\n", route, T,
               internal ? "int" : "ext",
               time_graphs(ex, st, ev, reps, warm, t));
        for (int s = 0; s < NSETS; s++)
            for (int x = 0; x < NX; x++) CK(cudaGraphExecDestroy(ex[s][x]));
    }
    cudaGraphNode_t *nodes = malloc(sizeof *nodes * n), *cn = malloc(sizeof *cn * n);
    for (size_t k = 1; k <= n; k++) {
        cudaGraphExec_t ex[NSETS][NX];
        for (int s = 0; s < NSETS; s++)
            for (int x = 0; x < NX; x++) {
                size_t m = n;
                CK(cudaGraphGetNodes(g[s][x], nodes, &m));
                cudaGraph_t c;
                CK(cudaGraphClone(&c, g[s][x]));
                for (size_t i = 0; i < m; i++) CK(cudaGraphNodeFindInClone(&cn[i], nodes[i], c));
                for (size_t i = m; i-- > k;) CK(cudaGraphDestroyNode(cn[i]));
                CK(cudaGraphInstantiate(&ex[s][x], c, 0));
                CK(cudaGraphDestroy(c));
            }
        const double med = time_graphs(ex, st, ev, reps, warm, t);
        CK(cudaGraphGetNodes(g[0][0], nodes, &n));
        enum cudaGraphNodeType ty;
        CK(cudaGraphNodeGetType(nodes[k - 1], &ty));
        const char *name = ty == cudaGraphNodeTypeMemset ? "(memset)" : "(node)";
        unsigned    grid = 0, block = 0;
        if (ty == cudaGraphNodeTypeKernel) {
            struct cudaKernelNodeParams kp;
            CK(cudaGraphKernelNodeGetParams(nodes[k - 1], &kp));
            if (cudaFuncGetName(&name, kp.func) != cudaSuccess) name = "(kernel)";
            grid = kp.gridDim.x * kp.gridDim.y * kp.gridDim.z, block = kp.blockDim.x * kp.blockDim.y * kp.blockDim.z;
        }
        printf("breakdown %-5s T=%-5d %s node %zu/%zu %8.1f us (+%7.1f) grid %6u x %4u  %.90s\n", route, T,
               internal ? "int" : "ext", k, n, med,
               med - prev, grid, block, name);
        prev = med;
        for (int s = 0; s < NSETS; s++)
            for (int x = 0; x < NX; x++) CK(cudaGraphExecDestroy(ex[s][x]));
    }
    for (int s = 0; s < NSETS; s++)
        for (int x = 0; x < NX; x++) CK(cudaGraphDestroy(g[s][x]));
    free(nodes), free(cn), free(t);
    fflush(stdout);
}

/* --timeline: two eager forwards (after one unrecorded) with the probe build's per-CTA
 * record of every mma launch (4 slots: FC1, FC2, FC1, FC2), written as CSV */
static void write_timeline(const char *path, fm_layer *l, const uint16_t *dx, const int32_t *dids, const float *dw,
                           float *dout, int T, cudaStream_t st)
{
    const unsigned cap = 1u << 16; /* CTAs per launch kept */
    const size_t   tb = (size_t)4 * cap * 3 * sizeof(unsigned long long);
    fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
    unsigned long long *dtl = NULL, *htl = malloc(tb);
    FK(fm_layer_run(l, &a)); /* warm: plans, attributes, caches */
    CK(cudaStreamSynchronize(st));
    CK(cudaMalloc((void **)&dtl, tb));
    CK(cudaMemset(dtl, 0, tb));
    if (!htl || fm_mma_probe_timeline(dtl, cap) != 0) {
        fprintf(stderr, "bench_layer: --timeline needs a probe build (cmake -DFM_PROBE_TIMELINE=ON)\n");
        exit(2);
    }
    for (int r = 0; r < 2; r++) FK(fm_layer_run(l, &a));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(htl, dtl, tb, cudaMemcpyDeviceToHost));
    CK(fm_mma_probe_timeline(NULL, 0) == 0 ? cudaSuccess : cudaErrorUnknown);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_layer: cannot write %s\n", path);
        exit(2);
    }
    fm_layer_plan_info pl;
    char               s1[64] = "", s2[64] = "";
    memset(&pl, 0, sizeof pl);
    if (fm_layer_plan(l, T, &pl) == FM_OK) {
        fm_tile_name(&pl.tile[0], s1, sizeof s1);
        fm_tile_name(&pl.tile[1], s2, sizeof s2);
    }
    fprintf(f, "# bench_layer ep8 T=%d: launches 0, 2 = FC1 %s split %d, 1, 3 = FC2 %s split %d (eager, 2 forwards)\n", T,
            s1, pl.k_splits[0], s2, pl.k_splits[1]);
    fm_probe_tl_write(f, htl, cap);
    fclose(f);
    free(htl);
    CK(cudaFree(dtl));
    printf("# timeline of T = %d (ep8) written to %s\n", T, path);
}

static void plan_str(const fm_layer_plan_info *p, char *buf, size_t n)
{
    char n1[48], n2[48];
    snprintf(buf, n, "FC1 %s split %d%s%s, FC2 %s split %d%s%s%s", fm_tile_name(&p->tile[0], n1, sizeof n1),
             p->k_splits[0], p->feature_blocks[0] > 1 ? " mb" : "", p->x_packed[0] ? " packed" : "",
             fm_tile_name(&p->tile[1], n2, sizeof n2), p->k_splits[1], p->feature_blocks[1] > 1 ? " mb" : "",
             p->x_packed[1] ? " packed" : "", p->work_list ? ", work list" : "");
}

/* Graph replay (external routing, rot_time) of the layers with plan pl at T's bucket;
 * -1 when fm_layer_set_plan refuses it. */
static double time_plan(fm_layer **L, const fm_layer_plan_info *pl, uint16_t **dx, int32_t **dids, float **dw,
                        float *dout, int T, cudaStream_t st, cudaEvent_t *ev, int reps, int warm, double *t, int internal)
{
    for (int s = 0; s < NSETS; s++)
        if (fm_layer_set_plan(L[s], T, pl) != FM_OK) return -1;
    cudaGraphExec_t ex[NSETS][NX];
    for (int s = 0; s < NSETS; s++)
        for (int x = 0; x < NX; x++) {
            fm_layer_run_args a = {.x = dx[x], .T = T, .out = dout, .stream = st,
                                   .topk_ids = internal ? NULL : dids[x], .topk_weights = internal ? NULL : dw[x]};
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            FK(fm_layer_run(L[s], &a));
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ex[s][x], g, 0));
            CK(cudaGraphDestroy(g));
        }
    const double us = time_graphs(ex, st, ev, reps, warm, t);
    for (int s = 0; s < NSETS; s++)
        for (int x = 0; x < NX; x++) CK(cudaGraphExecDestroy(ex[s][x]));
    return us;
}

/* --sweep: fm_layer_tune on T's bucket (its search: tiles x K splits x work list, graph
 * replay, synthetic routing), then the planner's plan and the tuned one timed here
 * interleaved 3 times with this benchmark's method (two weight sets, the routings above:
 * the means), so that the gain is measured outside the tuner too. The planner's plan is
 * restored. */
static void sweep_plans(fm_layer **L, uint16_t **dx, int32_t **dids, float **dw, float *dout, int T, cudaStream_t st,
                        cudaEvent_t *ev, int reps, int warm, const char *route)
{
    fm_layer_plan_info def, tuned;
    fm_layer_tune_info ti;
    FK(fm_layer_plan(L[0], T, &def));
    FK(fm_layer_tune(L[0], T, st, &ti));
    FK(fm_layer_plan(L[0], T, &tuned));
    double *t = malloc(sizeof(double) * reps), a = 0, b = 0;
    for (int r = 0; r < 3; r++) {
        a += time_plan(L, &def, dx, dids, dw, dout, T, st, ev, reps, warm, t, 0) / 3;
        b += time_plan(L, &tuned, dx, dids, dw, dout, T, st, ev, reps, warm, t, 0) / 3;
    }
    char sd[200], sb[200];
    plan_str(&def, sd, sizeof sd);
    plan_str(&tuned, sb, sizeof sb);
    printf("sweep %-5s T=%-5d fm_layer_tune: %d plans (%d refused), %.1f -> %.1f us (its timing)%s\n", route, T,
           ti.plans_tried, ti.plans_refused, ti.before_us, ti.after_us, ti.changed ? ", changed" : ", kept the plan");
    printf("sweep %-5s T=%-5d interleaved x3 here: planner %.1f us, tuned %.1f us (%+.1f %%)\n", route, T, a, b,
           100.0 * (b - a) / a);
    printf("sweep %-5s T=%-5d   planner: %s\nsweep %-5s T=%-5d   tuned:   %s\n", route, T, sd, route, T, sb);
    FK(fm_layer_set_plan(L[0], T, &def));
    FK(fm_layer_set_plan(L[1], T, &def));
    free(t);
    fflush(stdout);
}

/* One eager run of L's plan at T (external routing, input 0) into host (n floats). */
static void run_once(fm_layer *l, uint16_t *dx, int32_t *dids, float *dw, float *dout, int T, cudaStream_t st,
                     float *host, size_t n)
{
    fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
    CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st)); /* poison: a path that leaves rows unwritten shows */
    FK(fm_layer_run(l, &a));
    CK(cudaMemcpyAsync(host, dout, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
}

/* --dispatched (expert parallelism): per T, the layer on the rows an EP dispatch would hand
 * it, laid out from the same routings on the host, against fm_layer_run of those tokens:
 * (a) run: token order, external routing; (b) expert-major (low-latency layout, capacity =
 * the routings' largest count: the tightest an engine could give) without max_rows (the
 * plan of n_local x capacity rows' bucket) and (c) with max_rows = T x top_k (one rank's own
 * tokens: the plan of T's bucket); (d) expert-rows (high-throughput layout) without max_rows:
 * the layer's max_tokens x top_k bound, the plan of max_tokens' bucket, and (e) with it. Weights applied by the layer (the rows are weight x expert(x)).
 * Graph replay of each (rot_time), interleaved 3 times; then eager outputs: each token's
 * rows summed in slot order against the run's output (bit-identical where the plan is the
 * same) and the error word. The plans each variant ran are printed. */
typedef struct {
    int       rows, cap;
    uint16_t *xr, *xm;     /* device: expert-rows [rows][H], expert-major [EL][cap][H] */
    int32_t  *off, *cnt;   /* device offsets [EL + 1], counts [EL] */
    float    *wr, *wm;     /* device weights per row, both layouts */
    float    *outr, *outm; /* device outputs, FP32 */
    int32_t  *where_r;     /* host: [T*K] row of slot (t, j) in expert-rows, or -1 */
} disp_set;

static void dispatched_vs_run(fm_layer **L, uint16_t **dx, int32_t **dids, float **dw, float *dout, int T, int H,
                              int K, int EL, int maxt, cudaStream_t st, cudaEvent_t *ev, int reps, int warm, const char *route)
{
    disp_set ds[NX];
    int      cap = 1;
    int32_t *ids = malloc(sizeof(int32_t) * T * K);
    float   *wts = malloc(sizeof(float) * T * K);
    uint16_t *hx = malloc(sizeof(uint16_t) * (size_t)T * H);
    int     *cnts = calloc((size_t)NX * EL, sizeof(int));
    for (int x = 0; x < NX; x++) { /* the counts first: the capacity is the largest over the routings */
        CK(cudaMemcpy(ids, dids[x], sizeof(int32_t) * T * K, cudaMemcpyDeviceToHost));
        for (int i = 0; i < T * K; i++)
            if (ids[i] >= 0 && ids[i] < EL && ++cnts[x * EL + ids[i]] > cap) cap = cnts[x * EL + ids[i]];
    }
    for (int x = 0; x < NX; x++) {
        disp_set *d = &ds[x];
        CK(cudaMemcpy(ids, dids[x], sizeof(int32_t) * T * K, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wts, dw[x], sizeof(float) * T * K, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hx, dx[x], sizeof(uint16_t) * (size_t)T * H, cudaMemcpyDeviceToHost));
        int32_t *off = calloc(EL + 1, sizeof(int32_t)), *fill = calloc(EL, sizeof(int32_t));
        for (int e = 0; e < EL; e++) off[e + 1] = off[e] + cnts[x * EL + e];
        d->rows = off[EL], d->cap = cap;
        const int rows = d->rows > 0 ? d->rows : 1;
        uint16_t *xr = malloc(sizeof(uint16_t) * (size_t)rows * H), *xm = malloc(sizeof(uint16_t) * (size_t)EL * cap * H);
        float    *wr = calloc(rows, sizeof(float)), *wm = calloc((size_t)EL * cap, sizeof(float));
        for (size_t i = 0; i < (size_t)EL * cap * H; i++) xm[i] = 0x7fc0; /* unsent slots: NaN, never read */
        d->where_r = malloc(sizeof(int32_t) * T * K);
        for (int t = 0; t < T; t++) /* expert, then token, then slot: the order the run packs rows in */
            for (int j = 0; j < K; j++) {
                const int e = ids[t * K + j];
                d->where_r[t * K + j] = -1;
                if (e < 0 || e >= EL) continue;
                const int p = off[e] + fill[e], q = e * cap + fill[e]++;
                d->where_r[t * K + j] = p;
                memcpy(xr + (size_t)p * H, hx + (size_t)t * H, sizeof(uint16_t) * H);
                memcpy(xm + (size_t)q * H, hx + (size_t)t * H, sizeof(uint16_t) * H);
                wr[p] = wm[q] = wts[t * K + j];
            }
        CK(cudaMalloc((void **)&d->xr, sizeof(uint16_t) * (size_t)rows * H));
        CK(cudaMalloc((void **)&d->xm, sizeof(uint16_t) * (size_t)EL * cap * H));
        CK(cudaMalloc((void **)&d->off, sizeof(int32_t) * (EL + 1)));
        CK(cudaMalloc((void **)&d->cnt, sizeof(int32_t) * EL));
        CK(cudaMalloc((void **)&d->wr, sizeof(float) * rows));
        CK(cudaMalloc((void **)&d->wm, sizeof(float) * EL * cap));
        CK(cudaMalloc((void **)&d->outr, sizeof(float) * (size_t)rows * H));
        CK(cudaMalloc((void **)&d->outm, sizeof(float) * (size_t)EL * cap * H));
        CK(cudaMemcpy(d->xr, xr, sizeof(uint16_t) * (size_t)rows * H, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d->xm, xm, sizeof(uint16_t) * (size_t)EL * cap * H, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d->off, off, sizeof(int32_t) * (EL + 1), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d->cnt, cnts + x * EL, sizeof(int32_t) * EL, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d->wr, wr, sizeof(float) * rows, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d->wm, wm, sizeof(float) * EL * cap, cudaMemcpyHostToDevice));
        free(off), free(fill), free(xr), free(xm), free(wr), free(wm);
    }
    enum { RUN, MAJOR, MAJOR_BOUND, ROWS, ROWS_BOUND, NV };
    cudaGraphExec_t ex[NV][NSETS][NX];
    for (int v = 0; v < NV; v++)
        for (int s = 0; s < NSETS; s++)
            for (int x = 0; x < NX; x++) {
                const disp_set *d = &ds[x];
                cudaGraph_t     g;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                if (v == RUN) {
                    fm_layer_run_args a = {.x = dx[x], .T = T, .out = dout, .stream = st, .topk_ids = dids[x],
                                           .topk_weights = dw[x]};
                    FK(fm_layer_run(L[s], &a));
                } else {
                    const int major = v == MAJOR || v == MAJOR_BOUND;
                    fm_layer_dispatch_args a = {.layout = major ? FM_DISPATCH_EXPERT_MAJOR : FM_DISPATCH_EXPERT_ROWS,
                                                .x = major ? d->xm : d->xr, .counts = d->cnt, .capacity = d->cap,
                                                .offsets = d->off, .weights = major ? d->wm : d->wr,
                                                .out = major ? (void *)d->outm : (void *)d->outr, .stream = st,
                                                .max_rows = v == ROWS_BOUND || v == MAJOR_BOUND ? T * K : 0};
                    FK(fm_layer_run_dispatched(L[s], &a));
                }
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ex[v][s][x], g, 0));
                CK(cudaGraphDestroy(g));
            }
    double *t = malloc(sizeof(double) * reps), us[NV] = {0};
    for (int r = 0; r < 3; r++)
        for (int v = 0; v < NV; v++) us[v] += time_graphs(ex[v], st, ev, reps, warm, t) / 3;
    /* eager outputs: the expert-rows runs' per-token sums against the run's output */
    const size_t n = (size_t)T * H;
    float       *ref = malloc(sizeof(float) * n), *rowsh = NULL;
    char         cmp[2][96];
    run_once(L[0], dx[0], dids[0], dw[0], dout, T, st, ref, n);
    for (int b = 0; b < 2; b++) {
        const disp_set *d = &ds[0];
        const int       rows = d->rows > 0 ? d->rows : 1;
        rowsh = realloc(rowsh, sizeof(float) * (size_t)rows * H);
        CK(cudaMemsetAsync(d->outr, 0xFF, sizeof(float) * (size_t)rows * H, st));
        fm_layer_dispatch_args a = {.layout = FM_DISPATCH_EXPERT_ROWS, .x = d->xr, .offsets = d->off,
                                    .weights = d->wr, .out = d->outr, .stream = st, .max_rows = b ? T * K : 0};
        FK(fm_layer_run_dispatched(L[0], &a));
        CK(cudaMemcpyAsync(rowsh, d->outr, sizeof(float) * (size_t)d->rows * H, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        FK(fm_layer_errors(L[0], st, NULL));
        size_t differ = 0, nonfinite = 0;
        double num = 0, den = 0;
        for (int tk = 0; tk < T; tk++)
            for (int c = 0; c < H; c++) {
                float o = 0.0f;
                for (int j = 0; j < K; j++)
                    if (d->where_r[tk * K + j] >= 0) o += rowsh[(size_t)d->where_r[tk * K + j] * H + c];
                const float q = ref[(size_t)tk * H + c];
                if (!isfinite(o)) nonfinite++;
                differ += memcmp(&o, &q, sizeof o) != 0;
                num += ((double)o - q) * ((double)o - q), den += (double)q * q;
            }
        if (nonfinite) snprintf(cmp[b], sizeof cmp[b], "%zu NaN/Inf sums", nonfinite);
        else if (!differ) snprintf(cmp[b], sizeof cmp[b], "sums bit-identical to the run");
        else snprintf(cmp[b], sizeof cmp[b], "sums: %zu of %zu differ, NMSE %.3g", differ, n, den > 0 ? num / den : num);
    }
    printf("dispatched %-5s T=%-5d graph: run %7.1f us | expert-major %7.1f (%+6.1f %%), max_rows %7.1f (%+6.1f %%) | "
           "expert-rows %7.1f (%+6.1f %%), max_rows %7.1f (%+6.1f %%) | cap %d\n",
           route, T, us[RUN], us[MAJOR], 100.0 * (us[MAJOR] - us[RUN]) / us[RUN], us[MAJOR_BOUND],
           100.0 * (us[MAJOR_BOUND] - us[RUN]) / us[RUN], us[ROWS], 100.0 * (us[ROWS] - us[RUN]) / us[RUN],
           us[ROWS_BOUND], 100.0 * (us[ROWS_BOUND] - us[RUN]) / us[RUN], cap);
    printf("dispatched %-5s T=%-5d   expert-rows: %s; with max_rows: %s\n", route, T, cmp[0], cmp[1]);
    { /* the plans: the run's (T's bucket), expert-major's (ceil(EL x cap / K)), expert-rows' (max_tokens) */
        const int tb[3] = {T, (EL * cap + K - 1) / K < maxt ? (EL * cap + K - 1) / K : maxt, maxt};
        static const char *who[3] = {"run / max_rows", "expert-major", "expert-rows"};
        for (int i = 0; i < 3; i++) {
            fm_layer_plan_info p;
            char               buf[200];
            FK(fm_layer_plan(L[0], tb[i], &p));
            plan_str(&p, buf, sizeof buf);
            printf("dispatched %-5s T=%-5d   plan %-15s bucket %5d: %s\n", route, T, who[i], p.bucket_tokens, buf);
        }
    }
    printf("csv,dispatched,%s,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%d\n", route, T, us[RUN], us[MAJOR], us[MAJOR_BOUND], us[ROWS],
           us[ROWS_BOUND], cap);
    for (int v = 0; v < NV; v++)
        for (int s = 0; s < NSETS; s++)
            for (int x = 0; x < NX; x++) CK(cudaGraphExecDestroy(ex[v][s][x]));
    for (int x = 0; x < NX; x++) {
        disp_set *d = &ds[x];
        cudaFree(d->xr), cudaFree(d->xm), cudaFree(d->off), cudaFree(d->cnt), cudaFree(d->wr), cudaFree(d->wm);
        cudaFree(d->outr), cudaFree(d->outm);
        free(d->where_r);
    }
    free(ids), free(wts), free(hx), free(cnts), free(t), free(ref), free(rowsh);
    fflush(stdout);
}

static int cmp_dbl(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The decode kernel's phase timeline of its last launch (a FM_DECODE_TL probe build, decode.h
 * fm_decode_timeline), over the CTAs that did the phase: us from the first CTA's entry,
 * median / max; printed as "decode-tl" lines. */
static void decode_timeline(const char *route, int T, int grid)
{
    const int cap = fm_decode_timeline(NULL, 0);
    if (cap <= 0) return; /* not a probe build */
    const int           n = grid < cap ? grid : cap;
    unsigned long long *rec = malloc(sizeof(unsigned long long) * 8 * (size_t)n);
    double             *v = malloc(sizeof(double) * (size_t)n);
    if (!rec || !v || fm_decode_timeline(rec, n) != n) {
        printf("decode-tl %-5s T=%-5d: the record could not be read\n", route, T);
        free(rec), free(v);
        return;
    }
    unsigned long long t0 = ~0ull, tend = 0;
    for (int c = 0; c < n; c++) {
        if (rec[c * 8] && rec[c * 8] < t0) t0 = rec[c * 8];
        if (rec[c * 8 + 4] > tend) tend = rec[c * 8 + 4];
    }
    printf("decode-tl %-5s T=%-5d %d CTAs, span %.2f us (first entry to last exit); us from the first entry, "
           "median / max over the CTAs in the phase:",
           route, T, n, (double)(tend - t0) * 1e-3);
    /* entry, routed, FC1 done (CTAs with FC1 units), FC2 done (with FC2 units), exit; the
     * FC2 flag waits' sum (CTAs with FC2 units) */
    const char *name[6] = {"entry", "routed", "fc1-done", "fc2-done", "exit", "fc2-wait"};
    const int   slot[6] = {0, 1, 2, 3, 4, 5};
    for (int k = 0; k < 6; k++) {
        int m = 0;
        for (int c = 0; c < n; c++) {
            const unsigned long long *q = rec + (size_t)c * 8;
            const unsigned            u1 = (unsigned)(q[7] & 0xFFFF), u2 = (unsigned)(q[7] >> 16);
            if ((k == 2 && !u1) || ((k == 3 || k == 5) && !u2) || !q[0]) continue;
            v[m++] = k == 5 ? (double)q[5] * 1e-3 : (double)(q[slot[k]] - t0) * 1e-3;
        }
        if (!m) {
            printf(" %s -", name[k]);
            continue;
        }
        qsort(v, (size_t)m, sizeof(double), cmp_dbl);
        printf(" %s %.2f / %.2f (%d)", name[k], v[m / 2], v[m - 1], m);
    }
    printf("\n");
    free(rec), free(v);
}

/* --decode: the chain and the one-launch decode kernel (fm_layer_plan_info.decode) on T's bucket,
 * for each K-split pair of `splits` (FC1 / FC2; 0 / 0 = the automatic ones; --decode-splits),
 * graph replay with external and internal routing, interleaved 3 times (rot_time each); then one
 * eager output of each compared (bit-identical, or the NMSE of decode against the chain) and the
 * error word. A pair the plan refuses is reported and skipped. The bucket's plan is restored. */
#define MAX_DSPLITS 8
static void decode_vs_chain(fm_layer **L, uint16_t **dx, int32_t **dids, float **dw, float *dout, int T, int H,
                            cudaStream_t st, cudaEvent_t *ev, int reps, int warm, const char *route,
                            const int (*splits)[2], int nsplits, const int *nloc)
{
    fm_layer_plan_info keep, chain, dec[MAX_DSPLITS];
    int                nd = 0;
    FK(fm_layer_plan(L[0], T, &keep));
    chain = keep, chain.decode = 0;
    for (int j = 0; j < nsplits; j++) {
        fm_layer_plan_info d = chain;
        d.decode = 1, d.decode_k_splits[0] = splits[j][0], d.decode_k_splits[1] = splits[j][1];
        if (fm_layer_set_plan(L[0], T, &d) != FM_OK) {
            printf("decode %-5s T=%-5d splits %d/%d refused: %s\n", route, T, splits[j][0], splits[j][1], fm_last_error());
            continue;
        }
        FK(fm_layer_plan(L[0], T, &dec[nd])); /* the splits and grid it resolved */
        nd++;
    }
    FK(fm_layer_set_plan(L[0], T, &keep));
    if (nd == 0) return;
    double *t = malloc(sizeof(double) * reps), ce = 0, ci = 0, de[MAX_DSPLITS] = {0}, di[MAX_DSPLITS] = {0};
    /* per input (routing) x, the same means of its medians: at T = 1 on an EP8 shard some inputs
     * give the shard no expert and some one, so the averaged column mixes two very different runs */
    double cex[NX] = {0}, cix[NX] = {0}, dex[MAX_DSPLITS][NX] = {{0}}, dix[MAX_DSPLITS][NX] = {{0}};
#define FM_ACC_X(dst) for (int x = 0; x < NX; x++) (dst)[x] += g_rx[x] / 3
    for (int r = 0; r < 3; r++) {
        ce += time_plan(L, &chain, dx, dids, dw, dout, T, st, ev, reps, warm, t, 0) / 3;
        FM_ACC_X(cex);
        ci += time_plan(L, &chain, dx, dids, dw, dout, T, st, ev, reps, warm, t, 1) / 3;
        FM_ACC_X(cix);
        for (int j = 0; j < nd; j++) {
            de[j] += time_plan(L, &dec[j], dx, dids, dw, dout, T, st, ev, reps, warm, t, 0) / 3;
            FM_ACC_X(dex[j]);
            di[j] += time_plan(L, &dec[j], dx, dids, dw, dout, T, st, ev, reps, warm, t, 1) / 3;
            FM_ACC_X(dix[j]);
        }
    }
#undef FM_ACC_X
    const size_t n = (size_t)T * H;
    float       *oc = malloc(sizeof(float) * n), *od = malloc(sizeof(float) * n);
    FK(fm_layer_set_plan(L[0], T, &chain));
    run_once(L[0], dx[0], dids[0], dw[0], dout, T, st, oc, n);
    for (int j = 0; j < nd; j++) {
        FK(fm_layer_set_plan(L[0], T, &dec[j]));
        run_once(L[0], dx[0], dids[0], dw[0], dout, T, st, od, n);
        FK(fm_layer_errors(L[0], st, NULL));
        double num = 0, den = 0;
        size_t nonfinite = 0;
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(od[i])) nonfinite++;
            num += ((double)od[i] - oc[i]) * ((double)od[i] - oc[i]), den += (double)oc[i] * oc[i];
        }
        char cmp[96];
        if (nonfinite) snprintf(cmp, sizeof cmp, "%zu NaN/Inf outputs (unwritten?)", nonfinite);
        else if (!memcmp(oc, od, sizeof(float) * n)) snprintf(cmp, sizeof cmp, "bit-identical to the chain");
        else snprintf(cmp, sizeof cmp, "NMSE %.3g vs the chain", den > 0 ? num / den : num);
        printf("decode %-5s T=%-5d graph ext: chain %8.1f us, decode %8.1f us (%+6.1f %%) | int: chain %8.1f, decode "
               "%8.1f (%+6.1f %%) | %d CTAs, K splits %d/%d%s | %s\n",
               route, T, ce, de[j], 100.0 * (de[j] - ce) / ce, ci, di[j], 100.0 * (di[j] - ci) / ci, dec[j].decode_ctas,
               dec[j].decode_k_splits[0], dec[j].decode_k_splits[1],
               splits[j][0] == 0 && splits[j][1] == 0 ? " (auto)" : "", cmp);
        printf("csv,decode,%s,%d,%.2f,%.2f,%.2f,%.2f,%d,%d,%d\n", route, T, ce, de[j], ci, di[j], dec[j].decode_ctas,
               dec[j].decode_k_splits[0], dec[j].decode_k_splits[1]);
        char   line[NX * 64];
        size_t at = 0;
        for (int x = 0; x < NX && at < sizeof line; x++)
            at += (size_t)snprintf(line + at, sizeof line - at, " | x%d (%d local experts ext): chain %.1f decode %.1f, "
                                   "int chain %.1f decode %.1f", x, nloc[x], cex[x], dex[j][x], cix[x], dix[j][x]);
        printf("decode-x %-5s T=%-5d per input, us%s\n", route, T, line);
        decode_timeline(route, T, dec[j].decode_ctas); /* of run_once's launch above (probe builds) */
    }
    for (int s = 0; s < NSETS; s++) FK(fm_layer_set_plan(L[s], T, &keep));
    free(t), free(oc), free(od);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    double bw = 4200, tflops = 740;
    int    reps = 30, warm = 5, quick = 0, only_local = 0, ts_user[16], n_user = 0;
    float  row_q = FM_ROW_QUANTILE_AUTO; /* --row-quantile auto|mean|Q: fm_layer_desc.row_quantile */
    int    breakdown = 0; /* --breakdown: per graph node, the time its prefix of the graph adds */
    int    sweep = 0;     /* --sweep: fm_layer_tune on each T's bucket, timed against the planner's plan */
    const char *timeline = NULL; /* --timeline FILE: per-CTA timeline of the GEMMs (probe build) */
    int    work_list = FM_WORK_LIST_AUTO; /* --work-list / --no-work-list: decode_work_list ON / OFF */
    int    pdl_chain = FM_PDL_CHAIN_AUTO; /* --no-pdl-chain: fm_layer_desc.pdl_chain OFF (an A/B) */
    int    model = 0; /* --model: 0 glm5 (default), 1 gpt-oss-120b, 2 deepseek-v3, 3 qwen3-235b */
    int    act_fp8 = FM_ACT_FP8_OFF; /* --act-fp8 block128|token: the W4A8 layer (the GEMMs alone not timed) */
    int    decode_ab = 0; /* --decode: the chain against the one-launch decode kernel, per T (decode_vs_chain) */
    int    dsplits[MAX_DSPLITS][2] = {{0, 0}}, ndsplits = 1; /* --decode-splits auto,6/4,...: its K splits */
    int    dispatched = 0; /* --dispatched: the layer on dispatched rows (both layouts) against the run, per T */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bw") && i + 1 < argc) bw = atof(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "gpt-oss-120b")) model = 1;
            else if (!strcmp(m, "deepseek-v3")) model = 2;
            else if (!strcmp(m, "qwen3-235b")) model = 3;
            else if (strcmp(m, "glm5")) {
                fprintf(stderr, "bench_layer: --model %s: glm5, gpt-oss-120b, deepseek-v3 or qwen3-235b\n", m);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--tflops") && i + 1 < argc) tflops = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--local")) only_local = 1;
        else if (!strcmp(argv[i], "--work-list")) work_list = FM_WORK_LIST_ON;
        else if (!strcmp(argv[i], "--no-pdl-chain")) pdl_chain = FM_PDL_CHAIN_OFF;
        else if (!strcmp(argv[i], "--no-work-list")) work_list = FM_WORK_LIST_OFF;
        else if (!strcmp(argv[i], "--breakdown")) breakdown = 1;
        else if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "--act-fp8") && i + 1 < argc) {
            const char *m = argv[++i];
            act_fp8 = !strcmp(m, "block128") ? FM_ACT_FP8_BLOCK128 : !strcmp(m, "token") ? FM_ACT_FP8_TOKEN : -1;
            if (act_fp8 < 0) {
                fprintf(stderr, "bench_layer: --act-fp8 %s: block128 or token\n", m);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--decode")) decode_ab = 1;
        else if (!strcmp(argv[i], "--decode-splits") && i + 1 < argc) { /* auto | A/B, comma-separated */
            const char *q = argv[++i];
            ndsplits = 0;
            while (*q) {
                int a = 0, b = 0, used = 0;
                if (!strncmp(q, "auto", 4)) q += 4;
                else if (sscanf(q, "%d/%d%n", &a, &b, &used) == 2 && a >= 1 && b >= 1) q += used;
                else {
                    fprintf(stderr, "bench_layer: --decode-splits %s: a list of auto or FC1/FC2 splits (e.g. auto,6/4)\n", argv[i]);
                    return 2;
                }
                if (ndsplits == MAX_DSPLITS) {
                    fprintf(stderr, "bench_layer: --decode-splits: at most %d entries\n", MAX_DSPLITS);
                    return 2;
                }
                dsplits[ndsplits][0] = a, dsplits[ndsplits][1] = b, ndsplits++;
                if (*q == ',') q++;
                else if (*q) {
                    fprintf(stderr, "bench_layer: --decode-splits %s: a list of auto or FC1/FC2 splits (e.g. auto,6/4)\n", argv[i]);
                    return 2;
                }
            }
            if (ndsplits == 0) {
                fprintf(stderr, "bench_layer: --decode-splits: an empty list\n");
                return 2;
            }
            decode_ab = 1;
        }
        else if (!strcmp(argv[i], "--dispatched")) dispatched = 1;
        else if (!strcmp(argv[i], "--timeline") && i + 1 < argc) timeline = argv[++i];
        else if (!strcmp(argv[i], "--row-quantile") && i + 1 < argc) {
            const char *q = argv[++i];
            row_q = !strcmp(q, "mean") ? FM_ROW_QUANTILE_MEAN : !strcmp(q, "auto") ? FM_ROW_QUANTILE_AUTO : (float)atof(q);
        }
        else if (!strcmp(argv[i], "--ts") && i + 1 < argc) { /* comma-separated T list */
            char *p = argv[++i];
            n_user = 0;
            while (*p && n_user < 16) {
                ts_user[n_user++] = atoi(p);
                while (*p && *p != ',') p++;
                if (*p == ',') p++;
            }
        }
        else {
            fprintf(stderr, "usage: bench_layer [--model glm5|gpt-oss-120b|deepseek-v3|qwen3-235b] [--bw GB/s] [--tflops T] [--reps N] [--quick] [--local] [--ts T1,T2,...] "
                            "[--work-list | --no-work-list] [--breakdown] [--sweep] [--decode] [--decode-splits auto,A/B,...] [--dispatched] "
                            "[--act-fp8 block128|token] "
                            "[--row-quantile auto|mean|Q] [--timeline FILE]\n");
            return 2;
        }
    }
    if (reps < 2 * NSETS * NX) reps = 2 * NSETS * NX; /* >= 4 replays of each routing */
    const int gptoss = model == 1; /* its activation, biases and MXFP4 */
    /* the model's shapes: the EP8 shard's local / global experts, and all local */
    /* per model: hidden, inter, top-k, the shard's local / global experts, all-local experts */
    static const struct { const char *name, *shard; int H, I, K, el, eg, elocal; } models[] = {
        {"GLM-5", "ep8", 6144, 2048, 8, 32, 256, 32},
        {"gpt-oss-120b (softmax-topk, clamped SwiGLU, biases)", "ep8", 2880, 2880, 4, 16, 128, 128},
        {"DeepSeek-V3 (sigmoid, 8 groups keep 4, routed_scale 2.5)", "ep8", 7168, 2048, 8, 32, 256, 32},
        {"Qwen3-235B-A22B (softmax, renormalized)", "ep4", 4096, 1536, 8, 32, 128, 128},
    };
    const char *shard = models[model].shard;
    const int H = models[model].H, I = models[model].I, K = models[model].K, MAXT = 4096;
    const int EL_EP = models[model].el, EG_EP = models[model].eg, E_LOCAL = models[model].elocal;
    const int ELMAX = EL_EP > E_LOCAL ? EL_EP : E_LOCAL, EGMAX = EG_EP > E_LOCAL ? EG_EP : E_LOCAL;
    const fm_format F = gptoss ? FM_FORMAT_MXFP4 : FM_FORMAT_NVFP4;
    const int Ts_full[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096}, Ts_quick[] = {1, 4, 64, 1024};
    const int *Ts = n_user ? ts_user : quick ? Ts_quick : Ts_full;
    const int  nT = n_user ? n_user : quick ? 4 : (int)(sizeof Ts_full / sizeof Ts_full[0]);
    for (int i = 0; i < nT; i++)
        if (Ts[i] < 1 || Ts[i] > MAXT) {
            fprintf(stderr, "bench_layer: T=%d outside [1, %d]\n", Ts[i], MAXT);
            return 2;
        }
    fm_rng     r;
    fm_rng_init(&r, 12345);
    fm_cuda_device *dev;
    FK(fm_cuda_device_open(0, &dev));
    printf("# bench_layer: %s MoE layer, %s, hidden %d inter %d, %s: %d local experts of %d, local: %d, top-%d; "
           "ceilings %.0f GB/s, %.0f TFLOP/s; device %s%s\n",
           models[model].name, gptoss ? "MXFP4" : "NVFP4", H, I, shard, EL_EP, EG_EP, E_LOCAL, K, bw, tflops, fm_cuda_device_limits(dev)->name,
           work_list == FM_WORK_LIST_ON    ? "; decode_work_list ON (the work list and split K in every bucket)"
           : work_list == FM_WORK_LIST_OFF ? "; decode_work_list OFF (grids over every local expert)"
                                           : "; decode_work_list AUTO (the work list where FC1 splits >= 4 ways)");
    if (row_q > 0) printf("# tiles sized for the %.3g quantile of an expert's rows (fm_layer_desc.row_quantile)\n", row_q);
    else if (row_q < 0) printf("# tiles sized for the mean rows per expert (FM_ROW_QUANTILE_MEAN)\n");
    else printf("# tiles sized for the 0.9 quantile of an expert's rows from %d tokens (FM_ROW_QUANTILE_AUTO)\n",
                FM_ROW_QUANTILE_AUTO_MIN_T);
    if (act_fp8)
        printf("# W4A8: FP8 activations %s (fm_moe_config.act_fp8); the GEMMs alone not timed (fm_cuda_gemm is the "
               "W4A16 kernel); the floor's FLOP rate is --tflops\n", act_fp8 == FM_ACT_FP8_BLOCK128 ? "per 128" : "per token");
    else if (gptoss)
        printf("# GEMMs alone: not timed for gpt-oss (fm_cuda_gemm runs plain SwiGLU without biases, not its "
               "epilogues)\n");
    else
        printf("# GEMMs alone: the layer's FC1 + FC2 of T's bucket (fm_layer_plan: rows, experts, splits, X layouts, "
               "work list) on one routing, eager\n");
    size_t db13, sb13, db2, sb2;
    FK(fm_qtensor_bytes(F, 2 * I, H, &db13, &sb13));
    FK(fm_qtensor_bytes(F, H, I, &db2, &sb2));
    /* an expert with rows: its FP4 data and scales, and its two biases (gpt-oss) */
    const double expert_bytes = (double)(db13 + sb13 + db2 + sb2) + (gptoss ? 4.0 * (2 * I + H) : 0.0);
    wset ws[NSETS];
    for (int s = 0; s < NSETS; s++) {
        ws[s].w13 = calloc(ELMAX, sizeof(fm_qtensor));
        ws[s].w2 = calloc(ELMAX, sizeof(fm_qtensor));
        make_experts(&r, F, ws[s].w13, ELMAX, 2 * I, H);
        make_experts(&r, F, ws[s].w2, ELMAX, H, I);
        ws[s].router = malloc(sizeof(float) * EGMAX * H);
        fm_rng_fill_normal(&r, ws[s].router, (size_t)EGMAX * H, 1.0f / sqrtf((float)H));
        ws[s].rbias = ws[s].b13 = ws[s].b2 = NULL;
        if (gptoss) { /* biases of the model's order of magnitude; limit 7 as its config.json */
            ws[s].rbias = malloc(sizeof(float) * EGMAX);
            ws[s].b13 = malloc(sizeof(float) * ELMAX * 2 * I);
            ws[s].b2 = malloc(sizeof(float) * ELMAX * H);
            fm_rng_fill_normal(&r, ws[s].rbias, (size_t)EGMAX, 0.5f);
            fm_rng_fill_normal(&r, ws[s].b13, (size_t)ELMAX * 2 * I, 0.5f);
            fm_rng_fill_normal(&r, ws[s].b2, (size_t)ELMAX * H, 0.5f);
        }
    }
    uint16_t *dx[NX];
    int32_t  *dids[NX];
    float    *dw[NX], *dout;
    for (int i = 0; i < NX; i++) {
        uint16_t *hx = malloc(sizeof(uint16_t) * MAXT * H);
        for (size_t j = 0; j < (size_t)MAXT * H; j++) hx[j] = fm_bf16_encode(fm_rng_normal(&r));
        CK(cudaMalloc((void **)&dx[i], sizeof(uint16_t) * MAXT * H));
        CK(cudaMemcpy(dx[i], hx, sizeof(uint16_t) * MAXT * H, cudaMemcpyHostToDevice));
        free(hx);
        CK(cudaMalloc((void **)&dids[i], sizeof(int32_t) * MAXT * K));
        CK(cudaMalloc((void **)&dw[i], sizeof(float) * MAXT * K));
    }
    CK(cudaMalloc((void **)&dout, sizeof(float) * MAXT * H));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev[2];
    CK(cudaEventCreate(&ev[0]));
    CK(cudaEventCreate(&ev[1]));
    printf("%-6s %5s %7s %9s | %9s %6s | %9s %6s | %9s %6s | %9s %6s | %s\n", "route", "T", "experts", "floor_us",
           "graph_us", "x", "eager_us", "x", "int_graph", "x", "gemms_us", "x", "ksplit");
    for (int mi = 0; mi < 2; mi++) { /* 0: the EP8 shard, 1: all local */
        const int mode = only_local ? 1 : mi, EG = mode == 0 ? EG_EP : E_LOCAL, EL = mode == 0 ? EL_EP : E_LOCAL;
        if (only_local && mi) break;
        fm_moe_config cfg;
        fm_moe_config_default(&cfg);
        cfg.n_experts = EG;
        cfg.top_k = K;
        cfg.hidden = H;
        cfg.inter = I;
        cfg.wfmt = F;
        cfg.act_fp8 = (fm_act_fp8)act_fp8;
        if (gptoss) { /* gpt-oss-120b's config.json */
            cfg.score = FM_SCORE_SOFTMAX_TOPK, cfg.renormalize = 0, cfg.routed_scale = 1.0f;
            cfg.activation = FM_ACT_SWIGLU_GPTOSS, cfg.swiglu_limit = 7.0f;
        }
        else if (model == 2) /* deepseek-ai/DeepSeek-V3's config.json */
            cfg.score = FM_SCORE_SIGMOID, cfg.n_group = 8, cfg.topk_group = 4, cfg.renormalize = 1,
            cfg.routed_scale = 2.5f;
        else if (model == 3) /* Qwen3-235B-A22B's config.json (norm_topk_prob) */
            cfg.score = FM_SCORE_SOFTMAX, cfg.renormalize = 1, cfg.routed_scale = 1.0f;
        fm_layer *L[NSETS];
        for (int s = 0; s < NSETS; s++) {
            fm_moe_weights w = {.router_w = ws[s].router, .router_bias = ws[s].rbias, .w13 = ws[s].w13,
                                .w2 = ws[s].w2, .w13_bias = ws[s].b13, .w2_bias = ws[s].b2};
            fm_layer_desc  d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = MAXT, .first_expert = 0,
                                .n_local = EL, .decode_work_list = work_list, .row_quantile = row_q,
                                .pdl_chain = pdl_chain};
            FK(fm_layer_create_desc(&d, &cfg, &w, &L[s]));
        }
        for (int ti = 0; ti < nT; ti++) {
            const int T = Ts[ti];
            /* external routing: distinct random ids over EG experts */
            int32_t *ids = malloc(sizeof(int32_t) * T * K);
            float   *wts = malloc(sizeof(float) * T * K);
            int      used[NX][256]; /* local experts: at most 128 */
            double   rows_sum = 0;
            memset(used, 0, sizeof used);
            for (int x = 0; x < NX; x++) {
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < K; j++) {
                        int e, again;
                        do {
                            e = (int)(fm_rng_uniform(&r) * EG);
                            again = 0;
                            for (int q = 0; q < j; q++) again |= ids[t * K + q] == e;
                        } while (again);
                        ids[t * K + j] = e;
                        wts[t * K + j] = (float)(0.05 + 0.2 * fm_rng_uniform(&r));
                        if (e < EL) used[x][e] = 1, rows_sum += 1;
                    }
                CK(cudaMemcpy(dids[x], ids, sizeof(int32_t) * T * K, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dw[x], wts, sizeof(float) * T * K, cudaMemcpyHostToDevice));
            }
            CK(cudaDeviceSynchronize()); /* pageable copies may land after cudaMemcpy returns; st is non-blocking */
            if (timeline && mode == 0 && ti == 0)
                write_timeline(timeline, L[0], dx[0], dids[0], dw[0], dout, T, st);
            /* the floor of each of the NX routings the timings rotate over, averaged */
            double act_sum = 0;
            int    nloc[NX] = {0}; /* each input's local experts (external routing) */
            for (int x = 0; x < NX; x++)
                for (int e = 0; e < EL; e++) act_sum += used[x][e], nloc[x] += used[x][e];
            const double actv = act_sum / NX, local_rows = rows_sum / NX;
            const int    active = (int)lround(actv);
            const double bytes = actv * expert_bytes + (double)T * H * (2 + 4);
            const double flops = 2.0 * local_rows * (2.0 * I * H + (double)H * I);
            const double floor_us = fmax(bytes / (bw * 1e3), flops / (tflops * 1e6));
            const double router_us = (double)EG * H * 4 / (bw * 1e3);
            double *tg = malloc(sizeof(double) * reps), *te = malloc(sizeof(double) * reps),
                   *ti_ = malloc(sizeof(double) * reps);
            /* graphs: one per (weight set, input), external and internal routing */
            cudaGraphExec_t ge[NSETS][NX], gi[NSETS][NX];
            for (int s = 0; s < NSETS; s++)
                for (int x = 0; x < NX; x++)
                    for (int ext = 0; ext < 2; ext++) {
                        fm_layer_run_args a = {.x = dx[x], .T = T, .out = dout, .stream = st,
                                               .topk_ids = ext ? dids[x] : NULL, .topk_weights = ext ? dw[x] : NULL};
                        cudaGraph_t g;
                        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                        FK(fm_layer_run(L[s], &a));
                        CK(cudaStreamEndCapture(st, &g));
                        CK(cudaGraphInstantiate(ext ? &ge[s][x] : &gi[s][x], g, 0));
                        CK(cudaGraphDestroy(g));
                    }
            const double ge_med = time_graphs(ge, st, ev, reps, warm, tg); /* graph replay, external routing */
            const double gi_med = time_graphs(gi, st, ev, reps, warm, ti_); /* graph replay, internal routing */
            /* eager: the host's enqueue cost is inside (queued runs, an event around each) */
            for (int it = -warm; it < reps; it++) {
                int s = (it + warm) % NSETS, x = ((it + warm) / NSETS) % NX;
                fm_layer_run_args a = {.x = dx[x], .T = T, .out = dout, .stream = st, .topk_ids = dids[x],
                                       .topk_weights = dw[x]};
                CK(cudaEventRecord(ev[0], st));
                FK(fm_layer_run(L[s], &a));
                CK(cudaEventRecord(ev[1], st));
                CK(cudaEventSynchronize(ev[1]));
                float ms;
                CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
                if (it >= 0) te[it] = ms * 1e3;
            }
            FK(fm_layer_errors(L[0], st, NULL));
            FK(fm_layer_errors(L[1], st, NULL));
            for (int in = 0; breakdown && in < 2; in++) /* external, then internal routing */
                graph_breakdown(L, dx, dids, dw, dout, T, st, ev, reps, warm, mode == 0 ? shard : "local", in);
            if (sweep) sweep_plans(L, dx, dids, dw, dout, T, st, ev, reps, warm, mode == 0 ? shard : "local");
            if (decode_ab)
                decode_vs_chain(L, dx, dids, dw, dout, T, H, st, ev, reps, warm, mode == 0 ? shard : "local",
                                (const int(*)[2])dsplits, ndsplits, nloc);
            if (dispatched)
                dispatched_vs_run(L, dx, dids, dw, dout, T, H, K, EL, MAXT, st, ev, reps, warm,
                                  mode == 0 ? shard : "local");
            /* the two GEMMs alone: the layer's own kernels with the routing's
             * offsets. The layer's FC1/FC2 launches are its last two kernels +
             * the reduce; timed here as a stand-alone pair through fm_cuda_gemm. */
            double gemm_us = NAN;
            int    gemm_ks[2] = {1, 1}; /* the K splits of the GEMMs-alone pair */
            if (!gptoss && !act_fp8) {
                int32_t *off = calloc(EL + 1, sizeof(int32_t));
                for (int i = 0; i < T * K; i++)
                    if (ids[i] < EL) off[ids[i] + 1]++;
                for (int e = 0; e < EL; e++) off[e + 1] += off[e];
                const int R = T * K;
                int32_t  *doff, *dslots;
                uint16_t *dxp, *dh;
                float    *drw, *dscr;
                CK(cudaMalloc((void **)&doff, sizeof(int32_t) * (EL + 1)));
                CK(cudaMemcpy(doff, off, sizeof(int32_t) * (EL + 1), cudaMemcpyHostToDevice));
                CK(cudaMalloc((void **)&dslots, sizeof(int32_t) * R));
                int32_t *slots = malloc(sizeof(int32_t) * R);
                for (int i = 0; i < R; i++) slots[i] = i < off[EL] ? i : -1;
                CK(cudaMemcpy(dslots, slots, sizeof(int32_t) * R, cudaMemcpyHostToDevice));
                free(slots);
                CK(cudaMalloc((void **)&dxp, sizeof(uint16_t) * (size_t)R * H));
                CK(cudaMemcpy(dxp, dx[0], sizeof(uint16_t) * (size_t)(T < R ? T : R) * H, cudaMemcpyDeviceToDevice));
                CK(cudaMalloc((void **)&dh, sizeof(uint16_t) * (size_t)R * I));
                CK(cudaMemset(dh, 0x3c, sizeof(uint16_t) * (size_t)R * I)); /* BF16 ~1.0x: not zeros */
                CK(cudaMalloc((void **)&drw, sizeof(float) * R));
                CK(cudaMemcpy(drw, dw[0], sizeof(float) * R, cudaMemcpyDeviceToDevice));
                CK(cudaMalloc((void **)&dscr, sizeof(float) * (size_t)R * H));
                fm_cuda_weights *cw13[NSETS], *cw2[NSETS];
                for (int s = 0; s < NSETS; s++) {
                    FK(fm_cuda_weights_create(ws[s].w13, EL, &cw13[s]));
                    FK(fm_cuda_weights_create(ws[s].w2, EL, &cw2[s]));
                }
                /* the layer's plan of this T (fm_layer_plan): the rows and experts its tiles were
                 * chosen for, X layouts, K splits and work list, so the pair below launches what
                 * the layer launches (fm_cuda_gemm picks the same tiles from the same inputs) */
                fm_layer_plan_info pi;
                FK(fm_layer_plan(L[0], T, &pi));
                const int act = pi.active_experts, avg = pi.expected_rows, use_list = pi.work_list;
                const int pk[2] = {pi.x_packed[0], pi.x_packed[1]}, ksp[2] = {pi.k_splits[0], pi.k_splits[1]};
                size_t    cnt_b = 0, part_b = 0;
                for (int g = 0; g < 2; g++)
                    if (ksp[g] > 1) {
                        const fm_cuda_weights *q = g ? cw2[0] : cw13[0];
                        size_t cb = fm_cuda_split_counter_bytes(q, R);
                        size_t pb = fm_cuda_gemm_split_ws_bytes(q, R, ksp[g]) - cb;
                        cnt_b = cb > cnt_b ? cb : cnt_b;
                        part_b = pb > part_b ? pb : part_b;
                    }
                void *dsplit = NULL;
                if (cnt_b + part_b) {
                    CK(cudaMalloc(&dsplit, cnt_b + part_b));
                    CK(cudaMemset(dsplit, 0, cnt_b + part_b));
                }
                gemm_ks[0] = ksp[0], gemm_ks[1] = ksp[1];
                /* the experts' work list, as the layer's permutation writes it */
                int32_t *lst = calloc(EL + 1, sizeof(int32_t)), *dlst;
                for (int e = 0; e < EL; e++)
                    if (off[e + 1] > off[e]) lst[1 + lst[0]++] = e;
                CK(cudaMalloc((void **)&dlst, sizeof(int32_t) * (EL + 1)));
                CK(cudaMemcpy(dlst, lst, sizeof(int32_t) * (EL + 1), cudaMemcpyHostToDevice));
                free(lst);
                double *tgm = malloc(sizeof(double) * reps);
                for (int it = -warm; it < reps; it++) {
                    int s = (it + warm) % NSETS;
                    fm_cuda_gemm_args a1 = {.w = cw13[s], .x = dxp, .offsets = doff, .max_rows = R,
                                            .epi = FM_CUDA_EPI_SWIGLU, .y = dh, .expected_rows = avg,
                                            .active_experts = act, .stream = st, .pdl = 1, .x_packed = pk[0],
                                            .y_packed = pk[1], .k_splits = ksp[0], .split_ws = dsplit,
                                            .split_ws_bytes = cnt_b + part_b, .expert_list = use_list ? dlst : NULL,
                                            .expert_slots = use_list ? act : 0};
                    fm_cuda_gemm_args a2 = {.w = cw2[s], .x = dh, .offsets = doff, .max_rows = R,
                                            .epi = FM_CUDA_EPI_FINALIZE_DET, .y = dout, .y_zero_init = 1,
                                            .row_weight = drw, .n_tokens = T, .top_k = K, .token_slots = dslots,
                                            .scratch = dscr, .expected_rows = avg, .active_experts = act,
                                            .stream = st, .pdl = 1, .x_packed = pk[1], .k_splits = ksp[1],
                                            .split_ws = dsplit, .split_ws_bytes = cnt_b + part_b,
                                            .expert_list = use_list ? dlst : NULL,
                                            .expert_slots = use_list ? act : 0};
                    CK(cudaEventRecord(ev[0], st));
                    FK(fm_cuda_gemm(&a1));
                    FK(fm_cuda_gemm(&a2));
                    CK(cudaEventRecord(ev[1], st));
                    CK(cudaEventSynchronize(ev[1]));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
                    if (it >= 0) tgm[it] = ms * 1e3;
                }
                gemm_us = median(tgm, reps);
                free(tgm);
                for (int s = 0; s < NSETS; s++) fm_cuda_weights_destroy(cw13[s]), fm_cuda_weights_destroy(cw2[s]);
                cudaFree(doff), cudaFree(dslots), cudaFree(dxp), cudaFree(dh), cudaFree(drw), cudaFree(dscr);
                cudaFree(dsplit);
                cudaFree(dlst);
                free(off);
            }
            const double g = ge_med, e = rot_time(te, reps, warm), gi_us = gi_med;
            printf("%-6s %5d %7d %9.1f | %9.1f %6.2f | %9.1f %6.2f | %9.1f %6.2f | %9.1f %6.2f | %d/%d\n",
                   mode == 0 ? shard : "local", T, active, floor_us, g, g / floor_us, e, e / floor_us, gi_us,
                   gi_us / (floor_us + router_us), gemm_us, gemm_us / floor_us, gemm_ks[0], gemm_ks[1]);
            printf("csv,layer,%s,%d,%d,%.0f,%.0f,%.2f,%.2f,%.2f,%.2f,%.2f\n", mode == 0 ? shard : "local", T, active,
                   bytes, flops, floor_us, g, e, gi_us, gemm_us);
            { /* what the layer launched at this T (fm_layer_plan) */
                fm_layer_plan_info lp;
                char               n1[48], n2[48];
                FK(fm_layer_plan(L[0], T, &lp));
                printf("#   plan: bucket %d, tiles for %d rows x %d experts%s; FC1 %s split %d%s, FC2 %s split %d%s%s\n",
                       lp.bucket_tokens, lp.expected_rows, lp.active_experts, lp.work_list ? ", work list" : "",
                       fm_tile_name(&lp.tile[0], n1, sizeof n1), lp.k_splits[0], lp.x_packed[0] ? " packed" : "",
                       fm_tile_name(&lp.tile[1], n2, sizeof n2), lp.k_splits[1], lp.x_packed[1] ? " packed" : "",
                       /* graph_us / eager_us / int_graph ran the decode kernel, not these tiles */
                       lp.decode ? "; the decode kernel runs this bucket (the tiles are the chain's)" : "");
            }
            { /* what the int_graph column's routing gave this shard: each weight set's router on each
               * input picks its own experts (the external routings above are drawn uniformly), so the
               * local experts it streams may differ from the external runs' (issue 31: the ~39 us
               * internal routing costs over external ids at GLM-5 EP8 T = 1) */
                int32_t *rid, *hid = malloc(sizeof(int32_t) * T * K);
                float   *rwt;
                if (!hid) {
                    fprintf(stderr, "bench_layer: out of host memory\n");
                    exit(1);
                }
                CK(cudaMalloc((void **)&rid, sizeof(int32_t) * T * K));
                CK(cudaMalloc((void **)&rwt, sizeof(float) * T * K));
                char   list[NSETS * NX * 24] = "";
                size_t at = 0;
                double sum = 0;
                for (int s = 0; s < NSETS; s++)
                    for (int x = 0; x < NX; x++) {
                        fm_layer_run_args a = {.x = dx[x], .T = T, .out = dout, .stream = st, .routed_ids = rid,
                                               .routed_weights = rwt};
                        FK(fm_layer_run(L[s], &a));
                        CK(cudaMemcpyAsync(hid, rid, sizeof(int32_t) * T * K, cudaMemcpyDeviceToHost, st));
                        CK(cudaStreamSynchronize(st));
                        unsigned char hit[256] = {0}; /* local experts: at most 128 */
                        int           n = 0, slots = 0;
                        for (int i = 0; i < T * K; i++)
                            if (hid[i] >= 0 && hid[i] < EL) {
                                slots++;
                                if (!hit[hid[i]]) hit[hid[i]] = 1, n++;
                            }
                        sum += n;
                        if (at < sizeof list)
                            at += (size_t)snprintf(list + at, sizeof list - at, "%s%d/%d", s || x ? " " : "", n, slots);
                    }
                printf("#   internal routing: local experts / slots per (weight set, input): %s; mean %.2f experts "
                       "(external: %.2f)\n",
                       list, sum / (NSETS * NX), actv);
                FK(fm_layer_errors(L[0], st, NULL));
                FK(fm_layer_errors(L[1], st, NULL));
                CK(cudaFree(rid));
                CK(cudaFree(rwt));
                free(hid);
            }
            fflush(stdout);
            for (int s = 0; s < NSETS; s++)
                for (int x = 0; x < NX; x++) cudaGraphExecDestroy(ge[s][x]), cudaGraphExecDestroy(gi[s][x]);
            free(tg), free(te), free(ti_), free(ids), free(wts);
        }
        for (int s = 0; s < NSETS; s++) fm_layer_destroy(L[s]);
    }
    fm_cuda_device_close(dev);
    return 0;
}
