/* test_io_hostile.c - the checkpoint reader against hostile inputs (issue 15):
 * a shard truncated after it was opened (once a SIGBUS through the mapping),
 * expert ranges that overflow int, FIFOs / directories / devices where files
 * are expected (once a blocked open()), a stray expert index, and name
 * patterns too long for the name buffers. Each case checks the specific
 * status and that the message names the culprit.
 *
 * A hang is a failure: ctest gives this program a TIMEOUT (tests/io.cmake)
 * and main() arms alarm() as well, for runs outside ctest.
 */
#include "test_io_fixture.h"

#include "fm_internal.h" /* FM_ARRAY_LEN */

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/types.h>

/* The routing, given: these checkpoints are written without a config.json. */
static const fm_moe_config *routing(void)
{
    static fm_moe_config c;
    fm_moe_config_default(&c);
    c.top_k = 2;
    return &c;
}

static void expect(const char *what, fm_status got, fm_status want, const char *needle)
{
    if (got != want || !strstr(fm_last_error(), needle))
        fail_msg("%s: got %s '%s', want %s with '%s'", what, fm_status_name(got), fm_last_error(), fm_status_name(want),
                 needle);
}

/* 8 + the header length of a safetensors file: where its data section starts. */
static long data_start(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t b[8];
    assert_int_equal(fread(b, 1, 8, f), 8);
    fclose(f);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
    return (long)(8 + h);
}

/* Open the checkpoint, then cut every shard (ftruncate, as another process
 * would) to `keep` bytes of its data section (keep < 0: to 0 bytes, so that
 * every page of a mapping would be past the end: the SIGBUS), then load: full and
 * validate-only must fail with FM_ERR_IO naming a shard and the truncation,
 * never SIGBUS, and hand back NULL. */
static void truncated_after_open(const char *dir, int keep, const char *what)
{
    fm_checkpoint *ck = NULL;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    for (int f = 0; f < 2; f++) {
        char p[400];
        snprintf(p, sizeof p, "%s/%s", dir, k_shards[f]);
        int fd = open(p, O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, keep < 0 ? 0 : data_start(p) + keep), 0);
        close(fd);
    }
    for (int dry = 0; dry < 2; dry++) {
        fm_ckpt_load_opts o = {.validate_only = dry, .routing = routing()};
        fm_ckpt_layer *l = (fm_ckpt_layer *)&l; /* poisoned: must come back NULL */
        fm_status st = fm_checkpoint_load_layer(ck, LAYER, &o, &l);
        char w[160];
        snprintf(w, sizeof w, "%s (%s)", what, dry ? "validate only" : "full load");
        expect(w, st, FM_ERR_IO, "truncated or replaced since it was opened");
        expect(w, st, FM_ERR_IO, ".safetensors: file ends at byte");
        assert_null(l);
    }
    fm_checkpoint_close(ck);
}

static void test_truncated_after_open(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x7a1c);
    itemset *s = calloc(1, sizeof *s);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("cut_modelopt");
    write_set(dir, s, 1);
    truncated_after_open(dir, 0, "ModelOpt, data section gone");
    write_set(dir, s, 1);
    truncated_after_open(dir, 3, "ModelOpt, 3 data bytes left");
    write_set(dir, s, 1);
    truncated_after_open(dir, -1, "ModelOpt, cut to 0 bytes");
    model_free(m);

    memset(s, 0, sizeof *s);
    m = model_new(&r, FM_FORMAT_MXFP4, 1);
    uint8_t *gu_b = malloc(GU_B), *gu_s = malloc(GU_S), *dn_b = malloc(DN_B), *dn_s = malloc(DN_S);
    build_gptoss(s, m, LAYER, gu_b, gu_s, dn_b, dn_s);
    dir = subdir("cut_gptoss");
    write_set(dir, s, 1);
    truncated_after_open(dir, 0, "gpt-oss, data section gone");
    free(gu_b), free(gu_s), free(dn_b), free(dn_s);
    model_free(m);

    /* One file through fm_st_read: whole, then cut to half a tensor. */
    const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fm_st_write_item it = {"v", FM_DTYPE_F32, 1, {8}, v};
    char p[400];
    snprintf(p, sizeof p, "%s/one.safetensors", subdir("cut_one"));
    assert_int_equal(fm_safetensors_write(p, &it, 1, NULL, NULL, 0), FM_OK);
    fm_safetensors *st;
    assert_int_equal(fm_safetensors_open(p, &st), FM_OK);
    const fm_st_tensor *t = fm_safetensors_at(st, 0);
    float got[8];
    assert_int_equal(fm_st_read(t, 0, sizeof got, got), FM_OK);
    assert_memory_equal(got, v, sizeof v);
    assert_int_equal(truncate(p, data_start(p) + 16), 0);
    assert_int_equal(fm_st_read(t, 0, 16, got), FM_OK); /* what is left still reads */
    expect("fm_st_read past the cut", fm_st_read(t, 8, 16, got), FM_ERR_IO, "tensor 'v'");
    fm_safetensors_close(st);
    free(s);
}

