/* smem_cutlass.c - the mainloops of CUTLASS's grouped GEMMs and their builders'
 * automatic stage counts.
 *
 * SM120 block-scaled (CUTLASS 4.2 gemm/collective/sm120_blockscaled_mma_array_tma.hpp,
 * builders/sm120_blockscaled_mma_builder.inl):
 *   TensorStorage { alignas(1024) A[S]; alignas(1024) B[S]; SFA[S]; SFB[S]; } (aligned 1024)
 *   TensorMapStorage = 4 descriptors x 128 B; pipeline = 2 mbarriers x 8 B a stage.
 *   SF bytes a stage = floor(M/128)*128 * 4*floor(K/V/4) (V = 16 NVFP4, 32 MX); a tile
 *   edge under 128 gets no SF buffer in 4.2 (an empty array, 1 byte) - later releases
 *   round M up to one 128-row block and N to at least 128.
 *   A/B are 4-bit for NVFP4/MXFP4 (MXF4 MMA) and 8-bit containers for FP8 x FP4 (MXF8F6F4).
 *   Auto stages = (101,376 - epilogue) / (A + B + SFA + SFB + 16) in 4.2;
 *   newer builders first subtract the scheduler pipeline (128), 2 tensor maps (256) and
 *   the tensor-map-ready pipeline (48): 100,944.
 * SM90 TMA GMMA ptr-array (sm90_mma_array_tma_gmma_ss_warpspecialized.hpp, sm90_gmma_builder.inl):
 *   TensorStorage { A[S]; B[S]; } (aligned 128); 2 tensor maps; auto stages =
 *   (232,448 - 256 - 128 - epilogue) / (A + B + 16).
 */
#include <string.h>

#include "cutlass/cutlass_models.h"

static fm_status finish(const fm_kernel_config *cfg, fm_model_out *o, size_t stage_ab, size_t stage_sf, size_t capacity,
                        const fm_epi_out *epi, int *stages)
{
    /* one stage's pipeline barrier: 16 B; the block-scaled builders count it rounded up to
     * 128 B since 4.4 (sm100_compute_stage_count_or_override_blockscaled) */
    o->stage_bytes = stage_ab + stage_sf + (stage_sf && cfg->cutlass >= 440 ? 128 : 16);
    o->capacity = capacity;
    o->carveout = epi->shared;
    o->auto_stages = capacity > epi->shared ? (int)((capacity - epi->shared) / o->stage_bytes) : 0;
    /* an automatic count below the collective's minimum of 2 would not compile; the bytes
     * are reported for 2 stages so the verdict can say by how much it misses */
    *stages = cfg->stages ? cfg->stages : (o->auto_stages < 2 ? 2 : o->auto_stages);
    o->min_stages = 2;
    return FM_OK;
}

/* The collective's SharedStorage, the same shape for both families:
 *   { TensorStorage { A[S]; B[S]; [SFA[S]; SFB[S];] } (aligned 128);
 *     TensorMapStorage (n_tmaps x 128 B); PipelineStorage (2 mbarriers x 8 B a stage) }
 * then the kernel's storage around it (fm_kernel_sm90_array).  sf = 0: no SF buffers
 * (SM90); an SM120 SF buffer of 0 bytes is an empty array, 1 byte. */
typedef struct {
    size_t a, b, ab_align; /* one stage of A and B, and their buffers' alignment */
    int    sf;             /* 1: SFA/SFB buffers follow */
    size_t sfa, sfb;       /* one stage of each */
    int    n_tmaps;        /* tensor-map descriptors in the mainloop's storage */
} mainloop_shape;

