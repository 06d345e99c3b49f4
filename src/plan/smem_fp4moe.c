/* smem_fp4moe.c - fp4moe's own CUDA kernels as planner families.
 *
 * The bytes are never modelled twice: the planner calls fm_smem_mma /
 * fm_smem_wgmma (src/kernels/fm_kernels_smem.c), the same functions the launcher
 * (src/cuda/gemm_launch.c) sizes its dynamic shared memory with and refuses a tile
 * by, so a plan and a launch cannot disagree.  This file only maps the planner's
 * generic tile onto the kernels' tile and says what the verdict means:
 *
 *   planner field   fp4moe meaning (both families)
 *   tile_m          tokens per pass = 8 * nt (an expert's rows, the MMA's N operand)
 *   tile_n          output features per CTA = warps * mt * 16 (weights, the MMA's M)
 *   tile_k          kc, K per pipeline stage
 *   warps           warps per CTA (0 = the family's default)
 *   stages          X staging stages; 0 = the compiled instantiation's count
 *
 *   family          kernel                 needs           warps     mt       nt          kc
 *   fp4moe-mma   gemm_mma.cuh         mma.sync bf16   1..8 (4)  1/2/4    1..8        64..1024
 *                   (sm_80+)
 *   fp4moe-wgmma    gemm_wgmma.cu          wgmma (sm_90a)  4/8 (8)   1/2      1..32       64..256
 *
 * (nt and mt powers of 2, kc a multiple of 64.)  The launchers run only compiled
 * instantiations (fm_mma_tiles, fm_wgmma_tiles), so the check answers
 * FM_ERR_UNSUPPORTED for any other: everything it accepts can launch.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/fm_kernels_smem.h"
#include "plan_family.h"

/* One of fp4moe's own families: its functions in fm_kernels_smem.c and its limits
 * (the ranges those functions accept, so the planner can name the bad field). */
typedef struct {
    fm_kernel_family family;
    const char      *name;          /* fm_family_name() */
    int              default_warps; /* warps = 0 */
    unsigned         warps_mask;    /* bit w: w warps allowed */
    const char      *warps_text;    /* the allowed warps, in words */
    int              max_mt, max_nt, max_kc;
    const fm_tile *(*tiles)(size_t *count);
    fm_status (*smem)(const fm_tile *t, fm_smem_breakdown *out);
    char *(*tile_name)(const fm_tile *t, char *buf, size_t n);
} own_family;

static const own_family k_mma = {FM_FAMILY_FP4MOE_MMA, "fp4moe-mma", 4, 0x1FEu, "1..8", 4, 8, 1024,
                                    fm_mma_tiles, fm_smem_mma, fm_mma_tile_name};
static const own_family k_wgmma = {FM_FAMILY_FP4MOE_WGMMA, "fp4moe-wgmma", 8, (1u << 4) | (1u << 8) | (1u << 12),
                                   "4, 8 or 12 (one to three consumer warpgroups)", 2, 32, 256, fm_wgmma_tiles, fm_smem_wgmma,
                                   fm_wgmma_tile_name};

static const own_family *fam_of(fm_kernel_family f) { return f == FM_FAMILY_FP4MOE_WGMMA ? &k_wgmma : &k_mma; }

static int pow2_upto(int v, int max) { return v >= 1 && v <= max && (v & (v - 1)) == 0; }

static fm_tile to_tile(const fm_kernel_config *c)
{
    const own_family *F = fam_of(c->family);
    int w = c->warps ? c->warps : F->default_warps;
    fm_tile t = {w, c->tile_n / (16 * w), c->tile_m / 8, c->tile_k, c->stages, c->persistent != 0, F->family};
    return t;
}

const fm_tile *fm_fp4moe_tiles(fm_kernel_family f, size_t *count)
{
    if (!fm_family_is_fp4moe(f)) {
        if (count) *count = 0;
        return NULL;
    }
    return fam_of(f)->tiles(count);
}

int fm_fp4moe_compiled(const fm_kernel_config *cfg)
{
    size_t n = 0;
    const fm_tile *t = fam_of(cfg->family)->tiles(&n);
    fm_tile x = to_tile(cfg);
    for (size_t i = 0; i < n; i++)
        if (t[i].warps == x.warps && t[i].mt == x.mt && t[i].nt == x.nt && t[i].kc == x.kc &&
            (x.stages == 0 || t[i].stages == x.stages) && t[i].persist == x.persist)
            return (int)i;
    return -1;
}

