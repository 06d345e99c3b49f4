/* test_cuda_decode.c - the one-launch decode kernel (src/cuda/decode.cu) forced on
 * (fm_layer_desc.decode_path = FM_DECODE_PATH_ON) against the oracles of the layer:
 *  - the cpu-ref backend with the same routing: the cuda bound (fm_layer_accuracy);
 *  - the chain with the same tile geometry (mma_w4m2n1k128s4 for FC1 and FC2) and the same
 *    K splits: bit for bit (the same sums in the same order: decode.cu's header);
 *  - graph replay = eager bit for bit, over repeated replays (the counters' rest state);
 *  - expert shards summed = the whole layer (the same K splits set on both: FP32 finalize
 *    order only, 1e-8 NMSE as test_cuda_layer's split shards);
 *  - ids -1 / out of range and NaN x: the same error word as the chain, the output written;
 *  - BF16 output = BF16(FP32 output);
 *  - internal routing: the same bits as the chain's internal routing;
 * at T = 1, 2, 3, 4, 8, 16 and 32 (top-4: 128 routed slots, the kernel's limit), NVFP4 and
 * MXFP4, fresh inputs, outputs poisoned before every run. Then gpt-oss layers (issue 32: the
 * twin kernel, decode_oss_kernel: the clamped SwiGLU, FC1 / FC2 expert biases, softmax-topk
 * routing) against the same oracles, the plan's report (decode, CTAs, note; refusals of
 * set_plan) and the grid guard of both kernels (a cooperative launch of more CTAs than can be
 * resident is refused by the runtime). test_decode_units: the two ways CTAs find their units
 * ($FM_DECODE_UNITS: strides of the grid, the counter) give the same bits. FM_TEST_FILTER
 * selects tests. */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <math.h>
#include <string.h>

#include "cuda/decode.h"
#include "fp4moe.h"
#include "gpu_common.h"

enum { E = 64, K = 4, H = 2048, I = 512, NL = 8, MAXT = 32 };

typedef struct {
    fm_moe_config  cfg;
    gpu_experts    w13, w2;
    float         *router, *bias;
    fm_moe_weights w;
} dfx;

static void dfx_make(dfx *L, fm_rng *r, fm_format f)
{
    fm_moe_config_default(&L->cfg);
    L->cfg.n_experts = E, L->cfg.top_k = K, L->cfg.hidden = H, L->cfg.inter = I, L->cfg.wfmt = f;
    gpu_experts_make(&L->w13, r, f, E, 2 * I, H);
    gpu_experts_make(&L->w2, r, f, E, H, I);
    L->router = malloc(sizeof(float) * E * H);
    L->bias = malloc(sizeof(float) * E);
    fm_rng_fill_normal(r, L->router, (size_t)E * H, 0.05f);
    fm_rng_fill_normal(r, L->bias, (size_t)E, 0.1f);
    L->w = (fm_moe_weights){.router_w = L->router, .router_bias = L->bias, .w13 = L->w13.w, .w2 = L->w2.w};
}

static void dfx_free(dfx *L)
{
    gpu_experts_free(&L->w13);
    gpu_experts_free(&L->w2);
    free(L->router), free(L->bias);
}

static fm_layer *make(const dfx *L, fm_backend_kind b, fm_cuda_device *dev, int first, int n, fm_out_dtype od,
                      int decode)
{
    fm_moe_weights w = L->w;
    w.w13 += first, w.w2 += first;
    fm_layer_desc d = {.backend = b, .device = b == FM_BACKEND_CUDA ? dev : NULL, .max_tokens = MAXT,
                       .out_dtype = od, .first_expert = first, .n_local = n,
                       .decode_path = decode ? FM_DECODE_PATH_ON : FM_DECODE_PATH_OFF}; /* OFF: the chain */
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &L->cfg, &w, &l);
    if (s != FM_OK) fail_msg("create: %s: %s", fm_status_name(s), fm_last_error());
    return l;
}

static fm_cuda_device *setup(fm_rng *r, unsigned off)
{
    fm_test_require_gpu();
    fm_rng_init(r, fm_test_seed() + off);
    CK(cudaSetDevice(0));
    fm_cuda_device *dev = NULL;
    assert_int_equal(fm_cuda_device_open(0, &dev), FM_OK);
    return dev;
}

static void *dmalloc(size_t n)
{
    void *p = NULL;
    CK(cudaMalloc(&p, n));
    return p;
}

static void h2d(void *dst, const void *src, size_t bytes)
{
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize()); /* pageable copies may land late; the stream is non-blocking */
}

/* A test's run buffers for up to MAXT tokens of width w (hidden) and top-K routing: device
 * x / out / ids / weights, their host sides, four host outputs and a float64 sum. */
typedef struct {
    uint16_t *dx, *x;
    float    *dout, *dw, *wts, *o[4];
    int32_t  *dids, *ids;
    double   *sum;
} iob;

static void iob_make(iob *b, int w)
{
    b->dx = dmalloc(sizeof(uint16_t) * MAXT * w), b->dout = dmalloc(sizeof(float) * MAXT * w);
    b->dw = dmalloc(sizeof(float) * MAXT * K), b->dids = dmalloc(sizeof(int32_t) * MAXT * K);
    b->x = malloc(sizeof(uint16_t) * MAXT * w), b->wts = malloc(sizeof(float) * MAXT * K);
    b->ids = malloc(sizeof(int32_t) * MAXT * K), b->sum = malloc(sizeof(double) * MAXT * w);
    for (int i = 0; i < 4; i++) b->o[i] = malloc(sizeof(float) * MAXT * w);
}

static void iob_free(iob *b)
{
    CK(cudaFree(b->dx));
    CK(cudaFree(b->dout));
    CK(cudaFree(b->dw));
    CK(cudaFree(b->dids));
    free(b->x), free(b->wts), free(b->ids), free(b->sum);
    for (int i = 0; i < 4; i++) free(b->o[i]);
}

