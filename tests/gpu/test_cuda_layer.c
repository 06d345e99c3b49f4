/* test_cuda_layer.c - the device-resident layer (fm_layer_run on the "cuda"
 * backend) as a serving engine calls it: device x/out, a non-default stream,
 * CUDA-graph capture and replay, external routing, expert shards, BF16 output,
 * caller workspace, the device error word, the caller's current device kept.
 *
 * Oracles: the cpu-ref backend with the same routing (the accuracy table's bound: 1e-4 NMSE
 * for W4A16, as test_cuda_backend.c: the GPU rounds h to BF16 before FC2; W4A8's, where
 * test_layer_device_path runs FP8 activations too); graph replay vs
 * eager and external-from-internal routing are bit-for-bit (deterministic
 * finalize; the device router is bit-identical to the CPU's); shards summed vs
 * the whole layer up to FP32 summation order (1e-10). Fresh inputs, poisoned
 * outputs, NaN/Inf first. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp4moe.h"
#include "gpu_common.h"
#include "moe/moe_internal.h"

typedef struct {
    fm_moe_config  cfg;
    gpu_experts    w13, w2;
    float         *router, *bias;
    fm_moe_weights w;
} layer_fx;

static void fx_make_shape(layer_fx *L, fm_rng *r, fm_format f, int E, int K, int H, int I)
{
    fm_moe_config_default(&L->cfg);
    L->cfg.n_experts = E;
    L->cfg.top_k = K;
    L->cfg.hidden = H;
    L->cfg.inter = I;
    L->cfg.wfmt = f;
    gpu_experts_make(&L->w13, r, f, E, 2 * L->cfg.inter, L->cfg.hidden);
    gpu_experts_make(&L->w2, r, f, E, L->cfg.hidden, L->cfg.inter);
    L->router = malloc(sizeof(float) * E * L->cfg.hidden);
    L->bias = malloc(sizeof(float) * E);
    fm_rng_fill_normal(r, L->router, (size_t)E * L->cfg.hidden, 0.05f);
    fm_rng_fill_normal(r, L->bias, (size_t)E, 0.1f);
    L->w = (fm_moe_weights){.router_w = L->router, .router_bias = L->bias, .w13 = L->w13.w, .w2 = L->w2.w};
}

static void fx_make(layer_fx *L, fm_rng *r, fm_format f, int E, int K) { fx_make_shape(L, r, f, E, K, 256, 128); }

static void fx_free(layer_fx *L)
{
    gpu_experts_free(&L->w13);
    gpu_experts_free(&L->w2);
    free(L->router);
    free(L->bias);
}

/* layers made with fm_layer_desc.decode_work_list (test_layer_split_shard) */
static int         g_work_list = 0;
static float       g_row_quantile = 0; /* fm_layer_desc.row_quantile of the cuda layers made */
static const char *g_plans = NULL;     /* fm_layer_desc.plans of the cuda layers made (test_layer_plans) */
static int         g_pdl_chain = FM_PDL_CHAIN_AUTO; /* FM_TEST_PDL_CHAIN_OFF=1: every layer made with it off */

static fm_layer *make(const layer_fx *L, fm_backend_kind b, fm_cuda_device *dev, int max_tokens, int first, int n,
                      fm_out_dtype od, int caller_ws)
{
    fm_moe_weights w = L->w;
    w.w13 += first, w.w2 += first;
    fm_layer_desc d = {.backend = b, .device = b == FM_BACKEND_CUDA ? dev : NULL, .max_tokens = max_tokens,
                       .out_dtype = od, .first_expert = first, .n_local = n, .caller_workspace = caller_ws,
                       .decode_work_list = g_work_list, .row_quantile = g_row_quantile,
                       .plans = b == FM_BACKEND_CUDA ? g_plans : NULL, .pdl_chain = g_pdl_chain,
                       /* the chain in every bucket: these tests compare layers of other shards and
                        * plans bit for bit or at 1e-10, and set the chain's tiles; decode_path AUTO
                        * would run the decode kernel at T = 1-2 of a shard (test_cuda_decode) */
                       .decode_path = FM_DECODE_PATH_OFF};
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &L->cfg, &w, &l);
    if (s != FM_OK) fail_msg("create: %s: %s", fm_status_name(s), fm_last_error());
    return l;
}

/* Every test's start: a GPU or a skip, the rng (seed + off), ordinal 0 current and opened. */
static fm_cuda_device *gpu_setup(fm_rng *r, unsigned off)
{
    fm_test_require_gpu();
    fm_rng_init(r, fm_test_seed() + off);
    CK(cudaSetDevice(0));
    fm_cuda_device *dev = NULL;
    assert_int_equal(fm_cuda_device_open(0, &dev), FM_OK);
    return dev;
}

/* The shard tests' layer: NVFP4, 64 experts top-4, hidden 2,048, inter 512, shards of 8
 * (the planner splits FC1's K when one expert has rows: test_layer_split_shard checks) */
enum { SH_E = 64, SH_K = 4, SH_H = 2048, SH_I = 512, SH_NL = 8 };
static fm_cuda_device *shard_setup(fm_rng *r, unsigned off, layer_fx *L)
{
    fm_cuda_device *dev = gpu_setup(r, off);
    fx_make_shape(L, r, FM_FORMAT_NVFP4, SH_E, SH_K, SH_H, SH_I);
    return dev;
}

/* The cuda backend's bound against cpu-ref (fm_layer_accuracy: the one table) */
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

/* Host -> device before work on a non-blocking stream: cudaMemcpy from pageable memory may
 * return once the bytes are staged, before the DMA lands, and a non-blocking stream does not
 * wait for the legacy stream's copy; so wait for the device (suspected in a ctest -j6 run on
 * the H200, 2026-12-03, where one forward counted no out-of-range id). */