static void list_compiled(const own_family *F, char *buf, size_t cap)
{
    size_t n = 0, used = 0;
    const fm_tile *t = F->tiles(&n);
    buf[0] = 0;
    for (size_t i = 0; i < n && used + 1 < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%dx%dx%d/w%d/s%d%s", i ? " " : "", 8 * t[i].nt,
                         t[i].warps * t[i].mt * 16, t[i].kc, t[i].warps, t[i].stages, t[i].persist ? "/p" : "");
        if (w < 0) break;
        used += (size_t)w;
    }
}

fm_status fm_resolve_fp4moe(fm_kernel_config *c)
{
    const own_family *F = fam_of(c->family);
    const char *nm = F->name;
    const fm_arch_info *arch = NULL;
    FM_CHECK(fm_arch_get(c->cc, &arch));
    FM_CHECK(fm_fp4moe_arch_check(F->family, arch));
    if (c->a != FM_ELEM_NVFP4 && c->a != FM_ELEM_MXFP4)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "%s takes nvfp4 or mxfp4 weights (--a), not %s", nm, fm_elem_name(c->a));
    if (c->b != c->a && c->b != FM_ELEM_BF16)
        return fm_fail(FM_ERR_ARCH_MISMATCH, "%s stages BF16 activations: --b must be %s or bf16, not %s", nm,
                       fm_elem_name(c->a), fm_elem_name(c->b));
    if (c->cluster_m != 1 || c->cluster_n != 1) /* not their product: 65536 x 65536 overflows int */
        return fm_fail(FM_ERR_BAD_SHAPE, "%s runs without clusters (1x1), not %dx%d", nm, c->cluster_m, c->cluster_n);
    if (c->warps < 0 || c->warps > 31 || (c->warps && !(F->warps_mask & (1u << c->warps))))
        return fm_fail(FM_ERR_BAD_SHAPE, "%s: warps=%d, the family takes %s", nm, c->warps, F->warps_text);
    if (c->persistent && F->family != FM_FAMILY_FP4MOE_WGMMA)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s has no persistent kernel (fp4moe-wgmma has)", nm);
    int w = c->warps ? c->warps : F->default_warps;
    char list[400];
    if (c->tile_m <= 0 || c->tile_m % 8 || c->tile_n <= 0 || c->tile_n % (16 * w) || c->tile_k <= 0 ||
        !pow2_upto(c->tile_m / 8, F->max_nt) || !pow2_upto(c->tile_n / (16 * w), F->max_mt) || c->tile_k % 64 ||
        c->tile_k > F->max_kc) {
        list_compiled(F, list, sizeof list);
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "%s tile %dx%dx%d: M (tokens a pass) must be 8..%d (a power of 2), N = %d warps x 16 x mt "
                       "(mt 1..%d, a power of 2), K a multiple of 64 up to %d; compiled MxNxK/warps/stages: %s",
                       nm, c->tile_m, c->tile_n, c->tile_k, 8 * F->max_nt, w, F->max_mt, F->max_kc, list);
    }
    if (c->stages) {
        fm_tile t = to_tile(c);
        fm_smem_breakdown bd;
        FM_CHECK(F->smem(&t, &bd)); /* FM_ERR_BAD_SHAPE with the ranges (stages) */
    }
    c->warps = w;
    if (c->stages == 0) {
        int i = fm_fp4moe_compiled(c);
        if (i < 0) {
            list_compiled(F, list, sizeof list);
            return fm_fail(FM_ERR_UNSUPPORTED,
                           "%s %dx%dx%d with %d warps is not compiled in, so it has no stage count (give --stages to "
                           "size it anyway); compiled MxNxK/warps/stages: %s",
                           nm, c->tile_m, c->tile_n, c->tile_k, w, list);
        }
        c->stages = F->tiles(NULL)[i].stages;
    }
    return FM_OK;
}