/* One run over a poisoned out, copied back (n floats). */
static void run_dev(fm_layer *l, const fm_layer_run_args *a, cudaStream_t st, float *host, size_t n)
{
    CK(cudaMemsetAsync(a->out, 0xFF, sizeof(float) * n, st));
    fm_status s = fm_layer_run(l, a);
    if (s != FM_OK) fail_msg("run: %s: %s", fm_status_name(s), fm_last_error());
    CK(cudaMemcpyAsync(host, a->out, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
}

/* The chain of `chain` set to the decode kernel's tile geometry and K splits at T (so that
 * its sums are the decode kernel's): FC1 and FC2 mma_w4m2n1k128s4, one feature block. */
static void chain_like_decode(fm_layer *chain, fm_layer *dec, int T)
{
    fm_layer_plan_info d, c;
    assert_int_equal(fm_layer_plan(dec, T, &d), FM_OK);
    assert_int_equal(d.decode, 1);
    assert_int_equal(fm_layer_plan(chain, T, &c), FM_OK);
    for (int g = 0; g < 2; g++) {
        assert_int_equal(fm_tile_parse("mma_w4m2n1k128s4", &c.tile[g]), FM_OK);
        c.k_splits[g] = d.decode_k_splits[g], c.feature_blocks[g] = 1, c.x_packed[g] = 0;
    }
    c.decode = 0;
    fm_status s = fm_layer_set_plan(chain, T, &c);
    if (s != FM_OK) fail_msg("T=%d: the chain with the decode kernel's splits: %s: %s", T, fm_status_name(s), fm_last_error());
}

/* Fresh external routing of T tokens over n_experts: distinct ids, weights in [0.1, 0.4);
 * token 0's first slot on expert 3 (shard 0 has rows) */
static void routing_over(fm_rng *r, int T, int n_experts, int32_t *ids, float *wts)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, dup = 1;
            while (dup) {
                e = t == 0 && j == 0 ? 3 : (int)(fm_rng_uniform(r) * n_experts) % n_experts;
                dup = 0;
                for (int u = 0; u < j; u++) dup |= ids[t * K + u] == e;
            }
            ids[t * K + j] = e;
            wts[t * K + j] = (float)(0.1 + 0.3 * fm_rng_uniform(r));
        }
}

static void routing(fm_rng *r, int T, int32_t *ids, float *wts) { routing_over(r, T, E, ids, wts); }

/* Fresh inputs of T tokens into b (width w, routing over n_experts), uploaded */
static void iob_fresh(iob *b, fm_rng *r, int T, int w, int n_experts)
{
    for (size_t i = 0; i < (size_t)T * w; i++) b->x[i] = fm_bf16_encode(fm_rng_normal(r));
    routing_over(r, T, n_experts, b->ids, b->wts);
    h2d(b->dx, b->x, sizeof(uint16_t) * T * w);
    h2d(b->dids, b->ids, sizeof(int32_t) * T * K);
    h2d(b->dw, b->wts, sizeof(float) * T * K);
}

/* the error words of two layers agree (field by field: the struct has padding) */
static void errors_equal(const fm_layer_error_info *a, const fm_layer_error_info *b)
{
    assert_int_equal(a->bad_ids, b->bad_ids);
    assert_int_equal(a->first_bad_slot, b->first_bad_slot);
    assert_int_equal(a->nonfinite_x, b->nonfinite_x);
    assert_int_equal(a->first_nonfinite, b->first_nonfinite);
    assert_int_equal(a->nonfinite_logits, b->nonfinite_logits);
    assert_int_equal(a->nonfinite_weights, b->nonfinite_weights);
}

