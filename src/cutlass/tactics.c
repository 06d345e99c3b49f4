/* tactics.c - the serving engines' MoE grouped-GEMM tactic lists as data, each row read
 * from the engine's source at the named commit, and their verdict on a GPU.
 *
 * Tile units: TensorRT-LLM / FlashInfer name tiles CtaShapeMxNxKB with K in BYTES of the
 * FP4 operand (128x256x64B = 128 x 256 x 128 elements); SM100 "2-SM" configurations use
 * the per-CTA shape with a 2x1 cluster, so the MMA tile here is twice M.  A row is one
 * kernel: FC1 (gate/up) runs the plain TMA epilogue (C = D = bf16), FC2 (down) the
 * FINALIZE fusion where the engine fuses the scatter (D = void).
 * The CUTLASS version of a row is the one the engine build in the field used (cfg.cutlass);
 * the verdict is fm_plan_check's for it.
 */
#include <stdio.h>
#include <string.h>

#include "fm_internal.h"
#include "fp4moe/tactics.h"

#define TRT_SRC "cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp"
#define TRT_SHA "9beec905974719a2e6901af7a39bd48c81498a53"
#define FI_SRC "csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp"
#define FI_SHA "d027074adc916e7a2e29cfc2750db9b680ddda92"
#define SGL_SRC "sgl-kernel/csrc/moe/nvfp4_blockwise_moe.cu"
#define SGL_SHA "414c210f4e3183dc3ec6036318ef70b5c571b24d"
#define VLLM_SRC "csrc/quantization/fp4/nvfp4_blockwise_moe_kernel.cu"
#define VLLM_SHA "0529feb873d5d1545a33b91142ad4fc768166b92"
/* FlashInfer's newest row set: the same heuristic file at fb28d724 (2026-08-22), which pins
 * CUTLASS b46b16d0 (3rdparty/cutlass submodule; version.h 4.5.0, measured identical to v4.5.3:
 * tests/conformance/truth-4.5.0+main-b46b16d.csv). d027074a pins CUTLASS f3fde583 = v4.2.1, whose
 * include/ differs from v4.2.0 only in SM100 blockwise no-smem schedules (none of these rows). */
#define FI2_SHA "fb28d7242b3506a2348265962041acc1fb56cca4"
#define FI_CUT 421
#define FI2_CUT 450
/* Swap-AB and FINALIZE rows follow FlashInfer's
 * csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_template_dispatch.h
 * (getTmaWarpSpecializedConfigs, same at d027074a and fb28d724): every heuristic config is duplicated
 * with the FINALIZE fusion (dropped for a NO_SMEM epilogue), then every config with swap_ab = true;
 * moe_gemm_template_dispatch_tma_ws.h sends SM100 block-scaled and FINALIZE kernels to
 * PtrArrayTmaWarpSpecialized (the TMA epilogue). FC1 runs the NONE fusion, FC2 FINALIZE. */

