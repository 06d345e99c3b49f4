/* gemm_mma_row.cuh - the mma.sync kernels of one catalogue row, FM_UNIT_ROW of
 * src/kernels/fm_tiles.def's FM_MMA_TILE rows: the plain kernel, the multi-block one
 * where the row has it, and the work-list one. Included by the generated unit
 * build/kernels/mma_row_NN.cu (src/kernels/fm_units_gen.c), which is compiled for the
 * targets whose opt-in shared memory the row fits; exported as fm_mma_unit_NN. The
 * gpt-oss twins: mma_row_NN_oss.cu (FM_UNIT_OSS); the 8-band rows' work-list kernels:
 * mma_row_NN{,_oss}_list.cu (FM_UNIT_LIST; units.h says why). */
#include "cuda/gemm_mma.cuh"
#include "cuda/units.h"

#ifndef FM_UNIT_ROW
#error "FM_UNIT_ROW: the catalogue row this unit instantiates"
#endif

namespace {
struct mma_row {
    int w, mt, nt, kc, st, mb;
};
constexpr mma_row k_rows[] = {
#define FM_MMA_TILE(w, mt, nt, kc, st, mb) {w, mt, nt, kc, st, mb},
#include "kernels/fm_tiles.def"
#undef FM_MMA_TILE
};
constexpr mma_row R = k_rows[FM_UNIT_ROW];
/* the row's fields in the template's ranges, its shared memory within the largest
 * opt-in limit, the launch-bounds hint at least one block */
static_assert(FM_MMA_TILE_OK(R.w, R.mt, R.nt, R.kc, R.st) &&
                  FM_MMA_SMEM(R.w, R.mt, R.nt, R.kc, R.st) <= FM_SMEM_OPTIN_MAX &&
                  FM_MMA_MIN_BLOCKS(R.w, R.mt, R.nt, R.kc, R.st) >= 1,
              "fm_tiles.def: bad mma row");

/* the multi-block kernel only where the row has it (a discarded branch is never instantiated) */
template <bool MB, bool OSS> const void *mb_kernel()
{
    if constexpr (MB && OSS) return (const void *)mma_oss_kernel<R.w, R.mt, R.nt, R.kc, R.st, true>;
    else if constexpr (MB) return (const void *)mma_kernel<R.w, R.mt, R.nt, R.kc, R.st, true>;
    else return nullptr;
}

#if defined(FM_PROBE_TIMELINE) && !defined(FM_UNIT_OSS) && !defined(FM_UNIT_LIST)
/* the plain kernels' unit holds the probe (a work-list kernel in a unit of its own records no
 * timeline: its unit's fm_probe_tl stays NULL) */
int probe_timeline(void *buf, unsigned cap)
{
    unsigned    zero = 0;
    cudaError_t err = cudaMemcpyToSymbol(fm_probe_tl, &buf, sizeof buf);
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(fm_probe_tl_cap, &cap, sizeof cap);
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(fm_probe_tl_seq, &zero, sizeof zero);
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(fm_probe_tl_done, &zero, sizeof zero);
    return (int)err;
}
#define FM_UNIT_PROBE probe_timeline
#else
#define FM_UNIT_PROBE NULL
#endif
} // namespace

#define FM_UNIT_CAT_(a, b) a##b
#define FM_UNIT_CAT(a, b) FM_UNIT_CAT_(a, b)
/* the row's work-list kernel (plain or twin): here, or in a unit of its own
 * (FM_UNIT_LIST: only it; FM_UNIT_LIST_APART: the unit that leaves it to that one) */
#ifdef FM_UNIT_OSS
#define FM_UNIT_LIST_NAME FM_UNIT_CAT(fm_mma_oss_list_, FM_UNIT_ROW)
#define FM_UNIT_LIST_KERNEL mma_oss_list_kernel<R.w, R.mt, R.nt, R.kc, R.st>
#else
#define FM_UNIT_LIST_NAME FM_UNIT_CAT(fm_mma_list_, FM_UNIT_ROW)
#define FM_UNIT_LIST_KERNEL mma_list_kernel<R.w, R.mt, R.nt, R.kc, R.st>
#endif
#if defined(FM_UNIT_LIST_APART)
extern "C" const void *const FM_UNIT_LIST_NAME;
#else
extern "C" const void *const FM_UNIT_LIST_NAME = (const void *)FM_UNIT_LIST_KERNEL;
#endif

#if defined(FM_UNIT_LIST)
/* nothing else: the row's other kernels are in its other unit */
#elif defined(FM_UNIT_OSS) /* the row's gpt-oss twins, a unit of their own (units.h) */
extern "C" const fm_mma_twins FM_UNIT_CAT(fm_mma_twins_, FM_UNIT_ROW) = {
    (const void *)mma_oss_kernel<R.w, R.mt, R.nt, R.kc, R.st, false>, mb_kernel<R.mb != 0, true>(), &FM_UNIT_LIST_NAME};
#else
extern "C" const fm_mma_twins FM_UNIT_CAT(fm_mma_twins_, FM_UNIT_ROW);
extern "C" const fm_mma_unit  FM_UNIT_CAT(fm_mma_unit_, FM_UNIT_ROW) = {
    R.w,
    R.mt,
    R.nt,
    R.kc,
    R.st,
    (const void *)mma_kernel<R.w, R.mt, R.nt, R.kc, R.st, false>,
    mb_kernel<R.mb != 0, false>(),
    &FM_UNIT_LIST_NAME,
    FM_UNIT_PROBE,
    &FM_UNIT_CAT(fm_mma_twins_, FM_UNIT_ROW)};
#endif
