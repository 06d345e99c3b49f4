/* test_moe_bad_input.c - bad input to the reference, the router and both CPU
 * backends: each gets its specific status and a detail message, nothing
 * crashes, and the caller's output buffers are byte-for-byte untouched.
 * Policy checked: NaN/Inf in x is rejected (FM_ERR_NONFINITE), and so is a
 * forward whose output overflows (finite but huge x): an Inf is never handed
 * back as a result.
 */
#include "test_moe_fixture.h"

#include <stdio.h>

enum { T = 3 };

typedef struct {
    fx_layer  L;
    uint16_t *x;
    float    *out, *out0; /* out0: the poisoned copy out must still equal */
    size_t    n;
} bench;

static int setup(void **state)
{
    bench *b = calloc(1, sizeof *b);
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    fm_moe_config c = fx_config(4, 2, 32, 32, FM_FORMAT_NVFP4);
    fx_build(&b->L, &c, &r, 1, 0);
    b->n = (size_t)T * c.hidden;
    b->x = fx_bf16(&r, b->n, 1.0f);
    b->out = malloc(sizeof(float) * b->n);
    b->out0 = malloc(sizeof(float) * b->n);
    fm_poison_f32(b->out, b->n);
    memcpy(b->out0, b->out, sizeof(float) * b->n);
    *state = b;
    return 0;
}

static int teardown(void **state)
{
    bench *b = *state;
    fx_free(&b->L);
    free(b->x), free(b->out), free(b->out0), free(b);
    return 0;
}

/* The status, a detail message, and `out` untouched. */
#define EXPECT(b, call, status)                                               \
    do {                                                                      \
        assert_int_equal((call), (status));                                   \
        assert_true(strlen(fm_last_error()) > 0);                             \
        printf("# %-20s %s\n", fm_status_name(status), fm_last_error());      \
        assert_memory_equal((b)->out, (b)->out0, sizeof(float) * (b)->n);     \
    } while (0)

static void test_ref_bad_args(void **state)
{
    bench *b = *state;
    fm_moe_config c = b->L.cfg;
    EXPECT(b, fm_moe_forward_ref(NULL, &b->L.w, b->x, T, b->out), FM_ERR_INVALID_ARG);
    EXPECT(b, fm_moe_forward_ref(&c, NULL, b->x, T, b->out), FM_ERR_INVALID_ARG);
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, NULL, T, b->out), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_moe_forward_ref(&c, &b->L.w, b->x, T, NULL), FM_ERR_INVALID_ARG);
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, 0, b->out), FM_ERR_BAD_SHAPE);
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, -5, b->out), FM_ERR_BAD_SHAPE);
    /* T x top_k past int32 (2^30 x 2): refused before x is read. It used to run, and the
     * finalize's slot index t * top_k + j overflowed int (undefined behaviour) */
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, 1 << 30, b->out), FM_ERR_BAD_SHAPE);
    assert_non_null(strstr(fm_last_error(), "routed rows exceed"));

    fm_moe_config bad = c;
    bad.top_k = 5; /* > 4 experts */
    EXPECT(b, fm_moe_forward_ref(&bad, &b->L.w, b->x, T, b->out), FM_ERR_INVALID_ARG);
    bad = c;
    bad.hidden = 40; /* not a multiple of the NVFP4 block */
    EXPECT(b, fm_moe_forward_ref(&bad, &b->L.w, b->x, T, b->out), FM_ERR_BAD_SHAPE);
    bad = c;
    bad.wfmt = (fm_format)7;
    EXPECT(b, fm_moe_forward_ref(&bad, &b->L.w, b->x, T, b->out), FM_ERR_FORMAT);
    bad = c;
    bad.n_group = 3; /* does not divide 4 experts */
    bad.topk_group = 1;
    EXPECT(b, fm_moe_forward_ref(&bad, &b->L.w, b->x, T, b->out), FM_ERR_INVALID_ARG);
}

static void test_ref_bad_weights(void **state)
{
    bench *b = *state;
    fm_moe_config c = b->L.cfg;
    fm_moe_weights w = b->L.w;
    w.w13 = NULL;
    EXPECT(b, fm_moe_forward_ref(&c, &w, b->x, T, b->out), FM_ERR_INVALID_ARG);

    fm_qtensor saved = b->L.w13[1];
    b->L.w13[1].rows = 2 * c.inter + 16; /* wrong shape */
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, T, b->out), FM_ERR_BAD_SHAPE);
    b->L.w13[1] = saved;
    saved = b->L.w2[0];
    b->L.w2[0].fmt = FM_FORMAT_MXFP4; /* disagrees with cfg */
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, T, b->out), FM_ERR_FORMAT);
    b->L.w2[0] = saved;

    uint8_t keep = b->L.w13[2].scales[5];
    b->L.w13[2].scales[5] = 0x7F; /* E4M3 NaN */
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, T, b->out), FM_ERR_NONFINITE);
    fm_layer *l = (fm_layer *)&l;
    EXPECT(b, fm_layer_create(FM_BACKEND_CPU, &c, &b->L.w, T, &l), FM_ERR_NONFINITE);
    assert_null(l);
    EXPECT(b, fm_layer_create(FM_BACKEND_CPU_REF, &c, &b->L.w, T, &l), FM_ERR_NONFINITE);
    assert_null(l);
    b->L.w13[2].scales[5] = keep;

    /* the reference still works after all that */
    assert_int_equal(fm_moe_forward_ref(&c, &b->L.w, b->x, T, b->out), FM_OK);
    assert_true(fm_first_nonfinite(b->out, b->n) < 0);
    memcpy(b->out, b->out0, sizeof(float) * b->n);
}

