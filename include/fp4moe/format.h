/* fp4moe/format.h - 4-bit block-scaled formats (NVFP4, MXFP4), scalar codecs,
 * quantization and scale-factor layouts.
 *
 * Conventions (see docs/formats.md):
 *  - A quantized matrix is [rows][cols] quantized along cols (K): for weights
 *    rows = N (output features), cols = K (input features), as checkpoints store them.
 *  - FP4 data: two E2M1 codes per byte, the LOW nibble holds the even column
 *    (ModelOpt convention). Row stride = cols / 2 bytes.
 *  - Scales: one per `block` consecutive elements of a row, row-major
 *    [rows][cols / block] (checkpoint layout) unless a function says "swizzled".
 *  - NVFP4: E4M3 block scale per 16, FP32 global scale (weight_scale_2):
 *      x ~= e2m1 * e4m3_scale * global_scale.
 *  - MXFP4: UE8M0 block scale per 32, no global scale (global_scale == 1).
 */
#ifndef FP4MOE_FORMAT_H
#define FP4MOE_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FM_FORMAT_BF16 = 0, /* unquantized BF16 weights (the baseline) */
    FM_FORMAT_NVFP4 = 1,
    FM_FORMAT_MXFP4 = 2,
    FM_FORMAT_COUNT
} fm_format;

typedef enum {
    FM_SCALE_NONE = 0,
    FM_SCALE_E4M3 = 1,  /* float8_e4m3fn */
    FM_SCALE_UE8M0 = 2, /* float8_e8m0fnu: 2^(code-127), 0xFF = NaN */
} fm_scale_type;

/* One row per format (ggml-style trait table). */
typedef struct {
    const char   *name;       /* "bf16", "nvfp4", "mxfp4" */
    int           elem_bits;  /* bits per stored element: 16 or 4 */
    fm_scale_type scale_type; /* block scale type */
    int           block;      /* elements per block scale along K; 0 = none */
    int           has_global; /* 1 = FP32 per-tensor global scale */
} fm_format_traits;

/* Traits of `f`, or NULL when f is not a valid fm_format. */
const fm_format_traits *fm_format_traits_get(fm_format f);

/* Parse "bf16" / "nvfp4" / "mxfp4" (case-insensitive).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL argument) or FM_ERR_FORMAT (unknown name). */
fm_status fm_format_parse(const char *name, fm_format *out);

/* Bytes of element data per row of `cols` elements (cols*2 for BF16, cols/2 for FP4).
 * 0 if cols is not a multiple of the format's block (or of 2 for FP4). */
size_t fm_format_row_bytes(fm_format f, int64_t cols);
/* Scale bytes per row (cols / block), 0 for BF16 or a bad cols. */
size_t fm_format_row_scale_bytes(fm_format f, int64_t cols);

/* ---- scalar codecs: round-to-nearest-even (integer arithmetic on the float32
 * bits, independent of the FPU rounding mode); exact decoding of every code.
 * Oracle: ml_dtypes (tests/py/codec_oracle.py); policies in docs/formats.md.
 * E2M1: values ±{0,0.5,1,1.5,2,3,4,6}; |x| > 6 (and ±Inf) saturates to ±6; ties
 *       to even (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4); NaN -> 0x0 (+0: the
 *       format has no NaN; ml_dtypes float4_e2m1fn gives -0 for +NaN, we don't
 *       copy that artefact); fm_quantize rejects non-finite input first.
 * E4M3 (float8_e4m3fn): finite-only, max 448; |x| > 448 (and ±Inf) saturates
 *       to ±448 (ml_dtypes gives NaN above 464); NaN -> 0x7F, or 0xFF when its
 *       sign bit is set (as ml_dtypes). Decoding 0x7F/0xFF gives NaN.
 * UE8M0 (float8_e8m0fnu, 2^(code-127)): a positive finite x gives the code of
 *       the nearest power of two; a tie (1.5 * 2^e) rounds UP, as ml_dtypes
 *       0.7; x <= 2^-127 -> 0x00 (also float32 subnormals below 1.5 * 2^-127);
 *       x >= 1.5 * 2^127, x <= 0 (and -0), Inf and NaN -> 0xFF (the NaN code).
 *       The full rule: docs/formats.md.
 * BF16, FP16: IEEE RNE; overflow -> Inf; NaN stays NaN (quiet). */
uint8_t  fm_e2m1_encode(float x);
float    fm_e2m1_decode(uint8_t code); /* low 4 bits used */
uint8_t  fm_e4m3_encode(float x);
float    fm_e4m3_decode(uint8_t code);
uint8_t  fm_ue8m0_encode(float x);
float    fm_ue8m0_decode(uint8_t code);
uint16_t fm_bf16_encode(float x);
float    fm_bf16_decode(uint16_t code);
uint16_t fm_fp16_encode(float x);
float    fm_fp16_decode(uint16_t code);

/* ---- quantized tensors ---------------------------------------------------- */

