/* smem_fp4moe.c - fp4moe's own CUDA kernels as a planner family.
 *
 * The bytes are never modelled twice: the planner calls fm_smem_swapab
 * (src/plan/fm_kernels_smem.c), the same function the launcher
 * (src/cuda/gemm_launch.c) sizes its dynamic shared memory with and refuses a tile
 * by, so a plan and a launch cannot disagree.  This file only maps the planner's
 * generic tile onto the swap-AB tile and says what the verdict means:
 *
 *   planner field   swap-AB meaning
 *   tile_m          tokens per pass = 8 * nt (an expert's rows, the MMA's N operand)
 *   tile_n          output features per CTA = warps * mt * 16 (weights, the MMA's M)
 *   tile_k          kc, K per pipeline stage
 *   warps           warps per CTA (0 = 4, what every compiled tile uses today)
 *   stages          X staging stages; 0 = the compiled instantiation's count
 *
 * The launcher runs only compiled instantiations (fm_swapab_tiles), so the check
 * answers FM_ERR_UNSUPPORTED for any other: everything it accepts can launch.
 */
#include <stdio.h>
#include <string.h>

#include "plan/fm_kernels_smem.h"
#include "plan_internal.h"

static fm_swapab_tile to_tile(const fm_kernel_config *c)
{
    int w = c->warps ? c->warps : 4;
    fm_swapab_tile t = {w, c->tile_n / (16 * w), c->tile_m / 8, c->tile_k, c->stages};
    return t;
}

int fm_swapab_compiled(const fm_kernel_config *cfg)
{
    size_t n = 0;
    const fm_swapab_tile *t = fm_swapab_tiles(&n);
    fm_swapab_tile x = to_tile(cfg);
    for (size_t i = 0; i < n; i++)
        if (t[i].warps == x.warps && t[i].mt == x.mt && t[i].nt == x.nt && t[i].kc == x.kc &&
            (x.stages == 0 || t[i].stages == x.stages))
            return (int)i;
    return -1;
}

static void list_compiled(char *buf, size_t cap)
{
    size_t n = 0, used = 0;
    const fm_swapab_tile *t = fm_swapab_tiles(&n);
    buf[0] = 0;
    for (size_t i = 0; i < n && used + 1 < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%dx%dx%d/w%d/s%d", i ? " " : "", 8 * t[i].nt,
                         t[i].warps * t[i].mt * 16, t[i].kc, t[i].warps, t[i].stages);
        if (w < 0) break;
        used += (size_t)w;
    }
}

fm_status fm_resolve_fp4moe_swapab(fm_kernel_config *c)
{
    const fm_arch_info *arch = NULL;
    FM_CHECK(fm_arch_get(c->cc, &arch));
    if (!(arch->features & FM_FEAT_MMA_BF16))
        return fm_fail(FM_ERR_ARCH_MISMATCH, "fp4moe-swapab needs BF16 mma.sync and cp.async (sm_80+), not %s",
                       arch->name);
    if (c->a != FM_ELEM_NVFP4 && c->a != FM_ELEM_MXFP4)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "fp4moe-swapab takes nvfp4 or mxfp4 weights (--a), not %s",
                       fm_elem_name(c->a));
    if (c->b != c->a && c->b != FM_ELEM_BF16)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "fp4moe-swapab stages BF16 activations: --b must be %s or bf16, not %s",
                       fm_elem_name(c->a), fm_elem_name(c->b));
    if (c->cluster_m * c->cluster_n != 1)
        return fm_fail(FM_ERR_BAD_SHAPE, "fp4moe-swapab runs without clusters (1x1), not %dx%d", c->cluster_m,
                       c->cluster_n);
    if (c->warps < 0 || c->warps > 8)
        return fm_fail(FM_ERR_BAD_SHAPE, "fp4moe-swapab: warps=%d outside 1..8", c->warps);
    int w = c->warps ? c->warps : 4;
    if (c->tile_m <= 0 || c->tile_m % 8 || c->tile_n <= 0 || c->tile_n % (16 * w) || c->tile_k <= 0)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fp4moe-swapab tile %dx%dx%d: M is tokens per pass (8, 16, 32 or 64), N = warps(%d) x mt x 16 "
                       "features, K a multiple of 64",
                       c->tile_m, c->tile_n, c->tile_k, w);
    int nt = c->tile_m / 8, mt = c->tile_n / (16 * w);
    if ((nt & (nt - 1)) || nt > 8 || (mt & (mt - 1)) || mt > 4 || c->tile_k % 64 || c->tile_k > 1024)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fp4moe-swapab tile %dx%dx%d: M (tokens a pass) must be 8, 16, 32 or 64, N = %d warps x 16 x "
                       "(1, 2 or 4), K a multiple of 64 up to 1024",
                       c->tile_m, c->tile_n, c->tile_k, w);
    if (c->stages) {
        fm_swapab_tile t = to_tile(c);
        fm_smem_breakdown bd;
        FM_CHECK(fm_smem_swapab(&t, &bd)); /* FM_ERR_BAD_SHAPE with the ranges (stages 1..8) */
    }
    c->warps = w;
    if (c->stages == 0) {
        int i = fm_swapab_compiled(c);
        if (i < 0) {
            char list[400];
            list_compiled(list, sizeof list);
            return fm_fail(FM_ERR_UNSUPPORTED,
                           "fp4moe-swapab %dx%dx%d with %d warps is not compiled in, so it has no stage count (give "
                           "--stages to size it anyway); compiled MxNxK/warps/stages: %s",
                           c->tile_m, c->tile_n, c->tile_k, w, list);
        }
        c->stages = fm_swapab_tiles(NULL)[i].stages;
    }
    return FM_OK;
}

