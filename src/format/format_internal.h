/* format_internal.h - format helpers the rest of the library shares (not
 * installed).
 *
 * Why here: a block-scale byte that decodes to NaN (E4M3 0x7F/0xFF, UE8M0
 * 0xFF) poisons a whole block, and every consumer of scales from outside
 * (fm_dequantize, the backends' weight check, the checkpoint loader, the CUDA
 * prepack) must refuse it before using the tensor. One scan, one definition
 * of "NaN code", one message shape; callers prefix their own context.
 */
#ifndef FM_FORMAT_INTERNAL_H
#define FM_FORMAT_INTERNAL_H

#include "fm_internal.h"

/* Is scale byte c of type st a NaN code? (FM_SCALE_NONE: never.) */
static inline int fm_scale_code_is_nan(fm_scale_type st, uint8_t c)
{
    return st == FM_SCALE_E4M3 ? (c & 0x7F) == 0x7F : st == FM_SCALE_UE8M0 && c == 0xFF;
}

/* Scales s[rows][cols] (row-major, cols = scales per row): FM_OK, or
 * FM_ERR_NONFINITE with the detail
 *     "<who>: block scale [r][c] = 0xXX decodes to NaN"
 * for the first NaN code (who may be NULL: the message then starts at
 * "block scale"). Nothing to check (FM_OK) for FM_SCALE_NONE or rows/cols <= 0. */
fm_status fm_scales_check_codes(const char *who, fm_scale_type st, const uint8_t *s, int64_t rows, int64_t cols);

/* Every element of the FP4 tensor t decodes, computed as fm_dequantize does
 * ((e2m1 x block scale) x global scale, float32), to a finite float: FM_OK, or
 * FM_ERR_NONFINITE with the detail
 *     "<who>: element [r][c] = (6 x block scale 448) x global scale 3e+38 overflows FP32"
 * for the first element that overflows (who may be NULL). Blocks whose scale
 * is a NaN code are skipped: fm_scales_check_codes reports those. BF16: FM_OK.
 * Cheap when nothing can overflow: one pass over the scale bytes; the data is
 * read only in blocks where 6 x scale x global overflows. The caller has
 * validated t (format, shape, buffers). */
fm_status fm_qtensor_check_finite(const char *who, const fm_qtensor *t);

/* The re-encoding a kernel that applies ONE global per matrix needs of a w13 whose gate
 * rows [0, inter) have global g_gate = w13->global_scale and up rows [inter, 2*inter) global
 * g_up (NVFP4): the half with the smaller global is re-expressed against the larger one g,
 * each of its E4M3 block-scale codes c becoming E4M3(decode(c) * (g_half / g)), rounded to
 * nearest even (fm_e4m3_encode): lossy, within 2^-4 relative per normal block scale (coarser
 * where the product falls among E4M3's subnormals); the other half's codes are copied. What
 * fp4moe's checkpoint loader did until the layer took both globals (fm_moe_weights.
 * w13_up_global), and the cuda backend until its epilogue took both (2026-12-06); kept as the
 * contrast of tests/test_layer_gate_up.c and tests/gpu/test_cuda_gate_up.c. scales_out holds
 * 2 * inter * cols / 16 bytes (it may be w13->scales); *out = w13 with scales_out and
 * global g. w13 is NVFP4 (checked by the caller); inter = w13->rows / 2. */
void fm_w13_one_global(const fm_qtensor *w13, float g_up, uint8_t *scales_out, fm_qtensor *out);

#endif
