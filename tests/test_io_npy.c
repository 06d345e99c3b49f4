/* test_io_npy.c - the .npy reader and writer (fp4moe/io.h): round trips of
 * fresh random FP32 and BF16 arrays, headers of every version numpy writes
 * (1.0, 2.0, 3.0; ml_dtypes' '<V2' bfloat16), and malformed files, each with
 * its specific status.
 *
 * Also the checks of `fp4moe run --input/--output` (tests/io.cmake):
 *   test_io_npy --write-input CKPT X.npy       x [16][hidden of CKPT layer 1] FP32
 *   test_io_npy --check-output CKPT X.npy Y.npy  Y must equal, bit for bit,
 *       fm_moe_forward_ref of the loaded layer on bf16(X): what cpu-ref computes.
 */
#include "test_io_fixture.h"

/* Build a file: magic, version, header text padded as given, then data. */
static size_t make(uint8_t *buf, int major, const char *hdr, const void *data, size_t nbytes)
{
    size_t hl = strlen(hdr), off = major == 1 ? 10 : 12;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    buf[7] = 0;
    buf[8] = (uint8_t)(hl & 255);
    buf[9] = (uint8_t)(hl >> 8);
    if (major != 1) buf[10] = buf[11] = 0;
    memcpy(buf + off, hdr, hl);
    memcpy(buf + off + hl, data, nbytes);
    return off + hl + nbytes;
}

static void expect_parse(const uint8_t *buf, size_t len, fm_status want, const char *needle)
{
    fm_npy a;
    memset(&a, 0x5a, sizeof a); /* poisoned: must come back zeroed on failure */
    fm_status st = fm_npy_parse(buf, len, "t.npy", &a);
    if (st != want || (needle && !strstr(fm_last_error(), needle)))
        fail_msg("got %s '%s', want %s with '%s'", fm_status_name(st), fm_last_error(), fm_status_name(want),
                 needle ? needle : "");
    if (st != FM_OK) assert_null(a.data);
    fm_npy_free(&a);
}

static void test_round_trip(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    enum { R = 7, C = 33 };
    float x[R * C];
    uint16_t b[R * C];
    fm_rng_fill_normal(&r, x, R * C, 1.0f);
    for (int i = 0; i < R * C; i++) b[i] = fm_bf16_encode(x[i] * 3.0f);
    char p[400];
    snprintf(p, sizeof p, "%s/x.npy", g_dir);
    const int64_t shape[2] = {R, C};
    assert_int_equal(fm_npy_write(p, FM_DTYPE_F32, 2, shape, x), FM_OK);
    fm_npy a;
    assert_int_equal(fm_npy_read(p, &a), FM_OK);
    assert_int_equal(a.dtype, FM_DTYPE_F32);
    assert_int_equal(a.ndim, 2);
    assert_true(a.shape[0] == R && a.shape[1] == C && a.numel == R * C);
    assert_memory_equal(a.data, x, sizeof x);
    fm_npy_free(&a);
    assert_int_equal(fm_npy_write(p, FM_DTYPE_BF16, 2, shape, b), FM_OK);
    assert_int_equal(fm_npy_read(p, &a), FM_OK);
    assert_int_equal(a.dtype, FM_DTYPE_BF16);
    assert_memory_equal(a.data, b, sizeof b);
    fm_npy_free(&a);
    /* 1-D and 0-D shapes as numpy writes them: (5,) and () */
    const int64_t s1[1] = {5};
    assert_int_equal(fm_npy_write(p, FM_DTYPE_F32, 1, s1, x), FM_OK);
    assert_int_equal(fm_npy_read(p, &a), FM_OK);
    assert_true(a.ndim == 1 && a.shape[0] == 5);
    fm_npy_free(&a);
    assert_int_equal(fm_npy_write(p, FM_DTYPE_F32, 0, NULL, x), FM_OK);
    assert_int_equal(fm_npy_read(p, &a), FM_OK);
    assert_true(a.ndim == 0 && a.numel == 1 && ((float *)a.data)[0] == x[0]);
    fm_npy_free(&a);
    /* the writer's header is what numpy writes: data aligned to 64 bytes */
    FILE *f = fopen(p, "rb");
    uint8_t h[10];
    assert_int_equal(fread(h, 1, 10, f), 10);
    fclose(f);
    assert_int_equal((10 + h[8] + 256 * h[9]) % 64, 0);
    assert_int_equal(fm_npy_write(p, FM_DTYPE_F16, 2, shape, b), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_npy_read("/nonexistent/x.npy", &a), FM_ERR_IO);
}

