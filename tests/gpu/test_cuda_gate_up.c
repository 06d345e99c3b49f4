/* test_cuda_gate_up.c - separate gate and up global scales per expert
 * (fm_moe_weights.w13_up_global, as NVFP4 checkpoints store them) on the cuda backend:
 * block scales taken as stored, each half's global applied by the FC1 epilogue
 * (fm_cuda_weights_create_gate_up; tests/test_layer_gate_up.c holds the CPU backends).
 *  - the layer against cpu-ref of the same (split-global) weights within the cuda bound
 *    (fm_layer_accuracy), at T = 1 .. 512: the mma chain, the work list and K splits,
 *    the wgmma kernels, and the one-launch decode kernel forced on (T <= 32); a shard;
 *  - the same layer against the reference of the re-encoded weights (fm_w13_one_global:
 *    what this backend ran before): printed, and asserted far worse than the layer, so
 *    the test fails if the epilogue applied one global to both halves;
 *  - up globals equal to the gate's: bit for bit the layer without them;
 *  - fm_cuda_weights_create_gate_up's refusals (MXFP4, a NaN / 0 / subnormal up global,
 *    rows not a multiple of 32): the status, *out NULL.
 * Fresh random inputs, outputs poisoned before each run, NaN/Inf checked first. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "format/format_internal.h"
#include "fp4moe.h"
#include "gpu_common.h"

enum { E = 16, K = 4, H = 1024, I = 512, MAXT = 512 };

/* up global = gate global x this (expert e: factor e % 5; 1.0 = an unsplit expert among them) */
static const float k_up_factor[5] = {1.7f, 0.45f, 0.3f, 1.0f, 2.9f};

typedef struct {
    fm_moe_config  cfg;
    gpu_experts    w13, w2;
    float          up[E], *router;
    fm_moe_weights w;
} gfx;

static void gfx_make(gfx *L, fm_rng *r)
{
    fm_moe_config_default(&L->cfg);
    L->cfg.n_experts = E, L->cfg.top_k = K, L->cfg.hidden = H, L->cfg.inter = I, L->cfg.wfmt = FM_FORMAT_NVFP4;
    gpu_experts_make(&L->w13, r, FM_FORMAT_NVFP4, E, 2 * I, H);
    gpu_experts_make(&L->w2, r, FM_FORMAT_NVFP4, E, H, I);
    for (int e = 0; e < E; e++) L->up[e] = L->w13.w[e].global_scale * k_up_factor[e % 5];
    L->router = malloc(sizeof(float) * E * H); /* the layer takes one; external routing here */
    assert_non_null(L->router);
    fm_rng_fill_normal(r, L->router, (size_t)E * H, 0.05f);
    L->w = (fm_moe_weights){.router_w = L->router, .w13 = L->w13.w, .w2 = L->w2.w, .w13_up_global = L->up};
}

static void gfx_free(gfx *L)
{
    gpu_experts_free(&L->w13);
    gpu_experts_free(&L->w2);
    free(L->router);
}

static fm_layer *make(const fm_moe_config *c, const fm_moe_weights *w0, fm_backend_kind b, fm_cuda_device *dev,
                      int first, int n, int decode)
{
    fm_moe_weights w = *w0;
    w.w13 += first, w.w2 += first;
    if (w.w13_up_global) w.w13_up_global += first;
    fm_layer_desc d = {.backend = b, .device = b == FM_BACKEND_CUDA ? dev : NULL, .max_tokens = MAXT,
                       .out_dtype = FM_OUT_F32, .first_expert = first, .n_local = n,
                       .decode_path = decode ? FM_DECODE_PATH_ON : FM_DECODE_PATH_OFF};
    fm_layer *l = NULL;
    fm_status s = fm_layer_create_desc(&d, c, &w, &l);
    if (s != FM_OK) fail_msg("create (%s): %s: %s", fm_backend_name(b), fm_status_name(s), fm_last_error());
    return l;
}

