/* test_cuda_gptoss.c - gpt-oss layers on the cuda backend (issue 32): MXFP4 experts,
 * softmax-topk routing with the router's logit bias, the clamped SwiGLU
 * (FM_ACT_SWIGLU_GPTOSS) and both expert biases, against the cpu-ref backend.
 *
 * Every layer's limit is calibrated on its own weights so that 8-15 % of FC1's outputs
 * clamp (gate > L or |up| > L, measured in float64 on fresh tokens and asserted), so
 * both clamps bite as in the model. Oracles and bounds:
 *  - cpu-ref on the same weights and inputs: NMSE <= fm_layer_accuracy(cuda) (1e-4: the
 *    GPU rounds h to BF16 before FC2, as with plain SwiGLU), NaN/Inf checked first, the
 *    output poisoned before every run, fresh random inputs for every T;
 *  - graph replay = eager, bit for bit; external routing with the ids / weights the
 *    device's softmax-topk router wrote (routed_ids) = internal routing, bit for bit; the
 *    device routing against fm_moe_route on the CPU's logits (distinct ids, weights a
 *    softmax: sum 1, at most 1 % of slots off by a near-tie);
 *  - expert shards (EP) with the whole layer's plans: their sum = the whole layer up to
 *    the FP32 order of the finalize (NMSE 1e-10, in double);
 *  - every FC1 / FC2 kernel family the plan can pick (mma plain, multi-block, work list
 *    with K splits; wgmma natural X, packed X, persistent, 8-token), set by
 *    fm_layer_set_plan, each against cpu-ref with graph = eager;
 *  - create refuses a NaN / Inf expert bias with FM_ERR_NONFINITE naming the element,
 *    the caller's arrays unchanged; fm_layer_supports says yes for gpt-oss. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <math.h>
#include <string.h>

#include "fp4moe.h"
#include "gpu_common.h"
#include "moe/moe_internal.h"

typedef struct {
    fm_moe_config  cfg;
    gpu_experts    w13, w2;
    float         *router, *rbias, *b13, *b2;
    fm_moe_weights w;
    double         clamped; /* fraction of FC1 outputs the limit clamps on fresh tokens */
} oss_fx;

/* FC1 outputs (+ bias) in float64 of n random (token, expert) pairs: v[n][2I]. */
static double *fc1_sample(const oss_fx *L, fm_rng *r, int n)
{
    const int H = L->cfg.hidden, I = L->cfg.inter, E = L->cfg.n_experts;
    double   *v = malloc(sizeof(double) * (size_t)n * 2 * I);
    float    *x = malloc(sizeof(float) * H);
    assert_true(v && x);
    for (int s = 0; s < n; s++) {
        for (int k = 0; k < H; k++) x[k] = fm_bf16_decode(fm_bf16_encode(fm_rng_normal(r)));
        const int e = (int)(fm_rng_uniform(r) * E) % E;
        for (int o = 0; o < 2 * I; o++) {
            const float *wr = L->w13.deq + ((size_t)e * 2 * I + o) * H;
            double       acc = L->b13[(size_t)e * 2 * I + o];
            for (int k = 0; k < H; k++) acc += (double)wr[k] * x[k];
            v[(size_t)s * 2 * I + o] = acc;
        }
    }
    free(x);
    return v;
}

/* The fraction of outputs limit lim clamps: gate > lim, |up| > lim. */
static double clamp_fraction(const double *v, int n, int I, double lim)
{
    long c = 0;
    for (int s = 0; s < n; s++)
        for (int i = 0; i < I; i++) {
            c += v[(size_t)s * 2 * I + i] > lim;
            c += fabs(v[(size_t)s * 2 * I + I + i]) > lim;
        }
    return (double)c / ((double)n * 2 * I);
}

/* A gpt-oss layer of E experts, top-K, hidden H, inter I: MXFP4 experts, a router with a
 * logit bias, both expert biases, softmax-topk, the clamped SwiGLU with a limit that
 * clamps ~11 % of FC1's outputs. */
