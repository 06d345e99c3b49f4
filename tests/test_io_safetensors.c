/* test_io_safetensors.c - the safetensors reader and writer: a round trip of
 * every dtype fp4moe meets, then every kind of bad file (crafted byte by byte
 * here) giving its specific status with the file and tensor named, every
 * truncation of a valid file rejected, and random header corruptions that
 * either fail cleanly or leave every tensor inside the buffer (ASan in CI
 * checks that nothing reads outside it); small tensors (scales, biases) read
 * as FP32 exactly as the format codecs decode them.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "io/io_internal.h" /* fm_st_to_f32 */

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fm_io_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

/* A raw file: 8-byte length (hlen, or the header's size when hlen < 0), header text, data. */
static void write_raw(const char *path, long long hlen, const char *header, const void *data, size_t ndata)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = hlen < 0 ? strlen(header) : (uint64_t)hlen;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(n >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    if (*header) assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    if (ndata) assert_int_equal(fwrite(data, 1, ndata, f), ndata);
    fclose(f);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* Round trip: every dtype, scalar, zero-size and F4 tensors, metadata. */
static void test_round_trip(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed());
    enum { N = 7 };
    uint8_t u8[24 * 8], e4m3[24], f4[10];
    float f32s = 0.125f, f32v[5];
    uint16_t bf16[3 * 5];
    for (size_t i = 0; i < sizeof u8; i++) u8[i] = (uint8_t)fm_rng_u64(&r);
    for (size_t i = 0; i < sizeof e4m3; i++) e4m3[i] = (uint8_t)fm_rng_u64(&r);
    for (size_t i = 0; i < sizeof f4; i++) f4[i] = (uint8_t)fm_rng_u64(&r);
    for (int i = 0; i < 5; i++) f32v[i] = fm_rng_normal(&r);
    for (int i = 0; i < 15; i++) bf16[i] = (uint16_t)fm_rng_u64(&r);
    fm_st_write_item it[N] = {
        {"w.weight", FM_DTYPE_U8, 2, {24, 8}, u8},
        {"w.weight_scale", FM_DTYPE_F8_E4M3, 2, {24, 1}, e4m3},
        {"w.weight_scale_2", FM_DTYPE_F32, 0, {0}, &f32s},
        {"v\"quoted\\name", FM_DTYPE_F32, 1, {5}, f32v},
        {"b", FM_DTYPE_BF16, 2, {3, 5}, bf16},
        {"empty", FM_DTYPE_I32, 2, {0, 4}, NULL},
        {"packed", FM_DTYPE_F4, 1, {20}, f4},
    };
    const char *mk[2] = {"format", "note"}, *mv[2] = {"pt", "line\nbreak"};
    char path[300];
    path_in(path, sizeof path, "rt.safetensors");
    assert_int_equal(fm_safetensors_write(path, it, N, mk, mv, 2), FM_OK);

    size_t len;
    uint8_t *buf = read_all(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    assert_int_equal((8 + hlen) % 8, 0); /* data section 8-byte aligned */

    for (int pass = 0; pass < 2; pass++) { /* from the file (pread), then from a buffer */
        fm_safetensors *st = NULL;
        if (pass == 0) assert_int_equal(fm_safetensors_open(path, &st), FM_OK);
        else assert_int_equal(fm_safetensors_parse(buf, len, "buf", &st), FM_OK);
        assert_int_equal(fm_safetensors_count(st), N);
        assert_int_equal(fm_safetensors_size(st), len);
        assert_string_equal(fm_safetensors_metadata(st, "format"), "pt");
        assert_string_equal(fm_safetensors_metadata(st, "note"), "line\nbreak");
        assert_null(fm_safetensors_metadata(st, "absent"));
        for (int i = 0; i < N; i++) {
            const fm_st_tensor *t = NULL;
            assert_int_equal(fm_safetensors_find(st, it[i].name, &t), FM_OK);
            assert_string_equal(t->name, it[i].name);
            assert_int_equal(t->dtype, it[i].dtype);
            assert_int_equal(t->ndim, it[i].ndim);
            for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], it[i].shape[d]);
            if (pass == 0) assert_null(t->data); /* a file is never mapped */
            else assert_true(t->data >= buf && t->data + t->nbytes <= buf + len);
            uint8_t got[256];
            assert_true(t->nbytes <= sizeof got);
            fm_poison_bytes(got, sizeof got);
            assert_int_equal(fm_st_read(t, 0, (size_t)t->nbytes, got), FM_OK);
            if (t->nbytes) assert_memory_equal(got, it[i].data, t->nbytes);
            if (t->nbytes) assert_memory_equal(buf + t->file_offset, it[i].data, t->nbytes);
            if (t->nbytes > 1) { /* a slice, and a range past the end */
                assert_int_equal(fm_st_read(t, 1, (size_t)t->nbytes - 1, got), FM_OK);
                assert_memory_equal(got, (const uint8_t *)it[i].data + 1, t->nbytes - 1);
            }
            assert_int_equal(fm_st_read(t, 1, (size_t)t->nbytes, got), FM_ERR_INVALID_ARG);
            assert_non_null(strstr(fm_last_error(), it[i].name));
        }
        const fm_st_tensor *t;
        assert_int_equal(fm_safetensors_find(st, "w.weight", &t), FM_OK);
        assert_int_equal(t->nbytes, 24 * 8);
        assert_int_equal(fm_safetensors_find(st, "packed", &t), FM_OK);
        assert_int_equal(t->nbytes, 10);
        assert_int_equal(fm_safetensors_find(st, "nope", &t), FM_ERR_NOT_FOUND);
        /* ascending offsets */
        for (size_t i = 1; i < fm_safetensors_count(st); i++)
            assert_true(fm_safetensors_at(st, i)->file_offset >= fm_safetensors_at(st, i - 1)->file_offset);
        assert_null(fm_safetensors_at(st, N));
        fm_safetensors_close(st);
    }
    free(buf);
}

