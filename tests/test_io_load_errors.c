/* test_io_load_errors.c - every bad checkpoint gives its specific status, a
 * message naming the tensor (or file) at fault, and a NULL result: missing
 * expert / scale / global, wrong dtype, wrong shape, non-finite global or
 * input scale, NaN scale codes, bad router, absent layer, bad expert range;
 * lying, escaping, malformed or dangling indexes, a tensor in two shards, a
 * truncated shard, an empty folder.
 */
#include "test_io_fixture.h"

#include "fm_internal.h" /* fm_fail: the detail-message regression test */

static float g_nan, g_zero;

typedef void (*mutator)(itemset *s, void *ctx);

/* Build layer LAYER, mutate, write with an index, open (must succeed), load
 * (must fail with want, naming needle), and the same with validate_only (what
 * `fp4moe inspect` runs): inspect must reject what a load rejects. */
static void expect_load_fail(const char *what, const model *m, mutator mut, void *ctx, int layer,
                             const fm_ckpt_load_opts *o, fm_status want, const char *needle)
{
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    if (mut) mut(s, ctx);
    const char *dir = subdir("bad");
    write_set(dir, s, 1);
    fm_checkpoint *ck = NULL;
    fm_status st = fm_checkpoint_open(dir, &ck);
    if (st != FM_OK) fail_msg("%s: open failed: %s: %s", what, fm_status_name(st), fm_last_error());
    for (int dry = 0; dry < 2; dry++) {
        fm_ckpt_load_opts od = o ? *o : (fm_ckpt_load_opts){0};
        od.validate_only = dry;
        fm_ckpt_layer *l = (fm_ckpt_layer *)&l; /* poisoned: must come back NULL */
        st = fm_checkpoint_load_layer(ck, layer, &od, &l);
        if (st != want || !strstr(fm_last_error(), needle))
            fail_msg("%s%s: got %s '%s', want %s with '%s'", what, dry ? " (validate only)" : "", fm_status_name(st),
                     fm_last_error(), fm_status_name(want), needle);
        assert_null(l);
    }
    fm_checkpoint_close(ck);
    free(s);
}

static void mut_remove(itemset *s, void *ctx) { remove_item(s, (const char *)ctx); }

static void mut_dtype_i8(itemset *s, void *ctx) { s->it[find_item(s, ctx)].dtype = FM_DTYPE_I8; }

static void mut_router_i16(itemset *s, void *ctx) { s->it[find_item(s, ctx)].dtype = FM_DTYPE_I16; }

static void mut_halve_rows(itemset *s, void *ctx) /* [N][K/2] -> [N/2][K]: same bytes, wrong shape */
{
    fm_st_write_item *it = &s->it[find_item(s, ctx)];
    it->shape[0] /= 2;
    it->shape[1] *= 2;
}

static void mut_router_i32(itemset *s, void *ctx) { s->it[find_item(s, ctx)].dtype = FM_DTYPE_I32; }

static void mut_fold_2d(itemset *s, void *ctx) /* [E] -> [E/2][2]: same bytes, wrong shape */
{
    fm_st_write_item *it = &s->it[find_item(s, ctx)];
    it->ndim = 2;
    it->shape[1] = 2;
    it->shape[0] /= 2;
}

static void mut_nan(itemset *s, void *ctx) { s->it[find_item(s, ctx)].data = &g_nan; }
static void mut_zero(itemset *s, void *ctx) { s->it[find_item(s, ctx)].data = &g_zero; }

static uint8_t g_scales[H * I / 16];
static void mut_nan_code(itemset *s, void *ctx)
{
    fm_st_write_item *it = &s->it[find_item(s, ctx)];
    memcpy(g_scales, it->data, sizeof g_scales);
    g_scales[5] = 0x7f; /* E4M3 NaN */
    it->data = g_scales;
}

#define EXPERT(e, p, suf) "model.layers.1.mlp.experts." #e "." #p suf