static void h2d(void *dst, const void *src, size_t bytes)
{
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

/* The device output of one run into host memory (FP32). */
static void run_dev(fm_layer *l, const fm_layer_run_args *a, cudaStream_t st, float *host, size_t n)
{
    assert_int_equal(fm_layer_run(l, a), FM_OK);
    CK(cudaMemcpyAsync(host, a->out, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
}

static void test_layer_device_path(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 0);
    assert_non_null(fm_cuda_device_limits(dev));
    const int fmts[2] = {FM_FORMAT_NVFP4, FM_FORMAT_MXFP4};
    /* each format with BF16 activations (W4A16), then FP8 per 128 and per token (W4A8: its own
     * chain, fm_cuda_layer_enqueue_w4a8), all held to the same contract; then W4A8 again on the
     * staged GEMM kernels (FM_W4A8_KERNEL, read at create: 32 tokens a pass per 128, 64 per
     * token) and the wgmma ones (64 per 128, 128 per token: MXFP4 on sm_90; NVFP4, or another
     * device, must refuse the create with FM_ERR_UNSUPPORTED), which are not the default */
    static const char *kern[14] = {NULL,       NULL,       NULL,   NULL,   NULL,    NULL,   "staged32",
                                   "staged32", "staged64", "staged64", "wg64", "wg64", "wg128", "wg128"};
    int cc = 0;
    {
        int major = 0, minor = 0;
        CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
        CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
        cc = major * 10 + minor;
    }
    for (int v = 0; v < 14; v++) {
        const int fi = v % 2;
        layer_fx  L;
        fx_make(&L, &r, (fm_format)fmts[fi], 16, 4);
        L.cfg.act_fp8 = (fm_act_fp8)(v < 6 ? v / 2 : (v / 2) % 2 ? FM_ACT_FP8_BLOCK128 : FM_ACT_FP8_TOKEN);
        printf("  %s, act_fp8 %s%s%s\n", fi ? "MXFP4" : "NVFP4", fm_act_fp8_name(L.cfg.act_fp8), kern[v] ? ", kernel " : "",
               kern[v] ? kern[v] : "");
        const int maxT = 600, H = L.cfg.hidden, K = L.cfg.top_k; /* 600 x 4 slots: 3 placement chunks */
        if (kern[v]) { /* a name the list does not hold refuses the create, by name */
            setenv("FM_W4A8_KERNEL", "staged128", 1);
            fm_moe_weights w = L.w;
            fm_layer_desc  bd = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = 8};
            fm_layer      *bl = NULL;
            assert_int_equal(fm_layer_create_desc(&bd, &L.cfg, &w, &bl), FM_ERR_INVALID_ARG);
            assert_null(bl);
            assert_non_null(strstr(fm_last_error(), "FM_W4A8_KERNEL='staged128'"));
            setenv("FM_W4A8_KERNEL", kern[v], 1);
            if (!strncmp(kern[v], "wg", 2) && (!fi || cc != 90)) { /* a kernel that cannot run this layer here */
                assert_int_equal(fm_layer_create_desc(&bd, &L.cfg, &w, &bl), FM_ERR_UNSUPPORTED);
                assert_null(bl);
                assert_non_null(strstr(fm_last_error(), kern[v]));
                printf("    refused, as it should be: %s\n", fm_last_error());
                unsetenv("FM_W4A8_KERNEL");
                fx_free(&L);
                continue;
            }
        }
        /* FM_W4A8_KERNEL stays set for the whole variant: the shards and the BF16-output layer
         * below are created on the same GEMM kernel as gl (another kernel rounds differently) */
        fm_layer *gl = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, FM_OUT_F32, 0);
        fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, 0, FM_OUT_F32, 0);
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        uint16_t *dx = dmalloc(sizeof(uint16_t) * maxT * H);
        float    *dout = dmalloc(sizeof(float) * maxT * H);
        int32_t  *dids = dmalloc(sizeof(int32_t) * maxT * K);
        float    *dw = dmalloc(sizeof(float) * maxT * K);
        float    *got = malloc(sizeof(float) * maxT * H), *ref = malloc(sizeof(float) * maxT * H),
              *again = malloc(sizeof(float) * maxT * H);
        const int Ts[] = {1, 3, 8, 33, 64, 600};
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            const size_t n = (size_t)T * H;
            uint16_t *x = malloc(sizeof(uint16_t) * n);
            for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
            h2d(dx, x, sizeof(uint16_t) * n);
            /* eager, internal routing, on a non-default stream */
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st)); /* poison: NaN bytes */
            fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st};
            run_dev(gl, &a, st, got, n);
            assert_int_equal(fm_layer_errors(gl, st, NULL), FM_OK);
            fm_poison_f32(ref, n);
            assert_int_equal(fm_layer_forward(cl, x, T, ref, NULL), FM_OK);
            fm_assert_close(got, ref, n, cuda_bound(&L.cfg), "cuda layer vs cpu-ref (internal routing)");
            { /* the value itself, for the accuracy table (a passing test's output is in `ctest -V`) */
                double num = 0, den = 0;
                for (size_t i = 0; i < n; i++) num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]), den += (double)ref[i] * ref[i];
                printf("    T=%d: cuda vs cpu-ref NMSE %.3g (bound %.0e)\n", T, den > 0 ? num / den : num, cuda_bound(&L.cfg));
            }

            /* graph capture + replay = eager, bit for bit */
            cudaGraph_t     g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            assert_int_equal(fm_layer_run(gl, &a), FM_OK);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            for (int rep = 0; rep < 3; rep++) {
                CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
                CK(cudaGraphLaunch(ge, st));
                CK(cudaMemcpyAsync(again, dout, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
                assert_memory_equal(got, again, sizeof(float) * n);
            }
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));

            /* external routing with the ids/weights the device's internal routing chose
             * (fm_layer_run_args.routed_ids/_weights): the same bits. (Routing computed on the
             * CPU instead is not always bit-identical: on the H200, 2026-12-03, one token of
             * T = 600 got a weight one ulp off, from libm's expf against the device's.) */
            CK(cudaMemsetAsync(dids, 0xFF, sizeof(int32_t) * T * K, st)); /* poison: -1 ids, NaN weights */
            CK(cudaMemsetAsync(dw, 0xFF, sizeof(float) * T * K, st));
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            fm_layer_run_args ar = a;
            ar.routed_ids = dids, ar.routed_weights = dw;
            run_dev(gl, &ar, st, again, n);
            assert_memory_equal(got, again, sizeof(float) * n); /* asking for the routing changes nothing */
            int32_t *ids = malloc(sizeof(int32_t) * T * K);
            float   *wts = malloc(sizeof(float) * T * K);
            CK(cudaMemcpy(ids, dids, sizeof(int32_t) * T * K, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(wts, dw, sizeof(float) * T * K, cudaMemcpyDeviceToHost));
            { /* the routing looks like one: distinct ids in range, finite positive weights, and
               * (almost) the CPU router's choice */
                float   *logits = malloc(sizeof(float) * T * L.cfg.n_experts), *cw = malloc(sizeof(float) * T * K);
                int32_t *cid = malloc(sizeof(int32_t) * T * K);
                fm_moe_router_logits(&L.cfg, L.router, x, T, logits);
                assert_int_equal(fm_moe_route(&L.cfg, L.bias, logits, T, cid, cw), FM_OK);
                int differ = 0;
                for (int i = 0; i < T * K; i++) {
                    assert_true(ids[i] >= 0 && ids[i] < L.cfg.n_experts);
                    assert_true(isfinite(wts[i]) && wts[i] > 0.0f);
                    for (int j = i % K + 1; j < K; j++) assert_int_not_equal(ids[i], ids[i - i % K + j]);
                    differ += ids[i] != cid[i] || fabsf(wts[i] - cw[i]) > 1e-6f * fabsf(cw[i]);
                }
                assert_true(differ <= T * K / 100); /* an ulp may flip a near-tie */
                free(logits), free(cw), free(cid);
            }
            fm_layer_run_args ae = a;
            ae.topk_ids = dids, ae.topk_weights = dw;
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(gl, &ae, st, again, n);
            assert_memory_equal(got, again, sizeof(float) * n);

            /* shards 1, 2, 4, 8 summed = the layer */
            double *sum = malloc(sizeof(double) * n);
            for (int shards = 2; shards <= 8; shards *= 2) {
                memset(sum, 0, sizeof(double) * n);
                for (int q = 0; q < shards; q++) {
                    int first = q * L.cfg.n_experts / shards, cnt = (q + 1) * L.cfg.n_experts / shards - first;
                    fm_layer *sl = make(&L, FM_BACKEND_CUDA, dev, maxT, first, cnt, FM_OUT_F32, q & 1);
                    size_t ws = 0;
                    assert_int_equal(fm_layer_workspace_size(sl, &ws), FM_OK);
                    void *dws = (q & 1) ? dmalloc(ws) : NULL; /* odd shards: caller workspace */
                    fm_layer_run_args as = q % 2 ? ae : a;      /* both routings */
                    as.workspace = dws;
                    CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
                    run_dev(sl, &as, st, again, n);
                    assert_int_equal(fm_layer_errors(sl, st, NULL), FM_OK);
                    assert_int_equal(fm_first_nonfinite(again, n), -1);
                    for (size_t i = 0; i < n; i++) sum[i] += again[i];
                    fm_layer_destroy(sl);
                    CK(cudaFree(dws));
                }
                double e = fm_nmse64(got, sum, n);
                if (!(e <= 1e-10)) fail_msg("T=%d: %d shards summed differ from the layer: NMSE %.3g", T, shards, e);
            }
            free(sum);

            /* BF16 output = BF16(FP32 output), round to nearest even */
            fm_layer *bl = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, FM_OUT_BF16, 0);
            uint16_t *dob = dmalloc(sizeof(uint16_t) * n), *ob = malloc(sizeof(uint16_t) * n);
            fm_layer_run_args ab = a;
            ab.out = dob;
            CK(cudaMemsetAsync(dob, 0xFF, sizeof(uint16_t) * n, st));
            assert_int_equal(fm_layer_run(bl, &ab), FM_OK);
            CK(cudaMemcpyAsync(ob, dob, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            for (size_t i = 0; i < n; i++)
                if (ob[i] != fm_bf16_encode(got[i])) fail_msg("BF16 out[%zu] = %04x, expected %04x", i, ob[i], fm_bf16_encode(got[i]));
            fm_layer_destroy(bl);
            CK(cudaFree(dob));
            free(ob);

            /* bad ids and NaN x: the output is still written, the error word says what */
            if (T >= 3) {
                ids[1] = L.cfg.n_experts + 5; /* out of range */
                ids[2] = -1;                 /* skipped, not an error */
                h2d(dids, ids, sizeof(int32_t) * T * K);
                run_dev(gl, &ae, st, again, n);
                assert_int_equal(fm_first_nonfinite(again, n), -1);
                fm_layer_error_info info;
                assert_int_equal(fm_layer_errors(gl, st, &info), FM_ERR_OUT_OF_RANGE);
                assert_int_equal(info.bad_ids, 1);
                assert_int_equal(info.first_bad_slot, 1);
                assert_int_equal(fm_layer_errors(gl, st, &info), FM_OK); /* cleared */
                uint16_t bad = 0x7fc0;
                h2d(dx + H + 7, &bad, 2); /* x[1][7] = NaN */
                assert_int_equal(fm_layer_run(gl, &a), FM_OK);
                assert_int_equal(fm_layer_errors(gl, st, &info), FM_ERR_NONFINITE);
                assert_int_equal(info.nonfinite_x, 1);
                assert_int_equal(info.first_nonfinite, H + 7);
            }
            free(wts), free(ids), free(x);
        }
        /* bad arguments */
        fm_layer_run_args a = {.x = dx, .T = maxT + 1, .out = dout, .stream = st};
        assert_int_equal(fm_layer_run(gl, &a), FM_ERR_BAD_SHAPE);
        a.T = 1;
        a.out = (char *)dout + 4;
        assert_int_equal(fm_layer_run(gl, &a), FM_ERR_MISALIGNED);
        a.out = dout;
        a.topk_ids = dids;
        assert_int_equal(fm_layer_run(gl, &a), FM_ERR_INVALID_ARG);
        int cur = -1;
        CK(cudaGetDevice(&cur));
        assert_int_equal(cur, 0); /* the caller's device is what it was */
        CK(cudaStreamDestroy(st));
        CK(cudaFree(dx));
        CK(cudaFree(dout));
        CK(cudaFree(dids));
        CK(cudaFree(dw));
        free(got), free(ref), free(again);
        fm_layer_destroy(gl);
        unsetenv("FM_W4A8_KERNEL");
        fm_layer_destroy(cl);
        fx_free(&L);
    }
    fm_cuda_device_close(dev);
    assert_int_equal(fm_cuda_device_open(1 << 20, &dev), FM_ERR_OUT_OF_RANGE);
    assert_null(dev);
}