/* One crafted bad file: status and the words the message must contain. */
typedef struct {
    const char *what;
    long long   hlen;   /* -1: the header's length */
    const char *header;
    size_t      ndata;  /* zero bytes of data after the header */
    fm_status   want;
    const char *needle; /* in fm_last_error(), besides the file name */
} bad_case;

static void test_bad_files(void **state)
{
    (void)state;
    static const bad_case k_cases[] = {
        /* what                   hlen  header                                                    ndata status  needle */
        {"malformed JSON",         -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]", 2, FM_ERR_FORMAT, "JSON"},
        {"not an object",          -1, "[1,2,3]", 0, FM_ERR_FORMAT, "'{'"},
        {"garbage after JSON",     -1, "{}  x", 0, FM_ERR_FORMAT, "after the JSON"},
        {"header beyond file",    500, "{}", 0, FM_ERR_FORMAT, "beyond the file"},
        {"huge header length",   1LL << 62, "{}", 0, FM_ERR_FORMAT, "beyond the file"},
        {"unknown dtype",          -1, "{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, FM_ERR_FORMAT, "'a'"},
        {"missing offsets",        -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2, FM_ERR_FORMAT, "'a'"},
        {"negative dim",           -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,2]}}", 2, FM_ERR_FORMAT, "'a'"},
        {"fractional dim",         -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,2]}}", 2, FM_ERR_FORMAT, "'a'"},
        {"string offset",          -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[\"0\",2]}}", 2, FM_ERR_FORMAT, "'a'"},
        {"entry not object",       -1, "{\"a\":7}", 0, FM_ERR_FORMAT, "'a'"},
        {"offsets out of range",   -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4, FM_ERR_OUT_OF_RANGE, "'a'"},
        {"end before begin",       -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,1]}}", 4, FM_ERR_FORMAT, "'a'"},
        {"dtype x shape mismatch", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, FM_ERR_BAD_SHAPE, "'a'"},
        {"F4 odd count",           -1, "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, FM_ERR_BAD_SHAPE, "'a'"},
        {"overlap",                -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                                        "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6, FM_ERR_FORMAT, "overlap"},
        {"gap",                    -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                                        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}", 6, FM_ERR_FORMAT, "'b'"},
        {"trailing bytes",         -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 5, FM_ERR_FORMAT, "not indexed"},
        {"duplicate name",         -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                                        "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4, FM_ERR_FORMAT, "twice"},
        {"too many dims",          -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, FM_ERR_UNSUPPORTED, "'a'"},
        {"metadata not strings",   -1, "{\"__metadata__\":{\"k\":1}}", 0, FM_ERR_FORMAT, "__metadata__"},
        {"offset beyond 2^53",     -1, "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1e300]}}", 2, FM_ERR_FORMAT, "'a'"},
    };
    static const uint8_t zeros[64];
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const bad_case *c = &k_cases[i];
        char path[300];
        path_in(path, sizeof path, "bad.safetensors");
        write_raw(path, c->hlen, c->header, zeros, c->ndata);
        fm_safetensors *st = (fm_safetensors *)&st; /* poisoned: must come back NULL */
        fm_status s = fm_safetensors_open(path, &st);
        if (s != c->want || !strstr(fm_last_error(), "bad.safetensors") || !strstr(fm_last_error(), c->needle))
            fail_msg("%s: got %s '%s', want %s with '%s'", c->what, fm_status_name(s), fm_last_error(),
                     fm_status_name(c->want), c->needle);
        assert_null(st);
    }
}