/* first_expert / n_experts anywhere in int: no signed overflow (the
 * sanitizer build aborts on one), a specific status and the true range. */
static void test_expert_range_overflow(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x0f10);
    itemset *s = calloc(1, sizeof *s);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("range");
    write_set(dir, s, 1);
    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    static const struct {
        int         first, n;
        fm_status   want;
        const char *needle;
    } k[] = {
        {INT_MIN, 0, FM_ERR_OUT_OF_RANGE, "experts [-2147483648, 4)"},
        {INT_MIN, INT_MAX, FM_ERR_OUT_OF_RANGE, "experts [-2147483648, -1)"},
        {1, INT_MAX, FM_ERR_OUT_OF_RANGE, "experts [1, 2147483648)"},
        {INT_MAX, INT_MAX, FM_ERR_OUT_OF_RANGE, "experts [2147483647, 4294967294)"},
        {INT_MAX, 0, FM_ERR_OUT_OF_RANGE, "experts [2147483647, 4)"},
        {0, -5, FM_ERR_INVALID_ARG, "n_experts -5 < 0"},
        {0, INT_MIN, FM_ERR_INVALID_ARG, "n_experts -2147483648 < 0"},
    };
    for (size_t i = 0; i < FM_ARRAY_LEN(k); i++)
        for (int dry = 0; dry < 2; dry++) {
            fm_ckpt_load_opts o = {.first_expert = k[i].first, .n_experts = k[i].n, .validate_only = dry,
                                   .routing = routing()};
            fm_ckpt_layer *l = (fm_ckpt_layer *)&l;
            char w[80];
            snprintf(w, sizeof w, "experts (%d, %d)", k[i].first, k[i].n);
            expect(w, fm_checkpoint_load_layer(ck, LAYER, &o, &l), k[i].want, k[i].needle);
            assert_null(l);
        }
    fm_ckpt_layer *l = NULL; /* the edges that are valid still load */
    fm_ckpt_load_opts o = {.first_expert = E - 1, .n_experts = 1, .routing = routing()};
    assert_int_equal(fm_checkpoint_load_layer(ck, LAYER, &o, &l), FM_OK);
    assert_int_equal(l->cfg.n_experts, 1);
    fm_ckpt_layer_free(l);
    fm_checkpoint_close(ck);
    model_free(m);
    free(s);
}

static void make_fifo(const char *dir, const char *name, char *p, size_t n)
{
    snprintf(p, n, "%s/%s", dir, name);
    assert_int_equal(mkfifo(p, 0600), 0);
}

