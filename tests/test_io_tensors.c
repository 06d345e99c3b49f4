/* test_io_tensors.c - checkpoints over tensors in memory (fm_checkpoint_open_tensors)
 * and shards with the global router (fm_ckpt_load_opts.global_router).
 *
 * The same fixture layers as test_io_checkpoint, given once as files and once as
 * views of the same bytes: the layout loaders must make the same layer of both,
 * bit for bit. Shards loaded with the global router must keep every router row
 * and sum, as fm_layer shards, to the whole layer (gpt-oss's router bias, a
 * logit bias, included). Bad views are refused before
 * anything is kept, each with its status; a failed load leaves the caller's
 * bytes as they were.
 */
#include "test_io_fixture.h"

#include "fp4moe/layer.h"

/* The routing of the fixture's layers, given in full: tensors in memory have no config.json. */
static fm_ckpt_load_opts routed(const model *m, int first, int n, int global)
{
    return (fm_ckpt_load_opts){.routing = &m->cfg, .first_expert = first, .n_experts = n, .global_router = global};
}

static fm_checkpoint *open_views(const itemset *s)
{
    fm_tensor_view v[MAXI];
    for (int i = 0; i < s->n; i++) {
        const fm_st_write_item *it = &s->it[i];
        v[i] = (fm_tensor_view){.name = it->name, .dtype = it->dtype, .ndim = it->ndim, .data = it->data};
        memcpy(v[i].shape, it->shape, sizeof v[i].shape);
    }
    fm_checkpoint *ck = NULL;
    fm_status st = fm_checkpoint_open_tensors(v, (size_t)s->n, "test views", &ck);
    if (st != FM_OK) fail_msg("open_tensors: %s: %s", fm_status_name(st), fm_last_error());
    /* the names are copied: the views (and their name strings) may go */
    memset(v, 0, sizeof v);
    return ck;
}

static fm_ckpt_layer *load_from(const fm_checkpoint *ck, const fm_ckpt_load_opts *o)
{
    fm_ckpt_layer *l = NULL;
    fm_status st = fm_checkpoint_load_layer(ck, LAYER, o, &l);
    if (st != FM_OK) fail_msg("load: %s: %s", fm_status_name(st), fm_last_error());
    return l;
}

static void assert_f32_equal(const float *a, const float *b, size_t n)
{
    assert_true((a == NULL) == (b == NULL));
    if (a) assert_memory_equal(a, b, n * sizeof *a);
}

static void assert_layers_equal(const fm_ckpt_layer *a, const fm_ckpt_layer *b)
{
    assert_memory_equal(&a->cfg, &b->cfg, sizeof a->cfg);
    assert_int_equal(a->n_local, b->n_local);
    assert_int_equal(a->first_expert, b->first_expert);
    assert_int_equal(a->layout, b->layout);
    assert_int_equal(a->has_router_bias, b->has_router_bias);
    assert_int_equal(a->has_expert_bias, b->has_expert_bias);
    const int n = a->n_local, R = a->cfg.n_experts, Hd = a->cfg.hidden, In = a->cfg.inter;
    for (int e = 0; e < n; e++) {
        assert_qtensor_equal(&a->w13[e], &b->w13[e]);
        assert_qtensor_equal(&a->w2[e], &b->w2[e]);
    }
    assert_f32_equal(a->router_w, b->router_w, (size_t)R * Hd);
    assert_f32_equal(a->router_bias, b->router_bias, (size_t)R);
    assert_f32_equal(a->a1_scale, b->a1_scale, (size_t)n);
    assert_f32_equal(a->a2_scale, b->a2_scale, (size_t)n);
    assert_f32_equal(a->w13_bias, b->w13_bias, (size_t)n * 2 * In);
    assert_f32_equal(a->w2_bias, b->w2_bias, (size_t)n * Hd);
    assert_true((a->shared_w13 == NULL) == (b->shared_w13 == NULL));
    if (a->shared_w13) {
        assert_memory_equal(a->shared_w13, b->shared_w13, (size_t)2 * a->cfg.shared_inter * Hd * 2);
        assert_memory_equal(a->shared_w2, b->shared_w2, (size_t)a->cfg.shared_inter * Hd * 2);
    }
}

