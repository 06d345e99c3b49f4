/* fp4moe/plan.h - the shared-memory planner: exact bytes of a GPU GEMM tile, a
 * truthful can-it-run check, and ranked candidates.
 *
 * The model reproduces sizeof(GemmKernel::SharedStorage) of CUTLASS's grouped
 * (ptr-array) kernels member by member - including the alignas(1024) padding,
 * tensor maps and scheduler storage that CUTLASS's automatic stage count leaves
 * out - and the stage count each CollectiveBuilder picks.  See docs/planner.md.
 *
 * What FM_OK + result.fits == 1 guarantees: the kernel's static shared storage
 * (what GemmUniversalAdapter::initialize() passes to cudaFuncSetAttribute) is at
 * most the architecture's opt-in per-block limit, so initialize() will not fail
 * for shared memory. It says nothing about registers, occupancy or speed.
 *
 * A tool (fp4moe/tools.h), not part of the runtime: fp4moe's own tiles, families and
 * the ranking the launcher runs are fp4moe/kernels.h, which this header includes.
 */
#ifndef FP4MOE_PLAN_H
#define FP4MOE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "fp4moe/arch.h"
#include "fp4moe/kernels.h"
#include "fp4moe/smem.h"
#include "fp4moe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A set of families for fm_plan_candidates_in: FM_FAMILY_BIT(f) | ...; 0 = all. */
#define FM_FAMILY_BIT(f) (1u << (unsigned)(f))
#define FM_FAMILIES_CUTLASS                                                                       \
    (FM_FAMILY_BIT(FM_FAMILY_CUTLASS_SM90) | FM_FAMILY_BIT(FM_FAMILY_CUTLASS_SM120) |             \
     FM_FAMILY_BIT(FM_FAMILY_CUTLASS_SM100))

typedef enum { FM_SCHED_AUTO = 0, FM_SCHED_COOP, FM_SCHED_PINGPONG, FM_SCHED_1SM, FM_SCHED_2SM, FM_SCHED_COUNT } fm_schedule;

/* The epilogue's shared-memory kind, for the planner's byte model: how CUTLASS's
 * epilogue collective stores D (it changes the SharedStorage). Not the same concept as
 * fm_cuda_epilogue (fp4moe/cuda.h), the operation fp4moe's own kernels apply to the
 * output (plain, SwiGLU, router-weighted scatter-add): those kernels' bytes do not
 * depend on it (their output leaves from registers or the drained stages), and a
 * CUTLASS FINALIZE here is TensorRT-LLM's fused scatter, which fp4moe runs as
 * FM_CUDA_EPI_FINALIZE(_DET). Two enums, two questions. */
typedef enum {
    FM_EPI_TMA = 0,  /* CUTLASS TMA warp-specialized epilogue (TensorRT-LLM "default": C smem reused for D) */
    FM_EPI_NOSMEM,   /* no shared memory: registers straight to global */
    FM_EPI_FINALIZE, /* TensorRT-LLM FINALIZE: router-scale + scatter-add in the TMA epilogue, D = void */
    FM_EPI_COUNT
} fm_epilogue;

/* One kernel configuration: everything that changes the bytes.
 * For FM_FAMILY_FP4MOE_MMA the tile reads: tile_m = tokens per pass (8*nt),
 * tile_n = output features per CTA (warps*mt*16), tile_k = K per stage (kc),
 * `warps` warps per CTA (0 = 4); the CUTLASS-only fields (c, d, schedule, cluster,
 * cutlass) do not change its bytes: its epilogue (plain store, SwiGLU or FINALIZE)
 * goes from registers to global memory.
 * FM_FAMILY_FP4MOE_WGMMA reads the tile the same way (tile_m = 8*nt tokens a pass,
 * 8..256; tile_n = warps*mt*16 with mt 1 or 2; tile_k = kc, 64..256), `warps` 4 or 8
 * (one or two warpgroups; 0 = 8); it exists only where the architecture has
 * FM_FEAT_WGMMA (sm_90), anywhere else FM_ERR_ARCH_MISMATCH. */
