/* st_write.c - the safetensors writer and the index writer, so tests and tools
 * make their own checkpoints.
 *
 * The header is printed by hand rather than by cJSON: cJSON prints large
 * integral doubles in exponent form ("1e+16"), which the reference reader
 * (serde u64) rejects; offsets and dims here are printed as exact integers.
 * The header is padded with spaces so the data section starts 8-byte aligned.
 * Output goes through fm_file_out (fm_file.h): an exclusive temporary renamed
 * into place, so a failed write never leaves a half-written checkpoint at PATH,
 * and a PATH that is a link, device or FIFO is refused, never replaced.
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"
#include "fm_file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char  *p;
    size_t len, cap;
    int    oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->len + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(strbuf *b, const char *fmt, ...) FM_PRINTF(2, 3);
static void sb_printf(strbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped;
 * other bytes (UTF-8) pass through. */
static void sb_json_str(strbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* Write `n` byte ranges to path (fm_file_out: an exclusive temporary renamed
 * over path, which must be absent or a writable regular file). */
static fm_status write_file(const char *path, const void *const *parts, const uint64_t *sizes, size_t n)
{
    fm_file_out o;
    FM_CHECK(fm_file_out_begin(path, &o));
    for (size_t i = 0; i < n; i++)
        if (sizes[i]) FM_CHECK(fm_file_out_write(&o, parts[i], (size_t)sizes[i]));
    return fm_file_out_commit(&o);
}

fm_status fm_safetensors_write(const char *path, const fm_st_write_item *items, size_t n, const char *const *meta_keys,
                               const char *const *meta_values, size_t n_meta)
{
    fm_clear_error();
    if (!path || (n && !items) || (n_meta && (!meta_keys || !meta_values)))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_write: NULL argument");
    /* Validate everything before creating the file. */
    uint64_t *sizes = calloc(n + 2, sizeof *sizes);
    const void **parts = calloc(n + 2, sizeof *parts);
    strbuf h = {0};
    fm_status s = FM_OK;
    if (!sizes || !parts) {
        s = fm_fail(FM_ERR_OOM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const fm_st_write_item *it = &items[i];
        if (!it->name || !*it->name || !strcmp(it->name, "__metadata__")) {
            s = fm_fail(FM_ERR_INVALID_ARG, "%s: item %zu has an empty or reserved name", path, i);
            goto out;
        }
        if (!fm_dtype_bits(it->dtype)) {
            s = fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': invalid dtype %d", path, it->name, (int)it->dtype);
            goto out;
        }
        if (it->ndim < 0 || it->ndim > FM_ST_MAX_DIMS) {
            s = fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s': ndim=%d outside [0, %d]", path, it->name, it->ndim,
                        FM_ST_MAX_DIMS);
            goto out;
        }
        uint64_t nb = fm_st_nbytes(it->dtype, fm_st_numel(it->ndim, it->shape));
        if (nb == UINT64_MAX || (nb && !it->data)) {
            s = fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s': bad shape or NULL data", path, it->name);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(items[j].name, it->name)) {
                s = fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s' given twice", path, it->name);
                goto out;
            }
        sizes[i + 2] = nb; /* [0], [1]: length and header */
        parts[i + 2] = it->data;
    }
    sb_put(&h, "{", 1);
    if (n_meta) {
        sb_put(&h, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < n_meta; i++) {
            if (i) sb_put(&h, ",", 1);
            sb_json_str(&h, meta_keys[i] ? meta_keys[i] : "");
            sb_put(&h, ":", 1);
            sb_json_str(&h, meta_values[i] ? meta_values[i] : "");
        }
        sb_put(&h, "}", 1);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const fm_st_write_item *it = &items[i];
        if (i || n_meta) sb_put(&h, ",", 1);
        sb_json_str(&h, it->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", fm_dtype_name(it->dtype));
        for (int d = 0; d < it->ndim; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)it->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + sizes[i + 2]));
        off += sizes[i + 2];
    }
    sb_put(&h, "}", 1);
    while ((h.len % 8) != 0) sb_put(&h, " ", 1); /* data section 8-byte aligned */
    if (h.oom) {
        s = fm_fail(FM_ERR_OOM, "%s: out of memory for the header", path);
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    parts[0] = len8;
    sizes[0] = 8;
    parts[1] = h.p;
    sizes[1] = h.len;
    s = write_file(path, parts, sizes, n + 2);
out:
    free(h.p);
    free(sizes);
    free(parts);
    return s;
}

fm_status fm_safetensors_write_index(const char *path, const char *const *names, const char *const *files, size_t n,
                                     uint64_t total_size)
{
    fm_clear_error();
    if (!path || (n && (!names || !files))) return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_write_index: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!names[i] || !files[i])
            return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_write_index: entry %zu has a NULL name or file", i);
    strbuf b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {", (unsigned long long)total_size);
    for (size_t i = 0; i < n; i++) {
        const char *sep = i ? ",\n    " : "\n    ";
        sb_put(&b, sep, strlen(sep)); /* not a fixed 6: the first separator is 5 bytes */
        sb_json_str(&b, names[i]);
        sb_put(&b, ": ", 2);
        sb_json_str(&b, files[i]);
    }
    sb_put(&b, "\n  }\n}\n", 7);
    if (b.oom) {
        free(b.p);
        return fm_fail(FM_ERR_OOM, "%s: out of memory", path);
    }
    const void *parts[1] = {b.p};
    uint64_t sizes[1] = {b.len};
    fm_status s = write_file(path, parts, sizes, 1);
    free(b.p);
    return s;
}
