/* testutil.c - see testutil.h */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fm_rng_init(fm_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t fm_rng_u64(fm_rng *r) /* xoshiro256** */
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double fm_rng_uniform(fm_rng *r) { return (double)(fm_rng_u64(r) >> 11) * 0x1.0p-53; }

float fm_rng_normal(fm_rng *r)
{
    double u1 = fm_rng_uniform(r), u2 = fm_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void fm_rng_fill_normal(fm_rng *r, float *x, size_t n, float sigma)
{
    for (size_t i = 0; i < n; i++) x[i] = sigma * fm_rng_normal(r);
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
}
