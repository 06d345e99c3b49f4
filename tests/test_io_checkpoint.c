/* test_io_checkpoint.c - checkpoints end to end: quantize random weights with
 * fm_quantize, write them in the ModelOpt layout over two shards with a
 * model.safetensors.index.json (and in the gpt-oss MXFP4 layout), load the
 * layer back and require bit-identical tensors and a bit-identical
 * fm_moe_forward_ref output (same inputs, same code: any difference is a
 * loading bug). Bad checkpoints are in test_io_load_errors.c.
 */
#include "test_io_fixture.h"

static void test_modelopt_round_trip(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    build_modelopt(s, m, 3); /* a second MoE layer */
    const char *dir = subdir("modelopt");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config);

    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    assert_int_equal(fm_checkpoint_file_count(ck), 2);
    assert_int_equal(fm_checkpoint_tensor_count(ck), (size_t)s->n);
    fm_ckpt_scan sc;
    assert_int_equal(fm_checkpoint_scan(ck, NULL, &sc), FM_OK);
    assert_int_equal(sc.layout, FM_LAYOUT_MODELOPT);
    assert_int_equal(sc.wfmt, FM_FORMAT_NVFP4);
    assert_int_equal(sc.n_layers, 2);
    assert_int_equal(sc.layers[0], LAYER);
    assert_int_equal(sc.layers[1], 3);
    assert_int_equal(sc.experts[0], E);
    assert_int_equal(sc.found[1], E);
    fm_ckpt_scan_free(&sc);
    fm_checkpoint_close(ck);

    fm_ckpt_load_opts o = {.swizzle_scales = 1};
    fm_ckpt_layer *l = load_ok(dir, LAYER, &o);
    assert_int_equal(l->layout, FM_LAYOUT_MODELOPT);
    assert_int_equal(l->cfg.n_experts, E);
    assert_int_equal(l->cfg.hidden, H);
    assert_int_equal(l->cfg.inter, I);
    assert_int_equal(l->cfg.shared_inter, SI);
    assert_int_equal(l->cfg.top_k, 2);
    assert_int_equal(l->cfg.n_group, 2);
    assert_int_equal(l->cfg.topk_group, 1);
    assert_int_equal(l->cfg.score, FM_SCORE_SIGMOID);
    assert_true(l->cfg.routed_scale == 2.5f);
    assert_int_equal(l->w13_split_globals, 0);
    assert_null(l->w13_up_global); /* gate and up globals agree: one global per w13, as before */
    assert_null(l->w.w13_up_global);
    for (int e = 0; e < E; e++) {
        assert_qtensor_equal(&l->w13[e], &m->w13[e]);
        assert_qtensor_equal(&l->w2[e], &m->w2[e]);
        assert_true(l->a1_scale[e] == m->a1[e] && l->a2_scale[e] == m->a2[e]);
        size_t n13 = fm_sf_swizzled_bytes(2 * I, H / 16), n2 = fm_sf_swizzled_bytes(H, I / 16);
        uint8_t *sw = malloc(n13 > n2 ? n13 : n2);
        assert_int_equal(fm_sf_swizzle(m->w13[e].scales, 2 * I, H / 16, sw), FM_OK);
        assert_memory_equal(l->w13_sf_swizzled[e], sw, n13);
        assert_int_equal(fm_sf_swizzle(m->w2[e].scales, H, I / 16, sw), FM_OK);
        assert_memory_equal(l->w2_sf_swizzled[e], sw, n2);
        free(sw);
    }
    assert_memory_equal(l->router_w, m->router_w, sizeof m->router_w);
    assert_memory_equal(l->router_bias, m->bias, sizeof m->bias);
    assert_memory_equal(l->shared_w13, m->sh13, sizeof m->sh13);
    assert_memory_equal(l->shared_w2, m->sh2, sizeof m->sh2);
    assert_same_output(&r, &m->cfg, &m->w, &l->cfg, &l->w);

    /* The layer API accepts it as loaded. */
    fm_layer *layer = NULL;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU_REF, &l->cfg, &l->w, T, &layer), FM_OK);
    fm_layer_destroy(layer);

    /* Validation only: the same configuration, no weights. */
    o = (fm_ckpt_load_opts){.validate_only = 1};
    fm_ckpt_layer *v = load_ok(dir, LAYER, &o);
    assert_memory_equal(&v->cfg, &l->cfg, sizeof v->cfg);
    assert_true(v->has_router_bias && v->has_input_scales);
    assert_null(v->w13);
    assert_null(v->router_w);
    assert_null(v->shared_w13);
    fm_ckpt_layer_free(v);
    fm_ckpt_layer_free(l);

    /* The index file itself, and an EP shard of experts [2, 4). */
    char ip[400];
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir);
    o = (fm_ckpt_load_opts){.first_expert = 2, .n_experts = 2};
    l = load_ok(ip, LAYER, &o);
    assert_int_equal(l->cfg.n_experts, 2);
    assert_int_equal(l->cfg.n_group, 0); /* groups span all experts: dropped on a shard */
    assert_null(l->w13_sf_swizzled);
    for (int e = 0; e < 2; e++) assert_qtensor_equal(&l->w13[e], &m->w13[2 + e]);
    assert_memory_equal(l->router_w, m->router_w + 2 * H, 2 * H * sizeof(float));
    assert_memory_equal(l->router_bias, m->bias + 2, 2 * sizeof(float));
    fm_ckpt_layer_free(l);

    /* Explicit routing settings override config.json. */
    fm_moe_config rt = m->cfg;
    rt.top_k = 3;
    rt.n_group = 0;
    rt.score = FM_SCORE_SOFTMAX;
    o = (fm_ckpt_load_opts){.routing = &rt};
    l = load_ok(dir, 3, &o);
    assert_int_equal(l->cfg.top_k, 3);
    assert_int_equal(l->cfg.score, FM_SCORE_SOFTMAX);
    fm_ckpt_layer_free(l);
    free(s);
    model_free(m);
}

