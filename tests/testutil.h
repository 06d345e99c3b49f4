/* testutil.h - what every fp4moe test shares: cmocka, a seeded RNG whose seed is
 * printed (fresh per run unless FM_SEED is set, so a failure can be replayed),
 * output poisoning, the NaN/Inf-first check and the error metrics. */
#ifndef FM_TESTUTIL_H
#define FM_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fp4moe/tools.h"

/* Seed for this run: $FM_SEED if set, else from the clock; printed once. */
uint64_t fm_test_seed(void);

/* fm_rng, fm_rng_init, fm_rng_uniform, fm_rng_normal, ...: the library's generator. */
#include "fm_rng.h"

/* Fill with a signalling-looking NaN pattern so unwritten outputs are caught. */
void fm_poison_f32(float *x, size_t n);
void fm_poison_bytes(void *x, size_t n);

/* Index of the first NaN/Inf in x, or -1. */
long fm_first_nonfinite(const float *x, size_t n);

/* Normalised mean squared error sum((a-ref)^2) / sum(ref^2) (0 when both are 0). */
double fm_nmse(const float *a, const float *ref, size_t n);
double fm_nmse64(const float *a, const double *ref, size_t n);

/* Assert: no NaN/Inf in `got` first, then NMSE <= bound; prints context on failure. */
void fm_assert_close(const float *got, const float *ref, size_t n, double nmse_bound, const char *what);

/* Exit with 77 (ctest "skipped") and a clear message when no CUDA device is
 * usable; call first in GPU tests. */
void fm_test_require_gpu(void);

/* A new file /tmp/fm-<tag>-XXXXXX holding `text` (asserts on failure); the path is in a
 * static buffer that the next call overwrites. The caller unlinks it. */
char *fm_test_write_tmp(const char *tag, const char *text);

#endif
