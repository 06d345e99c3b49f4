/* plan_family.h - what a planner family file needs and provides (not installed):
 * the CUTLASS models (src/cutlass/cutlass_models.h: the struct-layout helper, the
 * result of one family model, the CUTLASS families' entry points) and fp4moe's own
 * family (smem_fp4moe.c). The dispatcher (smem_model.c: the family table) and the
 * planner's other files include plan_internal.h, which includes this one: no include
 * circle between them.
 */
#ifndef FM_PLAN_FAMILY_H
#define FM_PLAN_FAMILY_H

#include "cutlass/cutlass_models.h"
#include "kernels/fm_kernels_smem.h"

/* fp4moe's own kernels (smem_fp4moe.c): FM_FAMILY_FP4MOE_MMA (mma.sync, sm_80+) and
 * FM_FAMILY_FP4MOE_WGMMA (sm_90a).  Bytes from fm_smem_mma / fm_smem_wgmma (the
 * launcher's functions); auto_stages = the compiled instantiation's stage count. */
static inline int fm_family_is_fp4moe(fm_kernel_family f)
{
    return f == FM_FAMILY_FP4MOE_MMA || f == FM_FAMILY_FP4MOE_WGMMA;
}
fm_status fm_model_fp4moe(const fm_kernel_config *cfg, fm_model_out *out);
/* Validate an fp4moe config (arch, operands, shape) and resolve warps = 0 to the
 * family's default and stages = 0 to the compiled tile; FM_ERR_UNSUPPORTED when no
 * compiled tile has that shape. */
fm_status fm_resolve_fp4moe(fm_kernel_config *cfg);
/* The compiled tiles of fp4moe family f (fm_mma_tiles / fm_wgmma_tiles); NULL and
 * *count = 0 for any other family. */
const fm_tile *fm_fp4moe_tiles(fm_kernel_family f, size_t *count);
/* Index of cfg's tile in its family's compiled list (stages 0 = any), -1 if not
 * compiled in. */
int fm_fp4moe_compiled(const fm_kernel_config *cfg);
/* Fill the check's result for an fp4moe config (bytes, verdict, reason with the fix:
 * the widest compiled tile of the family with the same tokens a pass that fits). */
void fm_check_fp4moe(const fm_kernel_config *resolved, const fm_model_out *m, size_t limit, fm_plan_result *res);

#endif