/* Decode on an expert shard with decode_work_list: 8 local experts of 64 (top-4),
 * K = 2048 / 512, so that at T = 1-8 one to a few local experts get rows and the
 * planner splits K over several CTAs (checked: fm_cuda_gemm_choose splits this FC1 shape on one expert). The split
 * layer vs the cpu-ref shard with the same (external) routing, graph replay = eager bit
 * for bit over repeated replays (the split counters are reset by every launch), and
 * the eight shards summed = the whole layer. */
/* Fresh inputs of a shard test: x [T][H] BF16 normal, distinct ids over E experts per token
 * (token 0's first always expert 3: shard 0 has rows) with weights in [0.1, 0.4), copied
 * to dx / dids / dw. The host copies are the caller's to free. */
static void shard_inputs(fm_rng *r, int T, int H, int K, int E, uint16_t **x, int32_t **ids, float **wts,
                         uint16_t *dx, int32_t *dids, float *dw)
{
    const size_t n = (size_t)T * H;
    *x = malloc(sizeof(uint16_t) * n);
    *ids = malloc(sizeof(int32_t) * T * K);
    *wts = malloc(sizeof(float) * T * K);
    for (size_t i = 0; i < n; i++) (*x)[i] = fm_bf16_encode(fm_rng_normal(r));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, dup = 1;
            while (dup) {
                e = t == 0 && j == 0 ? 3 : (int)(fm_rng_uniform(r) * E);
                dup = 0;
                for (int u = 0; u < j; u++) dup |= (*ids)[t * K + u] == e;
            }
            (*ids)[t * K + j] = e;
            (*wts)[t * K + j] = (float)(0.1 + 0.3 * fm_rng_uniform(r));
        }
    h2d(dx, *x, sizeof(uint16_t) * n);
    h2d(dids, *ids, sizeof(int32_t) * T * K);
    h2d(dw, *wts, sizeof(float) * T * K);
}

/* The run a captured into a graph and replayed `reps` times over a poisoned out: each
 * replay equals eager (n floats) bit for bit. */
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
        assert_memory_equal(eager, again, sizeof(float) * n);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
}

/* The device buffers of a shard test (maxT tokens), its stream and host outputs. */
typedef struct {
    cudaStream_t st;
    uint16_t    *dx;
    float       *dout, *dw, *got, *ref, *again;
    int32_t     *dids;
} shard_bufs;

static void shard_bufs_make(shard_bufs *b, int maxT, int H, int K)
{
    CK(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking));
    b->dx = dmalloc(sizeof(uint16_t) * maxT * H);
    b->dout = dmalloc(sizeof(float) * maxT * H);
    b->dids = dmalloc(sizeof(int32_t) * maxT * K);
    b->dw = dmalloc(sizeof(float) * maxT * K);
    b->got = malloc(sizeof(float) * maxT * H);
    b->ref = malloc(sizeof(float) * maxT * H);
    b->again = malloc(sizeof(float) * maxT * H);
}

static void shard_bufs_free(shard_bufs *b)
{
    CK(cudaStreamDestroy(b->st));
    CK(cudaFree(b->dx));
    CK(cudaFree(b->dout));
    CK(cudaFree(b->dids));
    CK(cudaFree(b->dw));
    free(b->got), free(b->ref), free(b->again);
}

/* One run of T fresh tokens (shard_inputs) on l against the cpu-ref layer cl (1e-4 NMSE,
 * NaN/Inf first, out poisoned), then graph replay = eager bit for bit. */
static void run_vs_ref(fm_layer *l, fm_layer *cl, fm_rng *r, int T, int H, int K, int E, const shard_bufs *b,
                       void *ws, const char *what)
{
    const size_t n = (size_t)T * H;
    uint16_t    *x;
    int32_t     *ids;
    float       *wts;
    shard_inputs(r, T, H, K, E, &x, &ids, &wts, b->dx, b->dids, b->dw);
    fm_layer_run_args a = {.x = b->dx, .T = T, .out = b->dout, .stream = b->st, .topk_ids = b->dids,
                           .topk_weights = b->dw, .workspace = ws};
    CK(cudaMemsetAsync(b->dout, 0xFF, sizeof(float) * n, b->st));
    run_dev(l, &a, b->st, b->got, n);
    assert_int_equal(fm_layer_errors(l, b->st, NULL), FM_OK);
    assert_int_equal(fm_first_nonfinite(b->got, n), -1);
    fm_layer_run_args ah = {.x = x, .T = T, .out = b->ref, .topk_ids = ids, .topk_weights = wts};
    fm_poison_f32(b->ref, n);
    assert_int_equal(fm_layer_run(cl, &ah), FM_OK);
    fm_moe_config wo; /* the shard tests' layers: weights-only activations */
    fm_moe_config_default(&wo);
    fm_assert_close(b->got, b->ref, n, cuda_bound(&wo), what);
    graph_equals_eager(l, &a, b->st, b->got, b->again, n, 2);
    free(x), free(ids), free(wts);
}