/* Distinct ids per token over E experts, weights in [0.1, 0.4). */
static void routing(fm_rng *r, int T, int32_t *ids, float *wts)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, dup = 1;
            while (dup) {
                e = (int)(fm_rng_uniform(r) * E);
                dup = 0;
                for (int u = 0; u < j; u++) dup |= ids[t * K + u] == e;
            }
            ids[t * K + j] = e;
            wts[t * K + j] = (float)(0.1 + 0.3 * fm_rng_uniform(r));
        }
}

typedef struct {
    uint16_t    *dx;
    int32_t     *dids;
    float       *dw, *dout;
    cudaStream_t st;
} dbufs;

static void dbufs_make(dbufs *b)
{
    CK(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&b->dx, sizeof(uint16_t) * MAXT * H));
    CK(cudaMalloc((void **)&b->dids, sizeof(int32_t) * MAXT * K));
    CK(cudaMalloc((void **)&b->dw, sizeof(float) * MAXT * K));
    CK(cudaMalloc((void **)&b->dout, sizeof(float) * MAXT * H));
}

static void dbufs_free(dbufs *b)
{
    CK(cudaFree(b->dx));
    CK(cudaFree(b->dids));
    CK(cudaFree(b->dw));
    CK(cudaFree(b->dout));
    CK(cudaStreamDestroy(b->st));
}

/* Fresh x and routing of T tokens on the host, uploaded to b. */
static void fresh_inputs(fm_rng *r, int T, uint16_t *x, int32_t *ids, float *wts, dbufs *b)
{
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(r));
    routing(r, T, ids, wts);
    CK(cudaMemcpy(b->dx, x, sizeof(uint16_t) * T * H, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b->dids, ids, sizeof(int32_t) * T * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b->dw, wts, sizeof(float) * T * K, cudaMemcpyHostToDevice));
}

/* The GPU required, the seed, device 0 opened. */
static fm_cuda_device *open_device(fm_rng *r, unsigned off)
{
    fm_test_require_gpu();
    fm_rng_init(r, fm_test_seed() + off);
    CK(cudaSetDevice(0));
    fm_cuda_device *dev = NULL;
    assert_int_equal(fm_cuda_device_open(0, &dev), FM_OK);
    return dev;
}

/* One cuda run over a poisoned output, copied back; NaN / Inf fail first. */
static void run_cuda(fm_layer *l, dbufs *b, int T, float *host)
{
    const size_t n = (size_t)T * H;
    CK(cudaMemsetAsync(b->dout, 0xFF, sizeof(float) * n, b->st));
    fm_layer_run_args a = {.x = b->dx, .T = T, .topk_ids = b->dids, .topk_weights = b->dw, .out = b->dout,
                           .stream = b->st};
    fm_status s = fm_layer_run(l, &a);
    if (s != FM_OK) fail_msg("run T=%d: %s: %s", T, fm_status_name(s), fm_last_error());
    CK(cudaMemcpyAsync(host, b->dout, sizeof(float) * n, cudaMemcpyDeviceToHost, b->st));
    CK(cudaStreamSynchronize(b->st));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(host[i])) fail_msg("T=%d: out[%zu] = %g (not finite)", T, i, (double)host[i]);
}

static void run_host(fm_layer *l, const uint16_t *x, int T, const int32_t *ids, const float *wts, float *out)
{
    fm_poison_f32(out, (size_t)T * H);
    fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = out};
    fm_status s = fm_layer_run(l, &a);
    if (s != FM_OK) fail_msg("cpu-ref T=%d: %s: %s", T, fm_status_name(s), fm_last_error());
}

