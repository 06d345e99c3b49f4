/* tile.c - the tile height the simulator pads rows to.
 *
 * The waste the simulator reports is the waste of the tile a server would really
 * launch, so the tile comes from the shared-memory planner's ranking
 * (fm_plan_candidates: the tiles that fit the GPU's shared memory, ranked by
 * estimated cost for the rows per expert), asked for FC1's shape with the
 * weights' format.  Where the GPU has no FP4 MMA (sm_90) the planner rejects
 * FP4 operands, so the BF16 ranking is used: the dequantize-to-BF16 path this
 * simulator's roofline assumes there.  An explicit --tile-m overrides the
 * planner; where the planner has no family for the GPU (sm_80, sm_100) the
 * field's 128-row CUTLASS tile is assumed and the result says so.
 *
 * With kernel = FM_SIM_KERNEL_FP4MOE the rows are padded as fp4moe's own swap-AB
 * kernel pads them: tokens are the MMA's N operand, 8 per fragment, nt fragments
 * per pass; the launcher's policy takes the smallest compiled nt with 8*nt >=
 * the expected rows (8, 16, 32, else 64 rows per pass) among the tiles that
 * fit the architecture's opt-in shared memory (the planner's swapab model).
 */
#include <math.h>

#include "fm_internal.h"
#include "plan/fm_kernels_smem.h"
#include "sim_internal.h"

#define FM_SIM_TILE_CANDS 32

static int swapab_rows(const fm_sim_ctx *x, int64_t rows, int *tile_n, int *tile_k, int *from_planner)
{
    const fm_arch_info *arch = NULL;
    size_t limit = 101376; /* the smallest opt-in limit of the table when the arch is unknown */
    if (fm_arch_get(x->cfg.gpu.cc, &arch) == FM_OK && arch) limit = arch->smem_block_optin;
    fm_clear_error();
    size_t n = 0;
    const fm_swapab_tile *t = fm_swapab_tiles(&n);
    int best = -1, widest = -1;
    for (size_t i = 0; i < n; i++) {
        fm_smem_breakdown bd;
        if (fm_smem_swapab(&t[i], &bd) != FM_OK || bd.total > limit) continue;
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
    if (x->cfg.kernel == FM_SIM_KERNEL_FP4MOE) return swapab_rows(x, rows, tile_n, tile_k, from_planner);
    fm_elem ab = x->cfg.model.wfmt == FM_FORMAT_NVFP4   ? FM_ELEM_NVFP4
                 : x->cfg.model.wfmt == FM_FORMAT_MXFP4 ? FM_ELEM_MXFP4
                                                         : FM_ELEM_BF16;
    fm_plan_candidate cand[FM_SIM_TILE_CANDS];
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
