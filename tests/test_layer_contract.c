/* test_layer_contract.c - one contract every backend of the layer is held to, against the
 * oracle (the cpu-ref backend) with the bound of the accuracy table (fm_layer_accuracy):
 * every backend compiled into this build and available here runs the same cases, so a new
 * backend (or this build's cuda one, on a machine with a GPU) meets them without a test of
 * its own. Label cpu: without a GPU the cuda backend is reported absent and only the CPU
 * backends run; with one, it runs too.
 *
 * Per case: a random layer (router, experts, optional shared expert / router bias / gpt-oss
 * experts), fresh random BF16 inputs, the output poisoned with NaN before the run, then
 *   1. fm_layer_supports answers as fm_layer_create_desc does (same status); a refusal
 *      ends the case there (the backend does not run this configuration, and says so);
 *   2. NaN/Inf first, then NMSE against cpu-ref <= fm_layer_accuracy(backend, cfg);
 *   3. a second forward of the same input is bit-identical (no state leaks between runs);
 *   4. an expert shard's partial sums over 2 shards add up to the whole layer (1e-11 on
 *      top of the bound, the FP32 order of the sum);
 *   5. a NaN in x is FM_ERR_NONFINITE with out untouched (host forward: checked on entry).
 * Through fm_layer_forward (host pointers, internal routing, FP32 out), the call every
 * backend takes the same way. */
#include "test_moe_fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    fm_format   fmt;
    int         E, K, H, I, shared;
    fm_score_func score;
    int         n_group, topk_group, bias, act_nvfp4, gptoss;
    fm_act_fp8  act_fp8;
} contract_case;

static const contract_case k_cases[] = {
    {"GLM-like: sigmoid, bias, groups, NVFP4", FM_FORMAT_NVFP4, 16, 4, 128, 64, 0, FM_SCORE_SIGMOID, 4, 2, 1, 0, 0, 0},
    {"Qwen-like: softmax, MXFP4", FM_FORMAT_MXFP4, 8, 2, 128, 64, 0, FM_SCORE_SOFTMAX, 0, 0, 0, 0, 0, 0},
    {"DeepSeek-like: shared expert", FM_FORMAT_NVFP4, 8, 2, 128, 64, 64, FM_SCORE_SIGMOID, 0, 0, 1, 0, 0, 0},
    {"gpt-oss-like: softmax-topk, clamped SwiGLU, biases", FM_FORMAT_MXFP4, 8, 2, 128, 64, 0, FM_SCORE_SOFTMAX_TOPK,
     0, 0, 1, 0, 1, 0},
    {"W4A4: NVFP4 activations", FM_FORMAT_NVFP4, 8, 2, 128, 64, 0, FM_SCORE_SOFTMAX, 0, 0, 0, 1, 0, 0},
    {"W4A8: FP8 activations per 128", FM_FORMAT_NVFP4, 8, 2, 256, 128, 0, FM_SCORE_SOFTMAX, 0, 0, 0, 0, 0,
     FM_ACT_FP8_BLOCK128},
    {"W4A8 per token, gpt-oss-like: MXFP4, biases, clamped SwiGLU", FM_FORMAT_MXFP4, 8, 2, 128, 64, 0,
     FM_SCORE_SOFTMAX_TOPK, 0, 0, 1, 0, 1, FM_ACT_FP8_TOKEN},
    {"W4A8 per 128 with a shared expert, sigmoid, bias", FM_FORMAT_NVFP4, 8, 2, 128, 64, 64, FM_SCORE_SIGMOID, 0, 0,
     1, 0, 0, FM_ACT_FP8_BLOCK128},
};

static const fm_backend_kind k_backends[] = {FM_BACKEND_CPU, FM_BACKEND_CUDA};

typedef struct {
    fx_layer L;
    float   *b13, *b2;
} built;

static void build(const contract_case *c, fm_rng *r, built *b)
{
    fm_moe_config cfg = fx_config(c->E, c->K, c->H, c->I, c->fmt);
    cfg.score = c->score;
    cfg.n_group = c->n_group;
    cfg.topk_group = c->topk_group;
    cfg.shared_inter = c->shared;
    cfg.act_nvfp4 = c->act_nvfp4;
    cfg.act_fp8 = c->act_fp8;
    if (c->score == FM_SCORE_SIGMOID) cfg.routed_scale = 2.5f;
    if (c->gptoss) cfg.activation = FM_ACT_SWIGLU_GPTOSS, cfg.swiglu_limit = 7.0f;
    assert_int_equal(fm_moe_config_check(&cfg), FM_OK);
    memset(b, 0, sizeof *b);
    fx_build(&b->L, &cfg, r, c->bias, 0);
    if (c->gptoss) {
        b->b13 = malloc(sizeof(float) * c->E * 2 * c->I);
        b->b2 = malloc(sizeof(float) * c->E * c->H);
        assert_true(b->b13 && b->b2);
        for (int i = 0; i < c->E * 2 * c->I; i++) b->b13[i] = 0.2f * fm_rng_normal(r);
        for (int i = 0; i < c->E * c->H; i++) b->b2[i] = 0.2f * fm_rng_normal(r);
        b->L.w.w13_bias = b->b13, b->L.w.w2_bias = b->b2;
    }
}

static unsigned features_of(const fm_moe_weights *w)
{
    return (w->w13_bias ? FM_FEATURE_EXPERT_BIAS : 0u) | (w->router_bias ? FM_FEATURE_ROUTER_BIAS : 0u) |
           (w->a1_scale ? FM_FEATURE_A_SCALE : 0u);
}