static void test_layer_vs_ref(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = open_device(&r, 0x6a7e);
    gfx L;
    gfx_make(&L, &r);
    double bound = -1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &L.cfg, &bound), FM_OK);

    /* the re-encoded weights (one global per w13): what the backend ran before */
    const size_t sb = (size_t)2 * I * (H / 16);
    fm_qtensor   one[E];
    uint8_t     *sc = malloc(sb * E);
    assert_non_null(sc);
    for (int e = 0; e < E; e++) fm_w13_one_global(&L.w13.w[e], L.up[e], sc + sb * (size_t)e, &one[e]);
    fm_moe_weights w_one = L.w;
    w_one.w13 = one, w_one.w13_up_global = NULL;

    fm_layer *cu = make(&L.cfg, &L.w, FM_BACKEND_CUDA, dev, 0, 0, 0);
    fm_layer *dec = make(&L.cfg, &L.w, FM_BACKEND_CUDA, dev, 0, 0, 1);
    fm_layer *ref = make(&L.cfg, &L.w, FM_BACKEND_CPU_REF, NULL, 0, 0, 0);
    fm_layer *ref1 = make(&L.cfg, &w_one, FM_BACKEND_CPU_REF, NULL, 0, 0, 0);
    fm_layer *shard = make(&L.cfg, &L.w, FM_BACKEND_CUDA, dev, 4, 8, 0);
    fm_layer *sref = make(&L.cfg, &L.w, FM_BACKEND_CPU_REF, NULL, 4, 8, 0);

    dbufs b;
    dbufs_make(&b);
    uint16_t *x = malloc(sizeof(uint16_t) * MAXT * H);
    int32_t  *ids = malloc(sizeof(int32_t) * MAXT * K);
    float    *wts = malloc(sizeof(float) * MAXT * K), *got = malloc(sizeof(float) * MAXT * H),
          *want = malloc(sizeof(float) * MAXT * H), *want1 = malloc(sizeof(float) * MAXT * H);
    assert_true(x && ids && wts && got && want && want1);

    const int Ts[] = {1, 2, 4, 8, 16, 32, 64, 128, 512};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int    T = Ts[ti];
        const size_t n = (size_t)T * H;
        fresh_inputs(&r, T, x, ids, wts, &b);
        run_host(ref, x, T, ids, wts, want);
        run_host(ref1, x, T, ids, wts, want1);
        const double e_one = fm_nmse(want1, want, n);

        fm_layer_plan_info pi;
        assert_int_equal(fm_layer_plan(cu, T, &pi), FM_OK);
        char ps[200], t1[64], t2[64];
        snprintf(ps, sizeof ps, "%s / %s, K splits %d / %d%s", fm_tile_name(&pi.tile[0], t1, sizeof t1),
                 fm_tile_name(&pi.tile[1], t2, sizeof t2), pi.k_splits[0], pi.k_splits[1],
                 pi.work_list ? ", work list" : "");
        run_cuda(cu, &b, T, got);
        const double e_cu = fm_nmse(got, want, n);
        printf("  T=%-3d cuda (%s): NMSE vs cpu-ref %.3g (bound %.0e); the re-encoded layer's %.3g\n", T, ps, e_cu,
               bound, e_one);
        assert_true(e_cu <= bound);
        /* one global for both halves would be the re-encoded layer or worse */
        assert_true(e_cu * 10 < e_one);

        if (T <= 32) {
            run_cuda(dec, &b, T, got);
            const double e_dec = fm_nmse(got, want, n);
            printf("  T=%-3d cuda decode kernel: NMSE vs cpu-ref %.3g\n", T, e_dec);
            assert_true(e_dec <= bound);
            assert_true(e_dec * 10 < e_one);
        }
        if (T == 16 || T == 128) { /* a shard: experts [4, 12), up globals from w13_up_global + 4 */
            run_cuda(shard, &b, T, got);
            run_host(sref, x, T, ids, wts, want);
            const double e_sh = fm_nmse(got, want, n);
            printf("  T=%-3d cuda shard [4, 12): NMSE vs cpu-ref %.3g\n", T, e_sh);
            assert_true(e_sh <= bound);
        }
    }
    fm_layer *ls[] = {cu, dec, ref, ref1, shard, sref};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) fm_layer_destroy(ls[i]);
    dbufs_free(&b);
    free(x), free(ids), free(wts), free(got), free(want), free(want1), free(sc);
    gfx_free(&L);
    fm_cuda_device_close(dev);
}

