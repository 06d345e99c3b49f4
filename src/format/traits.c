/* traits.c - the format trait table (ggml-style: one designated-initializer row
 * per format) and the size arithmetic every other part derives from it.
 *
 * Nothing else in the library hard-codes "16" or "32" for a block size or
 * "/2" for packing: they ask fm_format_traits_get() or the byte helpers here,
 * so adding a format is one table row plus its quantizer.
 */
#include "fm_internal.h"

#include <ctype.h>
#include <string.h>

/* name     elem_bits  scale_type      block  has_global
 * bf16        16      none              0        0      unquantized baseline
 * nvfp4        4      E4M3 (fn)        16        1      ModelOpt NVFP4
 * mxfp4        4      UE8M0            32        0      OCP MX v1.0 MXFP4      */
static const fm_format_traits k_traits[FM_FORMAT_COUNT] = {
    [FM_FORMAT_BF16]  = {.name = "bf16",  .elem_bits = 16, .scale_type = FM_SCALE_NONE,  .block = 0,  .has_global = 0},
    [FM_FORMAT_NVFP4] = {.name = "nvfp4", .elem_bits = 4,  .scale_type = FM_SCALE_E4M3,  .block = 16, .has_global = 1},
    [FM_FORMAT_MXFP4] = {.name = "mxfp4", .elem_bits = 4,  .scale_type = FM_SCALE_UE8M0, .block = 32, .has_global = 0},
};

_Static_assert(FM_ARRAY_LEN(k_traits) == FM_FORMAT_COUNT, "one trait row per format");
_Static_assert(FM_FORMAT_BF16 == 0 && FM_FORMAT_NVFP4 == 1 && FM_FORMAT_MXFP4 == 2,
               "format codes are stable (stored in files and the CLI)");
/* Two E2M1 codes per byte, and every FP4 block is a whole number of bytes. */
_Static_assert(16 % 2 == 0 && 32 % 2 == 0, "FP4 blocks pack into whole bytes");
/* E4M3 and UE8M0 scales are one byte each: scale bytes per row = cols / block. */
_Static_assert(sizeof(uint8_t) == 1, "one byte per block scale");

const fm_format_traits *fm_format_traits_get(fm_format f)
{
    if ((int)f < 0 || (int)f >= FM_FORMAT_COUNT) return NULL;
    return &k_traits[f];
}

fm_status fm_format_parse(const char *name, fm_format *out)
{
    fm_clear_error();
    if (!name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_format_parse: NULL %s", name ? "out" : "name");
    for (int f = 0; f < FM_FORMAT_COUNT; f++) {
        const char *a = k_traits[f].name, *b = name;
        while (*a && *b && tolower((unsigned char)*b) == *a) a++, b++;
        if (!*a && !*b) {
            *out = (fm_format)f;
            return FM_OK;
        }
    }
    return fm_fail(FM_ERR_FORMAT, "fm_format_parse: unknown format '%.64s' (expected bf16, nvfp4 or mxfp4)", name);
}

/* cols is valid for f: positive and a whole number of blocks (FP4: also even). */
static int cols_ok(const fm_format_traits *t, int64_t cols)
{
    if (cols <= 0) return 0;
    if (t->block > 0 && cols % t->block != 0) return 0;
    if (t->elem_bits == 4 && cols % 2 != 0) return 0;
    return 1;
}

size_t fm_format_row_bytes(fm_format f, int64_t cols)
{
    const fm_format_traits *t = fm_format_traits_get(f);
    if (!t || !cols_ok(t, cols)) return 0;
    /* cols / 8 first: no overflow for any int64_t cols */
    return (size_t)(cols / 8) * (size_t)t->elem_bits + (size_t)(cols % 8) * (size_t)t->elem_bits / 8u;
}

size_t fm_format_row_scale_bytes(fm_format f, int64_t cols)
{
    const fm_format_traits *t = fm_format_traits_get(f);
    if (!t || t->block == 0 || !cols_ok(t, cols)) return 0;
    return (size_t)(cols / t->block);
}

fm_status fm_qtensor_bytes(fm_format f, int64_t rows, int64_t cols, size_t *data_bytes, size_t *scale_bytes)
{
    fm_clear_error();
    const fm_format_traits *t = fm_format_traits_get(f);
    if (!t) return fm_fail(FM_ERR_FORMAT, "fm_qtensor_bytes: unknown format %d", (int)f);
    if (rows <= 0 || cols <= 0)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_qtensor_bytes: rows=%lld cols=%lld must be positive",
                       (long long)rows, (long long)cols);
    if (!cols_ok(t, cols))
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_qtensor_bytes: cols=%lld is not a multiple of the %s block (%d)",
                       (long long)cols, t->name, t->block);
    /* The element count rows x cols is int64 arithmetic in every consumer (fm_quantize,
     * fm_dequantize): FP4's half byte per element lets it overflow where the bytes do not. */
    if (rows > INT64_MAX / cols)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_qtensor_bytes: %lld x %lld elements overflow int64", (long long)rows,
                       (long long)cols);
    /* Guard the products against size_t overflow (rows, cols up to 2^62). */
    size_t rb = fm_format_row_bytes(f, cols), sb = fm_format_row_scale_bytes(f, cols);
    if ((size_t)rows > SIZE_MAX / rb)
        return fm_fail(FM_ERR_BAD_SHAPE, "fm_qtensor_bytes: %lld x %lld overflows size_t", (long long)rows,
                       (long long)cols);
    if (data_bytes) *data_bytes = (size_t)rows * rb;
    if (scale_bytes) *scale_bytes = (size_t)rows * sb;
    return FM_OK;
}