static void oss_make(oss_fx *L, fm_rng *r, int E, int K, int H, int I)
{
    memset(L, 0, sizeof *L);
    fm_moe_config_default(&L->cfg);
    fm_moe_config *c = &L->cfg;
    c->n_experts = E, c->top_k = K, c->hidden = H, c->inter = I, c->wfmt = FM_FORMAT_MXFP4;
    c->score = FM_SCORE_SOFTMAX_TOPK, c->renormalize = 0, c->routed_scale = 1.0f, c->n_group = c->topk_group = 0;
    c->shared_inter = 0, c->activation = FM_ACT_SWIGLU_GPTOSS;
    gpu_experts_make(&L->w13, r, FM_FORMAT_MXFP4, E, 2 * I, H);
    gpu_experts_make(&L->w2, r, FM_FORMAT_MXFP4, E, H, I);
    L->router = malloc(sizeof(float) * E * H);
    L->rbias = malloc(sizeof(float) * E);
    L->b13 = malloc(sizeof(float) * E * 2 * I);
    L->b2 = malloc(sizeof(float) * E * H);
    assert_true(L->router && L->rbias && L->b13 && L->b2);
    fm_rng_fill_normal(r, L->router, (size_t)E * H, 0.05f);
    fm_rng_fill_normal(r, L->rbias, (size_t)E, 0.5f);
    fm_rng_fill_normal(r, L->b13, (size_t)E * 2 * I, 0.5f);
    fm_rng_fill_normal(r, L->b2, (size_t)E * H, 0.5f);
    L->w = (fm_moe_weights){.router_w = L->router, .router_bias = L->rbias, .w13 = L->w13.w, .w2 = L->w2.w,
                            .w13_bias = L->b13, .w2_bias = L->b2};
    /* the limit: bisection for 11 % clamped on one sample, checked on another */
    enum { NS = 192 };
    double *v = fc1_sample(L, r, NS), lo = 0, hi = 0;
    for (size_t i = 0; i < (size_t)NS * 2 * I; i++) hi = fmax(hi, fabs(v[i]));
    for (int it = 0; it < 60; it++) {
        const double mid = 0.5 * (lo + hi);
        if (clamp_fraction(v, NS, I, mid) > 0.11) lo = mid;
        else hi = mid;
    }
    free(v);
    c->swiglu_limit = (float)hi;
    v = fc1_sample(L, r, NS);
    L->clamped = clamp_fraction(v, NS, I, c->swiglu_limit);
    free(v);
    printf("  gpt-oss layer E=%d top-%d H=%d I=%d: swiglu_limit %.4g clamps %.1f %% of FC1's outputs\n", E, K, H, I,
           (double)c->swiglu_limit, 100 * L->clamped);
    assert_true(L->clamped >= 0.08 && L->clamped <= 0.15);
    assert_int_equal(fm_moe_config_check(c), FM_OK);
}

static void oss_free(oss_fx *L)
{
    gpu_experts_free(&L->w13);
    gpu_experts_free(&L->w2);
    free(L->router), free(L->rbias), free(L->b13), free(L->b2);
}

/* layers made with fm_layer_desc.decode_work_list / row_quantile (the split-shard test) */
static int   g_work_list = 0;
static float g_row_quantile = 0;

/* The shard [first, first + n) (n = 0: every expert) on backend b: its experts' weights and biases. */
static fm_layer *make(const oss_fx *L, fm_backend_kind b, fm_cuda_device *dev, int max_tokens, int first, int n,
                      int caller_ws)
{
    fm_moe_weights w = L->w;
    w.w13 += first, w.w2 += first;
    w.w13_bias += (size_t)first * 2 * L->cfg.inter;
    w.w2_bias += (size_t)first * L->cfg.hidden;
    fm_layer_desc d = {.backend = b, .device = b == FM_BACKEND_CUDA ? dev : NULL, .max_tokens = max_tokens,
                       .first_expert = first, .n_local = n, .caller_workspace = caller_ws,
                       .decode_work_list = g_work_list, .row_quantile = g_row_quantile,
                       /* the chain: shards and forced split-K plans compared with each other;
                        * the decode kernel's gpt-oss twin is test_cuda_decode's */
                       .decode_path = FM_DECODE_PATH_OFF};
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &L->cfg, &w, &l);
    if (s != FM_OK) fail_msg("create (%s): %s: %s", fm_backend_name(b), fm_status_name(s), fm_last_error());
    return l;
}

static fm_cuda_device *gpu_setup(fm_rng *r, unsigned off)
{
    fm_test_require_gpu();
    fm_rng_init(r, fm_test_seed() + off);
    CK(cudaSetDevice(0));
    fm_cuda_device *dev = NULL;
    assert_int_equal(fm_cuda_device_open(0, &dev), FM_OK);
    return dev;
}

static double cuda_bound(const fm_moe_config *c)
{
    double b = -1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, c, &b), FM_OK);
    return b;
}

static void *dmalloc(size_t n)
{
    void *p = NULL;
    CK(cudaMalloc(&p, n));
    return p;
}

