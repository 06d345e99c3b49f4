/* test_layer_api.c - the checks fm_layer_create / fm_layer_forward make for every
 * backend (src/layer.c): specific statuses, a detail message, and caller buffers
 * untouched on failure. Small random layers; NVFP4 weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

enum { E = 4, TOPK = 2, H = 64, I = 32, TMAX = 3 };

typedef struct {
    fm_moe_config  cfg;
    fm_moe_weights w;
    fm_qtensor     w13[E], w2[E];
    uint8_t        blob[E][2][2 * I * H / 2 + 2 * I * H / 16 + H * I / 2 + H * I / 16];
    float          router[E * H];
    uint16_t       x[TMAX * H];
} small_layer;

static small_layer *make_layer(fm_rng *r)
{
    small_layer *L = calloc(1, sizeof *L);
    assert_non_null(L);
    fm_moe_config_default(&L->cfg);
    L->cfg.n_experts = E, L->cfg.top_k = TOPK, L->cfg.hidden = H, L->cfg.inter = I;
    float *tmp = malloc(sizeof(float) * 2 * I * H);
    assert_non_null(tmp);
    for (int e = 0; e < E; e++) {
        uint8_t *b = L->blob[e][0];
        L->w13[e] = (fm_qtensor){FM_FORMAT_NVFP4, 2 * I, H, b, b + 2 * I * H / 2, 1.0f};
        b += 2 * I * H / 2 + 2 * I * H / 16;
        L->w2[e] = (fm_qtensor){FM_FORMAT_NVFP4, H, I, b, b + H * I / 2, 1.0f};
        fm_rng_fill_normal(r, tmp, 2 * I * H, 0.1f);
        assert_int_equal(fm_quantize(tmp, NULL, &L->w13[e]), FM_OK);
        fm_rng_fill_normal(r, tmp, H * I, 0.1f);
        assert_int_equal(fm_quantize(tmp, NULL, &L->w2[e]), FM_OK);
    }
    free(tmp);
    fm_rng_fill_normal(r, L->router, E * H, 0.1f);
    for (int i = 0; i < TMAX * H; i++) L->x[i] = fm_bf16_encode(fm_rng_normal(r));
    L->w = (fm_moe_weights){.router_w = L->router, .w13 = L->w13, .w2 = L->w2};
    return L;
}

/* Plan files on a CPU layer: desc.plans is not read (a note says why; create succeeds
 * even for a path that does not exist), saving is FM_ERR_UNSUPPORTED and writes nothing. */
static void plans_on_cpu(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 3);
    small_layer  *L = make_layer(&r);
    fm_layer_desc d = {.backend = FM_BACKEND_CPU, .max_tokens = TMAX, .plans = "/nonexistent/plans.json"};
    fm_layer     *l = NULL;
    assert_int_equal(fm_layer_create_desc(&d, &L->cfg, &L->w, &l), FM_OK);
    assert_non_null(strstr(fm_layer_plans_note(l), "not used"));
    assert_non_null(strstr(fm_layer_plans_note(l), "cpu backend"));
    char *path = fm_test_write_tmp("plans", "{\"keep\": 1}");
    assert_int_equal(fm_layer_save_plans(l, path), FM_ERR_UNSUPPORTED);
    FILE *f = fopen(path, "r");
    char  buf[32] = {0};
    assert_non_null(f);
    assert_true(fread(buf, 1, sizeof buf - 1, f) > 0);
    fclose(f);
    assert_string_equal(buf, "{\"keep\": 1}"); /* untouched */
    unlink(path);
    assert_int_equal(fm_layer_save_plans(NULL, "x"), FM_ERR_INVALID_ARG);
    assert_string_equal(fm_layer_plans_note(NULL), "");
    fm_layer_destroy(l);
    d.plans = NULL;
    assert_int_equal(fm_layer_create_desc(&d, &L->cfg, &L->w, &l), FM_OK);
    assert_string_equal(fm_layer_plans_note(l), ""); /* none given */
    fm_layer_destroy(l);
    /* pdl_chain: AUTO or OFF (the CPU backends ignore it), anything else refused */
    d.pdl_chain = FM_PDL_CHAIN_OFF;
    assert_int_equal(fm_layer_create_desc(&d, &L->cfg, &L->w, &l), FM_OK);
    fm_layer_destroy(l);
    d.pdl_chain = 1;
    l = (fm_layer *)(uintptr_t)1;
    assert_int_equal(fm_layer_create_desc(&d, &L->cfg, &L->w, &l), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "pdl_chain=1"));
    assert_null(l);
    /* act_fp8_path: EVERY or FASTER (the CPU backends ignore it, also on a W4A8 layer), anything
     * else refused */
    d.pdl_chain = FM_PDL_CHAIN_AUTO;
    d.act_fp8_path = FM_FP8_PATH_FASTER;
    assert_int_equal(fm_layer_create_desc(&d, &L->cfg, &L->w, &l), FM_OK);
    fm_layer_destroy(l);
    d.act_fp8_path = -1;
    l = (fm_layer *)(uintptr_t)1;
    assert_int_equal(fm_layer_create_desc(&d, &L->cfg, &L->w, &l), FM_ERR_INVALID_ARG);
    assert_non_null(strstr(fm_last_error(), "act_fp8_path=-1"));
    assert_null(l);
    free(L);
}