/* out = the layer (or shard) on x, cpu-ref. */
static void run_layer(const fm_ckpt_layer *l, int first, int n_local, const uint16_t *x, float *out)
{
    fm_layer_desc d = {.backend = FM_BACKEND_CPU_REF, .max_tokens = T, .first_expert = first, .n_local = n_local};
    fm_layer *L = NULL;
    fm_status st = fm_layer_create_desc(&d, &l->cfg, &l->w, &L);
    if (st != FM_OK) fail_msg("create: %s: %s", fm_status_name(st), fm_last_error());
    fm_layer_run_args a = {.x = x, .T = T, .out = out};
    assert_int_equal(fm_layer_run(L, &a), FM_OK);
    fm_layer_destroy(L);
}

/* Shards [0, E/2) and [E/2, E) of the global layer, from ck, summed against the whole. */
static void assert_shards_sum(fm_rng *r, const fm_checkpoint *ck, const model *m)
{
    uint16_t x[T * H];
    for (int i = 0; i < T * H; i++) x[i] = fm_bf16_encode(fm_rng_normal(r));
    float whole[T * H], part[T * H], sum[T * H] = {0};
    fm_ckpt_load_opts o = routed(m, 0, 0, 0);
    fm_ckpt_layer *l = load_from(ck, &o);
    run_layer(l, 0, 0, x, whole);
    for (int s = 0; s < 2; s++) {
        fm_ckpt_load_opts so = routed(m, s * E / 2, E / 2, 1);
        fm_ckpt_layer *sl = load_from(ck, &so);
        assert_int_equal(sl->cfg.n_experts, E); /* the router's count: routing over global ids */
        assert_int_equal(sl->n_local, E / 2);
        assert_int_equal(sl->first_expert, s * E / 2);
        assert_int_equal(sl->cfg.top_k, l->cfg.top_k);
        assert_int_equal(sl->cfg.n_group, l->cfg.n_group); /* groups kept: they are the global layer's */
        assert_memory_equal(sl->router_w, l->router_w, sizeof(float) * E * H);
        assert_true((sl->router_bias == NULL) == (l->router_bias == NULL));
        if (l->router_bias) assert_memory_equal(sl->router_bias, l->router_bias, sizeof(float) * E);
        for (int e = 0; e < E / 2; e++) assert_qtensor_equal(&sl->w13[e], &l->w13[s * E / 2 + e]);
        run_layer(sl, s * E / 2, E / 2, x, part);
        for (int i = 0; i < T * H; i++) sum[i] += part[i];
        fm_ckpt_layer_free(sl);
    }
    double num = 0, den = 0;
    for (int i = 0; i < T * H; i++) num += ((double)sum[i] - whole[i]) * ((double)sum[i] - whole[i]), den += (double)whole[i] * whole[i];
    assert_true(den > 0);
    if (num > 1e-12 * den) fail_msg("shards sum to NMSE %g of the whole layer", num / den);
    /* without the global router a shard is a standalone layer of its experts: its own router rows */
    fm_ckpt_load_opts so = routed(m, E / 2, E / 2, 0);
    fm_ckpt_layer *sl = load_from(ck, &so);
    assert_int_equal(sl->cfg.n_experts, E / 2);
    assert_memory_equal(sl->router_w, l->router_w + E / 2 * H, sizeof(float) * E / 2 * H);
    fm_ckpt_layer_free(sl);
    fm_ckpt_layer_free(l);
}

