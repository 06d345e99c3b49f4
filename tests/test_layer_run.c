/* test_layer_run.c - the layer as a serving engine calls it (fm_layer_run), on
 * the CPU backends: external routing, expert shards, BF16 output, caller
 * workspace, and every bad argument with its status.
 *
 * Oracles:
 *  - external routing: a float64 MoE written here from the formula (weights
 *    decoded with fm_dequantize, whose codecs are checked against ml_dtypes
 *    elsewhere): out[t] = sum_j w[t][j] * W2_e . SwiGLU(W13_e . x_t), e =
 *    ids[t][j], slots with id -1 skipped; random ids and weights, not the
 *    router's; with gpt-oss's experts (FM_ACT_SWIGLU_GPTOSS, w13_bias / w2_bias) the
 *    formula of transformers' GptOssExperts: g + b13, gate min(g, L), up clamp(u, -L, L),
 *    (up + 1) * gate * sigmoid(1.702 gate), W2 h + b2. Bound: the layer accumulates in FP32 over K <= 256 terms of O(1)
 *    products, so NMSE ~ K * 2^-48 << 1e-9.
 *  - internal routing fed back as external routing: the same ids and weights
 *    give a bit-identical output (the routing step is the only difference).
 *  - shards: the outputs of 1, 2, 4 and 8 shards summed = the whole layer up to
 *    FP32 summation order (NMSE <= 1e-11).
 * Outputs are poisoned before every run.
 */
#include "test_moe_fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const fm_backend_kind k_cpu[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};

/* float64 MoE from the formula, external routing. */
static void oracle(const fx_layer *L, const uint16_t *x, int T, const int32_t *ids, const float *wts, double *out)
{
    const fm_moe_config *c = &L->cfg;
    const int H = c->hidden, I = c->inter, K = c->top_k;
    float  *w13 = malloc(sizeof(float) * 2 * I * H), *w2 = malloc(sizeof(float) * H * I);
    double *g = malloc(sizeof(double) * 2 * I), *h = malloc(sizeof(double) * I);
    assert_true(w13 && w2 && g && h);
    memset(out, 0, sizeof(double) * T * H);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e = ids[t * K + j];
            if (e < 0) continue;
            assert_int_equal(fm_dequantize(&L->w13[e], w13), FM_OK);
            assert_int_equal(fm_dequantize(&L->w2[e], w2), FM_OK);
            for (int n = 0; n < 2 * I; n++) {
                double s = 0;
                for (int k = 0; k < H; k++) s += (double)w13[(size_t)n * H + k] * fm_bf16_decode(x[(size_t)t * H + k]);
                g[n] = s + (L->w.w13_bias ? L->w.w13_bias[(size_t)e * 2 * I + n] : 0.0);
            }
            for (int i = 0; i < I; i++) {
                if (c->activation == FM_ACT_SWIGLU_GPTOSS) {
                    const double lim = c->swiglu_limit, gt = fmin(g[i], lim), up = fmax(fmin(g[I + i], lim), -lim);
                    h[i] = (up + 1.0) * gt / (1.0 + exp(-1.702 * gt));
                } else {
                    h[i] = g[i] / (1.0 + exp(-g[i])) * g[I + i];
                }
            }
            for (int n = 0; n < H; n++) {
                double s = 0;
                for (int i = 0; i < I; i++) s += (double)w2[(size_t)n * I + i] * h[i];
                s += L->w.w2_bias ? L->w.w2_bias[(size_t)e * H + n] : 0.0;
                out[(size_t)t * H + n] += wts[t * K + j] * s;
            }
        }
    free(w13), free(w2), free(g), free(h);
}

static void test_external_routing_vs_formula(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    const int E = 8, K = 3, H = 64, I = 32, T = fx_asan() ? 3 : 6;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &cfg, &r, 1, 0);
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K), *out = fx_aligned(sizeof(float) * T * H);
    double   *ref = malloc(sizeof(double) * T * H);
    fx_random_routing(&r, T, K, E, 0.15, ids, wts);
    for (int q = 0; q < K; q++) ids[q] = -1; /* token 0 goes nowhere: its output is 0 */
    oracle(&L, x, T, ids, wts, ref);
    for (int b = 0; b < 2; b++) {
        fm_layer *l = fx_shard_layer(k_cpu[b], &L, T, 0, 0, FM_OUT_F32);
        fm_poison_f32(out, (size_t)T * H);
        fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = out};
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        assert_int_equal(fm_first_nonfinite(out, (size_t)T * H), -1);
        for (int n = 0; n < H; n++) assert_true(out[n] == 0.0f);
        double e = fm_nmse64(out, ref, (size_t)T * H);
        if (!(e <= 1e-9)) fail_msg("%s: external routing NMSE %.3g vs the float64 formula", fm_backend_name(k_cpu[b]), e);
        fm_layer_destroy(l);
    }
    free(x), free(ids), free(wts), free(out), free(ref);
    fx_free(&L);
}