static void test_versions(void **state)
{
    (void)state;
    static uint8_t buf[4096];
    const uint16_t d[6] = {0x3f80, 0x4000, 0xbf80, 0, 1, 0x7f7f};
    fm_npy a;
    /* what np.save writes for an ml_dtypes.bfloat16 array */
    size_t n = make(buf, 1, "{'descr': '<V2', 'fortran_order': False, 'shape': (2, 3), }          \n", d, 12);
    assert_int_equal(fm_npy_parse(buf, n, "t", &a), FM_OK);
    assert_true(a.dtype == FM_DTYPE_BF16 && a.shape[0] == 2 && a.shape[1] == 3);
    assert_memory_equal(a.data, d, 12);
    fm_npy_free(&a);
    /* version 2.0 and 3.0 (4-byte header length), keys in another order, double quotes */
    n = make(buf, 2, "{\"shape\": (3, 2), 'fortran_order': False, 'descr': '<u2'}\n", d, 12);
    assert_int_equal(fm_npy_parse(buf, n, "t", &a), FM_OK);
    assert_true(a.dtype == FM_DTYPE_BF16 && a.shape[0] == 3);
    fm_npy_free(&a);
    n = make(buf, 3, "{'descr': '|V2', 'fortran_order': False, 'shape': (6,), }\n", d, 12);
    assert_int_equal(fm_npy_parse(buf, n, "t", &a), FM_OK);
    fm_npy_free(&a);
}

static void test_malformed(void **state)
{
    (void)state;
    static uint8_t buf[4096];
    const float d[8] = {0};
    const char *ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
    size_t n = make(buf, 1, ok, d, 24);
    expect_parse(buf, n, FM_OK, NULL);
    expect_parse(buf, n - 1, FM_ERR_FORMAT, "truncated");
    expect_parse(buf, 8, FM_ERR_FORMAT, "not a .npy");
    buf[1] = 'X';
    expect_parse(buf, n, FM_ERR_FORMAT, "magic");
    n = make(buf, 1, ok, d, 28);
    expect_parse(buf, n, FM_ERR_FORMAT, "trailing bytes");
    n = make(buf, 4, ok, d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "version 4.0");
    n = make(buf, 1, ok, d, 24);
    buf[8] = 0xff; /* header length beyond the file */
    expect_parse(buf, n, FM_ERR_FORMAT, "runs past the file");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", d, 24);
    expect_parse(buf, n, FM_ERR_UNSUPPORTED, "Fortran order");
    n = make(buf, 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", d, 24);
    expect_parse(buf, n, FM_ERR_UNSUPPORTED, "big-endian");
    n = make(buf, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "dtype '<f8'");
    n = make(buf, 1, "{'descr': '<f4', 'shape': (2, 3), }\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "lacks 'fortran_order'");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "unexpected or repeated key 'x'");
    n = make(buf, 1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "repeated key 'descr'");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "non-negative integers");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", d, 4);
    expect_parse(buf, n, FM_ERR_BAD_SHAPE, "more than 8 dimensions");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", d, 4);
    expect_parse(buf, n, FM_ERR_BAD_SHAPE, "overflows");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", d, 4);
    expect_parse(buf, n, FM_ERR_BAD_SHAPE, "overflows");
    n = make(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } junk\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "text after the dict");
    n = make(buf, 1, "['descr', '<f4']\n", d, 24);
    expect_parse(buf, n, FM_ERR_FORMAT, "not a dict");
}

/* ---- the CLI checks ---------------------------------------------------------- */

static int write_input(const char *ckpt, const char *path)
{
    fm_ckpt_load_opts o = {.validate_only = 1};
    fm_ckpt_layer *l = load_ok(ckpt, LAYER, &o);
    int64_t shape[2] = {16, l->cfg.hidden};
    size_t n = (size_t)(shape[0] * shape[1]);
    float *x = malloc(n * sizeof *x);
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    fm_rng_fill_normal(&r, x, n, 1.0f);
    fm_status s = fm_npy_write(path, FM_DTYPE_F32, 2, shape, x);
    free(x);
    fm_ckpt_layer_free(l);
    return s == FM_OK ? 0 : 1;
}

static int check_output(const char *ckpt, const char *xp, const char *yp)
{
    fm_npy x, y;
    fm_ckpt_layer *l = load_ok(ckpt, LAYER, NULL);
    if (fm_npy_read(xp, &x) != FM_OK || fm_npy_read(yp, &y) != FM_OK) {
        fprintf(stderr, "check-output: %s\n", fm_last_error());
        return 1;
    }
    int NT = (int)x.shape[0], H2 = l->cfg.hidden, bad = 0;
    if (y.dtype != FM_DTYPE_F32 || y.ndim != 2 || y.shape[0] != NT || y.shape[1] != H2) {
        fprintf(stderr, "check-output: y is not float32 [%d][%d]\n", NT, H2);
        return 1;
    }
    uint16_t *xb = malloc(x.numel * sizeof *xb);
    float *ref = malloc(y.numel * sizeof *ref);
    for (uint64_t i = 0; i < x.numel; i++) xb[i] = fm_bf16_encode(((const float *)x.data)[i]); /* RNE, as documented */
    fm_poison_f32(ref, (size_t)y.numel);
    if (fm_moe_forward_ref(&l->cfg, &l->w, xb, NT, ref) != FM_OK) bad = 1;
    else if (fm_first_nonfinite(ref, (size_t)y.numel) >= 0 || memcmp(ref, y.data, y.numel * 4)) bad = 1;
    if (bad) fprintf(stderr, "check-output: %s differs from fm_moe_forward_ref\n", yp);
    free(xb);
    free(ref);
    fm_npy_free(&x);
    fm_npy_free(&y);
    fm_ckpt_layer_free(l);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--write-input")) return write_input(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "--check-output")) return check_output(argv[2], argv[3], argv[4]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
