/* test_io_ct.c - compressed-tensors NVFP4 ("nvfp4-pack-quantized", written by
 * llmcompressor): the same quantized layer written in the ModelOpt layout and
 * in the compressed-tensors one (weight_packed, weight_scale,
 * weight_global_scale = 1 / weight_scale_2, input_global_scale = 1 /
 * input_scale; W4A16 without input scales) must load to the same bytes, with
 * the global scales converted by the documented rule (one FP32 division), and
 * the cases fp4moe cannot read must say "unsupported format". The CLI side
 * (`fp4moe inspect` naming the layout) is in tests/io.cmake on --write-sample.
 */
#include "test_io_fixture.h"

static const char *k_ct_config =
    "{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_group\": 1,"
    " \"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"nvfp4-pack-quantized\"}}";

static float g_recip[MAXI]; /* the reciprocal scales the renamed items point at */

/* Rename a ModelOpt item set into compressed-tensors names, storing 1/x for the
 * global and input scales (a16: drop the input scales). */
static void to_ct(itemset *s, int a16)
{
    for (int i = 0; i < s->n; i++) {
        char *nm = s->names[i];
        size_t n = strlen(nm);
        if (!strstr(nm, "experts")) continue;
        if (n > 7 && !strcmp(nm + n - 7, ".weight") && s->it[i].dtype == FM_DTYPE_U8) { /* BF16 stays .weight */
            strcat(nm, "_packed");
        } else if (n > 15 && !strcmp(nm + n - 15, ".weight_scale_2")) {
            strcpy(nm + n - 15, ".weight_global_scale");
            g_recip[i] = 1.0f / *(const float *)s->it[i].data;
            s->it[i].data = &g_recip[i];
        } else if (n > 12 && !strcmp(nm + n - 12, ".input_scale")) {
            if (a16) {
                remove_item(s, nm);
                i--;
                continue;
            }
            strcpy(nm + n - 12, ".input_global_scale");
            g_recip[i] = 1.0f / *(const float *)s->it[i].data;
            s->it[i].data = &g_recip[i];
        }
    }
}

/* The layer in both layouts; returns the compressed-tensors load. */
static fm_ckpt_layer *load_ct(const model *m, int a16, fm_ckpt_layer **modelopt)
{
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("mo");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config);
    *modelopt = load_ok(dir, LAYER, NULL);
    to_ct(s, a16);
    dir = subdir(a16 ? "ct16" : "ct");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_ct_config);
    fm_ckpt_layer *l = load_ok(dir, LAYER, NULL);
    free(s);
    return l;
}

static void expect_same_experts(const fm_ckpt_layer *ct, const fm_ckpt_layer *mo)
{
    assert_int_equal(ct->layout, FM_LAYOUT_COMPRESSED_TENSORS);
    assert_int_equal(ct->cfg.wfmt, FM_FORMAT_NVFP4);
    assert_int_equal(ct->cfg.n_experts, mo->cfg.n_experts);
    for (int e = 0; e < E; e++) {
        const fm_qtensor *q[2] = {&ct->w13[e], &ct->w2[e]}, *r[2] = {&mo->w13[e], &mo->w2[e]};
        for (int k = 0; k < 2; k++) {
            size_t db, sb;
            assert_int_equal(fm_qtensor_bytes(q[k]->fmt, q[k]->rows, q[k]->cols, &db, &sb), FM_OK);
            assert_memory_equal(q[k]->data, r[k]->data, db); /* the packed values are ModelOpt's */
            assert_memory_equal(q[k]->scales, r[k]->scales, sb);
            /* the documented conversion, exactly: weight_scale_2 = fl(1 / weight_global_scale) */
            float stored = 1.0f / r[k]->global_scale;
            assert_true(q[k]->global_scale == 1.0f / stored);
            /* ... which is the ModelOpt value itself or its neighbour (two roundings) */
            assert_true(fabsf(q[k]->global_scale - r[k]->global_scale) <= 2.4e-7f * r[k]->global_scale);
        }
    }
    assert_memory_equal(ct->router_w, mo->router_w, sizeof(float) * E * H);
    assert_memory_equal(ct->router_bias, mo->router_bias, sizeof(float) * E);
    assert_memory_equal(ct->shared_w13, mo->shared_w13, sizeof(uint16_t) * 2 * SI * H);
}