typedef struct {
    int              cc;          /* target architecture (90, 120, ...) */
    fm_kernel_family family;      /* FM_FAMILY_AUTO picks from cc */
    fm_elem          a, b;        /* operand element types */
    fm_elem          c, d;        /* epilogue source / destination */
    int              tile_m, tile_n, tile_k;
    int              cluster_m, cluster_n; /* 0 = 1 */
    fm_schedule      schedule;
    fm_epilogue      epilogue;
    int              stages;      /* 0 = automatic (StageCountAutoCarveout of the epilogue) */
    int              swap_ab;     /* TensorRT-LLM swap-AB variant (only FINALIZE bytes depend on it) */
    int              cutlass;     /* CUTLASS version: major * 100 + minor * 10 + patch (4.7.0 = 470); 0 = 420.
                                     The bytes follow the version: 4.2, 4.4, 4.5, 4.7 are checked against
                                     measured CUTLASS trees (tests/conformance/truth-*.csv), exact */
    int              warps;       /* fp4moe kernels: warps per CTA (0 = the family's default: mma 4, wgmma 8) */
    int              persistent;  /* fp4moe-wgmma: the persistent kernel (one CTA per SM over the tiles, its
                                     own output buffer in shared memory); 0 elsewhere */
    int              plain;       /* CUTLASS families: 1 = one GEMM (the non-ptr-array kernel: no tensor maps
                                     in shared memory, the persistent tile scheduler), 0 = grouped (ptr-array,
                                     what MoE engines run) */
    int              epi_tile_m, epi_tile_n; /* CUTLASS families: an explicit epilogue tile (the epilogue
                                     CollectiveBuilder's EpilogueTileType = Shape<_M,_N>, as SGLang's and vLLM's
                                     SM100 FP4 kernels pass 128x64); 0x0 = EpilogueTileAuto (the builder's own).
                                     The builders take it as given, so it sets the epilogue's sub-tile count, its
                                     C/D stages and through them the mainloop's automatic stage count; each
                                     builder's static_asserts on it are checked (docs/planner.md) */
} fm_kernel_config;

/* The newest CUTLASS version measured (tests/conformance/truth-*.csv): `fp4moe explain`'s default. */
#define FM_CUTLASS_NEWEST 470

/* Fill a config with the defaults: BF16 C/D, TMA epilogue, auto stages, CUTLASS 4.2.
 * For FM_FAMILY_FP4MOE_MMA and _WGMMA, stages = 0 means "the stage count of the
 * first compiled instantiation of that tile shape" (fm_mma_tiles / fm_wgmma_tiles
 * order). */
void fm_kernel_config_init(fm_kernel_config *cfg);

/* Shared-memory model: the breakdown and total of one configuration on the
 * architecture `cc` (validated).  `stages` in the breakdown is the stage count
 * the kernel gets (cfg->stages or the builder's automatic choice).
 * Returns FM_OK, FM_ERR_INVALID_ARG (NULL), FM_ERR_NOT_FOUND (unknown cc),
 * FM_ERR_BAD_SHAPE (malformed tile/cluster/stages), FM_ERR_ARCH_MISMATCH (format or
 * family not available on that arch), FM_ERR_UNSUPPORTED (combination not modelled). */
fm_status fm_smem_model(const fm_kernel_config *cfg, fm_smem_breakdown *out);

/* Verdict of fm_plan_check. */
typedef struct {
    int                fits;           /* 1: total <= limit_bytes */
    fm_smem_breakdown  bytes;          /* the real struct, broken down */
    size_t             limit_bytes;    /* opt-in per-block limit of the arch */
    int                auto_stages;    /* what the builder's arithmetic picks (0 if it finds none) */
    size_t             builder_bytes;  /* what that arithmetic believes the kernel needs */
    int                builder_fits;   /* 1: builder_bytes <= capacity (what can_implement implies) */
    int                best_stages;    /* most stages that really fit (0: none do) */
    size_t             best_bytes;     /* total with best_stages */
    int64_t            tiles;          /* CTA tiles of the problem (0 if no problem was given) */
    double             waves;          /* tiles / SMs (0 if unknown) */
    char               reason[320];    /* one line: why it fits or not, and the fix */
} fm_plan_result;

/* The truthful check.  Return value: whether the query itself worked.
 * `problem_*` may be 0 (unknown); sms = 0 skips waves.  k must be a multiple of
 * tile_k when given.  Statuses as fm_smem_model plus FM_ERR_BAD_SHAPE for a K
 * that is not a multiple of tile_k, and FM_ERR_UNSUPPORTED for an fp4moe tile that
 * is not compiled into the library (fm_mma_tiles / fm_wgmma_tiles list them): for
 * fp4moe's own kernels the check answers exactly what the launcher will do, because
 * both call fm_smem_mma / fm_smem_wgmma.  Tiles: swap-AB runs one CTA per
 * (expert, N block) looping over passes, wgmma one CTA per (expert, pass, N block).  FM_ERR_BAD_SHAPE also for rows_per_expert, n, k or experts negative
 * or above INT32_MAX (CUTLASS problem shapes are int), or a problem of more than
 * 2^62 CTA tiles.  *out is written only on FM_OK. */
fm_status fm_plan_check(const fm_kernel_config *cfg, int64_t rows_per_expert, int64_t n, int64_t k, int64_t experts,
                        int sms, fm_plan_result *out);