/* Up globals equal to the gate's: the layer without them, bit for bit (T = 4 and 64). */
static void test_equal_globals(void **state)
{
    (void)state;
    fm_rng          r;
    fm_cuda_device *dev = open_device(&r, 0xe9);
    gfx L;
    gfx_make(&L, &r);
    for (int e = 0; e < E; e++) L.up[e] = L.w13.w[e].global_scale;
    fm_moe_weights none = L.w;
    none.w13_up_global = NULL;
    fm_layer *a = make(&L.cfg, &L.w, FM_BACKEND_CUDA, dev, 0, 0, 0), *c = make(&L.cfg, &none, FM_BACKEND_CUDA, dev, 0, 0, 0);
    dbufs b;
    dbufs_make(&b);
    uint16_t *x = malloc(sizeof(uint16_t) * MAXT * H);
    int32_t  *ids = malloc(sizeof(int32_t) * MAXT * K);
    float *wts = malloc(sizeof(float) * MAXT * K), *o1 = malloc(sizeof(float) * MAXT * H), *o2 = malloc(sizeof(float) * MAXT * H);
    const int Ts[2] = {4, 64};
    for (int ti = 0; ti < 2; ti++) {
        const int T = Ts[ti];
        fresh_inputs(&r, T, x, ids, wts, &b);
        run_cuda(a, &b, T, o1);
        run_cuda(c, &b, T, o2);
        assert_memory_equal(o1, o2, sizeof(float) * (size_t)T * H);
    }
    fm_layer_destroy(a), fm_layer_destroy(c);
    dbufs_free(&b);
    free(x), free(ids), free(wts), free(o1), free(o2);
    gfx_free(&L);
    fm_cuda_device_close(dev);
}

static void expect_refused(const fm_qtensor *w, int n, const float *up, fm_status want, const char *needle)
{
    fm_cuda_weights *cw = (fm_cuda_weights *)(uintptr_t)1; /* must come back NULL */
    const fm_status  s = fm_cuda_weights_create_gate_up(w, n, up, &cw);
    printf("  refused: %s: %s\n", fm_status_name(s), fm_last_error());
    assert_int_equal(s, want);
    assert_null(cw);
    assert_non_null(strstr(fm_last_error(), needle));
}

static void test_refusals(void **state)
{
    (void)state;
    fm_test_require_gpu();
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 0xbad);
    CK(cudaSetDevice(0));
    gpu_experts nv, mx, odd;
    gpu_experts_make(&nv, &r, FM_FORMAT_NVFP4, 2, 64, 128);
    gpu_experts_make(&mx, &r, FM_FORMAT_MXFP4, 2, 64, 128);
    gpu_experts_make(&odd, &r, FM_FORMAT_NVFP4, 2, 48, 128);
    float up[2] = {1.0f, 1.0f};
    expect_refused(mx.w, 2, up, FM_ERR_FORMAT, "NVFP4 only");
    expect_refused(odd.w, 2, up, FM_ERR_BAD_SHAPE, "rows % 32");
    const float bad[] = {NAN, INFINITY, 0.0f, -1.0f, 1e-40f};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        up[1] = bad[i];
        expect_refused(nv.w, 2, up, FM_ERR_NONFINITE, "up_global[1]");
    }
    up[1] = 0.5f;
    fm_cuda_weights *cw = NULL;
    assert_int_equal(fm_cuda_weights_create_gate_up(nv.w, 2, up, &cw), FM_OK);
    assert_non_null(cw);
    fm_cuda_weights_destroy(cw);
    gpu_experts_free(&nv), gpu_experts_free(&mx), gpu_experts_free(&odd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_vs_ref),
        cmocka_unit_test(test_equal_globals),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
