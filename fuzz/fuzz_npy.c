/* fuzz_npy.c - libFuzzer target over the .npy reader (src/io/npy.c: routing ids / weights and
 * activations that `fp4moe run --input` and the tests read):
 *
 * 1. the parser over a buffer (fm_npy_parse): any byte string either fails with a status and
 *    a zeroed result, or yields an F32 / BF16 array whose numel is the product of its shape
 *    and whose every byte the target reads (ASan reports a read outside the allocation);
 * 2. the same bytes as a file (a memfd, read by path with fm_npy_read): the same verdict and
 *    the same array;
 * 3. an accepted array written with fm_npy_write and read back: the same dtype, shape and
 *    bytes (the writer and the reader agree on every array the reader accepts).
 * Any disagreement aborts (a finding). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp4moe/tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_array(const fm_npy *a, const fm_npy *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->numel != b->numel) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    const size_t bytes = (size_t)a->numel * (a->dtype == FM_DTYPE_F32 ? 4 : 2);
    return bytes == 0 || (a->data && b->data && !memcmp(a->data, b->data, bytes));
}

static int zeroed(const fm_npy *a)
{
    static const fm_npy z;
    return !memcmp(a, &z, sizeof z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* 1. the buffer */
    fm_npy    a;
    fm_status s = fm_npy_parse(size ? data : (const uint8_t *)"", size, "fuzz", &a);
    if (s != FM_OK) {
        if (!zeroed(&a)) abort(); /* "On failure *out is zeroed" */
    } else {
        if (a.dtype != FM_DTYPE_F32 && a.dtype != FM_DTYPE_BF16) abort();
        if (a.ndim < 0 || a.ndim > FM_ST_MAX_DIMS) abort();
        uint64_t n = 1;
        for (int d = 0; d < a.ndim; d++) {
            if (a.shape[d] < 0) abort();
            n *= (uint64_t)a.shape[d];
        }
        if (n != a.numel) abort();
        const size_t   bytes = (size_t)a.numel * (a.dtype == FM_DTYPE_F32 ? 4 : 2);
        const uint8_t *p = a.data;
        if (bytes > size) abort(); /* the data came from the input */
        volatile unsigned char sink = 0; /* every byte read (ASan checks each read) */
        for (size_t i = 0; i < bytes; i++) sink ^= p[i];
        (void)sink;
    }

    /* 2. the same bytes as a file */
    int fd = memfd_create("fuzz_npy", MFD_CLOEXEC);
    if (fd >= 0) {
        if (size && write(fd, data, size) != (ssize_t)size) abort();
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        fm_npy    f;
        fm_status sf = fm_npy_read(path, &f);
        if (sf != s) abort();
        if (sf == FM_OK ? !same_array(&a, &f) : !zeroed(&f)) abort();
        fm_npy_free(&f);
        close(fd);
    }

    /* 3. written and read back (small arrays: the round trip costs a file per input) */
    if (s == FM_OK && a.numel <= 4096) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/fuzz_npy_%ld.npy", (long)getpid());
        if (fm_npy_write(path, a.dtype, a.ndim, a.shape, a.data) != FM_OK) abort();
        fm_npy b;
        if (fm_npy_read(path, &b) != FM_OK || !same_array(&a, &b)) abort();
        fm_npy_free(&b);
        unlink(path);
    }
    if (s == FM_OK) fm_npy_free(&a);
    return 0;
}