/* gpt-oss's experts: the clamped SwiGLU (a limit of 0.5 so that both clamps bite: FC1
 * outputs are O(1)) and both expert biases, on both CPU backends, whole and as 4 shards,
 * against the float64 formula; and what create refuses (a NaN bias, limits that do not
 * go with the activation, an unknown activation). */
static void test_gptoss_experts_vs_formula(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x6055);
    const int E = 8, K = 3, H = 64, I = 32, T = fx_asan() ? 3 : 6;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_MXFP4);
    cfg.activation = FM_ACT_SWIGLU_GPTOSS;
    cfg.swiglu_limit = 0.5f;
    fx_layer L;
    fx_build(&L, &cfg, &r, 1, 0);
    float *b13 = malloc(sizeof(float) * E * 2 * I), *b2 = malloc(sizeof(float) * E * H);
    for (int i = 0; i < E * 2 * I; i++) b13[i] = 0.5f * fm_rng_normal(&r);
    for (int i = 0; i < E * H; i++) b2[i] = 0.5f * fm_rng_normal(&r);
    L.w.w13_bias = b13;
    L.w.w2_bias = b2;
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K), *out = fx_aligned(sizeof(float) * T * H);
    float    *sum = malloc(sizeof(float) * T * H);
    double   *ref = malloc(sizeof(double) * T * H), *plain = malloc(sizeof(double) * T * H);
    fx_random_routing(&r, T, K, E, 0.15, ids, wts);
    oracle(&L, x, T, ids, wts, ref);
    fx_layer P = L; /* the same weights as plain SwiGLU without biases: what fp4moe ran before */
    P.cfg.activation = FM_ACT_SWIGLU;
    P.cfg.swiglu_limit = 0.0f;
    P.w.w13_bias = P.w.w2_bias = NULL;
    oracle(&P, x, T, ids, wts, plain);
    double far = 0, nrm = 0;
    for (int i = 0; i < T * H; i++) far += (plain[i] - ref[i]) * (plain[i] - ref[i]), nrm += ref[i] * ref[i];
    assert_true(far > 1e-2 * nrm); /* the test tells the two apart */
    for (int b = 0; b < 2; b++) {
        for (int shards = 1; shards <= 4; shards *= 4) {
            for (int i = 0; i < T * H; i++) sum[i] = 0.0f;
            for (int q = 0; q < shards; q++) {
                const int nl = E / shards;
                fm_layer *l = fx_shard_layer(k_cpu[b], &L, T, q * nl, nl, FM_OUT_F32);
                fm_poison_f32(out, (size_t)T * H);
                fm_layer_run_args a = {.x = x, .T = T, .topk_ids = ids, .topk_weights = wts, .out = out};
                assert_int_equal(fm_layer_run(l, &a), FM_OK);
                assert_int_equal(fm_first_nonfinite(out, (size_t)T * H), -1);
                for (int i = 0; i < T * H; i++) sum[i] += out[i];
                fm_layer_destroy(l);
            }
            double e = fm_nmse64(sum, ref, (size_t)T * H);
            if (!(e <= 1e-9))
                fail_msg("%s, %d shard(s): gpt-oss experts NMSE %.3g vs the float64 formula", fm_backend_name(k_cpu[b]),
                         shards, e);
        }
    }
    /* refused at create, with the status that names the cause */
    fm_layer_desc d = {.backend = FM_BACKEND_CPU, .max_tokens = T};
    fm_layer     *l = NULL;
    b13[5 * 2 * I + 7] = NAN;
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &L.w, &l), FM_ERR_NONFINITE);
    assert_non_null(strstr(fm_last_error(), "w13_bias[5][7]"));
    assert_null(l);
    b13[5 * 2 * I + 7] = 0.0f;
    b2[3 * H + 1] = INFINITY;
    assert_int_equal(fm_layer_create_desc(&d, &L.cfg, &L.w, &l), FM_ERR_NONFINITE);
    assert_non_null(strstr(fm_last_error(), "w2_bias[3][1]"));
    b2[3 * H + 1] = 0.0f;
    fm_moe_config bad = L.cfg;
    const float limits[3] = {0.0f, -1.0f, NAN};
    for (int i = 0; i < 3; i++) {
        bad.swiglu_limit = limits[i];
        assert_int_equal(fm_layer_create_desc(&d, &bad, &L.w, &l), FM_ERR_INVALID_ARG);
        assert_non_null(strstr(fm_last_error(), "swiglu_limit"));
    }
    bad.activation = FM_ACT_SWIGLU;
    bad.swiglu_limit = 7.0f;
    assert_int_equal(fm_layer_create_desc(&d, &bad, &L.w, &l), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "plain SwiGLU takes 0"));
    bad.activation = (fm_activation)7;
    assert_int_equal(fm_layer_create_desc(&d, &bad, &L.w, &l), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "unknown activation 7"));
    assert_null(l);
    assert_string_equal(fm_activation_name(FM_ACT_SWIGLU_GPTOSS), "swiglu-gptoss");
    assert_string_equal(fm_activation_name((fm_activation)7), "?");
    free(b13), free(b2), free(x), free(ids), free(wts), free(out), free(sum), free(ref), free(plain);
    fx_free(&L);
}

