/* smem_epilogue.c - CUTLASS's ptr-array TMA warp-specialized epilogue, byte by byte,
 * and the SM90 ptr-array kernel SharedStorage that wraps mainloop and epilogue.
 *
 * Sources (CUTLASS 4.2, include/cutlass/epilogue/collective/): 
 *  - builders/sm90_builder.inl, sm120_builder.inl: epilogue tile (SM90 cooperative
 *    min(128,M) x gcd(min(32,N),N), ping-pong min(64,M) x 32 (64 for 8-bit D), SM120
 *    64 x 32; an explicit EpilogueTileType as given: SM90 asserts M = 128 cooperative / 64
 *    ping-pong and N % 16 == 0, SM120 that it divides the CTA tile), StagesD = min(tiles, 2),
 *    StagesC = reuse ? max(min(tiles, 4|2), StagesD+1) : min(tiles, 4) (SM90) | StagesD (SM120); reuse = C and D of equal width > 8 bits.
 *  - sm90_epilogue_array_tma_warpspecialized.hpp: TensorStorage = union or struct of
 *    smem_C / smem_D (alignas = swizzle alignment) + fusion storage; TensorMapStorage
 *    = 1 + NumEpilogueWarpGroups descriptors of 128 B; load pipeline = 2 mbarriers a stage.
 *  - gemm/kernel/sm90_gemm_array_tma_warpspecialized_{cooperative,pingpong}.hpp:
 *    SharedStorage = {tensors, pipelines (scheduler PipelineAsync<8>, mainloop, epilogue
 *    load, load-order barrier, ping-pong math order), 8 scheduler responses, tensor maps}.
 * FINALIZE (TensorRT-LLM): C = bf16, D = void, D staged as the fusion's aux type (bf16);
 * the router scale (swap-AB) or bias (no swap) is a row broadcast of the CTA's N extent.
 */
#include <string.h>

#include "cutlass/cutlass_models.h"