static void test_modelopt_memory_equals_file(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("modelopt");
    write_set(dir, s, 1);
    fm_checkpoint *fk, *mk = open_views(s);
    assert_int_equal(fm_checkpoint_open(dir, &fk), FM_OK);
    assert_int_equal(fm_checkpoint_tensor_count(mk), fm_checkpoint_tensor_count(fk));
    assert_int_equal(fm_checkpoint_file_count(mk), 0);
    assert_int_equal(fm_checkpoint_data_bytes(mk), fm_checkpoint_data_bytes(fk));
    fm_ckpt_scan sf, sm;
    assert_int_equal(fm_checkpoint_scan(fk, NULL, &sf), FM_OK);
    assert_int_equal(fm_checkpoint_scan(mk, NULL, &sm), FM_OK);
    assert_int_equal(sm.layout, sf.layout);
    assert_int_equal(sm.n_layers, 1);
    assert_int_equal(sm.experts[0], sf.experts[0]);
    fm_ckpt_scan_free(&sf);
    fm_ckpt_scan_free(&sm);
    for (int shard = 0; shard < 2; shard++) {
        fm_ckpt_load_opts o = routed(m, shard ? 1 : 0, shard ? 2 : 0, shard);
        o.swizzle_scales = 1;
        fm_ckpt_layer *a = load_from(fk, &o), *b = load_from(mk, &o);
        assert_layers_equal(a, b);
        for (int e = 0; e < a->n_local; e++)
            assert_memory_equal(a->w13_sf_swizzled[e], b->w13_sf_swizzled[e], fm_sf_swizzled_bytes(2 * I, H / 16));
        fm_ckpt_layer_free(a);
        fm_ckpt_layer_free(b);
    }
    /* validate-only over memory, as inspect runs it */
    fm_ckpt_load_opts v = routed(m, 0, 0, 0);
    v.validate_only = 1;
    fm_ckpt_layer *l = load_from(mk, &v);
    assert_null(l->w13);
    fm_ckpt_layer_free(l);
    /* the layer matches the in-memory model */
    fm_ckpt_load_opts o = routed(m, 0, 0, 0);
    l = load_from(mk, &o);
    assert_same_output(&r, &m->cfg, &m->w, &l->cfg, &l->w);
    fm_ckpt_layer_free(l);
    assert_shards_sum(&r, mk, m);
    fm_checkpoint_close(fk);
    fm_checkpoint_close(mk);
    free(s);
    model_free(m);
}

static void test_gptoss_memory_equals_file(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    model *m = model_new(&r, FM_FORMAT_MXFP4, 1);
    itemset *s = calloc(1, sizeof *s);
    uint8_t *gu_b = malloc(GU_B), *gu_s = malloc(GU_S), *dn_b = malloc(DN_B), *dn_s = malloc(DN_S);
    build_gptoss(s, m, LAYER, gu_b, gu_s, dn_b, dn_s);
    const char *dir = subdir("gptoss");
    write_set(dir, s, 1);
    write_text(dir, "config.json", k_config_gptoss);
    fm_checkpoint *fk, *mk = open_views(s);
    assert_int_equal(fm_checkpoint_open(dir, &fk), FM_OK);
    for (int shard = 0; shard < 2; shard++) {
        fm_ckpt_load_opts o = routed(m, shard ? 2 : 0, shard ? 2 : 0, shard);
        fm_ckpt_layer *a = load_from(fk, &o), *b = load_from(mk, &o);
        assert_layers_equal(a, b);
        assert_int_equal(b->cfg.activation, FM_ACT_SWIGLU_GPTOSS);
        assert_true(b->has_router_bias && !b->ignored_router_bias);
        fm_ckpt_layer_free(a);
        fm_ckpt_layer_free(b);
    }
    fm_ckpt_load_opts o = routed(m, 0, 0, 0);
    fm_ckpt_layer *l = load_from(mk, &o);
    assert_same_output(&r, &m->cfg, &m->w, &l->cfg, &l->w);
    fm_ckpt_layer_free(l);
    assert_shards_sum(&r, mk, m);
    assert_shards_sum(&r, fk, m); /* and from the files: the router bias is global there too */
    fm_checkpoint_close(fk);
    fm_checkpoint_close(mk);
    free(s);
    free(gu_b), free(gu_s), free(dn_b), free(dn_s);
    model_free(m);
}

/* A rank holding only its experts' slices of gpt-oss's fused tensors: taken with the
 * global router, refused as a standalone layer (E must be the router's there). */
