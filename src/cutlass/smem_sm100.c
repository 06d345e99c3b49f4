/* smem_sm100.c - CUTLASS's SM100 (B200/B300) block-scaled grouped GEMM, byte by byte:
 * mainloop, epilogue, kernel SharedStorage and the builder's automatic stage count.
 *
 * Why a separate model: the UMMA kernels keep the accumulator in tensor memory, so
 * their shared storage is laid out differently from the SM90-style kernels that
 * smem_cutlass.c / smem_epilogue.c describe (no alignas(1024) per operand, a
 * cluster-launch-control scheduler, an accumulator pipeline, a 2-SM split).
 *
 * Sources (CUTLASS 4.2 as shipped by PyPI nvidia-cutlass; conformance-checked):
 *  - gemm/collective/builders/sm100_blockscaled_umma_builder.inl, sm100_pipeline_carveout.inl:
 *    per SM the A tile is (M / #SMs) x K, B is (N / #SMs) x K; SFA = M/#SMs rows (whole
 *    128-row blocks) and SFB = N rounded up to 128 (never split), each x K/V one-byte
 *    scales (V = 16 NVFP4, 32 MX); stage = A + B + SFA + SFB + 16 (one PipelineTmaUmmaAsync
 *    stage); auto stages = (232,448 - carveout - epilogue) / stage, carveout =
 *    accumulator pipeline (16 a stage; 1 stage when N = 256, else 2) + CLC fetch pipeline
 *    (128) + load-order barrier (16) + TMEM dealloc barrier (8) + CLC throttle (128) +
 *    8 CLC responses (128) + 8 TMEM base pointers (32) + 4 tensor maps (512).
 *  - gemm/collective/sm100_blockscaled_mma_array_warpspecialized.hpp: SharedStorage =
 *    { TensorStorage (aligned 128) {A; B; SFA; SFB}, TensorMapStorage 4 x 128, pipeline }.
 *  - epilogue/collective/builders/sm100_builder.inl (epilogue tile: an explicit
 *    EpilogueTileType as given (N % 8 asserted), else 128 x 128 for a
 *    256-wide block-scaled tile, else M = min(CTA M, 128) and N from the element widths;
 *    StagesD = min(tiles, 2), StagesC = reuse ? max(min(tiles, 4), StagesD + 1) : min(tiles, 4),
 *    reuse = C wider than 8 bits) and sm100_epilogue_array_tma_warpspecialized.hpp
 *    (C/D union or struct at the swizzle alignment, fusion storage, 2 tensor maps,
 *    a 16-byte load-pipeline stage per C stage); sm100_epilogue_array_nosmem.hpp.
 *  - gemm/kernel/sm100_gemm_array_tma_warpspecialized.hpp: SharedStorage = { pipelines
 *    (every member alignas(16)), 8 CLC responses, tmem base pointer, tensor maps,
 *    tensors { epilogue; mainloop } } - grouped GEMMs get the static group scheduler,
 *    so the CLC pipeline is a PipelineAsync<8> and the throttle pipeline is empty.
 */
#include <string.h>

#include "cutlass/cutlass_models.h"

#define SM100_CAPACITY 232448u /* cutlass::arch::sm100_smem_capacity_bytes */
#define SCHED_STAGES 8         /* grouped GEMM scheduler pipeline depth */
#define TMAP 128u              /* sizeof(cute::TmaDescriptor) */

typedef struct {
    size_t tensors, align;   /* CollectiveEpilogue::TensorStorage and its alignment */
    size_t tmaps, tmaps_al;  /* TensorMapStorage */
    size_t pipeline;         /* load pipeline storage */
    size_t shared;           /* sizeof(CollectiveEpilogue::SharedStorage) */
    size_t c, d, fusion;
} sm100_epi;