fm_status fm_model_fp4moe(const fm_kernel_config *cfg, fm_model_out *o)
{
    const own_family *F = fam_of(cfg->family);
    fm_tile t = to_tile(cfg);
    FM_CHECK(F->smem(&t, &o->bd)); /* the launcher's own function */
    int i = fm_fp4moe_compiled(cfg);
    o->auto_stages = i < 0 ? 0 : F->tiles(NULL)[i].stages;
    o->stage_bytes = o->bd.total / (size_t)t.stages;
    o->capacity = 0;
    o->carveout = 0;
    o->min_stages = 1;
    return FM_OK;
}

void fm_check_fp4moe(const fm_kernel_config *r, const fm_model_out *m, size_t limit, fm_plan_result *res)
{
    const own_family *F = fam_of(r->family);
    int wg = F->family == FM_FAMILY_FP4MOE_WGMMA;
    const fm_smem_breakdown *b = &m->bd;
    fm_tile t = to_tile(r);
    char name[64];
    F->tile_name(&t, name, sizeof name);
    res->auto_stages = m->auto_stages;
    res->builder_bytes = b->total; /* no builder: the launcher computes exactly these bytes */
    res->builder_fits = res->fits;
    res->best_stages = res->fits ? b->stages : 0;
    res->best_bytes = res->fits ? b->total : 0;
    size_t S = (size_t)b->stages;
    if (res->fits) {
        if (wg && b->epilogue)
            snprintf(res->reason, sizeof res->reason,
                     "fits: %s needs %zu B = %d stages x (FP4 weights %zu + scales %zu + BF16 X %zu in wgmma's "
                     "swizzled core-matrix layout + %zu to align the stage on 1 KB) + the persistent kernel's output "
                     "tile %zu <= %zu B opt-in (%zu B spare)",
                     name, b->total, b->stages, b->a / S, b->sf / S, b->b / S, b->padding / S, b->epilogue, limit,
                     limit - b->total);
        else if (wg)
            snprintf(res->reason, sizeof res->reason,
                     "fits: %s needs %zu B = %d stages x (FP4 weights %zu + scales %zu + BF16 X %zu in wgmma's "
                     "swizzled core-matrix layout + %zu to align the stage on 1 KB; the epilogue uses none) <= %zu B "
                     "opt-in (%zu B spare)",
                     name, b->total, b->stages, b->a / S, b->sf / S, b->b / S, b->padding / S, limit, limit - b->total);
        else
            snprintf(res->reason, sizeof res->reason,
                     "fits: %s needs %zu B = %d stages x (FP4 weights %zu + scales %zu + BF16 X %zu + row padding %zu; "
                     "the epilogue uses none) <= %zu B opt-in (%zu B spare)",
                     name, b->total, b->stages, b->a / S, b->sf / S, b->b / S, b->padding / S, limit,
                     limit - b->total);
        return;
    }
    /* the fix: the widest compiled tile of the family (and kind: persistent or not) with the
     * same tokens per pass that fits */
    size_t n = 0;
    const fm_tile *c = F->tiles(&n);
    int best = -1;
    size_t best_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        fm_smem_breakdown x;
        if (c[i].nt != t.nt || c[i].persist != t.persist || F->smem(&c[i], &x) != FM_OK || x.total > limit) continue;
        if (best < 0 || c[i].warps * c[i].mt > c[best].warps * c[best].mt) best = (int)i, best_bytes = x.total;
    }
    fm_clear_error();
    char fix[128];
    if (best >= 0) {
        char bn[64];
        snprintf(fix, sizeof fix, "use %s (%dx%dx%d): %zu B", F->tile_name(&c[best], bn, sizeof bn), 8 * c[best].nt,
                 c[best].warps * c[best].mt * 16, c[best].kc, best_bytes);
    } else snprintf(fix, sizeof fix, "no compiled %s tile with %d tokens a pass fits", F->name, 8 * t.nt);
    int used = snprintf(res->reason, sizeof res->reason,
                        "needs %zu B with %d stages (FP4 weights %zu + scales %zu + BF16 X %zu + padding %zu%s%.0zu) > "
                        "%zu B opt-in (%zu B over): the launcher refuses %s with FM_ERR_SMEM_EXCEEDED; ",
                        b->total, b->stages, b->a, b->sf, b->b, b->padding, b->epilogue ? " + output tile " : "",
                        b->epilogue, limit, b->total - limit, name);
    if (used > 0 && (size_t)used < sizeof res->reason)
        snprintf(res->reason + used, sizeof res->reason - (size_t)used, "%s", fix);
}
