/* npy.c - numpy .npy files for layer inputs and outputs (fp4moe/io.h).
 *
 * The header is a Python dict literal; numpy itself writes exactly three keys
 * ('descr', 'fortran_order', 'shape'). The parser accepts any order of those
 * three, single or double quotes, spaces anywhere between tokens and a
 * trailing comma, and nothing else: a hand-made or foreign file that says
 * something fp4moe would misread is an error naming what it saw, never a
 * guess. Data is copied out of the read buffer (files are small: one
 * layer's activations).
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"
#include "fm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char k_magic[6] = {(char)0x93, 'N', 'U', 'M', 'P', 'Y'};

typedef struct {
    const char *p, *end, *label;
} lex;

static void ws(lex *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t')) l->p++;
}

static int eat(lex *l, char c)
{
    ws(l);
    if (l->p < l->end && *l->p == c) {
        l->p++;
        return 1;
    }
    return 0;
}

/* A quoted string ('...' or "...", no escapes: numpy never writes any) into dst. */
static int str(lex *l, char *dst, size_t n)
{
    ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) return 0;
    char q = *l->p++;
    size_t k = 0;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || k + 1 >= n) return 0;
        dst[k++] = *l->p++;
    }
    if (l->p >= l->end) return 0;
    l->p++;
    dst[k] = '\0';
    return 1;
}

static fm_status parse_shape(lex *l, fm_npy *a)
{
    if (!eat(l, '(')) return fm_fail(FM_ERR_FORMAT, "%s: .npy header: 'shape' is not a tuple", l->label);
    a->ndim = 0;
    for (;;) {
        if (eat(l, ')')) return FM_OK;
        ws(l);
        if (l->p >= l->end || *l->p < '0' || *l->p > '9')
            return fm_fail(FM_ERR_FORMAT, "%s: .npy header: 'shape' holds something other than non-negative integers",
                           l->label);
        int64_t v = 0;
        while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
            if (v > (INT64_MAX - 9) / 10) return fm_fail(FM_ERR_BAD_SHAPE, "%s: .npy shape dimension overflows", l->label);
            v = v * 10 + (*l->p++ - '0');
        }
        if (a->ndim >= FM_ST_MAX_DIMS)
            return fm_fail(FM_ERR_BAD_SHAPE, "%s: .npy array has more than %d dimensions", l->label, FM_ST_MAX_DIMS);
        a->shape[a->ndim++] = v;
        if (eat(l, ',')) continue;
        if (eat(l, ')')) return FM_OK;
        return fm_fail(FM_ERR_FORMAT, "%s: .npy header: malformed 'shape' tuple", l->label);
    }
}

/* The dict: exactly descr, fortran_order and shape, once each. */
static fm_status parse_dict(lex *l, fm_npy *a)
{
    int seen_d = 0, seen_f = 0, seen_s = 0;
    char descr[32] = "";
    if (!eat(l, '{')) return fm_fail(FM_ERR_FORMAT, "%s: .npy header is not a dict", l->label);
    while (!eat(l, '}')) {
        char key[32];
        if (!str(l, key, sizeof key) || !eat(l, ':'))
            return fm_fail(FM_ERR_FORMAT, "%s: .npy header: malformed dict entry", l->label);
        if (!strcmp(key, "descr") && !seen_d) {
            if (!str(l, descr, sizeof descr)) return fm_fail(FM_ERR_FORMAT, "%s: .npy 'descr' is not a simple type string", l->label);
            seen_d = 1;
        } else if (!strcmp(key, "fortran_order") && !seen_f) {
            ws(l);
            size_t left = (size_t)(l->end - l->p);
            if (left >= 5 && !memcmp(l->p, "False", 5)) l->p += 5;
            else if (left >= 4 && !memcmp(l->p, "True", 4))
                return fm_fail(FM_ERR_UNSUPPORTED, "%s: .npy array is in Fortran order; save it C-contiguous "
                                                   "(np.ascontiguousarray)", l->label);
            else return fm_fail(FM_ERR_FORMAT, "%s: .npy 'fortran_order' is not True or False", l->label);
            seen_f = 1;
        } else if (!strcmp(key, "shape") && !seen_s) {
            FM_CHECK(parse_shape(l, a));
            seen_s = 1;
        } else {
            return fm_fail(FM_ERR_FORMAT, "%s: .npy header: unexpected or repeated key '%s'", l->label, key);
        }
        if (!eat(l, ',')) {
            if (eat(l, '}')) break;
            return fm_fail(FM_ERR_FORMAT, "%s: .npy header: expected ',' or '}'", l->label);
        }
    }
    if (!seen_d || !seen_f || !seen_s)
        return fm_fail(FM_ERR_FORMAT, "%s: .npy header lacks '%s'", l->label,
                       !seen_d ? "descr" : !seen_f ? "fortran_order" : "shape");
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r')) l->p++;
    if (l->p != l->end) return fm_fail(FM_ERR_FORMAT, "%s: .npy header: text after the dict", l->label);
    if (!strcmp(descr, "<f4")) a->dtype = FM_DTYPE_F32;
    else if (!strcmp(descr, "<u2") || !strcmp(descr, "<V2") || !strcmp(descr, "|V2")) a->dtype = FM_DTYPE_BF16;
    else if (descr[0] == '>' && (!strcmp(descr + 1, "f4") || !strcmp(descr + 1, "u2")))
        return fm_fail(FM_ERR_UNSUPPORTED, "%s: .npy dtype '%s' is big-endian; fp4moe reads '<f4' and '<u2'", l->label,
                       descr);
    else
        return fm_fail(FM_ERR_FORMAT, "%s: .npy dtype '%s': fp4moe reads '<f4' (float32), '<u2' (BF16 bits) and "
                                      "'<V2' (ml_dtypes bfloat16)", l->label, descr);
    return FM_OK;
}