static void test_ct_w4a4(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    fm_ckpt_layer *mo, *ct = load_ct(m, 0, &mo);
    expect_same_experts(ct, mo);
    assert_int_equal(ct->has_input_scales, 1);
    for (int e = 0; e < E; e++) {
        assert_true(ct->a1_scale[e] == 1.0f / (1.0f / mo->a1_scale[e]));
        assert_true(ct->a2_scale[e] == 1.0f / (1.0f / mo->a2_scale[e]));
    }
    /* the layer runs: the CT load against the ModelOpt load of the same data, W4A16
     * numerics (global scales differ by at most one ulp: bound 1e-12 NMSE) */
    uint16_t x[T * H];
    float *o0 = malloc(sizeof(float) * T * H), *o1 = malloc(sizeof(float) * T * H);
    for (int i = 0; i < T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(&r));
    fm_poison_f32(o0, T * H);
    fm_poison_f32(o1, T * H);
    assert_int_equal(fm_moe_forward_ref(&mo->cfg, &mo->w, x, T, o0), FM_OK);
    assert_int_equal(fm_moe_forward_ref(&ct->cfg, &ct->w, x, T, o1), FM_OK);
    assert_int_equal(fm_first_nonfinite(o1, T * H), -1);
    fm_assert_close(o1, o0, T * H, 1e-12, "compressed-tensors vs modelopt layer");
    free(o0);
    free(o1);
    fm_ckpt_layer_free(ct);
    fm_ckpt_layer_free(mo);
    model_free(m);
}

static void test_ct_w4a16(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xa16);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    fm_ckpt_layer *mo, *ct = load_ct(m, 1, &mo);
    expect_same_experts(ct, mo);
    assert_int_equal(ct->has_input_scales, 0);
    assert_null(ct->a1_scale);
    assert_null(ct->a2_scale);
    fm_ckpt_layer_free(ct);
    fm_ckpt_layer_free(mo);
    model_free(m);
}

static void expect_fail(const char *dir, fm_status want, const char *needle)
{
    fm_checkpoint *ck = NULL;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    fm_ckpt_layer *l = (fm_ckpt_layer *)&l;
    fm_status st = fm_checkpoint_load_layer(ck, LAYER, NULL, &l);
    if (st != want || !strstr(fm_last_error(), needle))
        fail_msg("%s: got %s '%s', want %s with '%s'", dir, fm_status_name(st), fm_last_error(), fm_status_name(want),
                 needle);
    assert_null(l);
    fm_checkpoint_close(ck);
}

static void test_ct_errors(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xbad);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    to_ct(s, 0);
    char nm[128];
    /* a missing global scale is named */
    itemset *t = calloc(1, sizeof *t);
    *t = *s;
    for (int i = 0; i < t->n; i++) t->it[i].name = t->names[i];
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.2.up_proj.weight_global_scale", LAYER);
    remove_item(t, nm);
    const char *dir = subdir("noglobal");
    write_set(dir, t, 1);
    write_text(dir, "config.json", k_ct_config);
    expect_fail(dir, FM_ERR_NOT_FOUND, nm);
    /* a zero weight_global_scale (whose reciprocal is Inf) */
    *t = *s;
    for (int i = 0; i < t->n; i++) t->it[i].name = t->names[i];
    static const float zero = 0.0f;
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.1.down_proj.weight_global_scale", LAYER);
    t->it[find_item(t, nm)].data = &zero;
    dir = subdir("zeroglobal");
    write_set(dir, t, 1);
    write_text(dir, "config.json", k_ct_config);
    expect_fail(dir, FM_ERR_NONFINITE, nm);
    /* a compressed-tensors format fp4moe does not read */
    dir = subdir("int4");
    write_set(dir, s, 1);
    write_text(dir, "config.json",
               "{\"model_type\": \"deepseek_v3\", \"quantization_config\": {\"quant_method\": \"compressed-tensors\","
               " \"format\": \"mixed-precision\", \"config_groups\": {\"g0\": {\"format\": \"nvfp4-pack-quantized\"},"
               " \"g1\": {\"format\": \"pack-quantized\"}}}}");
    expect_fail(dir, FM_ERR_UNSUPPORTED, "unsupported format");
    /* mixed-precision whose groups are all nvfp4 is read */
    write_text(dir, "config.json",
               "{\"model_type\": \"deepseek_v3\", \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_group\": 1, \"quantization_config\": "
               "{\"quant_method\": \"compressed-tensors\", \"format\": \"mixed-precision\", \"config_groups\": "
               "{\"g0\": {\"format\": \"nvfp4-pack-quantized\"}}}}");
    fm_ckpt_layer_free(load_ok(dir, LAYER, NULL));
    free(t);
    free(s);
    model_free(m);
}