static void test_bad_paths(void **state)
{
    (void)state;
    fm_safetensors *st = NULL;
    char path[300];
    path_in(path, sizeof path, "missing.safetensors");
    assert_int_equal(fm_safetensors_open(path, &st), FM_ERR_IO);
    assert_non_null(strstr(fm_last_error(), "missing.safetensors"));
    assert_int_equal(fm_safetensors_open(g_dir, &st), FM_ERR_IO); /* a directory */
    path_in(path, sizeof path, "empty.safetensors");
    FILE *f = fopen(path, "wb");
    fclose(f);
    assert_int_equal(fm_safetensors_open(path, &st), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_last_error(), "truncated"));
    assert_int_equal(fm_safetensors_open(NULL, &st), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_safetensors_open(path, NULL), FM_ERR_INVALID_ARG);
    assert_int_equal(fm_safetensors_parse(NULL, 5, "x", &st), FM_ERR_INVALID_ARG);
    assert_null(st);
}

/* Every strict prefix of a valid file is rejected (truncated downloads). */
static void test_every_truncation(void **state)
{
    (void)state;
    uint8_t d[40];
    memset(d, 0x5a, sizeof d);
    fm_st_write_item it[2] = {{"x", FM_DTYPE_U8, 2, {4, 5}, d}, {"y", FM_DTYPE_BF16, 1, {10}, d + 20}};
    char path[300];
    path_in(path, sizeof path, "trunc.safetensors");
    assert_int_equal(fm_safetensors_write(path, it, 2, NULL, NULL, 0), FM_OK);
    size_t len;
    uint8_t *buf = read_all(path, &len);
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc(n ? n : 1); /* exact-size copy: ASan sees any overread */
        memcpy(cut, buf, n);
        fm_safetensors *st = NULL;
        fm_status s = fm_safetensors_parse(cut, n, "cut", &st);
        if (s == FM_OK) fail_msg("prefix of %zu/%zu bytes accepted", n, len);
        assert_null(st);
        free(cut);
    }
    free(buf);
}