static void graph_equals_eager(fm_layer *l, const fm_layer_run_args *a, cudaStream_t st, const float *eager,
                               float *again, size_t n)
{
    cudaGraph_t     g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    assert_int_equal(fm_layer_run(l, a), FM_OK);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaMemsetAsync(a->out, 0xFF, sizeof(float) * n, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaMemcpyAsync(again, a->out, sizeof(float) * n, cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        if (memcmp(eager, again, sizeof(float) * n)) fail_msg("graph replay %d differs from eager", rep);
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
}

/* BF16 out = BF16(FP32 out): layer dbf (BF16 out) on a's inputs, from a poisoned output, against
 * the FP32 output `got` of the same run rounded to nearest even */
static void bf16_out_equals(fm_layer *dbf, const fm_layer_run_args *a, cudaStream_t st, const float *got, size_t n,
                            const char *what, int T)
{
    uint16_t         *dob = dmalloc(sizeof(uint16_t) * n), *ob = malloc(sizeof(uint16_t) * n);
    fm_layer_run_args ab = *a;
    ab.out = dob;
    CK(cudaMemsetAsync(dob, 0xFF, sizeof(uint16_t) * n, st));
    assert_int_equal(fm_layer_run(dbf, &ab), FM_OK);
    CK(cudaMemcpyAsync(ob, dob, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    for (size_t i = 0; i < n; i++)
        if (ob[i] != fm_bf16_encode(got[i]))
            fail_msg("%sT=%d: BF16 out[%zu] = %04x, expected %04x", what, T, i, ob[i], fm_bf16_encode(got[i]));
    CK(cudaFree(dob));
    free(ob);
}

/* Shards summed = the whole layer: every layer set to plan d0 (shard 0's decode splits), the
 * nshards runs summed in float64 against the whole layer's run (NMSE <= 1e-8). again, sum:
 * n-element scratch. */
static void shards_sum_to_whole(fm_layer *whole, fm_layer **shards, int nshards, const fm_layer_plan_info *d0,
                                const fm_layer_run_args *a, cudaStream_t st, float *again, double *sum, size_t n,
                                const char *what, int T)
{
    assert_int_equal(fm_layer_set_plan(whole, T, d0), FM_OK);
    memset(sum, 0, sizeof(double) * n);
    for (int q = 0; q < nshards; q++) {
        assert_int_equal(fm_layer_set_plan(shards[q], T, d0), FM_OK);
        run_dev(shards[q], a, st, again, n);
        assert_int_equal(fm_layer_errors(shards[q], st, NULL), FM_OK);
        assert_int_equal(fm_first_nonfinite(again, n), -1);
        for (size_t i = 0; i < n; i++) sum[i] += again[i];
    }
    run_dev(whole, a, st, again, n);
    const double es = fm_nmse64(again, sum, n);
    if (!(es <= 1e-8)) fail_msg("%sT=%d: shards summed differ from the layer: NMSE %.3g", what, T, es);
}

static void test_decode_layer(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = setup(&r, 11);
    const int       fmts[2] = {FM_FORMAT_NVFP4, FM_FORMAT_MXFP4};
    const int       Ts[] = {1, 2, 3, 4, 8, 16, 32};
    cudaStream_t    st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    iob B;
    iob_make(&B, H);
    uint16_t *dx = B.dx, *x = B.x;
    float    *dout = B.dout, *dw = B.dw, *wts = B.wts, *got = B.o[0], *ref = B.o[1], *again = B.o[2];
    int32_t  *dids = B.dids, *ids = B.ids;
    double   *sum = B.sum;
    for (int fi = 0; fi < 2; fi++) {
        dfx L;
        dfx_make(&L, &r, (fm_format)fmts[fi]);
        double bound = -1;
        assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &L.cfg, &bound), FM_OK);
        fm_layer *dec = make(&L, FM_BACKEND_CUDA, dev, 0, NL, FM_OUT_F32, 1); /* shard 0 of 8 */
        fm_layer *chain = make(&L, FM_BACKEND_CUDA, dev, 0, NL, FM_OUT_F32, 0);
        fm_layer *cref = make(&L, FM_BACKEND_CPU_REF, NULL, 0, NL, FM_OUT_F32, 0);
        fm_layer *whole = make(&L, FM_BACKEND_CUDA, dev, 0, 0, FM_OUT_F32, 1);
        fm_layer *dbf = make(&L, FM_BACKEND_CUDA, dev, 0, NL, FM_OUT_BF16, 1);
        fm_layer *shards[E / NL];
        for (int q = 0; q < E / NL; q++) shards[q] = make(&L, FM_BACKEND_CUDA, dev, q * NL, NL, FM_OUT_F32, 1);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int    T = Ts[ti];
            const size_t n = (size_t)T * H;
            iob_fresh(&B, &r, T, H, E);
            chain_like_decode(chain, dec, T);
            fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
            /* vs cpu-ref (NaN/Inf first), vs the chain bit for bit, graph = eager */
            run_dev(dec, &a, st, got, n);
            assert_int_equal(fm_layer_errors(dec, st, NULL), FM_OK);
            assert_int_equal(fm_first_nonfinite(got, n), -1);
            fm_layer_run_args ah = {.x = x, .T = T, .out = ref, .topk_ids = ids, .topk_weights = wts};
            fm_poison_f32(ref, n);
            assert_int_equal(fm_layer_run(cref, &ah), FM_OK);
            fm_assert_close(got, ref, n, bound, "decode kernel vs cpu-ref (external routing)");
            run_dev(chain, &a, st, again, n);
            if (memcmp(got, again, sizeof(float) * n)) {
                double num = 0, den = 0;
                for (size_t i = 0; i < n; i++) num += (got[i] - again[i]) * (double)(got[i] - again[i]), den += (double)again[i] * again[i];
                fail_msg("T=%d: decode differs from the chain with its tiles and splits: NMSE %.3g", T, num / den);
            }
            graph_equals_eager(dec, &a, st, got, again, n);

            /* shards summed = the whole layer, every layer with shard 0's decode splits */
            fm_layer_plan_info d0;
            assert_int_equal(fm_layer_plan(dec, T, &d0), FM_OK);
            shards_sum_to_whole(whole, shards, E / NL, &d0, &a, st, again, sum, n, "", T);

            /* BF16 out = BF16(FP32 out) */
            bf16_out_equals(dbf, &a, st, got, n, "", T);

            /* internal routing: the chain's bits (the same routing kernels, the same sums) */
            fm_layer_run_args ai = {.x = dx, .T = T, .out = dout, .stream = st};
            run_dev(dec, &ai, st, got, n);
            assert_int_equal(fm_layer_errors(dec, st, NULL), FM_OK);
            run_dev(chain, &ai, st, again, n);
            assert_int_equal(fm_layer_errors(chain, st, NULL), FM_OK);
            if (memcmp(got, again, sizeof(float) * n)) fail_msg("T=%d: internal routing: decode differs from the chain", T);
            graph_equals_eager(dec, &ai, st, got, again, n);

            /* bad ids and NaN x: the chain's error word, the output still written */
            if (T >= 3) {
                ids[1] = E + 5; /* out of range: counted */
                ids[2] = -1;    /* skipped, not an error */
                h2d(dids, ids, sizeof(int32_t) * T * K);
                fm_layer_error_info ed, ec;
                run_dev(dec, &a, st, got, n);
                assert_int_equal(fm_first_nonfinite(got, n), -1);
                assert_int_equal(fm_layer_errors(dec, st, &ed), FM_ERR_OUT_OF_RANGE);
                run_dev(chain, &a, st, again, n);
                assert_int_equal(fm_layer_errors(chain, st, &ec), FM_ERR_OUT_OF_RANGE);
                assert_int_equal(ed.bad_ids, 1);
                assert_int_equal(ed.first_bad_slot, 1);
                errors_equal(&ed, &ec);
                assert_memory_equal(got, again, sizeof(float) * n);
                assert_int_equal(fm_layer_errors(dec, st, NULL), FM_OK); /* cleared */
                uint16_t bad = 0x7fc0;
                h2d(dx + H + 7, &bad, 2); /* x[1][7] = NaN: token 1 has a local row? then reported */
                run_dev(dec, &a, st, got, n);
                fm_status sd = fm_layer_errors(dec, st, &ed);
                run_dev(chain, &a, st, again, n);
                fm_status sc = fm_layer_errors(chain, st, &ec);
                assert_int_equal(sd, sc);
                errors_equal(&ed, &ec);
                if (sd == FM_ERR_NONFINITE) assert_int_equal(ed.first_nonfinite, H + 7);
            }
            printf("  %s T=%2d: decode = chain bit for bit, vs cpu-ref within %.0e, graph = eager, shards = layer\n",
                   fi ? "MXFP4" : "NVFP4", T, bound);
        }
        for (int q = 0; q < E / NL; q++) fm_layer_destroy(shards[q]);
        fm_layer_destroy(dec), fm_layer_destroy(chain), fm_layer_destroy(cref), fm_layer_destroy(whole);
        fm_layer_destroy(dbf);
        dfx_free(&L);
    }
    CK(cudaStreamDestroy(st));
    iob_free(&B);
    fm_cuda_device_close(dev);
}

/* ---- gpt-oss (issue 32): the twin kernel, decode_oss_kernel ----
 * 16 experts, top-4, hidden 320 and inter 192 (both 64 past a multiple of 128, as gpt-oss's
 * 2,880: K stages of 128 that end half empty), MXFP4, softmax-topk routing with the router's
 * logit bias, the clamped SwiGLU, random FC1 / FC2 expert biases; shards of 4 experts. */
enum { GE = 16, GH = 320, GI = 192, GNL = 4 };

typedef struct {
    fm_moe_config  cfg;
    gpu_experts    w13, w2;
    float         *router, *rbias, *b13, *b2;
    fm_moe_weights w;
} ofx;

/* The fraction of the FC1 outputs v[ns][2I] (float64, bias added) that limit lim clamps:
 * gate > lim, |up| > lim. */
static double oss_clamped(const double *v, int ns, double lim)
{
    long c = 0;
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < GI; i++) {
            c += v[(size_t)s * 2 * GI + i] > lim;
            c += fabs(v[(size_t)s * 2 * GI + GI + i]) > lim;
        }
    return (double)c / ((double)ns * 2 * GI);
}