/* kernel configurations: a, b, c, d, tile, cluster, schedule, epilogue, stages, swap, CUTLASS */
#define KC(A, B, C, D, M, N, K, CM, CN, S, E, CUT, SWP)                                                                \
    {.a = FM_ELEM_##A, .b = FM_ELEM_##B, .c = FM_ELEM_##C, .d = FM_ELEM_##D, .tile_m = M, .tile_n = N, .tile_k = K, \
     .cluster_m = CM, .cluster_n = CN, .schedule = FM_SCHED_##S, .epilogue = FM_EPI_##E, .swap_ab = SWP, .cutlass = CUT}
#define FC1(A, B, M, N, K, CM, S, CUT) KC(A, B, BF16, BF16, M, N, K, CM, 1, S, TMA, CUT, 0)
/* ... with an explicit epilogue tile EM x EN (the epilogue builder's EpilogueTileType) */
#define FC1E(A, B, M, N, K, CM, S, CUT, EM, EN)                                                                        \
    {.a = FM_ELEM_##A, .b = FM_ELEM_##B, .c = FM_ELEM_BF16, .d = FM_ELEM_BF16, .tile_m = M, .tile_n = N, .tile_k = K, \
     .cluster_m = CM, .cluster_n = 1, .schedule = FM_SCHED_##S, .epilogue = FM_EPI_TMA, .cutlass = CUT,              \
     .epi_tile_m = EM, .epi_tile_n = EN}
#define FC2(A, B, M, N, K, CM, S, CUT) KC(A, B, BF16, VOID, M, N, K, CM, 1, S, FINALIZE, CUT, 0)
#define FC1X(M, N, K, CM, S, CUT, SWP) KC(NVFP4, NVFP4, BF16, BF16, M, N, K, CM, 1, S, TMA, CUT, SWP)
#define FC2X(M, N, K, CM, S, CUT, SWP) KC(NVFP4, NVFP4, BF16, VOID, M, N, K, CM, 1, S, FINALIZE, CUT, SWP)

#define TRT120(G, CFG, NOTE) {"trtllm", TRT_SHA, TRT_SRC, TRT_SHA, G, 120, 121, "nvfp4", CFG, NOTE}
#define TRT100(G, CFG, NOTE) {"trtllm", TRT_SHA, TRT_SRC, TRT_SHA, G, 100, 103, "nvfp4", CFG, NOTE}
/* one heuristic tile of a FlashInfer row set: FC1 (NONE fusion) and FC2 (FINALIZE), each plain and swap-AB */
#define FIROWS(SHA, LO, HI, M, N, K, CM, S, CUT, NOTE)                                                                 \
    {"flashinfer", SHA, FI_SRC, SHA, "fc1", LO, HI, "nvfp4", FC1X(M, N, K, CM, S, CUT, 0), NOTE},                      \
    {"flashinfer", SHA, FI_SRC, SHA, "fc1", LO, HI, "nvfp4", FC1X(M, N, K, CM, S, CUT, 1), NOTE ", swap-AB"},          \
    {"flashinfer", SHA, FI_SRC, SHA, "fc2", LO, HI, "nvfp4", FC2X(M, N, K, CM, S, CUT, 0), NOTE ", fused finalize"},   \
    {"flashinfer", SHA, FI_SRC, SHA, "fc2", LO, HI, "nvfp4", FC2X(M, N, K, CM, S, CUT, 1),                             \
     NOTE ", fused finalize, swap-AB"}
#define SEED_CUT 420 /* the field deployment's CUTLASS (background: the 4.2 builder's stage count) */

static const fm_tactic k_tactics[] = {
    /* TensorRT-LLM get_candidate_configs_sm120, GROUPED_GEMM + FP4_ONLY: four tiles, 1x1x1 */
    TRT120("fc1", FC1(NVFP4, NVFP4, 128, 128, 256, 1, COOP, SEED_CUT), "CtaShape128x128x128B"),
    TRT120("fc1", FC1(NVFP4, NVFP4, 128, 128, 128, 1, COOP, SEED_CUT), "CtaShape128x128x64B"),
    TRT120("fc1", FC1(NVFP4, NVFP4, 128, 256, 128, 1, COOP, SEED_CUT), "CtaShape128x256x64B"),
    TRT120("fc1", FC1(NVFP4, NVFP4, 256, 128, 128, 1, COOP, SEED_CUT), "CtaShape256x128x64B"),
    TRT120("fc2", FC2(NVFP4, NVFP4, 128, 128, 256, 1, COOP, SEED_CUT), "CtaShape128x128x128B, fused finalize"),
    TRT120("fc2", FC2(NVFP4, NVFP4, 128, 128, 128, 1, COOP, SEED_CUT), "CtaShape128x128x64B, fused finalize"),
    TRT120("fc2", FC2(NVFP4, NVFP4, 128, 256, 128, 1, COOP, SEED_CUT), "CtaShape128x256x64B, fused finalize"),
    TRT120("fc2", FC2(NVFP4, NVFP4, 256, 128, 128, 1, COOP, SEED_CUT), "CtaShape256x128x64B, fused finalize"),
    /* ... + FP8FP4_MIXED (MXFP8 activations x MXFP4 weights): 128x128x128B only */
    {"trtllm", TRT_SHA, TRT_SRC, TRT_SHA, "fc1", 120, 121, "fp8xfp4", FC1(FP8, MXFP4, 128, 128, 128, 1, COOP, SEED_CUT),
     "CtaShape128x128x128B (K in bytes of the FP8 operand)"},
    {"trtllm", TRT_SHA, TRT_SRC, TRT_SHA, "fc2", 120, 121, "fp8xfp4", FC2(FP8, MXFP4, 128, 128, 128, 1, COOP, SEED_CUT),
     "CtaShape128x128x128B, fused finalize"},
    /* get_candidate_configs_sm100_dynamic_cluster_shape, FP4_ONLY, TMA epilogue (sm 100: 128x64 too);
     * cluster2sm = 2x1x1: the MMA tile is 2 x the CTA shape's M */
    TRT100("fc1", FC1(NVFP4, NVFP4, 128, 64, 256, 1, 1SM, SEED_CUT), "CtaShape128x64x128B, 1 SM"),
    TRT100("fc1", FC1(NVFP4, NVFP4, 256, 64, 256, 2, 2SM, SEED_CUT), "CtaShape128x64x128B, 2 SM"),
    TRT100("fc1", FC1(NVFP4, NVFP4, 128, 128, 256, 1, 1SM, SEED_CUT), "CtaShape128x128x128B, 1 SM"),
    TRT100("fc1", FC1(NVFP4, NVFP4, 128, 256, 256, 1, 1SM, SEED_CUT), "CtaShape128x256x128B, 1 SM"),
    TRT100("fc1", FC1(NVFP4, NVFP4, 256, 128, 256, 2, 2SM, SEED_CUT), "CtaShape128x128x128B, 2 SM"),
    TRT100("fc1", FC1(NVFP4, NVFP4, 256, 256, 256, 2, 2SM, SEED_CUT), "CtaShape128x256x128B, 2 SM"),
    /* FlashInfer @ fb28d724 (its newest row set, listed first; CUTLASS b46b16d0 = 4.5): get_candidate_configs_sm120
     * FP4: all_tiles[] (10), of which the grouped dispatch (SHAPE_CASE 120 in moe_gemm_template_dispatch_tma_ws.h,
     * are_tile_shapes_supported_sm120) builds 8 - CtaShape128x128x256B and 256x128x128B throw and are skipped */
    FIROWS(FI2_SHA, 120, 121, 128, 128, 256, 1, COOP, FI2_CUT, "CtaShape128x128x128B"),
    FIROWS(FI2_SHA, 120, 121, 128, 128, 128, 1, COOP, FI2_CUT, "CtaShape128x128x64B"),
    FIROWS(FI2_SHA, 120, 121, 256, 128, 128, 1, COOP, FI2_CUT, "CtaShape256x128x64B"),
    FIROWS(FI2_SHA, 120, 121, 128, 256, 128, 1, COOP, FI2_CUT, "CtaShape128x256x64B"),
    FIROWS(FI2_SHA, 120, 121, 128, 32, 256, 1, COOP, FI2_CUT, "CtaShape128x32x128B"),
    FIROWS(FI2_SHA, 120, 121, 128, 32, 128, 1, COOP, FI2_CUT, "CtaShape128x32x64B"),
    FIROWS(FI2_SHA, 120, 121, 128, 64, 256, 1, COOP, FI2_CUT, "CtaShape128x64x128B"),
    FIROWS(FI2_SHA, 120, 121, 128, 64, 128, 1, COOP, FI2_CUT, "CtaShape128x64x64B"),
    /* get_candidate_configs_sm100_dynamic_cluster_shape FP4 (= TensorRT-LLM's): the runtime cluster shapes
     * (1x1, 4x1, 4x2, none) share these kernels' static 1x1 / 2x1 clusters */
    FIROWS(FI2_SHA, 100, 103, 128, 64, 256, 1, 1SM, FI2_CUT, "CtaShape128x64x128B, 1 SM"),
    FIROWS(FI2_SHA, 100, 103, 256, 64, 256, 2, 2SM, FI2_CUT, "CtaShape128x64x128B, 2 SM"),
    FIROWS(FI2_SHA, 100, 103, 128, 128, 256, 1, 1SM, FI2_CUT, "CtaShape128x128x128B, 1 SM"),
    FIROWS(FI2_SHA, 100, 103, 128, 256, 256, 1, 1SM, FI2_CUT, "CtaShape128x256x128B, 1 SM"),
    FIROWS(FI2_SHA, 100, 103, 256, 128, 256, 2, 2SM, FI2_CUT, "CtaShape128x128x128B, 2 SM"),
    FIROWS(FI2_SHA, 100, 103, 256, 256, 256, 2, 2SM, FI2_CUT, "CtaShape128x256x128B, 2 SM"),
    /* FlashInfer @ d027074a (CUTLASS v4.2.1): the four SM120 FP4 tiles of TensorRT-LLM's list (no SM120
     * FP8 x FP4), and the same SM100 list */
    FIROWS(FI_SHA, 120, 121, 128, 128, 256, 1, COOP, FI_CUT, "CtaShape128x128x128B"),
    FIROWS(FI_SHA, 120, 121, 128, 128, 128, 1, COOP, FI_CUT, "CtaShape128x128x64B"),
    FIROWS(FI_SHA, 120, 121, 128, 256, 128, 1, COOP, FI_CUT, "CtaShape128x256x64B"),
    FIROWS(FI_SHA, 120, 121, 256, 128, 128, 1, COOP, FI_CUT, "CtaShape256x128x64B"),
    FIROWS(FI_SHA, 100, 103, 128, 64, 256, 1, 1SM, FI_CUT, "CtaShape128x64x128B, 1 SM"),
    FIROWS(FI_SHA, 100, 103, 256, 64, 256, 2, 2SM, FI_CUT, "CtaShape128x64x128B, 2 SM"),
    FIROWS(FI_SHA, 100, 103, 128, 128, 256, 1, 1SM, FI_CUT, "CtaShape128x128x128B, 1 SM"),
    FIROWS(FI_SHA, 100, 103, 128, 256, 256, 1, 1SM, FI_CUT, "CtaShape128x256x128B, 1 SM"),
    FIROWS(FI_SHA, 100, 103, 256, 128, 256, 2, 2SM, FI_CUT, "CtaShape128x128x128B, 2 SM"),
    FIROWS(FI_SHA, 100, 103, 256, 256, 256, 2, 2SM, FI_CUT, "CtaShape128x256x128B, 2 SM"),
    /* SGLang's own cutlass_moe_fp4 (sgl-kernel): one tile per arch, both GEMMs, C = D = bf16 */
    {"sglang", SGL_SHA, SGL_SRC, SGL_SHA, "fc1+fc2", 120, 121, "nvfp4",
     FC1(NVFP4, NVFP4, 128, 128, 128, 1, PINGPONG, SEED_CUT),
     "run_fp4_blockwise_scaled_group_mm_sm120: Shape<_128,_128,_128>, KernelPtrArrayTmaWarpSpecializedPingpong, "
     "EpilogueScheduleAuto (2 epilogue warp groups = PtrArrayTmaWarpSpecializedPingpong); CUTLASS 57e3cfb4 "
     "(sgl-kernel/CMakeLists.txt @ 00390b86; include/ = v4.2.0)"},
    {"sglang", SGL_SHA, SGL_SRC, SGL_SHA, "fc1+fc2", 100, 103, "nvfp4",
     FC1E(NVFP4, NVFP4, 128, 128, 128, 1, 1SM, SEED_CUT, 128, 64),
     "run_fp4_blockwise_scaled_group_mm_sm100: 128x128x128, 1 SM, epilogue tile Shape<_128,_64> given (measured "
     "218,112 B, 9 stages on v4.2.0: tests/conformance/truth-epitile-4.2.0.csv; the automatic 128x32 would be "
     "219,136 B, 10 stages); CUTLASS 57e3cfb4 (= v4.2.0 include/)"},
    /* vLLM's cutlass_fp4_group_mm: the same single tile */
    {"vllm", VLLM_SHA, VLLM_SRC, VLLM_SHA, "fc1+fc2", 100, 103, "nvfp4",
     FC1E(NVFP4, NVFP4, 128, 128, 128, 1, 1SM, SEED_CUT, 128, 64),
     "MMA1SMConfig: 128x128x128, KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100, epilogue tile Shape<_128,_64> given "
     "(measured 218,112 B on v4.2.0, 221,184 B on v4.4.2, 9 stages: truth-epitile-*.csv; the automatic 128x32 "
     "would be 10 stages); "
     "CMakeLists.txt CUTLASS_REVISION v4.4.2 @ 000a1ee9 (not read at this row's commit: the row keeps 4.2, "
     "--cutlass 4.4 checks it under the pin)"},
};

size_t fm_tactic_count(void) { return sizeof k_tactics / sizeof k_tactics[0]; }

const fm_tactic *fm_tactic_at(size_t i) { return i < fm_tactic_count() ? &k_tactics[i] : NULL; }

const char *fm_tactic_verdict_name(fm_tactic_verdict v)
{
    static const char *const n[FM_TACTIC_VERDICT_COUNT] = {"fits", "dies in initialize()", "too big",
                                                            "rejected at compile time"};
    return (unsigned)v < FM_TACTIC_VERDICT_COUNT ? n[v] : "?";
}

static const char *const k_engines[] = {"trtllm", "flashinfer", "sglang", "vllm"};
static const char *const k_formats[] = {"nvfp4", "mxfp4", "fp8xfp4"};

static void verdict(const fm_tactic *t, const fm_gpu_info *g, fm_tactic_check *o)
{
    memset(o, 0, sizeof *o);
    o->tactic = t;
    fm_kernel_config c = t->cfg;
    c.cc = g->cc;
    fm_status st = fm_plan_check(&c, 0, 0, 0, 0, g->sms, &o->res);
    if (st != FM_OK) { /* the configuration itself is refused: what CUTLASS does at compile time */
        o->verdict = FM_TACTIC_COMPILE_REJECT;
        snprintf(o->why, sizeof o->why, "%s", fm_last_error());
        snprintf(o->fix, sizeof o->fix, "drop the tactic from the engine's list");
        fm_clear_error();
        return;
    }
    const fm_plan_result *r = &o->res;
    if (r->fits) {
        o->verdict = FM_TACTIC_FITS;
        snprintf(o->why, sizeof o->why, "%zu B with %d stages <= %zu B", r->bytes.total, r->bytes.stages,
                 r->limit_bytes);
        return;
    }
    o->verdict = c.stages == 0 && r->builder_fits ? FM_TACTIC_DIES_INIT : FM_TACTIC_TOO_BIG;
    if (o->verdict == FM_TACTIC_DIES_INIT)
        snprintf(o->why, sizeof o->why,
                 "StageCountAutoCarveout picks %d stages (the builder counted %zu B); sizeof(SharedStorage) = %zu B > "
                 "%zu B opt-in: cudaFuncSetAttribute fails in initialize() -> kErrorInternal; can_implement() "
                 "never checks shared memory",
                 r->bytes.stages, r->builder_bytes, r->bytes.total, r->limit_bytes);
    else
        snprintf(o->why, sizeof o->why, "%zu B with %d stages > %zu B opt-in", r->bytes.total, r->bytes.stages,
                 r->limit_bytes);
    if (r->best_stages)
        snprintf(o->fix, sizeof o->fix, "StageCount<%d> instead of StageCountAutoCarveout: %zu B", r->best_stages,
                 r->best_bytes);
    else
        snprintf(o->fix, sizeof o->fix, "no stage count fits: drop the tile (or a smaller K tile)");
}

static fm_status unknown(const char *what, const char *got, const char *const *names, size_t n)
{
    char list[200] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    return fm_fail(FM_ERR_UNSUPPORTED, "unknown %s '%s': known %s", what, got, list);
}

fm_status fm_tactics_check(const char *engine, const char *version, const char *gpu, const char *format,
                           fm_tactic_check *out, size_t cap, size_t *count, size_t *total)
{
    fm_clear_error();
    if (!engine || !gpu || !format || !count || (cap && !out))
        return fm_fail(FM_ERR_INVALID_ARG, "fm_tactics_check: NULL argument");
    size_t ne = sizeof k_engines / sizeof *k_engines, nf = sizeof k_formats / sizeof *k_formats, i;
    for (i = 0; i < ne && strcmp(engine, k_engines[i]); i++) {}
    if (i == ne) return unknown("engine", engine, k_engines, ne);
    for (i = 0; i < nf && strcmp(format, k_formats[i]); i++) {}
    if (i == nf) return unknown("format", format, k_formats, nf);
    const fm_gpu_info *g = NULL;
    if (fm_gpu_find(gpu, &g) != FM_OK) {
        const char *names[32];
        size_t n = 0;
        for (; n < fm_gpu_count() && n < 32; n++) names[n] = fm_gpu_at(n)->name;
        fm_clear_error();
        return unknown("GPU", gpu, names, n);
    }
    const char *vers[8];
    size_t nv = 0, any_engine_arch = 0;
    for (i = 0; i < fm_tactic_count(); i++) {
        const fm_tactic *t = &k_tactics[i];
        if (strcmp(t->engine, engine)) continue;
        size_t j;
        for (j = 0; j < nv && strcmp(vers[j], t->version); j++) {}
        if (j == nv && nv < 8) vers[nv++] = t->version;
    }
    if (version && *version) {
        size_t j;
        for (j = 0; j < nv && strncmp(vers[j], version, strlen(version)); j++) {}
        if (j == nv || strlen(version) < 7) return unknown("engine version", version, vers, nv);
    } else if (nv) /* no version asked: the engine's newest row set, the first one listed */
        version = vers[0];
    size_t n = 0, w = 0;
    for (i = 0; i < fm_tactic_count(); i++) {
        const fm_tactic *t = &k_tactics[i];
        if (strcmp(t->engine, engine) || g->cc < t->cc_lo || g->cc > t->cc_hi) continue;
        if (version && *version && strncmp(t->version, version, strlen(version))) continue;
        any_engine_arch++;
        if (strcmp(t->format, format)) continue;
        if (w < cap) verdict(t, g, &out[w++]);
        n++;
    }
    if (!n)
        return fm_fail(FM_ERR_UNSUPPORTED, "%s has no %s MoE grouped-GEMM tactic for %s (sm_%d)%s", engine, format,
                       g->name, g->cc,
                       any_engine_arch ? " (it has tactics for other formats there)"
                                       : ": none for that architecture in the table");
    *count = w;
    if (total) *total = n;
    return FM_OK;
}

fm_status fm_tactics_recheck(const fm_gpu_info *gpu, const fm_tactic *tactics, fm_tactic_check *out, size_t n)
{
    fm_clear_error();
    if (!gpu || (n && (!tactics || !out))) return fm_fail(FM_ERR_INVALID_ARG, "fm_tactics_recheck: NULL argument");
    for (size_t i = 0; i < n; i++) verdict(&tactics[i], gpu, &out[i]);
    return FM_OK;
}