/* host -> device, the DMA landed before any work on a non-blocking stream (test_cuda_layer.c) */
static void h2d(void *dst, const void *src, size_t bytes)
{
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

/* One run over a poisoned out into host memory: FM_OK, the error word clear, nothing non-finite. */
static void run_dev(fm_layer *l, const fm_layer_run_args *a, cudaStream_t st, float *host, size_t n)
{
    CK(cudaMemsetAsync(a->out, 0xFF, sizeof(float) * n, st)); /* poison: NaN bytes */
    fm_status s = fm_layer_run(l, a);
    if (s != FM_OK) fail_msg("fm_layer_run: %s: %s", fm_status_name(s), fm_last_error());
    CK(cudaMemcpyAsync(host, a->out, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    s = fm_layer_errors(l, st, NULL);
    if (s != FM_OK) fail_msg("fm_layer_errors: %s: %s", fm_status_name(s), fm_last_error());
    long bad = fm_first_nonfinite(host, n);
    if (bad >= 0) fail_msg("out[%ld] = %g: not written, or NaN / Inf", bad, (double)host[bad]);
}

/* a captured into a graph, replayed reps times over a poisoned out: each = eager bit for bit */
static void graph_equals_eager(fm_layer *l, const fm_layer_run_args *a, cudaStream_t st, const float *eager,
                               float *again, size_t n, int reps)
{
    cudaGraph_t     g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    assert_int_equal(fm_layer_run(l, a), FM_OK);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int rep = 0; rep < reps; rep++) {
        CK(cudaMemsetAsync(a->out, 0xFF, sizeof(float) * n, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaMemcpyAsync(again, a->out, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        if (memcmp(eager, again, sizeof(float) * n)) fail_msg("graph replay %d differs from eager", rep);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
}

/* Every bucket's plan of `from` set on `to` (the work list's grid at most to's n_local experts). */
static void copy_plans(const fm_layer *from, fm_layer *to, int max_tokens, int n_local)
{
    for (int T = 1;; T = T * 2 > max_tokens ? max_tokens : T * 2) {
        fm_layer_plan_info p;
        assert_int_equal(fm_layer_plan(from, T, &p), FM_OK);
        if (p.active_experts > n_local) p.active_experts = n_local;
        fm_status s = fm_layer_set_plan(to, T, &p);
        if (s != FM_OK) fail_msg("T=%d: the whole layer's plan on a shard: %s: %s", T, fm_status_name(s), fm_last_error());
        if (T == max_tokens) break;
    }
}

/* The whole layer (32 experts, top-4, hidden = inter = 576: K % 128 != 0 as gpt-oss's 2,880)
 * with internal softmax-topk routing at T = 1 ... 600 against cpu-ref; graph = eager;
 * the device's routing against the CPU router's and, as external routing, the same bits;
 * 4 EP shards (8 experts each, internal and external routing, own and caller workspace)
 * summed = the layer. */
static void test_gptoss_layer(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 0x055);
    oss_fx          L;
    enum { E = 32, K = 4, H = 576, I = 576, maxT = 600, NSH = 4 };
    oss_make(&L, &r, E, K, H, I);
    fm_layer *gl = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, 0);
    fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, 0, 0);
    fm_layer *sl[NSH];
    for (int q = 0; q < NSH; q++) {
        sl[q] = make(&L, FM_BACKEND_CUDA, dev, maxT, q * E / NSH, E / NSH, q & 1);
        copy_plans(gl, sl[q], maxT, E / NSH); /* the same tiles: the same h, only the finalize's order differs */
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint16_t *dx = dmalloc(sizeof(uint16_t) * maxT * H);
    float    *dout = dmalloc(sizeof(float) * maxT * H), *dw = dmalloc(sizeof(float) * maxT * K);
    int32_t  *dids = dmalloc(sizeof(int32_t) * maxT * K);
    float    *got = malloc(sizeof(float) * maxT * H), *ref = malloc(sizeof(float) * maxT * H),
          *again = malloc(sizeof(float) * maxT * H);
    double   *sum = malloc(sizeof(double) * maxT * H);
    const int Ts[] = {1, 2, 5, 16, 33, 130, 600};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int    T = Ts[ti];
        const size_t n = (size_t)T * H;
        uint16_t    *x = malloc(sizeof(uint16_t) * n);
        for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
        h2d(dx, x, sizeof(uint16_t) * n);
        fm_layer_plan_info pi;
        assert_int_equal(fm_layer_plan(gl, T, &pi), FM_OK);
        char n1[48], n2[48];
        printf("  T=%3d: FC1 %s x%d%s, FC2 %s x%d%s\n", T, fm_tile_name(&pi.tile[0], n1, sizeof n1), pi.k_splits[0],
               pi.x_packed[0] ? " packed X" : "", fm_tile_name(&pi.tile[1], n2, sizeof n2), pi.k_splits[1],
               pi.work_list ? ", work list" : "");

        /* internal routing, eager, against cpu-ref */
        fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st};
        run_dev(gl, &a, st, got, n);
        fm_poison_f32(ref, n);
        assert_int_equal(fm_layer_forward(cl, x, T, ref, NULL), FM_OK);
        char what[96];
        snprintf(what, sizeof what, "T=%d: gpt-oss layer vs cpu-ref (internal softmax-topk routing)", T);
        fm_assert_close(got, ref, n, cuda_bound(&L.cfg), what);
        graph_equals_eager(gl, &a, st, got, again, n, 3);

        /* the device's routing: asked for, it changes nothing; a softmax over top-k of the
         * biased logits, as fm_moe_route chooses it */
        CK(cudaMemsetAsync(dids, 0xFF, sizeof(int32_t) * T * K, st)); /* poison: -1 ids, NaN weights */
        CK(cudaMemsetAsync(dw, 0xFF, sizeof(float) * T * K, st));
        fm_layer_run_args ar = a;
        ar.routed_ids = dids, ar.routed_weights = dw;
        run_dev(gl, &ar, st, again, n);
        assert_memory_equal(got, again, sizeof(float) * n);
        int32_t *ids = malloc(sizeof(int32_t) * T * K), *cid = malloc(sizeof(int32_t) * T * K);
        float   *wts = malloc(sizeof(float) * T * K), *cw = malloc(sizeof(float) * T * K);
        float   *logits = malloc(sizeof(float) * T * E);
        CK(cudaMemcpy(ids, dids, sizeof(int32_t) * T * K, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wts, dw, sizeof(float) * T * K, cudaMemcpyDeviceToHost));
        fm_moe_router_logits(&L.cfg, L.router, x, T, logits);
        assert_int_equal(fm_moe_route(&L.cfg, L.rbias, logits, T, cid, cw), FM_OK);
        int differ = 0;
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int j = 0; j < K; j++) {
                const int i = t * K + j;
                assert_true(ids[i] >= 0 && ids[i] < E);
                assert_true(isfinite(wts[i]) && wts[i] > 0.0f && wts[i] <= 1.0f);
                for (int u = 0; u < j; u++) assert_int_not_equal(ids[t * K + u], ids[i]);
                if (j) assert_true(wts[i] <= wts[i - 1]); /* descending biased logits, so descending weights */
                differ += ids[i] != cid[i] || fabsf(wts[i] - cw[i]) > 1e-6f * fabsf(cw[i]);
                s += wts[i];
            }
            if (fabs(s - 1.0) > 1e-5) fail_msg("T=%d token %d: the weights sum to %.9g, not 1", T, t, s);
        }
        if (differ > T * K / 100) fail_msg("T=%d: %d of %d slots differ from fm_moe_route", T, differ, T * K);

        /* external routing with the device's choice: the same bits */
        fm_layer_run_args ae = a;
        ae.topk_ids = dids, ae.topk_weights = dw;
        run_dev(gl, &ae, st, again, n);
        assert_memory_equal(got, again, sizeof(float) * n);
        graph_equals_eager(gl, &ae, st, got, again, n, 2);

        /* EP shards summed = the layer (both routings, own and caller workspace) */
        memset(sum, 0, sizeof(double) * n);
        for (int q = 0; q < NSH; q++) {
            size_t ws = 0;
            assert_int_equal(fm_layer_workspace_size(sl[q], &ws), FM_OK);
            void             *dws = (q & 1) ? dmalloc(ws) : NULL;
            fm_layer_run_args as = q % 2 ? ae : a;
            as.workspace = dws;
            run_dev(sl[q], &as, st, again, n);
            for (size_t i = 0; i < n; i++) sum[i] += again[i];
            if (q == 1) graph_equals_eager(sl[q], &as, st, again, ref, n, 2); /* a shard's replay too */
            CK(cudaFree(dws));
        }
        double e = fm_nmse64(got, sum, n);
        printf("  T=%3d: %d shards summed vs the layer: NMSE %.3g\n", T, NSH, e);
        if (!(e <= 1e-10)) fail_msg("T=%d: %d EP shards summed differ from the layer: NMSE %.3g", T, NSH, e);
        free(x), free(ids), free(cid), free(wts), free(cw), free(logits);
    }
    for (int q = 0; q < NSH; q++) fm_layer_destroy(sl[q]);
    fm_layer_destroy(gl);
    fm_layer_destroy(cl);
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    CK(cudaFree(dw));
    CK(cudaFree(dids));
    free(got), free(ref), free(again), free(sum);
    oss_free(&L);
    fm_cuda_device_close(dev);
}