/* The accuracy table: the bound of each backend against cpu-ref, weights-only and with
 * NVFP4 activations, and the refusals. */
static void accuracy_table(void **st)
{
    (void)st;
    fm_moe_config c;
    fm_moe_config_default(&c);
    double b = -1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU_REF, &c, &b), FM_OK);
    assert_true(b == 0.0);
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU, &c, &b), FM_OK);
    assert_true(b == 1e-9);
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &c, &b), FM_OK);
    assert_true(b == 1e-4);
    c.act_nvfp4 = 1;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU, &c, &b), FM_OK);
    assert_true(b == 2e-3);
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CUDA, &c, &b), FM_OK);
    assert_true(b == 2e-3);
    b = 7;
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_AUTO, &c, &b), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_accuracy((fm_backend_kind)99, &c, &b), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU, NULL, &b), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_accuracy(FM_BACKEND_CPU, &c, NULL), FM_ERR_INVALID_ARG);
    assert_true(b == 7); /* untouched on failure */
}

static void create_rejects(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    small_layer *L = make_layer(&r);
    fm_layer *l = (fm_layer *)(uintptr_t)1; /* must come back NULL on failure */
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &L->cfg, &L->w, 0, &l), FM_ERR_INVALID_ARG);
    assert_null(l);
    /* routed rows beyond int32 for every backend */
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &L->cfg, &L->w, 0x7fffffff, &l), FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), "2^31-1"));
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, NULL, &L->w, 1, &l), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &L->cfg, NULL, 1, &l), FM_ERR_INVALID_ARG);
    /* a weight tensor whose shape disagrees with the config */
    L->w13[2].rows = 2 * I + 16;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &L->cfg, &L->w, 1, &l), FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), "w13[2]"));
    L->w13[2].rows = 2 * I;
    L->w2[1].global_scale = 0.0f;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &L->cfg, &L->w, 1, &l), FM_ERR_NONFINITE);
    L->w2[1].global_scale = 1.0f;
    L->w2[3].fmt = FM_FORMAT_MXFP4;
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &L->cfg, &L->w, 1, &l), FM_ERR_FORMAT);
    L->w2[3].fmt = FM_FORMAT_NVFP4;
    /* a NaN / Inf in the router or in a BF16 shared-expert weight (issue 30): refused at
     * create naming the tensor and element, on both CPU backends; it used to be blamed on
     * the input at run time ("inputs too large") */
    static const fm_backend_kind cpu[2] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};
    for (int b = 0; b < 2; b++) {
        L->router[1 * H + 5] = NAN;
        assert_int_equal(fm_layer_create(cpu[b], &L->cfg, &L->w, 1, &l), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "router_w[1][5]"));
        assert_null(l);
        L->router[1 * H + 5] = 0.25f;
        float bias[E] = {0, 0, -INFINITY, 0};
        L->w.router_bias = bias;
        assert_int_equal(fm_layer_create(cpu[b], &L->cfg, &L->w, 1, &l), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "router_bias[2]"));
        L->w.router_bias = NULL;
        enum { S = 32 };
        uint16_t *s13 = calloc(2 * S * H, 2), *s2 = calloc((size_t)H * S, 2);
        assert_true(s13 && s2);
        L->cfg.shared_inter = S;
        L->w.shared_w13 = s13, L->w.shared_w2 = s2;
        assert_int_equal(fm_layer_create(cpu[b], &L->cfg, &L->w, 1, &l), FM_OK); /* zeros: fine */
        fm_layer_destroy(l);
        s13[(size_t)(2 * S - 1) * H + 3] = 0x7fc0; /* BF16 NaN */
        assert_int_equal(fm_layer_create(cpu[b], &L->cfg, &L->w, 1, &l), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "shared_w13[63][3] is NaN"));
        s13[(size_t)(2 * S - 1) * H + 3] = 0;
        s2[7 * S + 1] = 0xff80; /* BF16 -Inf */
        assert_int_equal(fm_layer_create(cpu[b], &L->cfg, &L->w, 1, &l), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "shared_w2[7][1] is Inf"));
        L->cfg.shared_inter = 0;
        L->w.shared_w13 = L->w.shared_w2 = NULL;
        free(s13), free(s2);
    }
    /* the cuda backend: absent from this build, or no device on this machine */
    fm_status s = fm_layer_create(FM_BACKEND_CUDA, &L->cfg, &L->w, 1, &l);
    if (fm_backend_available(FM_BACKEND_CUDA) != FM_OK) {
        assert_true(s == FM_ERR_NO_BACKEND || s == FM_ERR_NO_DEVICE);
        assert_null(l);
    } else {
        assert_int_equal(s, FM_OK);
        fm_layer_destroy(l);
    }
    free(L);
}