/* test_cuda_gptoss.c's layer at these shapes: the limit bisected on FC1's outputs (+ bias, in
 * float64) of random (token, expert) pairs so that ~11 % of them clamp, both clamps biting as in
 * the model. */
static void ofx_make(ofx *L, fm_rng *r)
{
    memset(L, 0, sizeof *L);
    fm_moe_config_default(&L->cfg);
    fm_moe_config *c = &L->cfg;
    c->n_experts = GE, c->top_k = K, c->hidden = GH, c->inter = GI, c->wfmt = FM_FORMAT_MXFP4;
    c->score = FM_SCORE_SOFTMAX_TOPK, c->renormalize = 0, c->routed_scale = 1.0f, c->n_group = c->topk_group = 0;
    c->shared_inter = 0, c->activation = FM_ACT_SWIGLU_GPTOSS;
    gpu_experts_make(&L->w13, r, FM_FORMAT_MXFP4, GE, 2 * GI, GH);
    gpu_experts_make(&L->w2, r, FM_FORMAT_MXFP4, GE, GH, GI);
    L->router = malloc(sizeof(float) * GE * GH);
    L->rbias = malloc(sizeof(float) * GE);
    L->b13 = malloc(sizeof(float) * GE * 2 * GI);
    L->b2 = malloc(sizeof(float) * GE * GH);
    assert_true(L->router && L->rbias && L->b13 && L->b2);
    fm_rng_fill_normal(r, L->router, (size_t)GE * GH, 0.05f);
    fm_rng_fill_normal(r, L->rbias, (size_t)GE, 0.5f);
    fm_rng_fill_normal(r, L->b13, (size_t)GE * 2 * GI, 0.5f);
    fm_rng_fill_normal(r, L->b2, (size_t)GE * GH, 0.5f);
    L->w = (fm_moe_weights){.router_w = L->router, .router_bias = L->rbias, .w13 = L->w13.w, .w2 = L->w2.w,
                            .w13_bias = L->b13, .w2_bias = L->b2};
    enum { NS = 192 };
    double *v = malloc(sizeof(double) * NS * 2 * GI), lo = 0, hi = 0;
    float   x[GH];
    assert_non_null(v);
    for (int s = 0; s < NS; s++) {
        for (int k = 0; k < GH; k++) x[k] = fm_bf16_decode(fm_bf16_encode(fm_rng_normal(r)));
        const int e = (int)(fm_rng_uniform(r) * GE) % GE;
        for (int o = 0; o < 2 * GI; o++) {
            const float *wr = L->w13.deq + ((size_t)e * 2 * GI + o) * GH;
            double       acc = L->b13[(size_t)e * 2 * GI + o];
            for (int k = 0; k < GH; k++) acc += (double)wr[k] * x[k];
            v[(size_t)s * 2 * GI + o] = acc;
            hi = fmax(hi, fabs(acc));
        }
    }
    for (int it = 0; it < 60; it++) {
        const double mid = 0.5 * (lo + hi);
        if (oss_clamped(v, NS, mid) > 0.11) lo = mid;
        else hi = mid;
    }
    c->swiglu_limit = (float)hi;
    const double clamped = oss_clamped(v, NS, c->swiglu_limit);
    free(v);
    printf("  gpt-oss layer E=%d top-%d H=%d I=%d: swiglu_limit %.4g clamps %.1f %% of FC1's outputs\n", GE, K, GH,
           GI, (double)c->swiglu_limit, 100 * clamped);
    assert_true(clamped >= 0.08 && clamped <= 0.15);
    assert_int_equal(fm_moe_config_check(c), FM_OK);
}

static void ofx_free(ofx *L)
{
    gpu_experts_free(&L->w13);
    gpu_experts_free(&L->w2);
    free(L->router), free(L->rbias), free(L->b13), free(L->b2);
}

