/* test_io_routing.c - a loaded layer's routing comes from the model (issue 19,
 * issue 15): config.json's model_type selects the family, its keys override,
 * the caller overrides per setting, and what cannot be known is an error
 * naming it. Also the gpt-oss score (softmax over the top-k logits) against a
 * hand computation. Every case writes the same small ModelOpt checkpoint with
 * a different config.json.
 */
#include "test_io_fixture.h"

static model *g_m;
static itemset *g_s;

/* The checkpoint with config.json = cfg (NULL: none) in a fresh folder. */
static const char *ckpt_with(const char *name, const char *cfg)
{
    const char *dir = subdir(name);
    write_set(dir, g_s, 1);
    if (cfg) write_text(dir, "config.json", cfg);
    return dir;
}

static fm_ckpt_layer *load_cfg(const char *cfg, const fm_ckpt_load_opts *o)
{
    return load_ok(ckpt_with("ok", cfg), LAYER, o);
}

static void load_fails(const char *cfg, const fm_ckpt_load_opts *o, fm_status want, const char *needle)
{
    const char *dir = ckpt_with("bad", cfg);
    fm_checkpoint *ck = NULL;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    fm_ckpt_layer *l = (fm_ckpt_layer *)&l; /* poisoned: must come back NULL */
    fm_status st = fm_checkpoint_load_layer(ck, LAYER, o, &l);
    if (st != want || !strstr(fm_last_error(), needle))
        fail_msg("config %s: got %s '%s', want %s with '%s'", cfg ? cfg : "(none)", fm_status_name(st), fm_last_error(),
                 fm_status_name(want), needle);
    assert_null(l);
    fm_checkpoint_close(ck);
}

static int group_setup(void **state)
{
    if (setup(state)) return -1;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    g_m = model_new(&r, FM_FORMAT_NVFP4, 0);
    g_s = calloc(1, sizeof *g_s);
    build_modelopt(g_s, g_m, LAYER);
    return 0;
}

static int group_teardown(void **state)
{
    model_free(g_m);
    free(g_s);
    return teardown(state);
}

/* The finding: a Qwen3-MoE config.json has no scoring_func / routed_scaling_factor;
 * the layer must be softmax, x1, not GLM-5's sigmoid x2.5. */
static void test_qwen3_family(void **state)
{
    (void)state;
    fm_ckpt_layer *l = load_cfg("{\"model_type\": \"qwen3_moe\", \"num_experts_per_tok\": 2}", NULL);
    assert_int_equal(l->cfg.score, FM_SCORE_SOFTMAX);
    assert_int_equal(l->cfg.renormalize, 0); /* Qwen3MoeConfig's default */
    assert_true(l->cfg.routed_scale == 1.0f);
    assert_int_equal(l->cfg.n_group, 0);
    assert_int_equal(l->cfg.top_k, 2);
    assert_string_equal(l->model_type, "qwen3_moe");
    assert_int_equal(l->route_from[FM_ROUTE_TOP_K].from, FM_ROUTE_FROM_CONFIG);
    assert_string_equal(l->route_from[FM_ROUTE_TOP_K].key, "num_experts_per_tok");
    assert_int_equal(l->route_from[FM_ROUTE_SCORE].from, FM_ROUTE_FROM_MODEL_DEFAULT);
    assert_int_equal(l->route_from[FM_ROUTE_SCALE].from, FM_ROUTE_FROM_MODEL_DEFAULT);
    fm_ckpt_layer_free(l);
    /* norm_topk_prob from the file; a routed_scaling_factor Qwen's code never reads stays 1 */
    l = load_cfg("{\"model_type\": \"qwen3_moe\", \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5}", NULL);
    assert_int_equal(l->cfg.renormalize, 1);
    assert_int_equal(l->route_from[FM_ROUTE_RENORMALIZE].from, FM_ROUTE_FROM_CONFIG);
    assert_true(l->cfg.routed_scale == 1.0f);
    assert_int_equal(l->cfg.top_k, E); /* the family's 8, clamped to the E = 4 experts loaded */
    fm_ckpt_layer_free(l);
}