static void test_layer_split_shard(void **state)
{
    (void)state;
    fm_rng          r;
    layer_fx        L;
    fm_cuda_device *dev = shard_setup(&r, 3, &L);
    enum { E = SH_E, K = SH_K, H = SH_H, I = SH_I, NL = SH_NL, maxT = 16 };
    { /* the planner splits K for this shape when one expert has rows */
        fm_cuda_weights *cw = NULL;
        assert_int_equal(fm_cuda_weights_create(L.w.w13, NL, &cw), FM_OK);
        fm_cuda_gemm_args q = {.w = cw, .epi = FM_CUDA_EPI_SWIGLU, .expected_rows = 1, .active_experts = 1,
                               .k_splits = FM_CUDA_K_SPLITS_AUTO};
        fm_tile      t;
        int          ks = 0;
        assert_int_equal(fm_cuda_gemm_choose(&q, &t, NULL, &ks, NULL), FM_OK);
        printf("  FC1 on one expert: k_splits %d\n", ks);
        assert_true(ks > 1);
        fm_cuda_weights_destroy(cw);
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint16_t *dx = dmalloc(sizeof(uint16_t) * maxT * H);
    float    *dout = dmalloc(sizeof(float) * maxT * H);
    int32_t  *dids = dmalloc(sizeof(int32_t) * maxT * K);
    float    *dw = dmalloc(sizeof(float) * maxT * K);
    float    *got = malloc(sizeof(float) * maxT * H), *ref = malloc(sizeof(float) * maxT * H),
          *again = malloc(sizeof(float) * maxT * H);
    double   *sum = malloc(sizeof(double) * maxT * H);
    fm_layer *gl[E / NL], *cl = NULL;
    g_work_list = 1; /* the cuda layers: the work list and split K (the CPU backends ignore it) */
    g_row_quantile = 0.9f; /* and tiles sized for the 90th percentile of the rows */
    for (int q = 0; q < E / NL; q++) gl[q] = make(&L, FM_BACKEND_CUDA, dev, maxT, q * NL, NL, FM_OUT_F32, 0);
    fm_layer *whole = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, 0, FM_OUT_F32, 0);
    const int Ts[] = {1, 2, 5, 8, 16};
    /* the whole layer (64 experts) would plan its buckets for 8x the experts: other tiles
     * and K splits, so FP32 sums of h in another order, rounded to BF16 after them, and an
     * element of h on a rounding boundary moves by 2^-9 (measured on the H200, 2026-12-03:
     * NMSE 3e-8 at T = 5 and 8 from one token, 1.5-4e-7 there). With the shards' plans (the
     * same for every shard) the sums are the same; only the finalize's order differs */
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        fm_layer_plan_info pi;
        assert_int_equal(fm_layer_plan(gl[0], Ts[ti], &pi), FM_OK);
        assert_int_equal(fm_layer_set_plan(whole, Ts[ti], &pi), FM_OK);
    }
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int    T = Ts[ti];
        const size_t n = (size_t)T * H;
        uint16_t    *x;
        int32_t     *ids;
        float       *wts;
        shard_inputs(&r, T, H, K, E, &x, &ids, &wts, dx, dids, dw);
        fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
        memset(sum, 0, sizeof(double) * n);
        for (int q = 0; q < E / NL; q++) {
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(gl[q], &a, st, got, n);
            assert_int_equal(fm_layer_errors(gl[q], st, NULL), FM_OK);
            assert_int_equal(fm_first_nonfinite(got, n), -1);
            for (size_t i = 0; i < n; i++) sum[i] += got[i];
            if (q == 0) { /* shard 0 against the reference shard, and graph replay = eager */
                cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, NL, FM_OUT_F32, 0);
                fm_layer_run_args ah = {.x = x, .T = T, .out = ref, .topk_ids = ids, .topk_weights = wts};
                fm_poison_f32(ref, n);
                assert_int_equal(fm_layer_run(cl, &ah), FM_OK);
                fm_assert_close(got, ref, n, cuda_bound(&L.cfg), "split shard vs cpu-ref shard");
                fm_layer_destroy(cl);
                graph_equals_eager(gl[q], &a, st, got, again, n, 4);
            }
        }
        CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
        run_dev(whole, &a, st, got, n);
        /* the same plans: FP32 finalize sums against the shards' sum in double (1e-10 on the
         * H200 for identical plans) */
        double e = fm_nmse64(got, sum, n);
        if (!(e <= 1e-8)) { /* where, and is the whole layer itself repeatable? */
            for (int t = 0; t < T; t++) printf("  token %d: NMSE %.3g\n", t, fm_nmse64(got + (size_t)t * H, sum + (size_t)t * H, H));
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(whole, &a, st, again, n);
            printf("  the whole layer run again: %s\n", memcmp(got, again, sizeof(float) * n) ? "differs" : "the same bits");
            fail_msg("T=%d: %d split shards summed differ from the layer: NMSE %.3g", T, E / NL, e);
        }
        free(x), free(ids), free(wts);
    }
    for (int q = 0; q < E / NL; q++) fm_layer_destroy(gl[q]);
    fm_layer_destroy(whole);
    g_work_list = 0;
    g_row_quantile = 0;
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    CK(cudaFree(dids));
    CK(cudaFree(dw));
    free(got), free(ref), free(again), free(sum);
    fx_free(&L);
    fm_cuda_device_close(dev);
}

/* fm_layer_plan: what each T's bucket launches, for a shard of 8 of 64 experts, with the
 * three row_quantile rules: the mean (the documented formula), AUTO (the mean below
 * FM_ROW_QUANTILE_AUTO_MIN_T tokens, the 0.9-quantile's rows from there), 0.9 everywhere;
 * tile names round-trip; T outside [1, max_tokens] refused. */
