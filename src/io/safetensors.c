/* safetensors.c - the safetensors reader: read the header of a file (or a
 * caller's buffer), parse it with cJSON and validate every entry before anyone
 * can touch data; then read tensor data on demand (fm_st_read).
 *
 * File layout:  [u64 LE header length N][N bytes JSON header][data section]
 * Every tensor's data_offsets [b, e) are relative to the data section. The
 * rules follow the reference implementation (huggingface/safetensors): the
 * header starts with '{', may end in spaces, is at most 100 MB; e - b equals
 * size(dtype) x prod(shape); the tensors tile the data section exactly. After
 * fm_safetensors_parse returns FM_OK every (data, nbytes) lies inside the
 * buffer (file), which is the only promise the rest of src/io/ relies on to
 * never read outside it. Numbers are checked to be integers below 2^53
 * (cJSON holds them as doubles, exact up to there).
 *
 * Files are not mapped: a mapped file truncated by someone else while it is
 * open raises SIGBUS on the next touch, and no check made before the touch
 * can close that window. The header is read with pread at open and tensor
 * data by fm_st_read, so a file that shrank is an FM_ERR_IO from the read.
 * (pread of weights into their final buffers costs no more than copying them
 * out of a mapping: docs/checkpoints.md has the measurement.)
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"

#include "fm_file.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fm_safetensors {
    char          *label;   /* path or caller's label */
    const uint8_t *base;    /* the borrowed buffer; NULL for a file */
    uint64_t       size;    /* of the buffer, or of the file when opened */
    int            fd;      /* the open file, -1 for a buffer */
    fm_st_tensor  *t;       /* [n] ascending data offset */
    size_t         n;
    fm_st_tensor **by_name; /* [n] pointers into t, names ascending */
    char         **meta;    /* [2 * n_meta] key, value, key, value ... */
    size_t         n_meta;
};

#define MAX_EXACT_INT 9007199254740992.0 /* 2^53: larger doubles are not exact integers */

static int json_u64(const cJSON *n, uint64_t *out)
{
    if (!cJSON_IsNumber(n)) return 0;
    double v = n->valuedouble;
    if (!(v >= 0.0 && v <= MAX_EXACT_INT) || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

/* Parse one "name": {"dtype", "shape", "data_offsets"} entry into t (name set by caller). */
static fm_status parse_entry(const char *label, const cJSON *it, uint64_t data_len, fm_st_tensor *t, uint64_t *end)
{
    const char *nm = t->name;
    if (!cJSON_IsObject(it)) return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", label, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': needs string \"dtype\", array \"shape\" and array \"data_offsets\"",
                       label, nm);
    if (fm_dtype_parse(dt->valuestring, &t->dtype) != FM_OK)
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", label, nm, dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > FM_ST_MAX_DIMS)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions, at most %d supported", label, nm, nd,
                       FM_ST_MAX_DIMS);
    t->ndim = nd;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh)
    {
        uint64_t v;
        if (!json_u64(d, &v))
            return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", label, nm, i);
        t->shape[i++] = (int64_t)v;
    }
    uint64_t b, e;
    if (cJSON_GetArraySize(of) != 2 || !json_u64(cJSON_GetArrayItem(of, 0), &b) ||
        !json_u64(cJSON_GetArrayItem(of, 1), &e))
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers", label, nm);
    if (b > e) return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", label,
                              nm, (unsigned long long)b, (unsigned long long)e);
    if (e > data_len)
        return fm_fail(FM_ERR_OUT_OF_RANGE, "%s: tensor '%s': data_offsets [%llu, %llu] beyond the %llu-byte data section",
                       label, nm, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_len);
    uint64_t want = fm_st_nbytes(t->dtype, fm_st_numel(t->ndim, t->shape));
    if (want != e - b) {
        char s[160];
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s': %s x %s needs %llu bytes, data_offsets give %llu", label,
                       nm, fm_dtype_name(t->dtype), fm_st_shape_str(t, s, sizeof s), (unsigned long long)want,
                       (unsigned long long)(e - b));
    }
    t->file_offset = b; /* relative for now; made absolute after sorting */
    t->nbytes = e - b;
    *end = e;
    return FM_OK;
}

static int cmp_offset(const void *a, const void *b)
{
    const fm_st_tensor *x = a, *y = b;
    if (x->file_offset != y->file_offset) return x->file_offset < y->file_offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(fm_st_tensor *const *)a)->name, (*(fm_st_tensor *const *)b)->name);
}

static fm_status parse_metadata(fm_safetensors *st, const cJSON *m)
{
    if (!cJSON_IsObject(m)) return fm_fail(FM_ERR_FORMAT, "%s: __metadata__ is not a JSON object", st->label);
    size_t n = (size_t)cJSON_GetArraySize(m);
    st->meta = calloc(2 * n + 1, sizeof *st->meta);
    if (!st->meta) return fm_fail(FM_ERR_OOM, "%s: out of memory for metadata", st->label);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, m)
    {
        if (!cJSON_IsString(kv))
            return fm_fail(FM_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", st->label, kv->string);
        st->meta[2 * st->n_meta] = strdup(kv->string);
        st->meta[2 * st->n_meta + 1] = strdup(kv->valuestring);
        st->n_meta++;
        if (!st->meta[2 * st->n_meta - 2] || !st->meta[2 * st->n_meta - 1])
            return fm_fail(FM_ERR_OOM, "%s: out of memory for metadata", st->label);
    }
    return FM_OK;
}

