/* fuzz_safetensors.c - libFuzzer target over the safetensors header parser
 * (fm_safetensors_parse): any byte string either fails with a status or yields
 * tensors whose every byte lies inside the input. The target reads all of each
 * accepted tensor and looks each one up by name, so ASan (built in by
 * fuzz/run.sh) reports any read outside the buffer, and a lookup that misses
 * a listed tensor aborts.
 */
#include <stdint.h>
#include <stdlib.h>

#include "fp4moe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fm_safetensors *st = NULL;
    if (fm_safetensors_parse(data, size, "fuzz", &st) != FM_OK) {
        if (st) abort(); /* failure must leave the out pointer NULL */
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
    fm_safetensors_close(st);
    return 0;
}