/* The 1-SM-per-CTA epilogue the builder derives from the CTA tile (cta_m = MMA M / #SMs). */
static fm_status epilogue_sm100(const fm_kernel_config *cfg, int cta_m, sm100_epi *o)
{
    memset(o, 0, sizeof *o);
    if (cfg->epilogue == FM_EPI_NOSMEM) {
        /* Sm100PtrArrayNoSmem with a non-default fusion: { fusion storage; array_aligned<uint8_t, 0> }
         * = 32 B, reused as TensorMapStorage; the load pipeline has 0 stages (2 empty arrays) */
        o->tensors = 32, o->align = 16, o->tmaps = 32, o->tmaps_al = 16, o->pipeline = 2, o->shared = 32;
        return FM_OK;
    }
    int cn = cfg->tile_n;
    /* FINALIZE (D = void): D is staged as the fusion's bf16 aux element, apart from C, which keeps
     * the reuse stage count; swap-AB writes a column-major view (swizzle along M); the fusion holds
     * the per-column bias (bf16, no swap) or router scale (fp32, swap) of the tile's N
     * (measured: truth-4.7.0.csv SM100 FINALIZE rows) */
    int fin = cfg->epilogue == FM_EPI_FINALIZE;
    int bc = fm_elem_bits(cfg->c), bd = fin ? 16 : fm_elem_bits(cfg->d);
    int src = cfg->c != FM_ELEM_VOID;
    int bce = src ? bc : bd; /* a void C takes D's type in the tile deduction */
    int maxbits = bce > bd ? bce : bd;
    int em = cta_m < 128 ? cta_m : 128; /* 4 TMEM warps x 32 datapaths */
    int en;
    if (cfg->epi_tile_m) { /* an explicit tile is taken as given (sm100_dense_compute_tile_shape_or_override) */
        em = cfg->epi_tile_m, en = cfg->epi_tile_n;
        if (en % 8)
            return fm_fail(FM_ERR_BAD_SHAPE, "rejected at compile time: SM100 epilogue tile N=%d is not a multiple of "
                                             "8 (sm100_builder.inl static_assert: Unsupported tile shape)", en);
        if (em != 64 && em != 128) /* measured: 128 and 64 (a 64-row tile on a 128-row CTA builds) */
            return fm_fail(FM_ERR_UNSUPPORTED, "SM100 epilogue tile M=%d is not modelled (64 and 128 are measured: "
                                               "tests/conformance/truth-epitile-*.csv)", em);
        if (em > cta_m || en > cn)
            return fm_fail(FM_ERR_BAD_SHAPE, "epilogue tile %dx%d is larger than the per-SM tile %dx%d", em, en, cta_m,
                           cn);
    } else if (cn == 256) {
        en = 128; /* block-scaled 256-wide tiles: fixed 128 so the accumulator can overlap */
    } else {
        int nperf;
        if (!src) nperf = (maxbits == 4 ? 8192 : 4096) / em;
        else if (maxbits == 32) nperf = (cta_m > 64 && cn <= 128) ? 16 : 32;
        else if (maxbits == 16) nperf = cn <= 128 ? 32 : 64;
        else nperf = 64;
        int nmin_c = src ? 128 / bc : 8, nmin_d = 128 / bd;
        int n = nperf > nmin_c ? nperf : nmin_c;
        if (nmin_d > n) n = nmin_d;
        en = n < cn ? n : cn;
        if (cn < nmin_c || cn < nmin_d)
            return fm_fail(FM_ERR_BAD_SHAPE, "tile N=%d is under the epilogue's minimum TMA width", cn);
    }
    if (cta_m % em || cn % en)
        return fm_fail(FM_ERR_BAD_SHAPE, "tile %dx%d is not a multiple of the epilogue sub-tile %dx%d", cta_m, cn, em, en);
    int tiles = (cta_m / em) * (cn / en);
    int reuse = bc > 8; /* ReuseSmem = sizeof_bits<C> > 8 (void C: 0) */
    int sd = tiles < 2 ? tiles : 2;
    int t4 = tiles < 4 ? tiles : 4;
    int sc = reuse ? (t4 > sd + 1 ? t4 : sd + 1) : t4;

    size_t cstage = (size_t)em * en * bce / 8, dstage = (size_t)em * en * bd / 8;
    int colmajor = fin && cfg->swap_ab;
    size_t al_c = fm_swizzle_align(colmajor ? em : en, bce), al_d = fm_swizzle_align(colmajor ? em : en, bd);
    fm_lay coll;
    fm_lay_init(&coll, 1);
    if (fin) { /* C (reuse stage count) and the aux D, apart */
        fm_lay_put(&coll, cstage * sc, al_c);
        fm_lay_put(&coll, dstage * sd, al_d);
        o->c = cstage * sc, o->d = dstage * sd;
    } else if (!src) { /* union { array<C, 0>; alignas(AlignD) smem_D[StagesD]; } */
        fm_lay_put(&coll, dstage * sd, al_d);
        o->d = dstage * sd;
    } else if (reuse) { /* union of C and D, StagesC stages of the wider one each */
        size_t m = al_c > al_d ? al_c : al_d, st = cstage > dstage ? cstage : dstage;
        fm_lay_put(&coll, st * sc, m);
        o->c = st * sc;
    } else {
        fm_lay_put(&coll, cstage * sc, al_c);
        fm_lay_put(&coll, dstage * sd, al_d);
        o->c = cstage * sc, o->d = dstage * sd;
    }
    fm_lay t; /* TensorStorage { collective; FusionStorage thread; } (LinearCombination: empty) */
    fm_lay_init(&t, 1);
    fm_lay_put(&t, fm_lay_size(&coll), coll.align);
    size_t fus = fin ? (size_t)cn * (cfg->swap_ab ? 4 : 2) : 0;
    fm_lay_put(&t, fus ? fus : 1, fus ? 16 : 1);
    o->fusion = fus;
    o->tensors = fm_lay_size(&t), o->align = t.align;
    o->tmaps = cfg->plain ? 0 : 2 * TMAP, o->tmaps_al = 128;
    o->pipeline = 16u * (size_t)sc;
    fm_lay s;
    fm_lay_init(&s, 1);
    fm_lay_put(&s, o->tensors, o->align);
    if (o->tmaps) fm_lay_put(&s, o->tmaps, 128);
    fm_lay_put(&s, o->pipeline, 8);
    o->shared = fm_lay_size(&s);
    return FM_OK;
}