static void test_layer_plan(void **state)
{
    (void)state;
    fm_rng          r;
    layer_fx        L;
    fm_cuda_device *dev = shard_setup(&r, 5, &L);
    enum { E = SH_E, K = SH_K, NL = SH_NL, maxT = 300 }; /* per T: a bucket of up to 300 tokens */
    const float qs[3] = {FM_ROW_QUANTILE_MEAN, FM_ROW_QUANTILE_AUTO, 0.9f};
    fm_layer   *l[3];
    for (int i = 0; i < 3; i++) {
        g_row_quantile = qs[i];
        l[i] = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, 0);
    }
    g_row_quantile = 0;
    const int Ts[] = {1, 2, 3, 5, 8, 16, 31, 32, 33, 64, 100, 256, 257, 300};
    int       above = 0; /* buckets where the quantile asked for more rows than the mean */
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int          T = Ts[ti];
        fm_layer_plan_info p[3];
        for (int i = 0; i < 3; i++) {
            memset(&p[i], 0x5A, sizeof p[i]);
            fm_status st = fm_layer_plan(l[i], T, &p[i]);
            if (st != FM_OK) fail_msg("T=%d: fm_layer_plan %s: %s", T, fm_status_name(st), fm_last_error());
            int Tb = 1;
            while (Tb < T) Tb *= 2;
            if (Tb > maxT) Tb = maxT;
            if (p[i].bucket_tokens != Tb) fail_msg("T=%d: bucket_tokens %d, want %d", T, p[i].bucket_tokens, Tb);
            if (p[i].active_experts < 1 || p[i].active_experts > NL || p[i].expected_rows < 1)
                fail_msg("T=%d: %d rows x %d experts", T, p[i].expected_rows, p[i].active_experts);
            for (int g = 0; g < 2; g++) {
                char    name[48];
                fm_tile back;
                fm_tile_name(&p[i].tile[g], name, sizeof name);
                if (fm_tile_parse(name, &back) != FM_OK || !fm_tile_equal(&back, &p[i].tile[g]))
                    fail_msg("T=%d: GEMM %d tile '%s' does not parse back", T, g + 1, name);
                if (p[i].k_splits[g] < 1 || p[i].feature_blocks[g] < 1 || (p[i].x_packed[g] & ~1))
                    fail_msg("T=%d: GEMM %d: k_splits %d, feature_blocks %d, x_packed %d", T, g + 1, p[i].k_splits[g],
                             p[i].feature_blocks[g], p[i].x_packed[g]);
            }
        }
        /* the mean: ceil(Tb * K * NL / E) local rows over the experts expected to get one */
        const int rows = (p[0].bucket_tokens * K * NL + E - 1) / E, act = rows < NL ? (rows > 0 ? rows : 1) : NL;
        const int mean = (rows + act - 1) / act > 1 ? (rows + act - 1) / act : 1;
        if (p[0].expected_rows != mean || p[0].active_experts != act)
            fail_msg("T=%d, mean: %d rows x %d experts, want %d x %d", T, p[0].expected_rows, p[0].active_experts, mean,
                     act);
        if (p[2].expected_rows < mean) fail_msg("T=%d, 0.9: %d rows < the mean %d", T, p[2].expected_rows, mean);
        const int want_auto = p[0].bucket_tokens >= FM_ROW_QUANTILE_AUTO_MIN_T ? p[2].expected_rows : mean;
        if (p[1].expected_rows != want_auto)
            fail_msg("T=%d, auto: %d rows, want %d", T, p[1].expected_rows, want_auto);
        above += p[2].expected_rows > mean;
        char n1[48], n2[48];
        printf("  T=%3d bucket %3d: mean %2d rows, auto %2d, 0.9 %2d; auto FC1 %s x%d, FC2 %s x%d%s\n", T,
               p[1].bucket_tokens, mean, p[1].expected_rows, p[2].expected_rows,
               fm_tile_name(&p[1].tile[0], n1, sizeof n1), p[1].k_splits[0], fm_tile_name(&p[1].tile[1], n2, sizeof n2),
               p[1].k_splits[1], p[1].work_list ? ", work list" : "");
    }
    assert_true(above > 0); /* the rule is exercised: Binomial(256, 1/16)'s 0.9-quantile is ~21 rows, the mean 16 */
    fm_layer_plan_info keep, pi;
    memset(&pi, 0x3C, sizeof pi);
    keep = pi;
    assert_int_equal(fm_layer_plan(l[1], 0, &pi), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_layer_plan(l[1], maxT + 1, &pi), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_layer_plan(l[1], 1, NULL), FM_ERR_INVALID_ARG);
    assert_memory_equal(&pi, &keep, sizeof pi);
    for (int i = 0; i < 3; i++) fm_layer_destroy(l[i]);
    fx_free(&L);
    fm_cuda_device_close(dev);
}

/* The plans of every bucket of l equal want[] (fm_layer_plan). */
static void plans_are(const fm_layer *l, const int *Ts, int n, const fm_layer_plan_info *want, const char *what)
{
    for (int i = 0; i < n; i++) {
        fm_layer_plan_info p;
        assert_int_equal(fm_layer_plan(l, Ts[i], &p), FM_OK);
        if (memcmp(&p, &want[i], sizeof p)) fail_msg("%s: the plan of T=%d changed", what, Ts[i]);
    }
}

/* fm_layer_set_plan on a shard of 8 of 64 experts (max_tokens 16): every refusal with its
 * status and every bucket's plan unchanged after it; then, per bucket, plans the planner did
 * not choose (the work list toggled, other mma tiles with K splits up to 8: a split buffer
 * larger than the planner's) reported back by fm_layer_plan and run against the cpu-ref
 * shard (1e-4 NMSE), graph replay = eager bit for bit. */
static void test_layer_set_plan(void **state)
{
    (void)state;
    fm_rng          r;
    layer_fx        L;
    fm_cuda_device *dev = shard_setup(&r, 7, &L);
    enum { E = SH_E, K = SH_K, H = SH_H, NL = SH_NL, maxT = 16, NB = 5 };
    const int Tb[NB] = {1, 2, 4, 8, 16};
    fm_layer *l = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, 0);
    fm_layer_plan_info keep[NB], bad;
    for (int i = 0; i < NB; i++) assert_int_equal(fm_layer_plan(l, Tb[i], &keep[i]), FM_OK);
    assert_int_equal(fm_layer_set_plan(l, 1, &keep[0]), FM_OK); /* its own plan back: nothing changes */
    plans_are(l, Tb, NB, keep, "own plan set back");
    fm_tile t_odd, t_mb, t_none;
    assert_int_equal(fm_tile_parse("mma_w4m1n1k256s4", &t_odd), FM_OK); /* one band: no SwiGLU pairs */
    assert_int_equal(fm_tile_parse("mma_w4m2n1k256s3", &t_mb), FM_OK);  /* has a multi-block kernel */
    t_none = t_mb;
    t_none.stages = 7; /* not compiled */
    assert_int_equal(fm_layer_set_plan(NULL, 1, &keep[0]), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_set_plan(l, 1, NULL), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_set_plan(l, 0, &keep[0]), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_layer_set_plan(l, maxT + 1, &keep[0]), FM_ERR_BAD_SHAPE);
    struct {
        int       field, value;
        fm_status want;
        const char *what;
    } cases[] = {
        {0, 0, FM_ERR_INVALID_ARG, "FC1 k_splits 0"},
        {1, FM_CUDA_MAX_K_SPLITS + 1, FM_ERR_INVALID_ARG, "FC2 k_splits above the maximum"},
        {2, 0, FM_ERR_INVALID_ARG, "FC1 feature_blocks 0"},
        {3, 2, FM_ERR_INVALID_ARG, "work_list 2"},
        {4, 0, FM_ERR_INVALID_ARG, "work list sized for 0 experts"},
        {4, NL + 1, FM_ERR_INVALID_ARG, "work list sized for more than the local experts"},
        {5, 0, FM_ERR_UNSUPPORTED, "FC1 tile without SwiGLU pairs"},
        {6, 0, FM_ERR_UNSUPPORTED, "FC1 tile not compiled in"},
        {7, 0, FM_ERR_UNSUPPORTED, "FC1 mma tile with packed X"},
        {8, 0, FM_ERR_UNSUPPORTED, "FC1 K split with two feature blocks a CTA"},
        {9, 0, FM_ERR_UNSUPPORTED, "FC1 K split 16 over 8 K stages"},
        {10, 0, FM_ERR_UNSUPPORTED, "work list with two feature blocks a CTA"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bad = keep[0];
        switch (cases[c].field) {
        case 0: bad.k_splits[0] = cases[c].value; break;
        case 1: bad.k_splits[1] = cases[c].value; break;
        case 2: bad.feature_blocks[0] = cases[c].value; break;
        case 3: bad.work_list = cases[c].value; break;
        case 4: bad.work_list = 1, bad.active_experts = cases[c].value; break;
        case 5: bad.tile[0] = t_odd, bad.k_splits[0] = 1, bad.feature_blocks[0] = 1, bad.x_packed[0] = 0; break;
        case 6: bad.tile[0] = t_none, bad.k_splits[0] = 1, bad.feature_blocks[0] = 1, bad.x_packed[0] = 0; break;
        case 7: bad.tile[0] = t_mb, bad.k_splits[0] = 1, bad.feature_blocks[0] = 1, bad.x_packed[0] = 1; break;
        case 8: bad.tile[0] = t_mb, bad.k_splits[0] = 2, bad.feature_blocks[0] = 2, bad.x_packed[0] = 0, bad.work_list = 0;
                break;
        case 9: bad.tile[0] = t_mb, bad.k_splits[0] = 16, bad.feature_blocks[0] = 1, bad.x_packed[0] = 0; break;
        default: bad.tile[1] = t_mb, bad.k_splits[1] = 1, bad.feature_blocks[1] = 2, bad.x_packed[1] = 0;
                 bad.work_list = 1, bad.active_experts = 1;
        }
        fm_status st = fm_layer_set_plan(l, 1, &bad);
        printf("  refused (%s): %s: %s\n", cases[c].what, fm_status_name(st), fm_last_error());
        if (st != cases[c].want)
            fail_msg("%s: %s, want %s", cases[c].what, fm_status_name(st), fm_status_name(cases[c].want));
        plans_are(l, Tb, NB, keep, cases[c].what);
    }
    /* plans the planner did not choose, each run against the reference */
    shard_bufs bf;
    shard_bufs_make(&bf, maxT, H, K);
    fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, NL, FM_OUT_F32, 0);
    fm_tile   f1, f2;
    assert_int_equal(fm_tile_parse("mma_w4m2n1k128s4", &f1), FM_OK);
    assert_int_equal(fm_tile_parse("mma_w4m1n1k128s4", &f2), FM_OK);
    const int Ts[] = {1, 3, 16};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int T = Ts[ti], bi = T == 1 ? 0 : T <= 4 ? 2 : 4;
        for (int v = 0; v < 2; v++) {
            fm_layer_plan_info p = keep[bi], back;
            if (v == 0) { /* the work list toggled: plain grids, or the list with splits 4 / 2 */
                p.work_list = !keep[bi].work_list;
                p.k_splits[0] = p.work_list ? 4 : 1, p.k_splits[1] = p.work_list ? 2 : 1;
                if (p.work_list) p.feature_blocks[0] = p.feature_blocks[1] = 1;
            } else { /* other tiles, 8 / 4 splits over the list */
                p.tile[0] = f1, p.tile[1] = f2, p.k_splits[0] = 8, p.k_splits[1] = 4, p.work_list = 1;
                p.feature_blocks[0] = p.feature_blocks[1] = 1, p.x_packed[0] = p.x_packed[1] = 0;
            }
            if (p.work_list && (p.tile[0].family == FM_FAMILY_FP4MOE_WGMMA || p.tile[1].family == FM_FAMILY_FP4MOE_WGMMA))
                continue; /* the planner put wgmma tiles here: the list takes mma tiles only (refused above) */
            fm_status sst = fm_layer_set_plan(l, T, &p);
            if (sst != FM_OK) fail_msg("T=%d variant %d: %s: %s", T, v, fm_status_name(sst), fm_last_error());
            assert_int_equal(fm_layer_plan(l, T, &back), FM_OK);
            for (int g = 0; g < 2; g++)
                if (!fm_tile_equal(&back.tile[g], &p.tile[g]) || back.k_splits[g] != p.k_splits[g])
                    fail_msg("T=%d variant %d: fm_layer_plan does not report the plan set (GEMM %d)", T, v, g + 1);
            assert_int_equal(back.work_list, p.work_list);
            run_vs_ref(l, cl, &r, T, H, K, E, &bf, NULL, "a set plan vs the cpu-ref shard");
            char n1[48], n2[48];
            printf("  T=%2d variant %d: FC1 %s x%d, FC2 %s x%d%s: matches the reference\n", T, v,
                   fm_tile_name(&p.tile[0], n1, sizeof n1), p.k_splits[0], fm_tile_name(&p.tile[1], n2, sizeof n2),
                   p.k_splits[1], p.work_list ? ", work list" : "");
        }
    }
    fm_layer_destroy(cl);
    fm_layer_destroy(l);
    shard_bufs_free(&bf);
    fx_free(&L);
    fm_cuda_device_close(dev);
}

