/* codec.c - scalar codecs: E2M1, E4M3 (float8_e4m3fn), UE8M0 (float8_e8m0fnu),
 * BF16 and FP16, all round-to-nearest-even.
 *
 * How: every encoder works on the float32 bit pattern with integer arithmetic
 * only, so the result never depends on the FPU rounding mode, flush-to-zero
 * flags or the compiler's excess precision.  A finite |x| is rounded in one
 * place, minifloat_rne(): for a normal target the float32 magnitude bits are
 * shifted right by (23 - mantissa bits) with RNE, and a mantissa carry walks
 * into the exponent field by itself; for a subnormal target the full
 * significand is shifted by however many places puts its unit at the format's
 * smallest subnormal.  Each format then applies its own overflow policy:
 *
 *   format  bias  man  max finite   overflow            NaN in            (see docs/formats.md)
 *   E2M1      1    1   6            saturate to ±6      -> 0x0 (+0)
 *   E4M3      7    3   448          saturate to ±448    -> 0x7F | sign
 *   UE8M0   127    0   2^127        >= 1.5*2^127 -> NaN -> 0xFF (also x <= 0); nearest, ties up
 *   BF16    127    7   3.39e38      -> ±Inf             -> quiet, payload kept
 *   FP16     15   10   65504        -> ±Inf             -> quiet, payload kept
 *
 * The oracle for all of them is ml_dtypes (tests/py/codec_oracle.py); the two
 * places where we differ on purpose are E4M3 overflow (ml_dtypes gives NaN
 * above 464, we saturate: a scale must stay finite) and E2M1 NaN (ml_dtypes
 * gives -0 for +NaN, an artefact of the missing NaN code; we give +0).
 */
#include "fm_internal.h"
#include "format/e2m1_inline.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* v >> s rounded to nearest, ties to even. */
static uint32_t rshift_rne(uint32_t v, int s)
{
    if (s <= 0) return v;
    if (s >= 32) return 0; /* callers pass v < 2^31, so v / 2^32 < 0.5 */
    uint32_t q = v >> s;
    uint32_t rem = v & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

/* Magnitude code (exponent field << man | mantissa) of the finite float32
 * magnitude `a` (sign bit clear) rounded RNE into a format with `man`
 * mantissa bits and exponent bias `bias`, with subnormals and an unbounded
 * exponent range: the caller applies its overflow policy to the result. */
static uint32_t minifloat_rne(uint32_t a, int man, int bias)
{
    int e = (int)(a >> 23) - 127; /* unbiased float32 exponent; -127 = f32 subnormal */
    if (e >= 1 - bias) {
        /* Normal in the target: drop 23 - man mantissa bits; re-bias. */
        return rshift_rne(a, 23 - man) - ((uint32_t)(127 - bias) << man);
    }
    /* Subnormal in the target: count units of 2^(1 - bias - man). */
    uint32_t sig = a & 0x7FFFFFu;
    if (e == -127) {
        e = -126; /* float32 subnormal: no implicit bit */
    } else {
        sig |= 0x800000u;
    }
    /* value = sig * 2^(e - 23); units = value / 2^(1 - bias - man) */
    int s = 23 + 1 - bias - man - e; /* > 0 because e < 1 - bias */
    return rshift_rne(sig, s);
}

/* Inverse of minifloat_rne for a magnitude code (exact in float32), built
 * from bits rather than ldexpf: decoding sits in the dequantize loops. */
static float minifloat_decode(uint32_t mag, int man, int bias)
{
    uint32_t ef = mag >> man;
    uint32_t mf = mag & ((1u << man) - 1u);
    if (ef == 0) /* subnormal: mf units of 2^(1 - bias - man), a normal float32 for our formats */
        return (float)mf * bits_f32((uint32_t)(127 + 1 - bias - man) << 23);
    return bits_f32(((ef + 127u - (uint32_t)bias) << 23) | (mf << (23 - man)));
}

/* ---- E2M1 ------------------------------------------------------------------ */

uint8_t fm_e2m1_encode(float x) { return fm_e2m1_encode_inl(x); }

float fm_e2m1_decode(uint8_t code)
{
    static const float k_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return k_e2m1[code & 0xFu];
}

/* ---- E4M3 (float8_e4m3fn: no Inf, 0x7F/0xFF are NaN, max 448 = 0x7E) ------- */

uint8_t fm_e4m3_encode(float x)
{
    uint32_t u = f32_bits(x);
    uint32_t a = u & 0x7FFFFFFFu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7F800000u) return sign | 0x7F; /* NaN keeps its sign, as ml_dtypes */
    if (a == 0x7F800000u) return sign | 0x7E; /* saturate: ±448 */
    uint32_t mag = minifloat_rne(a, 3, 7);
    if (mag > 0x7Eu) mag = 0x7Eu; /* 0x7F would be NaN: saturate */
    return (uint8_t)(sign | mag);
}