/* A view of one quantized matrix; it does not own its buffers. */
typedef struct {
    fm_format fmt;
    int64_t   rows;         /* N */
    int64_t   cols;         /* K, a multiple of the format's block */
    void     *data;         /* BF16: uint16_t[rows][cols]; FP4: uint8_t[rows][cols/2] */
    uint8_t  *scales;       /* [rows][cols/block] row-major; NULL for BF16 */
    float     global_scale; /* NVFP4: weight_scale_2; 1.0f otherwise (fm_quantize sets it) */
} fm_qtensor;

/* Bytes needed for data and scales of a rows x cols matrix in format f
 * (scale bytes 0 for BF16). Either output pointer may be NULL; outputs are
 * written only on FM_OK.
 * Returns FM_OK, FM_ERR_FORMAT, FM_ERR_BAD_SHAPE (rows/cols <= 0, cols not a
 * multiple of block, a size that overflows size_t, or rows x cols elements beyond
 * int64; fm_quantize and fm_dequantize refuse the same shapes). */
fm_status fm_qtensor_bytes(fm_format f, int64_t rows, int64_t cols, size_t *data_bytes, size_t *scale_bytes);

/* Quantize src[rows][cols] (FP32) into dst, whose fmt/rows/cols/data/scales the
 * caller has set (buffers sized by fm_qtensor_bytes).
 *  NVFP4 (ModelOpt): global = amax / (6*448) (or *global_scale_in if not NULL;
 *    amax == 0 gives global = 1), block scale = E4M3(amax_block / (6*global)),
 *    element = E2M1(x / (decoded_block_scale * global)) (0 when the block scale is 0);
 *    all float32, in this order. A derived global below FLT_MIN is raised to FLT_MIN.
 *    *global_scale_in must be a normal positive float with 6 * 448 * global finite, i.e.
 *    in [FLT_MIN, FLT_MAX/2688 ~ 1.27e35] (above, the largest block could decode to Inf;
 *    above FLT_MAX/6 every block scale would be 0): FM_ERR_INVALID_ARG otherwise.
 *  MXFP4 (OCP MX v1.0): scale = 2^(floor(log2(amax_block)) - 2) as UE8M0 (2^-127 for
 *    an all-zero block; exponent clamped to [-127, 127]), element = E2M1(x / scale).
 *  BF16: element = bf16(x). global_scale_in is ignored except for NVFP4.
 * dst->global_scale is set (1.0f for BF16 / MXFP4). Everything is validated
 * before the first write: on failure no byte of dst's buffers changes.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL src/dst/data, NULL scales for FP4, bad
 * *global_scale_in), FM_ERR_FORMAT (unknown dst->fmt), FM_ERR_BAD_SHAPE,
 * FM_ERR_NONFINITE (NaN/Inf in src, or a finite value that overflows BF16). */
fm_status fm_quantize(const float *src, const float *global_scale_in, fm_qtensor *dst);

/* Dequantize src into dst[rows][cols] FP32: (e2m1 * block_scale) * global.
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL src/dst/data, NULL scales for FP4),
 * FM_ERR_FORMAT, FM_ERR_BAD_SHAPE, FM_ERR_NONFINITE (a scale code that decodes
 * to NaN: E4M3 0x7F/0xFF, UE8M0 0xFF; a non-finite NVFP4 global scale; or an
 * element that decodes to +-Inf, e.g. an NVFP4 global scale of FLT_MAX, or an
 * MXFP4 scale of 2^127 over a 2.0: the message names the element); nothing is
 * written on failure. A tensor fm_quantize produced never overflows. */
fm_status fm_dequantize(const fm_qtensor *src, float *dst);

/* ---- scale-factor layouts -------------------------------------------------
 * The "128x4" swizzled layout of CUTLASS's block-scaled kernels (SM100/SM120,
 * cutlass::detail::Sm1xxBlockScaledConfig, K-major SfKMajorAtom): the scale
 * matrix [rows][sf_cols] is padded to Rp = ceil(rows/128)*128 rows and
 * Kp = ceil(sf_cols/4)*4 columns and cut into 128x4 atoms of 512 bytes; the
 * atoms of one 128-row band are consecutive along K.  Scale (r, c) sits at
 *     ((r / 128) * (Kp / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4
 * (the same as vLLM/SGLang's host "interleave":
 *  reshape(Rp/128, 4, 32, Kp/4, 4).permute(0, 3, 2, 1, 4)).
 * Padding bytes are written as 0. */

/* Rp * Kp bytes; 0 when rows or sf_cols is outside [1, 2^31]. */
size_t    fm_sf_swizzled_bytes(int64_t rows, int64_t sf_cols);
/* Row-major [rows][sf_cols] -> swizzled (fm_sf_swizzled_bytes bytes, padding 0);
 * fm_sf_unswizzle is the inverse (reads only the non-padding bytes).
 * Return FM_OK, FM_ERR_INVALID_ARG (NULL buffer), FM_ERR_BAD_SHAPE (rows or
 * sf_cols outside [1, 2^31]); nothing is written on failure. */
fm_status fm_sf_swizzle(const uint8_t *row_major, int64_t rows, int64_t sf_cols, uint8_t *swizzled);
fm_status fm_sf_unswizzle(const uint8_t *swizzled, int64_t rows, int64_t sf_cols, uint8_t *row_major);

#ifdef __cplusplus
}
#endif
#endif