static void test_gptoss_rank_tensors(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    model *m = model_new(&r, FM_FORMAT_MXFP4, 1);
    itemset *s = calloc(1, sizeof *s);
    uint8_t *gu_b = malloc(GU_B), *gu_s = malloc(GU_S), *dn_b = malloc(DN_B), *dn_s = malloc(DN_S);
    build_gptoss(s, m, LAYER, gu_b, gu_s, dn_b, dn_s);
    fm_checkpoint *whole = open_views(s);
    fm_ckpt_load_opts o = routed(m, 2, 2, 1);
    fm_ckpt_layer *want = load_from(whole, &o);
    /* the rank's view: dim 0 of every fused expert tensor cut to experts [2, 4) */
    for (int i = 0; i < s->n; i++) {
        fm_st_write_item *it = &s->it[i];
        if (!strstr(it->name, ".experts.")) continue;
        size_t per = fm_dtype_bits(it->dtype) / 8;
        for (int d = 1; d < it->ndim; d++) per *= (size_t)it->shape[d];
        it->data = (const uint8_t *)it->data + 2 * per;
        it->shape[0] = 2;
    }
    fm_checkpoint *rank = open_views(s);
    fm_ckpt_layer *got = load_from(rank, &o);
    assert_layers_equal(want, got);
    fm_ckpt_layer *bad = (fm_ckpt_layer *)(uintptr_t)1;
    o.global_router = 0;
    assert_int_equal(fm_checkpoint_load_layer(rank, LAYER, &o, &bad), FM_ERR_BAD_SHAPE);
    assert_null(bad);
    assert_non_null(strstr(fm_last_error(), "holds 2 experts: expected the router's 4"));
    o = routed(m, 2, 1, 1); /* one expert of a rank's tensors of two: neither the layer's count nor the shard's */
    assert_int_equal(fm_checkpoint_load_layer(rank, LAYER, &o, &bad), FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), "(or the shard's, with a global router)"));
    fm_ckpt_layer_free(want);
    fm_ckpt_layer_free(got);
    fm_checkpoint_close(whole);
    fm_checkpoint_close(rank);
    free(s);
    free(gu_b), free(gu_s), free(dn_b), free(dn_s);
    model_free(m);
}

/* Bad views: each refused with its status before anything is kept, *out NULL. */
static void test_bad_views(void **state)
{
    (void)state;
    static const uint8_t bytes[64];
    const fm_tensor_view good = {.name = "a", .dtype = FM_DTYPE_U8, .ndim = 2, .shape = {4, 8}, .data = bytes};
    struct {
        const char *what;
        fm_tensor_view v;
        fm_status want;
        const char *msg;
    } cases[] = {
        {"no name", {.name = NULL, .dtype = FM_DTYPE_U8, .ndim = 1, .shape = {1}, .data = bytes}, FM_ERR_INVALID_ARG,
         "tensor 1 has no name"},
        {"empty name", {.name = "", .dtype = FM_DTYPE_U8, .ndim = 1, .shape = {1}, .data = bytes}, FM_ERR_INVALID_ARG,
         "has no name"},
        {"dtype", {.name = "b", .dtype = FM_DTYPE_COUNT, .ndim = 1, .shape = {1}, .data = bytes}, FM_ERR_FORMAT,
         "'b': unknown dtype"},
        {"negative dtype", {.name = "b", .dtype = (fm_dtype)-1, .ndim = 1, .shape = {1}, .data = bytes},
         FM_ERR_FORMAT, "unknown dtype"},
        {"ndim < 0", {.name = "b", .dtype = FM_DTYPE_U8, .ndim = -1, .data = bytes}, FM_ERR_INVALID_ARG, "ndim -1"},
        {"ndim 9", {.name = "b", .dtype = FM_DTYPE_U8, .ndim = 9, .data = bytes}, FM_ERR_UNSUPPORTED, "9 dimensions"},
        {"negative dim", {.name = "b", .dtype = FM_DTYPE_U8, .ndim = 2, .shape = {4, -1}, .data = bytes},
         FM_ERR_BAD_SHAPE, "'b' (U8)"},
        {"overflow", {.name = "b", .dtype = FM_DTYPE_F64, .ndim = 3, .shape = {1ll << 31, 1ll << 31, 1ll << 3},
                      .data = bytes}, FM_ERR_BAD_SHAPE, "overflowing"},
        {"odd F4", {.name = "b", .dtype = FM_DTYPE_F4, .ndim = 1, .shape = {3}, .data = bytes}, FM_ERR_BAD_SHAPE,
         "F4 of an odd"},
        {"NULL data", {.name = "b", .dtype = FM_DTYPE_F32, .ndim = 1, .shape = {2}, .data = NULL},
         FM_ERR_INVALID_ARG, "NULL data for 8 bytes"},
        {"twice", {.name = "a", .dtype = FM_DTYPE_U8, .ndim = 1, .shape = {1}, .data = bytes}, FM_ERR_FORMAT,
         "tensor 'a' is given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fm_tensor_view v[2] = {good, cases[i].v};
        fm_checkpoint *ck = (fm_checkpoint *)(uintptr_t)1;
        fm_status st = fm_checkpoint_open_tensors(v, 2, NULL, &ck);
        if (st != cases[i].want || !strstr(fm_last_error(), cases[i].msg))
            fail_msg("%s: %s: %s", cases[i].what, fm_status_name(st), fm_last_error());
        assert_null(ck);
        assert_non_null(strstr(fm_last_error(), "tensors in memory")); /* the default label */
    }
    char longname[600];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    fm_tensor_view v[2] = {good, good};
    v[1].name = longname;
    fm_checkpoint *ck = NULL;
    assert_int_equal(fm_checkpoint_open_tensors(v, 2, "L", &ck), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "L: tensor 1: name of 512 bytes"));
    assert_int_equal(fm_checkpoint_open_tensors(NULL, 2, NULL, &ck), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_checkpoint_open_tensors(v, 0, NULL, &ck), FM_ERR_NOT_FOUND);
    assert_int_equal(fm_checkpoint_open_tensors(v, 1, NULL, NULL), FM_ERR_INVALID_ARG);
    /* empty tensors need no data; a scalar is one element */
    fm_tensor_view e[2] = {{.name = "empty", .dtype = FM_DTYPE_F32, .ndim = 2, .shape = {0, 5}},
                           {.name = "s", .dtype = FM_DTYPE_F32, .ndim = 0, .data = bytes}};
    assert_int_equal(fm_checkpoint_open_tensors(e, 2, NULL, &ck), FM_OK);
    const fm_st_tensor *t;
    assert_int_equal(fm_checkpoint_find(ck, "s", &t), FM_OK);
    assert_int_equal(t->nbytes, 4);
    assert_int_equal(fm_checkpoint_find(ck, "nope", &t), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "tensors in memory: 2 tensors"));
    fm_ckpt_layer *l = (fm_ckpt_layer *)(uintptr_t)1;
    assert_int_equal(fm_checkpoint_load_layer(ck, 0, NULL, &l), FM_ERR_NOT_FOUND); /* no experts */
    assert_null(l);
    fm_checkpoint_close(ck);
}

