/* tile.c - fp4moe's tile type: its name, the parser of that name and equality
 * (fp4moe/plan.h). The one place a tile is written as text or compared: the planner,
 * the launcher, the bench and the tests call these. */
#include <stdio.h>
#include <string.h>

#include "fm_internal.h"
#include "fp4moe/plan.h"

static const char *prefix(fm_kernel_family f)
{
    return f == FM_FAMILY_FP4MOE_SWAPAB ? "swapab_" : f == FM_FAMILY_FP4MOE_WGMMA ? "wgmma_" : "";
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
    if (!strncmp(p, "swapab_", 7)) t.family = FM_FAMILY_FP4MOE_SWAPAB, p += 7;
    else if (!strncmp(p, "wgmma_", 6)) t.family = FM_FAMILY_FP4MOE_WGMMA, p += 6;
    else goto bad;
    int used = 0;
    if (sscanf(p, "w%dm%dn%dk%ds%d%n", &t.warps, &t.mt, &t.nt, &t.kc, &t.stages, &used) != 5 || used <= 0) goto bad;
    p += used;
    if (*p == 'p' && t.family == FM_FAMILY_FP4MOE_WGMMA) t.persist = 1, p++;
    if (*p || t.warps < 1 || t.mt < 1 || t.nt < 1 || t.kc < 1 || t.stages < 1) goto bad;
    char back[64]; /* exactly the canonical spelling: no signs, spaces or leading zeros */
    if (strcmp(fm_tile_name(&t, back, sizeof back), s)) goto bad;
    *out = t;
    return FM_OK;
bad:
    return fm_fail(FM_ERR_NOT_FOUND,
                   "tile name '%s': expected swapab_w<warps>m<mt>n<nt>k<kc>s<stages> or "
                   "wgmma_w<warps>m<mt>n<nt>k<kc>s<stages>[p] (e.g. swapab_w4m1n1k256s4, wgmma_w8m1n32k64s4p)",
                   s);
}

int fm_tile_equal(const fm_tile *a, const fm_tile *b)
{
    if (!a || !b) return 0;
    if (a->family && b->family && a->family != b->family) return 0;
    return a->warps == b->warps && a->mt == b->mt && a->nt == b->nt && a->kc == b->kc && a->stages == b->stages &&
           a->persist == b->persist;
}