/* Internal routing's ids/weights (fm_moe_route on the router's logits, computed
 * here with the public functions) given back as external routing: same bits. */
static void test_internal_equals_external(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 1);
    const int E = 16, K = 4, H = 64, I = 32, T = 5;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_MXFP4);
    cfg.n_group = 4, cfg.topk_group = 2;
    fx_layer L;
    fx_build(&L, &cfg, &r, 1, 0);
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    float    *logits = malloc(sizeof(float) * T * E);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K), *o1 = fx_aligned(sizeof(float) * T * H),
          *o2 = fx_aligned(sizeof(float) * T * H);
    for (int t = 0; t < T; t++) /* the router, in double then rounded: ties are irrelevant at this precision */
        for (int e = 0; e < E; e++) {
            float part[8] = {0};
            for (int k = 0; k < H; k++) part[k % 8] += fm_bf16_decode(x[t * H + k]) * L.router_w[e * H + k];
            logits[t * E + e] = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        }
    assert_int_equal(fm_moe_route(&cfg, L.router_bias, logits, T, ids, wts), FM_OK);
    for (int b = 0; b < 2; b++) {
        fm_layer *l = fx_shard_layer(k_cpu[b], &L, T, 0, 0, FM_OUT_F32);
        fm_poison_f32(o1, (size_t)T * H);
        fm_poison_f32(o2, (size_t)T * H);
        fm_layer_run_args a = {.x = x, .T = T, .out = o1};
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        a.out = o2, a.topk_ids = ids, a.topk_weights = wts;
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        assert_int_equal(fm_first_nonfinite(o1, (size_t)T * H), -1);
        assert_memory_equal(o1, o2, sizeof(float) * T * H);
        /* routed_ids/_weights: the internal routing handed back = fm_moe_route's, bit for bit,
         * and the output unchanged by asking */
        int32_t *rid = fx_aligned(sizeof(int32_t) * T * K);
        float   *rw = fx_aligned(sizeof(float) * T * K);
        memset(rid, 0xA5, sizeof(int32_t) * T * K);
        fm_poison_f32(rw, (size_t)T * K);
        fm_poison_f32(o2, (size_t)T * H);
        a = (fm_layer_run_args){.x = x, .T = T, .out = o2, .routed_ids = rid, .routed_weights = rw};
        assert_int_equal(fm_layer_run(l, &a), FM_OK);
        assert_memory_equal(o1, o2, sizeof(float) * T * H);
        assert_memory_equal(rid, ids, sizeof(int32_t) * T * K);
        assert_memory_equal(rw, wts, sizeof(float) * T * K);
        free(rid), free(rw);
        fm_layer_destroy(l);
    }
    free(x), free(logits), free(ids), free(wts), free(o1), free(o2);
    fx_free(&L);
}

