/* gemm_wgmma_row.cuh - the wgmma kernels of one catalogue row, FM_UNIT_ROW of
 * src/kernels/fm_tiles.def's FM_WGMMA_TILE rows: the warp-specialized kernel (packed X)
 * and, unless the row is the persistent kernel, the single-role one (natural X).
 * Included by the generated unit build/kernels/wgmma_row_NN.cu, compiled for sm_90a
 * alone; exported as fm_wgmma_unit_NN. */
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "a wgmma unit compiled for a target without the sm_90a features: its kernels would have no body"
#endif
#include "cuda/gemm_wgmma.cuh"
#include "cuda/units.h"

#ifndef FM_UNIT_ROW
#error "FM_UNIT_ROW: the catalogue row this unit instantiates"
#endif

namespace {
struct wgmma_row {
    int w, mt, nt, kc, st, persist;
};
constexpr wgmma_row k_rows[] = {
#define FM_WGMMA_TILE(w, mt, nt, kc, st, p) {w, mt, nt, kc, st, p},
#include "kernels/fm_tiles.def"
#undef FM_WGMMA_TILE
};
constexpr wgmma_row R = k_rows[FM_UNIT_ROW];
static_assert(FM_WGMMA_TILE_OK(R.w, R.mt, R.nt, R.kc, R.st, R.persist) &&
                  FM_WGMMA_SMEM(R.w, R.mt, R.nt, R.kc, R.st, R.persist) <= FM_SMEM_OPTIN_MAX,
              "fm_tiles.def: bad wgmma row");

/* the natural-X kernel, except for the persistent row (it reads packed X only); a discarded
 * branch is never instantiated */
template <bool PERSIST, bool OSS> const void *natural_kernel()
{
    if constexpr (PERSIST) return nullptr;
    else if constexpr (OSS) return (const void *)wgmma_oss_kernel<R.w, R.mt, R.nt, R.kc, R.st>;
    else return (const void *)wgmma_kernel<R.w, R.mt, R.nt, R.kc, R.st>;
}
} // namespace

#define FM_UNIT_CAT_(a, b) a##b
#define FM_UNIT_CAT(a, b) FM_UNIT_CAT_(a, b)
#ifdef FM_UNIT_OSS /* the row's gpt-oss twins, a unit of their own (units.h) */
extern "C" const fm_wgmma_twins FM_UNIT_CAT(fm_wgmma_twins_, FM_UNIT_ROW) = {
    (const void *)wgmma_oss_ws_kernel<R.w, R.mt, R.nt, R.kc, R.st, R.persist != 0>,
    natural_kernel<R.persist != 0, true>()};
#else
extern "C" const fm_wgmma_twins FM_UNIT_CAT(fm_wgmma_twins_, FM_UNIT_ROW);
extern "C" const fm_wgmma_unit  FM_UNIT_CAT(fm_wgmma_unit_, FM_UNIT_ROW) = {
    R.w,
    R.mt,
    R.nt,
    R.kc,
    R.st,
    R.persist,
    (const void *)wgmma_ws_kernel<R.w, R.mt, R.nt, R.kc, R.st, R.persist != 0>,
    natural_kernel<R.persist != 0, false>(),
    &FM_UNIT_CAT(fm_wgmma_twins_, FM_UNIT_ROW)};
#endif