fm_status fm_npy_parse(const void *buf, size_t len, const char *label, fm_npy *out)
{
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!buf || !label) return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_parse: NULL buffer or label");
    const unsigned char *b = buf;
    if (len < 10 || memcmp(b, k_magic, 6)) return fm_fail(FM_ERR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", label);
    int major = b[6];
    size_t hl, off;
    if (major == 1) hl = (size_t)b[8] | (size_t)b[9] << 8, off = 10;
    else if (major == 2 || major == 3) {
        if (len < 12) return fm_fail(FM_ERR_FORMAT, "%s: .npy file truncated in its header", label);
        hl = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        off = 12;
    } else
        return fm_fail(FM_ERR_FORMAT, "%s: .npy version %d.%d: fp4moe reads 1.0, 2.0 and 3.0", label, major, b[7]);
    if (b[7] != 0) return fm_fail(FM_ERR_FORMAT, "%s: .npy version %d.%d: fp4moe reads 1.0, 2.0 and 3.0", label, major, b[7]);
    if (hl > len - off) return fm_fail(FM_ERR_FORMAT, "%s: .npy header of %zu bytes runs past the file (%zu bytes)", label, hl, len);
    fm_npy a = {0};
    lex l = {(const char *)b + off, (const char *)b + off + hl, label};
    FM_CHECK(parse_dict(&l, &a));
    int64_t n = fm_st_numel(a.ndim, a.shape);
    size_t esz = a.dtype == FM_DTYPE_F32 ? 4 : 2;
    if (n < 0 || (uint64_t)n > SIZE_MAX / esz) return fm_fail(FM_ERR_BAD_SHAPE, "%s: .npy shape overflows", label);
    size_t want = (size_t)n * esz, have = len - off - hl;
    if (have != want)
        return fm_fail(FM_ERR_FORMAT, "%s: .npy data is %zu bytes, the shape says %zu (%s)", label, have, want,
                       have < want ? "truncated" : "trailing bytes");
    a.numel = (uint64_t)n;
    a.data = malloc(want ? want : 1);
    if (!a.data) return fm_fail(FM_ERR_OOM, "%s: out of memory for %zu bytes", label, want);
    memcpy(a.data, b + off + hl, want);
    *out = a;
    return FM_OK;
}

fm_status fm_npy_read(const char *path, fm_npy *out)
{
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_read: path is NULL");
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not hang the open */
    if (fd < 0) return fm_fail(FM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return fm_fail(FM_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return fm_fail(FM_ERR_OOM, "%s: out of memory for %zu bytes", path, n);
    }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    fm_status s = fm_npy_parse(buf, got, path, out); /* a file shrunk under us reads as truncated */
    free(buf);
    return s;
}

void fm_npy_free(fm_npy *a)
{
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

fm_status fm_npy_write(const char *path, fm_dtype dtype, int ndim, const int64_t *shape, const void *data)
{
    if (!path || (ndim > 0 && !shape) || ndim < 0 || ndim > FM_ST_MAX_DIMS)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_write: NULL path/shape or ndim %d outside [0, %d]", ndim, FM_ST_MAX_DIMS);
    if (dtype != FM_DTYPE_F32 && dtype != FM_DTYPE_BF16)
        return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_write: dtype %s: only F32 and BF16", fm_dtype_name(dtype));
    int64_t n = fm_st_numel(ndim, shape);
    if (n < 0) return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_write: negative or overflowing shape");
    if (n > 0 && !data) return fm_fail(FM_ERR_INVALID_ARG, "fm_npy_write: data is NULL");
    char hdr[512];
    int k = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     dtype == FM_DTYPE_F32 ? "<f4" : "<u2");
    for (int i = 0; i < ndim; i++) k += snprintf(hdr + k, sizeof hdr - (size_t)k, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
    if (ndim > 1) k--; /* numpy writes (2, 3) but (3,) */
    k += snprintf(hdr + k, sizeof hdr - (size_t)k, "), }");
    size_t total = 10 + (size_t)k + 1, pad = (64 - total % 64) % 64; /* numpy aligns the data to 64 bytes */
    size_t hl = (size_t)k + pad + 1;
    unsigned char pre[10 + 512 + 64] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 255), (unsigned char)(hl >> 8)};
    memcpy(pre + 10, hdr, (size_t)k);
    memset(pre + 10 + k, ' ', pad);
    pre[10 + (size_t)k + pad] = '\n';
    size_t bytes = (size_t)n * (dtype == FM_DTYPE_F32 ? 4 : 2);
    fm_file_out o; /* PATH only if absent or a writable regular file, via an exclusive temporary (fm_file.h) */
    FM_CHECK(fm_file_out_begin(path, &o));
    FM_CHECK(fm_file_out_write(&o, pre, 10 + (size_t)k + pad + 1));
    if (bytes) FM_CHECK(fm_file_out_write(&o, data, bytes));
    FM_CHECK(fm_file_out_commit(&o));
    return FM_OK;
}