static void test_nonfinite_and_overflow(void **state)
{
    bench *b = *state;
    fm_moe_config c = b->L.cfg;
    const uint16_t specials[3] = {0x7FC0, 0x7F80, 0xFF80}; /* NaN, +Inf, -Inf */
    fm_layer *ls[2] = {NULL, NULL};
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU_REF, &c, &b->L.w, T, &ls[0]), FM_OK);
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &c, &b->L.w, T, &ls[1]), FM_OK);
    for (int i = 0; i < 3; i++) {
        uint16_t keep = b->x[37];
        b->x[37] = specials[i];
        EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, b->x, T, b->out), FM_ERR_NONFINITE);
        for (int k = 0; k < 2; k++) EXPECT(b, fm_layer_forward(ls[k], b->x, T, b->out, NULL), FM_ERR_NONFINITE);
        b->x[37] = keep;
    }
    /* Finite x so large that the router logits overflow (3e38), or only the
     * SwiGLU product (1e20: logits ~1e20, h ~1e40): rejected, never Inf. */
    uint16_t *big = malloc(sizeof(uint16_t) * b->n);
    for (size_t i = 0; i < b->n; i++) big[i] = fm_bf16_encode(i % 2 ? 3e38f : -3e38f);
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, big, T, b->out), FM_ERR_NONFINITE);
    for (int k = 0; k < 2; k++) EXPECT(b, fm_layer_forward(ls[k], big, T, b->out, NULL), FM_ERR_NONFINITE);
    for (size_t i = 0; i < b->n; i++) big[i] = fm_bf16_encode(fm_bf16_decode(b->x[i]) * 1e20f);
    EXPECT(b, fm_moe_forward_ref(&c, &b->L.w, big, T, b->out), FM_ERR_NONFINITE);
    for (int k = 0; k < 2; k++) EXPECT(b, fm_layer_forward(ls[k], big, T, b->out, NULL), FM_ERR_NONFINITE);
    /* T outside [1, max_tokens] and NULL arguments through the layer */
    for (int k = 0; k < 2; k++) {
        EXPECT(b, fm_layer_forward(ls[k], b->x, T + 1, b->out, NULL), FM_ERR_BAD_SHAPE);
        EXPECT(b, fm_layer_forward(ls[k], b->x, 0, b->out, NULL), FM_ERR_BAD_SHAPE);
        EXPECT(b, fm_layer_forward(ls[k], NULL, T, b->out, NULL), FM_ERR_INVALID_ARG);
        fm_layer_destroy(ls[k]);
    }
    /* W4A4: the overflowing FC2 input is caught by the activation quantizer */
    fm_moe_config ca = c;
    ca.act_nvfp4 = 1;
    EXPECT(b, fm_moe_forward_ref(&ca, &b->L.w, big, T, b->out), FM_ERR_NONFINITE);
    assert_int_equal(fm_layer_create(FM_BACKEND_CPU, &ca, &b->L.w, T, &ls[1]), FM_OK);
    EXPECT(b, fm_layer_forward(ls[1], big, T, b->out, NULL), FM_ERR_NONFINITE);
    fm_layer_destroy(ls[1]);
    free(big);
}

static void test_route_bad_input(void **state)
{
    bench *b = *state;
    fm_moe_config c = b->L.cfg; /* 4 experts, top-2 */
    float logits[T * 4] = {0}, w[T * 2], w0[T * 2], bias[4] = {0};
    int32_t ids[T * 2], ids0[T * 2];
    fm_poison_f32(w, T * 2);
    fm_poison_bytes(ids, sizeof ids);
    memcpy(w0, w, sizeof w);
    memcpy(ids0, ids, sizeof ids);
    logits[9] = NAN;
    assert_int_equal(fm_moe_route(&c, NULL, logits, T, ids, w), FM_ERR_NONFINITE);
    logits[9] = INFINITY;
    assert_int_equal(fm_moe_route(&c, NULL, logits, T, ids, w), FM_ERR_NONFINITE);
    logits[9] = 0.0f;
    bias[2] = NAN;
    assert_int_equal(fm_moe_route(&c, bias, logits, T, ids, w), FM_ERR_NONFINITE);
    assert_int_equal(fm_moe_route(&c, NULL, NULL, T, ids, w), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_moe_route(&c, NULL, logits, T, NULL, w), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_moe_route(&c, NULL, logits, 0, ids, w), FM_ERR_BAD_SHAPE);
    c.top_k = 9;
    assert_int_equal(fm_moe_route(&c, NULL, logits, T, ids, w), FM_ERR_INVALID_ARG);
    assert_true(strlen(fm_last_error()) > 0);
    assert_memory_equal(w, w0, sizeof w);
    assert_memory_equal(ids, ids0, sizeof ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ref_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ref_bad_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonfinite_and_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_route_bad_input, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
