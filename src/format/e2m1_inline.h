/* e2m1_inline.h - the E2M1 encoder as a static inline, shared by codec.c
 * (fm_e2m1_encode, tested bit-exact against ml_dtypes) and quantize.c, whose
 * per-element loops need it inlined to vectorize (a call per element made
 * fm_quantize ~4x slower).  Private to src/format/.
 */
#ifndef FM_E2M1_INLINE_H
#define FM_E2M1_INLINE_H

#include <stdint.h>
#include <string.h>

/* With only eight magnitudes, RNE is a count of the midpoints passed: a tie
 * goes up exactly when the upper neighbour has an even code (0.75 -> 1,
 * 1.75 -> 2, 3.5 -> 4; but 0.25 -> 0, 1.25 -> 1, 2.5 -> 2, 5 -> 4).
 * Branch-free; NaN fails every compare (-> +0, sign dropped) and +-Inf
 * passes every one (-> +-6). */
static inline uint8_t fm_e2m1_encode_inl(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    float a = x < 0.0f ? -x : x;
    uint32_t mag = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f) + (uint32_t)(a > 1.25f) + (uint32_t)(a >= 1.75f) +
                   (uint32_t)(a > 2.5f) + (uint32_t)(a >= 3.5f) + (uint32_t)(a > 5.0f);
    uint32_t sign = (a == a) ? (u >> 28) & 0x8u : 0u;
    return (uint8_t)(sign | mag);
}

#endif
