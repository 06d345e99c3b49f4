/* fm_kernels_smem.c - shared-memory model of fp4moe's CUDA kernels (see
 * fm_kernels_smem.h for the layout each formula describes). Plain C, no CUDA:
 * the planner uses it on machines without a GPU, the launcher before each launch.
 */
#include "kernels/fm_kernels_smem.h"

#include <stdio.h>

#include "fm_internal.h"

/* Every row of the catalogue, checked at compile time: the fields are in the
 * family's ranges (the kernel templates take nothing else) and the tile's shared
 * memory (fm_tile_layout.h, the kernels' own layout) is within the largest opt-in
 * limit (227 KB, sm_90/sm_100). A bad row fails the build here, on any machine. */
#define FM_MMA_TILE(w, mt, nt, kc, st, mb)                                                               \
    _Static_assert(FM_MMA_TILE_OK(w, mt, nt, kc, st) && ((mb) == 0 || (mb) == 1),                          \
                   "fm_tiles.def: mma tile w" #w "m" #mt "n" #nt "k" #kc "s" #st " outside the kernel's ranges"); \
    _Static_assert(FM_MMA_SMEM(w, mt, nt, kc, st) <= FM_SMEM_OPTIN_MAX,                                    \
                   "fm_tiles.def: mma tile w" #w "m" #mt "n" #nt "k" #kc "s" #st " over 227 KB of shared memory");
#define FM_WGMMA_TILE(w, mt, nt, kc, st, p)                                                                  \
    _Static_assert(FM_WGMMA_TILE_OK(w, mt, nt, kc, st, p),                                                    \
                   "fm_tiles.def: wgmma tile w" #w "m" #mt "n" #nt "k" #kc "s" #st " outside the kernel's ranges");  \
    _Static_assert(FM_WGMMA_SMEM(w, mt, nt, kc, st, p) <= FM_SMEM_OPTIN_MAX,                                  \
                   "fm_tiles.def: wgmma tile w" #w "m" #mt "n" #nt "k" #kc "s" #st " over 227 KB of shared memory");
#include "kernels/fm_tiles.def"

/* The compiled mma instantiations (fm_tiles.def; src/cuda/gemm_mma.cuh expands
 * the same rows into its dispatch table, so the two cannot differ). */
static const fm_tile k_mma_tiles[] = {
#define FM_MMA_TILE(w, mt, nt, kc, st, mb) {w, mt, nt, kc, st, 0, FM_FAMILY_FP4MOE_MMA},
#include "kernels/fm_tiles.def"
};

/* 1 = the row of k_mma_tiles has the multi-block kernel (fm_tiles.def's mb column) */
static const unsigned char k_mma_mb[] = {
#define FM_MMA_TILE(w, mt, nt, kc, st, mb) mb,
#include "kernels/fm_tiles.def"
};

const fm_tile *fm_mma_tiles(size_t *count)
{
    if (count) *count = FM_ARRAY_LEN(k_mma_tiles);
    return k_mma_tiles;
}

static int tile_index(const fm_tile *list, size_t n, const fm_tile *t)
{
    for (size_t i = 0; t && i < n; i++)
        if (fm_tile_equal(&list[i], t)) return (int)i;
    return -1;
}

int fm_mma_tile_index(const fm_tile *t) { return tile_index(k_mma_tiles, FM_ARRAY_LEN(k_mma_tiles), t); }

int fm_mma_tile_has_mb(const fm_tile *t)
{
    int i = fm_mma_tile_index(t);
    return i < 0 ? 0 : k_mma_mb[i];
}

fm_status fm_smem_mma(const fm_tile *t, fm_smem_breakdown *out)
{
    if (!t || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_smem_mma: NULL argument");
    if (!FM_MMA_TILE_OK(t->warps, t->mt, t->nt, t->kc, t->stages))
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fm_smem_mma: tile warps=%d mt=%d nt=%d kc=%d stages=%d outside warps 1..8, mt 1/2/4, "
                       "nt 1/2/4/8, kc 64..1024 step 64, stages 1..8",
                       t->warps, t->mt, t->nt, t->kc, t->stages);
    /* the parts of FM_MMA_SMEM (fm_tile_layout.h), the stage layout the kernel uses */
    fm_smem_breakdown b = {0};
    size_t rows = 8u * (size_t)t->nt, st = (size_t)t->stages;
    size_t chunks = (size_t)FM_TILE_CHUNKS(t->warps, t->mt, t->kc);
    b.stages = t->stages;
    b.a = st * chunks * FM_TILE_CHUNK_BYTES;    /* FP4 weights: 16 rows x 64 K / 2 */
    b.b = st * rows * 2u * (size_t)t->kc;       /* BF16 token tile */
    b.sf = st * chunks * FM_TILE_CHUNK_SF_BYTES; /* scale bytes: 16 rows x 4 blocks */
    b.barriers = 0; /* cp.async groups + __syncthreads, no mbarriers */
    b.padding = st * rows * FM_MMA_ROW_PAD;
    b.mainloop = (size_t)FM_MMA_SMEM(t->warps, t->mt, t->nt, t->kc, t->stages);
    b.epilogue = 0; /* accumulators go registers -> global (or through the drained stages) */
    b.total = b.mainloop + b.epilogue;
    *out = b;
    return FM_OK;
}

fm_status fm_smem_mma_check(const fm_tile *t, size_t limit_bytes, fm_smem_breakdown *out)
{
    FM_CHECK(fm_smem_mma(t, out));
    if (out->total > limit_bytes) {
        char name[64];
        return fm_fail(FM_ERR_SMEM_EXCEEDED,
                       "%s needs %zu B of shared memory per block (weights %zu + scales %zu + X tiles %zu + row padding %zu, "
                       "%d stages) "
                       "but the limit is %zu B",
                       fm_mma_tile_name(t, name, sizeof name), out->total, out->a, out->sf, out->b, out->padding, out->stages,
                       limit_bytes);
    }
    return FM_OK;
}

char *fm_mma_tile_name(const fm_tile *t, char *buf, size_t n)
{
    fm_tile x = t ? *t : (fm_tile){0};
    x.family = FM_FAMILY_FP4MOE_MMA;
    return fm_tile_name(t ? &x : NULL, buf, n);
}

/* The compiled wgmma instantiations (fm_tiles.def; src/cuda/gemm_wgmma.cu expands
 * the same rows). */
static const fm_tile k_wgmma_tiles[] = {
#define FM_WGMMA_TILE(w, mt, nt, kc, st, p) {w, mt, nt, kc, st, p, FM_FAMILY_FP4MOE_WGMMA},
#include "kernels/fm_tiles.def"
};

const fm_tile *fm_wgmma_tiles(size_t *count)
{
    if (count) *count = FM_ARRAY_LEN(k_wgmma_tiles);
    return k_wgmma_tiles;
}

int fm_wgmma_tile_index(const fm_tile *t) { return tile_index(k_wgmma_tiles, FM_ARRAY_LEN(k_wgmma_tiles), t); }

fm_status fm_smem_wgmma(const fm_tile *t, fm_smem_breakdown *out)
{
    if (!t || !out) return fm_fail(FM_ERR_INVALID_ARG, "fm_smem_wgmma: NULL argument");
    if (!FM_WGMMA_TILE_OK(t->warps, t->mt, t->nt, t->kc, t->stages, t->persist))
        return fm_fail(FM_ERR_BAD_SHAPE,
                       "fm_smem_wgmma: tile warps=%d mt=%d nt=%d kc=%d stages=%d persist=%d outside warps 4/8/12, mt 1/2, "
                       "nt 1..32 (power of 2), kc 64..256 step 64, stages 4..8, persist 0/1",
                       t->warps, t->mt, t->nt, t->kc, t->stages, t->persist);
    /* the parts of FM_WGMMA_SMEM (fm_tile_layout.h), the stage layout the kernels use */
    fm_smem_breakdown b = {0};
    size_t rows = 8u * (size_t)t->nt, st = (size_t)t->stages;
    size_t chunks = (size_t)FM_TILE_CHUNKS(t->warps, t->mt, t->kc);
    b.stages = t->stages;
    b.a = st * chunks * FM_TILE_CHUNK_BYTES;
    b.sf = st * chunks * FM_TILE_CHUNK_SF_BYTES;
    b.b = st * rows * 2u * (size_t)t->kc; /* swizzled core-matrix lines: no padding inside */
    size_t raw = (size_t)FM_WGMMA_STAGE_RAW(t->warps, t->mt, t->nt, t->kc);
    b.padding = st * ((size_t)FM_WGMMA_STAGE_BYTES(t->warps, t->mt, t->nt, t->kc) - raw); /* 1 KB swizzle atoms */
    b.barriers = st * FM_WGMMA_BAR_BYTES; /* a full and an empty mbarrier per stage (producer <-> consumers) */
    b.mainloop = b.a + b.b + b.sf + b.padding + b.barriers;
    if (t->persist) /* the persistent kernel's own output tile: token rows of BF16 features + 16 B */
        b.epi_d = (size_t)FM_WGMMA_EPI_BYTES(t->warps, t->mt, t->nt);
    b.epilogue = b.epi_d;
    b.total = (size_t)FM_WGMMA_SMEM(t->warps, t->mt, t->nt, t->kc, t->stages, t->persist);
    *out = b;
    return FM_OK;
}

fm_status fm_smem_wgmma_check(const fm_tile *t, size_t limit_bytes, fm_smem_breakdown *out)
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

char *fm_wgmma_tile_name(const fm_tile *t, char *buf, size_t n)
{
    fm_tile x = t ? *t : (fm_tile){0};
    x.family = FM_FAMILY_FP4MOE_WGMMA;
    return fm_tile_name(t ? &x : NULL, buf, n);
}