/* Files that are not regular files: FM_ERR_IO "not a regular file" at once. */
static void test_not_regular_files(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0xf1f0);
    itemset *s = calloc(1, sizeof *s);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    build_modelopt(s, m, LAYER);
    char p[400];
    fm_checkpoint *ck = (fm_checkpoint *)&ck;

    /* a FIFO named as the checkpoint, as an index, as a folder member */
    const char *dir = subdir("fifo_path");
    make_fifo(dir, "model.safetensors", p, sizeof p);
    expect("FIFO as PATH", fm_checkpoint_open(p, &ck), FM_ERR_IO, "not a regular file (a FIFO");
    assert_null(ck);
    fm_safetensors *st = (fm_safetensors *)&st;
    expect("FIFO to fm_safetensors_open", fm_safetensors_open(p, &st), FM_ERR_IO, "model.safetensors");
    assert_null(st);
    make_fifo(dir, "index.json", p, sizeof p);
    expect("FIFO as index PATH", fm_checkpoint_open(p, &ck), FM_ERR_IO, "index.json: not a regular file");

    dir = subdir("fifo_index");
    write_set(dir, s, 0);
    make_fifo(dir, "model.safetensors.index.json", p, sizeof p);
    expect("FIFO as the folder's index", fm_checkpoint_open(dir, &ck), FM_ERR_IO, "model.safetensors.index.json");

    dir = subdir("fifo_member");
    write_set(dir, s, 0);
    make_fifo(dir, "model-00003-of-00003.safetensors", p, sizeof p);
    expect("FIFO among the shards", fm_checkpoint_open(dir, &ck), FM_ERR_IO, "model-00003-of-00003.safetensors");
    assert_null(ck);

    dir = subdir("dir_member");
    write_set(dir, s, 0);
    snprintf(p, sizeof p, "%s/extra.safetensors", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    expect("directory among the shards", fm_checkpoint_open(dir, &ck), FM_ERR_IO, "not a regular file (a directory)");
    expect("character device", fm_safetensors_open("/dev/null", &st), FM_ERR_IO, "a character device");

    /* config.json a FIFO: the load must not block on it; the routing the model
     * defines cannot be read from it, which is an error (never a silent default) */
    dir = subdir("fifo_config");
    write_set(dir, s, 1);
    make_fifo(dir, "config.json", p, sizeof p);
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    fm_ckpt_layer *l = NULL;
    fm_ckpt_load_opts o = {.validate_only = 1};
    expect("config.json a FIFO", fm_checkpoint_load_layer(ck, LAYER, &o, &l), FM_ERR_IO, "not a regular file");
    assert_null(l);
    fm_checkpoint_close(ck);

    /* the simulator's measured table */
    fm_sim_measured *ms = (fm_sim_measured *)&ms;
    make_fifo(subdir("fifo_csv"), "measured.csv", p, sizeof p);
    expect("FIFO as the measured table", fm_sim_measured_load(p, &ms), FM_ERR_IO, "measured.csv: not a regular file");
    model_free(m);
    free(s);
}

/* One tensor with a far-out expert index: the load names it (FM_ERR_FORMAT),
 * instead of ignoring it while a count from the indices says 1e9 experts. */
static void test_stray_expert(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x5a5a);
    itemset *s = calloc(1, sizeof *s);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    build_modelopt(s, m, LAYER);
    static const char *k_stray[] = {"model.layers.1.mlp.experts.999999999.gate_proj.weight",
                                    "model.layers.1.mlp.experts.4.down_proj.weight_scale_2"};
    for (size_t k = 0; k < FM_ARRAY_LEN(k_stray); k++) {
        add(s, 1, k_stray[k], FM_DTYPE_F32, 0, 0, 0, 0, 0, &k_one);
        const char *dir = subdir("stray");
        write_set(dir, s, 1);
        s->n--;
        fm_checkpoint *ck;
        assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
        for (int dry = 0; dry < 2; dry++) {
            fm_ckpt_load_opts o = {.validate_only = dry, .first_expert = 1, .n_experts = 2, /* any range */
                                   .routing = routing()};
            fm_ckpt_layer *l = (fm_ckpt_layer *)&l;
            expect(k_stray[k], fm_checkpoint_load_layer(ck, LAYER, &o, &l), FM_ERR_FORMAT, k_stray[k]);
            expect(k_stray[k], FM_ERR_FORMAT, FM_ERR_FORMAT, "router has 4 experts");
            assert_null(l);
        }
        fm_checkpoint_close(ck);
    }
    /* another layer's experts are not strays of this one */
    build_modelopt(s, m, 12);
    const char *dir = subdir("two_layers");
    write_set(dir, s, 1);
    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    fm_ckpt_layer    *l = NULL;
    fm_ckpt_load_opts o = {.routing = routing()};
    assert_int_equal(fm_checkpoint_load_layer(ck, LAYER, &o, &l), FM_OK);
    fm_ckpt_layer_free(l);
    fm_checkpoint_close(ck);
    model_free(m);
    free(s);
}

