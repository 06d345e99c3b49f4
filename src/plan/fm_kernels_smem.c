/* fm_kernels_smem.c - shared-memory model of fp4moe's CUDA kernels (see
 * fm_kernels_smem.h for the layout each formula describes). Plain C, no CUDA:
 * the planner uses it on machines without a GPU, the launcher before each launch.
 */
#include "plan/fm_kernels_smem.h"

#include <stdio.h>

#include "fm_internal.h"

/* The compiled swapab instantiations (src/cuda/gemm_swapab.cu lists the same
 * rows in its dispatch table; tests/gpu/test_cuda_gemm.c launches every row
 * here, so a row missing there fails with FM_ERR_UNSUPPORTED).
 * Dynamic smem in the last column = stages * (8*nt * (2*kc + 16) + warps*mt*(kc/64) * (512 + 64)).
 *   warps mt  nt  kc    stages      smem bytes  regime */
static const fm_swapab_tile k_swapab_tiles[] = {
    {4, 1, 1, 256, 4, 0}, /*  53,760  1-8 rows per expert */
    {8, 1, 1, 64, 4, 0},  /*  23,040  1-8, small K (TP8 FC2: K = 256): more CTAs in flight */
    {4, 1, 1, 128, 8, 0}, /*  54,272  1-8, deeper: 7 stages of 4.6 KB in flight per CTA */
    {4, 1, 1, 128, 4, 0}, /*  27,136  1-8, small CTA: up to 7 CTAs = 28 warps per SM */
    {4, 2, 1, 128, 8, 0}, /*  91,136  1-8, SwiGLU pairs, deeper */
    {4, 1, 1, 256, 6, 0}, /*  80,640  1-8, 5 stages of 9.2 KB in flight per CTA */
    {4, 1, 1, 256, 3, 0}, /*  40,320  1-8, 5 CTAs per SM on Hopper */
    {4, 2, 1, 256, 3, 0}, /*  67,968  1-8, SwiGLU pairs, 3 CTAs per SM on Hopper */
    {4, 2, 1, 128, 4, 0}, /*  45,568  1-8, SwiGLU pairs, short K */
    {4, 4, 1, 128, 3, 0}, /*  61,824  1-8, four bands per warp */
    {4, 4, 1, 256, 2, 0}, /*  82,176  1-8, four bands per warp, one stage ahead */
    {4, 2, 1, 256, 4, 0}, /*  90,624  1-8, SwiGLU pairs */
    {4, 1, 2, 256, 4, 0}, /*  70,656  9-16 */
    {4, 2, 2, 256, 4, 0}, /* 107,520  9-16, SwiGLU pairs: Hopper/A100 only */
    {4, 2, 2, 128, 4, 0}, /*  54,272  9-16, two bands per warp, 4 CTAs per SM on Hopper */
    {4, 4, 2, 128, 3, 0}, /*  68,352  9-16, four bands per warp, 3 CTAs per SM on Hopper */
    {4, 1, 4, 128, 4, 0}, /*  53,248  17-32 */
    {4, 2, 4, 128, 4, 0}, /*  71,680  17-32, SwiGLU pairs */
    {4, 2, 8, 128, 3, 0}, /*  79,872  33+ */
    {4, 4, 8, 128, 3, 0}, /* 107,520  33+ : Hopper/A100 only */
    {8, 2, 8, 128, 3, 0}, /* 107,520  33+ : Hopper/A100 only */
};

const fm_swapab_tile *fm_swapab_tiles(size_t *count)
{
    if (count) *count = FM_ARRAY_LEN(k_swapab_tiles);
    return k_swapab_tiles;
}

/* The tiles with a multi-block kernel (gemm_swapab.cu FM_SWAPAB_ENTRY_MB). */
static const fm_swapab_tile k_swapab_mb[] = {
    {8, 1, 1, 64, 4, 0},  {4, 1, 1, 128, 8, 0}, {4, 1, 1, 128, 4, 0}, {4, 2, 1, 128, 8, 0},
    {4, 1, 1, 256, 3, 0}, {4, 2, 1, 256, 3, 0}, {4, 2, 1, 128, 4, 0}, {4, 4, 1, 128, 3, 0},
};

int fm_swapab_tile_has_mb(const fm_swapab_tile *t)
{
    for (size_t i = 0; t && i < FM_ARRAY_LEN(k_swapab_mb); i++) {
        const fm_swapab_tile *m = &k_swapab_mb[i];
        if (m->warps == t->warps && m->mt == t->mt && m->nt == t->nt && m->kc == t->kc && m->stages == t->stages)
            return 1;
    }
    return 0;
}

static int is_pow2_upto(int v, int max) { return v >= 1 && v <= max && (v & (v - 1)) == 0; }