/* Random byte corruption of the header: a clean status, or tensors in bounds. */
static void test_corruption_never_escapes(void **state)
{
    (void)state;
    fm_rng r;
    fm_rng_init(&r, fm_test_seed() ^ 0x51);
    uint8_t d[64];
    for (size_t i = 0; i < sizeof d; i++) d[i] = (uint8_t)i;
    fm_st_write_item it[3] = {{"a.weight", FM_DTYPE_U8, 2, {4, 4}, d},
                              {"a.weight_scale", FM_DTYPE_F8_E4M3, 2, {4, 1}, d + 16},
                              {"b", FM_DTYPE_F32, 1, {11}, d + 20}};
    char path[300];
    path_in(path, sizeof path, "corrupt.safetensors");
    assert_int_equal(fm_safetensors_write(path, it, 3, NULL, NULL, 0), FM_OK);
    size_t len;
    uint8_t *buf = read_all(path, &len);
    int iters = getenv("FM_ASAN") ? 3000 : 20000, accepted = 0;
    for (int k = 0; k < iters; k++) {
        uint8_t *m = malloc(len);
        memcpy(m, buf, len);
        int flips = 1 + (int)(fm_rng_u64(&r) % 3);
        for (int j = 0; j < flips; j++) {
            size_t at = (size_t)(fm_rng_u64(&r) % len);
            m[at] = (fm_rng_u64(&r) & 1) ? (uint8_t)fm_rng_u64(&r) : (uint8_t)"0123456789,[]{}\" "[fm_rng_u64(&r) % 17];
        }
        fm_safetensors *st = NULL;
        if (fm_safetensors_parse(m, len, "m", &st) == FM_OK) {
            accepted++;
            uint64_t total = 0;
            for (size_t i = 0; i < fm_safetensors_count(st); i++) {
                const fm_st_tensor *t = fm_safetensors_at(st, i);
                assert_true(t->data >= m && t->data + t->nbytes <= m + len);
                total += t->nbytes;
            }
            assert_true(total <= len);
            fm_safetensors_close(st);
        } else {
            assert_null(st);
            assert_true(fm_last_error()[0] != '\0');
        }
        free(m);
    }
    print_message("# %d of %d corrupted headers still valid (changed data bytes or names)\n", accepted, iters);
    free(buf);
}

static void test_writer_rejects(void **state)
{
    (void)state;
    uint8_t d[8] = {0};
    char path[300];
    path_in(path, sizeof path, "w.safetensors");
    fm_st_write_item dup[2] = {{"a", FM_DTYPE_U8, 1, {4}, d}, {"a", FM_DTYPE_U8, 1, {4}, d + 4}};
    assert_int_equal(fm_safetensors_write(path, dup, 2, NULL, NULL, 0), FM_ERR_INVALID_ARG);
    fm_st_write_item nul[1] = {{"a", FM_DTYPE_U8, 1, {4}, NULL}};
    assert_int_equal(fm_safetensors_write(path, nul, 1, NULL, NULL, 0), FM_ERR_INVALID_ARG);
    fm_st_write_item bad[1] = {{"a", (fm_dtype)99, 1, {4}, d}};
    assert_int_equal(fm_safetensors_write(path, bad, 1, NULL, NULL, 0), FM_ERR_FORMAT);
    fm_st_write_item neg[1] = {{"a", FM_DTYPE_U8, 1, {-4}, d}};
    assert_int_equal(fm_safetensors_write(path, neg, 1, NULL, NULL, 0), FM_ERR_INVALID_ARG);
    fm_st_write_item meta[1] = {{"__metadata__", FM_DTYPE_U8, 1, {4}, d}};
    assert_int_equal(fm_safetensors_write(path, meta, 1, NULL, NULL, 0), FM_ERR_INVALID_ARG);
    struct stat sb;
    assert_int_not_equal(stat(path, &sb), 0); /* nothing written on failure */
    fm_st_write_item ok[1] = {{"a", FM_DTYPE_U8, 1, {4}, d}};
    assert_int_equal(fm_safetensors_write("/nonexistent-dir/x.safetensors", ok, 1, NULL, NULL, 0), FM_ERR_IO);
    assert_non_null(strstr(fm_last_error(), "/nonexistent-dir/x.safetensors"));
}