/* Fresh tokens with distinct external ids over E experts (token 0's first: expert 3, so
 * shard 0 has rows) and weights in [0.1, 0.4), uploaded. */
static void ext_inputs(fm_rng *r, int T, int H, int K, int E, uint16_t *x, int32_t *ids, float *wts, uint16_t *dx,
                       int32_t *dids, float *dw)
{
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(r));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, dup = 1;
            while (dup) {
                e = t == 0 && j == 0 ? 3 : (int)(fm_rng_uniform(r) * E) % E;
                dup = 0;
                for (int u = 0; u < j; u++) dup |= ids[t * K + u] == e;
            }
            ids[t * K + j] = e;
            wts[t * K + j] = (float)(0.1 + 0.3 * fm_rng_uniform(r));
        }
    h2d(dx, x, sizeof(uint16_t) * T * H);
    h2d(dids, ids, sizeof(int32_t) * T * K);
    h2d(dw, wts, sizeof(float) * T * K);
}

/* Decode on EP8 shards (8 of 64 experts, top-4, hidden 2,048, inter 512) with the work
 * list and K splits: the T = 1 and 2 buckets forced to split FC1 8 ways and FC2 4 ways
 * over the list (the bias added once, by the CTA that sums the splits), the others the
 * planner's (0.9-quantile rows); shard 0 against the cpu-ref shard (external routing),
 * graph replay = eager over repeated replays (the split counters reset by every launch);
 * the 8 shards summed = the whole layer run with the shards' plans. */