/* The shard [first, first + n) of b's layer on backend k (weights of those experts only). */
static fm_status make(fm_backend_kind k, const built *b, int T, int first, int n, fm_layer **out)
{
    fm_moe_weights w = b->L.w;
    w.w13 = b->L.w13 + first;
    w.w2 = b->L.w2 + first;
    if (w.w13_bias) w.w13_bias += (size_t)first * 2 * b->L.cfg.inter;
    if (w.w2_bias) w.w2_bias += (size_t)first * b->L.cfg.hidden;
    fm_layer_desc d = {.backend = k, .max_tokens = T, .first_expert = first, .n_local = n};
    return fm_layer_create_desc(&d, &b->L.cfg, &w, out);
}

static void run_case(fm_backend_kind k, const contract_case *c, fm_rng *r)
{
    const int T = fx_asan() ? 3 : 9, H = c->H;
    built     b;
    build(c, r, &b);
    const fm_moe_config *cfg = &b.L.cfg;

    fm_layer_desc d = {.backend = k, .max_tokens = T};
    char          why[512];
    fm_status     sup = fm_layer_supports(&d, cfg, features_of(&b.L.w), why, sizeof why);
    fm_layer     *l = NULL;
    fm_status     cr = make(k, &b, T, 0, c->E, &l);
    if (sup != cr)
        fail_msg("%s, %s: fm_layer_supports says %s (%s), create says %s (%s)", fm_backend_name(k), c->name,
                 fm_status_name(sup), why, fm_status_name(cr), fm_last_error());
    if (cr != FM_OK) {
        print_message("# %s, %s: not run by this backend: %s\n", fm_backend_name(k), c->name, why);
        assert_null(l);
        free(b.b13), free(b.b2);
        fx_free(&b.L);
        return;
    }
    fm_layer *ref = NULL;
    assert_int_equal(make(FM_BACKEND_CPU_REF, &b, T, 0, c->E, &ref), FM_OK);
    uint16_t *x = fx_bf16(r, (size_t)T * H, 1.0f);
    float    *want = malloc(sizeof(float) * T * H), *got = malloc(sizeof(float) * T * H);
    float    *again = malloc(sizeof(float) * T * H), *sum = malloc(sizeof(float) * T * H);
    assert_true(want && got && again && sum);
    fm_poison_f32(want, (size_t)T * H);
    assert_int_equal(fm_layer_forward(ref, x, T, want, NULL), FM_OK);

    /* 2. against the oracle with the table's bound */
    fm_poison_f32(got, (size_t)T * H);
    fm_status s = fm_layer_forward(l, x, T, got, NULL);
    if (s != FM_OK) fail_msg("%s, %s: forward %s: %s", fm_backend_name(k), c->name, fm_status_name(s), fm_last_error());
    double bound = -1;
    assert_int_equal(fm_layer_accuracy(k, cfg, &bound), FM_OK);
    char what[192];
    snprintf(what, sizeof what, "%s, %s, vs cpu-ref", fm_backend_name(k), c->name);
    fm_assert_close(got, want, (size_t)T * H, bound, what);

    /* 3. the same input again: the same bits */
    fm_poison_f32(again, (size_t)T * H);
    assert_int_equal(fm_layer_forward(l, x, T, again, NULL), FM_OK);
    if (memcmp(got, again, sizeof(float) * T * H)) fail_msg("%s: a second forward differs", what);

    /* 4. two shards' partial sums add up to the layer */
    const int half = c->E / 2;
    for (int q = 0; q < 2; q++) {
        fm_layer *sh = NULL;
        assert_int_equal(make(k, &b, T, q * half, half, &sh), FM_OK);
        fm_poison_f32(again, (size_t)T * H);
        assert_int_equal(fm_layer_forward(sh, x, T, again, NULL), FM_OK);
        for (int i = 0; i < T * H; i++) sum[i] = q ? sum[i] + again[i] : again[i];
        fm_layer_destroy(sh);
    }
    snprintf(what, sizeof what, "%s, %s, 2 shards summed vs the layer", fm_backend_name(k), c->name);
    fm_assert_close(sum, got, (size_t)T * H, 1e-11 + (k == FM_BACKEND_CPU ? 0.0 : bound), what);

    /* 5. a NaN in x: refused, out untouched */
    x[H + 3] = 0x7fc0;
    fm_poison_bytes(again, sizeof(float) * T * H);
    memcpy(sum, again, sizeof(float) * T * H);
    assert_int_equal(fm_layer_forward(l, x, T, again, NULL), FM_ERR_NONFINITE);
    assert_memory_equal(again, sum, sizeof(float) * T * H);

    fm_layer_destroy(l);
    fm_layer_destroy(ref);
    free(x), free(want), free(got), free(again), free(sum), free(b.b13), free(b.b2);
    fx_free(&b.L);
}

static void test_contract(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xc0de);
    int ran = 0;
    for (size_t i = 0; i < sizeof k_backends / sizeof k_backends[0]; i++) {
        fm_backend_kind k = k_backends[i];
        if (fm_backend_available(k) != FM_OK) {
            print_message("# %s: not available here (%s): not run\n", fm_backend_name(k), fm_last_error());
            continue;
        }
        for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++) run_case(k, &k_cases[c], &r);
        ran++;
    }
    assert_true(ran >= 1); /* the cpu backend is always there */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_contract)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