fm_status fm_model_fp4moe_swapab(const fm_kernel_config *cfg, fm_model_out *o)
{
    fm_swapab_tile t = to_tile(cfg);
    FM_CHECK(fm_smem_swapab(&t, &o->bd)); /* the launcher's own function */
    int i = fm_swapab_compiled(cfg);
    o->auto_stages = i < 0 ? 0 : fm_swapab_tiles(NULL)[i].stages;
    o->stage_bytes = o->bd.total / (size_t)t.stages;
    o->capacity = 0;
    o->carveout = 0;
    o->min_stages = 1;
    return FM_OK;
}

void fm_check_fp4moe_swapab(const fm_kernel_config *r, const fm_model_out *m, size_t limit, fm_plan_result *res)
{
    const fm_smem_breakdown *b = &m->bd;
    fm_swapab_tile t = to_tile(r);
    char name[64];
    fm_swapab_tile_name(&t, name, sizeof name);
    res->auto_stages = m->auto_stages;
    res->builder_bytes = b->total; /* no builder: the launcher computes exactly these bytes */
    res->builder_fits = res->fits;
    res->best_stages = res->fits ? b->stages : 0;
    res->best_bytes = res->fits ? b->total : 0;
    if (res->fits) {
        snprintf(res->reason, sizeof res->reason,
                 "fits: %s needs %zu B = %d stages x (FP4 weights %zu + scales %zu + BF16 X %zu + row padding %zu; "
                 "the epilogue uses none) <= %zu B opt-in (%zu B spare)",
                 name, b->total, b->stages, b->a / (size_t)b->stages, b->sf / (size_t)b->stages,
                 b->b / (size_t)b->stages, b->padding / (size_t)b->stages, limit, limit - b->total);
        return;
    }
    /* the fix: the widest compiled tile with the same tokens per pass that fits */
    size_t n = 0;
    const fm_swapab_tile *c = fm_swapab_tiles(&n);
    int best = -1;
    size_t best_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        fm_smem_breakdown x;
        if (c[i].nt != t.nt || fm_smem_swapab(&c[i], &x) != FM_OK || x.total > limit) continue;
        if (best < 0 || c[i].warps * c[i].mt > c[best].warps * c[best].mt) best = (int)i, best_bytes = x.total;
    }
    fm_clear_error();
    char fix[128];
    if (best >= 0) {
        char bn[64];
        snprintf(fix, sizeof fix, "use %s (%dx%dx%d): %zu B", fm_swapab_tile_name(&c[best], bn, sizeof bn),
                 8 * c[best].nt, c[best].warps * c[best].mt * 16, c[best].kc, best_bytes);
    } else snprintf(fix, sizeof fix, "no compiled tile with %d tokens a pass fits", 8 * t.nt);
    snprintf(res->reason, sizeof res->reason,
             "needs %zu B with %d stages > %zu B opt-in (%zu B over): the launcher refuses %s with "
             "FM_ERR_SMEM_EXCEEDED; %s",
             b->total, b->stages, limit, b->total - limit, name, fix);
}