static void test_gptoss_split_shard(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 0x5117);
    oss_fx          L;
    enum { E = 64, K = 4, H = 2048, I = 512, NL = 8, maxT = 16 };
    oss_make(&L, &r, E, K, H, I);
    g_work_list = 1, g_row_quantile = 0.9f;
    fm_layer *gl[E / NL];
    for (int q = 0; q < E / NL; q++) gl[q] = make(&L, FM_BACKEND_CUDA, dev, maxT, q * NL, NL, 0);
    fm_layer *whole = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, 0);
    fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, NL, 0);
    g_work_list = 0, g_row_quantile = 0;
    fm_tile f1, f2;
    assert_int_equal(fm_tile_parse("mma_w4m2n1k128s4", &f1), FM_OK);
    assert_int_equal(fm_tile_parse("mma_w4m1n1k128s4", &f2), FM_OK);
    for (int T = 1; T <= 2; T++) {
        fm_layer_plan_info p;
        assert_int_equal(fm_layer_plan(gl[0], T, &p), FM_OK);
        p.tile[0] = f1, p.tile[1] = f2, p.k_splits[0] = 8, p.k_splits[1] = 4, p.work_list = 1;
        p.feature_blocks[0] = p.feature_blocks[1] = 1, p.x_packed[0] = p.x_packed[1] = 0;
        for (int q = 0; q < E / NL; q++) {
            fm_status s = fm_layer_set_plan(gl[q], T, &p);
            if (s != FM_OK) fail_msg("T=%d: split plan: %s: %s", T, fm_status_name(s), fm_last_error());
        }
    }
    const int Ts[] = {1, 2, 5, 8, 16};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        fm_layer_plan_info p;
        assert_int_equal(fm_layer_plan(gl[0], Ts[ti], &p), FM_OK);
        assert_int_equal(fm_layer_set_plan(whole, Ts[ti], &p), FM_OK);
        if (Ts[ti] <= 2) assert_true(p.work_list && p.k_splits[0] == 8 && p.k_splits[1] == 4);
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint16_t *dx = dmalloc(sizeof(uint16_t) * maxT * H), *x = malloc(sizeof(uint16_t) * maxT * H);
    float    *dout = dmalloc(sizeof(float) * maxT * H), *dw = dmalloc(sizeof(float) * maxT * K);
    int32_t  *dids = dmalloc(sizeof(int32_t) * maxT * K), *ids = malloc(sizeof(int32_t) * maxT * K);
    float    *wts = malloc(sizeof(float) * maxT * K), *got = malloc(sizeof(float) * maxT * H),
          *ref = malloc(sizeof(float) * maxT * H), *again = malloc(sizeof(float) * maxT * H);
    double   *sum = malloc(sizeof(double) * maxT * H);
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int    T = Ts[ti];
        const size_t n = (size_t)T * H;
        ext_inputs(&r, T, H, K, E, x, ids, wts, dx, dids, dw);
        fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
        memset(sum, 0, sizeof(double) * n);
        for (int q = 0; q < E / NL; q++) {
            run_dev(gl[q], &a, st, got, n);
            for (size_t i = 0; i < n; i++) sum[i] += got[i];
            if (q == 0) {
                fm_layer_run_args ah = {.x = x, .T = T, .out = ref, .topk_ids = ids, .topk_weights = wts};
                fm_poison_f32(ref, n);
                assert_int_equal(fm_layer_run(cl, &ah), FM_OK);
                char what[96];
                snprintf(what, sizeof what, "T=%d: gpt-oss EP8 shard 0 (work list, K splits) vs cpu-ref", T);
                fm_assert_close(got, ref, n, cuda_bound(&L.cfg), what);
                graph_equals_eager(gl[q], &a, st, got, again, n, 4);
            }
        }
        run_dev(whole, &a, st, got, n);
        double e = fm_nmse64(got, sum, n);
        printf("  T=%2d: %d shards summed vs the whole layer: NMSE %.3g\n", T, E / NL, e);
        if (!(e <= 1e-8)) fail_msg("T=%d: %d split shards summed differ from the layer: NMSE %.3g", T, E / NL, e);
    }
    for (int q = 0; q < E / NL; q++) fm_layer_destroy(gl[q]);
    fm_layer_destroy(whole);
    fm_layer_destroy(cl);
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    CK(cudaFree(dw));
    CK(cudaFree(dids));
    free(x), free(ids), free(wts), free(got), free(ref), free(again), free(sum);
    oss_free(&L);
    fm_cuda_device_close(dev);
}