static void test_bad_checkpoints(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    g_nan = NAN;
    g_zero = 0.0f;
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    static const struct {
        const char *what;
        mutator     mut;
        const char *tensor; /* mutated, and named in the message */
        fm_status   want;
    } k_cases[] = {
        /* what                          mutator         tensor                                 status */
        {"missing expert",               mut_remove,     EXPERT(2, up_proj, ".weight"),         FM_ERR_NOT_FOUND},
        {"missing block scales",         mut_remove,     EXPERT(1, down_proj, ".weight_scale"), FM_ERR_NOT_FOUND},
        {"missing global scale",         mut_remove,     EXPERT(3, gate_proj, ".weight_scale_2"), FM_ERR_NOT_FOUND},
        {"missing input scale",          mut_remove,     EXPERT(3, down_proj, ".input_scale"),  FM_ERR_NOT_FOUND},
        {"scale dtype",                  mut_dtype_i8,   EXPERT(0, gate_proj, ".weight_scale"), FM_ERR_FORMAT},
        {"weight dtype",                 mut_dtype_i8,   EXPERT(0, gate_proj, ".weight"),       FM_ERR_FORMAT},
        {"weight dtype (later expert)",  mut_dtype_i8,   EXPERT(2, down_proj, ".weight"),       FM_ERR_FORMAT},
        {"weight shape",                 mut_halve_rows, EXPERT(2, up_proj, ".weight"),         FM_ERR_BAD_SHAPE},
        {"scale shape",                  mut_halve_rows, EXPERT(1, down_proj, ".weight_scale"), FM_ERR_BAD_SHAPE},
        {"NaN global",                   mut_nan,        EXPERT(1, up_proj, ".weight_scale_2"), FM_ERR_NONFINITE},
        {"zero input scale",             mut_zero,       EXPERT(0, down_proj, ".input_scale"),  FM_ERR_NONFINITE},
        {"NaN scale code",               mut_nan_code,   EXPERT(0, down_proj, ".weight_scale"), FM_ERR_NONFINITE},
        {"router dtype",                 mut_router_i16, "model.layers.1.mlp.gate.weight",      FM_ERR_FORMAT},
        {"router bias dtype",            mut_router_i32, "model.layers.1.mlp.gate.e_score_correction_bias", FM_ERR_FORMAT},
        {"router bias shape",            mut_fold_2d,    "model.layers.1.mlp.gate.e_score_correction_bias", FM_ERR_BAD_SHAPE},
        {"shared expert missing up",     mut_remove,     "model.layers.1.mlp.shared_experts.up_proj.weight", FM_ERR_NOT_FOUND},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        expect_load_fail(k_cases[i].what, m, k_cases[i].mut, (void *)k_cases[i].tensor, LAYER, NULL, k_cases[i].want,
                         k_cases[i].tensor);
    expect_load_fail("absent layer", m, NULL, NULL, 7, NULL, FM_ERR_NOT_FOUND, "layer 7");
    fm_ckpt_load_opts o = {.first_expert = 3, .n_experts = 2};
    expect_load_fail("expert range", m, NULL, NULL, LAYER, &o, FM_ERR_OUT_OF_RANGE, "[3, 5)");
    o = (fm_ckpt_load_opts){.first_expert = -1};
    expect_load_fail("negative first expert", m, NULL, NULL, LAYER, &o, FM_ERR_OUT_OF_RANGE, "layer 1");
    fm_ckpt_names bad_names;
    assert_int_equal(fm_ckpt_names_default(FM_LAYOUT_MODELOPT, &bad_names), FM_OK);
    bad_names.proj_up = NULL;
    o = (fm_ckpt_load_opts){.names = &bad_names};
    expect_load_fail("names without proj_up", m, NULL, NULL, LAYER, &o, FM_ERR_INVALID_ARG, "proj_up");
    model_free(m);
}

/* The gpt-oss layout's own shape checks. */
static void test_bad_gptoss(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x6055);
    model *m = model_new(&r, FM_FORMAT_MXFP4, 1);
    uint8_t *gu_b = malloc(GU_B), *gu_s = malloc(GU_S), *dn_b = malloc(DN_B), *dn_s = malloc(DN_S);
    const char *cases[7] = {"model.layers.1.mlp.experts.down_proj_scales", "model.layers.1.mlp.experts.gate_up_proj_scales",
                            "model.layers.1.mlp.experts.down_proj_blocks",
                            "model.layers.1.mlp.experts.down_proj_scales', expert 2: block scale [1][0] = 0xFF",
                            "expert bias 'model.layers.1.mlp.experts.gate_up_proj_bias' has dtype I8",
                            "model.layers.1.mlp.experts.down_proj_bias",
                            "expert bias 'model.layers.1.mlp.experts.down_proj_bias'[2][5] is nan"};
    const fm_status want[7] = {FM_ERR_BAD_SHAPE, FM_ERR_NOT_FOUND, FM_ERR_FORMAT, FM_ERR_NONFINITE, FM_ERR_FORMAT,
                               FM_ERR_BAD_SHAPE, FM_ERR_NONFINITE};
    for (int c = 0; c < 7; c++) {
        itemset *s = calloc(1, sizeof *s);
        const uint16_t keep = m->dn_bias_bf16[2 * H + 5];
        if (c == 6) m->dn_bias_bf16[2 * H + 5] = 0x7FC0; /* a BF16 NaN: expert 2, feature 5 */
        build_gptoss(s, m, LAYER, gu_b, gu_s, dn_b, dn_s);
        if (c == 0) mut_halve_rows(s, (void *)cases[c]);
        if (c == 1) remove_item(s, cases[c]);
        if (c == 2) s->it[find_item(s, cases[c])].dtype = FM_DTYPE_I8;
        if (c == 3) dn_s[2 * (DN_S / E) + I / 32] = 0xFF; /* UE8M0 NaN: expert 2, row 1, block 0 */
        if (c == 4) s->it[find_item(s, "model.layers.1.mlp.experts.gate_up_proj_bias")].dtype = FM_DTYPE_I8;
        if (c == 5) mut_halve_rows(s, (void *)cases[c]);
        const char *dir = subdir("badoss");
        write_set(dir, s, 1);
        write_text(dir, "config.json", k_config_gptoss); /* the routing known: the tensors decide */
        fm_checkpoint *ck;
        assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
        for (int dry = 0; dry < 2; dry++) { /* a load, and validate-only (inspect) */
            fm_ckpt_load_opts o = {.validate_only = dry};
            fm_ckpt_layer *l = NULL;
            fm_status st = fm_checkpoint_load_layer(ck, LAYER, &o, &l);
            if (c == 6 && dry) { /* validate-only reads no weights or biases (as for NaN weights) */
                assert_int_equal(st, FM_OK);
                fm_ckpt_layer_free(l);
                continue;
            }
            if (st != want[c] || !strstr(fm_last_error(), cases[c]))
                fail_msg("gpt-oss case %d%s: %s '%s'", c, dry ? " (validate only)" : "", fm_status_name(st),
                         fm_last_error());
            assert_null(l);
        }
        m->dn_bias_bf16[2 * H + 5] = keep;
        fm_checkpoint_close(ck);
        free(s);
    }
    free(gu_b), free(gu_s), free(dn_b), free(dn_s);
    model_free(m);
}