static void test_other_families(void **state)
{
    (void)state;
    /* DeepSeek-V3: sigmoid, x2.5 and renormalised by default; groups from the file */
    fm_ckpt_layer *l =
        load_cfg("{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_group\": 1}", NULL);
    assert_int_equal(l->cfg.score, FM_SCORE_SIGMOID);
    assert_true(l->cfg.routed_scale == 2.5f);
    assert_int_equal(l->cfg.renormalize, 1);
    assert_int_equal(l->cfg.n_group, 2);
    assert_int_equal(l->cfg.topk_group, 1);
    assert_int_equal(l->route_from[FM_ROUTE_GROUPS].from, FM_ROUTE_FROM_CONFIG);
    assert_int_equal(l->route_from[FM_ROUTE_SCALE].from, FM_ROUTE_FROM_MODEL_DEFAULT);
    fm_ckpt_layer_free(l);
    /* n_group without topk_group: the family's topk_group; topk_method greedy: no groups */
    l = load_cfg("{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 2, \"n_group\": 4}", NULL);
    assert_true(l->cfg.n_group == 4 && l->cfg.topk_group == 4);
    fm_ckpt_layer_free(l);
    l = load_cfg("{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_method\": \"greedy\"}",
                 NULL);
    assert_int_equal(l->cfg.n_group, 0);
    assert_string_equal(l->route_from[FM_ROUTE_GROUPS].key, "topk_method");
    fm_ckpt_layer_free(l);
    /* GLM-4-MoE: x1 by default; GLM-5 (glm_moe_dsa): x2.5 */
    l = load_cfg("{\"model_type\": \"glm4_moe\", \"num_experts_per_tok\": 2}", NULL);
    assert_true(l->cfg.routed_scale == 1.0f && l->cfg.score == FM_SCORE_SIGMOID && l->cfg.n_group == 0);
    fm_ckpt_layer_free(l);
    l = load_cfg("{\"model_type\": \"glm_moe_dsa\", \"num_experts_per_tok\": 2}", NULL);
    assert_true(l->cfg.routed_scale == 2.5f && l->cfg.score == FM_SCORE_SIGMOID);
    fm_ckpt_layer_free(l);
    /* Mixtral always renormalises, whatever norm_topk_prob says */
    l = load_cfg("{\"model_type\": \"mixtral\", \"norm_topk_prob\": false}", NULL);
    assert_true(l->cfg.renormalize == 1 && l->cfg.score == FM_SCORE_SOFTMAX && l->cfg.top_k == 2);
    assert_int_equal(l->route_from[FM_ROUTE_RENORMALIZE].from, FM_ROUTE_FROM_MODEL_DEFAULT);
    fm_ckpt_layer_free(l);
    /* architectures alone, and a multimodal text_config, name the family too */
    l = load_cfg("{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"num_experts_per_tok\": 2}", NULL);
    assert_true(l->cfg.score == FM_SCORE_SOFTMAX && l->cfg.renormalize == 0);
    fm_ckpt_layer_free(l);
    l = load_cfg("{\"model_type\": \"wrapper\", \"text_config\": {\"model_type\": \"qwen3_moe\", "
                 "\"num_experts_per_tok\": 3, \"norm_topk_prob\": true}}", NULL);
    assert_true(l->cfg.top_k == 3 && l->cfg.renormalize == 1 && l->cfg.score == FM_SCORE_SOFTMAX);
    fm_ckpt_layer_free(l);
    /* an unknown model type that gives every key is read as it says; no n_group = no groups */
    l = load_cfg(k_config, NULL);
    assert_true(l->cfg.top_k == 2 && l->cfg.score == FM_SCORE_SIGMOID && l->cfg.routed_scale == 2.5f);
    fm_ckpt_layer_free(l);
    l = load_cfg("{\"model_type\": \"new_moe\", \"num_experts_per_tok\": 2, \"scoring_func\": \"softmax\", "
                 "\"norm_topk_prob\": false, \"routed_scaling_factor\": 1.5}", NULL);
    assert_true(l->cfg.n_group == 0 && l->cfg.routed_scale == 1.5f);
    assert_int_equal(l->route_from[FM_ROUTE_GROUPS].from, FM_ROUTE_FROM_ABSENT);
    fm_ckpt_layer_free(l);
}