fm_status fm_model_cutlass_sm100(const fm_kernel_config *cfg, fm_model_out *o)
{
    int two = cfg->schedule == FM_SCHED_2SM;
    int vec = cfg->a == FM_ELEM_NVFP4 ? 16 : 32;
    int m_sm = cfg->tile_m / (two ? 2 : 1), n_sm = cfg->tile_n / (two ? 2 : 1);
    /* MXF8F6F4 (an FP8 operand): both operands in 8-bit containers (measured: truth-4.7.0.csv) */
    int bits = (cfg->a == FM_ELEM_FP8 || cfg->b == FM_ELEM_FP8) ? 8 : 4;
    size_t a = (size_t)m_sm * cfg->tile_k * bits / 8, b = (size_t)n_sm * cfg->tile_k * bits / 8;
    size_t sfk = (size_t)cfg->tile_k / vec;
    size_t sfa = (size_t)(m_sm / 128) * 128 * sfk, sfb = (size_t)((cfg->tile_n + 127) / 128) * 128 * sfk;

    sm100_epi epi;
    FM_CHECK(epilogue_sm100(cfg, m_sm, &epi));
    int acc_stages = cfg->tile_n == 256 ? 1 : 2;
    /* 4.4+: the grouped kernel updates tensor maps asynchronously (4 updater warps): 5 copies of the
     * tensor maps, 2 x 8 scheduler responses with 4 more bytes each, a tensor-map-ready pipeline;
     * the builder's carve-out counts 2 CLC pipelines and 2 x 8 responses, 5 x 4 tensor maps and
     * that pipeline (sm100_pipeline_carveout.inl) */
    /* plain (one GEMM): the CLC dynamic scheduler with 2 stages, a PipelineAsync<2> throttle, one set
     * of responses, no tensor maps in shared memory (sm100_gemm_tma_warpspecialized.hpp) */
    int plain = cfg->plain;
    int async = !plain && cfg->cutlass >= 440;
    size_t sched = plain ? 2 : SCHED_STAGES;
    size_t ntm = plain ? 0 : async ? 5 : 1, nresp = async ? 2 : 1;
    size_t carve = 16u * acc_stages + 16 * sched * nresp + 16 + 8 + 16 * sched + 16 * sched * nresp + 4 * sched +
                   4 * TMAP * ntm + (async ? 16 * sched : 0);
    o->stage_bytes = a + b + sfa + sfb + (cfg->cutlass >= 440 ? 128 : 16); /* the barrier, 128 B since 4.4 */
    o->capacity = SM100_CAPACITY - carve;
    o->carveout = epi.shared;
    o->auto_stages = o->capacity > epi.shared ? (int)((o->capacity - epi.shared) / o->stage_bytes) : 0;
    o->min_stages = 1; /* the builder only asserts PipelineStages > 0 */
    int S = cfg->stages ? cfg->stages : (o->auto_stages < 1 ? 1 : o->auto_stages);

    fm_lay t; /* mainloop TensorStorage : aligned_struct<128> */
    fm_lay_init(&t, 128);
    fm_lay_put(&t, a * S, 16);
    fm_lay_put(&t, b * S, 16);
    fm_lay_put(&t, sfa * S, 16);
    fm_lay_put(&t, sfb * S, 16);
    size_t ml_tensors = fm_lay_size(&t), ml_tmaps = 4 * TMAP, ml_pipe = 16u * (size_t)S;
    fm_lay ml;
    fm_lay_init(&ml, 1);
    fm_lay_put(&ml, ml_tensors, 128);
    if (plain) ml_tmaps = 0;
    else fm_lay_put(&ml, ml_tmaps, 128);
    fm_lay_put(&ml, ml_pipe, 8);

    fm_lay p; /* PipelineStorage : aligned_struct<16>, every member alignas(16) */
    fm_lay_init(&p, 16);
    const size_t load_order = 16, clc = 16 * sched, acc = 16u * acc_stages, throttle = plain ? 16 * sched : 1,
                 dealloc = 8;
    fm_lay_put(&p, ml_pipe, 16);
    fm_lay_put(&p, epi.pipeline, 16);
    fm_lay_put(&p, load_order, 16);
    fm_lay_put(&p, clc, 16);
    fm_lay_put(&p, acc, 16);
    fm_lay_put(&p, throttle, 16);
    fm_lay_put(&p, dealloc, 16);
    const size_t tmap_ready = async ? 16 * SCHED_STAGES : 0; /* PipelineAsync<8> */
    if (async) fm_lay_put(&p, tmap_ready, 16);
    fm_lay m; /* TensorMapStorage : aligned_struct<128> { alignas(128) epilogue; alignas(128) mainloop; } */
    fm_lay_init(&m, 128);
    fm_lay_put(&m, epi.tmaps, 128);
    fm_lay_put(&m, ml_tmaps, 128);
    fm_lay tt; /* TensorStorage : aligned_struct<128> { epilogue; mainloop; } */
    fm_lay_init(&tt, 128);
    fm_lay_put(&tt, epi.tensors, epi.align);
    fm_lay_put(&tt, ml_tensors, 128);
    /* CLC responses: 16 B (WorkTileInfo); with async updates 2 x 8 of 20 B (+ batch_changed, TMA_stage) */
    const size_t responses = async ? 2 * SCHED_STAGES * 20 : 16 * sched;
    fm_lay k;
    fm_lay_init(&k, 1);
    fm_lay_put(&k, fm_lay_size(&p), 16);
    fm_lay_put(&k, responses, 16);
    fm_lay_put(&k, 4, 4); /* tmem_base_ptr */
    if (ntm) fm_lay_put(&k, fm_lay_size(&m) * ntm, m.align); /* TensorMapStorage tensormaps[ntm] */
    fm_lay_put(&k, fm_lay_size(&tt), tt.align);

    fm_smem_breakdown *bd = &o->bd;
    memset(bd, 0, sizeof *bd);
    bd->stages = S;
    bd->a = a * S, bd->b = b * S, bd->sf = (sfa + sfb) * S;
    bd->mainloop = fm_lay_size(&ml);
    bd->epi_c = epi.c, bd->epi_d = epi.d, bd->epi_other = epi.fusion;
    bd->epilogue = epi.shared;
    bd->tensormaps = (ml_tmaps + (cfg->epilogue == FM_EPI_NOSMEM ? 0 : epi.tmaps)) * ntm;
    bd->scheduler = clc + throttle + responses;
    bd->barriers = ml_pipe + epi.pipeline + load_order + acc + dealloc + tmap_ready;
    bd->total = fm_lay_size(&k);
    size_t counted = bd->a + bd->b + bd->sf + bd->barriers + bd->epi_c + bd->epi_d + bd->epi_other + bd->tensormaps +
                     bd->scheduler;
    bd->padding = bd->total > counted ? bd->total - counted : 0;
    return FM_OK;
}