float fm_e4m3_decode(uint8_t code)
{
    if ((code & 0x7Fu) == 0x7Fu) return (code & 0x80u) ? -NAN : NAN;
    float v = minifloat_decode(code & 0x7Fu, 3, 7);
    return (code & 0x80u) ? -v : v;
}

/* ---- UE8M0 (float8_e8m0fnu: 2^(code-127), 0xFF = NaN, no zero) ---------- */

uint8_t fm_ue8m0_encode(float x)
{
    uint32_t u = f32_bits(x);
    if (u == 0 || (u & 0x80000000u) || (u & 0x7FFFFFFFu) >= 0x7F800000u) return 0xFF;
    /* Same bias as float32 and no mantissa bits: keep the exponent field and
     * round on the float32 mantissa.  With no stored mantissa the kept
     * significand is the implicit 1, which is odd, so RNE sends a tie
     * (x = 1.5 * 2^e) up to 2^(e+1): ties round up.  From 1.5 * 2^127 up the
     * result is 2^128: the NaN code.
     * Float32 subnormals (exponent field 0) lie in (0, 2^-126): the
     * neighbours are 2^-127 (code 0, bits 0x400000; also the nearest value for
     * anything smaller, the format has no zero) and 2^-126 (code 1), with the
     * midpoint 1.5 * 2^-127 at bits 0x600000, which rounds up like every tie.
     * (ml_dtypes < 0.7 sent all of (2^-127, 2^-126) to code 1.) */
    if ((u >> 23) == 0) return u >= 0x600000u ? 1 : 0;
    uint32_t q = (u + 0x400000u) >> 23;
    return q > 0xFEu ? 0xFF : (uint8_t)q;
}

float fm_ue8m0_decode(uint8_t code)
{
    if (code == 0xFF) return NAN;
    return bits_f32(code ? (uint32_t)code << 23 : 0x00400000u); /* code 0: 2^-127, a float32 subnormal */
}

/* ---- BF16 ------------------------------------------------------------------ */

uint16_t fm_bf16_encode(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    /* RNE on the low 16 bits; a carry into the exponent gives Inf on overflow. */
    return (uint16_t)rshift_rne(u & 0x7FFFFFFFu, 16) | (uint16_t)((u >> 16) & 0x8000u);
}

float fm_bf16_decode(uint16_t code) { return bits_f32((uint32_t)code << 16); }

/* ---- FP16 (IEEE binary16) ---------------------------------------------------- */

uint16_t fm_fp16_encode(float x)
{
    uint32_t u = f32_bits(x);
    uint32_t a = u & 0x7FFFFFFFu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7F800000u) return sign | 0x7E00u | (uint16_t)((a >> 13) & 0x3FFu); /* quiet NaN */
    if (a == 0x7F800000u) return sign | 0x7C00u;
    uint32_t mag = minifloat_rne(a, 10, 15);
    if (mag > 0x7C00u) mag = 0x7C00u; /* overflow: Inf (>= 65520 rounds there) */
    return (uint16_t)(sign | mag);
}

float fm_fp16_decode(uint16_t code)
{
    uint32_t sign = (uint32_t)(code & 0x8000u) << 16;
    uint32_t mag = code & 0x7FFFu;
    if (mag >= 0x7C00u) /* Inf / NaN: widen the payload */
        return bits_f32(sign | 0x7F800000u | ((mag & 0x3FFu) << 13));
    float v = minifloat_decode(mag, 10, 15);
    return sign ? -v : v;
}