fm_status fm_epilogue_sm90_style(const fm_kernel_config *cfg, int sm120, fm_epi_out *o)
{
    memset(o, 0, sizeof *o);
    if (cfg->epilogue == FM_EPI_NOSMEM) {
        /* empty structs: sizeof 1 each; the kernel's alignas(16)/(128) members pad them */
        o->tensors = 1, o->tensors_align = 1, o->shared = 1;
        return FM_OK;
    }
    int fin = cfg->epilogue == FM_EPI_FINALIZE;
    int bc = fm_elem_bits(cfg->c), bd_decl = fm_elem_bits(cfg->d);
    if (fin && cfg->d != FM_ELEM_VOID)
        return fm_fail(FM_ERR_UNSUPPORTED, "FINALIZE stores through its scatter: D must be void (--d void)");
    if (!fin && cfg->d == FM_ELEM_VOID)
        return fm_fail(FM_ERR_UNSUPPORTED, "a TMA epilogue without D needs a fusion that stores (use --epilogue finalize)");
    int bd = fin ? 16 : bd_decl; /* FINALIZE stages D as bf16 (its aux element) */
    int coop = cfg->schedule != FM_SCHED_PINGPONG;
    int em, en;
    if (sm120) { /* 64 x 32; since 4.7 narrow tiles: N < 32 -> N wide, N < 16 -> 128 rows */
        em = 64, en = 32;
        if (cfg->cutlass >= 470) {
            en = cfg->tile_n < 32 ? cfg->tile_n : 32;
            em = cfg->tile_n < 16 ? 128 : 64;
        }
    } else if (coop) {
        em = cfg->tile_m < 128 ? cfg->tile_m : 128;
        en = cfg->tile_n < 32 ? cfg->tile_n : 32;
    } else {
        int nperf = (bd_decl == 8 && cfg->tile_n % 64 == 0) ? 64 : 32;
        em = cfg->tile_m < 64 ? cfg->tile_m : 64;
        en = cfg->tile_n < nperf ? cfg->tile_n : nperf;
    }
    if (cfg->epi_tile_m) { /* an explicit EpilogueTileType, taken as given; each builder's static_asserts */
        em = cfg->epi_tile_m, en = cfg->epi_tile_n;
        if (sm120 && (cfg->tile_m % em || cfg->tile_n % en))
            return fm_fail(FM_ERR_BAD_SHAPE, "rejected at compile time: epilogue tile %dx%d does not divide the CTA "
                                             "tile %dx%d (sm120_builder.inl static_assert: EpilogueTile must evenly "
                                             "divide CTA tile)", em, en, cfg->tile_m, cfg->tile_n);
        if (sm120 && em != 64 && em != 128) /* measured: 128 (cooperative), 64 (ping-pong, FINALIZE) */
            return fm_fail(FM_ERR_UNSUPPORTED, "SM120 epilogue tile M=%d is not modelled (64 and 128 are measured: "
                                               "tests/conformance/truth-epitile-*.csv)", em);
        if (!sm120 && (em != (coop ? 128 : 64) || en % 16))
            return fm_fail(FM_ERR_BAD_SHAPE, "rejected at compile time: SM90 epilogue tile %dx%d: the %s schedule "
                                             "takes M = %d and N a multiple of 16 (sm90_builder.inl static_assert: "
                                             "Unsupported tile shape)", em, en, coop ? "cooperative" : "ping-pong",
                           coop ? 128 : 64);
    }
    if (cfg->tile_m % em || cfg->tile_n % en)
        return fm_fail(FM_ERR_BAD_SHAPE, "tile %dx%d is not a multiple of the epilogue sub-tile %dx%d", cfg->tile_m,
                       cfg->tile_n, em, en);
    int tiles = (cfg->tile_m / em) * (cfg->tile_n / en);
    /* the builder's ReuseSmem (void D has width 0); the SM90 builder sizes FINALIZE's C stages
     * with D as the fusion's bf16 aux element (measured: truth-4.7.0.csv sm_90 FINALIZE rows) */
    int bd_stage = (fin && !sm120) ? bd : bd_decl;
    int reuse_b = (bc == bd_stage) && bd_stage > 8;
    int sd = tiles < 2 ? tiles : 2;
    int sc;
    if (sm120) sc = reuse_b ? ((tiles < 2 ? tiles : 2) > sd + 1 ? (tiles < 2 ? tiles : 2) : sd + 1) : sd;
    else {
        int t4 = tiles < 4 ? tiles : 4;
        sc = reuse_b ? (t4 > sd + 1 ? t4 : sd + 1) : t4;
    }
    int reuse = reuse_b && cfg->d != FM_ELEM_VOID;
    int src = cfg->c != FM_ELEM_VOID;
    int bsc = src ? bc : bd; /* a void C takes D's type (never allocated) */
    int colmajor = fin && cfg->swap_ab; /* TensorRT-LLM's swap-AB FINALIZE writes a column-major view */
    size_t al_c = fm_swizzle_align(colmajor ? em : en, bsc), al_d = fm_swizzle_align(colmajor ? em : en, bd);
    size_t cb = (size_t)sc * em * en * bsc / 8;
    size_t db = (size_t)(reuse ? sc : sd) * em * en * bd / 8;

    fm_lay coll;
    fm_lay_init(&coll, 1);
    if (!src) { /* union { array<C,0>; alignas(AlignD) smem_D; } */
        fm_lay_put(&coll, db, al_d);
        o->c = 0, o->d = db;
    } else if (reuse) { /* union of C and D, both alignas(max) */
        size_t m = al_c > al_d ? al_c : al_d;
        fm_lay_put(&coll, cb > db ? cb : db, m);
        o->c = cb, o->d = 0;
    } else {
        fm_lay_put(&coll, cb, al_c);
        fm_lay_put(&coll, db, al_d);
        o->c = cb, o->d = db;
    }
    size_t coll_size = fm_lay_size(&coll);

    size_t fus = 0; /* fusion storage: only row broadcasts hold shared memory */
    if (fin) fus = (size_t)cfg->tile_n * (cfg->swap_ab ? 4 : 2);
    fm_lay t;
    fm_lay_init(&t, 1);
    fm_lay_put(&t, coll_size, coll.align);
    fm_lay_put(&t, fus ? fus : 1, fus ? 16 : 1);
    o->tensors = fm_lay_size(&t), o->tensors_align = t.align;
    o->fusion = fus;
    o->stages_c = sc, o->stages_d = sd;
    /* C + D per epilogue warp group (2 for cooperative and ping-pong); a plain GEMM's TMA
     * descriptors live in the kernel parameters, not in shared memory */
    o->tmaps = cfg->plain ? 0 : 128u * (1 + 2);
    o->pipeline = 16u * (size_t)sc;

    fm_lay s;
    fm_lay_init(&s, 1);
    fm_lay_put(&s, o->tensors, o->tensors_align);
    if (!cfg->plain) fm_lay_put(&s, o->tmaps, 128);
    fm_lay_put(&s, o->pipeline, 8);
    o->shared = fm_lay_size(&s);
    return FM_OK;
}