/* Unquantized BF16 experts in the same layout (no scales): loaded as FM_FORMAT_BF16. */
static void test_modelopt_bf16(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xb16);
    model *m = model_new(&r, FM_FORMAT_BF16, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("bf16");
    write_set(dir, s, 0); /* a folder of shards, no index */
    write_text(dir, "config.json", k_config);
    fm_ckpt_layer *l = load_ok(dir, LAYER, NULL);
    assert_int_equal(l->cfg.wfmt, FM_FORMAT_BF16);
    assert_null(l->a1_scale);
    for (int e = 0; e < E; e++) assert_qtensor_equal(&l->w13[e], &m->w13[e]);
    assert_same_output(&r, &m->cfg, &m->w, &l->cfg, &l->w);
    fm_ckpt_layer_free(l);
    free(s);
    model_free(m);
}

/* gpt-oss MXFP4: fused experts, interleaved gate/up rows de-interleaved into w13. */
static void test_gptoss_round_trip(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x6055);
    model *m = model_new(&r, FM_FORMAT_MXFP4, 1);
    itemset *s = calloc(1, sizeof *s);
    uint8_t *gu_b = malloc(GU_B), *gu_s = malloc(GU_S), *dn_b = malloc(DN_B), *dn_s = malloc(DN_S);
    build_gptoss(s, m, LAYER, gu_b, gu_s, dn_b, dn_s);
    const char *dir = subdir("gptoss");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config_gptoss);

    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    fm_ckpt_scan sc;
    assert_int_equal(fm_checkpoint_scan(ck, NULL, &sc), FM_OK);
    assert_int_equal(sc.layout, FM_LAYOUT_GPT_OSS);
    assert_int_equal(sc.wfmt, FM_FORMAT_MXFP4);
    assert_int_equal(sc.n_layers, 1);
    assert_int_equal(sc.experts[0], E);
    fm_ckpt_scan_free(&sc);
    fm_checkpoint_close(ck);

    fm_ckpt_layer *l = load_ok(dir, LAYER, NULL);
    assert_int_equal(l->layout, FM_LAYOUT_GPT_OSS);
    assert_int_equal(l->cfg.wfmt, FM_FORMAT_MXFP4);
    assert_int_equal(l->cfg.inter, I);
    assert_int_equal(l->cfg.top_k, 4);
    assert_int_equal(l->cfg.score, FM_SCORE_SOFTMAX_TOPK); /* the gpt_oss family's */
    assert_int_equal(l->route_from[FM_ROUTE_SCORE].from, FM_ROUTE_FROM_MODEL_DEFAULT);
    assert_string_equal(l->model_type, "gpt_oss");
    assert_int_equal(l->ignored_bias, 0); /* the expert biases are loaded */
    assert_int_equal(l->cfg.activation, FM_ACT_SWIGLU_GPTOSS);
    assert_true(l->cfg.swiglu_limit == 7.0f); /* no swiglu_limit in config.json: GptOssConfig's default */
    assert_int_equal(l->ignored_router_bias, 0); /* a logit bias, which softmax-topk adds */
    /* the biases as the model reads them: fused gate_up_proj_bias[e][2i] is gate i, [2i+1] up i */
    assert_non_null(l->w13_bias);
    assert_non_null(l->w2_bias);
    assert_ptr_equal(l->w.w13_bias, l->w13_bias);
    assert_ptr_equal(l->w.w2_bias, l->w2_bias);
    for (int e = 0; e < E; e++) {
        for (int n = 0; n < 2 * I; n++) {
            float want = fm_bf16_decode(m->gu_bias_bf16[e * 2 * I + n]);
            assert_true(l->w13_bias[e * 2 * I + ((n & 1) ? I + n / 2 : n / 2)] == want);
        }
        for (int n = 0; n < H; n++) assert_true(l->w2_bias[e * H + n] == fm_bf16_decode(m->dn_bias_bf16[e * H + n]));
    }
    assert_non_null(l->router_bias);
    for (int e = 0; e < E; e++) assert_true(l->router_bias[e] == 0.0f); /* g_zero_bias */
    for (int e = 0; e < E; e++) {
        assert_qtensor_equal(&l->w13[e], &m->w13[e]);
        assert_qtensor_equal(&l->w2[e], &m->w2[e]);
    }
    /* The gpt-oss definition, decoded independently of the loader: value(e, n, k) =
     * e2m1(nibble k of fused row n; low nibble = even k) * 2^(scale - 127), and the
     * model takes gate = fused rows 0, 2, 4..., up = rows 1, 3, 5... */
    float *deq = malloc(sizeof(float) * 2 * I * H);
    for (int e = 0; e < E; e++) {
        assert_int_equal(fm_dequantize(&l->w13[e], deq), FM_OK);
        for (int n = 0; n < 2 * I; n++)
            for (int k = 0; k < H; k++) {
                uint8_t byte = gu_b[((size_t)e * 2 * I + n) * (H / 2) + k / 2];
                uint8_t sc8 = gu_s[((size_t)e * 2 * I + n) * (H / 32) + k / 32];
                float want = fm_e2m1_decode((k & 1) ? byte >> 4 : byte & 15) * ldexpf(1.0f, (int)sc8 - 127);
                int row = (n & 1) ? I + n / 2 : n / 2; /* gate rows, then up rows */
                assert_true(deq[(size_t)row * H + k] == want);
            }
    }
    free(deq);
    assert_same_output(&r, &m->cfg, &m->w, &l->cfg, &l->w);
    fm_ckpt_layer_free(l);
    /* config.json's swiglu_limit is the clamp; a value that is not a positive number is refused */
    write_text(dir, "config.json", "{\"model_type\": \"gpt_oss\", \"swiglu_limit\": 5.5}");
    l = load_ok(dir, LAYER, NULL);
    assert_true(l->cfg.swiglu_limit == 5.5f);
    fm_ckpt_layer_free(l);
    const char *bad[3] = {"\"x\"", "0", "-7"};
    for (int i = 0; i < 3; i++) {
        char txt[128];
        snprintf(txt, sizeof txt, "{\"model_type\": \"gpt_oss\", \"swiglu_limit\": %s}", bad[i]);
        write_text(dir, "config.json", txt);
        assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
        fm_ckpt_layer *bl = NULL;
        assert_int_equal(fm_checkpoint_load_layer(ck, LAYER, NULL, &bl), FM_ERR_FORMAT);
        assert_non_null(strstr(fm_last_error(), "swiglu_limit"));
        assert_null(bl);
        fm_checkpoint_close(ck);
    }
    write_text(dir, "config.json", k_config_gptoss);
    free(gu_b), free(gu_s), free(dn_b), free(dn_s);
    free(s);
    model_free(m);
}