/* Every kernel family FC1 / FC2 can run, set on T = 50's bucket (64: ~6 rows per expert,
 * experts with more than 8: several passes of the 8-token tiles) of a 32-expert layer
 * (hidden = inter = 576), each against cpu-ref with graph = eager: the epilogues'
 * register path (8-token tiles), the staged path with stmatrix (natural Y) and without
 * (FC1's Y packed for a wgmma FC2), the multi-block kernel, the work list with K
 * splits, the wgmma natural-X, packed-X (warp-specialized) and persistent kernels. The
 * wgmma plans are skipped (said so) on a device without sm_90a code. */
static void test_gptoss_kernels(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 0xfa111);
    oss_fx          L;
    enum { E = 32, K = 4, H = 576, I = 576, maxT = 64, T = 50 };
    oss_make(&L, &r, E, K, H, I);
    fm_cuda_code_info code;
    assert_int_equal(fm_cuda_device_code(dev, &code), FM_OK);
    struct {
        const char *t1, *t2;
        int         nb, ks1, ks2, list, pk1, pk2;
    } plans[] = {
        {"mma_w4m2n4k128s4", "mma_w4m1n4k128s4", 1, 1, 1, 0, 0, 0},         /* staged epilogues (stmatrix) */
        {"mma_w4m2n1k128s4", "mma_w4m1n1k128s4", 2, 1, 1, 0, 0, 0},         /* multi-block, register epilogues */
        {"mma_w4m2n1k128s4", "mma_w4m1n1k128s4", 1, 4, 2, 1, 0, 0},         /* work list, K splits */
        {"mma_w4m2n4k128s4", "wgmma_w8m2n8k64s4", 1, 1, 1, 0, 0, 1},        /* FC1 staged, Y packed */
        {"wgmma_w8m2n8k64s4", "wgmma_w8m1n32k64s4", 1, 1, 1, 0, 0, 0},      /* wgmma natural X */
        {"wgmma_w8m2n8k64s4", "wgmma_w8m2n8k64s4", 1, 1, 1, 0, 1, 1},       /* wgmma packed X */
        {"wgmma_w8m2n8k64s8p", "wgmma_w8m1n32k64s4p", 1, 1, 1, 0, 1, 1},    /* wgmma persistent */
        {"wgmma_w4m2n1k128s4", "wgmma_w4m1n1k128s4", 1, 1, 1, 0, 0, 0},     /* wgmma 8-token tiles */
    };
    fm_layer *gl = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, 0);
    fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, 0, 0);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t n = (size_t)T * H;
    uint16_t    *dx = dmalloc(sizeof(uint16_t) * n), *x = malloc(sizeof(uint16_t) * n);
    float       *dout = dmalloc(sizeof(float) * n), *got = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n),
          *again = malloc(sizeof(float) * n);
    int ran = 0;
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        const int wg = !strncmp(plans[i].t1, "wgmma", 5) || !strncmp(plans[i].t2, "wgmma", 5);
        if (wg && code.wgmma_tiles == 0) {
            printf("  %s / %s: skipped (no wgmma code for %s)\n", plans[i].t1, plans[i].t2, code.running);
            continue;
        }
        fm_layer_plan_info p;
        assert_int_equal(fm_layer_plan(gl, T, &p), FM_OK);
        assert_int_equal(fm_tile_parse(plans[i].t1, &p.tile[0]), FM_OK);
        assert_int_equal(fm_tile_parse(plans[i].t2, &p.tile[1]), FM_OK);
        p.feature_blocks[0] = p.feature_blocks[1] = plans[i].nb;
        p.k_splits[0] = plans[i].ks1, p.k_splits[1] = plans[i].ks2;
        p.work_list = plans[i].list, p.active_experts = E;
        p.x_packed[0] = plans[i].pk1, p.x_packed[1] = plans[i].pk2;
        fm_status s = fm_layer_set_plan(gl, T, &p);
        if (s != FM_OK) fail_msg("%s / %s: %s: %s", plans[i].t1, plans[i].t2, fm_status_name(s), fm_last_error());
        for (size_t k = 0; k < n; k++) x[k] = fm_bf16_encode(fm_rng_normal(&r));
        h2d(dx, x, sizeof(uint16_t) * n);
        fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st};
        run_dev(gl, &a, st, got, n);
        fm_poison_f32(ref, n);
        assert_int_equal(fm_layer_forward(cl, x, T, ref, NULL), FM_OK);
        char what[128];
        snprintf(what, sizeof what, "FC1 %s%s x%d, FC2 %s x%d%s", plans[i].t1, plans[i].nb > 1 ? " (2 blocks)" : "",
                 plans[i].ks1, plans[i].t2, plans[i].ks2, plans[i].list ? ", work list" : "");
        fm_assert_close(got, ref, n, cuda_bound(&L.cfg), what);
        graph_equals_eager(gl, &a, st, got, again, n, 2);
        ran++;
    }
    assert_true(ran >= 3);
    fm_layer_destroy(gl);
    fm_layer_destroy(cl);
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    free(x), free(got), free(ref), free(again);
    oss_free(&L);
    fm_cuda_device_close(dev);
}