/* The shard [first, first + n) (n = 0: every expert): its experts' weights and biases. */
static fm_layer *omake(const ofx *L, fm_backend_kind b, fm_cuda_device *dev, int first, int n, fm_out_dtype od,
                       int decode)
{
    fm_moe_weights w = L->w;
    w.w13 += first, w.w2 += first;
    w.w13_bias += (size_t)first * 2 * GI;
    w.w2_bias += (size_t)first * GH;
    fm_layer_desc d = {.backend = b, .device = b == FM_BACKEND_CUDA ? dev : NULL, .max_tokens = MAXT,
                       .out_dtype = od, .first_expert = first, .n_local = n,
                       .decode_path = decode ? FM_DECODE_PATH_ON : FM_DECODE_PATH_OFF}; /* OFF: the chain */
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, &L->cfg, &w, &l);
    if (s != FM_OK) fail_msg("create (gpt-oss): %s: %s", fm_status_name(s), fm_last_error());
    return l;
}

/* decode (its splits as planned) = the chain with its tiles and splits, bit for bit, external
 * and internal routing, each with graph = eager; the decode output of external routing in got */
static void oss_vs_chain(fm_layer *dec, fm_layer *chain, const fm_layer_run_args *a, const fm_layer_run_args *ai,
                         cudaStream_t st, float *got, float *again, size_t n, int T, const char *what)
{
    chain_like_decode(chain, dec, T);
    float *gi = malloc(sizeof(float) * n);
    assert_non_null(gi);
    run_dev(dec, ai, st, gi, n); /* internal routing first: got keeps the external run's */
    assert_int_equal(fm_layer_errors(dec, st, NULL), FM_OK);
    assert_int_equal(fm_first_nonfinite(gi, n), -1);
    run_dev(chain, ai, st, again, n);
    assert_int_equal(fm_layer_errors(chain, st, NULL), FM_OK);
    if (memcmp(gi, again, sizeof(float) * n))
        fail_msg("gpt-oss T=%d %s: internal softmax-topk routing: decode differs from the chain", T, what);
    graph_equals_eager(dec, ai, st, gi, again, n);
    free(gi);
    run_dev(dec, a, st, got, n);
    assert_int_equal(fm_layer_errors(dec, st, NULL), FM_OK);
    assert_int_equal(fm_first_nonfinite(got, n), -1);
    run_dev(chain, a, st, again, n);
    assert_int_equal(fm_layer_errors(chain, st, NULL), FM_OK);
    if (memcmp(got, again, sizeof(float) * n)) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) num += (got[i] - again[i]) * (double)(got[i] - again[i]), den += (double)again[i] * again[i];
        fail_msg("gpt-oss T=%d %s: decode differs from the chain with its tiles and splits: NMSE %.3g", T, what, num / den);
    }
    graph_equals_eager(dec, a, st, got, again, n);
}

/* gpt-oss on the twin kernel: shard 0 of 4 at T = 1, 2, 3, 4, 8, 16, 32 (128 routed slots):
 * the plan runs it (decode = 1, no note); decode = the chain with the decode kernel's tiles and
 * K splits bit for bit (external and internal softmax-topk routing; the automatic splits, and
 * at T = 1, 8, 32 FC1 split 3 ways, one K stage each with the last half empty, FC2 unsplit);
 * vs cpu-ref within the cuda bound; graph = eager; the 4 shards summed = the whole layer; BF16
 * out = BF16(FP32 out). Fresh inputs for every T, outputs poisoned before every run. */
static void test_decode_gptoss(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = setup(&r, 14);
    ofx             L;
    ofx_make(&L, &r);
    double bound = -1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &L.cfg, &bound), FM_OK);
    fm_layer *dec = omake(&L, FM_BACKEND_CUDA, dev, 0, GNL, FM_OUT_F32, 1);
    fm_layer *chain = omake(&L, FM_BACKEND_CUDA, dev, 0, GNL, FM_OUT_F32, 0);
    fm_layer *cref = omake(&L, FM_BACKEND_CPU_REF, NULL, 0, GNL, FM_OUT_F32, 0);
    fm_layer *whole = omake(&L, FM_BACKEND_CUDA, dev, 0, 0, FM_OUT_F32, 1);
    fm_layer *dbf = omake(&L, FM_BACKEND_CUDA, dev, 0, GNL, FM_OUT_BF16, 1);
    fm_layer *shards[GE / GNL];
    for (int q = 0; q < GE / GNL; q++) shards[q] = omake(&L, FM_BACKEND_CUDA, dev, q * GNL, GNL, FM_OUT_F32, 1);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    iob B;
    iob_make(&B, GH);
    uint16_t *dx = B.dx, *x = B.x;
    float    *dout = B.dout, *dw = B.dw, *wts = B.wts, *got = B.o[0], *ref = B.o[1], *again = B.o[2];
    int32_t  *dids = B.dids, *ids = B.ids;
    double   *sum = B.sum;
    const int Ts[] = {1, 2, 3, 4, 8, 16, 32};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int    T = Ts[ti];
        const size_t n = (size_t)T * GH;
        iob_fresh(&B, &r, T, GH, GE);
        fm_layer_plan_info d0;
        assert_int_equal(fm_layer_plan(dec, T, &d0), FM_OK);
        if (d0.decode != 1 || d0.decode_note[0]) fail_msg("gpt-oss T=%d: decode %d, note \"%s\"", T, d0.decode, d0.decode_note);
        fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
        fm_layer_run_args ai = {.x = dx, .T = T, .out = dout, .stream = st};

        /* the automatic splits: = the chain, vs cpu-ref */
        char what[64];
        snprintf(what, sizeof what, "splits %d/%d", d0.decode_k_splits[0], d0.decode_k_splits[1]);
        oss_vs_chain(dec, chain, &a, &ai, st, got, again, n, T, what);
        fm_layer_run_args ah = {.x = x, .T = T, .out = ref, .topk_ids = ids, .topk_weights = wts};
        fm_poison_f32(ref, n);
        assert_int_equal(fm_layer_run(cref, &ah), FM_OK);
        fm_assert_close(got, ref, n, bound, "gpt-oss: decode kernel vs cpu-ref (external routing)");

        /* BF16 out = BF16(FP32 out) */
        bf16_out_equals(dbf, &a, st, got, n, "gpt-oss ", T);

        /* shards summed = the whole layer, every layer with shard 0's decode splits */
        shards_sum_to_whole(whole, shards, GE / GNL, &d0, &a, st, again, sum, n, "gpt-oss ", T);

        /* FC1 split 3 ways (each split one K stage of 128, the last with 64 of K), FC2 unsplit */
        if (T == 1 || T == 8 || T == 32) {
            fm_layer_plan_info p3 = d0;
            p3.decode_k_splits[0] = 3, p3.decode_k_splits[1] = 1;
            fm_status s = fm_layer_set_plan(dec, T, &p3);
            if (s != FM_OK) fail_msg("gpt-oss T=%d: decode splits 3/1: %s: %s", T, fm_status_name(s), fm_last_error());
            oss_vs_chain(dec, chain, &a, &ai, st, got, again, n, T, "splits 3/1");
            fm_assert_close(got, ref, n, bound, "gpt-oss: decode kernel, splits 3/1, vs cpu-ref (external routing)");
            assert_int_equal(fm_layer_set_plan(dec, T, &d0), FM_OK); /* the bucket's automatic plan back */
        }
        printf("  gpt-oss T=%2d: decode (splits %d/%d%s) = chain bit for bit, vs cpu-ref within %.0e, graph = eager, "
               "shards = layer\n",
               T, d0.decode_k_splits[0], d0.decode_k_splits[1], T == 1 || T == 8 || T == 32 ? ", 3/1" : "", bound);
    }
    for (int q = 0; q < GE / GNL; q++) fm_layer_destroy(shards[q]);
    fm_layer_destroy(dec), fm_layer_destroy(chain), fm_layer_destroy(cref), fm_layer_destroy(whole);
    fm_layer_destroy(dbf);
    ofx_free(&L);
    CK(cudaStreamDestroy(st));
    iob_free(&B);
    fm_cuda_device_close(dev);
}