/* Gate and up with different weight_scale_2 (the gate's 0.7x the up's, as the fixture's
 * w13 global): both are held as stored, w13[e].global_scale = the gate's and
 * w13_up_global[e] = the up's, and every block-scale and data byte is the checkpoint's
 * (no re-encoding); the forward pass is bit-identical to the reference on the same
 * tensors and globals given directly; validate_only counts them; an EP shard holds its
 * experts' up globals. (Before, the gate half was re-encoded against the up global:
 * NMSE up to 5e-3 on w13.) */
static void test_split_globals(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x5ca1e);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    float gg[E], gu[E];
    char nm[128];
    for (int e = 0; e < E; e++) {
        gg[e] = m->w13[e].global_scale * 0.7f;
        gu[e] = m->w13[e].global_scale;
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj.weight_scale_2", LAYER, e);
        s->it[find_item(s, nm)].data = &gg[e];
    }
    const char *dir = subdir("split_globals");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config);
    fm_ckpt_layer *l = load_ok(dir, LAYER, NULL);
    assert_int_equal(l->w13_split_globals, E);
    assert_non_null(l->w13_up_global);
    assert_ptr_equal(l->w.w13_up_global, l->w13_up_global);
    fm_qtensor w13[E];
    for (int e = 0; e < E; e++) {
        assert_true(l->w13[e].global_scale == gg[e]);
        assert_true(l->w13_up_global[e] == gu[e]);
        assert_memory_equal(l->w13[e].scales, m->w13[e].scales, 2 * I * H / 16);
        assert_memory_equal(l->w13[e].data, m->w13[e].data, 2 * I * H / 2);
        w13[e] = m->w13[e];
        w13[e].global_scale = gg[e];
    }
    /* the same layer given directly: the fixture's tensors, the gate and up globals */
    fm_moe_weights w = m->w;
    w.w13 = w13;
    w.w13_up_global = gu;
    assert_same_output(&r, &m->cfg, &w, &l->cfg, &l->w);
    fm_layer *layer = NULL;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &l->cfg, &l->w, T, &layer), FM_OK);
    fm_layer_destroy(layer);
    fm_ckpt_layer_free(l);

    fm_ckpt_load_opts o = {.validate_only = 1};
    l = load_ok(dir, LAYER, &o);
    assert_int_equal(l->w13_split_globals, E);
    assert_null(l->w13_up_global);
    fm_ckpt_layer_free(l);

    o = (fm_ckpt_load_opts){.first_expert = 1, .n_experts = 2, .global_router = 1};
    l = load_ok(dir, LAYER, &o);
    assert_int_equal(l->w13_split_globals, 2);
    for (int e = 0; e < 2; e++) {
        assert_true(l->w13[e].global_scale == gg[1 + e]);
        assert_true(l->w13_up_global[e] == gu[1 + e]);
    }
    fm_ckpt_layer_free(l);

    /* one expert's globals differ: the others' up globals are their w13 global */
    for (int e = 1; e < E; e++) {
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj.weight_scale_2", LAYER, e);
        s->it[find_item(s, nm)].data = &gu[e];
    }
    dir = subdir("split_globals_one");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config);
    l = load_ok(dir, LAYER, NULL);
    assert_int_equal(l->w13_split_globals, 1);
    assert_true(l->w13[0].global_scale == gg[0] && l->w13_up_global[0] == gu[0]);
    for (int e = 1; e < E; e++) assert_true(l->w13[e].global_scale == gu[e] && l->w13_up_global[e] == gu[e]);
    fm_ckpt_layer_free(l);
    free(s);
    model_free(m);
}