/* fm_layer_tune on a shard of 8 of 64 experts (max_tokens 16; one layer with its own
 * workspace, one with the caller's): per T the search ran (plans tried), the plan kept
 * is at least as fast as the one before by its own interleaved timing (after <= before:
 * the rule, not a speed claim), fm_layer_plan reports a valid plan, and the layer then
 * matches the cpu-ref shard with graph replay = eager. */
/* Plan files: a plan set on a shard layer, saved, loaded by a new layer (every bucket's
 * plan equal, the note says so); a file of another GPU ignored with a note (the planner's
 * plans); another shape ignored with a note; a file that is not a plan file, and one whose
 * matching section holds a tile this build does not have, refused at create with
 * FM_ERR_FORMAT; saving over a file that is not a plan file refused, the file untouched. */
static char *dup_str(const char *s)
{
    char *d = malloc(strlen(s) + 1);
    assert_non_null(d);
    return strcpy(d, s);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t      n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void test_layer_plans(void **state)
{
    (void)state;
    fm_rng          r;
    layer_fx        L;
    fm_cuda_device *dev = shard_setup(&r, 8, &L);
    enum { NL = SH_NL, maxT = 16, NB = 5 };
    const int Tb[NB] = {1, 2, 4, 8, 16};
    fm_layer *a = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, 0);
    fm_layer_plan_info planner[NB], want[NB];
    for (int i = 0; i < NB; i++) assert_int_equal(fm_layer_plan(a, Tb[i], &planner[i]), FM_OK);
    fm_layer_plan_info alt = planner[0]; /* not the planner's: the work list toggled, FC1 split 2 */
    alt.work_list = !alt.work_list;
    alt.active_experts = 1;
    assert_int_equal(fm_tile_parse("mma_w4m2n1k256s3", &alt.tile[0]), FM_OK);
    alt.k_splits[0] = 2, alt.feature_blocks[0] = 1, alt.x_packed[0] = 0;
    assert_int_equal(fm_layer_set_plan(a, 1, &alt), FM_OK);
    for (int i = 0; i < NB; i++) assert_int_equal(fm_layer_plan(a, Tb[i], &want[i]), FM_OK);
    char path[64];
    snprintf(path, sizeof path, "/tmp/fm-plans-%d.json", (int)getpid());
    unlink(path);
    g_plans = path; /* no such file yet: the planner's plans, and a note */
    fm_layer *none = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, 0);
    assert_non_null(strstr(fm_layer_plans_note(none), "no such file"));
    plans_are(none, Tb, NB, planner, "no plan file yet: the planner's");
    fm_layer_destroy(none);
    g_plans = NULL;
    assert_int_equal(fm_layer_save_plans(a, path), FM_OK);
    assert_int_equal(fm_layer_save_plans(a, path), FM_OK); /* again: the entry replaced, not doubled */
    char *text = slurp(path);
    assert_non_null(strstr(text, "\"fp4moe_plans\""));
    assert_null(strstr(strstr(text, "\"shape\"") + 1, "\"shape\""));
    g_plans = path;
    fm_layer *b = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, 0);
    assert_non_null(strstr(fm_layer_plans_note(b), "loaded 5 bucket plans"));
    plans_are(b, Tb, NB, want, "loaded from the plan file");
    fm_layer_destroy(b);
    /* another shape (max_tokens): not used, the planner's plans */
    b = make(&L, FM_BACKEND_CUDA, dev, 8, 0, NL, FM_OUT_F32, 0);
    assert_non_null(strstr(fm_layer_plans_note(b), "shape"));
    fm_layer_destroy(b);
    /* another GPU: the section's gpu renamed */
    char *other = dup_str(text), *g = strstr(other, "\"gpu\":");
    assert_non_null(g);
    char *q1 = strchr(g + 6, '"'), *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
    assert_non_null(q2);
    memset(q1 + 1, 'X', (size_t)(q2 - q1 - 1));
    FILE *f = fopen(path, "wb");
    fputs(other, f);
    fclose(f);
    b = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, 0);
    assert_non_null(strstr(fm_layer_plans_note(b), "none for this device"));
    plans_are(b, Tb, NB, planner, "another GPU's file: the planner's");
    fm_layer_destroy(b);
    /* corrupt: not JSON; and a matching section with a tile this build lacks */
    fm_moe_weights w = L.w;
    fm_layer_desc  d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = maxT, .n_local = NL, .plans = path,
                        .pdl_chain = g_pdl_chain};
    f = fopen(path, "wb");
    fputs("{\"fp4moe_plans\": 1, \"sections\": [", f);
    fclose(f);
    b = (fm_layer *)(uintptr_t)1;
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &b), FM_ERR_FORMAT);
    assert_null(b);
    char *bad = dup_str(text), *t = strstr(bad, "mma_w4m2n1k256s3");
    assert_non_null(t);
    t[strlen("mma_w4m2n1k256s")] = '7'; /* stages 7: not compiled */
    f = fopen(path, "wb");
    fputs(bad, f);
    fclose(f);
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &b), FM_ERR_FORMAT);
    /* a count past int's range (1e300: no undefined conversion, a malformed bucket) */
    const char *ks = strstr(text, "\"k_splits\":");
    assert_non_null(ks);
    const char *v = ks + strlen("\"k_splits\":");
    while (*v == ' ' || *v == '\t') v++;
    const char *ve = v;
    while (*ve >= '0' && *ve <= '9') ve++;
    assert_true(ve > v);
    f = fopen(path, "wb");
    fprintf(f, "%.*s1e300%s", (int)(v - text), text, ve);
    fclose(f);
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &b), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_last_error(), "malformed"));
    /* saving over something that is not a plan file: refused, left alone */
    f = fopen(path, "wb");
    fputs("not json", f);
    fclose(f);
    assert_int_equal(fm_layer_save_plans(a, path), FM_ERR_FORMAT);
    assert_string_equal(slurp(path), "not json");
    g_plans = NULL;
    unlink(path);
    free(other);
    free(bad);
    fm_layer_destroy(a);
    fx_free(&L);
    fm_cuda_device_close(dev);
}

