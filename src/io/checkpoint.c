/* checkpoint.c - a checkpoint is one safetensors file, a folder of them, or a
 * model.safetensors.index.json naming which shard holds each tensor; or
 * tensors a caller holds in memory, in the same table.
 *
 * Every shard is opened and its header validated at open (only headers are
 * read), so later lookups cannot fail on a bad header; data is read later
 * with fm_st_read, which turns a shard truncated since into FM_ERR_IO.
 * Files are opened through fm_file_open: a FIFO, device or directory named
 * as a shard, index or folder member is FM_ERR_IO, never a blocked open(). The index
 * is trusted for nothing: each tensor it names must really be in the shard it
 * names, shard names must be plain file names in the index's folder, and a
 * tensor name held by two shards is an error rather than a silent choice.
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"

#include "fm_file.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_INDEX_BYTES (256u << 20) /* a 1M-tensor index is ~100 MB */

struct fm_checkpoint {
    char                *dir;     /* folder of the shards ("." for a bare file name); NULL in memory */
    fm_safetensors     **files;   /* [n_files] */
    size_t               n_files;
    fm_st_tensor        *mem;     /* [n_mem] tensors of fm_checkpoint_open_tensors (data borrowed) */
    size_t               n_mem;
    char                *strings; /* their names and label, one block */
    const fm_st_tensor **by_name; /* [n] all tensors, names ascending */
    size_t               n;
    uint64_t             bytes;
};

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static char *dir_of(const char *path)
{
    const char *sl = strrchr(path, '/');
    if (!sl) return strdup(".");
    if (sl == path) return strdup("/");
    char *d = malloc((size_t)(sl - path) + 1);
    if (!d) return NULL;
    memcpy(d, path, (size_t)(sl - path));
    d[sl - path] = '\0';
    return d;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_tensor(const void *a, const void *b)
{
    return strcmp((*(const fm_st_tensor *const *)a)->name, (*(const fm_st_tensor *const *)b)->name);
}

void fm_checkpoint_close(fm_checkpoint *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->n_files; i++) fm_safetensors_close(ck->files[i]);
    free(ck->files);
    free(ck->mem);
    free(ck->strings);
    free(ck->by_name);
    free(ck->dir);
    free(ck);
}

/* Open the shards named in `names` (file names relative to ck->dir). */
static fm_status open_shards(fm_checkpoint *ck, char **names, size_t n)
{
    ck->files = calloc(n + 1, sizeof *ck->files);
    if (!ck->files) return fm_fail(FM_ERR_OOM, "out of memory opening %zu shards", n);
    for (size_t i = 0; i < n; i++) {
        char *p = path_join(ck->dir, names[i]);
        if (!p) return fm_fail(FM_ERR_OOM, "out of memory");
        fm_status s = fm_safetensors_open(p, &ck->files[i]);
        free(p);
        FM_CHECK(s);
        ck->n_files++;
    }
    return FM_OK;
}

/* Build the merged name table (the shards' tensors, or the tensors in memory:
 * the one table every lookup and loader reads); a name twice is an error. */
static fm_status build_table(fm_checkpoint *ck)
{
    size_t n = ck->n_mem;
    for (size_t i = 0; i < ck->n_files; i++) n += fm_safetensors_count(ck->files[i]);
    ck->by_name = malloc((n + 1) * sizeof *ck->by_name);
    if (!ck->by_name) return fm_fail(FM_ERR_OOM, "out of memory for %zu tensors", n);
    for (size_t i = 0; i < ck->n_files; i++)
        for (size_t j = 0; j < fm_safetensors_count(ck->files[i]); j++) {
            const fm_st_tensor *t = fm_safetensors_at(ck->files[i], j);
            ck->by_name[ck->n++] = t;
            ck->bytes += t->nbytes;
        }
    for (size_t i = 0; i < ck->n_mem; i++) {
        ck->by_name[ck->n++] = &ck->mem[i];
        ck->bytes += ck->mem[i].nbytes;
    }
    qsort(ck->by_name, ck->n, sizeof *ck->by_name, cmp_tensor);
    for (size_t i = 1; i < ck->n; i++)
        if (!strcmp(ck->by_name[i]->name, ck->by_name[i - 1]->name))
            return ck->n_mem ? fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' is given twice", ck->by_name[i]->file,
                                       ck->by_name[i]->name)
                             : fm_fail(FM_ERR_FORMAT, "tensor '%s' is in two shards: %s and %s", ck->by_name[i]->name,
                                       ck->by_name[i - 1]->file, ck->by_name[i]->file);
    return FM_OK;
}