/* Never a silent default (issue 15's findings among them). */
static void test_errors(void **state)
{
    (void)state;
    load_fails(NULL, NULL, FM_ERR_NOT_FOUND, "no config.json");
    load_fails("{\"model_type\": \"qwen3_moe\", ", NULL, FM_ERR_FORMAT, "not valid JSON");
    load_fails("[1, 2]", NULL, FM_ERR_FORMAT, "not a JSON object");
    load_fails("{\"model_type\": \"deepseek_v3\", \"scoring_func\": \"sigmod\"}", NULL, FM_ERR_UNSUPPORTED,
               "scoring_func \"sigmod\"");
    load_fails("{\"model_type\": \"deepseek_v2\", \"topk_method\": \"group_limited_greedy\"}", NULL, FM_ERR_UNSUPPORTED,
               "topk_method \"group_limited_greedy\"");
    load_fails("{\"model_type\": \"qwen3_moe\", \"num_experts_per_tok\": \"8\"}", NULL, FM_ERR_FORMAT,
               "\"num_experts_per_tok\" must be an integer");
    load_fails("{\"model_type\": \"qwen3_moe\", \"num_experts_per_tok\": 2.5}", NULL, FM_ERR_FORMAT, "num_experts_per_tok");
    load_fails("{\"model_type\": \"qwen3_moe\", \"norm_topk_prob\": 1}", NULL, FM_ERR_FORMAT, "norm_topk_prob");
    load_fails("{\"model_type\": \"glm4_moe\", \"routed_scaling_factor\": -1}", NULL, FM_ERR_FORMAT,
               "routed_scaling_factor");
    /* fuzz_config's finding (2026-12-03): > 0 as a double, 0 as the float the layer keeps */
    load_fails("{\"model_type\": \"glm4_moe\", \"routed_scaling_factor\": 1e-65}", NULL, FM_ERR_FORMAT,
               "routed_scaling_factor");
    load_fails("{\"model_type\": \"new_moe\", \"num_experts_per_tok\": 2}", NULL, FM_ERR_UNSUPPORTED,
               "score (scoring_func), renormalize (norm_topk_prob), routed_scale (routed_scaling_factor)");
    load_fails("{\"model_type\": \"new_moe\", \"num_experts_per_tok\": 2}", NULL, FM_ERR_UNSUPPORTED, "\"new_moe\"");
    load_fails("{\"model_type\": \"qwen3_moe\", \"quantization_config\": {\"quant_method\": \"fp8\"}}", NULL,
               FM_ERR_UNSUPPORTED, "unsupported format: config.json quantization_config quant_method \"fp8\"");
    load_fails("{\"model_type\": \"qwen3_moe\", \"quantization_config\": {\"quant_method\": \"compressed-tensors\", "
               "\"format\": \"pack-quantized\"}}", NULL, FM_ERR_UNSUPPORTED, "format \"pack-quantized\"");
    load_fails("{\"model_type\": \"qwen3_moe\", \"quantization_config\": {\"quant_method\": \"modelopt\", "
               "\"quant_algo\": \"FP8\"}}", NULL, FM_ERR_UNSUPPORTED, "quant_algo \"FP8\"");
    fm_ckpt_layer_free(load_cfg("{\"model_type\": \"qwen3_moe\", \"quantization_config\": {\"quant_method\": "
                                "\"modelopt\", \"quant_algo\": \"NVFP4\"}}", NULL));
    fm_moe_config rt = g_m->cfg;
    fm_ckpt_load_opts o = {.routing = &rt, .routing_fields = 1u << FM_ROUTE_N};
    load_fails(k_config, &o, FM_ERR_INVALID_ARG, "routing_fields");
}