static void test_shards_sum_to_layer(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 2);
    const int E = 16, K = 4, H = 64, I = 32, T = 7;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    cfg.shared_inter = 32; /* held by the shard at expert 0 */
    fx_layer L;
    fx_build(&L, &cfg, &r, 1, 0);
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K), *whole = fx_aligned(sizeof(float) * T * H),
          *part = fx_aligned(sizeof(float) * T * H);
    double   *sum = malloc(sizeof(double) * T * H);
    fx_random_routing(&r, T, K, E, 0.15, ids, wts);
    for (int b = 0; b < 2; b++)
        for (int ext = 0; ext < 2; ext++) {
            fm_layer *l = fx_shard_layer(k_cpu[b], &L, T, 0, 0, FM_OUT_F32);
            fm_layer_run_args a = {.x = x, .T = T, .out = whole, .topk_ids = ext ? ids : NULL,
                                   .topk_weights = ext ? wts : NULL};
            fm_poison_f32(whole, (size_t)T * H);
            assert_int_equal(fm_layer_run(l, &a), FM_OK);
            fm_layer_destroy(l);
            for (int shards = 1; shards <= 8; shards *= 2) {
                memset(sum, 0, sizeof(double) * T * H);
                for (int q = 0; q < shards; q++) {
                    int first = q * E / shards, n = (q + 1) * E / shards - first;
                    fm_layer *sl = fx_shard_layer(k_cpu[b], &L, T, first, n, FM_OUT_F32);
                    a.out = part;
                    fm_poison_f32(part, (size_t)T * H);
                    assert_int_equal(fm_layer_run(sl, &a), FM_OK);
                    assert_int_equal(fm_first_nonfinite(part, (size_t)T * H), -1);
                    for (size_t i = 0; i < (size_t)T * H; i++) sum[i] += part[i];
                    fm_layer_destroy(sl);
                }
                double e = fm_nmse64(whole, sum, (size_t)T * H);
                if (!(e <= 1e-11))
                    fail_msg("%s %s routing: %d shards summed differ from the layer: NMSE %.3g",
                             fm_backend_name(k_cpu[b]), ext ? "external" : "internal", shards, e);
            }
        }
    free(x), free(ids), free(wts), free(whole), free(part), free(sum);
    fx_free(&L);
}

static void test_bf16_output(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 3);
    const int E = 8, K = 2, H = 64, I = 32, T = 4;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &cfg, &r, 0, 0);
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f), *ob = fx_aligned(sizeof(uint16_t) * T * H);
    float    *of = fx_aligned(sizeof(float) * T * H);
    for (int b = 0; b < 2; b++) {
        fm_layer *lf = fx_shard_layer(k_cpu[b], &L, T, 0, 0, FM_OUT_F32), *lb = fx_shard_layer(k_cpu[b], &L, T, 0, 0, FM_OUT_BF16);
        fm_poison_bytes(ob, sizeof(uint16_t) * T * H);
        fm_layer_run_args a = {.x = x, .T = T, .out = of};
        assert_int_equal(fm_layer_run(lf, &a), FM_OK);
        a.out = ob;
        assert_int_equal(fm_layer_run(lb, &a), FM_OK);
        for (int i = 0; i < T * H; i++) assert_int_equal(ob[i], fm_bf16_encode(of[i]));
        /* the host wrapper refuses a BF16 layer with a status, not garbage */
        assert_int_equal(fm_layer_forward(lb, x, T, of, NULL), FM_ERR_INVALID_ARG);
        fm_layer_destroy(lf), fm_layer_destroy(lb);
    }
    free(x), free(ob), free(of);
    fx_free(&L);
}

