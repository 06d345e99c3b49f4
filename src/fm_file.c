/* fm_file.c - opening input files without blocking on a FIFO, and reading
 * them with pread so that a file truncated while open is an error, not a
 * SIGBUS (see fm_file.h). */
#define _POSIX_C_SOURCE 200809L
#include "fm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *fm_file_kind(unsigned mode)
{
    mode_t m = (mode_t)mode;
    if (S_ISLNK(m)) return "a symbolic link (not followed)";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

fm_status fm_file_open(const char *path, int *fd, uint64_t *size)
{
    if (!path || !fd) return fm_fail(FM_ERR_INVALID_ARG, "fm_file_open: NULL argument");
    *fd = -1;
    struct stat sb;
    /* Refuse by type before opening: open() of a FIFO waits for a writer. */
    if (stat(path, &sb) != 0) return fm_fail(FM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return fm_fail(FM_ERR_IO, "%s: not a regular file (%s)", path, fm_file_kind(sb.st_mode));
    /* O_NONBLOCK: should the path have become a FIFO since stat(), open() still returns at once. */
    int d = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (d < 0) return fm_fail(FM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(d, &sb) != 0) {
        int e = errno;
        close(d);
        return fm_fail(FM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(d);
        return fm_fail(FM_ERR_IO, "%s: not a regular file (%s)", path, fm_file_kind(sb.st_mode));
    }
    int fl = fcntl(d, F_GETFL);
    if (fl < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(d);
        return fm_fail(FM_ERR_IO, "%s: cannot clear O_NONBLOCK: %s", path, strerror(e));
    }
    *fd = d;
    if (size) *size = (uint64_t)sb.st_size;
    return FM_OK;
}

fm_status fm_file_fopen(const char *path, FILE **out)
{
    if (!out) return fm_fail(FM_ERR_INVALID_ARG, "fm_file_fopen: out is NULL");
    *out = NULL;
    int d;
    FM_CHECK(fm_file_open(path, &d, NULL));
    FILE *f = fdopen(d, "r");
    if (!f) {
        int e = errno;
        close(d);
        return fm_fail(FM_ERR_IO, "%s: cannot open a stream: %s", path, strerror(e));
    }
    *out = f;
    return FM_OK;
}

fm_status fm_file_pread(int fd, const char *label, uint64_t off, void *dst, size_t n)
{
    if (off > (uint64_t)INT64_MAX || n > (uint64_t)INT64_MAX - off)
        return fm_fail(FM_ERR_OUT_OF_RANGE, "%s: read of %zu bytes at offset %llu is beyond any file", label, n,
                       (unsigned long long)off);
    uint8_t *p = dst;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return fm_fail(FM_ERR_IO, "%s: read error at byte %llu: %s", label, (unsigned long long)(off + done),
                           strerror(errno));
        }
        if (r == 0)
            return fm_fail(FM_ERR_IO,
                           "%s: file ends at byte %llu, reading %zu bytes at offset %llu: truncated or replaced "
                           "since it was opened",
                           label, (unsigned long long)(off + done), n, (unsigned long long)off);
        done += (size_t)r;
    }
    return FM_OK;
}