static fm_status read_small_file(const char *path, char **out, size_t *len)
{
    FILE *f;
    FM_CHECK(fm_file_fopen(path, &f)); /* FM_ERR_IO for a FIFO, device, directory: never blocks */
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= MAX_INDEX_BYTES) {
            free(b);
            fclose(f);
            return fm_fail(FM_ERR_FORMAT, "%s: larger than %u bytes", path, MAX_INDEX_BYTES);
        }
        char *q = realloc(b, cap * 2);
        if (!q) {
            free(b);
            b = NULL;
            break;
        }
        b = q;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!b) return fm_fail(FM_ERR_OOM, "%s: out of memory reading it", path);
    if (err) {
        free(b);
        return fm_fail(FM_ERR_IO, "%s: read error", path);
    }
    *out = b;
    *len = n;
    return FM_OK;
}

static fm_status open_index(fm_checkpoint *ck, const char *index_path)
{
    char *txt = NULL;
    size_t len = 0;
    FM_CHECK(read_small_file(index_path, &txt, &len));
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!root) return fm_fail(FM_ERR_FORMAT, "%s: not valid JSON", index_path);
    fm_status s = FM_OK;
    char **names = NULL;
    size_t nn = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        s = fm_fail(FM_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    names = calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof *names);
    if (!names) {
        s = fm_fail(FM_ERR_OOM, "out of memory");
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm)
    {
        if (!cJSON_IsString(e)) {
            s = fm_fail(FM_ERR_FORMAT, "%s: weight_map entry '%s' is not a string", index_path, e->string);
            goto done;
        }
        const char *f = e->valuestring;
        if (!*f || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, "..")) {
            s = fm_fail(FM_ERR_FORMAT, "%s: tensor '%s' maps to '%s', not a file name in the index's folder",
                        index_path, e->string, f);
            goto done;
        }
        names[nn++] = (char *)f; /* borrowed from root until open_shards is done */
    }
    if (!nn) {
        s = fm_fail(FM_ERR_NOT_FOUND, "%s: weight_map is empty", index_path);
        goto done;
    }
    qsort(names, nn, sizeof *names, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < nn; i++)
        if (!u || strcmp(names[u - 1], names[i])) names[u++] = names[i];
    if ((s = open_shards(ck, names, u)) != FM_OK) goto done;
    if ((s = build_table(ck)) != FM_OK) goto done;
    /* Every tensor the index names must be in the shard it names. */
    cJSON_ArrayForEach(e, wm)
    {
        const fm_st_tensor *t;
        if (fm_checkpoint_find(ck, e->string, &t) != FM_OK || !ends_with(t->file, e->valuestring) ||
            t->file[strlen(t->file) - strlen(e->valuestring) - 1] != '/') {
            s = fm_fail(FM_ERR_NOT_FOUND, "%s: index places tensor '%s' in %s, which does not hold it", index_path,
                        e->string, e->valuestring);
            goto done;
        }
    }
done:
    free(names);
    cJSON_Delete(root);
    return s;
}