void fm_kernel_sm90_plain(const fm_kernel_config *cfg, size_t ml_tensors, size_t ml_tensors_align,
                          size_t ml_pipeline, const fm_epi_out *epi, fm_smem_breakdown *bd)
{
    const size_t load_order = 16, math_order = 32;
    int pingpong = cfg->schedule == FM_SCHED_PINGPONG;
    fm_lay p; /* PipelineStorage : aligned_struct<16> { mainloop; epi_load; [math_wg_order;] load_order; } */
    fm_lay_init(&p, 16);
    fm_lay_put(&p, ml_pipeline, 16);
    fm_lay_put(&p, epi->pipeline ? epi->pipeline : 1, 16);
    if (pingpong) fm_lay_put(&p, math_order, 16);
    fm_lay_put(&p, load_order, 16);
    fm_lay t; /* TensorStorage : aligned_struct<128> { epilogue; mainloop; } */
    fm_lay_init(&t, 128);
    fm_lay_put(&t, epi->tensors, epi->tensors_align);
    fm_lay_put(&t, ml_tensors, ml_tensors_align);
    fm_lay k; /* { pipelines; alignas(16) scheduler (an empty class); tensors; } */
    fm_lay_init(&k, 1);
    fm_lay_put(&k, fm_lay_size(&p), 16);
    fm_lay_put(&k, 1, 16);
    fm_lay_put(&k, fm_lay_size(&t), t.align);
    bd->total = fm_lay_size(&k);
    bd->tensormaps = 0;
    bd->scheduler = 1;
    bd->barriers = ml_pipeline + epi->pipeline + load_order + (pingpong ? math_order : 0);
    bd->epi_c = epi->c, bd->epi_d = epi->d, bd->epi_other = epi->fusion;
    bd->epilogue = epi->shared;
    size_t counted = bd->a + bd->b + bd->sf + bd->barriers + bd->epi_c + bd->epi_d + bd->epi_other + bd->scheduler;
    bd->padding = bd->total > counted ? bd->total - counted : 0;
}

void fm_kernel_sm90_array(const fm_kernel_config *cfg, size_t ml_tensors, size_t ml_tensors_align, size_t ml_tmaps,
                          size_t ml_pipeline, const fm_epi_out *epi, fm_smem_breakdown *bd)
{
    fm_lay t; /* TensorStorage : aligned_struct<128> { mainloop; epilogue; } */
    fm_lay_init(&t, 128);
    fm_lay_put(&t, ml_tensors, ml_tensors_align);
    fm_lay_put(&t, epi->tensors, epi->tensors_align);
    size_t tensors = fm_lay_size(&t);

    const size_t sched_pipe = 8 * 16, load_order = 16, math_order = 32, responses = 8 * 16;
    fm_lay p; /* PipelineStorage : aligned_struct<16>, every member alignas(16) */
    fm_lay_init(&p, 16);
    fm_lay_put(&p, sched_pipe, 16);
    fm_lay_put(&p, ml_pipeline, 16);
    fm_lay_put(&p, epi->pipeline ? epi->pipeline : 1, 16);
    fm_lay_put(&p, load_order, 16);
    int pingpong = cfg->schedule == FM_SCHED_PINGPONG;
    if (pingpong) fm_lay_put(&p, math_order, 16);
    size_t pipes = fm_lay_size(&p);

    fm_lay m; /* TensorMapStorage : aligned_struct<128> { alignas(128) mainloop; alignas(128) epilogue; } */
    fm_lay_init(&m, 128);
    fm_lay_put(&m, ml_tmaps, 128);
    fm_lay_put(&m, epi->tmaps ? epi->tmaps : 1, 128);
    size_t tmaps = fm_lay_size(&m);

    fm_lay k;
    fm_lay_init(&k, 1);
    fm_lay_put(&k, tensors, t.align);
    fm_lay_put(&k, pipes, 16);
    fm_lay_put(&k, responses, 16);
    fm_lay_put(&k, tmaps, m.align);
    bd->total = fm_lay_size(&k);
    bd->tensormaps = ml_tmaps + epi->tmaps;
    bd->scheduler = sched_pipe + responses;
    bd->barriers = ml_pipeline + epi->pipeline + load_order + (pingpong ? math_order : 0);
    bd->epi_c = epi->c, bd->epi_d = epi->d, bd->epi_other = epi->fusion;
    bd->epilogue = epi->shared;
    size_t counted = bd->a + bd->b + bd->sf + bd->barriers + bd->epi_c + bd->epi_d + bd->epi_other + bd->tensormaps +
                     bd->scheduler;
    bd->padding = bd->total > counted ? bd->total - counted : 0;
}