/* Name patterns that could make names longer than the name buffers, and
 * projection names {P} cannot match: FM_ERR_INVALID_ARG naming the field,
 * from the load and from the scan (not FM_ERR_NOT_FOUND). */
static void test_long_names(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x10c6);
    itemset *s = calloc(1, sizeof *s);
    model *m = model_new(&r, FM_FORMAT_NVFP4, 0);
    build_modelopt(s, m, LAYER);
    const char *dir = subdir("names");
    write_set(dir, s, 1);
    fm_checkpoint *ck;
    assert_int_equal(fm_checkpoint_open(dir, &ck), FM_OK);
    static char long_pat[700], long_proj[100], many_p[400];
    memset(long_pat, 'x', sizeof long_pat - 1);
    memcpy(long_pat, "model.layers.{L}.", 17);
    memset(long_proj, 'p', sizeof long_proj - 1);
    for (int i = 0; i + 3 < (int)sizeof many_p; i += 3) memcpy(many_p + i, "{P}", 3); /* 133 x 63 bytes */
    static const struct {
        int         field; /* 0 expert, 1 router, 2 proj_up, 3 proj_down with a '.', 4 shared */
        const char *val, *needle;
    } k[] = {
        {0, long_pat, "expert pattern"},   {1, long_pat, "router pattern"},   {0, many_p, "expert pattern"},
        {2, long_proj, "proj_up"},         {3, "down.proj", "proj_down"},     {4, long_pat, "shared pattern"},
        {0, "", "expert pattern"},
    };
    for (size_t i = 0; i < FM_ARRAY_LEN(k); i++) {
        fm_ckpt_names nm;
        assert_int_equal(fm_ckpt_names_default(FM_LAYOUT_MODELOPT, &nm), FM_OK);
        if (k[i].field == 0) nm.expert = k[i].val;
        if (k[i].field == 1) nm.router = k[i].val;
        if (k[i].field == 2) nm.proj_up = k[i].val;
        if (k[i].field == 3) nm.proj_down = k[i].val;
        if (k[i].field == 4) nm.shared = k[i].val;
        fm_ckpt_load_opts o = {.names = &nm};
        fm_ckpt_layer *l = (fm_ckpt_layer *)&l;
        expect(k[i].needle, fm_checkpoint_load_layer(ck, LAYER, &o, &l), FM_ERR_INVALID_ARG, k[i].needle);
        assert_null(l);
        fm_ckpt_scan sc;
        expect(k[i].needle, fm_checkpoint_scan(ck, &nm, &sc), FM_ERR_INVALID_ARG, k[i].needle);
    }
    fm_ckpt_names nm;
    assert_int_equal(fm_ckpt_names_default(FM_LAYOUT_MODELOPT, &nm), FM_OK);
    nm.layout = (fm_ckpt_layout)7;
    fm_ckpt_scan sc;
    expect("unknown layout", fm_checkpoint_scan(ck, &nm, &sc), FM_ERR_INVALID_ARG, "unknown layout 7");
    fm_checkpoint_close(ck);
    model_free(m);
    free(s);
}

int main(void)
{
    alarm(120); /* a blocked open() must fail the program, not stall it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_after_open), cmocka_unit_test(test_expert_range_overflow),
        cmocka_unit_test(test_not_regular_files),    cmocka_unit_test(test_stray_expert),
        cmocka_unit_test(test_long_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