fm_status fm_smem_swapab(const fm_swapab_tile *t, fm_smem_breakdown *out)
{
    if (!t || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_smem_swapab: NULL argument");
    if (t->warps < 1 || t->warps > 8 || !is_pow2_upto(t->mt, 4) || !is_pow2_upto(t->nt, 8) || t->kc < 64 ||
        t->kc > 1024 || t->kc % 64 != 0 || t->stages < 1 || t->stages > 8)
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fm_smem_swapab: tile warps=%d mt=%d nt=%d kc=%d stages=%d outside warps 1..8, mt 1/2/4, "
                       "nt 1/2/4/8, kc 64..1024 step 64, stages 1..8",
                       t->warps, t->mt, t->nt, t->kc, t->stages);
    fm_smem_breakdown b = {0};
    size_t rows = 8u * (size_t)t->nt;
    b.stages = t->stages;
    size_t chunks = (size_t)t->warps * t->mt * (t->kc / 64); /* 64-K weight chunks per stage */
    b.a = (size_t)t->stages * chunks * 512u;                 /* FP4 weights: 16 rows x 64 K / 2 */
    b.b = (size_t)t->stages * rows * 2u * (size_t)t->kc;     /* BF16 token tile */
    b.sf = (size_t)t->stages * chunks * 64u;                 /* scale bytes: 16 rows x 4 blocks */
    b.barriers = 0; /* cp.async groups + __syncthreads, no mbarriers */
    size_t row_pad = (size_t)t->stages * rows * FM_SWAPAB_ROW_PAD;
    b.mainloop = b.a + b.b + b.sf + b.barriers + row_pad;
    b.epilogue = 0; /* accumulators go registers -> global */
    b.padding = row_pad;
    b.total = b.mainloop + b.epilogue;
    *out = b;
    return FM_OK;
}

fm_status fm_smem_swapab_check(const fm_swapab_tile *t, size_t limit_bytes, fm_smem_breakdown *out)
{
    FM_CHECK(fm_smem_swapab(t, out));
    if (out->total > limit_bytes) {
        char name[64];
        return fm_fail(FM_ERR_SMEM_EXCEEDED,
                       "%s needs %zu B of shared memory per block (weights %zu + scales %zu + X tiles %zu + row padding %zu, "
                       "%d stages) "
                       "but the limit is %zu B",
                       fm_swapab_tile_name(t, name, sizeof name), out->total, out->a, out->sf, out->b, out->padding, out->stages,
                       limit_bytes);
    }
    return FM_OK;
}

char *fm_swapab_tile_name(const fm_swapab_tile *t, char *buf, size_t n)
{
    if (!buf || n == 0) return buf;
    if (!t) {
        snprintf(buf, n, "swapab_(null)");
        return buf;
    }
    snprintf(buf, n, "swapab_w%dm%dn%dk%ds%d", t->warps, t->mt, t->nt, t->kc, t->stages);
    return buf;
}

/* The compiled wgmma instantiations (src/cuda/gemm_wgmma.cu has the same rows).
 * Dynamic smem = stages * (roundup(warps*mt*(kc/64)*576 + 8*nt*2*kc, 1024) + 16),
 * persistent (last field 1) + 8*nt * (warps*mt*32 + 16) for the output tile.
 *   warps mt  nt  kc  stages      smem bytes  CTA = features x tokens a pass */
static const fm_swapab_tile k_wgmma_tiles[] = {
    {8, 2, 16, 64, 4, 0}, /* 102,464  256 x 128 (SwiGLU pairs) */
    {8, 2, 16, 64, 6, 0}, /* 153,696  256 x 128, deeper */
    {8, 1, 32, 64, 4, 0}, /* 151,616  128 x 256 */
    {4, 2, 16, 64, 4, 0}, /*  86,080  128 x 128 (SwiGLU pairs): two CTAs per SM overlap each other */
    {8, 2, 8, 64, 4, 0},  /*  69,696  256 x 64 (SwiGLU pairs) */
    {4, 2, 8, 64, 4, 0},  /*  53,312  128 x 64 (SwiGLU pairs): up to four CTAs per SM */
    {8, 2, 4, 128, 4, 0}, /* 106,560  256 x 32 (SwiGLU pairs) */
    {4, 2, 2, 128, 4, 0}, /*  53,312  128 x 16 (SwiGLU pairs) */
    {4, 1, 1, 128, 4, 0}, /*  28,736   64 x 8  */
    {4, 2, 1, 128, 4, 0}, /*  45,120  128 x 8 (SwiGLU pairs) */
    /* deeper pipelines: every wgmma CTA has an SM to itself (its registers, bench/regs_table.py),
     * so stages cost nothing but shared memory, of which one CTA leaves most unused */
    {8, 2, 8, 64, 8, 0},  /* 139,392  256 x 64, 7 stages in flight */
    {8, 2, 4, 128, 6, 0}, /* 159,840  256 x 32 */
    {8, 2, 16, 64, 8, 0}, /* 204,928  256 x 128 */
    {8, 1, 32, 64, 6, 0}, /* 227,424  128 x 256 */
    /* three consumer warpgroups: 12 decoding warps per SM, as the mma kernel's 3 CTAs x 4 */
    {12, 2, 4, 64, 8, 0}, /* 147,584  384 x 32 */
    /* persistent (packed X): one CTA per SM over all tiles, + the output tile's buffer
     * (256 x 128, 6 stages, was measured too: never the fastest, at K = 256 half the
     * speed of the 128 x 256 one, bench/RESULTS.md) */
    {8, 1, 32, 64, 4, 1}, /* 221,248  128 x 256 */
    {8, 2, 8, 64, 8, 1},  /* 173,184  256 x 64 (SwiGLU pairs) */
};