/* An NVFP4 shared expert (ModelOpt tensors) is held as BF16: each element is
 * bf16(dequantized value), exactly what the checkpoint defines rounded once. */
static void test_shared_nvfp4(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x54a);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    fm_qtensor q[3];
    uint8_t *bufs[3][2];
    char nm[128];
    for (int p = 0; p < 3; p++) {
        quantize_into(&r, FM_FORMAT_NVFP4, p < 2 ? SI : H, p < 2 ? H : SI, &q[p], bufs[p]);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.weight", LAYER, proj[p]);
        remove_item(s, nm);
        add(s, 1, nm, FM_DTYPE_U8, 2, q[p].rows, q[p].cols / 2, 0, 0, q[p].data);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.weight_scale", LAYER, proj[p]);
        add(s, 1, nm, FM_DTYPE_F8_E4M3, 2, q[p].rows, q[p].cols / 16, 0, 0, q[p].scales);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.%s.weight_scale_2", LAYER, proj[p]);
        add(s, 1, nm, FM_DTYPE_F32, 0, 0, 0, 0, 0, &q[p].global_scale);
    }
    const char *dir = subdir("shared_nvfp4");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config);
    fm_ckpt_layer *l = load_ok(dir, LAYER, NULL);
    assert_int_equal(l->cfg.shared_inter, SI);
    float *deq = malloc(sizeof(float) * SI * H);
    const uint16_t *got[3] = {l->shared_w13, l->shared_w13 + SI * H, l->shared_w2};
    for (int p = 0; p < 3; p++) {
        assert_int_equal(fm_dequantize(&q[p], deq), FM_OK);
        for (int i = 0; i < SI * H; i++)
            if (got[p][i] != fm_bf16_encode(deq[i])) fail_msg("%s element %d: 0x%04x", proj[p], i, got[p][i]);
    }
    free(deq);
    fm_ckpt_layer_free(l);
    /* A NaN E4M3 code in the shared down_proj scales: rejected by a load and by
     * validate_only (inspect) alike, naming the tensor (issue 15). */
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.shared_experts.down_proj.weight_scale", LAYER);
    static uint8_t nan_sc[H * SI / 16];
    memcpy(nan_sc, s->it[find_item(s, nm)].data, sizeof nan_sc);
    nan_sc[3] = 0x7F;
    s->it[find_item(s, nm)].data = nan_sc;
    write_set(dir, s, 1);
    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    for (int dry = 0; dry < 2; dry++) {
        fm_ckpt_load_opts o = {.validate_only = dry};
        l = (fm_ckpt_layer *)&l;
        fm_status st = fm_checkpoint_load_layer(ck, LAYER, &o, &l);
        if (st != FM_ERR_NONFINITE || !strstr(fm_last_error(), nm))
            fail_msg("NaN shared scale%s: %s '%s'", dry ? " (validate only)" : "", fm_status_name(st), fm_last_error());
        assert_null(l);
    }
    fm_checkpoint_close(ck);
    for (int p = 0; p < 3; p++) free(bufs[p][0]), free(bufs[p][1]);
    free(s);
    model_free(m);
}