/* A load that fails over memory: its status and message, and the caller's bytes
 * as they were (the loaders only read views). No config.json: routing required. */
static void test_failed_load_leaves_views(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    const uint16_t router0 = m->router_bf16[0];
    fm_checkpoint *ck = open_views(s);
    fm_ckpt_layer *l = (fm_ckpt_layer *)(uintptr_t)1;
    assert_int_equal(fm_checkpoint_load_layer(ck, LAYER, NULL, &l), FM_ERR_NOT_FOUND);
    assert_null(l);
    assert_non_null(strstr(fm_last_error(), "test views"));
    assert_non_null(strstr(fm_last_error(), "routing is unknown"));
    fm_checkpoint_close(ck);
    /* a NaN global scale in one expert: FM_ERR_NONFINITE naming it, nothing written */
    float nan_g = NAN;
    int i = find_item(s, "model.layers.1.mlp.experts.2.down_proj.weight_scale_2");
    s->it[i].data = &nan_g;
    uint8_t *copy = malloc(fm_format_row_bytes(FM_FORMAT_NVFP4, I) * H);
    memcpy(copy, m->w2[3].data, fm_format_row_bytes(FM_FORMAT_NVFP4, I) * H);
    ck = open_views(s);
    fm_ckpt_load_opts o = routed(m, 0, 0, 0);
    assert_int_equal(fm_checkpoint_load_layer(ck, LAYER, &o, &l), FM_ERR_NONFINITE);
    assert_non_null(strstr(fm_last_error(), "experts.2.down_proj.weight_scale_2"));
    assert_true(isnan(nan_g));
    assert_int_equal(m->router_bf16[0], router0);
    assert_memory_equal(copy, m->w2[3].data, fm_format_row_bytes(FM_FORMAT_NVFP4, I) * H);
    fm_checkpoint_close(ck);
    free(copy);
    free(s);
    model_free(m);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modelopt_memory_equals_file),
        cmocka_unit_test(test_gptoss_memory_equals_file),
        cmocka_unit_test(test_gptoss_rank_tensors),
        cmocka_unit_test(test_bad_views),
        cmocka_unit_test(test_failed_load_leaves_views),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
