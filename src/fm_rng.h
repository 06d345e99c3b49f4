/* fm_rng.h - the one seeded random generator of fp4moe (xoshiro256** seeded by
 * splitmix64), shared by the simulator, the CLI's random layers and the tests:
 * reproducible from a 64-bit seed, independent of the platform's rand(). */
#ifndef FM_RNG_H
#define FM_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t s[4]; } fm_rng;

void     fm_rng_init(fm_rng *r, uint64_t seed);
uint64_t fm_rng_u64(fm_rng *r);
double   fm_rng_uniform(fm_rng *r);     /* [0, 1), 53 random bits */
float    fm_rng_normal(fm_rng *r);      /* N(0, 1), Box-Muller */
/* Approximately N(0, 1) from a sum of 4 uniforms (Irwin-Hall, bounded by
 * +-3.46): ~10x cheaper than Box-Muller, for filling gigabytes of random weights
 * where the tails do not matter. */
float fm_rng_normal_fast(fm_rng *r);
void  fm_rng_fill_normal(fm_rng *r, float *x, size_t n, float sigma);

#endif
