/* format_dump.c - a filter exposing the format codecs to the Python oracle
 * (tests/py/codec_oracle.py), which compares them with ml_dtypes / numpy.
 *
 * Raw little-endian binary on stdin/stdout keeps millions of values cheap to
 * pass and avoids any text round trip of float values:
 *   format_dump enc  e2m1|e4m3|ue8m0|bf16|fp16     float32[n]  -> code[n] (u8, or u16 for bf16/fp16)
 *   format_dump dec  e2m1|e4m3|ue8m0|bf16|fp16     code[n]     -> float32[n]
 *   format_dump quant nvfp4|mxfp4|bf16 ROWS COLS [GLOBAL]
 *                                                  float32[rows*cols]
 *                                                  -> status (i32), then on FM_OK: data bytes,
 *                                                     scale bytes, global (f32), dequantized f32[rows*cols]
 *   format_dump swz ROWS SF_COLS                   u8[rows*sf_cols] -> swizzled bytes (padded size)
 * Exit status 0 unless the command line or I/O is bad (2).
 */
#include "fp4moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *read_all(size_t *n)
{
    size_t cap = 1 << 20, len = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) return NULL;
    size_t got;
    while ((got = fread(buf + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
    }
    *n = len;
    return buf;
}

static int put(const void *p, size_t n) { return fwrite(p, 1, n, stdout) == n ? 0 : 2; }

static int do_codec(int enc, const char *fmt)
{
    size_t nbytes;
    unsigned char *in = read_all(&nbytes);
    if (!in) return 2;
    int wide = !strcmp(fmt, "bf16") || !strcmp(fmt, "fp16");
    size_t in_size = enc ? 4 : (wide ? 2 : 1);
    size_t n = nbytes / in_size;
    size_t out_size = enc ? (wide ? 2 : 1) : 4;
    unsigned char *out = malloc(n * out_size + 1);
    if (!out) return 2;
    for (size_t i = 0; i < n; i++) {
        if (enc) {
            float x;
            memcpy(&x, in + 4 * i, 4);
            uint8_t c8 = 0;
            uint16_t c16 = 0;
            if (!strcmp(fmt, "e2m1")) c8 = fm_e2m1_encode(x);
            else if (!strcmp(fmt, "e4m3")) c8 = fm_e4m3_encode(x);
            else if (!strcmp(fmt, "ue8m0")) c8 = fm_ue8m0_encode(x);
            else if (!strcmp(fmt, "bf16")) c16 = fm_bf16_encode(x);
            else if (!strcmp(fmt, "fp16")) c16 = fm_fp16_encode(x);
            else return 2;
            if (wide) memcpy(out + 2 * i, &c16, 2);
            else out[i] = c8;
        } else {
            float y;
            uint16_t c16 = 0;
            if (wide) memcpy(&c16, in + 2 * i, 2);
            if (!strcmp(fmt, "e2m1")) y = fm_e2m1_decode(in[i]);
            else if (!strcmp(fmt, "e4m3")) y = fm_e4m3_decode(in[i]);
            else if (!strcmp(fmt, "ue8m0")) y = fm_ue8m0_decode(in[i]);
            else if (!strcmp(fmt, "bf16")) y = fm_bf16_decode(c16);
            else if (!strcmp(fmt, "fp16")) y = fm_fp16_decode(c16);
            else return 2;
            memcpy(out + 4 * i, &y, 4);
        }
    }
    int rc = put(out, n * out_size);
    free(in);
    free(out);
    return rc;
}

static int do_quant(const char *fmtname, int64_t rows, int64_t cols, const char *global)
{
    fm_format f;
    if (fm_format_parse(fmtname, &f) != FM_OK) return 2;
    size_t nbytes;
    float *src = read_all(&nbytes);
    if (!src || nbytes != (size_t)(rows * cols) * 4) return 2;
    size_t db = 0, sb = 0;
    int32_t st = fm_qtensor_bytes(f, rows, cols, &db, &sb);
    if (st != FM_OK) {
        free(src);
        return put(&st, 4);
    }
    fm_qtensor t = {.fmt = f, .rows = rows, .cols = cols, .data = malloc(db), .scales = malloc(sb + 1)};
    float *dq = malloc((size_t)(rows * cols) * 4);
    if (!t.data || !t.scales || !dq) return 2;
    float g = global ? strtof(global, NULL) : 0.0f;
    st = fm_quantize(src, global ? &g : NULL, &t);
    if (st == FM_OK) st = fm_dequantize(&t, dq);
    int rc = put(&st, 4);
    if (st == FM_OK && !rc) {
        rc = put(t.data, db);
        if (!rc) rc = put(t.scales, sb);
        if (!rc) rc = put(&t.global_scale, 4);
        if (!rc) rc = put(dq, (size_t)(rows * cols) * 4);
    }
    free(t.data);
    free(t.scales);
    free(dq);
    free(src);
    return rc;
}

static int do_swz(int64_t rows, int64_t sf_cols)
{
    size_t nbytes;
    uint8_t *in = read_all(&nbytes);
    if (!in || nbytes != (size_t)(rows * sf_cols)) return 2;
    size_t n = fm_sf_swizzled_bytes(rows, sf_cols);
    uint8_t *out = malloc(n + 1);
    if (!out || fm_sf_swizzle(in, rows, sf_cols, out) != FM_OK) return 2;
    int rc = put(out, n);
    free(in);
    free(out);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && (!strcmp(argv[1], "enc") || !strcmp(argv[1], "dec")))
        return do_codec(!strcmp(argv[1], "enc"), argv[2]);
    if (argc >= 5 && !strcmp(argv[1], "quant"))
        return do_quant(argv[2], strtoll(argv[3], NULL, 10), strtoll(argv[4], NULL, 10), argc > 5 ? argv[5] : NULL);
    if (argc == 4 && !strcmp(argv[1], "swz")) return do_swz(strtoll(argv[2], NULL, 10), strtoll(argv[3], NULL, 10));
    fprintf(stderr, "usage: format_dump enc|dec FMT | quant FMT ROWS COLS [GLOBAL] | swz ROWS SF_COLS\n");
    return 2;
}
