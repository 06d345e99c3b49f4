/* testutil.c - see testutil.h */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t fm_test_seed(void)
{
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *e = getenv("FM_SEED");
        if (e && *e) {
            seed = strtoull(e, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        }
        printf("# FM_SEED=%llu (set FM_SEED to replay)\n", (unsigned long long)seed);
        fflush(stdout);
        done = 1;
    }
    return seed;
}

void fm_poison_f32(float *x, size_t n)
{
    const uint32_t nan_bits = 0x7fa5a5a5u; /* a NaN payload no kernel produces */
    for (size_t i = 0; i < n; i++) memcpy(&x[i], &nan_bits, 4);
}

void fm_poison_bytes(void *x, size_t n) { memset(x, 0xA5, n); }

long fm_first_nonfinite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (long)i;
    return -1;
}

double fm_nmse(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

double fm_nmse64(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

void fm_assert_close(const float *got, const float *ref, size_t n, double nmse_bound, const char *what)
{
    long bad = fm_first_nonfinite(got, n);
    if (bad >= 0) fail_msg("%s: non-finite output at %ld (%g): unwritten or overflow", what, bad, got[bad]);
    double e = fm_nmse(got, ref, n);
    printf("# %s: nmse %.3e (bound %.1e)\n", what, e, nmse_bound);
    if (!(e <= nmse_bound)) fail_msg("%s: nmse %.3e > bound %.1e", what, e, nmse_bound);
}

void fm_test_require_gpu(void)
{
    fm_status s = fm_backend_available(FM_BACKEND_CUDA);
    if (s != FM_OK) {
        printf("SKIPPED: no usable CUDA device (%s: %s); GPU tests run on the GPU machine "
               "(bench/gpu-check.sh)\n", fm_status_name(s), fm_last_error());
        exit(77);
    }
    /* FM_TEST_FILTER=pattern (cmocka's wildcards): run only those tests, e.g. one test under
     * compute-sanitizer (bench/gpu-check.sh) */
    const char *f = getenv("FM_TEST_FILTER");
    if (f && *f) {
        cmocka_set_test_filter(f);
        printf("# FM_TEST_FILTER=%s: only the tests it matches\n", f);
    }
}

char *fm_test_write_tmp(const char *tag, const char *text)
{
    static char path[96];
    snprintf(path, sizeof path, "/tmp/fm-%s-XXXXXX", tag);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path;
}