/* fm_layer_plan reports the choice: decode_path ON gives decode = 1, a grid and splits in
 * every bucket of <= 128 slots and the chain with a note above; AUTO the decode kernel where
 * the bucket expects <= 1 local routed slot on an sm_90 device (T x K x NL / E: T = 1, 2
 * here), the chain elsewhere; set_plan's
 * refusals (a bucket over the limit, splits out of range, decode = 2), plans unchanged. */
static void test_decode_plan_report(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = setup(&r, 12);
    dfx             L;
    dfx_make(&L, &r, FM_FORMAT_NVFP4);
    fm_moe_weights w = L.w;
    fm_layer_desc  d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = 64, .n_local = NL,
                        .decode_path = FM_DECODE_PATH_ON};
    fm_layer *on = NULL, *au = NULL;
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &on), FM_OK);
    d.decode_path = FM_DECODE_PATH_AUTO;
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &au), FM_OK);
    const int Ts[] = {1, 2, 4, 8, 16, 32, 64};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        fm_layer_plan_info p, q;
        assert_int_equal(fm_layer_plan(on, Ts[i], &p), FM_OK);
        assert_int_equal(fm_layer_plan(au, Ts[i], &q), FM_OK);
        printf("  T=%2d: ON decode %d (%d CTAs, splits %d/%d) note \"%s\"; AUTO decode %d\n", Ts[i], p.decode,
               p.decode_ctas, p.decode_k_splits[0], p.decode_k_splits[1], p.decode_note, q.decode);
        const int auto_decode = (double)Ts[i] * K * NL / E <= 1.0 && Ts[i] * K <= 8 && fm_cuda_device_limits(dev)->cc / 10 == 9;
        assert_int_equal(q.decode, auto_decode);
        if (auto_decode) /* AUTO's splits and grid are ON's */
            assert_true(q.decode_ctas == p.decode_ctas && q.decode_k_splits[0] == p.decode_k_splits[0] &&
                        q.decode_k_splits[1] == p.decode_k_splits[1]);
        if (Ts[i] * K <= FM_DECODE_MAX_SLOTS) {
            assert_int_equal(p.decode, 1);
            assert_true(p.decode_ctas > 0 && p.decode_k_splits[0] >= 1 && p.decode_k_splits[1] >= 1);
            assert_int_equal(p.decode_counter, Ts[i] >= FM_DECODE_COUNTER_MIN_T);
            assert_string_equal(p.decode_note, "");
        } else {
            assert_int_equal(p.decode, 0);
            assert_non_null(strstr(p.decode_note, "routed slots"));
            fm_layer_plan_info bad = p;
            bad.decode = 1;
            assert_int_equal(fm_layer_set_plan(on, Ts[i], &bad), FM_ERR_UNSUPPORTED);
            assert_int_equal(fm_layer_plan(on, Ts[i], &q), FM_OK);
            assert_memory_equal(&p, &q, sizeof p);
        }
    }
    fm_layer_plan_info p, q;
    assert_int_equal(fm_layer_plan(on, 1, &p), FM_OK);
    fm_layer_plan_info bad = p;
    bad.decode = 2;
    assert_int_equal(fm_layer_set_plan(on, 1, &bad), FM_ERR_INVALID_ARG);
    bad = p, bad.decode_k_splits[0] = FM_DECODE_MAX_K_SPLITS + 1;
    assert_int_equal(fm_layer_set_plan(on, 1, &bad), FM_ERR_INVALID_ARG);
    bad = p, bad.decode_k_splits[1] = -1;
    assert_int_equal(fm_layer_set_plan(on, 1, &bad), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_plan(on, 1, &q), FM_OK);
    assert_memory_equal(&p, &q, sizeof p);
    /* AUTO's layer switched to the chain and to decode with other splits by set_plan, and back */
    assert_int_equal(fm_layer_plan(au, 1, &q), FM_OK);
    bad = q, bad.decode = 0;
    assert_int_equal(fm_layer_set_plan(au, 1, &bad), FM_OK);
    assert_int_equal(fm_layer_plan(au, 1, &p), FM_OK);
    assert_int_equal(p.decode, 0);
    bad = q, bad.decode = 1, bad.decode_k_splits[0] = 2, bad.decode_k_splits[1] = 4;
    assert_int_equal(fm_layer_set_plan(au, 1, &bad), FM_OK);
    assert_int_equal(fm_layer_plan(au, 1, &p), FM_OK);
    assert_int_equal(p.decode, 1);
    assert_int_equal(p.decode_k_splits[0], 2);
    assert_int_equal(p.decode_k_splits[1], 4);
    assert_int_equal(fm_layer_set_plan(au, 1, &q), FM_OK);
    assert_int_equal(fm_layer_plan(au, 1, &p), FM_OK);
    assert_int_equal(p.decode, q.decode);
    /* where AUTO takes the kernel, its layer runs what ON's runs: the same bits, vs cpu-ref */
    if (q.decode) {
        enum { T1 = 1 };
        const size_t n = (size_t)T1 * H;
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        uint16_t *x = malloc(sizeof(uint16_t) * n), *dx = dmalloc(sizeof(uint16_t) * n);
        int32_t   ids[T1 * K], *dids = dmalloc(sizeof ids);
        float     wts[T1 * K], *dw = dmalloc(sizeof wts), *dout = dmalloc(sizeof(float) * n);
        float    *got = malloc(sizeof(float) * n), *again = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
        routing(&r, T1, ids, wts);
        h2d(dx, x, sizeof(uint16_t) * n), h2d(dids, ids, sizeof ids), h2d(dw, wts, sizeof wts);
        fm_layer_run_args a = {.x = dx, .T = T1, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
        run_dev(au, &a, st, got, n);
        assert_int_equal(fm_layer_errors(au, st, NULL), FM_OK);
        assert_int_equal(fm_first_nonfinite(got, n), -1);
        run_dev(on, &a, st, again, n);
        assert_memory_equal(got, again, sizeof(float) * n);
        fm_layer *cref = make(&L, FM_BACKEND_CPU_REF, NULL, 0, NL, FM_OUT_F32, 0);
        double    bound = -1;
        assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &L.cfg, &bound), FM_OK);
        fm_layer_run_args ah = {.x = x, .T = T1, .out = ref, .topk_ids = ids, .topk_weights = wts};
        fm_poison_f32(ref, n);
        assert_int_equal(fm_layer_run(cref, &ah), FM_OK);
        fm_assert_close(got, ref, n, bound, "decode_path AUTO at T = 1 vs cpu-ref");
        fm_layer_destroy(cref);
        CK(cudaFree(dx));
        CK(cudaFree(dids));
        CK(cudaFree(dw));
        CK(cudaFree(dout));
        free(x), free(got), free(again), free(ref);
        CK(cudaStreamDestroy(st));
    }
    fm_layer_destroy(on);
    fm_layer_destroy(au);
    dfx_free(&L);
    fm_cuda_device_close(dev);
}