/* Occurrences of needle in hay. */
static int count_str(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* A detail message that quotes the previous one (fm_fail(..., fm_last_error()))
 * must hold the old text once, after the new prefix: review finding 1, where
 * vsnprintf read the buffer it was writing and repeated the prefix. */
static void test_detail_quotes_detail(void **state)
{
    (void)state;
    fm_clear_error();
    assert_int_equal(fm_fail(FM_ERR_BAD_SHAPE, "inner %d", 42), FM_ERR_BAD_SHAPE);
    assert_int_equal(fm_fail(FM_ERR_INVALID_ARG, "outer: %s", fm_last_error()), FM_ERR_INVALID_ARG);
    assert_string_equal(fm_last_error(), "outer: inner 42");
    /* a message longer than the buffer is cut, still terminated */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fm_fail(FM_ERR_IO, "%s", big);
    assert_true(strlen(fm_last_error()) > 500 && strlen(fm_last_error()) < sizeof big - 1);
    fm_fail(FM_ERR_IO, "p: %s", fm_last_error());
    assert_memory_equal(fm_last_error(), "p: xxx", 6);

    /* the loader path of the finding: config.json with n_group = 3 over E = 4 experts */
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xc0f);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("badcfg");
    write_set(dir, s, 1);
    write_text(dir, "config.json", "{\"model_type\": \"deepseek_v3\", \"n_group\": 3, \"topk_group\": 1}");
    fm_checkpoint *ck = NULL;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    fm_ckpt_layer *l = (fm_ckpt_layer *)&l;
    fm_status st = fm_checkpoint_load_layer(ck, LAYER, NULL, &l);
    const char *d = fm_last_error();
    if (st == FM_OK || count_str(d, "the loaded configuration is invalid") != 1 || !strstr(d, "layer 1: ") ||
        !strstr(d, "n_group"))
        fail_msg("bad config.json: got %s '%s'", fm_status_name(st), d);
    assert_null(l);
    fm_checkpoint_close(ck);
    free(s);
    model_free(m);
}