/* An NVFP4 shared expert in compressed-tensors names loads as the ModelOpt one
 * (global scales powers of two, so 1/gs is exact and the BF16 results equal). */
static void test_ct_shared_nvfp4(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x5a5);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    static const float g = 0.25f, gs = 4.0f;
    fm_qtensor q[3];
    uint8_t *bufs[3][2];
    itemset *s[2] = {calloc(1, sizeof(itemset)), calloc(1, sizeof(itemset))};
    for (int k = 0; k < 2; k++) build_modelopt(s[k], m, LAYER);
    char nm[160];
    for (int p = 0; p < 3; p++) {
        quantize_into(&r, FM_FORMAT_NVFP4, p < 2 ? SI : H, p < 2 ? H : SI, &q[p], bufs[p]);
        for (int k = 0; k < 2; k++) { /* k = 0 ModelOpt, 1 compressed-tensors */
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.weight", LAYER, proj[p]);
            remove_item(s[k], nm);
            if (k) strcat(nm, "_packed");
            add(s[k], 1, nm, FM_DTYPE_U8, 2, q[p].rows, q[p].cols / 2, 0, 0, q[p].data);
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.weight_scale", LAYER, proj[p]);
            add(s[k], 1, nm, FM_DTYPE_F8_E4M3, 2, q[p].rows, q[p].cols / 16, 0, 0, q[p].scales);
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.%s", LAYER, proj[p],
                     k ? "weight_global_scale" : "weight_scale_2");
            add(s[k], 1, nm, FM_DTYPE_F32, 0, 0, 0, 0, 0, k ? &gs : &g);
        }
    }
    to_ct(s[1], 0);
    const char *dir = subdir("sh_mo");
    write_set(dir, s[0], 1);
    write_text(dir, "config.json", k_config);
    fm_ckpt_layer *mo = load_ok(dir, LAYER, NULL);
    dir = subdir("sh_ct");
    write_set(dir, s[1], 1);
    write_text(dir, "config.json", k_ct_config);
    fm_ckpt_layer *ct = load_ok(dir, LAYER, NULL);
    assert_int_equal(ct->cfg.shared_inter, SI);
    assert_memory_equal(ct->shared_w13, mo->shared_w13, sizeof(uint16_t) * 2 * SI * H);
    assert_memory_equal(ct->shared_w2, mo->shared_w2, sizeof(uint16_t) * H * SI);
    int nonzero = 0;
    for (int i = 0; i < 2 * SI * H; i++) nonzero += (ct->shared_w13[i] & 0x7fff) != 0;
    assert_true(nonzero > SI * H); /* a vacuous all-zero expert would compare equal too */
    fm_ckpt_layer_free(ct);
    fm_ckpt_layer_free(mo);
    for (int p = 0; p < 3; p++) free(bufs[p][0]), free(bufs[p][1]);
    free(s[0]);
    free(s[1]);
    model_free(m);
}

/* `test_io_ct --write-sample DIR`: DIR/ct16, a W4A16 compressed-tensors checkpoint
 * (for inspect in tests/io.cmake), and DIR/gptq, expert tensors of a format
 * fp4moe does not read. */
static int write_sample(const char *dir)
{
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    fm_rng r;
    fm_rng_init(&r, 2);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    to_ct(s, 1);
    const char *d = subdir("ct16");
    write_set(d, s, 1);
    write_text(d, "config.json", k_ct_config);
    memset(s, 0, sizeof *s);
    static const int32_t q[64];
    add(s, 0, "model.layers.1.mlp.experts.0.gate_proj.qweight", FM_DTYPE_I32, 2, 8, 8, 0, 0, q);
    add(s, 0, "model.layers.1.mlp.gate.weight", FM_DTYPE_I32, 2, 8, 8, 0, 0, q);
    add(s, 1, "model.layers.1.mlp.experts.0.up_proj.qweight", FM_DTYPE_I32, 2, 8, 8, 0, 0, q);
    write_set(subdir("gptq"), s, 0);
    free(s);
    model_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-sample")) return write_sample(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ct_w4a4),
        cmocka_unit_test(test_ct_w4a16),
        cmocka_unit_test(test_ct_errors),
        cmocka_unit_test(test_ct_shared_nvfp4),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