/* The grid guard of both kernels (the plain one and the gpt-oss twin, fm_decode_oss): a
 * cooperative launch of occupancy x SMs CTAs runs (T = 0: the kernel returns at once), one CTA
 * more is refused by the runtime before anything runs (the strided form); the counter form
 * (fm_decode_params.dynamic, no residency needed) is a plain launch that runs that grid; an
 * activation the kernel does not know is refused by the launcher. */
static void test_decode_grid_guard(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = setup(&r, 13);
    const int       sms = fm_cuda_device_limits(dev)->sms;
    for (int oss = 0; oss < 2; oss++) {
        int occ = 0, regs = 0;
        assert_int_equal(fm_decode_occupancy(oss, &occ, &regs), 0);
        printf("  decode kernel%s: %d CTAs per SM x %d SMs, %d registers, %zu B dynamic shared memory\n",
               oss ? " (gpt-oss twin)" : "", occ, sms, regs, fm_decode_smem_bytes());
        assert_true(occ >= 1);
        fm_decode_params p;
        memset(&p, 0, sizeof p);
        p.T = 0, p.top_k = 1, p.ks1 = p.ks2 = 1;
        p.act = oss ? FM_ACT_SWIGLU_GPTOSS : FM_ACT_SWIGLU, p.act_limit = 7.0f;
        assert_int_equal(fm_decode_oss(p.act, p.b1, p.b2), oss);
        assert_int_equal(fm_decode_launch(&p, occ * sms, NULL), 0);
        CK(cudaDeviceSynchronize());
        const int e = fm_decode_launch(&p, occ * sms + 1, NULL);
        printf("  %d CTAs: %s\n", occ * sms + 1, cudaGetErrorString((cudaError_t)e));
        assert_int_equal(e, (int)cudaErrorCooperativeLaunchTooLarge);
        (void)cudaGetLastError();
        CK(cudaDeviceSynchronize());
        /* the counter form needs no residency: a plain launch, the same grid runs */
        p.dynamic = 1;
        assert_int_equal(fm_decode_launch(&p, occ * sms + 1, NULL), 0);
        CK(cudaDeviceSynchronize());
        p.dynamic = 0;
        p.act = 7;
        assert_int_equal(fm_decode_launch(&p, 1, NULL), (int)cudaErrorInvalidValue);
    }
    fm_cuda_device_close(dev);
}