static void test_layer_tune(void **state)
{
    (void)state;
    fm_rng          r;
    layer_fx        L;
    fm_cuda_device *dev = shard_setup(&r, 9, &L);
    enum { E = SH_E, K = SH_K, H = SH_H, NL = SH_NL, maxT = 16 };
    shard_bufs bf;
    shard_bufs_make(&bf, maxT, H, K);
    cudaStream_t st = bf.st;
    fm_layer *cl = make(&L, FM_BACKEND_CPU_REF, NULL, maxT, 0, NL, FM_OUT_F32, 0);
    for (int cw = 0; cw < 2; cw++) {
        fm_layer *l = make(&L, FM_BACKEND_CUDA, dev, maxT, 0, NL, FM_OUT_F32, cw);
        size_t    wsb = 0;
        assert_int_equal(fm_layer_workspace_size(l, &wsb), FM_OK);
        void     *ws = wsb ? dmalloc(wsb) : NULL;
        const int Ts[] = {1, 16};
        for (int ti_ = 0; ti_ < 2; ti_++) {
            const int          T = Ts[ti_];
            fm_layer_tune_info ti;
            memset(&ti, 0x5A, sizeof ti);
            fm_status ts = fm_layer_tune(l, T, st, &ti);
            if (ts != FM_OK) fail_msg("T=%d: fm_layer_tune %s: %s", T, fm_status_name(ts), fm_last_error());
            printf("  T=%2d%s: %d plans (%d refused), %.1f -> %.1f us%s\n", T, cw ? " (caller workspace)" : "",
                   ti.plans_tried, ti.plans_refused, ti.before_us, ti.after_us, ti.changed ? ", changed" : "");
            assert_true(ti.plans_tried > 0 && ti.plans_refused >= 0 && ti.plans_refused <= ti.plans_tried);
            assert_true(ti.before_us > 0 && ti.after_us > 0 && ti.after_us <= ti.before_us);
            assert_true(ti.changed == 0 || ti.changed == 1);
            fm_layer_plan_info p;
            assert_int_equal(fm_layer_plan(l, T, &p), FM_OK);
            assert_true(p.k_splits[0] >= 1 && p.k_splits[1] >= 1);
            run_vs_ref(l, cl, &r, T, H, K, E, &bf, ws, "a tuned layer vs the cpu-ref shard");
        }
        assert_int_equal(fm_layer_tune(l, 0, st, NULL), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_tune(l, maxT + 1, st, NULL), FM_ERR_BAD_SHAPE);
        fm_layer_destroy(l);
        if (ws) CK(cudaFree(ws));
    }
    fm_layer_destroy(cl);
    shard_bufs_free(&bf);
    fx_free(&L);
    fm_cuda_device_close(dev);
}

/* fm_layer_desc.act_fp8_path on a W4A8 layer: FM_FP8_PATH_EVERY runs W4A8 in every bucket and
 * refuses a W4A16 plan; FM_FP8_PATH_FASTER takes the planner's choice (W4A16 everywhere, as
 * measured so far) and set_plan's / the tuner's per bucket, a W4A16 bucket giving the W4A16
 * layer's output bit for bit (held to the cpu-ref layer without act_fp8) and a W4A8 bucket the
 * EVERY layer's bit for bit (held to the cpu-ref W4A8 layer); plan files keep the choice. */
static fm_layer *make_fp8(const layer_fx *L, const fm_moe_config *cfg, fm_cuda_device *dev, int maxT, int path,
                          int decode, const char *plans)
{
    fm_moe_weights w = L->w;
    fm_layer_desc  d = {.backend = dev ? FM_BACKEND_CUDA : FM_BACKEND_CPU_REF, .device = dev, .max_tokens = maxT,
                        .pdl_chain = g_pdl_chain, .act_fp8_path = path, .decode_path = decode, .plans = plans};
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, cfg, &w, &l);
    if (s != FM_OK) fail_msg("create: %s: %s", fm_status_name(s), fm_last_error());
    return l;
}

