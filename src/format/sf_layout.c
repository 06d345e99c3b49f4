/* sf_layout.c - block-scale layouts: row-major (checkpoints) <-> the "128x4"
 * swizzled layout of CUTLASS's SM100/SM120 block-scaled MMA
 * (cute::Sm1xxBlockScaledConfig, include/cutlass/detail/sm100_blockscaled_layout.hpp).
 *
 * CUTLASS's K-major scale atom is
 *     Layout<Shape<Shape<_32,_4>, Shape<SFVecSize,_4>>, Stride<Stride<_16,_4>, Stride<_0,_1>>>
 * i.e. 128 rows x 4 scale columns = 512 bytes, where row r = r0 + 32*r1 lives at
 * r0*16 + r1*4 and scale column c adds c.  tile_to_shape(..., Step<_2,_1,_3>)
 * repeats the atom along K first, so the atoms of one 128-row band are
 * contiguous.  Byte offset of scale (r, c), sf_cols padded to Kp = ceil4(sf_cols):
 *
 *     (r / 128) * (Kp / 4) * 512      band of 128 rows
 *   + (c / 4) * 512                   atom along K
 *   + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4)
 *
 * This is also what TensorRT-LLM / FlashInfer / vLLM compute on the host when
 * they "interleave" NVFP4 block scales for the CUTLASS FP4 GEMMs.
 */
#include "fm_internal.h"

#include <string.h>

enum {
    FM_SF_ATOM_ROWS = 128, /* rows per atom: 4 groups of 32 (one per warp quadrant) */
    FM_SF_ATOM_COLS = 4,   /* scale columns per atom: 4 x 16 = 64 K-elements for NVFP4 */
    FM_SF_ATOM_BYTES = FM_SF_ATOM_ROWS * FM_SF_ATOM_COLS,
};
_Static_assert(FM_SF_ATOM_BYTES == 512, "a 128x4 scale atom is 512 bytes");

static int64_t ceil_to(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Byte offset of scale (r, c) in the swizzled buffer (kp = padded sf_cols). */
static size_t sf_offset(int64_t r, int64_t c, int64_t kp)
{
    int64_t band = r / FM_SF_ATOM_ROWS, atom = c / FM_SF_ATOM_COLS;
    int64_t inner = (r % 32) * 16 + ((r % FM_SF_ATOM_ROWS) / 32) * 4 + (c % FM_SF_ATOM_COLS);
    return (size_t)((band * (kp / FM_SF_ATOM_COLS) + atom) * FM_SF_ATOM_BYTES + inner);
}

/* Largest shape we accept: keeps every offset well inside size_t and int64_t. */
#define FM_SF_MAX_DIM ((int64_t)1 << 31)

size_t fm_sf_swizzled_bytes(int64_t rows, int64_t sf_cols)
{
    if (rows <= 0 || sf_cols <= 0 || rows > FM_SF_MAX_DIM || sf_cols > FM_SF_MAX_DIM) return 0;
    return (size_t)ceil_to(rows, FM_SF_ATOM_ROWS) * (size_t)ceil_to(sf_cols, FM_SF_ATOM_COLS);
}

static fm_status check_args(const char *who, const void *in, int64_t rows, int64_t sf_cols, const void *out)
{
    if (!in || !out) return fm_fail(FM_ERR_INVALID_ARG, "%s: NULL %s", who, in ? "output" : "input");
    if (fm_sf_swizzled_bytes(rows, sf_cols) == 0)
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: rows=%lld sf_cols=%lld must be in [1, 2^31]", who, (long long)rows,
                       (long long)sf_cols);
    return FM_OK;
}

fm_status fm_sf_swizzle(const uint8_t *row_major, int64_t rows, int64_t sf_cols, uint8_t *swizzled)
{
    fm_clear_error();
    FM_CHECK(check_args("fm_sf_swizzle", row_major, rows, sf_cols, swizzled));
    const int64_t kp = ceil_to(sf_cols, FM_SF_ATOM_COLS);
    /* Padding (rows beyond `rows`, columns beyond `sf_cols`) must read as scale 0
     * so a kernel that touches it multiplies by zero. */
    memset(swizzled, 0, fm_sf_swizzled_bytes(rows, sf_cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < sf_cols; c++) swizzled[sf_offset(r, c, kp)] = row_major[r * sf_cols + c];
    return FM_OK;
}

fm_status fm_sf_unswizzle(const uint8_t *swizzled, int64_t rows, int64_t sf_cols, uint8_t *row_major)
{
    fm_clear_error();
    FM_CHECK(check_args("fm_sf_unswizzle", swizzled, rows, sf_cols, row_major));
    const int64_t kp = ceil_to(sf_cols, FM_SF_ATOM_COLS);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < sf_cols; c++) row_major[r * sf_cols + c] = swizzled[sf_offset(r, c, kp)];
    return FM_OK;
}
