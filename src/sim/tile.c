/* tile.c - the tile height the simulator pads rows to.
 *
 * The waste the simulator reports is the waste of the tile a server would really
 * launch, so the tile comes from the shared-memory planner's ranking (the tiles
 * that fit the GPU's shared memory, ranked by estimated cost for the rows per
 * expert), asked for FC1's shape with the weights' format.  An explicit --tile-m
 * overrides the planner.
 *
 * --kernel cutlass: fm_plan_candidates (the CUTLASS catalogue of the GPU's
 * architecture: SM90, SM100 1-SM/2-SM, SM120).  Where the architecture has no
 * FP4 MMA (sm_90) its catalogue rejects FP4 operands, so the BF16 ranking is
 * used: the dequantize-to-BF16 path this simulator's roofline assumes there.
 * Where the planner has no CUTLASS family at all (sm_80, sm_86/89) the field's
 * 128-row tile is assumed and the result says so.
 *
 * --kernel fp4moe: fp4moe's own swap-AB kernel (tokens are the MMA's N operand,
 * 8 per fragment, nt fragments a pass), ranked by the planner's fp4moe-mma
 * family (fm_plan_candidates_in): its compiled tiles that fit the architecture's
 * opt-in shared memory, the least padded of the fastest estimates first - 8, 16,
 * 32, else 64 rows a pass, as the launcher picks and as bench/RESULTS.md's
 * fastest tiles are.  More rows than a pass loop over passes.  For weights the
 * family does not take (BF16) the same rule is applied to the compiled tile list
 * directly (smallest pass that holds the rows, else the widest).
 * The planner's other fp4moe family, fp4moe-wgmma (sm_90 only, passes of up to 256
 * tokens), is deliberately not asked here: --kernel fp4moe is the swap-AB mma.sync
 * kernel on every architecture, its 8..64-row passes are what the simulator's
 * results and tests (test_sim_errors.c on the H200) describe, --calibrated-h200
 * was fitted to that kernel's measured points, and bench/RESULTS.md has none of
 * the wgmma kernel yet.
 */
#include <math.h>

#include "fm_internal.h"
#include "kernels/fm_kernels_smem.h"
#include "sim_internal.h"

#define FM_SIM_TILE_CANDS 32

static int mma_rows(const fm_sim_ctx *x, int64_t rows, int *tile_n, int *tile_k, int *from_planner)
{
    const fm_arch_info *arch = NULL;
    size_t limit = 101376; /* the smallest opt-in limit of the table when the arch is unknown */
    if (fm_arch_get(x->cfg.gpu.cc, &arch) == FM_OK && arch) limit = arch->smem_block_optin;
    fm_clear_error();
    size_t n = 0;
    const fm_tile *t = fm_mma_tiles(&n);
    int best = -1, widest = -1;
    for (size_t i = 0; i < n; i++) {
        fm_smem_breakdown bd;
        if (fm_smem_mma(&t[i], &bd) != FM_OK || bd.total > limit) continue;
        if (widest < 0 || t[i].nt > t[widest].nt) widest = (int)i;
        if (8 * t[i].nt >= rows && (best < 0 || t[i].nt < t[best].nt)) best = (int)i;
    }
    if (best < 0) best = widest; /* more rows than one pass: loop over passes of the widest */
    if (best < 0) return FM_SIM_DEFAULT_TILE_M;
    *tile_n = t[best].warps * t[best].mt * 16;
    *tile_k = t[best].kc;
    *from_planner = 1;
    return 8 * t[best].nt;
}

int fm_sim_pick_tile(const fm_sim_ctx *x, double rows_per_active, int *tile_n, int *tile_k, int *from_planner)
{
    *tile_n = 0;
    *tile_k = 0;
    *from_planner = 0;
    if (x->cfg.tile_m > 0) return x->cfg.tile_m;
    int64_t rows = (int64_t)ceil(rows_per_active);
    if (rows < 1) rows = 1;
    fm_elem ab = x->cfg.model.wfmt == FM_FORMAT_NVFP4   ? FM_ELEM_NVFP4
                 : x->cfg.model.wfmt == FM_FORMAT_MXFP4 ? FM_ELEM_MXFP4
                                                         : FM_ELEM_BF16;
    fm_plan_candidate cand[FM_SIM_TILE_CANDS];
    if (x->cfg.kernel == FM_SIM_KERNEL_FP4MOE) {
        size_t n = 0;
        fm_status st = ab == FM_ELEM_BF16
                           ? FM_ERR_UNSUPPORTED
                           : fm_plan_candidates_in(FM_FAMILY_BIT(FM_FAMILY_FP4MOE_MMA), &x->cfg.gpu, ab,
                                                   FM_EPI_NOSMEM, 0, rows, x->shape.n[0], x->shape.k[0],
                                                   x->shape.local_experts, cand, FM_SIM_TILE_CANDS, &n, NULL);
        if (st == FM_OK && n > 0 && cand[0].res.fits) {
            *tile_n = cand[0].cfg.tile_n;
            *tile_k = cand[0].cfg.tile_k;
            *from_planner = 1;
            return cand[0].cfg.tile_m;
        }
        fm_clear_error();
        return mma_rows(x, rows, tile_n, tile_k, from_planner);
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        fm_elem e = attempt ? FM_ELEM_BF16 : ab;
        if (attempt && ab == FM_ELEM_BF16) break;
        size_t n = 0;
        fm_status st = fm_plan_candidates(&x->cfg.gpu, e, FM_EPI_TMA, 0, rows, x->shape.n[0], x->shape.k[0],
                                          x->shape.local_experts, cand, FM_SIM_TILE_CANDS, &n, NULL);
        if (st == FM_OK && n > 0 && cand[0].res.fits) {
            *tile_n = cand[0].cfg.tile_n;
            *tile_k = cand[0].cfg.tile_k;
            *from_planner = 1;
            return cand[0].cfg.tile_m;
        }
    }
    fm_clear_error(); /* no planner family for this GPU: not an error of the caller's */
    return FM_SIM_DEFAULT_TILE_M;
}