static void test_layer_fp8_path(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = gpu_setup(&r, 10);
    enum { maxT = 64 };
    const int Ts[] = {1, 8, 64};
    for (int fi = 0; fi < 2; fi++) {
        layer_fx L;
        fx_make(&L, &r, fi ? FM_FORMAT_MXFP4 : FM_FORMAT_NVFP4, 16, 4);
        const int     H = L.cfg.hidden;
        fm_moe_config c16 = L.cfg, c8 = L.cfg;
        c16.act_fp8 = FM_ACT_FP8_OFF, c8.act_fp8 = FM_ACT_FP8_BLOCK128;
        printf("  %s\n", fi ? "MXFP4" : "NVFP4");
        fm_layer *w16 = make_fp8(&L, &c16, dev, maxT, FM_FP8_PATH_EVERY, 0, NULL);
        fm_layer *every = make_fp8(&L, &c8, dev, maxT, FM_FP8_PATH_EVERY, 0, NULL);
        fm_layer *fast = make_fp8(&L, &c8, dev, maxT, FM_FP8_PATH_FASTER, 0, NULL);
        fm_layer *r16 = make_fp8(&L, &c16, NULL, maxT, 0, 0, NULL), *r8 = make_fp8(&L, &c8, NULL, maxT, 0, 0, NULL);
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        uint16_t *dx = dmalloc(sizeof(uint16_t) * maxT * H);
        float    *dout = dmalloc(sizeof(float) * maxT * H);
        float    *a16 = malloc(sizeof(float) * maxT * H), *a8 = malloc(sizeof(float) * maxT * H),
              *got = malloc(sizeof(float) * maxT * H), *ref = malloc(sizeof(float) * maxT * H);
        uint16_t *x = malloc(sizeof(uint16_t) * maxT * H);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int    T = Ts[ti];
            const size_t n = (size_t)T * H;
            for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
            h2d(dx, x, sizeof(uint16_t) * n);
            fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st};
            fm_layer_plan_info pw, pe, pf;
            assert_int_equal(fm_layer_plan(w16, T, &pw), FM_OK);
            assert_int_equal(fm_layer_plan(every, T, &pe), FM_OK);
            assert_int_equal(fm_layer_plan(fast, T, &pf), FM_OK);
            assert_int_equal(pw.act_fp8, 0);
            assert_int_equal(pe.act_fp8, 1);
            assert_int_equal(pf.act_fp8, 0); /* the planner's rule: no bucket has measured W4A8 faster */
            /* the references: W4A16 and W4A8 layers on the device, each against its cpu-ref */
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(w16, &a, st, a16, n);
            fm_poison_f32(ref, n);
            assert_int_equal(fm_layer_forward(r16, x, T, ref, NULL), FM_OK);
            fm_assert_close(a16, ref, n, cuda_bound(&c16), "W4A16 layer vs cpu-ref");
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(every, &a, st, a8, n);
            fm_poison_f32(ref, n);
            assert_int_equal(fm_layer_forward(r8, x, T, ref, NULL), FM_OK);
            fm_assert_close(a8, ref, n, cuda_bound(&c8), "W4A8 layer (every bucket) vs cpu-ref W4A8");
            /* FASTER, the planner's W4A16 bucket: the W4A16 layer's bits */
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(fast, &a, st, got, n);
            assert_int_equal(fm_layer_errors(fast, st, NULL), FM_OK);
            assert_int_equal(fm_first_nonfinite(got, n), -1);
            assert_memory_equal(got, a16, sizeof(float) * n);
            /* set to W4A8: the W4A8 layer's bits; and back */
            fm_layer_plan_info q = pf;
            q.act_fp8 = 1;
            assert_int_equal(fm_layer_set_plan(fast, T, &q), FM_OK);
            assert_int_equal(fm_layer_plan(fast, T, &q), FM_OK);
            assert_int_equal(q.act_fp8, 1);
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(fast, &a, st, got, n);
            assert_int_equal(fm_first_nonfinite(got, n), -1);
            assert_memory_equal(got, a8, sizeof(float) * n);
            /* refusals, the plans unchanged: W4A16 on EVERY, W4A8 on a W4A16 layer, 2 */
            q = pe, q.act_fp8 = 0;
            assert_int_equal(fm_layer_set_plan(every, T, &q), FM_ERR_UNSUPPORTED);
            assert_non_null(strstr(fm_last_error(), "FM_FP8_PATH_FASTER"));
            q = pw, q.act_fp8 = 1;
            assert_int_equal(fm_layer_set_plan(w16, T, &q), FM_ERR_UNSUPPORTED);
            q.act_fp8 = 2;
            assert_int_equal(fm_layer_set_plan(fast, T, &q), FM_ERR_INVALID_ARG);
            assert_int_equal(fm_layer_plan(every, T, &q), FM_OK);
            assert_int_equal(q.act_fp8, 1);
            assert_int_equal(fm_layer_plan(w16, T, &q), FM_OK);
            assert_int_equal(q.act_fp8, 0);
            if (T != 8) { /* back to W4A16 (T = 8 stays W4A8 for the plan file below) */
                assert_int_equal(fm_layer_set_plan(fast, T, &pf), FM_OK);
                CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
                run_dev(fast, &a, st, got, n);
                assert_memory_equal(got, a16, sizeof(float) * n);
            }
        }
        /* a plan file keeps the choice; the EVERY layer's shape is another entry */
        char path[64];
        snprintf(path, sizeof path, "/tmp/fm-plans-fp8-%d.json", (int)getpid());
        unlink(path);
        assert_int_equal(fm_layer_save_plans(fast, path), FM_OK);
        fm_layer *b = make_fp8(&L, &c8, dev, maxT, FM_FP8_PATH_FASTER, 0, path);
        assert_non_null(strstr(fm_layer_plans_note(b), "loaded"));
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            fm_layer_plan_info q;
            assert_int_equal(fm_layer_plan(b, Ts[ti], &q), FM_OK);
            assert_int_equal(q.act_fp8, Ts[ti] == 8);
        }
        fm_layer_destroy(b);
        b = make_fp8(&L, &c8, dev, maxT, FM_FP8_PATH_EVERY, 0, path);
        assert_non_null(strstr(fm_layer_plans_note(b), "shape"));
        fm_layer_destroy(b);
        b = make_fp8(&L, &c16, dev, maxT, FM_FP8_PATH_EVERY, 0, path);
        assert_non_null(strstr(fm_layer_plans_note(b), "shape"));
        fm_layer_destroy(b);
        unlink(path);
        /* the decode kernel: a W4A16 bucket of a FASTER layer may run it, a W4A8 bucket never */
        b = make_fp8(&L, &c8, dev, maxT, FM_FP8_PATH_FASTER, FM_DECODE_PATH_ON, NULL);
        fm_layer *e2 = make_fp8(&L, &c8, dev, maxT, FM_FP8_PATH_EVERY, FM_DECODE_PATH_ON, NULL);
        fm_layer_plan_info pb, p2;
        assert_int_equal(fm_layer_plan(b, 1, &pb), FM_OK);
        assert_int_equal(fm_layer_plan(e2, 1, &p2), FM_OK);
        printf("    decode at T=1: FASTER %d (%s), EVERY %d (%s)\n", pb.decode, pb.decode_note, p2.decode, p2.decode_note);
        assert_null(strstr(pb.decode_note, "BF16 activations"));
        assert_int_equal(p2.decode, 0);
        if (pb.decode) {
            pb.act_fp8 = 1;
            assert_int_equal(fm_layer_set_plan(b, 1, &pb), FM_ERR_UNSUPPORTED);
            assert_non_null(strstr(fm_last_error(), "BF16 activations"));
        }
        fm_layer_destroy(e2);
        fm_layer_destroy(b);
        /* the tuner on a FASTER layer: both chains timed, the faster kept, the output its oracle's */
        {
            const int          T = 8;
            const size_t       n = (size_t)T * H;
            fm_layer_tune_info ti;
            fm_status          ts = fm_layer_tune(fast, T, st, &ti);
            if (ts != FM_OK) fail_msg("fm_layer_tune %s: %s", fm_status_name(ts), fm_last_error());
            fm_layer_plan_info q;
            assert_int_equal(fm_layer_plan(fast, T, &q), FM_OK);
            printf("    tune T=8: %d plans (%d refused), %.1f -> %.1f us, act_fp8 %d\n", ti.plans_tried, ti.plans_refused,
                   ti.before_us, ti.after_us, q.act_fp8);
            for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
            h2d(dx, x, sizeof(uint16_t) * n);
            fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st};
            CK(cudaMemsetAsync(dout, 0xFF, sizeof(float) * n, st));
            run_dev(fast, &a, st, got, n);
            fm_poison_f32(ref, n);
            assert_int_equal(fm_layer_forward(q.act_fp8 ? r8 : r16, x, T, ref, NULL), FM_OK);
            fm_assert_close(got, ref, n, cuda_bound(q.act_fp8 ? &c8 : &c16), "a tuned FASTER layer vs its oracle");
            /* EVERY: nothing to search, the time of its one chain */
            assert_int_equal(fm_layer_tune(every, T, st, &ti), FM_OK);
            assert_true(ti.before_us > 0 && ti.after_us == ti.before_us && !ti.changed);
        }
        CK(cudaStreamDestroy(st));
        CK(cudaFree(dx));
        CK(cudaFree(dout));
        free(a16), free(a8), free(got), free(ref), free(x);
        fm_layer_destroy(w16), fm_layer_destroy(every), fm_layer_destroy(fast);
        fm_layer_destroy(r16), fm_layer_destroy(r8);
        fx_free(&L);
    }
    fm_cuda_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_layer_device_path),
                                       cmocka_unit_test(test_layer_split_shard), cmocka_unit_test(test_layer_plan),
                                       cmocka_unit_test(test_layer_set_plan),
                                       cmocka_unit_test(test_layer_plans), cmocka_unit_test(test_layer_tune),
                                       cmocka_unit_test(test_layer_fp8_path)};
    const char *off = getenv("FM_TEST_PDL_CHAIN_OFF"); /* tests/layer_switches.cmake */
    if (off && !strcmp(off, "1")) g_pdl_chain = FM_PDL_CHAIN_OFF;
    const char *only = getenv("FM_TEST_FILTER"); /* e.g. test_layer_split_shard (cmocka's pattern) */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