/* What create refuses and supports answers for gpt-oss on the cuda backend: a NaN / Inf
 * expert bias is FM_ERR_NONFINITE naming the tensor and element (the shared weight check,
 * before anything is uploaded), the caller's arrays unchanged, *out NULL; supports says
 * FM_OK for the gpt-oss configuration with every optional weight. */
static void test_gptoss_create(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 0xc4ea7e);
    oss_fx          L;
    enum { E = 8, K = 2, H = 128, I = 64 };
    oss_make(&L, &r, E, K, H, I);
    fm_layer_desc d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = 8};
    char          why[256];
    assert_int_equal(fm_layer_supports(&d, &L.cfg, FM_FEATURE_ALL, why, sizeof why), FM_OK);
    assert_string_equal(why, "");
    float *k13 = malloc(sizeof(float) * E * 2 * I), *k2 = malloc(sizeof(float) * E * H);
    const struct {
        int   which, e, i;
        float v;
        const char *name;
    } bad[] = {{0, 5, 7, NAN, "w13_bias[5][7]"}, {0, 0, 2 * I - 1, INFINITY, "w13_bias[0][127]"},
               {1, 3, 1, -INFINITY, "w2_bias[3][1]"}};
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        float *b = bad[c].which ? L.b2 : L.b13;
        size_t at = (size_t)bad[c].e * (bad[c].which ? H : 2 * I) + bad[c].i;
        const float keep = b[at];
        b[at] = bad[c].v;
        memcpy(k13, L.b13, sizeof(float) * E * 2 * I);
        memcpy(k2, L.b2, sizeof(float) * E * H);
        fm_layer *l = (fm_layer *)(uintptr_t)1;
        assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &L.w, &l), FM_ERR_NONFINITE);
        assert_null(l);
        if (!strstr(fm_last_error(), bad[c].name)) fail_msg("'%s' does not name %s", fm_last_error(), bad[c].name);
        assert_memory_equal(k13, L.b13, sizeof(float) * E * 2 * I);
        assert_memory_equal(k2, L.b2, sizeof(float) * E * H);
        b[at] = keep;
    }
    fm_layer *l = NULL;
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &L.w, &l), FM_OK);
    fm_layer_destroy(l);
    free(k13), free(k2);
    oss_free(&L);
    fm_cuda_device_close(dev);
}

/* gpt-oss as W4A8 (issue 34: FP8 activations; the MXFP4 model the wgmma W4A8 kernels are for):
 * 16 experts, top-4, hidden 320 and inter 192 (both 64 past a multiple of 128, as gpt-oss's
 * 2,880: the GEMMs' last K group is half), both expert biases and the clamp, per 128 and per
 * token, on the automatic GEMM kernel, staged32 and (sm_90) wg64 (FM_W4A8_KERNEL, read at
 * create, held for every layer of the case). Against cpu-ref's W4A8 numerics at T = 1 ... 200
 * (up to ~50 rows an expert: several passes of every kernel): NMSE <= fm_layer_accuracy; graph
 * = eager bit for bit; 2 EP shards on the same kernel summed = the layer (NMSE 1e-10). */