static fm_status too_short(const fm_safetensors *st)
{
    return fm_fail(FM_ERR_FORMAT, "%s: truncated: %llu bytes, a safetensors file starts with an 8-byte header length",
                   st->label, (unsigned long long)st->size);
}

/* The header length in the first 8 bytes p (st->size >= 8), checked against the size. */
static fm_status header_length(const fm_safetensors *st, const uint8_t *p, uint64_t *out)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > st->size - 8)
        return fm_fail(FM_ERR_FORMAT, "%s: header length %llu goes beyond the file (%llu bytes after the length)",
                       st->label, (unsigned long long)hlen, (unsigned long long)(st->size - 8));
    if (hlen > FM_ST_MAX_HEADER)
        return fm_fail(FM_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", st->label,
                       (unsigned long long)hlen, FM_ST_MAX_HEADER);
    *out = hlen;
    return FM_OK;
}

/* Parse the hlen-byte JSON header h (a copy for a file, inside st->base for a
 * buffer) into st: the data section is the rest of st->size. */
static fm_status parse_header(fm_safetensors *st, const char *h, uint64_t hlen)
{
    const char *lb = st->label;
    if (hlen < 2 || h[0] != '{') return fm_fail(FM_ERR_FORMAT, "%s: header does not start with '{'", lb);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(h, (size_t)hlen, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= h && at <= h + hlen) ? (long)(at - h) : -1;
        return fm_fail(FM_ERR_FORMAT, "%s: header is not valid JSON (error near byte %ld of %llu)", lb, off,
                       (unsigned long long)hlen);
    }
    fm_status s = FM_OK;
    for (const char *p = end; p && p < h + hlen; p++)
        if (*p != ' ') {
            s = fm_fail(FM_ERR_FORMAT, "%s: unexpected byte 0x%02x after the JSON header at byte %ld", lb,
                        (unsigned)(unsigned char)*p, (long)(p - h));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        s = fm_fail(FM_ERR_FORMAT, "%s: header is not a JSON object", lb);
        goto done;
    }
    uint64_t data_len = st->size - 8 - hlen;
    size_t cap = (size_t)cJSON_GetArraySize(root);
    st->t = calloc(cap + 1, sizeof *st->t);
    if (!st->t) {
        s = fm_fail(FM_ERR_OOM, "%s: out of memory for %zu tensors", lb, cap);
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        if (!strcmp(it->string, "__metadata__")) {
            if (st->meta) {
                s = fm_fail(FM_ERR_FORMAT, "%s: duplicate __metadata__", lb);
                goto done;
            }
            if ((s = parse_metadata(st, it)) != FM_OK) goto done;
            continue;
        }
        fm_st_tensor *t = &st->t[st->n];
        if (!(t->name = strdup(it->string))) {
            s = fm_fail(FM_ERR_OOM, "%s: out of memory", lb);
            goto done;
        }
        t->file = st->label;
        st->n++;
        uint64_t e;
        if ((s = parse_entry(lb, it, data_len, t, &e)) != FM_OK) goto done;
    }
    /* The tensors must tile [0, data_len): sort by offset, then no overlap or gap. */
    qsort(st->t, st->n, sizeof *st->t, cmp_offset);
    uint64_t pos = 0;
    for (size_t i = 0; i < st->n; i++) {
        fm_st_tensor *t = &st->t[i];
        if (t->file_offset < pos) {
            s = fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s'", lb, t->name,
                        (unsigned long long)t->file_offset, (unsigned long long)(t->file_offset + t->nbytes),
                        st->t[i - 1].name);
            goto done;
        }
        if (t->file_offset > pos) {
            s = fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': gap of %llu unindexed bytes before its data_offsets", lb,
                        t->name, (unsigned long long)(t->file_offset - pos));
            goto done;
        }
        pos = t->file_offset + t->nbytes;
        t->data = st->base ? st->base + 8 + hlen + t->file_offset : NULL;
        t->owner_ = st->fd >= 0 ? st : NULL;
        t->file_offset += 8 + hlen;
    }
    if (pos != data_len) {
        s = fm_fail(FM_ERR_FORMAT, "%s: %llu bytes after the last tensor are not indexed by the header", lb,
                    (unsigned long long)(data_len - pos));
        goto done;
    }
    st->by_name = malloc((st->n + 1) * sizeof *st->by_name);
    if (!st->by_name) {
        s = fm_fail(FM_ERR_OOM, "%s: out of memory", lb);
        goto done;
    }
    for (size_t i = 0; i < st->n; i++) st->by_name[i] = &st->t[i];
    qsort(st->by_name, st->n, sizeof *st->by_name, cmp_name);
    for (size_t i = 1; i < st->n; i++)
        if (!strcmp(st->by_name[i]->name, st->by_name[i - 1]->name)) {
            s = fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", lb, st->by_name[i]->name);
            goto done;
        }