static void test_bad_arguments(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 4);
    const int E = 8, K = 2, H = 64, I = 32, T = 3;
    fm_moe_config cfg = fx_config(E, K, H, I, FM_FORMAT_NVFP4);
    fx_layer L;
    fx_build(&L, &cfg, &r, 0, 0);
    uint16_t *x = fx_bf16(&r, (size_t)T * H, 1.0f);
    int32_t  *ids = fx_aligned(sizeof(int32_t) * T * K);
    float    *wts = fx_aligned(sizeof(float) * T * K), *out = fx_aligned(sizeof(float) * (T * H + 4)), *keep = malloc(sizeof(float) * T * H);
    fx_random_routing(&r, T, K, E, 0.15, ids, wts);

    /* create */
    fm_layer     *l = NULL;
    fm_layer_desc d = {.backend = FM_BACKEND_CPU, .max_tokens = T};
    assert_int_equal(fm_layer_create_desc(NULL, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    d.first_expert = -1;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    d.first_expert = 4, d.n_local = 5;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    d.first_expert = 1, d.n_local = 0x7fffffff;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    d.first_expert = -0x7fffffff - 1, d.n_local = 1;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    d.first_expert = 0, d.n_local = 0, d.out_dtype = (fm_out_dtype)7;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    d.out_dtype = FM_OUT_F32;
    const int bad_wl[] = {2, -2, 0x7fffffff, -0x7fffffff - 1}; /* FM_WORK_LIST_OFF/AUTO/ON: -1, 0, 1 */
    for (size_t i = 0; i < sizeof bad_wl / sizeof bad_wl[0]; i++) {
        d.decode_work_list = bad_wl[i];
        assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
        assert_non_null(strstr(fm_last_error(), "decode_work_list"));
        assert_null(l);
    }
    d.decode_work_list = FM_WORK_LIST_AUTO;
    const float bad_q[] = {-0.1f, -0.9f, -2.0f, 0.3f, 0.49f, 1.0f, 2.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_q / sizeof bad_q[0]; i++) {
        d.row_quantile = bad_q[i];
        assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
        assert_non_null(strstr(fm_last_error(), "row_quantile"));
        assert_null(l);
    }
    const float good_q[] = {0.5f, 0.9f, 0.999f, FM_ROW_QUANTILE_MEAN, FM_ROW_QUANTILE_AUTO}; /* the CPU backends take them and ignore them */
    for (size_t i = 0; i < sizeof good_q / sizeof good_q[0]; i++) {
        d.row_quantile = good_q[i];
        assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_OK);
        fm_layer_destroy(l);
        l = NULL;
    }
    for (int wl = FM_WORK_LIST_OFF; wl <= FM_WORK_LIST_ON; wl++) { /* the CPU backends take them and ignore them */
        d.decode_work_list = wl;
        assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_OK);
        fm_layer_destroy(l);
        l = NULL;
    }
    d.decode_work_list = 0;
    d.device = (fm_cuda_device *)&d; /* any non-NULL device given to a CPU backend */
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_ERR_INVALID_ARG);
    assert_null(l);
    d.device = NULL;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_OK);
    size_t ws = 1;
    assert_int_equal(fm_layer_workspace_size(l, &ws), FM_OK);
    assert_int_equal(ws, 0);

    /* run: every bad input gets its status and leaves out untouched */
    fm_poison_f32(out, (size_t)T * H);
    memcpy(keep, out, sizeof(float) * T * H);
    fm_layer_run_args good = {.x = x, .T = T, .out = out, .topk_ids = ids, .topk_weights = wts}, a;
#define BAD(mutate, status)                                                  \
    do {                                                                     \
        a = good;                                                            \
        mutate;                                                              \
        assert_int_equal(fm_layer_run(l, &a), status);                       \
        assert_true(strlen(fm_last_error()) > 0);                            \
        assert_memory_equal(out, keep, sizeof(float) * T * H);               \
    } while (0)
    assert_int_equal(fm_layer_run(NULL, &good), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_run(l, NULL), FM_ERR_INVALID_ARG);
    BAD(a.x = NULL, FM_ERR_INVALID_ARG);
    BAD(a.topk_weights = NULL, FM_ERR_INVALID_ARG);
    BAD(a.T = 0, FM_ERR_BAD_SHAPE);
    BAD(a.T = T + 1, FM_ERR_BAD_SHAPE);
    BAD(a.x = (const uint16_t *)((const char *)x + 2), FM_ERR_MISALIGNED);
    BAD(a.workspace = out, FM_ERR_INVALID_ARG);
    int32_t save = ids[3];
    ids[3] = E; /* out of range */
    BAD((void)0, FM_ERR_OUT_OF_RANGE);
    ids[3] = -2;
    BAD((void)0, FM_ERR_OUT_OF_RANGE);
    ids[3] = save >= 0 ? save : 0;
    float sw = wts[3];
    wts[3] = NAN;
    BAD((void)0, FM_ERR_NONFINITE);
    wts[3] = sw;
    uint16_t sx = x[5];
    x[5] = 0x7fc0; /* BF16 NaN */
    BAD((void)0, FM_ERR_NONFINITE);
    BAD((a.topk_ids = NULL, a.topk_weights = NULL), FM_ERR_NONFINITE); /* internal routing too */
    { /* ... and the routing outputs are left alone on failure */
        int32_t *rid = fx_aligned(sizeof(int32_t) * T * K), *rid0 = malloc(sizeof(int32_t) * T * K);
        float   *rw = fx_aligned(sizeof(float) * T * K);
        memset(rid, 0x5A, sizeof(int32_t) * T * K);
        memcpy(rid0, rid, sizeof(int32_t) * T * K);
        memcpy(rw, rid, sizeof(float) * T * K);
        BAD((a.topk_ids = NULL, a.topk_weights = NULL, a.routed_ids = rid, a.routed_weights = rw), FM_ERR_NONFINITE);
        assert_memory_equal(rid, rid0, sizeof(int32_t) * T * K);
        assert_memory_equal(rw, rid0, sizeof(float) * T * K);
        x[5] = sx;
        BAD((a.routed_ids = rid, a.routed_weights = rw), FM_ERR_INVALID_ARG); /* with external routing */
        assert_non_null(strstr(fm_last_error(), "routed_ids"));
        BAD((a.topk_ids = NULL, a.topk_weights = NULL, a.routed_ids = rid), FM_ERR_INVALID_ARG); /* one of two */
        BAD((a.topk_ids = NULL, a.topk_weights = NULL, a.routed_weights = rw), FM_ERR_INVALID_ARG);
        BAD((a.topk_ids = NULL, a.topk_weights = NULL, a.routed_ids = (int32_t *)((char *)rid + 2), a.routed_weights = rw),
            FM_ERR_MISALIGNED);
        assert_memory_equal(rid, rid0, sizeof(int32_t) * T * K);
        assert_memory_equal(rw, rid0, sizeof(float) * T * K);
        free(rid), free(rid0), free(rw);
    }
    x[5] = sx;