/* The caller's settings: all of them (a model fp4moe does not know), or some. */
static void test_caller_overrides(void **state)
{
    (void)state;
    fm_moe_config rt = g_m->cfg;
    rt.top_k = 3;
    rt.score = FM_SCORE_SOFTMAX;
    rt.renormalize = 0;
    rt.routed_scale = 1.25f;
    rt.n_group = 0;
    fm_ckpt_load_opts o = {.routing = &rt};
    fm_ckpt_layer *l = load_ok(ckpt_with("none", NULL), LAYER, &o); /* no config.json: all given */
    assert_true(l->cfg.top_k == 3 && l->cfg.score == FM_SCORE_SOFTMAX && l->cfg.routed_scale == 1.25f);
    for (int i = 0; i < FM_ROUTE_N; i++) assert_int_equal(l->route_from[i].from, FM_ROUTE_FROM_CALLER);
    fm_ckpt_layer_free(l);
    o.routing_fields = 1u << FM_ROUTE_TOP_K; /* only top_k: the rest from qwen3_moe */
    l = load_cfg("{\"model_type\": \"qwen3_moe\"}", &o);
    assert_true(l->cfg.top_k == 3 && l->cfg.score == FM_SCORE_SOFTMAX && l->cfg.routed_scale == 1.0f);
    assert_int_equal(l->route_from[FM_ROUTE_TOP_K].from, FM_ROUTE_FROM_CALLER);
    assert_int_equal(l->route_from[FM_ROUTE_SCALE].from, FM_ROUTE_FROM_MODEL_DEFAULT);
    fm_ckpt_layer_free(l);
    /* only top_k with no config.json: the others are named as missing */
    load_fails(NULL, &o, FM_ERR_NOT_FOUND, "missing: score (scoring_func)");
}

/* FM_SCORE_SOFTMAX_TOPK: top-k of logits + bias, softmax over those k only. */
static void test_softmax_topk_route(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x70c);
    enum { NE = 8, K = 3, TT = 5 };
    fm_moe_config c;
    fm_moe_config_default(&c);
    c.n_experts = NE, c.top_k = K, c.hidden = 64, c.inter = 64, c.score = FM_SCORE_SOFTMAX_TOPK;
    c.routed_scale = 1.5f;
    c.renormalize = 0; /* softmax over the k sums to 1 whatever renormalize says */
    float logits[TT * NE], bias[NE], w[TT * K];
    int32_t ids[TT * K];
    for (int i = 0; i < TT * NE; i++) logits[i] = 3.0f * fm_rng_normal(&r);
    for (int e = 0; e < NE; e++) bias[e] = fm_rng_normal(&r);
    fm_poison_f32(w, TT * K);
    assert_int_equal(fm_moe_route(&c, bias, logits, TT, ids, w), FM_OK);
    assert_int_equal(fm_first_nonfinite(w, TT * K), -1);
    for (int t = 0; t < TT; t++) {
        double z[NE], sum = 0;
        int used[NE] = {0};
        for (int e = 0; e < NE; e++) z[e] = (double)logits[t * NE + e] + bias[e];
        for (int j = 0; j < K; j++) { /* the oracle: selection in double, by the biased logit */
            int b = -1;
            for (int e = 0; e < NE; e++)
                if (!used[e] && (b < 0 || z[e] > z[b])) b = e;
            used[b] = 1;
            assert_int_equal(ids[t * K + j], b);
            sum += exp(z[b] - z[ids[t * K]]);
        }
        for (int j = 0; j < K; j++) {
            double want = 1.5 * exp(z[ids[t * K + j]] - z[ids[t * K]]) / sum;
            if (fabs(w[t * K + j] - want) > 1e-6 * want + 1e-7)
                fail_msg("token %d slot %d: weight %.9g, want %.9g", t, j, (double)w[t * K + j], want);
        }
    }
    /* a logit + bias that overflows is refused, not turned into NaN weights */
    bias[0] = 3e38f;
    logits[0] = 3e38f;
    assert_int_equal(fm_moe_route(&c, bias, logits, 1, ids, w), FM_ERR_NONFINITE);
    assert_string_equal(fm_score_name(FM_SCORE_SOFTMAX_TOPK), "softmax-topk");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_family),   cmocka_unit_test(test_other_families),
        cmocka_unit_test(test_errors),         cmocka_unit_test(test_caller_overrides),
        cmocka_unit_test(test_softmax_topk_route),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