static fm_status open_dir(fm_checkpoint *ck, const char *dir)
{
    char *ip = path_join(dir, "model.safetensors.index.json");
    if (!ip) return fm_fail(FM_ERR_OOM, "out of memory");
    struct stat sb;
    if (stat(ip, &sb) == 0) {
        fm_status s = open_index(ck, ip);
        free(ip);
        return s;
    }
    free(ip);
    DIR *d = opendir(dir);
    if (!d) return fm_fail(FM_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    char **idx = NULL, **st = NULL;
    size_t ni = 0, ns = 0, ci = 0, cs = 0;
    fm_status s = FM_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && s == FM_OK) {
        char ***arr = NULL;
        size_t *n = NULL, *c = NULL;
        if (ends_with(de->d_name, ".safetensors.index.json")) arr = &idx, n = &ni, c = &ci;
        else if (ends_with(de->d_name, ".safetensors")) arr = &st, n = &ns, c = &cs;
        if (!arr) continue;
        if (*n == *c) {
            *c = *c ? 2 * *c : 16;
            char **q = realloc(*arr, *c * sizeof *q);
            if (!q) {
                s = fm_fail(FM_ERR_OOM, "out of memory");
                break;
            }
            *arr = q;
        }
        if (!((*arr)[*n] = strdup(de->d_name))) s = fm_fail(FM_ERR_OOM, "out of memory");
        else (*n)++;
    }
    closedir(d);
    if (s == FM_OK) {
        if (ni > 1) {
            s = fm_fail(FM_ERR_FORMAT, "%s: %zu index files and no model.safetensors.index.json: open one of them",
                        dir, ni);
        } else if (ni == 1) {
            char *p = path_join(dir, idx[0]);
            s = p ? open_index(ck, p) : fm_fail(FM_ERR_OOM, "out of memory");
            free(p);
        } else if (!ns) {
            s = fm_fail(FM_ERR_NOT_FOUND, "%s: no *.safetensors files", dir);
        } else {
            qsort(st, ns, sizeof *st, cmp_str);
            s = open_shards(ck, st, ns);
            if (s == FM_OK) s = build_table(ck);
        }
    }
    for (size_t i = 0; i < ni; i++) free(idx[i]);
    for (size_t i = 0; i < ns; i++) free(st[i]);
    free(idx);
    free(st);
    return s;
}

fm_status fm_checkpoint_open(const char *path, fm_checkpoint **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_open: out is NULL");
    *out = NULL;
    if (!path || !*path) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_open: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0) return fm_fail(FM_ERR_IO, "%s: %s", path, strerror(errno));
    fm_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return fm_fail(FM_ERR_OOM, "out of memory");
    fm_status s;
    if (S_ISDIR(sb.st_mode)) {
        ck->dir = strdup(path);
        s = ck->dir ? open_dir(ck, path) : fm_fail(FM_ERR_OOM, "out of memory");
    } else {
        ck->dir = dir_of(path);
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (!ck->dir) s = fm_fail(FM_ERR_OOM, "out of memory");
        else if (ends_with(path, ".json")) s = open_index(ck, path);
        else {
            char *one = (char *)base;
            s = open_shards(ck, &one, 1);
            if (s == FM_OK) s = build_table(ck);
        }
    }
    if (s != FM_OK) {
        fm_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return FM_OK;
}

/* One view checked as the safetensors reader checks a header entry, so that what
 * the loaders see in memory obeys the rules a file's tensors do. */
static fm_status check_view(const fm_tensor_view *v, size_t i, const char *label)
{
    if (!v->name || !*v->name)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: tensor %zu has no name", label, i);
    if (strnlen(v->name, 512) >= 512)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: tensor %zu: name of 512 bytes or more", label, i);
    if ((int)v->dtype < 0 || v->dtype >= FM_DTYPE_COUNT)
        return fm_fail(FM_ERR_FORMAT, "%s: tensor '%s': unknown dtype %d", label, v->name, (int)v->dtype);
    if (v->ndim < 0) return fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s': ndim %d < 0", label, v->name, v->ndim);
    if (v->ndim > FM_ST_MAX_DIMS)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: tensor '%s': %d dimensions, more than %d", label, v->name, v->ndim,
                       FM_ST_MAX_DIMS);
    int64_t numel = fm_st_numel(v->ndim, v->shape);
    uint64_t nbytes = numel < 0 ? UINT64_MAX : fm_st_nbytes(v->dtype, numel);
    if (nbytes == UINT64_MAX || nbytes > (uint64_t)SIZE_MAX)
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: tensor '%s' (%s): a negative or overflowing shape, or F4 of an odd "
                       "element count", label, v->name, fm_dtype_name(v->dtype));
    if (nbytes && !v->data)
        return fm_fail(FM_ERR_INVALID_ARG, "%s: tensor '%s': NULL data for %llu bytes", label, v->name,
                       (unsigned long long)nbytes);
    return FM_OK;
}

