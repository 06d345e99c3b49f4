/* dtype.c - the safetensors dtype table: one row per dtype string, and the
 * conversion of (part of) a tensor to FP32, read through fm_st_read in chunks
 * (BF16/F16 through the format codecs, so there is one decoder of each in the
 * library). */
#include "io_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name; /* safetensors spelling */
    int         bits; /* bits per element */
} fm_dtype_row;

static const fm_dtype_row k_dtypes[FM_DTYPE_COUNT] = {
    /*                   name        bits */
    [FM_DTYPE_BOOL]    = {"BOOL",     8},
    [FM_DTYPE_U8]      = {"U8",       8},
    [FM_DTYPE_I8]      = {"I8",       8},
    [FM_DTYPE_U16]     = {"U16",     16},
    [FM_DTYPE_I16]     = {"I16",     16},
    [FM_DTYPE_U32]     = {"U32",     32},
    [FM_DTYPE_I32]     = {"I32",     32},
    [FM_DTYPE_U64]     = {"U64",     64},
    [FM_DTYPE_I64]     = {"I64",     64},
    [FM_DTYPE_F16]     = {"F16",     16},
    [FM_DTYPE_BF16]    = {"BF16",    16},
    [FM_DTYPE_F32]     = {"F32",     32},
    [FM_DTYPE_F64]     = {"F64",     64},
    [FM_DTYPE_F8_E4M3] = {"F8_E4M3",  8},
    [FM_DTYPE_F8_E5M2] = {"F8_E5M2",  8},
    [FM_DTYPE_F8_E8M0] = {"F8_E8M0",  8},
    [FM_DTYPE_F4]      = {"F4",       4}, /* float4_e2m1fn, two per byte */
};
_Static_assert(FM_ARRAY_LEN(k_dtypes) == FM_DTYPE_COUNT, "one row per dtype");

const char *fm_dtype_name(fm_dtype d) { return ((int)d >= 0 && d < FM_DTYPE_COUNT) ? k_dtypes[d].name : "?"; }

int fm_dtype_bits(fm_dtype d) { return ((int)d >= 0 && d < FM_DTYPE_COUNT) ? k_dtypes[d].bits : 0; }

fm_status fm_dtype_parse(const char *s, fm_dtype *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_dtype_parse: NULL argument");
    for (int d = 0; d < FM_DTYPE_COUNT; d++)
        if (!strcmp(s, k_dtypes[d].name)) {
            *out = (fm_dtype)d;
            return FM_OK;
        }
    return fm_fail(FM_ERR_FORMAT, "unknown safetensors dtype '%s'", s);
}

int64_t fm_st_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

uint64_t fm_st_nbytes(fm_dtype d, int64_t numel)
{
    int bits = fm_dtype_bits(d);
    if (!bits || numel < 0) return UINT64_MAX;
    uint64_t n = (uint64_t)numel;
    if (n > UINT64_MAX / (uint64_t)bits) return UINT64_MAX;
    uint64_t b = n * (uint64_t)bits;
    if (b % 8) return UINT64_MAX; /* a partial byte: odd count of F4 elements */
    return b / 8;
}

const char *fm_st_shape_str(const fm_st_tensor *t, char *buf, size_t len)
{
    size_t o = 0;
    if (!len) return buf;
    buf[0] = '\0';
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < t->ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

fm_status fm_st_to_f32(const fm_st_tensor *t, int64_t first, int64_t n, float *dst)
{
    int es = 0;
    switch (t->dtype) {
    case FM_DTYPE_F32: es = 4; break;
    case FM_DTYPE_F64: es = 8; break;
    case FM_DTYPE_BF16:
    case FM_DTYPE_F16: es = 2; break;
    default:
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F32, BF16, F16 or F64", t->file,
                       t->name, fm_dtype_name(t->dtype));
    }
    if (first < 0 || n < 0 || (uint64_t)first > t->nbytes / (uint64_t)es ||
        (uint64_t)n > t->nbytes / (uint64_t)es - (uint64_t)first)
        return fm_fail(FM_ERR_OUT_OF_RANGE, "%s: tensor '%s': elements [%lld, +%lld) beyond its %llu bytes", t->file,
                       t->name, (long long)first, (long long)n, (unsigned long long)t->nbytes);
    enum { CHUNK = 4096 }; /* elements per read: 32 kB of F64 on the stack */
    uint8_t buf[CHUNK * 8];
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        const int64_t m = n - c0 < CHUNK ? n - c0 : CHUNK;
        FM_CHECK(fm_st_read(t, (uint64_t)(first + c0) * (uint64_t)es, (size_t)m * (size_t)es, buf));
        float *d = dst + c0;
        for (int64_t i = 0; i < m; i++) {
            const uint8_t *p = buf + (size_t)i * (size_t)es;
            switch (t->dtype) {
            case FM_DTYPE_F32: memcpy(&d[i], p, 4); break;
            case FM_DTYPE_F64: {
                double v;
                memcpy(&v, p, 8);
                d[i] = (float)v;
                break;
            }
            case FM_DTYPE_BF16: d[i] = fm_bf16_decode((uint16_t)(p[0] | p[1] << 8)); break;
            default: d[i] = fm_fp16_decode((uint16_t)(p[0] | p[1] << 8)); break; /* F16 */
            }
        }
    }
    return FM_OK;
}
