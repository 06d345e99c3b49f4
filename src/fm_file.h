/* fm_file.h - the one way the library opens and reads the files it is given
 * (not installed): safetensors shards, index files, folder members,
 * config.json, the simulator's measured CSV; and the one way it writes a file
 * (fm_file_out, below): .npy outputs, safetensors checkpoints and indexes, plots.
 *
 * Why one helper: a path the user names may be a FIFO (open() blocks until a
 * writer comes, forever), a device (opening it can have effects), a directory
 * or a socket; and a regular file may shrink while it is in use (a mapping of
 * it would then SIGBUS on the next touch). Checking S_ISREG after a plain
 * open() is too late for the first, and a mapping cannot be made safe against
 * the second, so every reader goes through these functions instead.
 */
#ifndef FM_FILE_H
#define FM_FILE_H

#include "fm_internal.h"

#include <stdint.h>
#include <stdio.h>

/* Open `path` read-only, as a regular file: stat() first, so a FIFO, device,
 * directory or socket is refused without being opened; then open with
 * O_NONBLOCK | O_NOCTTY | O_CLOEXEC and fstat() the descriptor (the path may
 * have been swapped in between), then clear O_NONBLOCK. On success *fd is the
 * open descriptor (the caller closes it) and *size (may be NULL) its size.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL argument), FM_ERR_IO naming the path:
 * "cannot open: <errno text>" or "not a regular file (a FIFO)" and so on. */
fm_status fm_file_open(const char *path, int *fd, uint64_t *size);

/* What a non-regular file is, for messages ("a FIFO (named pipe)", "a symbolic link (not
 * followed)", ...), from its st_mode. */
const char *fm_file_kind(unsigned mode);

/* fm_file_open as a stdio stream for reading. Same statuses; *out is NULL on failure. */
fm_status fm_file_fopen(const char *path, FILE **out);

/* Read exactly n bytes at byte offset off of fd into dst (pread: no file
 * position, no mapping). `label` names the file in messages. Partial reads
 * and EINTR are retried; a read that ends early (the file is shorter than it
 * was when opened) or fails is FM_ERR_IO naming label, offset and length.
 * Returns FM_OK, FM_ERR_IO, FM_ERR_OUT_OF_RANGE (off + n beyond 2^63). */
fm_status fm_file_pread(int fd, const char *label, uint64_t off, void *dst, size_t n);

/* ---- writing ----------------------------------------------------------------
 *
 * Every file the library writes goes through fm_file_out: begin, write (any
 * number of times), then commit or abort. The bytes go to a temporary created
 * next to PATH, which is renamed over PATH only once every byte was written,
 * fsync()ed and closed without error; on any failure the temporary is removed
 * and PATH is as it was (absent, or the old file).
 *
 * The rule for PATH, checked at begin and again just before the rename:
 *   - absent (its directory must exist and be writable): written;
 *   - a regular file: written only if it is writable by this process
 *     (access(W_OK)) and has a write bit in its mode (S_IWUSR | S_IWGRP |
 *     S_IWOTH): access() says yes to root for every file, so the mode bits are
 *     what makes a read-only file (chmod a-w) refused for root too;
 *   - anything else is refused with FM_ERR_IO naming PATH and what it is: a
 *     symbolic link (not followed, dangling or not: renaming over it would
 *     replace the link, writing through it would write elsewhere), a directory,
 *     a FIFO, a character or block device (/dev/null, /dev/full), a socket.
 * Why refuse rather than write into such a PATH: the old writer's rename()
 * replaced a device node or FIFO with a regular file (as root, /dev/full) and
 * exited 0.
 *
 * The temporary is "PATH.XXXXXXXXXXXX.tmp" (random hex), opened with
 * O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode 0666 before the umask (as
 * fopen("w") would make PATH): never an existing file, never through a link.
 * fsync before the rename: so that after a crash PATH is the old file or the
 * whole new one, never an empty or partial one (ext4 and XFS may commit the
 * rename before the data), and so that a write error the kernel reports only
 * at writeback (ENOSPC, EIO, quota on NFS) is an error here, not a silently
 * short file. The directory is not fsynced: after a crash the rename itself
 * may be lost, leaving the old file, which the rule above allows.
 *
 * What is not defended: a process that can write PATH's directory can swap
 * PATH between the last check and rename(2) (rename has no "only if still a
 * regular file"); when PATH was absent the rename is renameat2(RENAME_NOREPLACE)
 * where the file system supports it, so nothing created meanwhile is replaced.
 */
typedef struct {
    int   fd;      /* the temporary, open for writing; -1 once closed */
    int   existed; /* 1: PATH was a regular file at begin; 0: absent */
    char *path;    /* PATH (a copy) */
    char *tmp;     /* the temporary's path (a child process may write it by name: plot.c) */
} fm_file_out;

/* Check PATH by the rule above and create its temporary. On FM_OK the caller
 * must end with fm_file_out_commit or fm_file_out_abort. Returns FM_OK,
 * FM_ERR_INVALID_ARG (NULL or empty path), FM_ERR_OOM, FM_ERR_IO naming PATH
 * (refused by the rule; its directory missing or not writable). On failure o
 * needs no abort (it is left so that an abort is harmless). */
fm_status fm_file_out_begin(const char *path, fm_file_out *o);

/* Append n bytes (partial writes and EINTR retried). On failure (ENOSPC, EFBIG,
 * EIO...) returns FM_ERR_IO naming PATH and the errno text, and aborts o: the
 * temporary is removed, PATH untouched, and the caller only returns the status
 * (a later write, commit or abort on o is a harmless no-op / FM_ERR_IO). */
fm_status fm_file_out_write(fm_file_out *o, const void *p, size_t n);

/* fsync and close the temporary, check PATH by the rule again, rename the
 * temporary over it. Returns FM_OK, or FM_ERR_IO naming PATH with the temporary
 * removed and PATH untouched. o is finished either way. */
fm_status fm_file_out_commit(fm_file_out *o);

/* Close and remove the temporary, free o; PATH untouched. Safe on a finished o. */
void fm_file_out_abort(fm_file_out *o);

#endif