fm_status fm_checkpoint_open_tensors(const fm_tensor_view *views, size_t n, const char *label, fm_checkpoint **out)
{
    fm_clear_error();
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_open_tensors: out is NULL");
    *out = NULL;
    if (!label) label = "tensors in memory";
    if (n && !views) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_open_tensors: views is NULL for %zu tensors", n);
    if (!n) return fm_fail(FM_ERR_NOT_FOUND, "%s: no tensors", label);
    if (n > SIZE_MAX / sizeof(fm_st_tensor) / 2)
        return fm_fail(FM_ERR_OOM, "%s: %zu tensors", label, n);
    size_t chars = strlen(label) + 1;
    for (size_t i = 0; i < n; i++) {
        FM_CHECK(check_view(&views[i], i, label));
        chars += strlen(views[i].name) + 1;
    }
    fm_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) return fm_fail(FM_ERR_OOM, "out of memory");
    ck->mem = calloc(n, sizeof *ck->mem);
    ck->strings = malloc(chars);
    fm_status s = ck->mem && ck->strings ? FM_OK : fm_fail(FM_ERR_OOM, "%s: out of memory for %zu tensors", label, n);
    if (s == FM_OK) {
        char *p = ck->strings;
        size_t ll = strlen(label) + 1;
        memcpy(p, label, ll);
        const char *file = p;
        p += ll;
        for (size_t i = 0; i < n; i++) {
            const fm_tensor_view *v = &views[i];
            size_t nl = strlen(v->name) + 1;
            memcpy(p, v->name, nl);
            fm_st_tensor *t = &ck->mem[i];
            /* owner_ NULL: fm_st_read copies from data, as for a parsed buffer */
            *t = (fm_st_tensor){.name = p, .dtype = v->dtype, .ndim = v->ndim, .data = v->data, .file = file};
            memcpy(t->shape, v->shape, (size_t)v->ndim * sizeof *t->shape);
            t->nbytes = fm_st_nbytes(v->dtype, fm_st_numel(v->ndim, v->shape));
            p += nl;
        }
        ck->n_mem = n;
        s = build_table(ck);
    }
    if (s != FM_OK) {
        fm_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return FM_OK;
}

size_t fm_checkpoint_tensor_count(const fm_checkpoint *ck) { return ck ? ck->n : 0; }

const fm_st_tensor *fm_checkpoint_tensor_at(const fm_checkpoint *ck, size_t i)
{
    return (ck && i < ck->n) ? ck->by_name[i] : NULL;
}

fm_status fm_checkpoint_find(const fm_checkpoint *ck, const char *name, const fm_st_tensor **out)
{
    if (!ck || !name || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_checkpoint_find: NULL argument");
    size_t lo = 0, hi = ck->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->by_name[mid]->name, name);
        if (!c) {
            *out = ck->by_name[mid];
            return FM_OK;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    if (!ck->dir) return fm_fail(FM_ERR_NOT_FOUND, "no tensor '%s' in the checkpoint (%s: %zu tensors)", name, ck->strings, ck->n);
    return fm_fail(FM_ERR_NOT_FOUND, "no tensor '%s' in the checkpoint (%zu files under %s)", name, ck->n_files,
                   ck->dir);
}

size_t fm_checkpoint_file_count(const fm_checkpoint *ck) { return ck ? ck->n_files : 0; }

const char *fm_checkpoint_file_path(const fm_checkpoint *ck, size_t i)
{
    return (ck && i < ck->n_files) ? fm_safetensors_path(ck->files[i]) : NULL;
}

uint64_t fm_checkpoint_data_bytes(const fm_checkpoint *ck) { return ck ? ck->bytes : 0; }

const char *fm_checkpoint_dir(const fm_checkpoint *ck) { return ck ? ck->dir : NULL; }

const char *fm_checkpoint_label(const fm_checkpoint *ck)
{
    return !ck ? "" : ck->dir ? ck->dir : ck->strings;
}
