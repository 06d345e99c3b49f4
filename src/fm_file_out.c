/* fm_file_out.c - writing a file through an exclusive temporary renamed over
 * its path, refusing paths that are not plain writable files (the rule and
 * why: fm_file.h). */
#define _GNU_SOURCE /* renameat2 */
#include "fm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* PATH by the rule of fm_file.h: FM_OK with *existed 0 (absent) or 1 (a
 * writable regular file), else FM_ERR_IO naming it. */
static fm_status check_target(const char *path, int *existed)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) {
            *existed = 0;
            return FM_OK; /* a missing directory is reported when the temporary is created */
        }
        return fm_fail(FM_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
        return fm_fail(FM_ERR_IO, "%s: refusing to write: it is %s, not a regular file", path, fm_file_kind(sb.st_mode));
    /* access(): the owner / group / other bits as they apply to this process;
     * the mode test: root passes access() for any file, a 0444 file stays read-only */
    if (access(path, W_OK) != 0 || !(sb.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)))
        return fm_fail(FM_ERR_IO, "%s: refusing to write: the file is read-only (mode %03o)", path,
                       (unsigned)(sb.st_mode & 0777));
    *existed = 1;
    return FM_OK;
}

static uint64_t random_bits(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r) return r;
    /* no entropy yet (early boot): O_EXCL keeps it safe, the name need only differ */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    static _Thread_local uint64_t n;
    r = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ (++n * 0x9e3779b97f4a7c15ull);
    return r;
}

fm_status fm_file_out_begin(const char *path, fm_file_out *o)
{
    if (!o) return fm_fail(FM_ERR_INVALID_ARG, "fm_file_out_begin: NULL argument");
    *o = (fm_file_out){.fd = -1};
    if (!path || !*path) return fm_fail(FM_ERR_INVALID_ARG, "fm_file_out_begin: NULL or empty path");
    int existed = 0;
    FM_CHECK(check_target(path, &existed));
    size_t pl = strlen(path);
    o->path = malloc(pl + 1);
    o->tmp = malloc(pl + 18); /* "." 12 hex ".tmp" NUL */
    if (!o->path || !o->tmp) {
        fm_file_out_abort(o);
        return fm_fail(FM_ERR_OOM, "%s: out of memory", path);
    }
    memcpy(o->path, path, pl + 1);
    o->existed = existed;
    int e = 0;
    for (int tries = 0; tries < 64; tries++) {
        snprintf(o->tmp, pl + 18, "%s.%012llx.tmp", path, (unsigned long long)(random_bits() & 0xffffffffffffull));
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0666);
        if (o->fd >= 0) return FM_OK;
        if ((e = errno) != EEXIST) break;
    }
    fm_file_out_abort(o);
    return fm_fail(FM_ERR_IO, "%s: cannot create a temporary next to it: %s", path, strerror(e));
}

fm_status fm_file_out_write(fm_file_out *o, const void *p, size_t n)
{
    if (!o || !o->path || o->fd < 0) return fm_fail(FM_ERR_IO, "fm_file_out_write: the file is not open");
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t w = write(o->fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            /* w == 0 with n > 0 does not happen for a regular file; treat it as full */
            fm_status s = fm_fail(FM_ERR_IO, "%s: write failed: %s (nothing written there)", o->path,
                                  w < 0 ? strerror(errno) : "no space");
            fm_file_out_abort(o);
            return s;
        }
        b += w;
        n -= (size_t)w;
    }
    return FM_OK;
}

fm_status fm_file_out_commit(fm_file_out *o)
{
    if (!o || !o->path || o->fd < 0) {
        if (o) fm_file_out_abort(o);
        return fm_fail(FM_ERR_IO, "fm_file_out_commit: the file is not open (an earlier write failed)");
    }
    fm_status s = FM_OK;
    int fd = o->fd;
    o->fd = -1;
    if (fsync(fd) != 0) s = fm_fail(FM_ERR_IO, "%s: write failed (fsync): %s (nothing written there)", o->path, strerror(errno));
    if (close(fd) != 0 && s == FM_OK)
        s = fm_fail(FM_ERR_IO, "%s: write failed (close): %s (nothing written there)", o->path, strerror(errno));
    int existed = 0;
    if (s == FM_OK) s = check_target(o->path, &existed);
    if (s == FM_OK) {
        int r = -1;
#ifdef RENAME_NOREPLACE
        if (!existed && (r = renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->path, RENAME_NOREPLACE)) != 0 &&
            errno != EINVAL && errno != ENOSYS)
            s = fm_fail(FM_ERR_IO, "%s: cannot rename the temporary over it: %s", o->path,
                        errno == EEXIST ? "it was created by someone else meanwhile" : strerror(errno));
#endif
        if (s == FM_OK && r != 0 && rename(o->tmp, o->path) != 0)
            s = fm_fail(FM_ERR_IO, "%s: cannot rename the temporary over it: %s", o->path, strerror(errno));
        if (s == FM_OK) {
            free(o->tmp); /* renamed: nothing to remove */
            o->tmp = NULL;
        }
    }
    fm_file_out_abort(o);
    return s;
}

void fm_file_out_abort(fm_file_out *o)
{
    if (!o) return;
    if (o->fd >= 0) close(o->fd);
    if (o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    *o = (fm_file_out){.fd = -1};
}
