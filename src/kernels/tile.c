/* tile.c - fp4moe's tile type and what a tile's kernel is: its name, the parser of
 * that name and equality (fp4moe/kernels.h), the architectures the families run on,
 * the kernel variants and their threads per block. The one place a tile is written as
 * text or compared: the planner, the launcher, the bench and the tests call these.
 * The GEMM operand element names live here too, because the runtime's ranking
 * (cost_fp4moe.c) names the weights' element in its messages. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "fm_internal.h"
#include "kernels/fm_kernels_smem.h"

static const char *prefix(fm_kernel_family f)
{
    return f == FM_FAMILY_FP4MOE_MMA ? "mma_" : f == FM_FAMILY_FP4MOE_WGMMA ? "wgmma_" : "";
}

char *fm_tile_name(const fm_tile *t, char *buf, size_t n)
{
    if (!buf || n == 0) return buf;
    if (!t) {
        snprintf(buf, n, "(null)");
        return buf;
    }
    snprintf(buf, n, "%sw%dm%dn%dk%ds%d%s", prefix(t->family), t->warps, t->mt, t->nt, t->kc, t->stages,
             t->persist ? "p" : "");
    return buf;
}

fm_status fm_tile_parse(const char *s, fm_tile *out)
{
    if (!s || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_tile_parse: NULL argument");
    fm_tile t = {0};
    const char *p = s;
    int         legacy = 0; /* the mma family's former name, in plan files written before the rename */
    if (!strncmp(p, "mma_", 4)) t.family = FM_FAMILY_FP4MOE_MMA, p += 4;
    else if (!strncmp(p, "swapab_", 7)) t.family = FM_FAMILY_FP4MOE_MMA, p += 7, legacy = 1;
    else if (!strncmp(p, "wgmma_", 6)) t.family = FM_FAMILY_FP4MOE_WGMMA, p += 6;
    else goto bad;
    /* w<warps>m<mt>n<nt>k<kc>s<stages>: digits read here, not by sscanf's %d (a field past
     * int's range is undefined behaviour there); 1 .. 99,999 each, the canonical check below */
    static const char keys[5] = {'w', 'm', 'n', 'k', 's'};
    int *const        field[5] = {&t.warps, &t.mt, &t.nt, &t.kc, &t.stages};
    for (int i = 0; i < 5; i++) {
        if (*p++ != keys[i] || !isdigit((unsigned char)*p)) goto bad;
        int v = 0, nd = 0;
        for (; isdigit((unsigned char)*p); p++) {
            if (++nd > 5) goto bad;
            v = 10 * v + (*p - '0');
        }
        *field[i] = v;
    }
    if (*p == 'p' && t.family == FM_FAMILY_FP4MOE_WGMMA) t.persist = 1, p++;
    if (*p || t.warps < 1 || t.mt < 1 || t.nt < 1 || t.kc < 1 || t.stages < 1) goto bad;
    char back[64]; /* exactly the canonical spelling: no signs, spaces or leading zeros */
    if (strcmp(fm_tile_name(&t, back, sizeof back) + (legacy ? 4 : 0), legacy ? s + 7 : s)) goto bad;
    *out = t;
    return FM_OK;
bad:
    return fm_fail(FM_ERR_NOT_FOUND,
                   "tile name '%s': expected mma_w<warps>m<mt>n<nt>k<kc>s<stages> or "
                   "wgmma_w<warps>m<mt>n<nt>k<kc>s<stages>[p] (e.g. mma_w4m1n1k256s4, wgmma_w8m1n32k64s4p)",
                   s);
}

int fm_tile_equal(const fm_tile *a, const fm_tile *b)
{
    if (!a || !b) return 0;
    if (a->family && b->family && a->family != b->family) return 0;
    return a->warps == b->warps && a->mt == b->mt && a->nt == b->nt && a->kc == b->kc && a->stages == b->stages &&
           a->persist == b->persist;
}

/* element         bits  name */
static const struct {
    int         bits;
    const char *name;
} k_elems[FM_ELEM_COUNT] = {
    [FM_ELEM_VOID] = {0, "void"},   [FM_ELEM_BF16] = {16, "bf16"},   [FM_ELEM_FP16] = {16, "fp16"},
    [FM_ELEM_FP32] = {32, "fp32"},  [FM_ELEM_FP8] = {8, "fp8"},      [FM_ELEM_NVFP4] = {4, "nvfp4"},
    [FM_ELEM_MXFP4] = {4, "mxfp4"},
};

int fm_elem_bits(fm_elem e) { return (unsigned)e < FM_ELEM_COUNT ? k_elems[e].bits : 0; }

const char *fm_elem_name(fm_elem e) { return (unsigned)e < FM_ELEM_COUNT ? k_elems[e].name : "?"; }

fm_status fm_fp4moe_arch_check(fm_kernel_family f, const fm_arch_info *arch)
{
    if (f == FM_FAMILY_FP4MOE_WGMMA && !(arch->features & FM_FEAT_WGMMA))
        return fm_fail(FM_ERR_ARCH_MISMATCH,
                       "fp4moe-wgmma needs wgmma (sm_90a), not %s: use fp4moe-mma (mma.sync, sm_80+) there",
                       arch->name);
    if (!(arch->features & FM_FEAT_MMA_BF16))
        return fm_fail(FM_ERR_ARCH_MISMATCH, "%s needs BF16 mma.sync and cp.async (sm_80+), not %s",
                       f == FM_FAMILY_FP4MOE_WGMMA ? "fp4moe-wgmma" : "fp4moe-mma", arch->name);
    return FM_OK;
}

fm_kernel_family fm_variant_family(fm_kernel_variant v)
{
    return v == FM_VARIANT_MMA || v == FM_VARIANT_MMA_MULTI_BLOCK ? FM_FAMILY_FP4MOE_MMA : FM_FAMILY_FP4MOE_WGMMA;
}

const char *fm_kernel_variant_name(fm_kernel_variant v)
{
    static const char *const k[FM_VARIANT_COUNT] = {"mma", "mma-multi-block", "wgmma-natural-x", "wgmma-packed-x",
                                                    "wgmma-persistent"};
    return (int)v >= 0 && v < FM_VARIANT_COUNT ? k[v] : "?";
}

fm_kernel_variant fm_variant_of(fm_kernel_family fam, const fm_tile *t, int feature_blocks, int x_packed)
{
    if (fam == FM_FAMILY_FP4MOE_MMA) return feature_blocks > 1 ? FM_VARIANT_MMA_MULTI_BLOCK : FM_VARIANT_MMA;
    if (t && t->persist) return FM_VARIANT_WGMMA_PERSISTENT;
    return x_packed ? FM_VARIANT_WGMMA_PACKED_X : FM_VARIANT_WGMMA_NATURAL_X;
}

int fm_kernel_threads(const fm_tile *t, fm_kernel_variant v)
{
    if (!t) return 0;
    int producer = v == FM_VARIANT_WGMMA_PACKED_X || v == FM_VARIANT_WGMMA_PERSISTENT;
    return (t->warps + (producer ? FM_WGMMA_PRODUCER_WARPS : 0)) * 32;
}