static void mainloop_layout(const fm_kernel_config *cfg, const mainloop_shape *m, int S, const fm_epi_out *epi,
                            fm_smem_breakdown *bd)
{
    fm_lay t;
    fm_lay_init(&t, 128);
    fm_lay_put(&t, m->a * S, m->ab_align);
    fm_lay_put(&t, m->b * S, m->ab_align);
    if (m->sf) {
        fm_lay_put(&t, m->sfa ? m->sfa * S : 1, 1);
        fm_lay_put(&t, m->sfb ? m->sfb * S : 1, 1);
    }
    size_t tensors = fm_lay_size(&t);
    size_t tmaps = cfg->plain ? 0 : (size_t)m->n_tmaps * 128, pipe = 16 * (size_t)S;
    fm_lay ml;
    fm_lay_init(&ml, 1);
    fm_lay_put(&ml, tensors, t.align);
    if (tmaps) fm_lay_put(&ml, tmaps, 128);
    fm_lay_put(&ml, pipe, 16);

    memset(bd, 0, sizeof *bd);
    bd->stages = S;
    bd->a = m->a * S, bd->b = m->b * S, bd->sf = (m->sfa + m->sfb) * S;
    bd->mainloop = fm_lay_size(&ml);
    if (cfg->plain) fm_kernel_sm90_plain(cfg, tensors, t.align, pipe, epi, bd);
    else fm_kernel_sm90_array(cfg, tensors, t.align, tmaps, pipe, epi, bd);
}

fm_status fm_model_cutlass_sm120(const fm_kernel_config *cfg, fm_model_out *o)
{
    int f8f6f4 = cfg->a == FM_ELEM_FP8 || cfg->b == FM_ELEM_FP8;
    int vec = (cfg->a == FM_ELEM_NVFP4) ? 16 : 32;
    int bits = f8f6f4 ? 8 : 4;
    /* the builder's capacity carve-out (scheduler pipeline, 2 tensor maps, tensor-map-ready
     * pipeline) arrived in 4.4; SFB rounded up to one 128-column block in 4.5; SFA is
     * floor(M / 128) blocks in every version (M = 64: an empty array, 1 byte) */
    int newer = cfg->cutlass >= 440;
    int sfk = 4 * ((cfg->tile_k / vec) / 4);
    int mblk = cfg->tile_m / 128;
    int nblk = cfg->cutlass >= 450 ? (cfg->tile_n < 128 ? 128 : cfg->tile_n) / 128 : cfg->tile_n / 128;
    mainloop_shape m = {.a = (size_t)cfg->tile_m * cfg->tile_k * bits / 8,
                        .b = (size_t)cfg->tile_n * cfg->tile_k * bits / 8,
                        .ab_align = 1024,
                        .sf = 1,
                        .sfa = (size_t)mblk * 128 * sfk,
                        .sfb = (size_t)nblk * 128 * sfk,
                        .n_tmaps = 4};
    fm_epi_out epi;
    FM_CHECK(fm_epilogue_sm90_style(cfg, 1, &epi));
    size_t cap = newer ? 101376 - 128 - 256 - 48 : 101376;
    int S;
    FM_CHECK(finish(cfg, o, m.a + m.b, m.sfa + m.sfb, cap, &epi, &S));
    mainloop_layout(cfg, &m, S, &epi, &o->bd);
    return FM_OK;
}

fm_status fm_model_cutlass_sm90(const fm_kernel_config *cfg, fm_model_out *o)
{
    int bits = fm_elem_bits(cfg->a);
    mainloop_shape m = {.a = (size_t)cfg->tile_m * cfg->tile_k * bits / 8,
                        .b = (size_t)cfg->tile_n * cfg->tile_k * bits / 8,
                        .ab_align = 128,
                        .n_tmaps = 2};
    fm_epi_out epi;
    FM_CHECK(fm_epilogue_sm90_style(cfg, 0, &epi));
    int S;
    /* the builder's carve-out: 2 tensor maps + the scheduler pipeline, for ptr-array kernels only */
    FM_CHECK(finish(cfg, o, m.a + m.b, 0, cfg->plain ? 232448 : 232448 - 2 * 128 - 128, &epi, &S));
    mainloop_layout(cfg, &m, S, &epi, &o->bd);
    return FM_OK;
}