#undef BAD
    /* a misaligned out: refused before anything is written */
    a = good;
    a.out = out + 1;
    assert_int_equal(fm_layer_run(l, &a), FM_ERR_MISALIGNED);
    assert_int_equal(fm_layer_errors(l, NULL, NULL), FM_OK); /* the CPU defers nothing */
    { /* fm_layer_plan: a CPU layer has no tiles; the arguments are checked first; info untouched */
        fm_layer_plan_info pi, pi0;
        memset(&pi, 0x5A, sizeof pi);
        pi0 = pi;
        assert_int_equal(fm_layer_plan(l, 1, &pi), FM_ERR_UNSUPPORTED);
        assert_non_null(strstr(fm_last_error(), "no tile plan"));
        assert_int_equal(fm_layer_plan(l, 0, &pi), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_plan(l, T + 1, &pi), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_plan(NULL, 1, &pi), FM_ERR_INVALID_ARG);
        assert_int_equal(fm_layer_plan(l, 1, NULL), FM_ERR_INVALID_ARG);
        assert_memory_equal(&pi, &pi0, sizeof pi);
        /* fm_layer_set_plan: the same checks, then no plan to replace */
        assert_int_equal(fm_layer_set_plan(l, 1, &pi), FM_ERR_UNSUPPORTED);
        assert_non_null(strstr(fm_last_error(), "no tile plan"));
        assert_int_equal(fm_layer_set_plan(l, 0, &pi), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_set_plan(l, T + 1, &pi), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_set_plan(NULL, 1, &pi), FM_ERR_INVALID_ARG);
        assert_int_equal(fm_layer_set_plan(l, 1, NULL), FM_ERR_INVALID_ARG);
        fm_layer_tune_info ti, ti0;
        memset(&ti, 0x5A, sizeof ti);
        ti0 = ti;
        assert_int_equal(fm_layer_tune(l, 1, NULL, &ti), FM_ERR_UNSUPPORTED);
        assert_non_null(strstr(fm_last_error(), "no tile plan"));
        assert_int_equal(fm_layer_tune(l, 0, NULL, &ti), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_tune(NULL, 1, NULL, &ti), FM_ERR_INVALID_ARG);
        assert_memory_equal(&ti, &ti0, sizeof ti);
    }
    fm_layer_destroy(l);

    /* caller workspace on a CPU layer: size 0, none needed */
    d.caller_workspace = 1;
    assert_int_equal(fm_layer_create_desc(&d, &cfg, &L.w, &l), FM_OK);
    assert_int_equal(fm_layer_workspace_size(l, &ws), FM_OK);
    assert_int_equal(ws, 0);
    a = good;
    assert_int_equal(fm_layer_run(l, &a), FM_OK);
    fm_layer_destroy(l);
    free(x), free(ids), free(wts), free(out), free(keep);
    fx_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_external_routing_vs_formula), cmocka_unit_test(test_gptoss_experts_vs_formula),
        cmocka_unit_test(test_internal_equals_external),
        cmocka_unit_test(test_shards_sum_to_layer),         cmocka_unit_test(test_bf16_output),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