/* The two ways the kernel's CTAs find their units ($FM_DECODE_UNITS, read at create: static =
 * strides of the grid, counter = the counter in the decode buffer; the plan reports which,
 * decode_counter) give the same bits at every T (the sums' order does not depend on which CTA
 * runs a unit), each against cpu-ref (NaN/Inf first); the counter's rest state holds (the
 * counter layer run twice, a graph of it replayed 3 times = eager); the default layer (AUTO:
 * strides at T = 1, the counter from T = 2) alternates the forms on one decode buffer
 * (T = 2, 1, 5, 1, 16, 32) with the same bits; a value the knob does not know refuses the
 * create with a message naming it, nothing made. */
static fm_layer *make_units(const dfx *L, fm_cuda_device *dev, const char *units)
{
    assert_int_equal(setenv("FM_DECODE_UNITS", units, 1), 0);
    fm_layer *l = make(L, FM_BACKEND_CUDA, dev, 0, NL, FM_OUT_F32, 1);
    assert_int_equal(unsetenv("FM_DECODE_UNITS"), 0);
    return l;
}

static void test_decode_units(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = setup(&r, 15);
    const int       Ts[] = {2, 1, 5, 1, 16, 32};
    cudaStream_t    st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    iob B;
    iob_make(&B, H);
    uint16_t *dx = B.dx, *x = B.x;
    float    *dout = B.dout, *dw = B.dw, *wts = B.wts, *st_out = B.o[0], *ct_out = B.o[1], *again = B.o[2];
    float    *ref = B.o[3];
    int32_t  *dids = B.dids, *ids = B.ids;
    dfx       L;
    dfx_make(&L, &r, FM_FORMAT_NVFP4);
    double bound = -1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &L.cfg, &bound), FM_OK);
    fm_layer *sl = make_units(&L, dev, "static"), *cl = make_units(&L, dev, "counter");
    fm_layer *al = make(&L, FM_BACKEND_CUDA, dev, 0, NL, FM_OUT_F32, 1); /* the default: auto */
    fm_layer *cref = make(&L, FM_BACKEND_CPU_REF, NULL, 0, NL, FM_OUT_F32, 0);
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int    T = Ts[ti];
        const size_t n = (size_t)T * H;
        iob_fresh(&B, &r, T, H, E);
        fm_layer_plan_info ps, pc, pa;
        assert_int_equal(fm_layer_plan(sl, T, &ps), FM_OK);
        assert_int_equal(fm_layer_plan(cl, T, &pc), FM_OK);
        assert_int_equal(fm_layer_plan(al, T, &pa), FM_OK);
        assert_true(ps.decode == 1 && pc.decode == 1 && pa.decode == 1);
        assert_true(ps.decode_counter == 0 && pc.decode_counter == 1 && pa.decode_counter == (T >= FM_DECODE_COUNTER_MIN_T));
        assert_true(ps.decode_ctas == pc.decode_ctas && ps.decode_k_splits[0] == pc.decode_k_splits[0] &&
                    ps.decode_k_splits[1] == pc.decode_k_splits[1]);
        fm_layer_run_args a = {.x = dx, .T = T, .out = dout, .stream = st, .topk_ids = dids, .topk_weights = dw};
        run_dev(cl, &a, st, ct_out, n);
        run_dev(sl, &a, st, st_out, n);
        run_dev(cl, &a, st, again, n); /* the counter at rest after a counter run */
        assert_int_equal(fm_first_nonfinite(ct_out, n), -1);
        assert_int_equal(fm_first_nonfinite(st_out, n), -1);
        fm_layer_run_args ah = {.x = x, .T = T, .out = ref, .topk_ids = ids, .topk_weights = wts};
        fm_poison_f32(ref, n);
        assert_int_equal(fm_layer_run(cref, &ah), FM_OK);
        fm_assert_close(ct_out, ref, n, bound, "decode kernel, units from the counter, vs cpu-ref");
        fm_assert_close(st_out, ref, n, bound, "decode kernel, units by strides, vs cpu-ref");
        if (memcmp(ct_out, st_out, sizeof(float) * n)) fail_msg("T=%d: counter units differ from strided units", T);
        if (memcmp(ct_out, again, sizeof(float) * n)) fail_msg("T=%d: the counter's second run differs", T);
        graph_equals_eager(cl, &a, st, ct_out, again, n);
        run_dev(al, &a, st, again, n); /* the default layer: this T's form after the last T's */
        if (memcmp(st_out, again, sizeof(float) * n)) fail_msg("T=%d: the default layer (after T's other form) differs", T);
        assert_int_equal(fm_layer_errors(cl, st, NULL), FM_OK);
        printf("  T=%2d: counter = strides bit for bit (splits %d/%d), vs cpu-ref within %.0e, graph = eager; default "
               "layer (%s) the same\n", T, pc.decode_k_splits[0], pc.decode_k_splits[1], bound,
               pa.decode_counter ? "counter" : "strides");
    }
    /* a value the knob does not know */
    assert_int_equal(setenv("FM_DECODE_UNITS", "dynamic", 1), 0);
    fm_moe_weights w = L.w;
    fm_layer_desc  d = {.backend = FM_BACKEND_CUDA, .device = dev, .max_tokens = MAXT, .n_local = NL,
                        .decode_path = FM_DECODE_PATH_ON};
    fm_layer *bad = (fm_layer *)&d; /* must come back NULL */
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &w, &bad), FM_ERR_INVALID_ARG);
    assert_null(bad);
    assert_non_null(strstr(fm_last_error(), "FM_DECODE_UNITS='dynamic'"));
    assert_int_equal(unsetenv("FM_DECODE_UNITS"), 0);
    fm_layer_destroy(sl), fm_layer_destroy(cl), fm_layer_destroy(al), fm_layer_destroy(cref);
    dfx_free(&L);
    CK(cudaStreamDestroy(st));
    iob_free(&B);
    fm_cuda_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_decode_layer), cmocka_unit_test(test_decode_gptoss),
                                       cmocka_unit_test(test_decode_plan_report),
                                       cmocka_unit_test(test_decode_units), cmocka_unit_test(test_decode_grid_guard)};
    const char *only = getenv("FM_TEST_FILTER");
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