static void test_gptoss_w4a8(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 0x4a8);
    enum { E = 16, K = 4, H = 320, I = 192, maxT = 200 };
    const int cc = fm_cuda_device_limits(dev)->cc;
    if (cc < 89) {
        printf("SKIP: sm_%d has no FP8 mma: the layer runs W4A8 on sm_89+\n", cc);
        fm_cuda_device_close(dev);
        return;
    }
    oss_fx L;
    oss_make(&L, &r, E, K, H, I);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint16_t *dx = dmalloc(sizeof(uint16_t) * maxT * H);
    float    *dout = dmalloc(sizeof(float) * maxT * H);
    float    *got = malloc(sizeof(float) * maxT * H), *ref = malloc(sizeof(float) * maxT * H),
          *again = malloc(sizeof(float) * maxT * H);
    double   *sum = malloc(sizeof(double) * maxT * H);
    static const char *kern[3] = {NULL, "staged32", "wg64"};
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < 3; k++) {
            L.cfg.act_fp8 = mode ? FM_ACT_FP8_TOKEN : FM_ACT_FP8_BLOCK128;
            if (kern[k]) setenv("FM_W4A8_KERNEL", kern[k], 1);
            printf("  W4A8 %s, kernel %s\n", fm_act_fp8_name(L.cfg.act_fp8), kern[k] ? kern[k] : "auto");
            if (k == 2 && cc != 90) { /* wgmma: sm_90 only, refused at create elsewhere */
                fm_layer_desc d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = maxT};
                fm_layer     *l = NULL;
                assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &L.w, &l), FM_ERR_UNSUPPORTED);
                assert_null(l);
                unsetenv("FM_W4A8_KERNEL");
                continue;
            }
            fm_layer *gl = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, 0);
            fm_layer *sl[2] = {make(&L, FM_BACKEND_CUDA, dev, maxT, 0, E / 2, 0),
                               make(&L, FM_BACKEND_CUDA, dev, maxT, E / 2, E / 2, 1)};
            unsetenv("FM_W4A8_KERNEL");
            fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, 0, 0);
            const int Ts[] = {1, 7, 64, 200};
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const int    T = Ts[ti];
                const size_t n = (size_t)T * H;
                uint16_t    *x = malloc(sizeof(uint16_t) * n);
                for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
                h2d(dx, x, sizeof(uint16_t) * n);
                fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st};
                run_dev(gl, &a, st, got, n);
                fm_poison_f32(ref, n);
                assert_int_equal(fm_layer_forward(cl, x, T, ref, NULL), FM_OK);
                char what[96];
                snprintf(what, sizeof what, "W4A8 %s %s T=%d vs cpu-ref", fm_act_fp8_name(L.cfg.act_fp8),
                         kern[k] ? kern[k] : "auto", T);
                fm_assert_close(got, ref, n, cuda_bound(&L.cfg), what);
                printf("    T=%3d: NMSE vs cpu-ref %.3g (bound %.0e)\n", T, fm_nmse(got, ref, n), cuda_bound(&L.cfg));
                graph_equals_eager(gl, &a, st, got, again, n, 2);
                memset(sum, 0, sizeof(double) * n);
                for (int q = 0; q < 2; q++) {
                    size_t ws = 0;
                    assert_int_equal(fm_layer_workspace_size(sl[q], &ws), FM_OK);
                    void             *dws = q ? dmalloc(ws) : NULL;
                    fm_layer_run_args as = a;
                    as.workspace = dws;
                    run_dev(sl[q], &as, st, again, n);
                    for (size_t i = 0; i < n; i++) sum[i] += again[i];
                    CK(cudaFree(dws));
                }
                const double e = fm_nmse64(got, sum, n);
                if (!(e <= 1e-10)) fail_msg("%s: 2 shards summed differ from the layer: NMSE %.3g", what, e);
                free(x);
            }
            fm_layer_destroy(gl), fm_layer_destroy(sl[0]), fm_layer_destroy(sl[1]), fm_layer_destroy(cl);
        }
    L.cfg.act_fp8 = FM_ACT_FP8_OFF;
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    free(got), free(ref), free(again), free(sum);
    oss_free(&L);
    fm_cuda_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gptoss_create), cmocka_unit_test(test_gptoss_layer),
                                       cmocka_unit_test(test_gptoss_split_shard),
                                       cmocka_unit_test(test_gptoss_kernels), cmocka_unit_test(test_gptoss_w4a8)};
    const char *only = getenv("FM_TEST_FILTER");
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