const fm_swapab_tile *fm_wgmma_tiles(size_t *count)
{
    if (count) *count = FM_ARRAY_LEN(k_wgmma_tiles);
    return k_wgmma_tiles;
}

fm_status fm_smem_wgmma(const fm_swapab_tile *t, fm_smem_breakdown *out)
{
    if (!t || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_smem_wgmma: NULL argument");
    if ((t->warps != 4 && t->warps != 8 && t->warps != 12) || !is_pow2_upto(t->mt, 2) || !is_pow2_upto(t->nt, 32) || t->kc < 64 ||
        t->kc > 256 || t->kc % 64 != 0 || t->stages < 4 || t->stages > 8 || (t->persist != 0 && t->persist != 1))
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fm_smem_wgmma: tile warps=%d mt=%d nt=%d kc=%d stages=%d persist=%d outside warps 4/8/12, mt 1/2, "
                       "nt 1..32 (power of 2), kc 64..256 step 64, stages 4..8, persist 0/1",
                       t->warps, t->mt, t->nt, t->kc, t->stages, t->persist);
    fm_smem_breakdown b = {0};
    size_t rows = 8u * (size_t)t->nt;
    size_t chunks = (size_t)t->warps * t->mt * (t->kc / 64);
    b.stages = t->stages;
    b.a = (size_t)t->stages * chunks * 512u;
    b.sf = (size_t)t->stages * chunks * 64u;
    b.b = (size_t)t->stages * rows * 2u * (size_t)t->kc; /* swizzled core-matrix lines: no padding inside */
    size_t raw = chunks * 576u + rows * 2u * (size_t)t->kc;
    b.padding = (size_t)t->stages * ((raw + 1023) / 1024 * 1024 - raw); /* stages start on 1 KB swizzle atoms */
    b.barriers = (size_t)t->stages * 16u; /* a full and an empty mbarrier per stage (producer <-> consumers) */
    b.mainloop = b.a + b.b + b.sf + b.padding + b.barriers;
    if (t->persist) /* the persistent kernel's own output tile: token rows of BF16 features + 16 B */
        b.epi_d = rows * (2u * (size_t)t->warps * t->mt * 16u + 16u);
    b.epilogue = b.epi_d;
    b.total = b.mainloop + b.epilogue;
    *out = b;
    return FM_OK;
}

fm_status fm_smem_wgmma_check(const fm_swapab_tile *t, size_t limit_bytes, fm_smem_breakdown *out)
{
    FM_CHECK(fm_smem_wgmma(t, out));
    if (out->total > limit_bytes) {
        char name[64];
        return fm_fail(FM_ERR_SMEM_EXCEEDED,
                       "%s needs %zu B of shared memory per block (weights %zu + scales %zu + X tiles %zu + 1 KB "
                       "alignment %zu, %d stages%s%.0zu) but the limit is %zu B",
                       fm_wgmma_tile_name(t, name, sizeof name), out->total, out->a, out->sf, out->b, out->padding,
                       out->stages, out->epilogue ? " + output tile " : "", out->epilogue, limit_bytes);
    }
    return FM_OK;
}

char *fm_wgmma_tile_name(const fm_swapab_tile *t, char *buf, size_t n)
{
    if (!buf || n == 0) return buf;
    if (!t) {
        snprintf(buf, n, "wgmma_(null)");
        return buf;
    }
    snprintf(buf, n, "wgmma_w%dm%dn%dk%ds%d%s", t->warps, t->mt, t->nt, t->kc, t->stages, t->persist ? "p" : "");
    return buf;
}
