/* rng.c - see fm_rng.h */
#include "fm_rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fm_rng_init(fm_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t fm_rng_u64(fm_rng *r)
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

float fm_rng_normal_fast(fm_rng *r)
{
    uint64_t a = fm_rng_u64(r), b = fm_rng_u64(r);
    float u = (float)(a & 0xffffffffu) + (float)(a >> 32) + (float)(b & 0xffffffffu) + (float)(b >> 32);
    return (u * (1.0f / 4294967296.0f) - 2.0f) * 1.7320508f; /* sum of 4 U(0,1): mean 2, variance 1/3 */
}

void fm_rng_fill_normal(fm_rng *r, float *x, size_t n, float sigma)
{
    for (size_t i = 0; i < n; i++) x[i] = sigma * fm_rng_normal(r);
}