/* `test_io_checkpoint --write-sample DIR`: checkpoints for the CLI checks in
 * tests/io.cmake: DIR/modelopt (NVFP4, layers 1 and 3, two shards + index +
 * config.json), DIR/gptoss (MXFP4, layer 1), DIR/bad (expert 1's down_proj
 * weight_scale missing), DIR/stray (modelopt plus one tensor of expert
 * 999999999), DIR/nanscale (modelopt with a NaN E4M3 code in layer 3's
 * expert 2 up_proj weight_scale). */
static int write_sample(const char *dir)
{
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    fm_rng r;
    fm_rng_init(&r, 1);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    build_modelopt(s, m, 3);
    const char *d = subdir("modelopt");
    write_set(d, s, 1);
    write_text(d, "config.json", k_config);
    add(s, 1, "model.layers.1.mlp.experts.999999999.gate_proj.weight", FM_DTYPE_U8, 2, 1, 1, 0, 0, &k_one);
    {
        char sd[300];
        snprintf(sd, sizeof sd, "%s", subdir("stray"));
        write_set(sd, s, 1);
        write_text(sd, "config.json", k_config);
    }
    s->n--;
    fm_st_write_item *sc = &s->it[find_item(s, "model.layers.3.mlp.experts.2.up_proj.weight_scale")];
    static uint8_t nan_sc[I * H / 16];
    memcpy(nan_sc, sc->data, sizeof nan_sc);
    nan_sc[7] = 0xFF; /* E4M3 NaN */
    const void *keep = sc->data;
    sc->data = nan_sc;
    {
        char sd[300];
        snprintf(sd, sizeof sd, "%s", subdir("nanscale"));
        write_set(sd, s, 1);
        write_text(sd, "config.json", k_config);
    }
    sc->data = keep;
    remove_item(s, "model.layers.1.mlp.experts.1.down_proj.weight_scale");
    write_set(subdir("bad"), s, 1);
    model_free(m);
    m = model_new(&r, FM_FORMAT_MXFP4, 1);
    memset(s, 0, sizeof *s);
    uint8_t *gu_b = malloc(GU_B), *gu_s = malloc(GU_S), *dn_b = malloc(DN_B), *dn_s = malloc(DN_S);
    build_gptoss(s, m, LAYER, gu_b, gu_s, dn_b, dn_s);
    d = subdir("gptoss");
    write_set(d, s, 1);
    write_text(d, "config.json", k_config_gptoss);
    free(gu_b), free(gu_s), free(dn_b), free(dn_s);
    model_free(m);
    free(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-sample")) return write_sample(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modelopt_round_trip),
        cmocka_unit_test(test_modelopt_bf16),
        cmocka_unit_test(test_gptoss_round_trip),
        cmocka_unit_test(test_split_globals),
        cmocka_unit_test(test_shared_nvfp4),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