static void expect_open_fail(const char *what, const char *path, fm_status want, const char *needle)
{
    fm_checkpoint *ck = (fm_checkpoint *)&ck;
    fm_status st = fm_checkpoint_open(path, &ck);
    if (st != want || !strstr(fm_last_error(), needle))
        fail_msg("%s: got %s '%s', want %s with '%s'", what, fm_status_name(st), fm_last_error(), fm_status_name(want),
                 needle);
    assert_null(ck);
}

static void test_bad_indexes(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x1d);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    itemset *s = calloc(1, sizeof *s);
    build_modelopt(s, m, LAYER);
    const char *name = EXPERT(3, gate_proj, ".weight"); /* lives in shard 2 */

    const char *dir = subdir("lying");
    write_set(dir, s, 0);
    char idx[1024];
    snprintf(idx, sizeof idx, "{\"weight_map\": {\"%s\": \"%s\"}}", name, k_shards[0]);
    write_text(dir, "model.safetensors.index.json", idx);
    expect_open_fail("index names the wrong shard", dir, FM_ERR_NOT_FOUND, name);

    snprintf(idx, sizeof idx, "{\"weight_map\": {\"%s\": \"../%s\"}}", name, k_shards[1]);
    write_text(dir, "model.safetensors.index.json", idx);
    expect_open_fail("index escapes its folder", dir, FM_ERR_FORMAT, name);

    snprintf(idx, sizeof idx, "{\"weight_map\": {\"%s\": \"model-00003-of-00002.safetensors\"}}", name);
    write_text(dir, "model.safetensors.index.json", idx);
    expect_open_fail("index names a missing shard", dir, FM_ERR_IO, "model-00003-of-00002.safetensors");

    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": ");
    expect_open_fail("malformed index", dir, FM_ERR_FORMAT, "model.safetensors.index.json");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    expect_open_fail("index without weight_map", dir, FM_ERR_FORMAT, "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
    expect_open_fail("weight_map value not a string", dir, FM_ERR_FORMAT, "'a'");

    /* The same tensor in both shards, no index. */
    dir = subdir("twice");
    int i = find_item(s, name);
    add(s, 0, name, s->it[i].dtype, s->it[i].ndim, s->it[i].shape[0], s->it[i].shape[1], 0, 0, s->it[i].data);
    write_set(dir, s, 0);
    expect_open_fail("tensor in two shards", dir, FM_ERR_FORMAT, name);
    s->n--;

    /* A shard cut short (an interrupted download). */
    dir = subdir("truncated");
    write_set(dir, s, 1);
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, k_shards[1]);
    FILE *f = fopen(p, "rb+");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fclose(f);
    assert_int_equal(truncate(p, len - 16), 0);
    expect_open_fail("truncated shard", dir, FM_ERR_OUT_OF_RANGE, k_shards[1]);
    assert_int_equal(truncate(p, 5), 0);
    expect_open_fail("shard shorter than its length field", dir, FM_ERR_FORMAT, k_shards[1]);

    expect_open_fail("empty folder", subdir("empty"), FM_ERR_NOT_FOUND, "no *.safetensors");
    expect_open_fail("no such path", "/nonexistent/ckpt", FM_ERR_IO, "/nonexistent/ckpt");

    /* A valid file with no experts: open works, scan says what it looked for. */
    dir = subdir("noexperts");
    fm_st_write_item one = {"lm_head.weight", FM_DTYPE_F32, 1, {1}, &g_zero};
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(fm_safetensors_write(p, &one, 1, NULL, NULL, 0), FM_OK);
    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(p, &ck), FM_OK);
    fm_ckpt_scan sc;
    assert_int_equal(fm_checkpoint_scan(ck, NULL, &sc), FM_ERR_NOT_FOUND);
    assert_non_null(strstr(fm_last_error(), "experts"));
    fm_ckpt_layer *l = NULL;
    assert_int_equal(fm_checkpoint_load_layer(ck, 0, NULL, &l), FM_ERR_NOT_FOUND);
    assert_null(l);
    fm_checkpoint_close(ck);
    free(s);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_bad_gptoss),
        cmocka_unit_test(test_bad_indexes),
        cmocka_unit_test(test_detail_quotes_detail),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