/* One candidate of fm_plan_candidates. */
typedef struct {
    fm_kernel_config cfg;
    fm_plan_result   res;
    double           wasted_rows;   /* fraction of tile rows with no token (rows_per_expert vs tile_m) */
    double           bytes_per_flop;/* operand bytes loaded per useful FLOP */
    double           est_us;        /* estimated time: max(memory, compute) / efficiency (an estimate) */
} fm_plan_candidate;

/* Ranked candidates for (a/b format, epilogue, shape) on a GPU, from the kernel families
 * in `families` (FM_FAMILY_BIT set; 0 = all: the CUTLASS tiles of the GPU's architecture
 * and, for FP4 weights, fp4moe's compiled swap-AB tiles and, where the architecture has
 * FM_FEAT_WGMMA (sm_90), its compiled wgmma tiles; FM_FAMILIES_CUTLASS = CUTLASS
 * only), each checked: fitting ones first by est_us (two estimates within 2% of their
 * group's best are a tie, broken by less wasted rows, then fewer shared-memory bytes),
 * then the rejected ones.  Writes at most `cap` entries into out, the number written
 * into *count (total considered in *total if not NULL).  Statuses: FM_OK,
 * FM_ERR_INVALID_ARG, FM_ERR_ARCH_MISMATCH (no tile of the set takes that format on that
 * arch, e.g. FP4 on sm_90's CUTLASS, or a set of only fp4moe-wgmma off sm_90), FM_ERR_BAD_SHAPE (n/k/rows/experts <= 0 or
 * > INT32_MAX, or a K that is a multiple of no tile K of the set: the detail lists the
 * tile Ks), FM_ERR_INVALID_ARG also when ab is void or fp32 (not a GEMM operand),
 * FM_ERR_UNSUPPORTED (no family of the set modelled for that GPU and format).
 * *count, *total and out are written only on FM_OK. */
fm_status fm_plan_candidates_in(unsigned families, const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab,
                                int64_t rows_per_expert, int64_t n, int64_t k, int64_t experts, fm_plan_candidate *out,
                                size_t cap, size_t *count, size_t *total);
/* fm_plan_candidates_in with the CUTLASS rows modelled for CUTLASS version `cutlass`
 * (fm_kernel_config.cutlass: major*100 + minor*10 + patch, 0 = 4.2, as
 * fm_plan_candidates_in does); fp4moe's own rows do not depend on it. Same statuses,
 * plus fm_kernel_config_check's FM_ERR_UNSUPPORTED for a version it does not model
 * (reported per row as rejected). */
fm_status fm_plan_candidates_ver(unsigned families, int cutlass, const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi,
                                 int swap_ab, int64_t rows_per_expert, int64_t n, int64_t k, int64_t experts,
                                 fm_plan_candidate *out, size_t cap, size_t *count, size_t *total);
/* fm_plan_candidates_in(FM_FAMILIES_CUTLASS, ...): the CUTLASS catalogue of the GPU's
 * architecture only (what this function has always answered).  Same statuses. */
fm_status fm_plan_candidates(const fm_gpu_info *gpu, fm_elem ab, fm_epilogue epi, int swap_ab, int64_t rows_per_expert,
                             int64_t n, int64_t k, int64_t experts, fm_plan_candidate *out, size_t cap, size_t *count,
                             size_t *total);
/* Names and parsers ("nvfp4", "coop", "finalize", "128x256x128", "4.2").
 * Parsers return FM_OK, FM_ERR_INVALID_ARG (NULL) or FM_ERR_BAD_SHAPE / FM_ERR_FORMAT /
 * FM_ERR_NOT_FOUND with a detail naming the accepted values. */
const char *fm_schedule_name(fm_schedule s);
const char *fm_epilogue_name(fm_epilogue e);
const char *fm_family_name(fm_kernel_family f);
fm_status   fm_family_parse(const char *s, fm_kernel_family *out); /* FM_ERR_NOT_FOUND lists the names */
fm_status   fm_elem_parse(const char *s, fm_elem *out);
fm_status   fm_schedule_parse(const char *s, fm_schedule *out);
fm_status   fm_epilogue_parse(const char *s, fm_epilogue *out);
/* A CUTLASS tile shape "MxNxK" (fm_tile_parse is fp4moe's tile names). */
fm_status   fm_tile_shape_parse(const char *s, int *m, int *n, int *k);
/* An epilogue tile "MxN" (M, N in [1, 256], digits only) or "auto" (0x0), for
 * fm_kernel_config.epi_tile_m / epi_tile_n; anything else is FM_ERR_BAD_SHAPE. */
fm_status   fm_epi_tile_parse(const char *s, int *m, int *n);
/* Accepts exactly "4.M" or "4.M.P" (digits, nothing after); anything else is FM_ERR_NOT_FOUND. */
fm_status   fm_cutlass_version_parse(const char *s, int *out);

#ifdef __cplusplus
}
#endif
#endif
