/* fuzz_safetensors.c - libFuzzer target over the safetensors reader:
 *
 * 1. the header parser over a buffer (fm_safetensors_parse): any byte string
 *    either fails with a status or yields tensors whose every byte lies inside
 *    the input; the target reads all of each accepted tensor and looks each
 *    one up by name, so ASan (built in by fuzz/run.sh) reports any read
 *    outside the buffer, and a lookup that misses a listed tensor aborts;
 * 2. the same bytes as a file (a memfd, opened by path through
 *    fm_safetensors_open and read with fm_st_read): the same verdict and the
 *    same bytes; then the file is cut short (at a length taken from the
 *    input) while open, and every read must either succeed with the same
 *    bytes (it lies before the cut) or fail with FM_ERR_IO, never crash.
 */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp4moe/tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Part 2 against the buffer's verdict (parsed: st, or NULL when it failed). */
static void check_file(const uint8_t *data, size_t size, const fm_safetensors *st, fm_status want)
{
    int fd = memfd_create("fuzz_st", MFD_CLOEXEC);
    if (fd < 0) return; /* no memfd here: part 1 alone */
    if (size && write(fd, data, size) != (ssize_t)size) abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    fm_safetensors *sf = NULL;
    fm_status s = fm_safetensors_open(path, &sf);
    if (s != want) abort(); /* a file and a buffer of the same bytes: one verdict */
    if (s != FM_OK) {
        if (sf) abort();
        close(fd);
        return;
    }
    if (fm_safetensors_count(sf) != fm_safetensors_count(st)) abort();
    static uint8_t buf[1 << 16];
    for (size_t i = 0; i < fm_safetensors_count(sf); i++) {
        const fm_st_tensor *t = fm_safetensors_at(sf, i), *u = fm_safetensors_at(st, i);
        if (t->data || t->nbytes != u->nbytes || t->nbytes > sizeof buf) abort();
        if (fm_st_read(t, 0, (size_t)t->nbytes, buf) != FM_OK || memcmp(buf, u->data, (size_t)t->nbytes)) abort();
    }
    /* Cut the open file: reads must fail cleanly past the cut. */
    uint64_t cut = size ? (uint64_t)data[size - 1] * size / 256 : 0;
    if (ftruncate(fd, (off_t)cut) != 0) abort();
    for (size_t i = 0; i < fm_safetensors_count(sf); i++) {
        const fm_st_tensor *t = fm_safetensors_at(sf, i), *u = fm_safetensors_at(st, i);
        s = fm_st_read(t, 0, (size_t)t->nbytes, buf);
        int inside = t->file_offset + t->nbytes <= cut;
        if (inside ? s != FM_OK || memcmp(buf, u->data, (size_t)t->nbytes) : s != FM_ERR_IO && t->nbytes) abort();
    }
    fm_safetensors_close(sf);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fm_safetensors *st = NULL;
    fm_status s = fm_safetensors_parse(data, size, "fuzz", &st);
    if (s != FM_OK) {
        if (st) abort(); /* failure must leave the out pointer NULL */
        check_file(data, size, NULL, s);
        return 0;
    }
    volatile uint8_t acc = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < fm_safetensors_count(st); i++) {
        const fm_st_tensor *t = fm_safetensors_at(st, i), *u = NULL;
        if (t->data < data || t->data + t->nbytes > data + size) abort();
        for (uint64_t k = 0; k < t->nbytes; k++) acc ^= t->data[k];
        if (fm_safetensors_find(st, t->name, &u) != FM_OK || u != t) abort();
        total += t->nbytes;
    }
    if (total > size) abort();
    (void)acc;
    check_file(data, size, st, FM_OK);
    fm_safetensors_close(st);
    return 0;
}