done:
    cJSON_Delete(root);
    return s;
}

void fm_safetensors_close(fm_safetensors *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free((char *)st->t[i].name);
    for (size_t i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    free(st->meta);
    free(st->t);
    free(st->by_name);
    if (st->fd >= 0) close(st->fd);
    free(st->label);
    free(st);
}

static fm_status st_new(const char *label, fm_safetensors **out)
{
    fm_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->label = strdup(label ? label : "<buffer>"))) {
        free(st);
        return fm_fail(FM_ERR_OOM, "out of memory opening %s", label ? label : "<buffer>");
    }
    st->fd = -1;
    *out = st;
    return FM_OK;
}

fm_status fm_safetensors_parse(const void *buf, size_t len, const char *label, fm_safetensors **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_parse: out is NULL");
    *out = NULL;
    if (!buf && len) return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_parse: NULL buffer of %zu bytes", len);
    fm_safetensors *st = NULL;
    FM_CHECK(st_new(label, &st));
    st->base = buf;
    st->size = len;
    uint64_t hlen = 0;
    fm_status s = len < 8 ? too_short(st) : header_length(st, st->base, &hlen);
    if (s == FM_OK) s = parse_header(st, (const char *)st->base + 8, hlen);
    if (s != FM_OK) {
        fm_safetensors_close(st);
        return s;
    }
    *out = st;
    return FM_OK;
}

fm_status fm_safetensors_open(const char *path, fm_safetensors **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_open: out is NULL");
    *out = NULL;
    if (!path) return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_open: path is NULL");
    int fd;
    uint64_t size;
    FM_CHECK(fm_file_open(path, &fd, &size)); /* FM_ERR_IO for a FIFO, device, directory */
    fm_safetensors *st = NULL;
    fm_status s = st_new(path, &st);
    if (s != FM_OK) {
        close(fd);
        return s;
    }
    st->fd = fd;
    st->size = size;
    uint8_t len8[8];
    uint64_t hlen = 0;
    s = size < 8 ? too_short(st) : fm_file_pread(fd, path, 0, len8, 8);
    if (s == FM_OK) s = header_length(st, len8, &hlen);
    char *h = s == FM_OK ? malloc(hlen + 1) : NULL; /* hlen <= FM_ST_MAX_HEADER */
    if (s == FM_OK && !h) s = fm_fail(FM_ERR_OOM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)hlen);
    if (s == FM_OK) s = fm_file_pread(fd, path, 8, h, (size_t)hlen);
    if (s == FM_OK) s = parse_header(st, h, hlen);
    free(h);
    if (s != FM_OK) {
        fm_safetensors_close(st);
        return s;
    }
    *out = st;
    return FM_OK;
}

fm_status fm_st_read(const fm_st_tensor *t, uint64_t off, size_t n, void *dst)
{
    if (!t || (!dst && n)) return fm_fail(FM_ERR_INVALID_ARG, "fm_st_read: NULL argument");
    if (off > t->nbytes || n > t->nbytes - off)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s': bytes [%llu, %llu) beyond its %llu bytes", t->file,
                       t->name, (unsigned long long)off, (unsigned long long)off + n, (unsigned long long)t->nbytes);
    if (!n) return FM_OK;
    if (!t->owner_) {
        if (!t->data) return fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s' has no data to read", t->file, t->name);
        memcpy(dst, t->data + off, n);
        return FM_OK;
    }
    const fm_safetensors *st = t->owner_;
    fm_status s = fm_file_pread(st->fd, st->label, t->file_offset + off, dst, n);
    if (s != FM_OK) return fm_fail(s, "tensor '%s': %s", t->name, fm_last_error());
    return FM_OK;
}

size_t fm_safetensors_count(const fm_safetensors *st) { return st ? st->n : 0; }

const fm_st_tensor *fm_safetensors_at(const fm_safetensors *st, size_t i)
{
    return (st && i < st->n) ? &st->t[i] : NULL;
}

const char *fm_safetensors_path(const fm_safetensors *st) { return st ? st->label : NULL; }

uint64_t fm_safetensors_size(const fm_safetensors *st) { return st ? st->size : 0; }

fm_status fm_safetensors_find(const fm_safetensors *st, const char *name, const fm_st_tensor **out)
{
    if (!st || !name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_safetensors_find: NULL argument");
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->by_name[mid]->name, name);
        if (!c) {
            *out = st->by_name[mid];
            return FM_OK;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return fm_fail(FM_ERR_NOT_FOUND, "%s: no tensor '%s'", st->label, name);
}

const char *fm_safetensors_metadata(const fm_safetensors *st, const char *key)
{
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta[2 * i], key)) return st->meta[2 * i + 1];
    return NULL;
}
