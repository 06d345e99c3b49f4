/* fm_file.h - the one way the library opens and reads the files it is given
 * (not installed): safetensors shards, index files, folder members,
 * config.json, the simulator's measured CSV.
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

/* fm_file_open as a stdio stream for reading. Same statuses; *out is NULL on failure. */
fm_status fm_file_fopen(const char *path, FILE **out);

/* Read exactly n bytes at byte offset off of fd into dst (pread: no file
 * position, no mapping). `label` names the file in messages. Partial reads
 * and EINTR are retried; a read that ends early (the file is shorter than it
 * was when opened) or fails is FM_ERR_IO naming label, offset and length.
 * Returns FM_OK, FM_ERR_IO, FM_ERR_OUT_OF_RANGE (off + n beyond 2^63). */
fm_status fm_file_pread(int fd, const char *label, uint64_t off, void *dst, size_t n);

#endif