static void forward_rejects_and_leaves_out_alone(void **st)
{
    (void)st;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() + 1);
    small_layer *L = make_layer(&r);
    fm_backend_kind kinds[] = {FM_BACKEND_CPU_REF, FM_BACKEND_CPU};
    for (int k = 0; k < 2; k++) {
        fm_layer *l = NULL;
        assert_int_equal(fm_layer_create(kinds[k], &L->cfg, &L->w, TMAX, &l), FM_OK);
        assert_int_equal(fm_layer_backend(l), kinds[k]);
        float out[TMAX * H], before[TMAX * H];
        fm_poison_f32(out, TMAX * H);
        memcpy(before, out, sizeof out);
        assert_int_equal(fm_layer_forward(l, L->x, TMAX + 1, out, NULL), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_forward(l, L->x, 0, out, NULL), FM_ERR_BAD_SHAPE);
        assert_int_equal(fm_layer_forward(l, NULL, 1, out, NULL), FM_ERR_INVALID_ARG);
        uint16_t keep = L->x[H + 5];
        L->x[H + 5] = 0x7fc0; /* BF16 NaN in token 1 */
        assert_int_equal(fm_layer_forward(l, L->x, 2, out, NULL), FM_ERR_NONFINITE);
        assert_non_null(strstr(fm_last_error(), "x[1][5]"));
        L->x[H + 5] = 0xff80; /* -Inf */
        assert_int_equal(fm_layer_forward(l, L->x, 2, out, NULL), FM_ERR_NONFINITE);
        L->x[H + 5] = keep;
        assert_memory_equal(out, before, sizeof out);
        /* and a good call writes every element */
        fm_run_stats stats;
        assert_int_equal(fm_layer_forward(l, L->x, TMAX, out, &stats), FM_OK);
        assert_int_equal(fm_first_nonfinite(out, TMAX * H), -1);
        assert_true(stats.ms >= 0.0);
        fm_layer_destroy(l);
    }
    free(L);
}

static void backend_names(void **st)
{
    (void)st;
    fm_backend_kind k;
    assert_int_equal(fm_backend_parse("nope", &k), FM_ERR_INVALID_ARG);
    assert_true(strlen(fm_last_error()) > 0);
    assert_int_equal(fm_backend_parse("CPU-REF", &k), FM_OK);
    assert_int_equal(k, FM_BACKEND_CPU_REF);
    assert_string_equal(fm_last_error(), ""); /* success clears the detail */
    for (int i = 0; i < FM_BACKEND_COUNT; i++) {
        assert_int_equal(fm_backend_parse(fm_backend_name((fm_backend_kind)i), &k), FM_OK);
        assert_int_equal(k, i);
    }
    assert_string_equal(fm_backend_name((fm_backend_kind)99), "unknown");
    assert_int_equal(fm_backend_available((fm_backend_kind)99), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_backend_available(FM_BACKEND_CPU), FM_OK);
    /* every status has a name and a message, and the table has no gaps */
    for (int s = 0; s < FM_STATUS_COUNT_; s++) {
        assert_true(strncmp(fm_status_name((fm_status)s), "FM_", 3) == 0);
        assert_true(strcmp(fm_status_str((fm_status)s), "unknown status") != 0);
    }
    assert_string_equal(fm_status_str((fm_status)-1), "unknown status");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_rejects),
        cmocka_unit_test(plans_on_cpu),
        cmocka_unit_test(accuracy_table),
        cmocka_unit_test(forward_rejects_and_leaves_out_alone),
        cmocka_unit_test(backend_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