static void test_dtype_table(void **state)
{
    (void)state;
    for (int d = 0; d < FM_DTYPE_COUNT; d++) {
        fm_dtype back;
        assert_int_equal(fm_dtype_parse(fm_dtype_name((fm_dtype)d), &back), FM_OK);
        assert_int_equal(back, d);
        assert_true(fm_dtype_bits((fm_dtype)d) > 0);
    }
    fm_dtype x;
    assert_int_equal(fm_dtype_parse("f32", &x), FM_ERR_FORMAT); /* case-sensitive, as the format */
    assert_string_equal(fm_dtype_name((fm_dtype)-1), "?");
    assert_int_equal(fm_dtype_bits(FM_DTYPE_F4), 4);
    assert_int_equal(fm_dtype_bits(FM_DTYPE_BF16), 16);
}

/* fm_st_to_f32 on every BF16 and F16 code (little-endian bytes, as in a file)
 * equals the codecs' decoders bit for bit, NaNs as NaNs of the same sign;
 * F32/F64 pass through; other dtypes are FM_ERR_FORMAT naming the tensor. */
static void test_to_f32(void **state)
{
    (void)state;
    static uint8_t raw[2 * 65536];
    static float got[65536];
    for (int c = 0; c < 65536; c++) raw[2 * c] = (uint8_t)c, raw[2 * c + 1] = (uint8_t)(c >> 8);
    for (int k = 0; k < 2; k++) {
        fm_st_tensor t = {.name = "b", .file = "f", .dtype = k ? FM_DTYPE_F16 : FM_DTYPE_BF16, .ndim = 1,
                          .shape = {65536}, .data = raw, .nbytes = sizeof raw};
        fm_poison_f32(got, 65536);
        assert_int_equal(fm_st_to_f32(&t, 0, 65536, got), FM_OK);
        for (int c = 0; c < 65536; c++) {
            float want = k ? fm_fp16_decode((uint16_t)c) : fm_bf16_decode((uint16_t)c);
            uint32_t gb, wb;
            memcpy(&gb, &got[c], 4), memcpy(&wb, &want, 4);
            int ok = isnan(want) ? isnan(got[c]) && signbit(got[c]) == signbit(want) : gb == wb;
            if (!ok) fail_msg("%s code 0x%04x: got %a, want %a", k ? "F16" : "BF16", c, (double)got[c], (double)want);
        }
    }
    /* F16 spot values: smallest subnormal, largest normal, -0, -Inf */
    const uint16_t h[4] = {0x0001, 0x7BFF, 0x8000, 0xFC00};
    const float hv[4] = {0x1p-24f, 65504.0f, -0.0f, -INFINITY};
    fm_st_tensor t = {.name = "h", .file = "f", .dtype = FM_DTYPE_F16, .ndim = 1, .shape = {4},
                      .data = (const uint8_t *)h, .nbytes = sizeof h};
    float v[4];
    assert_int_equal(fm_st_to_f32(&t, 0, 4, v), FM_OK);
    for (int i = 0; i < 4; i++) assert_memory_equal(&v[i], &hv[i], 4);
    fm_poison_f32(v, 4);
    assert_int_equal(fm_st_to_f32(&t, 1, 3, v), FM_OK); /* a slice */
    for (int i = 0; i < 3; i++) assert_memory_equal(&v[i], &hv[i + 1], 4);
    assert_int_equal(fm_st_to_f32(&t, 2, 3, v), FM_ERR_OUT_OF_RANGE); /* past the end */
    assert_int_equal(fm_st_to_f32(&t, -1, 1, v), FM_ERR_OUT_OF_RANGE);
    const double d = -2.5;
    t = (fm_st_tensor){.name = "d", .file = "f", .dtype = FM_DTYPE_F64, .ndim = 0, .data = (const uint8_t *)&d,
                       .nbytes = sizeof d};
    assert_int_equal(fm_st_to_f32(&t, 0, 1, v), FM_OK);
    assert_true(v[0] == -2.5f);
    t.dtype = FM_DTYPE_I32;
    v[0] = 7.0f;
    assert_int_equal(fm_st_to_f32(&t, 0, 1, v), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_last_error(), "'d'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bad_paths),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_corruption_never_escapes),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_to_f32),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
